#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lbkit_fuzz::trace(data));
