//! Fuzz entry points, shared by the cargo-fuzz targets in `fuzz/` and by a stable-toolchain
//! smoke test. Each takes arbitrary bytes and drives a parser that sees hostile input; the only
//! property checked is "no panic, no hang" (plus a few cheap consistency asserts).
//!
//! - [`front_end`]: a client's headers and body → the routing decision or an error
//!   (`frontend::era`, `check_modern_head`, `verify_modern`, `protocol::parse_envelope`,
//!   content/origin checks) and the bearer-token parser (`auth::check_jwt`).
//! - [`upstream_answer`]: a backend's bytes → SSE events → JSON-RPC messages, the bridge's probe
//!   classification and the cache's storability decision.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::OnceLock;

use crate::auth::Auth;
use crate::frontend::{self, Head};
use crate::protocol;

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
    let _ = protocol::sniff_id(body);
    let _ = protocol::decode_header_value(body);
    if let Some(token) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let _ = jwt_auth().check_jwt(token);
    }
    let _ = crate::auth::parse_jwks(body);
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
        let _ = protocol::parse_envelope(m);
        let _ = crate::protocol::is_response(m);
        for method in ["tools/list", "resources/read", "server/discover"] {
            let _ = crate::cache::classify(method, false, m, 60_000);
        }
    }
    let _ = crate::bridge::classify_http(status, &messages);
    let _ = crate::bridge::classify_stdio(Some(&messages));
}

#[cfg(test)]
mod tests {
    //! The stable-toolchain smoke run: seeds plus random mutations through both entry points.

    use super::*;

    const SEEDS: &[&[u8]] = &[
        b"mcp-protocol-version: 2026-07-28\nmcp-method: tools/call\nmcp-name: echo\ncontent-type: application/json\naccept: application/json, text/event-stream\nauthorization: Bearer a.b.c\0{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}",
        b"mcp-name: =?base64?ZWNobw==?=\nmcp-method: tools/call\0{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}",
        b"\0{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}",
        b"\x00event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"supportedVersions\":[\"2026-07-28\"],\"ttlMs\":5,\"cacheScope\":\"public\",\"resultType\":\"complete\"}}\n\n",
        b"\x02data: {\"jsonrpc\":\"2.0\",\"id\":1,\x01\"error\":{\"code\":-32601}}\r\n\r\n: keepalive\n\n",
    ];

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
        for _ in 0..(1 + rng.next() % 4) {
            let len = input.len().max(1);
            let at = (rng.next() as usize) % len;
            match rng.next() % 5 {
                0 if !input.is_empty() => {
                    let i = at.min(input.len() - 1);
                    input[i] = rng.next() as u8;
                }
                1 if !input.is_empty() => {
                    input.remove(at.min(input.len() - 1));
                }
                2 => input.insert(
                    at.min(input.len()),
                    b"{}[]\":,\\\n\0=?"[(rng.next() % 12) as usize],
                ),
                3 if input.len() > 2 => input.truncate(at),
                _ => {
                    let from = (rng.next() as usize) % len;
                    let piece: Vec<u8> = input.iter().skip(from).take(8).copied().collect();
                    let at = at.min(input.len());
                    input.splice(at..at, piece);
                }
            }
        }
    }

    #[test]
    fn smoke_both_targets() {
        let runs: u64 = std::env::var("PORTICO_FUZZ_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for i in 0..runs {
            let mut input = SEEDS[(i as usize) % SEEDS.len()].to_vec();
            mutate(&mut rng, &mut input);
            front_end(&input);
            upstream_answer(&input);
        }
    }
}
