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

use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;
pub use crate::frontend::PeerAddr;
use crate::state::State;

/// How long a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    builder.http2().timer(TokioTimer::new());
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
    loop {
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
        let open = crate::metrics::OpenConnection::new();
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
                            serve_hyper(&builder, io, shared, peer, stop).await;
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
                    serve_hyper(&builder, stream, shared, peer, stop).await;
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
    mut stop: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        if req.uri().path().starts_with("/admin/") {
            req.extensions_mut().insert(PeerAddr(peer));
        }
        // Each request sees one config generation, even across a hot reload.
        let state = shared.load_full();
        async move { Ok::<_, Infallible>(crate::proxy::handle(state, req).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
