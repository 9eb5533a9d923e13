//! Fuzz target `usage`: see `program_router::fuzz::usage`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::usage(data));
