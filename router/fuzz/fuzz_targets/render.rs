//! Fuzz target `render`: see `program_operator::fuzz::render`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_operator::fuzz::render(data));
