//! Fuzz target `metrics`: see `program_router::fuzz::metrics`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::metrics(data));
