//! Fuzz target `peer_usage`: see `program_router::fuzz::peer_usage`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| program_router::fuzz::peer_usage(data));
