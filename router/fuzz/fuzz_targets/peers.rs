//! Fuzz target `peers`: see `program_router::fuzz::peers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::peers(data));
