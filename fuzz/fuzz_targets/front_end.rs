//! Client request front end: headers + body → routing decision or error (see `portico::fuzz`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| portico::fuzz::front_end(data));
