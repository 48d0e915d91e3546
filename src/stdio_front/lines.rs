//! What the pipeline answers, turned into stdout lines: a request's answer (one JSON body, or
//! each event of a stream), a batch's, and an initialize-era session's GET stream, reopened
//! when it ends as an HTTP client reconnects. One task ([`write_lines`]) owns stdout, so lines
//! never interleave.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::body::Body;
use crate::error::GatewayError;
use crate::protocol::{self, Kind, RequestId};
use crate::resilience::Reconnect;
use crate::upstream::http::is_event_stream;

/// Largest single answer message relayed as one line.
const MAX_ANSWER_BYTES: usize = crate::sse::DEFAULT_MAX_EVENT_BYTES;
/// The first wait before a session's ended GET stream is reopened ([`Reconnect`]: doubled
/// after each wait, up to [`NOTES_REOPEN_MAX`], and back to this after a stream that lasted
/// that long).
const NOTES_REOPEN_MIN: Duration = Duration::from_millis(250);
const NOTES_REOPEN_MAX: Duration = Duration::from_secs(30);
/// stdout buffer; flushed whenever no line is waiting.
const WRITE_BUFFER: usize = 64 * 1024;

/// Turns the pipeline's response into stdout lines: each SSE event as it arrives, or the one
/// JSON body; 202 gives nothing. When `answers` (the line was a request), the client is owed a
/// response with its id: if the body ends without one, a JSON-RPC error stands in for it.
/// Otherwise nothing is written at all (notifications and responses are never answered).
pub(super) async fn relay(
    resp: Response<Body>,
    id: Option<&RequestId>,
    answers: bool,
    route: &str,
    out: &mpsc::Sender<Bytes>,
) {
    let (parts, body) = resp.into_parts();
    if !answers {
        if parts.status.as_u16() >= 400 {
            let text = read_capped(body).await.unwrap_or_default();
            tracing::debug!(status = parts.status.as_u16(), body = %String::from_utf8_lossy(&text),
                "a notification was refused");
        }
        return;
    }
    let mut answered = false;
    let failure = if is_event_stream(&parts.headers) {
        let mut events = Events::new(body);
        loop {
            match events.next().await {
                Ok(Some(ev)) => answered |= emit(&ev, out).await,
                Ok(None) => break None,
                Err(EventsEnd::Broke(e)) => break Some(format!("the answer stream broke: {e}")),
                Err(EventsEnd::TooLarge) => {
                    return fail(
                        id,
                        route,
                        "an answer message is larger than the relay limit",
                        out,
                    )
                    .await;
                }
            }
        }
    } else {
        match read_capped(body).await {
            Ok(b) if b.is_empty() && parts.status.is_success() => {
                // 202 to a request: nothing to relay, but the client waits for an answer.
                Some(format!("HTTP {} with no answer", parts.status.as_u16()))
            }
            Ok(b) => {
                answered = emit(&b, out).await;
                (!answered).then(|| format!("HTTP {} without a JSON-RPC answer", parts.status))
            }
            Err(e) => Some(e),
        }
    };
    if !answered {
        let why = failure.unwrap_or_else(|| "the answer stream ended without a response".into());
        fail(id, route, &why, out).await;
    }
}

/// The answer to a batch: a JSON array (one line), each event of a stream, or nothing (202).
pub(super) async fn relay_batch(resp: Response<Body>, out: &mpsc::Sender<Bytes>) {
    let (parts, body) = resp.into_parts();
    if !is_event_stream(&parts.headers) {
        if let Ok(b) = read_capped(body).await
            && !b.is_empty()
        {
            emit(&b, out).await;
        }
        return;
    }
    let mut events = Events::new(body);
    while let Ok(Some(ev)) = events.next().await {
        emit(&ev, out).await;
    }
}

/// How an event stream ended other than at its end.
enum EventsEnd {
    Broke(crate::body::BodyError),
    TooLarge,
}

/// The events of an SSE body, one message each, up to `MAX_ANSWER_BYTES` apiece.
struct Events {
    body: Body,
    dec: crate::sse::SseDecoder,
    ended: bool,
}

impl Events {
    fn new(body: Body) -> Events {
        Events {
            body,
            dec: crate::sse::SseDecoder::new(MAX_ANSWER_BYTES),
            ended: false,
        }
    }

    /// The next event; `None` once the body has ended (never polled past its end).
    async fn next(&mut self) -> Result<Option<Bytes>, EventsEnd> {
        loop {
            if let Some(ev) = self.dec.next_event().map_err(|_| EventsEnd::TooLarge)? {
                return Ok(Some(ev));
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.ended = true;
                    return Ok(self.dec.finish());
                }
                Some(Err(e)) => return Err(EventsEnd::Broke(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.dec.push(&data);
                    }
                }
            }
        }
    }
}

/// How a legacy session's GET stream is (re)opened: the request an HTTP client of the session
/// would send, through the pipeline.
pub(super) struct NotesLink {
    /// The generation each (re)opening goes to.
    pub(super) current: super::Current,
    pub(super) path: Arc<str>,
    pub(super) headers: HeaderMap,
}

impl NotesLink {
    /// The stream's body, or the status it was refused with.
    pub(super) async fn open(&self) -> Result<Body, http::StatusCode> {
        let mut req = Request::new(Full::new(Bytes::new()));
        req.extensions_mut().insert(crate::frontend::InProcess);
        *req.method_mut() = Method::GET;
        *req.uri_mut() =
            http::Uri::try_from(&*self.path).unwrap_or_else(|_| http::Uri::from_static("/"));
        *req.headers_mut() = self.headers.clone();
        let resp = crate::proxy::handle((self.current)(), req).await;
        if !resp.status().is_success() || !is_event_stream(resp.headers()) {
            return Err(resp.status());
        }
        Ok(resp.into_body())
    }
}

/// A session's GET stream: each message for the client a line. When the stream ends it is
/// reopened after a pause ([`Reconnect`]), as an HTTP client reconnects; it
/// stops for good when stdout is gone or the session is (404).
pub(super) async fn relay_notes(link: NotesLink, first: Body, out: mpsc::Sender<Bytes>) {
    let mut body = first;
    let mut reconnect = Reconnect::new(NOTES_REOPEN_MIN, NOTES_REOPEN_MAX);
    loop {
        relay_stream(body, &out).await;
        if out.is_closed() {
            return;
        }
        body = loop {
            reconnect.wait().await;
            if out.is_closed() {
                return;
            }
            match link.open().await {
                Ok(b) => {
                    reconnect.opened();
                    break b;
                }
                Err(http::StatusCode::NOT_FOUND) => {
                    tracing::info!("the session ended; its notification stream is not reopened");
                    return;
                }
                Err(status) => {
                    tracing::debug!(
                        status = status.as_u16(),
                        "the session's notification stream could not be reopened yet"
                    );
                }
            }
        };
        tracing::debug!("the session's notification stream was reopened");
    }
}

/// One opening of a GET stream, to its end. Only what is for the client becomes a line — its
/// notifications and the server's requests — not the error that ends a stream cut by
/// `[server] max_stream_ms` (a response to no request of the client's).
async fn relay_stream(body: Body, out: &mpsc::Sender<Bytes>) {
    let mut events = Events::new(body);
    loop {
        match events.next().await {
            Ok(Some(ev)) => {
                let for_client = protocol::parse_envelope(&ev)
                    .is_ok_and(|e| matches!(e.kind, Kind::Notification | Kind::Request));
                if !for_client {
                    continue;
                }
                emit(&ev, out).await;
                if out.is_closed() {
                    return;
                }
            }
            Ok(None) | Err(EventsEnd::Broke(_)) => return,
            Err(EventsEnd::TooLarge) => {
                tracing::warn!(
                    "a notification is larger than the relay limit; the session's notification stream is reopened"
                );
                return;
            }
        }
    }
}

/// Writes one message as one line; `true` when it is a JSON-RPC response (the end of an answer).
/// A message that spans lines (pretty-printed upstream JSON) is re-encoded compactly.
async fn emit(msg: &[u8], out: &mpsc::Sender<Bytes>) -> bool {
    let line = if msg.iter().any(|b| *b == b'\n' || *b == b'\r') {
        match serde_json::from_slice::<Value>(msg) {
            Ok(v) => Bytes::from(v.to_string()),
            Err(_) => return false,
        }
    } else {
        let trimmed = msg.trim_ascii();
        if trimmed.is_empty() || serde_json::from_slice::<serde::de::IgnoredAny>(trimmed).is_err() {
            return false;
        }
        Bytes::copy_from_slice(trimmed)
    };
    let is_response = crate::protocol::is_response(&line);
    let _ = out.send(line).await;
    is_response
}

/// The error line that stands in for an answer the upstream never gave.
async fn fail(id: Option<&RequestId>, route: &str, why: &str, out: &mpsc::Sender<Bytes>) {
    let err = GatewayError::BackendFailed {
        backend: route.to_string(),
        detail: why.to_string(),
    };
    let _ = out.send(Bytes::from(err.to_message(id))).await;
}

/// Reads a non-streamed body, refusing more than one message's worth.
async fn read_capped(body: Body) -> Result<Bytes, String> {
    match http_body_util::Limited::new(body, MAX_ANSWER_BYTES)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(format!("could not read the answer: {e}")),
    }
}

/// The only writer of stdout: whole lines, in the order they were queued; flushed whenever the
/// queue runs dry so an answer is never held back waiting for the next.
pub(super) async fn write_lines<W: AsyncWrite + Unpin>(w: W, mut rx: mpsc::Receiver<Bytes>) {
    // Buffered: tokio's stdout costs a blocking-pool round trip per write.
    let mut w = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, w);
    while let Some(msg) = rx.recv().await {
        let mut written = w.write_all(&msg).await;
        if written.is_ok() {
            written = w.write_all(b"\n").await;
        }
        if let Err(error) = written {
            tracing::warn!(%error, "cannot write to stdout; answers are dropped");
            break;
        }
        if rx.is_empty()
            && let Err(error) = w.flush().await
        {
            tracing::warn!(%error, "cannot flush stdout; answers are dropped");
            break;
        }
    }
    // Keep the senders from blocking on a dead stdout: drain until they are all gone.
    while rx.recv().await.is_some() {}
    let _ = w.flush().await;
}
