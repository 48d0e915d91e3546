//! portico's integration tests: one binary (one link), one module per capability. Every test
//! runs the gateway as a real server on 127.0.0.1:0 against real backends — the in-repo mock
//! (`common::mock`) for exact wire checks and fault injection, and the official SDKs (`interop`)
//! installed by `tests/interop/setup.sh`.

mod admission;
mod aggregate;
mod cache;
mod calls;
mod cli;
mod common;
mod core;
mod deploy;
mod hardening;
mod input;
mod interop;
mod jwt;
mod layers;
pub mod legacy;
mod listen;
mod observe;
mod redis;
mod reliability;
mod resume;
mod security;
mod server_h1;
mod sessions;
mod sse_front;
mod status; // status page
mod stdio;
mod stdio_front;
mod tls;
mod token_exchange;
mod traces;
mod upstream_faults;
mod upstream_h1;
