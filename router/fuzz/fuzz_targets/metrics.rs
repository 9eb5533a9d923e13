//! Fuzz target `metrics`: see `program_router::fuzz::metrics_against` (the scanner, checked
//! against openmetrics-parser wherever that parser accepts the exposition).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    program_router::fuzz::metrics_against(data, testkit::reference_samples)
});
