//! Fuzz target `config`: see `program_router::fuzz::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::config(data));
