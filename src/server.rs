//! Accepting connections: TCP, optional rustls (h1 + h2 by ALPN), hyper-util's auto h1/h2
//! server, and graceful shutdown (stop accepting, let in-flight requests finish within the
//! drain time).

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::State;
use crate::config::ServerConfig;

/// The client's socket address, attached to every request (admin endpoints are loopback-only).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

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
    let graceful = GracefulShutdown::new();
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
        let svc_state = shared.clone();
        let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            // Only admin endpoints look at the peer; inserting an extension allocates, so the
            // MCP hot path skips it.
            if req.uri().path().starts_with("/admin/") {
                req.extensions_mut().insert(PeerAddr(peer));
            }
            // Each request sees one config generation, even across a hot reload.
            let state = svc_state.load_full();
            async move { Ok::<_, Infallible>(crate::proxy::handle(state, req).await) }
        });
        let watcher = graceful.watcher();
        let builder = builder.clone();
        match &tls {
            None => {
                tokio::spawn(async move {
                    let conn = builder.serve_connection(TokioIo::new(tcp), service);
                    let _ = watcher.watch(conn.into_owned()).await;
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
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
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn.into_owned()).await;
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
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!("drain time over; closing remaining connections"),
    }
}
