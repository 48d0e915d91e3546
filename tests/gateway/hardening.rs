//! What a hostile client can do to a shared gateway, and what it can no longer do:
//! - bodies that another JSON parser reads differently (duplicate keys, case-folded member
//!   names) never execute a tool portico's policy denied — against a backend that reads JSON
//!   the way Go's `encoding/json` does, through direct, aggregated and legacy-bridged URLs;
//! - sockets that send a head and then nothing (plain, chunked, HTTP/1.0, `Expect`, TLS) hold no
//!   admission slot and are closed by `body_read_timeout_ms`.

use crate::common::{Gateway, mcp_with, send};
use crate::upstream_h1::read_request;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "hardening-key-0123456789ab";

// === A backend that reads JSON like Go's encoding/json ===

/// Unicode case folding, as Go's `strings.EqualFold` compares member names.
fn fold(s: &str) -> String {
    s.chars()
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
        .collect()
}

/// Case-insensitive member lookup where the last match in the text wins — how a Go struct
/// decoder reads (`serde_json::Value` already kept the last of exact duplicates; which of
/// several case variants comes last is read off the raw text).
fn go_get<'a>(v: &'a Value, field: &str, text: &str) -> Option<&'a Value> {
    v.as_object()?
        .iter()
        .filter(|(k, _)| fold(k) == fold(field))
        .max_by_key(|(k, _)| text.rfind(&format!("\"{k}\"")).unwrap_or(0))
        .map(|(_, v)| v)
}

/// The tool a Go backend would run for this body.
fn go_tool_name(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let text = String::from_utf8_lossy(body);
    let params = go_get(&v, "params", &text)?;
    go_get(params, "name", &text)?.as_str().map(String::from)
}

struct GoBackend {
    url: String,
    executed: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GoBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn go_backend() -> GoBackend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let executed = Arc::new(Mutex::new(Vec::new()));
    let seen = executed.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(serve_go(tcp, seen.clone()));
        }
    });
    GoBackend {
        url,
        executed,
        task,
    }
}

async fn serve_go(mut tcp: TcpStream, executed: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(body) = read_request(&mut tcp, &mut buf).await else {
            return;
        };
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let text = String::from_utf8_lossy(&body).to_string();
        let method = go_get(&v, "method", &text)
            .and_then(Value::as_str)
            .unwrap_or("");
        let id = go_get(&v, "id", &text).cloned().unwrap_or(Value::Null);
        let result = match method {
            "tools/list" => json!({"resultType":"complete","tools":[
                {"name":"echo","inputSchema":{"type":"object"}},
                {"name":"secret","inputSchema":{"type":"object"}}]}),
            "tools/call" => {
                let name = go_tool_name(&body).unwrap_or_default();
                executed.lock().unwrap().push(name.clone());
                json!({"resultType":"complete","content":[{"type":"text","text":format!("ran {name}")}]})
            }
            "server/discover" => json!({"resultType":"complete","supportedVersions":["2026-07-28"],
                "capabilities":{"tools":{}}}),
            _ => json!({}),
        };
        let answer = json!({"jsonrpc":"2.0","id":id,"result":result}).to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if tcp
            .write_all(format!("{head}{answer}").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn key_file() -> String {
    crate::common::secret_file("hardening", KEY)
        .display()
        .to_string()
}

/// The bodies another parser reads as a call of `secret` while portico's reads `echo`.
fn smuggling_bodies(id: u64, legacy: bool) -> Vec<String> {
    let meta = if legacy {
        String::new()
    } else {
        r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#.to_string()
    };
    vec![
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo"{meta}}},"Params":{{"name":"secret"{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo"{meta}}},"paramſ":{{"name":"secret"{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","name":"secret"{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","NAME":"secret"{meta}}}}}"#
        ),
    ]
}

#[test]
fn the_go_like_reader_reads_what_go_reads() {
    for body in smuggling_bodies(1, false) {
        assert_eq!(
            go_tool_name(body.as_bytes()).as_deref(),
            Some("secret"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn bodies_read_differently_elsewhere_never_run_a_denied_tool() {
    let go = go_backend().await;
    let gw = Gateway::start(&format!(
        r#"
[auth]
mode = "api_keys"
[[auth.api_keys]]
key_file = "{key}"
principal = "mallory"
team = "ops"
[[auth.teams]]
name = "ops"
tools = {{ deny = ["secret", "*__secret"] }}
[[backends]]
name = "go"
url = "{url}"
protocol = "modern"
[[endpoints]]
path = "/mcp"
backends = [{{ name = "go", prefix = "g" }}]
"#,
        key = key_file(),
        url = go.url
    ))
    .await;
    let auth = format!("Bearer {KEY}");
    // Control: the policy holds on an honest body, and an allowed tool runs.
    for (path, denied, allowed) in [
        ("/mcp/go", "secret", "echo"),
        ("/mcp", "g__secret", "g__echo"),
    ] {
        let url = gw.url(path);
        let r = mcp_with(
            &url,
            json!(1),
            "tools/call",
            json!({"name": denied}),
            &[("authorization", &auth)],
        )
        .await;
        assert_eq!(r.status, 403, "{path}: {:?}", r.body);
        let r = mcp_with(
            &url,
            json!(2),
            "tools/call",
            json!({"name": allowed}),
            &[("authorization", &auth)],
        )
        .await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    }
    assert_eq!(*go.executed.lock().unwrap(), ["echo", "echo"]);

    // Direct and aggregated, 2026-07-28 clients: every smuggling body is refused.
    for (path, name) in [("/mcp/go", "echo"), ("/mcp", "g__echo")] {
        for body in smuggling_bodies(3, false) {
            let body = body.replace("\"echo\"", &format!("\"{name}\""));
            let h = [
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", name),
                ("authorization", auth.as_str()),
            ];
            let r = send("POST", &gw.url(path), &h, body.clone()).await;
            assert_eq!(r.status, 400, "{path} {body}: {:?}", r.body);
            assert_eq!(r.code(), -32600, "{body}");
        }
    }
    // An initialize-era client through the bridge.
    let h = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", auth.as_str()),
    ];
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    let r = send("POST", &gw.url("/mcp/go"), &h, init.to_string()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let sid = r.header("mcp-session-id").expect("session").to_string();
    let mut hs = h.to_vec();
    hs.push(("mcp-session-id", sid.as_str()));
    hs.push(("mcp-protocol-version", "2025-06-18"));
    for body in smuggling_bodies(4, true) {
        let r = send("POST", &gw.url("/mcp/go"), &hs, body.clone()).await;
        assert_eq!(r.status, 400, "legacy {body}: {:?}", r.body);
    }
    assert_eq!(
        *go.executed.lock().unwrap(),
        ["echo", "echo"],
        "the denied tool never ran"
    );
    gw.stop().await;
}

// === Silent sockets ===

/// A request head that announces a body, and the first bytes of it.
fn slow_heads() -> Vec<(&'static str, Vec<u8>)> {
    let head = |extra: &str, version: &str| {
        format!(
            "POST /mcp/m {version}\r\nhost: x\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
             mcp-method: tools/call\r\nmcp-name: echo\r\n{extra}\r\n"
        )
        .into_bytes()
    };
    vec![
        (
            "plain",
            [
                head("content-length: 200\r\n", "HTTP/1.1"),
                b"{\"jsonrpc\"".to_vec(),
            ]
            .concat(),
        ),
        (
            "chunked",
            [
                head("transfer-encoding: chunked\r\n", "HTTP/1.1"),
                b"5\r\n{\"jso\r\n".to_vec(),
            ]
            .concat(),
        ),
        (
            "http/1.0",
            [
                head("content-length: 200\r\n", "HTTP/1.0"),
                b"{\"jsonrpc\"".to_vec(),
            ]
            .concat(),
        ),
        (
            "expect",
            head(
                "content-length: 200\r\nexpect: 100-continue\r\n",
                "HTTP/1.1",
            ),
        ),
    ]
}

/// Reads until the peer closes; what it sent first (a 408 or a 100 Continue, perhaps).
async fn closed_within<S: AsyncRead + Unpin>(s: &mut S, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn config(mock: &str, tls: &str) -> String {
    format!(
        "[server]\nbody_read_timeout_ms = 1000\nheader_read_timeout_ms = 20000\n{tls}\n[log]\naccess = false\n\
         [[backends]]\nname = \"m\"\nurl = \"{mock}\"\nprotocol = \"modern\"\nmax_concurrent = 2\n"
    )
}

#[tokio::test]
async fn silent_sockets_hold_no_slot_and_are_closed_by_the_body_timeout() {
    let mock = crate::common::mock::MockMcp::modern().start().await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    let mut silent = Vec::new();
    for _ in 0..10 {
        for (kind, bytes) in slow_heads() {
            let mut s = TcpStream::connect(gw.addr).await.unwrap();
            s.write_all(&bytes).await.unwrap();
            silent.push((kind, s, Instant::now()));
        }
    }
    // 40 sockets wait on their bodies; max_concurrent = 2 is untouched by them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let r = mcp_with(
        &gw.url("/mcp/m"),
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "through"}}),
        &[],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(
        took < Duration::from_secs(1),
        "a normal request waited {took:?}"
    );
    for (kind, mut s, opened) in silent {
        let got = closed_within(&mut s, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{kind}: still open 5 s after the head"));
        let text = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || text.contains("408") || text.starts_with("HTTP/1.1 100"),
            "{kind}: {text}"
        );
        assert!(
            opened.elapsed() >= Duration::from_millis(900),
            "{kind}: closed too early"
        );
    }
    assert_eq!(
        mock.count("tools/call"),
        1,
        "no partial body reached the backend"
    );
    gw.stop().await;
}

#[tokio::test]
async fn silent_tls_sockets_are_closed_too() {
    let dir = std::env::temp_dir().join(format!("portico-hardening-tls-{}", std::process::id()));
    let (ca, cert, key) = crate::tls::private_ca(&dir);
    let mock = crate::common::mock::MockMcp::modern().start().await;
    let tls = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"",
        cert.display(),
        key.display()
    );
    let gw = Gateway::start(&config(&mock.url(), &tls)).await;
    let connector = tls_connector(&ca);
    let mut silent = Vec::new();
    for _ in 0..10 {
        let mut s = tls_connect(&connector, gw.addr).await;
        s.write_all(&slow_heads()[0].1).await.unwrap();
        s.flush().await.unwrap();
        silent.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A normal request over TLS, by hand.
    let body = crate::common::modern_body(
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"tls"}}),
    );
    let req = format!(
        "POST /mcp/m HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: tools/call\r\nmcp-name: echo\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tls_connect(&connector, gw.addr).await;
    s.write_all(req.as_bytes()).await.unwrap();
    let answer = closed_within(&mut s, Duration::from_secs(5))
        .await
        .expect("answered");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for mut s in silent {
        assert!(
            closed_within(&mut s, Duration::from_secs(5))
                .await
                .is_some(),
            "a silent TLS socket is still open"
        );
    }
    gw.stop().await;
}

/// An HTTP/2 connection (here h2c by prior knowledge, which the lean loop hands to hyper; h2 by
/// ALPN takes the same path) that sends its preface and then nothing is closed once no request
/// has been in flight for `header_read_timeout_ms`, as an idle HTTP/1.1 keep-alive is — while
/// a call that streams for longer than that on another h2 connection is not cut.
#[tokio::test]
async fn a_silent_http2_connection_is_closed_and_a_long_one_is_not() {
    let mock = crate::common::mock::MockMcp::modern().sse().start().await;
    let gw = Gateway::start(&format!(
        "[server]\nheader_read_timeout_ms = 300\n[log]\naccess = false\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        mock.url()
    ))
    .await;
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    // The client preface and an empty SETTINGS frame, then silence.
    silent
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let started = Instant::now();

    let body = crate::common::modern_body(
        json!(1),
        "tools/call",
        json!({"name":"slow","arguments":{"ms":900}}),
    );
    let req = crate::common::modern_request(&gw.url("/mcp/m"), "tools/call", Some("slow"), body);
    let long = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let resp = crate::common::h2_client().request(req).await.unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    });

    let closed = closed_within(&mut silent, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "a silent h2 connection is still open");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    let answer = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the long call ends")
        .unwrap();
    assert!(answer.contains("\"result\""), "{answer}");
    gw.stop().await;
}

/// A client that asks for a large answer and then stops reading (its window fills) does not
/// hold its connection for good: the rest of the answer must go within the body clock's rule
/// (`body_read_timeout_ms` + a second per `body_min_bytes_per_s`), else portico closes — on the
/// lean plain-HTTP loop and on a TLS connection hyper serves alike. Reading only afterwards,
/// the client gets part of the answer and the close.
#[tokio::test]
async fn a_client_that_stops_reading_is_closed() {
    let dir = std::env::temp_dir().join(format!("portico-hardening-unread-{}", std::process::id()));
    let (ca, cert, key) = crate::tls::private_ca(&dir);
    let mock = crate::common::mock::MockMcp::modern().start().await;
    let config = |tls: &str| {
        format!(
            "[server]\nmax_body_bytes = 67108864\nbody_read_timeout_ms = 500\n\
             body_min_bytes_per_s = 1000000000\n{tls}\n[log]\naccess = false\n\
             [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n\
             max_answer_bytes = 67108864\n",
            mock.url()
        )
    };
    // 24 MiB of answer: more than loopback's socket buffers hold on both sides.
    let text = "x".repeat(24 << 20);
    let body = crate::common::modern_body(
        json!(1),
        "tools/call",
        json!({"name":"echo","arguments":{"text": text}}),
    );
    let request = format!(
        "POST /mcp/m HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: tools/call\r\nmcp-name: echo\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    async fn unread<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, request: &str, full: usize) {
        s.write_all(request.as_bytes()).await.unwrap();
        s.flush().await.unwrap();
        // The answer has begun (on a busy machine the 24 MiB may take seconds to come back
        // from the backend, and a pause before then would not be one)...
        let mut got = vec![0u8; 12];
        tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut got))
            .await
            .expect("the answer begins")
            .unwrap();
        // ...then no reading for well past the bound (0.5 s + 24 MiB at 1 GB/s).
        tokio::time::sleep(Duration::from_secs(3)).await;
        got.extend(
            closed_within(&mut s, Duration::from_secs(20))
                .await
                .expect("portico closed the connection"),
        );
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            &got[..got.len().min(60)]
        );
        assert!(
            got.len() < full,
            "only part of the answer: {} bytes",
            got.len()
        );
    }
    let plain = Gateway::start(&config("")).await;
    unread(
        TcpStream::connect(plain.addr).await.unwrap(),
        &request,
        text.len(),
    )
    .await;
    plain.stop().await;
    let tls = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"",
        cert.display(),
        key.display()
    );
    let gw = Gateway::start(&config(&tls)).await;
    let connector = tls_connector(&ca);
    unread(tls_connect(&connector, gw.addr).await, &request, text.len()).await;
    gw.stop().await;
}

fn tls_connector(ca: &std::path::Path) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_connect(
    connector: &tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
) -> impl AsyncRead + AsyncWrite + Unpin {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.expect("TLS handshake")
}

/// Without `public_url`, the resource metadata and `WWW-Authenticate` name the configured
/// listen address: a crafted `Host` appears in no response header or body.
#[tokio::test]
async fn a_crafted_host_is_never_reflected() {
    let gw = Gateway::start(&format!(
        "[server]\nlisten = \"127.0.0.1:8787\"\n[auth]\nmode = \"api_keys\"\n[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"p\"\n\
         [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        key_file()
    ))
    .await;
    let evil = "evil.example";
    let mut h = crate::common::modern_headers("tools/list", None);
    h.push(("host", evil));
    let body = crate::common::modern_body(json!(1), "tools/list", json!({}));
    let refused = send("POST", &gw.url("/mcp/demo"), &h, body).await;
    assert_eq!(refused.status, 401);
    let challenge = refused.header("www-authenticate").unwrap_or("").to_string();
    assert!(
        challenge.contains("http://127.0.0.1:8787/.well-known/oauth-protected-resource/mcp/demo"),
        "{challenge}"
    );
    let prm = send(
        "GET",
        &gw.url("/.well-known/oauth-protected-resource/mcp/demo"),
        &[("host", evil)],
        "",
    )
    .await;
    assert_eq!(prm.status, 200);
    assert_eq!(prm.json()["resource"], "http://127.0.0.1:8787/mcp/demo");
    for r in [&refused, &prm] {
        assert!(!String::from_utf8_lossy(&r.body).contains(evil));
        for v in r.headers.values() {
            assert!(!v.to_str().unwrap_or("").contains(evil));
        }
    }
    gw.stop().await;
}

/// The admin listener stands apart: purge and the status page are not on the client
/// listener, and with a token configured the admin listener wants it.
#[tokio::test]
async fn admin_endpoints_live_on_their_own_listener_behind_a_token() {
    let token = std::env::temp_dir().join(format!("portico-admin-token-{}", std::process::id()));
    std::fs::write(&token, "admin-token-0123456789abcdef\n").unwrap();
    let gw = Gateway::start(&format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        token.display()
    ))
    .await;
    for path in ["/admin/cache/purge", "/status", "/status.json"] {
        let r = send("POST", &gw.url(path), &[], "").await;
        assert_eq!(r.status, 404, "{path} on the client listener: {:?}", r.body);
    }
    let purge = gw.admin_url("/admin/cache/purge");
    let r = send("POST", &purge, &[], "").await;
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").is_some());
    let r = send(
        "POST",
        &purge,
        &[("authorization", "Bearer wrong-token-0123456789")],
        "",
    )
    .await;
    assert_eq!(r.status, 401);
    let good = [("authorization", "Bearer admin-token-0123456789abcdef")];
    let r = send("POST", &purge, &good, "").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["purged"], "all");
    let r = send("GET", &gw.admin_url("/status.json"), &good, "").await;
    assert_eq!(r.status, 200);
    let r = send("GET", &gw.admin_url("/status.json"), &[], "").await;
    assert_eq!(r.status, 401);
    gw.stop().await;
}

/// Fail closed: an admin listener off loopback needs a token.
#[test]
fn a_non_loopback_admin_listener_needs_a_token() {
    let err = portico::config::validate(
        portico::config::parse(
            "[admin]\nlisten = \"0.0.0.0:9000\"\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("admin.listen"), "{err}");
}

/// A stdio backend that prints 10,000 garbage lines costs a few dozen log lines, not 10,000.
/// The real binary runs here, so its stderr is exactly what an operator's log would hold.
#[tokio::test]
async fn a_backend_printing_garbage_cannot_flood_the_log() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let script = "import sys, time\nfor i in range(10000):\n    print('garbage line', i)\nsys.stdout.flush()\ntime.sleep(30)\n";
    let dir = std::env::temp_dir().join(format!("portico-noisy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("portico.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[log]\naccess = false\nlevel = \"warn\"\n\
             [[backends]]\nname = \"noisy\"\ncommand = [\"python3\", \"-c\", {script:?}]\n\
             protocol = \"modern\"\ntimeout_ms = 3000\n"
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("portico starts");
    let url = format!("http://127.0.0.1:{port}/mcp/noisy");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "portico never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Starts the child; its answer never comes (it only prints garbage).
    let r = mcp_with(&url, json!(1), "tools/call", json!({"name": "x"}), &[]).await;
    assert!(r.status >= 500, "{:?}", r.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SIGTERM: a graceful stop, so the window's count is reported too.
    let pid = child.id().expect("running").to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let mut stderr = child.stderr.take().expect("stderr");
    let mut log = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), stderr.read_to_end(&mut log)).await;
    let _ = child.kill().await;
    let text = String::from_utf8_lossy(&log);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("noisy")).collect();
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("non-JSON-RPC line"))
            .count()
            >= 5,
        "the garbage was read and warned about:\n{text}"
    );
    assert!(
        lines.len() <= 30,
        "{} log lines for one noisy backend:\n{}",
        lines.len(),
        lines[..lines.len().min(40)].join("\n")
    );
    assert!(
        lines.iter().any(|l| l.contains("suppressed")),
        "the suppression is reported: {lines:?}"
    );
}

// === The shared cache keys everything that can shape an answer ===

fn cache_config(mock: &str) -> String {
    format!(
        "[log]\naccess = false\n[[backends]]\nname = \"m\"\nurl = \"{mock}\"\nprotocol = \"modern\"\n"
    )
}

/// Params beyond the cursor, `_meta` members the key does not cover, and `Mcp-Param-*` headers
/// would change a public entry's meaning: such requests go around the cache.
#[tokio::test]
async fn requests_with_unkeyed_members_are_not_cached() {
    let mock = crate::common::mock::MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let gw = Gateway::start(&cache_config(&mock.url())).await;
    let url = gw.url("/mcp/m");
    let list = |params: Value, extra: Vec<(&'static str, &'static str)>| {
        let url = url.clone();
        async move { mcp_with(&url, json!(1), "tools/list", params, &extra).await }
    };
    assert_eq!(list(json!({}), vec![]).await.status, 200);
    assert_eq!(list(json!({}), vec![]).await.status, 200);
    assert_eq!(mock.count("tools/list"), 1, "a plain list is cached");
    for round in 0..2 {
        assert_eq!(list(json!({"filter": "x"}), vec![]).await.status, 200);
        assert_eq!(
            list(json!({"_meta": {"com.example/tenant": "a"}}), vec![])
                .await
                .status,
            200
        );
        assert_eq!(
            list(json!({}), vec![("mcp-param-region", "eu")])
                .await
                .status,
            200
        );
        assert_eq!(
            mock.count("tools/list"),
            1 + 3 * (round + 1),
            "round {round}"
        );
    }
    // clientInfo is in the key: another client's entry is its own.
    let r = list(
        json!({"_meta": {"io.modelcontextprotocol/clientInfo": {"name": "other", "version": "1"}}}),
        vec![],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(mock.count("tools/list"), 8);
    gw.stop().await;
}

/// A backend that refuses a cursor has moved on: the pages cached after it are dropped.
#[tokio::test]
async fn an_invalid_cursor_drops_the_cached_pages() {
    let mock = crate::common::mock::MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .page_size(2)
        .start()
        .await;
    let gw = Gateway::start(&cache_config(&mock.url())).await;
    let url = gw.url("/mcp/m");
    let page = |cursor: Option<&'static str>| {
        let url = url.clone();
        let params = cursor.map_or(json!({}), |c| json!({"cursor": c}));
        async move { mcp_with(&url, json!(1), "tools/list", params, &[]).await }
    };
    assert_eq!(page(None).await.status, 200);
    assert_eq!(page(Some("2")).await.status, 200);
    assert_eq!(page(Some("2")).await.status, 200);
    assert_eq!(mock.count("tools/list"), 2, "both pages cached");
    let r = page(Some("bogus")).await;
    assert_eq!(r.code(), -32602, "{:?}", r.body);
    assert_eq!(mock.count("tools/list"), 3);
    assert_eq!(page(Some("2")).await.status, 200);
    assert_eq!(
        mock.count("tools/list"),
        4,
        "the page after the refused cursor was dropped"
    );
    gw.stop().await;
}

/// A list portico filtered for a team is that team's view: labelled private to the client.
#[tokio::test]
async fn a_team_filtered_list_is_labelled_private() {
    let mock = crate::common::mock::MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let gw = Gateway::start(&format!(
        "[auth]\nmode = \"api_keys\"\n[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"p\"\nteam = \"t\"\n\
         [[auth.teams]]\nname = \"t\"\ntools = {{ deny = [\"add\"] }}\n{}",
        key_file(),
        cache_config(&mock.url())
    ))
    .await;
    let auth = format!("Bearer {KEY}");
    let r = mcp_with(
        &gw.url("/mcp/m"),
        json!(1),
        "tools/list",
        json!({}),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let result = &r.json()["result"];
    assert_eq!(result["cacheScope"], "private");
    assert!(
        result["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "add")
    );
    gw.stop().await;
}

/// Methods 2026-07-28 removed are answered 404 `-32601` by portico on every URL and never reach
/// a backend of either era; a stray `Mcp-Session-Id` on a 2026-07-28 request is ignored.
#[tokio::test]
async fn removed_methods_are_never_forwarded() {
    let modern = crate::common::mock::MockMcp::modern().start().await;
    let legacy = crate::common::mock::MockMcp::legacy().start().await;
    let gw = Gateway::start(&format!(
        "[log]\naccess = false\n[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n\
         [[backends]]\nname = \"l\"\nurl = \"{}\"\nprotocol = \"legacy\"\n[[endpoints]]\npath = \"/mcp\"\nbackends = [\"m\", \"l\"]\n",
        modern.url(),
        legacy.url()
    ))
    .await;
    let removed = [
        "ping",
        "initialize",
        "notifications/initialized",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
    ];
    for path in ["/mcp/m", "/mcp/l", "/mcp"] {
        for method in removed {
            let id = if method.starts_with("notifications/") {
                Value::Null
            } else {
                json!(1)
            };
            let mut body: Value = serde_json::from_str(&crate::common::modern_body(
                json!(1),
                method,
                json!({"uri": "x://y", "level": "info"}),
            ))
            .unwrap();
            if id.is_null() {
                body.as_object_mut().unwrap().remove("id");
            }
            let h = crate::common::modern_headers(method, None);
            let r = send("POST", &gw.url(path), &h, body.to_string()).await;
            assert_eq!(r.status, 404, "{path} {method}: {:?}", r.body);
            assert_eq!(r.code(), -32601, "{path} {method}");
        }
    }
    for method in removed {
        assert_eq!(
            modern.count(method),
            0,
            "{method} reached the modern backend"
        );
        if method != "initialize" && method != "notifications/initialized" {
            assert_eq!(
                legacy.count(method),
                0,
                "{method} reached the legacy backend"
            );
        }
    }
    // A stray session id does not make a 2026-07-28 request a legacy one.
    let mut h = crate::common::modern_headers("tools/list", None);
    h.push(("mcp-session-id", "not-a-session"));
    let r = send(
        "POST",
        &gw.url("/mcp/m"),
        &h,
        crate::common::modern_body(json!(2), "tools/list", json!({})),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    gw.stop().await;
}

/// The real binary started under a soft open-file limit of 256 raises it to the hard limit,
/// and with `max_connections` unset keeps half of it for clients (the metric says so).
#[tokio::test]
async fn the_binary_raises_its_open_file_limit_and_caps_clients_at_half() {
    let free = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (port, metrics_port) = (free(), free());
    let config = crate::observe::temp_file(
        "nofile.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[log]\naccess = false\nlevel = \"warn\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
             [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n"
        ),
    );
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -S -n 256 && exec \"$0\" --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_portico"))
        .arg(&config)
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("portico starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", metrics_port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "portico never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id().expect("running");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let (soft, hard) = limits
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("Max open files")?;
            let mut f = rest.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .expect("a Max open files line");
    let scrape = send(
        "GET",
        &format!("http://127.0.0.1:{metrics_port}/metrics"),
        &[],
        "",
    )
    .await;
    let _ = child.kill().await;
    assert_eq!(soft, hard, "the soft limit was raised to the hard one");
    let hard: u64 = hard.parse().expect("a finite hard limit here");
    let text = String::from_utf8_lossy(&scrape.body).to_string();
    let cap = format!("\nportico_client_connections_max {}\n", hard / 2);
    assert!(text.contains(&cap), "want{cap}in\n{text}");
}
