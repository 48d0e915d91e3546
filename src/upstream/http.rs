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
use crate::protocol::sniff_id;
use crate::sse::sse_event;
use crate::sse::{EventEnds, SseDecoder};

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
        let response = h1::exchange(&self.lean, &self.addr, deadline, encode).await?;
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
        if self.tls.is_none() {
            let response = h1::exchange(&self.lean, &self.addr, deadline, |out| {
                h1::encode(&req, out)
            })
            .await?;
            return Ok(Exchange {
                response: response.map(UpBody::H1),
                conn: None,
            });
        }
        match tokio::time::timeout_at(deadline, self.exchange_inner(req.map(Full::new))).await {
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
        let ex = self.exchange(req, deadline).await?;
        self.answer(ex, request, deadline, AnswerCheck::Upstream)
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
        self.answer(ex, Some(body), deadline, check).await
    }

    /// The message path's reading of an answer (`request`: the POSTed body, which is owed one;
    /// `check`: whether a JSON answer is checked here or by the caller).
    async fn answer(
        self: &Arc<Self>,
        ex: Exchange,
        request: Option<Bytes>,
        deadline: Instant,
        check: AnswerCheck,
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
                messages: MessageStream::Many(Box::pin(sse_messages(body, limit, request))),
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

/// The body error a relay ends with when the deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("backend answer exceeded the deadline")]
pub struct TimedOut;

/// An upstream answer relayed to the client as it arrives.
pub struct RelayBody {
    inner: UpBody,
    upstream: Arc<HttpUpstream>,
    /// Back to the pool once the answer has been read to its end; dropped (closing the
    /// connection, which the backend sees as cancellation) if the client leaves first.
    conn: Option<Sender>,
    deadline: Instant,
    /// Armed only when the upstream makes us wait, so a body that is already there costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
    /// For SSE answers: the request body, to address an error event to the request's id if the
    /// stream breaks or times out (a 200 has been sent, so only an in-stream error can tell the
    /// client).
    on_break: Option<Bytes>,
    /// For SSE answers: the call's clock and the event boundaries that move it.
    clock: Option<(CallClock, EventEnds)>,
    /// For SSE answers: the bytes relayed so far end an event (or none were relayed). An error
    /// event appended to half an event would merge into it, so a break mid-event aborts instead.
    at_boundary: bool,
    /// Bytes relayed since the clock was last read. The timer is polled only when the backend
    /// makes us wait, and a backend that never does (an endless body at full speed) would
    /// never be cut; reading the clock every `CLOCK_EVERY` bytes enforces the deadline there
    /// too, at the cost of a counter per frame.
    unclocked: usize,
    done: bool,
}

/// Bytes relayed between two looks at the clock while the backend keeps the relay busy.
const CLOCK_EVERY: usize = 64 * 1024;

impl RelayBody {
    fn finish_ok(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            self.upstream.release(conn);
        }
        if let UpBody::H1(b) = &mut self.inner {
            h1::recycle(&self.upstream.lean, b);
        }
    }

    fn fail(&mut self, why: &str, err: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.done = true;
        self.conn = None;
        // Drops the upstream connection now (H1: the socket; hyper: the body, which closes
        // its connection), rather than when the client's response is dropped.
        self.inner = UpBody::H1(h1::H1Body::ended());
        match self.on_break.take() {
            Some(req) if self.at_boundary => {
                let id = sniff_id(&req);
                let msg = GatewayError::BackendFailed {
                    backend: self.upstream.name.to_string(),
                    detail: why.to_string(),
                }
                .to_message(id.as_ref());
                Poll::Ready(Some(Ok(Frame::data(sse_event(&msg)))))
            }
            _ => Poll::Ready(Some(Err(err))),
        }
    }

    fn timed_out(&mut self, err: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let ms = self.upstream.timeout.as_millis();
        let why = match &self.clock {
            Some((clock, _)) if clock.past_hard() => format!(
                "did not finish within max_call_ms ({} ms)",
                self.upstream.max_call.unwrap_or_default().as_millis()
            ),
            Some(_) => format!("sent no message for {ms} ms"),
            None => format!("did not finish within {ms} ms"),
        };
        self.fail(&why, err)
    }

    /// A message went by on an SSE answer: the deadline moves on (never past the hard bound).
    fn message_seen(&mut self) {
        let Some((clock, _)) = &self.clock else {
            return;
        };
        let next = clock.after_message();
        self.deadline = next;
        if let UpBody::H1(b) = &mut self.inner {
            b.set_deadline(next);
        }
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(next);
        }
    }
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.unclocked += data.len();
                    if this.unclocked >= CLOCK_EVERY {
                        this.unclocked = 0;
                        if Instant::now() >= this.deadline {
                            return this.timed_out(Box::new(TimedOut));
                        }
                    }
                    if this.on_break.is_some() && !data.is_empty() {
                        this.at_boundary = data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n");
                    }
                    if let Some((_, ends)) = &mut this.clock
                        && ends.feed(data)
                    {
                        this.message_seen();
                    }
                }
                if this.inner.is_end_stream() {
                    this.finish_ok();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish_ok();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) if e.downcast_ref::<TimedOut>().is_some() => {
                this.timed_out(e)
            }
            Poll::Ready(Some(Err(e))) => this.fail("closed the stream", e),
            // The lean client's body watches the deadline itself.
            Poll::Pending if matches!(this.inner, UpBody::H1(_)) => Poll::Pending,
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => this.timed_out(Box::new(TimedOut)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// Decodes an SSE answer into JSON-RPC messages, ending with an error item if the stream breaks,
/// an event passes `limit` bytes or is not a JSON-RPC message, or (for a POSTed request, given
/// as `request`) the stream ends without the response (docs/protocol.md §4).
fn sse_messages(
    mut body: RelayBody,
    limit: usize,
    request: Option<Bytes>,
) -> impl futures_util::Stream<Item = Result<Bytes, UpstreamError>> + Send {
    async_stream(move |tx| async move {
        let mut dec = SseDecoder::new(limit);
        let mut answered = false;
        // Checks one event; `false` once the stream must end (an error was sent, or nobody
        // listens any more).
        let deliver = async |ev: Bytes, answered: &mut bool| {
            let item = match shape(&ev) {
                Ok(response) => {
                    *answered |= response;
                    Ok(ev)
                }
                Err(what) => Err(UpstreamError::Protocol(format!("an SSE event {what}"))),
            };
            let go_on = item.is_ok();
            tx.send(item).await.is_ok() && go_on
        };
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        dec.push(&data);
                        loop {
                            match dec.next_event() {
                                Ok(Some(ev)) => {
                                    if !deliver(ev, &mut answered).await {
                                        return;
                                    }
                                }
                                Ok(None) => break,
                                Err(_) => {
                                    let _ = tx
                                        .send(Err(UpstreamError::Protocol(format!(
                                            "an SSE event exceeds max_answer_bytes ({limit} bytes)"
                                        ))))
                                        .await;
                                    return;
                                }
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(body_error(e))).await;
                    return;
                }
                None => {
                    if let Some(ev) = dec.finish()
                        && !deliver(ev, &mut answered).await
                    {
                        return;
                    }
                    if !answered && request.as_deref().and_then(sniff_id).is_some() {
                        let _ = tx
                            .send(Err(UpstreamError::Protocol(
                                "the SSE stream ended without a response".into(),
                            )))
                            .await;
                    }
                    return;
                }
            }
        }
    })
}

/// A tiny generator: runs `f` with a sender and yields what it sends. Lazily started, and the
/// producing future lives inside the stream, so dropping the stream drops the work (and with it
/// the upstream connection) — no detached task.
pub fn async_stream<T, F, Fut>(f: F) -> impl futures_util::Stream<Item = T> + Send
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<T>(16);
    let producer = f(tx);
    GenStream {
        producer: Some(Box::pin(producer)),
        rx,
    }
}

struct GenStream<T> {
    producer: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    rx: tokio::sync::mpsc::Receiver<T>,
}

impl<T> futures_util::Stream for GenStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(p) = self.producer.as_mut()
            && p.as_mut().poll(cx).is_ready()
        {
            self.producer = None;
        }
        // Once the producer is done its sender is dropped, so this ends with `None`.
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn answers_are_shaped_as_serde_shapes_them() {
        for msg in [
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":null,"error":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":null,"result":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","result":1}"#,
            r#"{"res\u0075lt":1}"#,
            r#"{"result":1,"result":2}"#,
            r#"{"method":null,"method":null,"result":1}"#,
            r#"{"error":1,"x":{"error":2}}"#,
            r#"{}"#,
            r#"[]"#,
            r#""answer""#,
            r#"{"result":1"#,
            r#"{"result":1,}"#,
            r#"{"result":tru}"#,
            "",
            "\u{ff}",
        ] {
            assert_eq!(
                shape(msg.as_bytes()),
                shape_by_serde(msg.as_bytes()),
                "{msg}"
            );
        }
        assert_eq!(shape(br#"{"id":1,"result":{}}"#), Ok(true));
        assert_eq!(
            shape(br#"{"result":1,"result":2}"#),
            Err("is not a JSON-RPC message")
        );
    }

    fn upstream(url: &str) -> Arc<HttpUpstream> {
        let cfg: crate::config::Config = crate::config::parse(&format!(
            "[[backends]]\nname = 'b'\nurl = '{url}'\nheaders = {{ X-Api-Key = 'static', Mcp-Method = 'static' }}\n"
        ))
        .expect("config");
        Arc::new(HttpUpstream::new(&cfg.backends[0], url).expect("upstream"))
    }

    /// A client's headers: credentials and hop-by-hop ones that must never go upstream, and
    /// the allowlisted ones that must.
    fn client_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer client-secret"),
            ("cookie", "sid=1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("host", "evil.example"),
            ("content-type", "application/json"),
            ("mcp-method", "tools/call"),
            ("mcp-param-region", "eu"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    fn extra() -> Vec<(HeaderName, HeaderValue)> {
        vec![
            (
                header::AUTHORIZATION,
                HeaderValue::from_static("Bearer team"),
            ),
            (
                HeaderName::from_static("mcp-method"),
                HeaderValue::from_static("extra"),
            ),
        ]
    }

    /// What both request builders must produce, by header name.
    fn check(get: impl Fn(&str) -> Vec<String>, host: &str) {
        assert_eq!(get("host"), [host]);
        assert_eq!(
            get("authorization"),
            ["Bearer team"],
            "never the client's token"
        );
        assert!(get("cookie").is_empty() && get("x-forwarded-for").is_empty());
        assert_eq!(
            get("mcp-method"),
            ["extra"],
            "extra over static over the client's"
        );
        assert_eq!(get("x-api-key"), ["static"]);
        assert_eq!(get("mcp-param-region"), ["eu"]);
        assert_eq!(get("content-type"), ["application/json"]);
        assert_eq!(get("traceparent").len(), 1);
    }

    #[test]
    fn the_request_carries_allowlisted_client_headers_only() {
        let up = upstream("http://127.0.0.1:9/mcp");
        let req = up.request(&client_headers(), &extra(), Bytes::from_static(b"{}"));
        assert_eq!(req.uri().path(), "/mcp");
        let get = |n: &str| {
            req.headers()
                .get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        check(get, "127.0.0.1:9");
    }

    /// The lean client writes the same head as `request` builds, straight from the client's
    /// headers, and relays the answer.
    #[tokio::test]
    async fn the_lean_client_writes_the_same_head_and_relays_the_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tcp.read(&mut chunk).await.unwrap();
                assert!(n > 0, "request head");
                buf.extend_from_slice(&chunk[..n]);
            }
            let answer = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                answer.len()
            );
            tcp.write_all(head.as_bytes()).await.unwrap();
            tcp.write_all(answer).await.unwrap();
            buf
        });
        let up = upstream(&format!("http://{addr}/mcp"));
        let deadline = Instant::now() + Duration::from_secs(5);
        let body = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}");
        let ex = up
            .forward(&client_headers(), &extra(), &body, deadline)
            .await
            .expect("exchange");
        assert_eq!(ex.response.status(), 200);
        let (_, relay) = up.relay(ex, deadline, Bytes::new());
        use http_body_util::BodyExt;
        let got = relay.collect().await.expect("body").to_bytes();
        assert_eq!(&got[..], b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}");
        let wire = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("served")
            .unwrap();
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        let head_len = match parsed.parse(&wire).expect("valid HTTP/1.1 head") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("partial head"),
        };
        assert_eq!(parsed.method, Some("POST"));
        assert_eq!(parsed.path, Some("/mcp"));
        let get = |n: &str| {
            parsed
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(n))
                .map(|h| String::from_utf8_lossy(h.value).to_string())
                .collect::<Vec<_>>()
        };
        check(get, &addr.to_string());
        assert_eq!(get("content-length"), [body.len().to_string()]);
        assert_eq!(&wire[head_len..], &body[..]);
    }
}
