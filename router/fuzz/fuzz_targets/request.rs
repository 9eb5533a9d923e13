//! Fuzz target `request`: see `program_router::fuzz::request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::request(data));
