//! Accepting connections: TCP, optional rustls (h1 + h2 by ALPN), the lean HTTP/1.1 loop
//! ([`h1`]) for plain TCP with hyper-util's auto h1/h2 server behind it, and graceful shutdown
//! (stop accepting, let in-flight requests finish within the drain time).

pub mod h1;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;
pub use crate::frontend::PeerAddr;
use crate::state::State;

/// How long a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// With `max_connections = 0`, client connections get the open-file limit divided by this:
/// the rest stays for what portico opens itself (upstream connections, stdio children's
/// pipes, Redis, the config and TLS files), which must not fail because clients took it all.
const AUTO_CONNECTIONS_DIVISOR: u64 = 2;

/// The automatic cap when the open-file limit is unlimited or cannot be read.
const FALLBACK_MAX_CONNECTIONS: usize = 65_536;

/// How often, at most, the listener says that it stopped accepting at `max_connections`.
const LIMIT_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// How many client connections may be open at once: `[server] max_connections`, or with 0
/// half the process's open-file limit as it stands (`main` raised it to the hard limit).
pub fn connection_cap(configured: usize) -> usize {
    let cap = if configured > 0 {
        configured
    } else {
        match rlimit::getrlimit(rlimit::Resource::NOFILE) {
            Ok((soft, _)) if soft != rlimit::INFINITY => {
                usize::try_from(soft / AUTO_CONNECTIONS_DIVISOR).unwrap_or(FALLBACK_MAX_CONNECTIONS)
            }
            _ => FALLBACK_MAX_CONNECTIONS,
        }
    };
    cap.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)
}

/// Builds the TLS acceptor when `tls_cert`/`tls_key` are configured.
pub fn tls_acceptor(cfg: &ServerConfig) -> Result<Option<TlsAcceptor>, String> {
    let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) else {
        return Ok(None);
    };
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("server.tls_cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("server.tls_cert {}: {e}", cert.display()))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("server.tls_key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls_cert: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}

/// Serves the client listener until `shutdown` resolves, then drains.
///
/// Plain-TCP connections start on the lean HTTP/1.1 loop ([`h1`]); TLS connections, and
/// anything the lean loop hands over (h2c, HTTP/1.0, chunked bodies, `Expect`), are served by
/// hyper-util's auto h1/h2 connection. Both feed the same pipeline.
pub async fn serve(
    shared: Arc<ArcSwap<State>>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let cfg = shared.load().config.server.clone();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(cfg.header_read_timeout_ms))
        .max_buf_size(cfg.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(cfg.max_header_bytes).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    let limits = h1::Limits {
        header_timeout: Duration::from_millis(cfg.header_read_timeout_ms),
        body_timeout: Duration::from_millis(cfg.body_read_timeout_ms),
        body_min_rate: cfg.body_min_bytes_per_s,
        max_head: cfg.max_header_bytes,
        max_body: cfg.max_body_bytes,
    };
    // The drain: every connection holds a receiver; `true` asks it to finish its request and
    // close, and the sender's `closed()` tells when the last one is gone.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    // One permit per open connection: at the cap the loop stops accepting, and newcomers wait
    // in the listen backlog (their connect succeeds; their first request is answered once a
    // connection closes) rather than taking the file descriptors portico needs upstream.
    let cap = connection_cap(cfg.max_connections);
    shared.load().metrics.set_connection_cap(cap);
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                shared.load().metrics.connection_limit_reached();
                if warned.is_none_or(|t| t.elapsed() >= LIMIT_WARN_INTERVAL) {
                    warned = Some(std::time::Instant::now());
                    tracing::warn!(
                        max_connections = cap,
                        "server.max_connections are open: new connections wait in the listen backlog until one closes"
                    );
                }
                tokio::select! {
                    permit = slots.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // The semaphore is never closed.
                        Err(_) => break,
                    },
                    _ = &mut shutdown => break,
                }
            }
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let open = (crate::metrics::OpenConnection::new(), permit);
        let shared = shared.clone();
        let builder = builder.clone();
        let mut stop = stop_rx.clone();
        match &tls {
            None => {
                tokio::spawn(async move {
                    let _open = open;
                    match h1::serve(tcp, peer, &shared, limits, &mut stop).await {
                        h1::Outcome::Done => {}
                        h1::Outcome::Handoff(tcp, read) => {
                            let io = h1::Rewind::new(read, tcp);
                            serve_hyper(&builder, io, shared, peer, limits, stop).await;
                        }
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _open = open;
                    let stream =
                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(error)) => {
                                tracing::debug!(%error, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    serve_hyper(&builder, stream, shared, peer, limits, stop).await;
                });
            }
        }
    }
    drop(listener);
    let drain = Duration::from_millis(cfg.drain_timeout_ms);
    tracing::info!(
        drain_ms = cfg.drain_timeout_ms,
        "shutting down: draining in-flight requests"
    );
    let _ = stop_tx.send(true);
    drop(stop_rx);
    tokio::select! {
        _ = stop_tx.closed() => tracing::info!("drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!("drain time over; closing remaining connections"),
    }
}

/// One connection served by hyper until it closes; on the drain, hyper finishes the requests
/// in flight and closes.
async fn serve_hyper<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    shared: Arc<ArcSwap<State>>,
    peer: std::net::SocketAddr,
    limits: h1::Limits,
    mut stop: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let idle_limit = limits.header_timeout;
    let idle = Arc::new(Idle::new());
    let watched = idle.clone();
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        if req.uri().path().starts_with("/admin/") {
            req.extensions_mut().insert(PeerAddr(peer));
        }
        // Each request sees one config generation, even across a hot reload.
        let state = shared.load_full();
        let busy = Busy::enter(&watched);
        // The HTTP+SSE transport's URLs (a session outlives this generation).
        let sse = crate::sse_front::claims(&state, req.uri().path()).then(|| shared.clone());
        async move {
            let resp = match sse {
                Some(shared) => Box::pin(crate::sse_front::serve(shared, req)).await,
                None => crate::proxy::handle(state, req).await,
            };
            Ok::<_, Infallible>(resp.map(|body| Tracked { body, _busy: busy }))
        }
    });
    let io = WriteBound::new(io, limits);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let idled = tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|s| *s) => false,
        _ = idle.expired(idle_limit) => true,
    };
    conn.as_mut().graceful_shutdown();
    if idled {
        // HTTP/2's graceful shutdown ends only when the client acknowledges a PING after the
        // GOAWAY, which a silent client never does: once nothing is in flight, the connection
        // is dropped.
        loop {
            match tokio::time::timeout(idle_limit, conn.as_mut()).await {
                Ok(_) => return,
                Err(_) if idle.in_flight.load(Ordering::Acquire) == 0 => return,
                Err(_) => {}
            }
        }
    }
    let _ = conn.await;
}

/// The write side of a connection hyper serves, under the body clock's rule as the lean loop's
/// writes are ([`h1`]): once the socket pushes back, it must take bytes again within
/// `body_read_timeout_ms` plus a second per `body_min_bytes_per_s` bytes pending, or the write
/// fails and the connection closes — a TLS or HTTP/2 client that stops reading would otherwise
/// hold its connection, task and backend answer for good. No timer while writes go through.
struct WriteBound<I> {
    inner: I,
    limits: h1::Limits,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<I> WriteBound<I> {
    fn new(inner: I, limits: h1::Limits) -> WriteBound<I> {
        WriteBound {
            inner,
            limits,
            stalled: None,
        }
    }

    /// After the inner write returned `poll`: a pending write starts (or keeps) the clock and
    /// fails once it runs out; progress stops it.
    fn clocked<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        pending_bytes: usize,
        poll: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::task::Poll;
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let allowed = self.limits.write_allowance(pending_bytes);
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(allowed)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteBound<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteBound<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.clocked(cx, buf.len(), poll)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let pending = bufs.iter().map(|b| b.len()).sum();
        let poll = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.clocked(cx, pending, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.clocked(cx, 0, poll)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.clocked(cx, 0, poll)
    }
}

/// Whether a connection hyper serves has had a request in flight lately. hyper's HTTP/1 closes
/// an idle keep-alive connection after `header_read_timeout`; its HTTP/2 (h2 by ALPN, h2c) keeps
/// a connection that sends nothing after its preface open for good, each one a socket and a
/// task. Held to the same bound here: no request in flight for `header_read_timeout_ms` → a
/// graceful shutdown (GOAWAY; a response still streaming is never cut).
struct Idle {
    in_flight: AtomicUsize,
    since: std::sync::Mutex<tokio::time::Instant>,
}

impl Idle {
    fn new() -> Idle {
        Idle {
            in_flight: AtomicUsize::new(0),
            since: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    fn last(&self) -> tokio::time::Instant {
        *self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves once no request has been in flight for `limit`.
    async fn expired(&self, limit: Duration) {
        loop {
            let until = self.last() + limit;
            tokio::time::sleep_until(until).await;
            if self.in_flight.load(Ordering::Acquire) == 0 && self.last() + limit <= until {
                return;
            }
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // Busy: look again a whole period later (the last response to end resets it).
                tokio::time::sleep(limit).await;
            }
        }
    }
}

/// One request in flight on a connection, until its response body is done or dropped.
struct Busy(Arc<Idle>);

impl Busy {
    fn enter(idle: &Arc<Idle>) -> Busy {
        idle.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(idle.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight ([`Busy`]) while it streams.
struct Tracked {
    body: crate::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = crate::body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
