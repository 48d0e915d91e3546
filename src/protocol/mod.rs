//! MCP and JSON-RPC vocabulary: header names, versions, error codes, request ids, and the cheap
//! "envelope" view of a message that the gateway uses to route and check requests.
//!
//! Pure: no IO, no clock, no globals. Everything here is safe to call on hostile input — parsers
//! return errors, never panic — which is why the fuzz targets start here.

use serde::Deserialize;

use crate::jsonrpc::{At, Key, Raw, Read, scan_members};
pub use crate::jsonrpc::{RequestId, code, error_body};
use serde_json::value::RawValue;
use smallvec::SmallVec;
use std::borrow::Cow;

mod envelope;

pub use envelope::{
    Envelope, EnvelopeError, Kind, MetaSpan, Spans, first_byte, levels_agree, parse_envelope,
};

/// The revision portico speaks natively (and asks modern backends for).
pub const LATEST_VERSION: &str = "2026-07-28";
/// Initialize-era revisions portico can serve to legacy clients and speak to legacy backends,
/// newest first (the order `initialize` offers them in).
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// What `server/discover` advertises: portico serves both eras on every endpoint.
pub const SUPPORTED_VERSIONS: [&str; 4] =
    [LATEST_VERSION, "2025-11-25", "2025-06-18", "2025-03-26"];

/// Reserved `_meta` keys (exact spelling from the 2026-07-28 schema).
pub mod meta {
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
}

/// HTTP header names, lower-case as `http` wants them.
pub mod header {
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    pub const METHOD: &str = "mcp-method";
    pub const NAME: &str = "mcp-name";
    pub const SESSION_ID: &str = "mcp-session-id";
    pub const PARAM_PREFIX: &str = "mcp-param-";
    /// What an initialize-era client resuming an SSE stream names (the last event it saw).
    pub const LAST_EVENT_ID: &str = "last-event-id";
    /// The `Accept` of a Streamable HTTP client's POST: it takes either form of answer.
    pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

    /// `Content-Type` and `Accept` of every message portico posts as a Streamable HTTP client
    /// (bridged calls, probes, the catalogue, invalidation listens, the stdio front).
    pub fn post_headers() -> [(http::HeaderName, http::HeaderValue); 2] {
        use http::HeaderValue;
        [
            (
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (http::header::ACCEPT, HeaderValue::from_static(ACCEPT_BOTH)),
        ]
    }

    /// The same names as `HeaderName`s, built at compile time: a lookup or insert by `&str`
    /// (or a `from_static` call at run time) parses and validates the name on every request.
    pub mod names {
        use http::HeaderName;
        pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static(super::PROTOCOL_VERSION);
        pub const METHOD: HeaderName = HeaderName::from_static(super::METHOD);
        pub const NAME: HeaderName = HeaderName::from_static(super::NAME);
        pub const SESSION_ID: HeaderName = HeaderName::from_static(super::SESSION_ID);
    }
}

/// Which revisions define a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eras {
    /// 2026-07-28 only (e.g. `server/discover`, `subscriptions/listen`).
    Modern,
    /// The initialize era only: removed in 2026-07-28 (docs/protocol.md §2).
    Legacy,
    Both,
}

/// What portico knows about one method.
#[derive(Clone, Copy, Debug)]
pub struct MethodInfo {
    pub name: &'static str,
    pub eras: Eras,
    /// The body field `Mcp-Name` mirrors, if any.
    pub name_field: Option<&'static str>,
    /// Its `complete` results carry `ttlMs`/`cacheScope` (docs/protocol.md §2); such a method changes
    /// nothing upstream, so it is also safe to retry.
    pub cacheable: bool,
}

const fn m(
    name: &'static str,
    eras: Eras,
    name_field: Option<&'static str>,
    cacheable: bool,
) -> MethodInfo {
    MethodInfo {
        name,
        eras,
        name_field,
        cacheable,
    }
}

/// The one list of methods, per era. Anything else is `"other"` in metrics, so a client can
/// never mint label values.
pub const METHODS: &[MethodInfo] = &[
    m("server/discover", Eras::Modern, None, true),
    m("tools/list", Eras::Both, None, true),
    m("tools/call", Eras::Both, Some("name"), false),
    m("prompts/list", Eras::Both, None, true),
    m("prompts/get", Eras::Both, Some("name"), false),
    m("resources/list", Eras::Both, None, true),
    m("resources/templates/list", Eras::Both, None, true),
    m("resources/read", Eras::Both, Some("uri"), true),
    m("completion/complete", Eras::Both, None, false),
    m("subscriptions/listen", Eras::Modern, None, false),
    m("tasks/get", Eras::Both, Some("taskId"), false),
    m("tasks/update", Eras::Both, Some("taskId"), false),
    m("tasks/cancel", Eras::Both, Some("taskId"), false),
    m("initialize", Eras::Legacy, None, false),
    m("ping", Eras::Legacy, None, false),
    m("logging/setLevel", Eras::Legacy, None, false),
    m("resources/subscribe", Eras::Legacy, None, false),
    m("resources/unsubscribe", Eras::Legacy, None, false),
    m("notifications/initialized", Eras::Legacy, None, false),
    m("notifications/cancelled", Eras::Both, None, false),
];

/// What portico knows of `method`, if it knows it.
pub fn method_info(method: &str) -> Option<&'static MethodInfo> {
    METHODS.iter().find(|m| m.name == method)
}

/// The metric label for a method name: itself when known, else `"other"`.
pub fn method_label(method: &str) -> &'static str {
    method_info(method).map_or("other", |m| m.name)
}

/// Methods whose `Mcp-Name` header mirrors a body field, and which field.
pub fn name_field(method: &str) -> Option<&'static str> {
    method_info(method).and_then(|m| m.name_field)
}

/// Methods whose `complete` results carry `ttlMs`/`cacheScope` (docs/protocol.md §2).
pub fn is_cacheable_method(method: &str) -> bool {
    method_info(method).is_some_and(|m| m.cacheable)
}

/// Methods whose repetition changes nothing upstream: safe to retry after a connect failure.
pub fn is_idempotent(method: &str) -> bool {
    is_cacheable_method(method)
}

/// Methods the initialize era has and 2026-07-28 removed (docs/protocol.md §2).
pub fn is_removed_in_modern(method: &str) -> bool {
    method_info(method).is_some_and(|m| m.eras == Eras::Legacy)
}

/// `LoggingLevel`s from least to most severe (RFC 5424 order): a client asking for one gets it
/// and everything after it.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// A `LoggingLevel`'s rank in [`LOG_LEVELS`] (`None`: not a level).
pub fn log_rank(level: &str) -> Option<u8> {
    LOG_LEVELS.iter().position(|l| *l == level).map(|i| i as u8)
}

/// Whether `v` is an initialize-era revision portico can speak.
pub fn is_legacy_version(v: &str) -> bool {
    LEGACY_VERSIONS.contains(&v) || v == "2024-11-05"
}

/// HTTP status for a JSON-RPC error code that portico itself synthesises or bridges (the spec
/// fixes only some of these; docs/protocol.md §4 and §8 item 9).
pub fn status_for_code(code: i64) -> u16 {
    match code {
        code::PARSE_ERROR | code::INVALID_REQUEST | code::INVALID_PARAMS => 400,
        code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH => 400,
        code::METHOD_NOT_FOUND => 404,
        _ => 200,
    }
}

/// portico's own name and version, as `serverInfo`/`clientInfo` carry them.
pub fn portico_info() -> serde_json::Value {
    serde_json::json!({"name": "portico", "version": env!("CARGO_PKG_VERSION")})
}

/// The `server/discover` portico sends on its own account (the era probe, health checks): a
/// well-formed 2026-07-28 request, harmless to a server of either era. The one builder of it.
pub fn discover_probe(id: &str) -> bytes::Bytes {
    let msg = serde_json::json!({"jsonrpc":"2.0","id":id,"method":"server/discover","params":{"_meta":{
        meta::PROTOCOL_VERSION: LATEST_VERSION,
        meta::CLIENT_CAPABILITIES: {},
        meta::CLIENT_INFO: portico_info(),
    }}});
    bytes::Bytes::from(serde_json::to_vec(&msg).unwrap_or_default())
}

/// The HTTP headers of [`discover_probe`].
pub fn discover_probe_headers() -> Vec<(http::HeaderName, http::HeaderValue)> {
    use http::HeaderValue;
    let mut headers = Vec::with_capacity(4);
    headers.extend(header::post_headers());
    headers.push((
        header::names::PROTOCOL_VERSION,
        HeaderValue::from_static(LATEST_VERSION),
    ));
    headers.push((
        header::names::METHOD,
        HeaderValue::from_static("server/discover"),
    ));
    headers
}

/// A substring a message is tested for before it is parsed: most messages lack it and skip
/// the parse (a byte-window scan cost ~13 instructions a byte; callgrind, bridged
/// `tools/call`). The searcher is built once, on first use: building one costs more than a
/// search.
pub struct Needle(std::sync::LazyLock<memchr::memmem::Finder<'static>>);

impl Needle {
    pub const fn new(build: fn() -> memchr::memmem::Finder<'static>) -> Needle {
        Needle(std::sync::LazyLock::new(build))
    }

    /// Whether the needle occurs in `hay`.
    pub fn is_in(&self, hay: &[u8]) -> bool {
        self.find(hay).is_some()
    }

    /// Where the needle first occurs in `hay`.
    pub fn find(&self, hay: &[u8]) -> Option<usize> {
        self.0.find(hay)
    }
}

/// The requests a server may send a client during a call, with the client capability each
/// needs (digest §2: embedded input requests). The bridge relays or parks them; the stdio
/// transport routes them to the call they belong to.
pub const INPUT_REQUESTS: [(&str, &str); 3] = [
    ("elicitation/create", "elicitation"),
    ("sampling/createMessage", "sampling"),
    ("roots/list", "roots"),
];

/// The capability a server request needs, when it is one a client can be asked.
pub fn input_capability(method: &str) -> Option<&'static str> {
    INPUT_REQUESTS
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, c)| *c)
}

/// The members that make a JSON-RPC message a response — `method`, `result`, `error` — as a
/// one-pass reader meets them (the upstream's answer check, an aggregated list's reading), read
/// as serde's derive reads them: a `null` is absent, a name given twice makes no message.
#[derive(Default)]
pub struct ResponseMembers {
    seen: [bool; 3],
    present: [bool; 3],
    twice: bool,
}

impl ResponseMembers {
    /// Notes one top-level member, `value` its JSON text (other names are not counted).
    pub fn note(&mut self, name: &str, value: &str) {
        let i = match name {
            "method" => 0,
            "result" => 1,
            "error" => 2,
            _ => return,
        };
        self.twice |= std::mem::replace(&mut self.seen[i], true);
        self.present[i] = value != "null";
    }

    /// `method`, `result` or `error` given twice: no JSON-RPC message.
    pub fn repeated(&self) -> bool {
        self.twice
    }

    /// A `method` that is not null: a request or a notification, not a response.
    pub fn has_method(&self) -> bool {
        self.present[0]
    }

    /// No method, and a result or an error.
    pub fn is_response(&self) -> bool {
        let [method, result, error] = self.present;
        !method && (result || error)
    }
}

/// Whether a decoded message is a JSON-RPC response (the end of an answer) rather than a
/// notification about the request.
pub fn is_response(msg: &[u8]) -> bool {
    matches!(parse_envelope(msg), Ok(e) if e.kind == Kind::Response)
}

/// Reads just the id of a message, for echoing it in an error built after the fact.
pub fn sniff_id(body: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    if first_byte(body) != Some(b'{') {
        return None;
    }
    let m: IdOnly = serde_json::from_slice(body).ok()?;
    m.id.and_then(RequestId::from_raw)
}

// === Header values ===

/// Decodes an `Mcp-Name` / `Mcp-Param-*` header value: plain visible ASCII, or the
/// `=?base64?…?=` form for anything else (docs/protocol.md §4). `None` when the value is invalid.
pub fn decode_header_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    use base64::Engine;
    if let Some(inner) = raw
        .strip_prefix(b"=?base64?")
        .and_then(|r| r.strip_suffix(b"?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    let valid = !raw.is_empty()
        && raw.iter().all(|b| (0x20..0x7f).contains(b))
        && raw.first() != Some(&b' ')
        && raw.last() != Some(&b' ');
    if !valid {
        return None;
    }
    // The plain form (the usual one) is borrowed, not copied.
    std::str::from_utf8(raw).ok().map(Cow::Borrowed)
}

/// Encodes a value for an `Mcp-Name` header, using the base64 form when plain ASCII won't do.
pub fn encode_header_value(value: &str) -> String {
    use base64::Engine;
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| (0x21..0x7f).contains(&b) || b == b' ')
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with("=?base64?");
    if plain {
        value.to_string()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value.as_bytes())
        )
    }
}

/// Whether an `Accept` header admits both JSON and SSE (an absent header admits anything).
pub fn accept_ok(accept: Option<&[u8]>) -> bool {
    let Some(accept) = accept else { return true };
    // What the SDKs send, verbatim: settled without splitting.
    if accept == header::ACCEPT_BOTH.as_bytes() || accept == b"text/event-stream, application/json"
    {
        return true;
    }
    let (mut json, mut sse) = (false, false);
    for range in accept.split(|b| *b == b',') {
        let media = range
            .split(|b| *b == b';')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        let is = |m: &[u8]| media.eq_ignore_ascii_case(m);
        if is(b"*/*") {
            json = true;
            sse = true;
        } else if is(b"application/*") || is(b"application/json") {
            json = true;
        } else if is(b"text/*") || is(b"text/event-stream") {
            sse = true;
        }
    }
    json && sse
}

/// Whether a `Content-Type` header says JSON.
pub fn content_type_is_json(ct: Option<&[u8]>) -> bool {
    let Some(ct) = ct else { return false };
    let media = ct.split(|b| *b == b';').next().unwrap_or(b"");
    media.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

#[cfg(test)]
mod tests;
