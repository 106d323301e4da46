#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lbkit_fuzz::h1_request(data));
