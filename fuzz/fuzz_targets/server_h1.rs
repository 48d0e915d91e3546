//! The lean HTTP/1.1 server's request heads and bodies, differential against httparse and
//! RFC 9112 (see `portico::fuzz::server_h1`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    portico::fuzz::server_h1(data);
});
