//! Fuzz target `identity`: see `program_router::fuzz::identity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::identity(data));
