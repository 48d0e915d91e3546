//! Fuzz entry points, shared by the cargo-fuzz targets in `fuzz/` and by a stable-toolchain
//! smoke test. Each takes arbitrary bytes and drives a parser that sees hostile input; the only
//! property checked is "no panic, no hang" (plus a few cheap consistency asserts).
//!
//! - [`front_end`]: a client's headers and body → the routing decision or an error
//!   (`frontend::era`, `check_modern_head`, `verify_modern`, `protocol::parse_envelope`,
//!   content/origin checks), the bridge's request rewrite from the envelope's spans against
//!   its whole reading (`bridge::upward_agrees`) and the bearer-token parser
//!   (`auth::check_jwt`).
//! - [`upstream_answer`]: a backend's bytes → SSE events → JSON-RPC messages, the bridge's probe
//!   classification, the cache's storability decision, the bridge's text translations both ways
//!   and an aggregated endpoint's one-pass list reader and merge (their output must be JSON).
//!
//! The wire (HTTP/1.1 framing), each checked against `httparse` and RFC 9112 — a disagreement is
//! a panic, so a finding:
//! - [`server_h1`]: a client's bytes → the lean server's request heads (`server::h1::parse_head`)
//!   and bodies (Content-Length), pipelined, read whole and in pieces.
//! - [`upstream_h1`]: a backend's bytes → the lean client's answer head
//!   (`upstream::h1::parse_head`) and body (Content-Length, chunked, to the close), read whole
//!   and in pieces.
//!
//! All are deterministic and bounded: no I/O, no runtime, no clock.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::OnceLock;

use crate::auth::Auth;
use crate::frontend::{self, Head};
use crate::protocol;

mod wire;

pub use wire::{
    SERVER_H1_SEEDS, SERVER_MAX_BODY, SERVER_MAX_HEAD, UPSTREAM_H1_SEEDS, server_h1, upstream_h1,
};

/// Input layout: header lines `name: value\n` up to the first `\0`, then the body.
pub fn front_end(data: &[u8]) {
    let (head, body) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let seen = frontend::Seen::scan(&headers);
    let _ = frontend::check_origin(&seen, &[]);
    let _ = frontend::check_content(&seen);
    let head = Head::from_seen(&seen);
    if let Ok(frontend::Era::Modern) = frontend::era(&head, body)
        && let Ok(mh) = frontend::check_modern_head(&head)
        && let Ok(env) = protocol::parse_envelope(body)
    {
        let verified = frontend::verify_modern(&head, &mh, &env);
        // The safety argument of header routing: once verified, the headers say what the body says.
        if verified.is_ok() && env.kind == protocol::Kind::Request {
            assert_eq!(mh.method, Some(env.method.as_str()));
            if protocol::name_field(&env.method).is_some() {
                assert_eq!(mh.name, env.name.as_deref());
            }
        }
    }
    // A request the envelope accepts goes to an initialize-era backend the same by the
    // envelope's spans as by reading it whole (panics on a disagreement).
    crate::bridge::upward_agrees(body);
    let _ = protocol::sniff_id(body);
    members_as_serde(body);
    let _ = protocol::decode_header_value(body);
    if let Some(token) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let _ = jwt_auth().check_jwt(token, "/mcp");
    }
    let _ = crate::auth::parse_jwks(body);
}

/// `jsonrpc::parse_members` is our own scanner standing in for serde_json: it must read every
/// text as serde does.
fn members_as_serde(text: &[u8]) {
    if let Ok(text) = std::str::from_utf8(text) {
        crate::jsonrpc::agrees_with_serde(text);
        protocol::levels_agree(text);
    }
}

/// An `Auth` in JWT mode with one HS256 key, for the token parser.
fn jwt_auth() -> &'static Auth {
    static AUTH: OnceLock<Auth> = OnceLock::new();
    AUTH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("portico-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let jwks = dir.join("jwks.json");
        let _ = std::fs::write(
            &jwks,
            br#"{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}"#,
        );
        let cfg = crate::config::AuthConfig {
            mode: crate::config::AuthMode::Jwt,
            jwt: Some(crate::config::JwtConfig {
                jwks_file: Some(jwks),
                jwks_url: None,
                ca_file: None,
                jwks_refresh_ms: crate::config::DEFAULT_JWKS_REFRESH_MS,
                issuer: Some("i".into()),
                audience: Some("a".into()),
                team_claim: "team".into(),
                default_team: None,
                leeway_s: 0,
            }),
            ..Default::default()
        };
        Auth::build(&cfg, "http://127.0.0.1:8787".into())
            .unwrap_or_else(|e| panic!("fuzz auth config: {e}"))
    })
}

/// Input layout: first byte picks the HTTP status, the rest is an upstream body read as SSE
/// (in chunks split at `\x01`), and each event as a JSON-RPC message.
pub fn upstream_answer(data: &[u8]) {
    let Some((&s, rest)) = data.split_first() else {
        return;
    };
    let status = [200, 202, 400, 404, 405, 500, 502][usize::from(s) % 7];
    let mut dec = crate::sse::SseDecoder::new(64 * 1024);
    let mut messages = Vec::new();
    for chunk in rest.split(|b| *b == 1) {
        dec.push(chunk);
        loop {
            match dec.next_event() {
                Ok(Some(ev)) => messages.push(ev),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    if let Some(ev) = dec.finish() {
        messages.push(ev);
    }
    messages.push(Bytes::copy_from_slice(rest));
    for m in &messages {
        members_as_serde(m);
        let _ = protocol::parse_envelope(m);
        let _ = crate::protocol::is_response(m);
        for method in ["tools/list", "resources/read", "server/discover"] {
            let _ = crate::cache::classify(method, false, m, 60_000);
        }
    }
    let _ = crate::bridge::classify_http(status, &messages);
    let _ = crate::bridge::classify_stdio(Some(&messages));
    for m in &messages {
        crate::bridge::fuzz_translate(m);
        merge_answer(m);
    }
}

/// A member's answer read and merged as an aggregated endpoint does, under each list kind:
/// the merged items must always be a JSON array.
fn merge_answer(m: &[u8]) {
    use crate::merge::{self, ListAnswer, ListKind, Naming};
    let namings = [
        Naming {
            backend: "a".into(),
            prefix: "a".into(),
            tools: Default::default(),
        },
        Naming {
            backend: "b".into(),
            prefix: String::new(),
            tools: Default::default(),
        },
    ];
    for kind in [ListKind::Tools, ListKind::Resources] {
        let pages: Vec<_> = (0..2)
            .filter_map(|i| match merge::read_list_answer(kind, i, m) {
                ListAnswer::Page(p) => Some(p),
                _ => None,
            })
            .collect();
        if let Ok(merged) = merge::merge_list(kind, &namings, "__", &pages) {
            let items: Result<Vec<serde::de::IgnoredAny>, _> =
                serde_json::from_slice(&merged.items);
            assert!(
                items.is_ok_and(|v| v.len() == merged.count),
                "merged items are not an array of {}: {}",
                merged.count,
                String::from_utf8_lossy(&merged.items)
            );
        }
    }
}

#[cfg(test)]
mod tests;
