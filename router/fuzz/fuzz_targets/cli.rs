//! Fuzz target `cli`: see `program_router::fuzz::cli`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::cli(data));
