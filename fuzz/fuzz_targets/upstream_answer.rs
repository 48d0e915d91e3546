//! Upstream answers: SSE framing, JSON-RPC envelopes, probe classification, cache decision.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| portico::fuzz::upstream_answer(data));
