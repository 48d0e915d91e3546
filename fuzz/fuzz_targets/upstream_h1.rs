//! The lean HTTP/1.1 client's answer heads and bodies (Content-Length, chunked, to the close),
//! differential against httparse and RFC 9112 (see `portico::fuzz::upstream_h1`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    portico::fuzz::upstream_h1(data);
});
