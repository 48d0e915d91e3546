//! The client-facing rules of Streamable HTTP (2026-07-28, docs/protocol.md §4), applied header-first.
//!
//! `frontend` looks at a POST's headers, reads its body once through the size limit, decides
//! which era the client speaks, and — only when a gateway decision depends on the body — parses
//! the envelope and checks the mirrored headers against it. It does no upstream IO.
//!
//! Safety argument for header routing (also in README): a modern backend validates
//! header/body agreement itself (the spec requires it to), so forwarding a request whose headers
//! lie only lets the client fool the backend into rejecting it. Whenever *portico* acts on what
//! the headers say — cache keys, tool policy, name rewriting, bridging — the body is parsed and
//! every mirrored header is checked against it first, so a header can never steer a request
//! whose body says otherwise.

use bytes::Bytes;
use futures_util::FutureExt;
use http::HeaderValue;
use http::header::{self, HeaderMap, HeaderName};
use http_body_util::{BodyExt, Limited};
use std::borrow::Cow;

use crate::error::GatewayError;
use crate::protocol::{
    self, Envelope, EnvelopeError, Kind, LATEST_VERSION, accept_ok, content_type_is_json,
    decode_header_value, header as h, is_legacy_version, name_field,
};

/// The client's socket address, attached to every request (admin endpoints are loopback-only).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Marks an in-process request that portico wrote on a client's behalf (`portico stdio`): it
/// stands for a Streamable HTTP client that would have built its `Mcp-Param-*` headers, so a
/// `tools/call` takes the message path, where the per-backend step builds them, instead of
/// being passed through without them. A request extension: no header can claim it.
#[derive(Debug, Clone, Copy)]
pub struct BuiltByPortico;

/// Marks a request made by portico's in-process fronts (`portico stdio`, an HTTP+SSE
/// session): it has no connection of its own that could break under its answer, so an
/// initialize-era client's SSE answer is not held for a resume (`legacy`). A request
/// extension: no header can claim it.
#[derive(Debug, Clone, Copy)]
pub struct InProcess;

/// Which protocol era a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28: stateless, `_meta` on every request.
    Modern,
    /// initialize-era (2025-03-26 … 2025-11-25): sessions.
    Legacy,
}

/// The MCP headers of a POST, read before the body; borrowed from the request's header map.
#[derive(Debug, Default)]
pub struct Head<'a> {
    pub version: Option<&'a str>,
    pub method: Option<&'a str>,
    /// `Mcp-Name` decoded; `Err(())` when present but not validly encoded.
    pub name: Option<Result<Cow<'a, str>, ()>>,
    pub session: Option<&'a str>,
}

impl<'a> Head<'a> {
    pub fn read(headers: &'a HeaderMap) -> Head<'a> {
        Head::from_seen(&Seen::scan(headers))
    }

    pub fn from_seen(seen: &Seen<'a>) -> Head<'a> {
        let text = |v: Option<&'a HeaderValue>| v.and_then(|v| v.to_str().ok()).map(str::trim);
        Head {
            version: text(seen.version),
            method: text(seen.method),
            name: seen
                .name
                .map(|v| decode_header_value(v.as_bytes()).ok_or(())),
            session: text(seen.session),
        }
    }
}

/// The request headers the front end reads, found in one pass over the map: a lookup by name
/// hashes the name and probes the table, and eight of them cost more than comparing each of a
/// request's few headers once. The first value of a repeated header counts, as with `get`.
#[derive(Default)]
pub struct Seen<'a> {
    pub content_type: Option<&'a HeaderValue>,
    pub accept: Option<&'a HeaderValue>,
    pub origin: Option<&'a HeaderValue>,
    pub traceparent: Option<&'a HeaderValue>,
    pub version: Option<&'a HeaderValue>,
    pub method: Option<&'a HeaderValue>,
    pub name: Option<&'a HeaderValue>,
    pub session: Option<&'a HeaderValue>,
}

impl<'a> Seen<'a> {
    pub fn scan(headers: &'a HeaderMap) -> Seen<'a> {
        let mut seen = Seen::default();
        for (name, value) in headers {
            let slot = if name == header::CONTENT_TYPE {
                &mut seen.content_type
            } else if name == header::ACCEPT {
                &mut seen.accept
            } else if name == header::ORIGIN {
                &mut seen.origin
            } else {
                match name.as_str() {
                    h::PROTOCOL_VERSION => &mut seen.version,
                    h::METHOD => &mut seen.method,
                    h::NAME => &mut seen.name,
                    h::SESSION_ID => &mut seen.session,
                    "traceparent" => &mut seen.traceparent,
                    _ => continue,
                }
            };
            slot.get_or_insert(value);
        }
        seen
    }
}

/// Headers a client may pass to a backend. Everything else — above all `Authorization` and
/// `Cookie` (the spec forbids token pass-through), hop-by-hop headers, and the session id that
/// portico manages itself — stays behind.
pub fn forwardable(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "content-type"
            | "accept"
            | "mcp-protocol-version"
            | "mcp-method"
            | "mcp-name"
            | "traceparent"
            | "tracestate"
            | "baggage"
    ) || n.starts_with(h::PARAM_PREFIX)
}

/// The client's W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), when well-formed; anything
/// else is neither logged nor trusted (it is still forwarded by the allowlist, as the spec says a
/// receiver decides what to do with a malformed one).
pub fn traceparent(seen: &Seen<'_>) -> Option<HeaderValue> {
    let v = seen.traceparent?;
    let b = v.as_bytes();
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let shaped = b.len() >= 55
        && b[2] == b'-'
        && b[35] == b'-'
        && b[52] == b'-'
        && hex(&b[..2])
        && hex(&b[3..35])
        && hex(&b[36..52])
        && hex(&b[53..55])
        && (b.len() == 55 || b[55] == b'-')
        && &b[..2] != b"ff"
        && b[3..35].iter().any(|c| *c != b'0')
        && b[36..52].iter().any(|c| *c != b'0');
    shaped.then(|| v.clone())
}

/// The DNS-rebinding defence, before anything else about the request is looked at.
pub fn check_origin(seen: &Seen<'_>, allowed_origins: &[String]) -> Result<(), GatewayError> {
    match seen.origin {
        Some(origin) if !origin_allowed(origin.as_bytes(), allowed_origins) => {
            Err(GatewayError::OriginForbidden)
        }
        _ => Ok(()),
    }
}

/// Content negotiation. Checked after the body is read so the error can echo the request id.
pub fn check_content(seen: &Seen<'_>) -> Result<(), GatewayError> {
    if !content_type_is_json(seen.content_type.map(|v| v.as_bytes())) {
        return Err(GatewayError::UnsupportedMediaType);
    }
    if !accept_ok(seen.accept.map(|v| v.as_bytes())) {
        return Err(GatewayError::NotAcceptable);
    }
    Ok(())
}

/// `Origin` policy. An empty allow list admits loopback origins only (what a local client or
/// the Inspector uses); `"*"` admits any; otherwise exact, case-insensitive matches.
pub fn origin_allowed(origin: &[u8], allowed: &[String]) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    if allowed.is_empty() {
        let Some((scheme, rest)) = origin.split_once("://") else {
            return false;
        };
        if scheme != "http" && scheme != "https" {
            return false;
        }
        let host = if let Some(v6) = rest.strip_prefix('[') {
            v6.split(']').next().unwrap_or("")
        } else {
            rest.split(':').next().unwrap_or("")
        };
        return matches!(host, "localhost" | "127.0.0.1" | "::1");
    }
    allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
}

/// How long a request body may take: `body_read_timeout_ms` from the moment portico turns to
/// it, plus one second per `body_min_bytes_per_s` bytes already received, with no pause between
/// reads longer than `header_read_timeout_ms`. The one rule for both
/// server halves (the lean HTTP/1.1 loop and hyper: TLS, h2, chunked, HTTP/1.0, `Expect`), so a
/// socket that sends nothing, or a byte now and then, holds nothing for long — and, since the
/// per-backend step runs only after the body is in, never an admission slot.
#[derive(Debug, Clone, Copy)]
pub struct BodyClock {
    /// Set by the first read that has to wait: a body that is already in (the usual case, read
    /// with its head) costs no clock read at all.
    start: Option<tokio::time::Instant>,
    base: std::time::Duration,
    min_rate: u64,
    /// The longest pause between two reads (`header_read_timeout_ms`).
    pause: std::time::Duration,
}

impl BodyClock {
    /// `base` for any body, plus a second per `min_rate` bytes received, and never more than
    /// `pause` without a byte; counted from the first read that has to wait.
    pub fn new(base: std::time::Duration, min_rate: u64, pause: std::time::Duration) -> BodyClock {
        BodyClock {
            start: None,
            base,
            min_rate: min_rate.max(1),
            pause,
        }
    }

    /// With the `[server]` settings.
    pub fn start(cfg: &crate::config::ServerConfig) -> BodyClock {
        BodyClock::new(
            std::time::Duration::from_millis(cfg.body_read_timeout_ms),
            cfg.body_min_bytes_per_s,
            std::time::Duration::from_millis(cfg.header_read_timeout_ms),
        )
    }

    /// The latest the next read may complete, with `received` bytes in: the whole body's
    /// deadline, or the pause limit from now, whichever is sooner. Call it only when a read
    /// has to wait (the first call starts the clock).
    pub fn deadline(&mut self, received: usize) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let start = *self.start.get_or_insert(now);
        (start + body_allowance(self.base, self.min_rate, received)).min(now + self.pause)
    }
}

/// The body clock's rule for `bytes` (read, or still to write): `base` plus a second per
/// `min_rate` bytes. The server's writes to a client that reads slowly keep to it too
/// (`server::h1::Limits::write_allowance`).
pub fn body_allowance(
    base: std::time::Duration,
    min_rate: u64,
    bytes: usize,
) -> std::time::Duration {
    base + std::time::Duration::from_millis((bytes as u64).saturating_mul(1000) / min_rate.max(1))
}

/// Reads the whole body, never more than `limit` bytes, within `clock`. A declared length over
/// the limit is refused before reading anything.
pub async fn read_body<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    mut clock: BodyClock,
) -> Result<Bytes, GatewayError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<crate::error::BodyError>,
{
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let too_large = |e: &crate::error::BodyError| e.is::<http_body_util::LengthLimitError>();
    let mut body = std::pin::pin!(Limited::new(body, limit));
    // The usual body arrives as one frame (the lean HTTP/1.1 server reads it whole): return
    // that buffer as is, without a collecting buffer list.
    let mut first = Bytes::new();
    let mut rest: Option<bytes::BytesMut> = None;
    loop {
        let received = rest.as_ref().map_or(first.len(), |r| r.len());
        // A frame that is already there needs no deadline (nor a clock read).
        let next = match body.frame().now_or_never() {
            Some(next) => next,
            None => match tokio::time::timeout_at(clock.deadline(received), body.frame()).await {
                Ok(next) => next,
                Err(_) => return Err(GatewayError::BodyTimeout),
            },
        };
        let Some(frame) = next else { break };
        let frame = match frame {
            Ok(f) => f,
            Err(e) if too_large(&e) => return Err(GatewayError::BodyTooLarge { limit }),
            Err(e) => return Err(GatewayError::BodyRead(e.to_string())),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if first.is_empty() && rest.is_none() {
            first = data;
            continue;
        }
        rest.get_or_insert_with(|| bytes::BytesMut::from(&first[..]))
            .extend_from_slice(&data);
    }
    Ok(rest.map_or(first, bytes::BytesMut::freeze))
}

/// Decides the era of a request from its headers, peeking at the body only when the headers
/// cannot tell (no version header).
pub fn era(head: &Head, body: &[u8]) -> Result<Era, GatewayError> {
    // A 2026-07-28 request is one whatever else it carries: a stray `Mcp-Session-Id` is
    // ignored (2026-07-28 has no sessions), never a reason to look for a legacy session.
    if head.version == Some(LATEST_VERSION) {
        return Ok(Era::Modern);
    }
    if head.session.is_some() {
        return Ok(Era::Legacy);
    }
    match head.version {
        Some(LATEST_VERSION) => Ok(Era::Modern),
        Some(v) if is_legacy_version(v) => Ok(Era::Legacy),
        Some(_) => Ok(Era::Modern),
        None => {
            // Only an initialize-era client may omit the header, and it must start with
            // `initialize` (a 2025-03-26 client sends no header at all).
            match protocol::parse_envelope(body) {
                Ok(env) if env.method == "initialize" => Ok(Era::Legacy),
                Ok(env) if env.kind == Kind::Notification => Ok(Era::Modern),
                _ => Err(GatewayError::HeaderMismatch(
                    "missing MCP-Protocol-Version header".into(),
                )),
            }
        }
    }
}

/// What a modern request's headers alone establish (borrowed from the `Head`: no copies).
pub struct ModernHead<'a> {
    /// `Mcp-Method`; `None` only for a notification without one.
    pub method: Option<&'a str>,
    pub name: Option<&'a str>,
    /// The version header is not one portico serves: answer `-32022` or `-32020` after a body read.
    pub unknown_version: bool,
}

/// Header rules of a modern request that need no body. A request whose headers are incomplete
/// is only refused once the body shows it is a request (notifications have no header rules).
pub fn check_modern_head<'a>(head: &'a Head<'_>) -> Result<ModernHead<'a>, GatewayError> {
    let unknown_version = head.version != Some(LATEST_VERSION);
    let name = match &head.name {
        Some(Ok(n)) => Some(n.as_ref()),
        Some(Err(())) => {
            return Err(GatewayError::HeaderMismatch(
                "Mcp-Name is not a valid header value".into(),
            ));
        }
        None => None,
    };
    // Methods 2026-07-28 removed (docs/protocol.md §2) are answered here, on every URL, and
    // never forwarded: a legacy backend would answer them, a modern one must not see them.
    if let Some(m) = head.method
        && protocol::is_removed_in_modern(m)
    {
        return Err(GatewayError::MethodNotFound(format!(
            "{m} was removed in 2026-07-28"
        )));
    }
    if let Some(m) = &head.method
        && name_field(m).is_some()
        && name.is_none()
    {
        return Err(GatewayError::HeaderMismatch(format!(
            "Mcp-Name header is required for {m}"
        )));
    }
    Ok(ModernHead {
        method: head.method,
        name,
        unknown_version,
    })
}

/// Maps an envelope parse failure to the client-facing error.
pub fn envelope_error(e: EnvelopeError) -> GatewayError {
    match e {
        EnvelopeError::Parse(d) => GatewayError::Parse(d),
        EnvelopeError::Batch => GatewayError::Batch,
        EnvelopeError::Invalid(d, _) => GatewayError::InvalidRequest(d),
    }
}

/// The body check: every mirrored header must agree with the body, and the body must carry the
/// `_meta` keys 2026-07-28 requires.
pub fn verify_modern(head: &Head, mh: &ModernHead<'_>, env: &Envelope) -> Result<(), GatewayError> {
    if protocol::is_removed_in_modern(&env.method) {
        return Err(GatewayError::MethodNotFound(format!(
            "{} was removed in 2026-07-28",
            env.method
        )));
    }
    match env.kind {
        Kind::Response => {
            return Err(GatewayError::InvalidRequest(
                "clients do not send responses in 2026-07-28".into(),
            ));
        }
        Kind::Notification => {
            if let Some(m) = mh.method
                && m != env.method
            {
                return Err(GatewayError::HeaderMismatch(format!(
                    "Mcp-Method {m:?} does not match body method {:?}",
                    env.method
                )));
            }
            return Ok(());
        }
        Kind::Request => {}
    }
    let Some(m) = mh.method else {
        return Err(GatewayError::HeaderMismatch(
            "missing Mcp-Method header".into(),
        ));
    };
    if m != env.method {
        return Err(GatewayError::HeaderMismatch(format!(
            "Mcp-Method {m:?} does not match body method {:?}",
            env.method
        )));
    }
    if name_field(&env.method).is_some() && mh.name != env.name.as_deref() {
        return Err(GatewayError::HeaderMismatch(format!(
            "Mcp-Name {:?} does not match the body ({:?})",
            mh.name.unwrap_or(""),
            env.name.as_deref().unwrap_or("")
        )));
    }
    let Some(v) = &env.protocol_version else {
        return Err(GatewayError::InvalidParams(
            "params._meta must carry io.modelcontextprotocol/protocolVersion".into(),
        ));
    };
    if env.client_capabilities.is_none() {
        return Err(GatewayError::InvalidParams(
            "params._meta must carry io.modelcontextprotocol/clientCapabilities".into(),
        ));
    }
    if head.version != Some(v.as_str()) {
        return Err(GatewayError::HeaderMismatch(format!(
            "MCP-Protocol-Version {:?} does not match _meta protocolVersion {v:?}",
            head.version.unwrap_or("")
        )));
    }
    if mh.unknown_version {
        return Err(GatewayError::UnsupportedVersion {
            requested: v.clone(),
            supported: &crate::protocol::SUPPORTED_VERSIONS,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert!(origin_allowed(b"http://localhost:6274", &[]));
        assert!(origin_allowed(b"http://127.0.0.1", &[]));
        assert!(origin_allowed(b"http://[::1]:80", &[]));
        assert!(!origin_allowed(b"https://evil.example", &[]));
        assert!(!origin_allowed(b"null", &[]));
        let list = vec!["https://app.example".to_string()];
        assert!(origin_allowed(b"https://APP.example", &list));
        assert!(!origin_allowed(b"http://localhost", &list));
        assert!(origin_allowed(b"anything", &["*".to_string()]));
    }

    #[test]
    fn forwarding_allowlist() {
        for ok in [
            "mcp-method",
            "mcp-param-region",
            "traceparent",
            "content-type",
        ] {
            assert!(forwardable(&HeaderName::from_static(ok)), "{ok}");
        }
        for no in [
            "authorization",
            "cookie",
            "connection",
            "host",
            "mcp-session-id",
            "te",
        ] {
            assert!(!forwardable(&HeaderName::from_static(no)), "{no}");
        }
    }

    #[test]
    fn traceparent_is_kept_only_when_well_formed() {
        let check = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("traceparent", HeaderValue::from_str(v).unwrap());
            traceparent(&Seen::scan(&h)).is_some()
        };
        assert!(check(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        // A later version may append fields after a dash.
        assert!(check(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        for bad in [
            "",
            "hello",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!check(bad), "{bad:?}");
        }
        assert!(traceparent(&Seen::scan(&HeaderMap::new())).is_none());
    }
}
