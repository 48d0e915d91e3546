//! Streamable HTTP upstreams. Plain `http://` backends go through the lean in-task HTTP/1.1
//! client in `h1`; TLS backends (HTTP/1.1 or h2) through a pooled client built directly on
//! hyper's connection API, described below.
//!
//! Why not hyper-util's pooled `Client`: on this path every microsecond shows in the benchmark,
//! and the generic client pays for a connector service, a mutex-guarded pool and extra tasks per
//! request. Here a pool is a lock-free queue of ready `SendRequest`s; an HTTP/1.1 connection goes
//! back to the queue when the relayed answer has been read to its end, and is simply dropped
//! (closing the TCP connection — which is how a backend learns a request was cancelled) when the
//! client goes away first.

use bytes::{Bytes, BytesMut};
use crossbeam_queue::ArrayQueue;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::h1::{self, H1Body};
use super::{AnswerCheck, CallClock, MessageStream, Reply, UpstreamError};
use crate::config::BackendConfig;
use crate::error::{BodyError, GatewayError};
use crate::protocol::{LATEST_VERSION, header as h, sniff_id};
use crate::sse::sse_event;
use crate::sse::{EventEnds, SseDecoder};

mod relay;

pub use relay::{RelayBody, TimedOut, async_stream};
use relay::{Resume, sse_messages};

/// A live connection to the backend.
enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

/// TLS settings for an https backend.
struct Tls {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls_pki_types::ServerName<'static>,
}

/// One Streamable HTTP backend and its connection pool.
pub struct HttpUpstream {
    /// Backend name, for errors and logs.
    pub name: Arc<str>,
    /// Request target sent on the wire (origin form: path and query).
    path: Uri,
    /// `Host` header value.
    host: HeaderValue,
    /// `host:port` to connect to.
    addr: String,
    tls: Option<Tls>,
    /// Configured static headers, already validated; applied after the forwarded ones.
    static_headers: Vec<(HeaderName, HeaderValue)>,
    /// Deadline for one exchange; for an SSE answer, the longest silence between messages.
    pub timeout: Duration,
    /// Longest a streamed answer may run in all (`max_call_ms`).
    pub max_call: Option<Duration>,
    /// Largest answer held on the message path: a JSON body, or one SSE event
    /// (`max_answer_bytes`).
    pub max_answer: usize,
    /// Ready connections (TLS backends). HTTP/2 connections sit here too: they are pushed back
    /// at checkout, since one serves many requests at once.
    idle: ArrayQueue<Sender>,
    /// Ready connections of the lean client (plain `http://` backends).
    lean: h1::Pool,
}

/// The answer to a pass-through request, still streaming.
pub struct Exchange {
    pub response: Response<UpBody>,
    conn: Option<Sender>,
}

/// An answer body as the client that read its head hands it over.
pub enum UpBody {
    /// From a hyper connection (TLS backends).
    Hyper(Incoming),
    /// From the lean client (plain `http://` backends); it enforces the deadline itself.
    H1(H1Body),
}

impl http_body::Body for UpBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpBody::Hyper(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| Box::new(e) as BodyError))),
            UpBody::H1(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Hyper(b) => b.is_end_stream(),
            UpBody::H1(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Hyper(b) => b.size_hint(),
            UpBody::H1(b) => b.size_hint(),
        }
    }
}

impl HttpUpstream {
    pub fn new(cfg: &BackendConfig, url: &str) -> Result<HttpUpstream, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or("url has no host")?.to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let addr = if bare_host.contains(':') {
            format!("[{bare_host}]:{port}")
        } else {
            format!("{bare_host}:{port}")
        };
        let host_header = match uri.port_u16() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let path: Uri = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .parse()
            .map_err(|e| format!("{url}: {e}"))?;
        let tls = if https {
            Some(Tls {
                connector: tls_connector(cfg.ca_file.as_deref(), &[b"h2", b"http/1.1"])?,
                server_name: rustls_pki_types::ServerName::try_from(bare_host)
                    .map_err(|e| format!("{url}: {e}"))?,
            })
        } else {
            None
        };
        let mut static_headers = Vec::new();
        for (k, v) in &cfg.headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
            let value = HeaderValue::from_str(v).map_err(|e| e.to_string())?;
            static_headers.push((name, value));
        }
        Ok(HttpUpstream {
            name: cfg.name.as_str().into(),
            path,
            host: HeaderValue::from_str(&host_header).map_err(|e| e.to_string())?,
            addr,
            tls,
            static_headers,
            timeout: Duration::from_millis(cfg.timeout_ms),
            max_call: Some(cfg.max_call()),
            max_answer: cfg.max_answer_bytes.max(1),
            idle: ArrayQueue::new(cfg.max_idle_connections.max(1)),
            lean: h1::Pool::new(cfg.max_idle_connections),
        })
    }

    /// Builds the upstream request: the allowlisted client headers (never credentials), the
    /// configured static headers, then the caller's extra ones.
    pub fn request(
        &self,
        client_headers: &HeaderMap,
        extra: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Request<Bytes> {
        let mut req = Request::new(body);
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.path.clone();
        let h = req.headers_mut();
        h.reserve(client_headers.len() + self.static_headers.len() + extra.len() + 1);
        h.insert(header::HOST, self.host.clone());
        for (name, value) in client_headers {
            if crate::frontend::forwardable(name) {
                h.append(name.clone(), value.clone());
            }
        }
        // The caller's extra headers (MCP mirrors, session id, per-team credentials) win over
        // the static ones.
        for (name, value) in self.static_headers.iter().chain(extra.iter()) {
            h.insert(name.clone(), value.clone());
        }
        req
    }

    /// A `GET` for an event stream: [`request`](Self::request) with no client headers and no
    /// body, `Accept: text/event-stream`, and no `Content-Type` (a configured one describes
    /// POSTed bodies). A legacy session's standalone stream (`bridge::stream_request`) and the
    /// SSE transport's stream (`sse::connect`).
    pub fn get_events(&self, extra: &[(HeaderName, HeaderValue)]) -> Request<Bytes> {
        let mut req = self.request(&HeaderMap::new(), extra, Bytes::new());
        *req.method_mut() = Method::GET;
        let h = req.headers_mut();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        h.remove(header::CONTENT_TYPE);
        req
    }

    /// When the head of an answer to a request due by `deadline` is due: within `timeout_ms`
    /// of sending, however long the body may run. Only a long-lived stream (a listen stream, a
    /// legacy session's GET stream, the invalidation watcher's) has a later `deadline`; a
    /// backend that never answers one must not hold the caller, and its admission slot, until
    /// then. Every other request's deadline is its arrival plus `timeout_ms`, already sooner.
    fn head_due(&self, deadline: Instant) -> Instant {
        deadline.min(Instant::now() + self.timeout)
    }

    /// Pass-through: `request` + `exchange` in one step. On the lean client the request head is
    /// written straight from the client's headers, with no intermediate `HeaderMap`.
    pub async fn forward(
        &self,
        client_headers: &HeaderMap,
        extra: &[(HeaderName, HeaderValue)],
        body: &Bytes,
        deadline: Instant,
    ) -> Result<Exchange, UpstreamError> {
        if self.tls.is_some() {
            let req = self.request(client_headers, extra, body.clone());
            return self.exchange(req, deadline).await;
        }
        let encode = |out: &mut Vec<u8>| {
            let target = self.path.path_and_query().map_or("/", |p| p.as_str());
            h1::encode_start(out, &Method::POST, target, body.len());
            h1::encode_header(out, &header::HOST, &self.host);
            // The same precedence as `request`: extra over static over the client's.
            let set_later = |name: &HeaderName| {
                self.static_headers.iter().any(|(n, _)| n == name)
                    || extra.iter().any(|(n, _)| n == name)
            };
            for (name, value) in client_headers {
                if crate::frontend::forwardable(name) && !set_later(name) {
                    h1::encode_header(out, name, value);
                }
            }
            for (name, value) in &self.static_headers {
                if !extra.iter().any(|(n, _)| n == name) {
                    h1::encode_header(out, name, value);
                }
            }
            for (i, (name, value)) in extra.iter().enumerate() {
                // `insert` semantics: the last of a repeated name wins.
                if !extra[i + 1..].iter().any(|(n, _)| n == name) {
                    h1::encode_header(out, name, value);
                }
            }
            h1::encode_end(out, &Method::POST, body);
        };
        let head = self.head_due(deadline);
        let response = h1::exchange(&self.lean, &self.addr, head, deadline, encode).await?;
        Ok(Exchange {
            response: response.map(UpBody::H1),
            conn: None,
        })
    }

    /// Sends one request and returns the response head; the body streams afterwards.
    pub async fn exchange(
        &self,
        req: Request<Bytes>,
        deadline: Instant,
    ) -> Result<Exchange, UpstreamError> {
        let head = self.head_due(deadline);
        if self.tls.is_none() {
            let response = h1::exchange(&self.lean, &self.addr, head, deadline, |out| {
                h1::encode(&req, out)
            })
            .await?;
            return Ok(Exchange {
                response: response.map(UpBody::H1),
                conn: None,
            });
        }
        match tokio::time::timeout_at(head, self.exchange_inner(req.map(Full::new))).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn exchange_inner(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Exchange, UpstreamError> {
        // A pooled connection may have been closed by the backend a moment ago; hyper hands the
        // request back when it was never written, and only then is it safe to try again.
        for _ in 0..3 {
            let (mut conn, reused) = match self.checkout().await {
                Some(c) => (c, true),
                // Boxed: connecting (TLS, an h2 handshake) is a large future, and inline it
                // would enlarge every request's state by several KB.
                None => (Box::pin(self.connect()).await?, false),
            };
            let result = match &mut conn {
                Sender::H1(s) => s.try_send_request(req).await,
                Sender::H2(s) => s.try_send_request(req).await,
            };
            match result {
                // hyper accepts any three digits; see `h1::parse_head` for why 600–999 is not
                // relayed. Dropping `conn` closes it.
                Ok(response) if response.status().as_u16() > 599 => {
                    return Err(UpstreamError::Protocol(format!(
                        "bad status {}",
                        response.status().as_u16()
                    )));
                }
                Ok(response) => {
                    return Ok(Exchange {
                        response: response.map(UpBody::Hyper),
                        conn: Some(conn),
                    });
                }
                Err(mut e) => match e.take_message() {
                    Some(r) if reused => req = r,
                    _ => {
                        return Err(if reused || e.error().is_canceled() {
                            UpstreamError::Closed(format!("connection lost: {}", e.error()))
                        } else {
                            UpstreamError::Closed(e.error().to_string())
                        });
                    }
                },
            }
        }
        Err(UpstreamError::Connect("no usable connection".into()))
    }

    async fn checkout(&self) -> Option<Sender> {
        while let Some(mut conn) = self.idle.pop() {
            if conn.is_closed() {
                continue;
            }
            match &mut conn {
                Sender::H1(s) => {
                    if !s.is_ready() && s.ready().await.is_err() {
                        continue;
                    }
                }
                Sender::H2(s) => {
                    if s.ready().await.is_err() {
                        continue;
                    }
                    let _ = self.idle.push(Sender::H2(s.clone()));
                }
            }
            return Some(conn);
        }
        None
    }

    fn release(&self, conn: Sender) {
        if let Sender::H1(s) = &conn
            && !s.is_closed()
        {
            // A full queue drops the connection: we keep at most max_idle_connections.
            let _ = self.idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Sender, UpstreamError> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake_h1(TokioIo::new(tcp)).await,
            Some(tls) => {
                let stream = tls
                    .connector
                    .connect(tls.server_name.clone(), tcp)
                    .await
                    .map_err(|e| UpstreamError::Connect(format!("TLS: {e}")))?;
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                if h2 {
                    let (s, conn) = http2::Builder::new(TokioExecutor::new())
                        .handshake(TokioIo::new(stream))
                        .await
                        .map_err(|e| UpstreamError::Connect(e.to_string()))?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    let sender = Sender::H2(s.clone());
                    let _ = self.idle.push(Sender::H2(s));
                    Ok(sender)
                } else {
                    handshake_h1(TokioIo::new(stream)).await
                }
            }
        }
    }

    /// Pass-through: wraps the upstream answer so it streams to the client untouched, returns
    /// the connection to the pool at its end, and enforces the deadline — for an SSE answer,
    /// moved on by each event the backend sends ([`CallClock`]).
    pub fn relay(
        self: &Arc<Self>,
        ex: Exchange,
        deadline: Instant,
        request_body: Bytes,
    ) -> (http::response::Parts, RelayBody) {
        let (parts, inner) = ex.response.into_parts();
        let sse = is_event_stream(&parts.headers);
        let mut body = RelayBody {
            inner,
            upstream: Arc::clone(self),
            conn: ex.conn,
            deadline,
            sleep: None,
            on_break: sse.then_some(request_body),
            clock: sse.then(|| {
                (
                    CallClock::new(deadline, self.timeout, self.max_call),
                    EventEnds::default(),
                )
            }),
            at_boundary: true,
            unclocked: 0,
            done: false,
        };
        if body.inner.is_end_stream() {
            // An empty answer (202, 204): nobody may poll it, so recycle the connection now.
            body.finish_ok();
        }
        (parts, body)
    }

    /// Message path: sends a request and decodes the answer (JSON or SSE) into JSON-RPC messages.
    ///
    /// What is held here is bounded by `max_answer` (a JSON body; each SSE event), and a
    /// successful answer must be what docs/protocol.md §4 says it is: one JSON-RPC response as
    /// JSON, or SSE events that are JSON-RPC messages ending with the response. Anything else
    /// is the backend's fault (`Protocol`, a 502 naming it) rather than a 200 carrying broken
    /// bytes. Refusals (4xx/5xx) are returned as they are: their status already says the
    /// request failed, and the bridge's probe reads refusals of any shape (docs/protocol.md §5).
    /// An answer given up on is dropped mid-read, which closes its connection (it never goes
    /// back to the pool with unread bytes).
    pub async fn call(
        self: &Arc<Self>,
        req: Request<Bytes>,
        deadline: Instant,
    ) -> Result<Reply, UpstreamError> {
        // Only a POSTed request is owed a response; a GET stream (legacy notifications) is not.
        let request = (req.method() == Method::POST).then(|| req.body().clone());
        // Only an answer owed to a POST may be resumed: a GET's headers are not looked at.
        let session = request
            .as_ref()
            .and_then(|_| Resume::session_headers(|n| req.headers().get(n).cloned()));
        let ex = self.exchange(req, deadline).await?;
        self.answer(ex, request, deadline, AnswerCheck::Upstream, || session)
            .await
    }

    /// [`HttpUpstream::call`] of `request(client_headers, extra, body)`, the message path's
    /// POST, with the head written as [`HttpUpstream::forward`] writes it: no `Request` and no
    /// `HeaderMap` built in between (callgrind: ~3 k instructions of a bridged or checked call).
    pub async fn post(
        self: &Arc<Self>,
        client_headers: &HeaderMap,
        extra: &[(HeaderName, HeaderValue)],
        body: Bytes,
        deadline: Instant,
        check: AnswerCheck,
    ) -> Result<Reply, UpstreamError> {
        let ex = self.forward(client_headers, extra, &body, deadline).await?;
        let session = || {
            Resume::session_headers(|n| {
                let mut sent = extra.iter().filter(|(k, _)| k == n).map(|(_, v)| v);
                sent.next().or_else(|| client_headers.get(n)).cloned()
            })
        };
        self.answer(ex, Some(body), deadline, check, session).await
    }

    /// The message path's reading of an answer (`request`: the POSTed body, which is owed one;
    /// `check`: whether a JSON answer is checked here or by the caller; `session`: the
    /// request's initialize-era session headers, asked for only when the answer is a stream,
    /// which may then be resumed).
    async fn answer(
        self: &Arc<Self>,
        ex: Exchange,
        request: Option<Bytes>,
        deadline: Instant,
        check: AnswerCheck,
        session: impl FnOnce() -> Option<Vec<(HeaderName, HeaderValue)>>,
    ) -> Result<Reply, UpstreamError> {
        let status = ex.response.status();
        let (parts, body) = self.relay(ex, deadline, Bytes::new());
        let headers = parts.headers;
        // The relay's SSE error injection is for pass-through; here errors surface as Err items.
        let mut body = body;
        body.on_break = None;
        if status == StatusCode::ACCEPTED {
            return Ok(Reply {
                status,
                headers,
                messages: MessageStream::Empty,
            });
        }
        let limit = self.max_answer;
        if is_event_stream(&headers) {
            return Ok(Reply {
                status,
                headers,
                messages: MessageStream::Many(Box::pin(sse_messages(
                    body,
                    limit,
                    request,
                    session().map(|headers| Resume {
                        headers,
                        clock: CallClock::new(deadline, self.timeout, self.max_call),
                        deadline,
                    }),
                ))),
            });
        }
        // A declared length over the bound fails before a byte of the body is read.
        if body.size_hint().lower() > limit as u64 {
            return Err(too_large(limit));
        }
        let bytes = collect_bounded(&mut body, limit).await?;
        let owed = || request.as_deref().and_then(sniff_id).is_some();
        if bytes.is_empty() {
            if status.is_success() && owed() {
                return Err(UpstreamError::Protocol(
                    "the answer to a request is empty".into(),
                ));
            }
            return Ok(Reply {
                status,
                headers,
                messages: MessageStream::Empty,
            });
        }
        if status.is_success() && check == AnswerCheck::Upstream {
            match shape(&bytes) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(UpstreamError::Protocol(
                        "the answer is not a JSON-RPC response".into(),
                    ));
                }
                Err(what) => return Err(UpstreamError::Protocol(format!("the answer {what}"))),
            }
        }
        Ok(Reply {
            status,
            headers,
            messages: MessageStream::One(bytes),
        })
    }
}

fn too_large(limit: usize) -> UpstreamError {
    UpstreamError::Protocol(format!(
        "the answer exceeds max_answer_bytes ({limit} bytes)"
    ))
}

/// A body error as an upstream error: the deadline, broken framing (the backend's fault), or
/// a connection that ended early.
fn body_error(e: BodyError) -> UpstreamError {
    if e.downcast_ref::<TimedOut>().is_some() {
        UpstreamError::Timeout
    } else if let Some(h1::H1Error::Chunked) = e.downcast_ref::<h1::H1Error>() {
        UpstreamError::Protocol(e.to_string())
    } else {
        UpstreamError::Closed(e.to_string())
    }
}

/// Reads a whole answer body, giving up (and so dropping the connection) once it passes
/// `limit` bytes. A body that arrives in one frame is returned without a copy.
async fn collect_bounded(body: &mut RelayBody, limit: usize) -> Result<Bytes, UpstreamError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let Ok(data) = frame.map_err(body_error)?.into_data() else {
            continue; // trailers
        };
        len += data.len();
        if len > limit {
            return Err(too_large(limit));
        }
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let rest = usize::try_from(body.size_hint().lower()).unwrap_or(limit);
                let mut j = BytesMut::with_capacity(len.saturating_add(rest).min(limit));
                j.extend_from_slice(f);
                j.extend_from_slice(&data);
                joined = Some(j);
            }
            (Some(_), Some(j)) => j.extend_from_slice(&data),
        }
    }
    Ok(match joined {
        Some(j) => j.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// What one answer message is, read in a single pass that also checks it is complete JSON:
/// `Ok(true)` a JSON-RPC response (a `result` or `error`, no `method`), `Ok(false)` another
/// JSON-RPC message (a notification or request about the call), `Err` not a JSON-RPC message
/// (its words complete "the answer …").
pub(crate) fn shape(msg: &[u8]) -> Result<bool, &'static str> {
    // The members scanner first (a third of serde's cost here; README "Crates, and what portico
    // writes itself"); serde reads what it refuses, for the words.
    let mut members = crate::protocol::ResponseMembers::default();
    let read = std::str::from_utf8(msg).ok().and_then(|text| {
        crate::jsonrpc::scan_members(text, |name, at| {
            let value = at.skip()?;
            members.note(&name, value.raw().get());
            Some(value)
        })
    });
    match read {
        Some(()) if members.repeated() => Err("is not a JSON-RPC message"),
        Some(()) => Ok(members.is_response()),
        None => shape_by_serde(msg),
    }
}

/// [`shape`] by serde_json: its reading for the words of a refusal, and the reference the
/// scanner's reading is tested against.
fn shape_by_serde(msg: &[u8]) -> Result<bool, &'static str> {
    #[derive(serde::Deserialize)]
    struct Shape<'a> {
        #[serde(borrow)]
        method: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        result: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        error: Option<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_slice::<Shape<'_>>(msg) {
        Ok(s) => Ok(s.method.is_none() && (s.result.is_some() || s.error.is_some())),
        Err(e) if e.is_eof() => Err("is truncated JSON"),
        Err(e) if e.is_syntax() => Err("is not valid JSON"),
        Err(_) => Err("is not a JSON-RPC message"),
    }
}

async fn handshake_h1<T>(io: T) -> Result<Sender, UpstreamError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (s, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| UpstreamError::Connect(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Sender::H1(s))
}

/// The rustls client setup portico uses for every outgoing TLS connection (backends, JWKS):
/// the webpki roots plus an optional PEM `ca_file`, offering the given ALPN protocols.
pub fn tls_connector(
    ca_file: Option<&std::path::Path>,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        use rustls_pki_types::pem::PemObject;
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

#[cfg(test)]
mod tests;
