//! RFC 8693 token exchange (`[backends.token_exchange]`, `src/auth/exchange.rs`): a backend
//! gets a token the identity provider issued for it on each caller's behalf, never the
//! client's own token nor another caller's. Real gateway (JWT mode), the in-repo mock backend
//! and a small token endpoint in this file, on loopback.

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::common::mock::MockMcp;
use crate::common::{Gateway, mcp_with, send};
use crate::jwt::{Keys, now};

/// What the token endpoint was asked: the form, and the client authentication.
#[derive(Clone, Debug)]
struct Asked {
    form: Vec<(String, String)>,
    basic: Option<String>,
}

impl Asked {
    fn get(&self, name: &str) -> Option<&str> {
        self.form
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A token endpoint: exchanges a subject token for `tx-<sub>-<audience>-<n>`; refuses the
/// subject `mallory` (400 `invalid_grant`); answers 503 while `down`.
#[derive(Clone, Default)]
struct Idp {
    asked: Arc<Mutex<Vec<Asked>>>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Idp {
    /// Serves on loopback over plain HTTP; its token URL.
    async fn start(&self) -> String {
        self.serve(None).await
    }

    /// Serves over `tls` (as `localhost`, for the certificate's name), or plain HTTP.
    async fn serve(&self, tls: Option<tokio_rustls::TlsAcceptor>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let url = match tls {
            Some(_) => format!("https://localhost:{port}/oauth/token"),
            None => format!("http://127.0.0.1:{port}/oauth/token"),
        };
        let idp = self.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let (idp, tls) = (idp.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(mut stream) = tls.accept(tcp).await {
                                idp.exchange_on(&mut stream).await;
                            }
                        }
                        None => idp.exchange_on(&mut { tcp }).await,
                    }
                });
            }
        });
        url
    }

    /// One request on `stream`, answered.
    async fn exchange_on<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: &mut S) {
        let Some((head, body)) = read_request(stream).await else {
            return;
        };
        let (status, doc) = self.answer(&head, &body);
        let resp = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{doc}",
            doc.len()
        );
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
    }

    fn answer(&self, head: &str, body: &[u8]) -> (&'static str, String) {
        let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
        let basic = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_string())
        });
        let asked = Asked { form, basic };
        let n = {
            let mut all = self.asked.lock().unwrap();
            all.push(asked.clone());
            all.len()
        };
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return ("503 Service Unavailable", "{}".into());
        }
        // The subject's `sub`, unverified: the test's own tokens.
        let sub = asked
            .get("subject_token")
            .and_then(|t| t.split('.').nth(1))
            .and_then(|p| {
                use base64::Engine;
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(p)
                    .ok()
            })
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|c| c["sub"].as_str().map(str::to_string))
            .unwrap_or_default();
        if sub == "mallory" {
            return (
                "400 Bad Request",
                json!({"error": "invalid_grant", "error_description": "mallory may not"})
                    .to_string(),
            );
        }
        let audience = asked.get("audience").unwrap_or("");
        (
            "200 OK",
            json!({
                "access_token": format!("tx-{sub}-{audience}-{n}"),
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer",
                "expires_in": 3600,
            })
            .to_string(),
        )
    }
}

/// One HTTP/1.1 request: its head and its `Content-Length` body (bounded: 64 KiB).
async fn read_request<S: AsyncRead + Unpin>(tcp: &mut S) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = tcp.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some((head, buf[end + 4..end + 4 + len].to_vec()));
        }
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A JWT gateway over the test keys with backend `m` (`protocol`) exchanging its callers'
/// tokens at `token_url` (audience `m-api`, client `portico` by HTTP Basic).
async fn gateway(keys: &Keys, token_url: &str, mock_url: &str, protocol: &str) -> Gateway {
    gateway_with(keys, token_url, mock_url, protocol, "").await
}

/// [`gateway`] with `extra` lines in `[backends.token_exchange]`.
async fn gateway_with(
    keys: &Keys,
    token_url: &str,
    mock_url: &str,
    protocol: &str,
    extra: &str,
) -> Gateway {
    let jwks = crate::common::secret_file("tx-jwks", &keys.jwks().to_string());
    let secret = crate::common::secret_file("tx-secret", "s3cret:x\n");
    Gateway::start(&format!(
        "[metrics]\n[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_file = \"{}\"\n\
         [[backends]]\nname = \"m\"\nurl = \"{mock_url}\"\nprotocol = \"{protocol}\"\n\
         [backends.token_exchange]\ntoken_url = \"{token_url}\"\nclient_id = \"portico\"\n\
         client_secret_file = \"{}\"\naudience = \"m-api\"\nscope = \"tools:call\"\n{extra}\n",
        jwks.display(),
        secret.display(),
    ))
    .await
}

/// `method` (`tools/call` of `echo`, or a list) on `url` as the caller whose JWT is `token`.
async fn ask(url: &str, token: &str, method: &'static str) -> crate::common::Resp {
    let params = match method {
        "tools/call" => json!({"name": "echo", "arguments": {"text": "hi"}}),
        _ => json!({}),
    };
    let auth = format!("Bearer {token}");
    mcp_with(url, json!(7), method, params, &[("authorization", &auth)]).await
}

/// The `Authorization` of each request the mock saw with a JSON-RPC method (portico's own
/// health probe has no caller, and is left out with `only`).
fn authorizations(mock: &crate::common::mock::MockHandle, only: &str) -> Vec<String> {
    mock.seen()
        .iter()
        .filter(|s| {
            s.body["method"]
                .as_str()
                .is_some_and(|m| m.starts_with(only))
        })
        .map(|s| {
            s.headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// Each caller's requests reach the backend with the token exchanged for that caller — on
/// the pass-through path (`tools/call`) and the message path (`tools/list`) alike — never with
/// the client's own token; one exchange per caller token (cached), its form as RFC 8693 has
/// it with the client authenticated by HTTP Basic. Lists fetched so are the caller's own
/// (`private`, not served from the shared cache). The IdP refusing a caller is a 403 naming
/// its error; the IdP down is a 502 — neither reaches the backend — and a caller whose token
/// was exchanged before goes on.
#[tokio::test]
async fn a_backend_sees_a_token_exchanged_for_each_caller_never_the_clients_own() {
    let keys = Keys::new();
    let idp = Idp::default();
    let token_url = idp.start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(60_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let gw = gateway(&keys, &token_url, &mock.url(), "modern").await;
    let url = gw.url("/mcp/m");
    let token = |sub: &str| keys.es(&json!({"sub": sub, "exp": now() + 300}));
    let (alice, bob) = (token("alice"), token("bob"));

    for _ in 0..2 {
        assert_eq!(ask(&url, &alice, "tools/call").await.status, 200);
    }
    let list = ask(&url, &alice, "tools/list").await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    assert_eq!(
        list.json()["result"]["cacheScope"],
        "private",
        "fetched with the caller's own token: the caller's own view"
    );
    assert_eq!(ask(&url, &alice, "tools/list").await.status, 200);
    assert_eq!(ask(&url, &bob, "tools/call").await.status, 200);
    assert_eq!(
        mock.count("tools/list"),
        2,
        "not served from the shared cache"
    );

    // What the backend saw: the exchanged tokens, each caller's own, never a client's.
    let seen = authorizations(&mock, "tools/");
    assert_eq!(
        seen,
        [
            "Bearer tx-alice-m-api-1",
            "Bearer tx-alice-m-api-1",
            "Bearer tx-alice-m-api-1",
            "Bearer tx-alice-m-api-1",
            "Bearer tx-bob-m-api-2",
        ]
    );
    assert!(
        seen.iter()
            .all(|a| !a.contains(&alice) && !a.contains(&bob))
    );
    // What the IdP was asked: once per caller token, as RFC 8693 has it.
    let asked = idp.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "one exchange per caller token");
    let first = &asked[0];
    assert_eq!(
        first.get("grant_type"),
        Some("urn:ietf:params:oauth:grant-type:token-exchange")
    );
    assert_eq!(first.get("subject_token"), Some(alice.as_str()));
    assert_eq!(
        first.get("subject_token_type"),
        Some("urn:ietf:params:oauth:token-type:access_token")
    );
    assert_eq!(first.get("audience"), Some("m-api"));
    assert_eq!(first.get("scope"), Some("tools:call"));
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode("portico:s3cret%3Ax");
    assert_eq!(
        first.basic.as_deref(),
        Some(format!("Basic {basic}").as_str())
    );

    // Refused by the IdP: 403 naming its error; nothing reaches the backend.
    let calls = mock.count("tools/call");
    let r = ask(&url, &token("mallory"), "tools/call").await;
    assert_eq!((r.status, r.code()), (403, -32600), "{:?}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("invalid_grant") && msg.contains("mallory may not"),
        "{msg}"
    );
    // The IdP down: 502 for a caller it has not seen, never a hang; Alice's token was
    // exchanged before and she goes on.
    idp.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        ask(&url, &token("carol"), "tools/call"),
    )
    .await
    .expect("answered within 10 s");
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("identity provider"),
        "{:?}",
        r.body
    );
    assert_eq!(
        mock.count("tools/call"),
        calls,
        "neither reached the backend"
    );
    assert_eq!(ask(&url, &alice, "tools/call").await.status, 200);

    let scrape = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&scrape.body).to_string();
    for (outcome, n) in [
        ("exchanged", 2),
        ("cached", 4),
        ("refused", 1),
        ("failed", 1),
    ] {
        let line =
            format!("portico_token_exchanges_total{{backend=\"m\",outcome=\"{outcome}\"}} {n}");
        assert!(text.contains(&line), "{line}\n{text}");
    }
    // The refused call is counted for its tool like any other refusal of the step.
    assert!(
        text.contains(
            r#"portico_tool_calls_total{backend="m",outcome="client_error",tool="echo"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains("reason=\"token_exchange_refused\""));
    assert!(text.contains("reason=\"token_exchange_failed\""));
    gw.stop().await;
}

/// An initialize-era backend too: each caller's own upstream session is opened
/// (`initialize`, `notifications/initialized`) and used with the token exchanged for that
/// caller — sessions are per caller, so no session ever carries two callers' tokens.
#[tokio::test]
async fn an_initialize_era_backend_gets_each_callers_token_on_its_own_session() {
    let keys = Keys::new();
    let idp = Idp::default();
    let token_url = idp.start().await;
    let mock = MockMcp::legacy().start().await;
    let gw = gateway(&keys, &token_url, &mock.url(), "legacy").await;
    let url = gw.url("/mcp/m");
    let token = |sub: &str| keys.es(&json!({"sub": sub, "exp": now() + 300}));
    let (alice, bob) = (token("alice"), token("bob"));
    for t in [&alice, &alice, &bob] {
        let r = ask(&url, t, "tools/call").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let by_method = |m: &str| authorizations(&mock, m);
    assert_eq!(
        by_method("initialize"),
        ["Bearer tx-alice-m-api-1", "Bearer tx-bob-m-api-2"],
        "each caller's session opened with its own token"
    );
    assert_eq!(
        by_method("notifications/initialized"),
        ["Bearer tx-alice-m-api-1", "Bearer tx-bob-m-api-2"]
    );
    assert_eq!(
        by_method("tools/call"),
        [
            "Bearer tx-alice-m-api-1",
            "Bearer tx-alice-m-api-1",
            "Bearer tx-bob-m-api-2"
        ]
    );
    // Two sessions, one per caller.
    let sessions: std::collections::BTreeSet<String> = mock
        .seen()
        .iter()
        .filter(|s| s.body["method"] == "tools/call")
        .filter_map(|s| s.headers.get("mcp-session-id"))
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert_eq!(idp.asked.lock().unwrap().len(), 2);
    gw.stop().await;
}

/// A token endpoint over HTTPS with a private CA: trusted with `ca_file`, and not without it
/// (then the exchange fails: 502, the backend not asked).
#[tokio::test]
async fn an_https_token_endpoint_is_trusted_through_its_ca_file_only() {
    let (dir, ca, tls) = crate::tls::private_ca_acceptor("tx-pki");
    let keys = Keys::new();
    let idp = Idp::default();
    let token_url = idp.serve(Some(tls)).await;
    let mock = MockMcp::modern().start().await;
    let alice = keys.es(&json!({"sub": "alice", "exp": now() + 300}));
    let ca_line = format!("ca_file = {:?}", ca.display().to_string());
    let gw = gateway_with(&keys, &token_url, &mock.url(), "modern", &ca_line).await;
    let r = ask(&gw.url("/mcp/m"), &alice, "tools/call").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(authorizations(&mock, "tools/"), ["Bearer tx-alice-m-api-1"]);
    gw.stop().await;

    let gw = gateway(&keys, &token_url, &mock.url(), "modern").await;
    let r = ask(&gw.url("/mcp/m"), &alice, "tools/call").await;
    assert_eq!(r.status, 502, "an unknown CA is not trusted: {:?}", r.body);
    assert_eq!(mock.count("tools/call"), 1, "the backend was not asked");
    gw.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
