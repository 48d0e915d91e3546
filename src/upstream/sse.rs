//! The 2024-11-05 HTTP+SSE transport, as a message link for the connection actor of
//! `stdio/` (README "Configuration reference", `transport = "sse"`; docs/protocol.md §5).
//!
//! One upstream session is one event stream: portico GETs the backend's URL
//! (`Accept: text/event-stream`); the server's first event, `endpoint`, names where the
//! messages of this session are POSTed (usually `/messages?sessionId=…`); the server answers
//! each POST `202 Accepted` and sends every message of its own — responses, notifications, its
//! requests — as a `message` event on the stream. So the stream is to this transport what a
//! child's stdout is to stdio, and the POSTs its stdin: the actor in `stdio/actor.rs` owns the link
//! and does everything above it (id and progress-token rewriting, routing answers, server
//! requests to the call in flight, broadcast of other notifications, reconnecting with backoff
//! when the stream ends, which the bridge sees as a new generation to re-initialize).
//!
//! Security: the endpoint must stay on the backend's origin (scheme, host and port of `url`);
//! anything else is refused, so a backend cannot make portico POST its clients' messages (with
//! the configured `headers`) elsewhere. Every wait is bounded: the stream's head and the
//! `endpoint` event by `timeout_ms`, each POST by `timeout_ms`; a failed POST ends the session.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Uri, header};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::http::{HttpUpstream, UpBody};
use crate::sse::SseDecoder;

/// How long an open event stream may last before portico reads it under a new deadline; the
/// lean client enforces a deadline on every body, and a session stream has none of its own.
const STREAM_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Where a backend's sessions are opened, and how.
pub struct SseTarget {
    up: Arc<HttpUpstream>,
    /// The configured URL (scheme, authority, path): what the endpoint is resolved against.
    base: Uri,
    max_event: usize,
    timeout: Duration,
    /// Headers of this session's owner (its team's `team_headers`), on the GET and every POST.
    extra: Vec<(HeaderName, HeaderValue)>,
}

impl SseTarget {
    /// The same target for one owner, with its team's headers.
    pub fn with_headers(&self, extra: &[(HeaderName, HeaderValue)]) -> SseTarget {
        SseTarget {
            up: self.up.clone(),
            base: self.base.clone(),
            max_event: self.max_event,
            timeout: self.timeout,
            extra: extra.to_vec(),
        }
    }

    pub fn new(up: Arc<HttpUpstream>, url: &str) -> Result<SseTarget, String> {
        let base: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        Ok(SseTarget {
            max_event: up.max_answer,
            timeout: up.timeout,
            up,
            base,
            extra: Vec::new(),
        })
    }
}

/// The messages of one open session, as the server sends them.
pub struct SseConn {
    body: UpBody,
    decoder: SseDecoder,
    /// Why the poster gave up (a POST failed): the session is over.
    pub dead: mpsc::UnboundedReceiver<String>,
}

impl SseConn {
    /// The next `message` event's data; `Ok(None)` when the server ended the stream.
    /// Cancel-safe: bytes are only taken from the body when they are pushed into the decoder.
    pub async fn next_message(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            match self.decoder.next_event() {
                Err(_) => return Err("an SSE event exceeded max_answer_bytes".into()),
                Ok(Some(data)) => match self.decoder.event_type() {
                    b"" | b"message" => return Ok(Some(data)),
                    // Another `endpoint` (or an unknown type): nothing to route.
                    _ => continue,
                },
                Ok(None) => {}
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(format!("the SSE stream failed: {e}")),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
            }
        }
    }
}

/// Where the messages of a session go: lines written here are POSTed in order.
pub type Poster = super::LineQueue;

/// Opens one session: the GET, then the `endpoint` event (both within `timeout_ms`), and a
/// poster task for its messages.
pub async fn connect(t: &SseTarget) -> Result<(SseConn, Poster), String> {
    connect_within(t, t.timeout).await
}

/// [`connect`] within `wait` (the probe's fallback waits less: a server of this transport names
/// its endpoint as the stream opens, while a Streamable HTTP server may hold a GET open silently).
pub async fn connect_within(t: &SseTarget, wait: Duration) -> Result<(SseConn, Poster), String> {
    let deadline = Instant::now() + wait;
    let req = t.up.get_events(&t.extra);
    let ex =
        t.up.exchange(req, deadline)
            .await
            .map_err(|e| format!("GET of the SSE stream failed: {e}"))?;
    let status = ex.response.status();
    if !status.is_success() || !super::http::is_event_stream(ex.response.headers()) {
        return Err(format!(
            "GET of the SSE stream answered HTTP {status} without an event stream"
        ));
    }
    let mut body = ex.response.into_body();
    if let UpBody::H1(b) = &mut body {
        b.set_deadline(Instant::now() + STREAM_LIFETIME);
    }
    let (dead_tx, dead) = mpsc::unbounded_channel();
    let mut conn = SseConn {
        body,
        decoder: SseDecoder::new(t.max_event),
        dead,
    };
    let endpoint = tokio::time::timeout_at(deadline, first_endpoint(&mut conn))
        .await
        .map_err(|_| "no endpoint event before timeout_ms".to_string())??;
    let target = resolve_endpoint(&t.base, &endpoint)?;
    let (tx, rx) = super::LineQueue::new();
    let mut head = t.extra.clone();
    head.push((
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    ));
    tokio::spawn(post_lines(
        t.up.clone(),
        target,
        head,
        t.timeout,
        rx,
        dead_tx,
    ));
    Ok((conn, tx))
}

/// Reads up to the `endpoint` event; a `message` before it is a broken server.
async fn first_endpoint(conn: &mut SseConn) -> Result<String, String> {
    loop {
        match conn.decoder.next_event() {
            Err(_) => return Err("an SSE event exceeded max_answer_bytes".into()),
            Ok(Some(data)) if conn.decoder.event_type() == b"endpoint" => {
                return String::from_utf8(data.to_vec())
                    .map(|s| s.trim().to_string())
                    .map_err(|_| "the endpoint event is not UTF-8".into());
            }
            Ok(Some(_)) => return Err("a message arrived before the endpoint event".into()),
            Ok(None) => {}
        }
        match conn.body.frame().await {
            None => return Err("the SSE stream ended before the endpoint event".into()),
            Some(Err(e)) => return Err(format!("the SSE stream failed: {e}")),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    conn.decoder.push(&data);
                }
            }
        }
    }
}

/// The endpoint a server named, as a request target on the backend's own origin: a path
/// (absolute, or relative to the URL's directory) or an absolute URL with the same scheme,
/// host and port. Anything else (another origin, `//host/…`) is refused.
pub fn resolve_endpoint(base: &Uri, endpoint: &str) -> Result<Uri, String> {
    let refuse = || format!("endpoint {endpoint:?} is not on the backend's origin; refused");
    let target = if endpoint.starts_with("//") {
        return Err(refuse());
    } else if endpoint.starts_with('/') {
        endpoint.to_string()
    } else if let Ok(abs) = endpoint.parse::<Uri>()
        && abs.scheme().is_some()
    {
        let same = abs.scheme() == base.scheme()
            && abs.host().map(str::to_ascii_lowercase) == base.host().map(str::to_ascii_lowercase)
            && port_of(&abs) == port_of(base);
        if !same {
            return Err(refuse());
        }
        abs.path_and_query().map_or("/", |p| p.as_str()).to_string()
    } else if endpoint.contains(':') && !endpoint.contains('/') {
        return Err(refuse());
    } else {
        let path = base.path();
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        format!("{}{endpoint}", if dir.is_empty() { "/" } else { dir })
    };
    target
        .parse::<Uri>()
        .ok()
        .filter(|u| u.scheme().is_none() && u.path().starts_with('/'))
        .ok_or_else(|| format!("endpoint {endpoint:?} is not a valid request target"))
}

fn port_of(u: &Uri) -> Option<u16> {
    u.port_u16().or(match u.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    })
}

/// POSTs each message of the session in order (the server reads them in the order sent); the
/// first failure ends the session (a 404: the server forgot it).
async fn post_lines(
    up: Arc<HttpUpstream>,
    target: Uri,
    head: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    mut rx: super::LineRx,
    dead: mpsc::UnboundedSender<String>,
) {
    while let Some(line) = rx.recv().await {
        let body = line.slice(..line.len() - usize::from(line.ends_with(b"\n")));
        let mut req = up.request(&HeaderMap::new(), &head, body);
        *req.uri_mut() = target.clone();
        let deadline = Instant::now() + timeout;
        let sent = up.exchange(req, deadline).await;
        rx.written(line.len());
        let why = match sent {
            Ok(ex) => {
                let status = ex.response.status();
                // Read the (small) answer so the exchange ends; its content says nothing.
                let _ = tokio::time::timeout_at(deadline, ex.response.into_body().collect()).await;
                if status.is_success() {
                    continue;
                }
                format!("a POST to the session endpoint answered HTTP {status}")
            }
            Err(e) => format!("a POST to the session endpoint failed: {e}"),
        };
        let _ = dead.send(why);
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_stay_on_the_backends_origin() {
        let base: Uri = "http://127.0.0.1:8080/mcp/sse".parse().unwrap();
        let ok = |e: &str| resolve_endpoint(&base, e).map(|u| u.to_string());
        assert_eq!(
            ok("/messages?sessionId=a1").unwrap(),
            "/messages?sessionId=a1"
        );
        assert_eq!(
            ok("messages?sessionId=a1").unwrap(),
            "/mcp/messages?sessionId=a1"
        );
        assert_eq!(
            ok("http://127.0.0.1:8080/m?sessionId=x").unwrap(),
            "/m?sessionId=x"
        );
        for bad in [
            "http://evil.example/m",
            "http://127.0.0.1:9090/m",
            "https://127.0.0.1:8080/m",
            "//evil.example/m",
            "javascript:alert(1)",
        ] {
            assert!(ok(bad).is_err(), "{bad} must be refused");
        }
    }
}
