//! TLS on both sides: portico serving its client listener over rustls (ALPN h2 + http/1.1), and
//! portico reaching an `https://` backend with a private CA (`ca_file`). The chain test runs a
//! plain gateway in front of a TLS gateway, so one request crosses both.

use crate::common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`private_ca`] in a fresh directory named by `tag`, with a TLS acceptor for its server
/// certificate (an HTTPS side server of a test: a JWKS, a token endpoint). Returns the
/// directory, the CA certificate and the acceptor.
pub fn private_ca_acceptor(tag: &str) -> (PathBuf, PathBuf, tokio_rustls::TlsAcceptor) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("portico-{tag}-{}-{n}", std::process::id()));
    let (ca, cert, key) = private_ca(&dir);
    let tls = portico::server::tls_acceptor(&portico::config::ServerConfig {
        tls_cert: Some(cert),
        tls_key: Some(key),
        ..Default::default()
    })
    .unwrap()
    .unwrap();
    (dir, ca, tls)
}

/// A throwaway private CA and a server certificate it signed for localhost / 127.0.0.1, made
/// with `openssl`. Returns (CA cert, server cert, server key).
pub fn private_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let p = |f: &str| dir.join(f).display().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    let (ca_key, ca_cert) = (p("ca-key.pem"), p("ca.pem"));
    ca.extend([
        "-days",
        "1",
        "-subj",
        "/CN=portico test CA",
        "-keyout",
        &ca_key,
        "-out",
        &ca_cert,
    ]);
    openssl(&ca);
    let (key, csr, cert, ext) = (p("key.pem"), p("srv.csr"), p("cert.pem"), p("ext.cnf"));
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let mut req = vec!["req"];
    req.extend(ec);
    req.extend(["-subj", "/CN=localhost", "-keyout", &key, "-out", &csr]);
    openssl(&req);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_cert,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    (ca_cert.into(), cert.into(), key.into())
}

#[tokio::test]
async fn a_tls_listener_serves_and_an_https_backend_is_reached_with_a_private_ca() {
    let dir = std::env::temp_dir().join(format!("portico-tls-{}", std::process::id()));
    let (ca, cert, key) = private_ca(&dir);
    let inner = Gateway::start(&format!(
        "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n[log]\naccess = false\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        cert.display(),
        key.display()
    ))
    .await;
    // A plaintext request to the TLS listener is not served.
    let plain = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        crate::common::client().request(
            http::Request::post(inner.url("/mcp/demo"))
                .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                .unwrap(),
        ),
    )
    .await
    .expect("no hang");
    assert!(plain.is_err() || plain.unwrap().status() != 200);
    let outer = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"inner\"\nurl = \"https://localhost:{}/mcp/demo\"\nca_file = \"{}\"\nprotocol = \"modern\"\n",
        inner.addr.port(),
        ca.display()
    ))
    .await;
    let url = outer.url("/mcp/inner");
    let r = mcp(
        &url,
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"over tls"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.result()["result"]["content"][0]["text"], "over tls");
    let r = mcp(&url, json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // Without the private CA the backend's certificate is refused: 502, naming the backend.
    let strict = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"inner\"\nurl = \"https://localhost:{}/mcp/demo\"\nprotocol = \"modern\"\ntimeout_ms = 3000\n",
        inner.addr.port()
    ))
    .await;
    let r = mcp(
        &strict.url("/mcp/inner"),
        json!(3),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x"}}),
    )
    .await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert!(String::from_utf8_lossy(&r.body).contains("inner"));
}
