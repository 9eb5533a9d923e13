//! Fuzz target `scheduler`: see `program_router::fuzz::scheduler`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::scheduler(data));
