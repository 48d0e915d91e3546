//! The stable-toolchain smoke run: seeds plus random mutations through both entry points.

use super::*;

const SEEDS: &[&[u8]] = &[
    b"mcp-protocol-version: 2026-07-28\nmcp-method: tools/call\nmcp-name: echo\ncontent-type: application/json\naccept: application/json, text/event-stream\nauthorization: Bearer a.b.c\0{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}}}}",
    b"mcp-name: =?base64?ZWNobw==?=\nmcp-method: tools/call\0{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}",
    b"\0{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}",
    b"\x00event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"supportedVersions\":[\"2026-07-28\"],\"ttlMs\":5,\"cacheScope\":\"public\",\"resultType\":\"complete\"}}\n\n",
    b"\x02data: {\"jsonrpc\":\"2.0\",\"id\":1,\x01\"error\":{\"code\":-32601}}\r\n\r\n: keepalive\n\n",
    // A member's list page / a legacy server's answer to upstream id 7.
    b"\x00{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"tools\":[{\"name\":\"t\\u00e9\",\"inputSchema\":{\"type\":\"object\"}},{\"uri\":\"x://y\",\"name\":\"r\"},7],\"nextCursor\":\"c\",\"ttlMs\":5,\"cacheScope\":\"public\",\"_meta\":{\"k\":1.50}}}",
    b"\x00{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32002,\"message\":\"gone\"}}",
    // A 2026-07-28 request as the bridge sends it up.
    b"\x00{\"jsonrpc\":\"2.0\",\"id\":\"c\",\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"arguments\":{\"a\":[1e3]},\"_meta\":{\"progressToken\":3,\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}",
    // Requests the bridge sends up from the envelope's spans (`bridge::upward_agrees`): `_meta`
    // first, last, escaped; reserved keys only, a log level, a progress token; the id anywhere.
    b"\0{\"jsonrpc\": \"2.0\", \"method\": \"tools/call\", \"params\": {\"_meta\": {\"io.modelcontextprotocol/protocolVersion\": \"2026-07-28\", \"io.modelcontextprotocol/logLevel\": \"debug\"} , \"name\": \"t\"}, \"id\": 1}",
    b"\0{\"method\":\"tools/list\",\"params\":{\"cursor\":\"c\",\"_meta\":{\"progressToken\":\"p\",\"x\":{}}},\"jsonrpc\":\"2.0\",\"id\":\"q\"}",
    b"\0{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"\\u005fmeta\":{\"io.modelcontextprotocol/clientInfo\":{}},\"progress\":1}}",
    // Every kind of JSON value, escapes and whitespace, for the members scanner.
    b"\x00{ \"a\" :\t[ -0.5e+3 , 0 , 12E-2, true , false, null , \"\\u00e9\\n\\\"/\\/\" , { \"b\" : { } , \"c\":[[]] } ] ,\r\n\"c\\u0041\":\"x\" , \"\":{}}\n",
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

/// Pieces of HTTP/1.1 the wire mutator splices in.
const WIRE_TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"\t",
    b":",
    b",",
    b";",
    b"#",
    b"0",
    b"7",
    b"a",
    b"F",
    b"fffffffffffffff",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    b"3\r\nabc\r\n",
    b"1;x=\"y\"\r\nz\r\n",
    b"Content-Length: ",
    b"content-length: 0\r\n",
    b"Content-Length: 3, 3\r\n",
    b"Content-Length: 4\r\n",
    b"Transfer-Encoding: ",
    b"chunked",
    b"gzip, chunked",
    b"chunked, ",
    b"transfer-encoding: chunked\r\n",
    b"Connection: close\r\n",
    b"Expect: 100-continue\r\n",
    b"Upgrade: h2c\r\n",
    b"HTTP/1.0",
    b"HTTP/1.1 ",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"PRI * HTTP/2.0",
    b"x-trailer: 1\r\n",
    b"Mcp-Session-Id: s\r\n",
    b"Content-Type: a/b\r\n",
    b"Retry-After: 1\r\n",
    b"\x00",
    b"\x7f",
    b"\xff",
    b"?q=1",
    b"http://h",
    b"204",
    b"304",
    b"101",
];

/// One to four edits: a byte replaced, a token inserted (anywhere, or at the start of a
/// line), a range removed, a line repeated, the input cut short, a byte's case flipped.
fn mutate_wire(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..(1 + rng.next() % 4) {
        let at = (rng.next() as usize) % (input.len() + 1);
        match rng.next() % 8 {
            0 if at < input.len() => input[at] = rng.next() as u8,
            1 | 2 => {
                let token = WIRE_TOKENS[(rng.next() as usize) % WIRE_TOKENS.len()];
                input.splice(at..at, token.iter().copied());
            }
            3 if at < input.len() => {
                let end = (at + 1 + (rng.next() as usize) % 8).min(input.len());
                input.drain(at..end);
            }
            4 => {
                // Repeat the line that holds `at` (a header field, a chunk).
                let start = input[..at]
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                let end = input[at..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(input.len(), |i| at + i + 1);
                let line = input[start..end].to_vec();
                input.splice(end..end, line);
            }
            5 if input.len() > 4 => input.truncate(at),
            6 if at < input.len() && input[at].is_ascii_alphabetic() => input[at] ^= 0x20,
            7 => {
                let start = input[..at]
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                let token = WIRE_TOKENS[(rng.next() as usize) % WIRE_TOKENS.len()];
                input.splice(start..start, token.iter().copied());
            }
            _ => {}
        }
    }
}

fn runs() -> u64 {
    std::env::var("PORTICO_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Seeds (each as it is, then mutated) through a wire entry point; the tally of outcomes.
fn smoke_wire(
    seeds: &[&[u8]],
    seed: u64,
    target: fn(&[u8]) -> &'static str,
) -> std::collections::BTreeMap<&'static str, u64> {
    let mut rng = Rng(seed);
    let mut tally = std::collections::BTreeMap::new();
    for s in seeds {
        *tally.entry(target(s)).or_insert(0) += 1;
    }
    for i in 0..runs() {
        let mut input = seeds[(i as usize) % seeds.len()].to_vec();
        mutate_wire(&mut rng, &mut input);
        *tally.entry(target(&input)).or_insert(0) += 1;
    }
    eprintln!("{tally:#?}");
    tally
}

/// The seeded smoke run of the server's request parser: every request portico accepts,
/// refuses or hands to hyper is checked against httparse and RFC 9112 (a disagreement
/// panics), and the mutations reach each kind of outcome.
#[test]
fn smoke_server_h1() {
    let tally = smoke_wire(SERVER_H1_SEEDS, 0x5EED_0001_D1FF_C0DE, server_h1);
    let n = |k: &str| tally.get(k).copied().unwrap_or(0);
    let floor = (runs() / 2_000).max(1);
    for outcome in [
        "served",
        "served, closed (Connection: close)",
        "body over the limit: 413, closed",
        "handed to hyper",
        "malformed HTTP request head",
        "head incomplete",
        "invalid Content-Length",
        "conflicting Content-Length headers",
        "malformed request target",
    ] {
        assert!(n(outcome) >= floor, "{outcome}: {tally:?}");
    }
}

/// The seeded smoke run of the upstream client's answer parser and body decoder: every
/// answer is checked against httparse and RFC 9112, whole and in pieces (a disagreement
/// panics), and the mutations reach each kind of outcome.
#[test]
fn smoke_upstream_h1() {
    let tally = smoke_wire(UPSTREAM_H1_SEEDS, 0x5EED_0002_D1FF_C0DE, upstream_h1);
    let n = |k: &str| tally.get(k).copied().unwrap_or(0);
    let floor = (runs() / 2_000).max(1);
    for outcome in [
        "length, reused",
        "length, closed",
        "chunked, reused",
        "chunked, closed",
        "to the close",
        "bad answer head",
        "bad content-length",
        "malformed chunked encoding",
        "closed inside the body",
        "closed before an answer",
    ] {
        assert!(n(outcome) >= floor, "{outcome}: {tally:?}");
    }
}

/// Writes the seeds as libFuzzer's starting corpus (`fuzz/seeds/<target>/`):
/// `cargo test --lib fuzz::tests::write_seed_corpus -- --ignored`.
#[test]
#[ignore = "writes files: run by hand when the seeds change"]
fn write_seed_corpus() {
    for (target, seeds) in [
        ("server_h1", SERVER_H1_SEEDS),
        ("upstream_h1", UPSTREAM_H1_SEEDS),
    ] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/seeds")
            .join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).unwrap();
        }
    }
}
