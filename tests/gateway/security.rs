//! Security: authentication by API key, Protected Resource Metadata, team authorization
//! (allow_teams, tool allow/deny checked against the body), upstream credentials, rate limits
//! and request limits. JWT and JWKS are in `jwt`. Real gateway, real mock backend, real sockets.

use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::mock::MockMcp;
use crate::common::{Gateway, mcp, mcp_with, modern_body, modern_headers, send};

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef00";

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

pub(crate) async fn list_as(url: &str, auth: &str) -> crate::common::Resp {
    mcp_with(
        url,
        json!(1),
        "tools/list",
        json!({}),
        &[("authorization", auth)],
    )
    .await
}

fn api_keys_config(mock_url: &str, extra: &str) -> String {
    // Keys live in files (the env-var form is covered by config unit tests).
    let a = crate::common::secret_file("keys-alice", &format!("{ALICE}\n"));
    let b = crate::common::secret_file("keys-bob", BOB);
    let (a, b) = (a.display(), b.display());
    format!(
        r#"
[auth]
mode = "api_keys"
public_url = "https://gw.example"
authorization_servers = ["https://idp.example"]
[[auth.api_keys]]
key_file = "{a}"
principal = "alice"
team = "blue"
[[auth.api_keys]]
key_file = "{b}"
principal = "bob"
team = "red"
{extra}
[[backends]]
name = "m"
url = "{mock_url}"
protocol = "modern"
"#
    )
}

#[tokio::test]
async fn api_keys_refuse_missing_and_invalid_tokens_with_401() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(&mock.url(), "")).await;
    let url = gw.url("/mcp/m");

    let missing = mcp(&url, json!(1), "tools/list", json!({})).await;
    assert_eq!(missing.status, 401);
    let www = missing.header("www-authenticate").unwrap();
    assert_eq!(
        www,
        "Bearer resource_metadata=\"https://gw.example/.well-known/oauth-protected-resource/mcp/m\""
    );
    assert_eq!(missing.json()["error"]["code"], -32600);
    // Refused before the body is read: the error carries no id.
    assert_eq!(missing.json()["id"], Value::Null);

    let wrong = list_as(&url, "Bearer not-a-configured-key-at-all").await;
    assert_eq!(wrong.status, 401);
    assert!(
        wrong
            .header("www-authenticate")
            .unwrap()
            .contains("error=\"invalid_token\"")
    );
    let basic = list_as(&url, &format!("Basic {ALICE}")).await;
    assert_eq!(basic.status, 401);
    assert_eq!(mock.count("tools/list"), 0, "nothing reached the backend");

    let ok = list_as(&url, &bearer(ALICE)).await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(mock.count("tools/list"), 1);
    gw.stop().await;
}

/// A 401's challenge names the scopes the resource supports (`scope="…"` beside
/// `resource_metadata`, as the digest's table of statuses shows); a configured scope that is no
/// valid scope token (a `"` would break the quoted string) is left out of it.
#[tokio::test]
async fn the_401_challenge_names_the_supported_scopes() {
    let mock = MockMcp::modern().start().await;
    let servers = "authorization_servers = [\"https://idp.example\"]";
    let cfg = api_keys_config(&mock.url(), "").replace(
        servers,
        &format!("{servers}\nscopes_supported = [\"mcp:read\", \"bad\\\"scope\", \"mcp:call\"]"),
    );
    let gw = Gateway::start(&cfg).await;
    let url = gw.url("/mcp/m");
    let missing = mcp(&url, json!(1), "tools/list", json!({})).await;
    assert_eq!(missing.status, 401);
    assert_eq!(
        missing.header("www-authenticate").unwrap(),
        "Bearer resource_metadata=\"https://gw.example/.well-known/oauth-protected-resource/mcp/m\", \
         scope=\"mcp:read mcp:call\""
    );
    let wrong = list_as(&url, "Bearer not-a-configured-key-at-all").await;
    assert!(
        wrong
            .header("www-authenticate")
            .unwrap()
            .ends_with("scope=\"mcp:read mcp:call\", error=\"invalid_token\""),
        "{:?}",
        wrong.header("www-authenticate")
    );
    gw.stop().await;
}

#[tokio::test]
async fn protected_resource_metadata_is_served_without_auth() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(&mock.url(), "")).await;
    let root = send(
        "GET",
        &gw.url("/.well-known/oauth-protected-resource"),
        &[],
        "",
    )
    .await;
    assert_eq!(root.status, 200);
    assert_eq!(root.json()["resource"], "https://gw.example");
    assert_eq!(
        root.json()["authorization_servers"],
        json!(["https://idp.example"])
    );
    let per = send(
        "GET",
        &gw.url("/.well-known/oauth-protected-resource/mcp/m"),
        &[],
        "",
    )
    .await;
    assert_eq!(per.status, 200);
    assert_eq!(per.json()["resource"], "https://gw.example/mcp/m");
    let none = send(
        "GET",
        &gw.url("/.well-known/oauth-protected-resource/mcp/nope"),
        &[],
        "",
    )
    .await;
    assert_eq!(none.status, 404);
    gw.stop().await;
}

pub(crate) const TEAMS: &str = r#"
[[auth.teams]]
name = "blue"
tools.allow = ["echo", "whoami"]
[[auth.teams]]
name = "red"
tools.allow = ["add"]
"#;

pub(crate) fn tool_names(r: &crate::common::Resp) -> Vec<String> {
    r.result()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_team_cannot_list_or_call_another_teams_tools_even_with_a_forged_name() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(&mock.url(), TEAMS)).await;
    let url = gw.url("/mcp/m");
    let alice = bearer(ALICE);
    let bob = bearer(BOB);

    assert_eq!(tool_names(&list_as(&url, &alice).await), ["echo", "whoami"]);
    assert_eq!(tool_names(&list_as(&url, &bob).await), ["add"]);

    let call = |who: &'static str, tool: &'static str| {
        let url = url.clone();
        let auth = if who == "alice" {
            alice.clone()
        } else {
            bob.clone()
        };
        async move {
            mcp_with(
                &url,
                json!(7),
                "tools/call",
                json!({"name": tool, "arguments": {"a": 1, "b": 2, "text": "hi"}}),
                &[("authorization", &auth)],
            )
            .await
        }
    };
    assert_eq!(call("alice", "echo").await.status, 200);
    let denied = call("alice", "add").await;
    assert_eq!(denied.status, 403);
    assert_eq!(denied.json()["id"], 7);
    assert_eq!(call("bob", "echo").await.status, 403);
    assert_eq!(call("bob", "add").await.status, 200);
    assert_eq!(
        mock.count("tools/call"),
        2,
        "denied calls never reach the backend"
    );

    // Forged Mcp-Name: the header names an allowed tool, the body the forbidden one.
    let mut h = modern_headers("tools/call", Some("echo"));
    h.push(("authorization", &alice));
    let body = modern_body(
        json!(8),
        "tools/call",
        json!({"name": "add", "arguments": {}}),
    );
    let forged = send("POST", &url, &h, body).await;
    assert!(
        forged.status == 400 || forged.status == 403,
        "forged header refused: {}",
        forged.status
    );
    assert_eq!(
        mock.count("tools/call"),
        2,
        "the forged call never reached the backend"
    );
    gw.stop().await;
}

#[tokio::test]
async fn allow_teams_and_team_headers_and_the_client_token_never_reaches_the_backend() {
    let mock = MockMcp::modern().start().await;
    let cfg = api_keys_config(&mock.url(), "").replace(
        "protocol = \"modern\"",
        "protocol = \"modern\"\nallow_teams = [\"blue\"]\nheaders = { Authorization = \"Bearer upstream-static\" }\nteam_headers = { blue = { Authorization = \"Bearer upstream-blue\" } }",
    );
    let gw = Gateway::start(&cfg).await;
    let url = gw.url("/mcp/m");
    // bob (red) may not use the backend at all.
    let r = list_as(&url, &bearer(BOB)).await;
    assert_eq!(r.status, 403);
    // alice's call goes through with the blue team's upstream credential, on the pass-through
    // path (no tool policy) and on the message path (tools/call with an SSE answer).
    let r = list_as(&url, &bearer(ALICE)).await;
    assert_eq!(r.status, 200);
    let who = mcp_with(
        &url,
        json!(2),
        "tools/call",
        json!({"name": "whoami", "arguments": {}}),
        &[("authorization", &bearer(ALICE))],
    )
    .await;
    assert_eq!(who.status, 200);
    assert_eq!(
        who.result()["result"]["content"][0]["text"],
        "Bearer upstream-blue"
    );
    let seen = mock.seen();
    assert!(!seen.is_empty());
    // portico's own change-notification stream (cache invalidation) uses the backend's own
    // credential, not a team's: it is not a client request.
    for s in seen
        .into_iter()
        .filter(|s| s.body["method"] != "subscriptions/listen")
    {
        for v in s.headers.values() {
            let v = v.to_str().unwrap_or("");
            assert!(
                !v.contains(ALICE) && !v.contains(BOB),
                "client token leaked upstream"
            );
        }
        assert_eq!(s.headers["authorization"], "Bearer upstream-blue");
    }
    gw.stop().await;
}

/// `team_headers` reach an initialize-era backend too: every bridged request of a caller of
/// that team carries the team's credential, never the client's token — the `initialize`,
/// `notifications/initialized` and `DELETE` of its upstream session included.
#[tokio::test]
async fn team_headers_reach_a_legacy_backend() {
    let mock = MockMcp::legacy().start().await;
    let cfg = api_keys_config(&mock.url(), "").replace(
        "protocol = \"modern\"",
        "protocol = \"legacy\"\nteam_headers = { blue = { Authorization = \"Bearer upstream-blue\" } }",
    );
    let gw = Gateway::start(&cfg).await;
    let url = gw.url("/mcp/m");
    let r = mcp_with(
        &url,
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "hi"}}),
        &[("authorization", &bearer(ALICE))],
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let calls: Vec<_> = mock
        .seen()
        .into_iter()
        .filter(|s| s.body["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].headers["authorization"], "Bearer upstream-blue");
    // The caller's session is opened with them too: a server that authenticates every
    // request would refuse an `initialize` without them.
    for method in ["initialize", "notifications/initialized"] {
        let opened: Vec<_> = mock
            .seen()
            .into_iter()
            .filter(|s| s.body["method"] == method)
            .collect();
        assert_eq!(opened.len(), 1, "{method}");
        assert_eq!(
            opened[0].headers["authorization"], "Bearer upstream-blue",
            "{method}"
        );
    }
    gw.stop().await;
    // And closed with them (on shutdown: DELETE).
    let deletes: Vec<_> = mock
        .seen()
        .into_iter()
        .filter(|s| s.method == http::Method::DELETE)
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].headers["authorization"], "Bearer upstream-blue");
    for s in mock.seen() {
        for v in s.headers.values() {
            assert!(
                !v.to_str().unwrap_or("").contains(ALICE),
                "client token leaked"
            );
        }
    }
}

#[tokio::test]
async fn mode_none_also_never_forwards_the_client_authorization() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        mock.url()
    ))
    .await;
    let who = mcp_with(
        &gw.url("/mcp/m"),
        json!(2),
        "tools/call",
        json!({"name": "whoami", "arguments": {}}),
        &[("authorization", "Bearer client-secret")],
    )
    .await;
    assert_eq!(who.result()["result"]["content"][0]["text"], "none");
    gw.stop().await;
}

#[tokio::test]
async fn a_private_list_for_alice_is_never_served_to_bob() {
    let mock = MockMcp::modern()
        .ttl_ms(Some(60_000))
        .cache_scope(Some("private"))
        .start()
        .await;
    let gw = Gateway::start(&api_keys_config(&mock.url(), "")).await;
    let url = gw.url("/mcp/m");
    assert_eq!(list_as(&url, &bearer(ALICE)).await.status, 200);
    assert_eq!(list_as(&url, &bearer(ALICE)).await.status, 200);
    let before = mock.count("tools/list");
    assert_eq!(list_as(&url, &bearer(BOB)).await.status, 200);
    assert_eq!(
        mock.count("tools/list"),
        before + 1,
        "bob's private list came from the backend, not from alice's entry"
    );
    // The partition is the principal, not the token spelling.
    let alice = portico::auth::Principal {
        id: "alice".into(),
        team: None,
    };
    let bob = portico::auth::Principal {
        id: "bob".into(),
        team: None,
    };
    let h = http::HeaderMap::new();
    assert_ne!(
        portico::auth::partition(Some(&alice), &h),
        portico::auth::partition(Some(&bob), &h)
    );
    gw.stop().await;
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after_per_principal() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(
        &mock.url(),
        "[auth.rate_limit]\nper_second = 0.5\nburst = 2\n",
    ))
    .await;
    let url = gw.url("/mcp/m");
    assert_eq!(list_as(&url, &bearer(ALICE)).await.status, 200);
    assert_eq!(list_as(&url, &bearer(ALICE)).await.status, 200);
    let limited = list_as(&url, &bearer(ALICE)).await;
    assert_eq!(limited.status, 429);
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "retry-after {retry}");
    assert_eq!(limited.json()["error"]["code"], -32600);
    // bob has his own bucket.
    assert_eq!(list_as(&url, &bearer(BOB)).await.status, 200);
    gw.stop().await;
}

#[tokio::test]
async fn mode_none_is_refused_on_a_public_listener() {
    let cfg = "[server]\nlisten = \"0.0.0.0:8787\"\n[[backends]]\nname='a'\nbuiltin='demo'\n";
    let err = portico::config::validate(portico::config::parse(cfg).unwrap()).unwrap_err();
    assert!(err.to_string().starts_with("auth.mode:"), "{err}");
    let forced = format!("{cfg}[auth]\nallow_insecure_none = true\n");
    assert!(portico::config::validate(portico::config::parse(&forced).unwrap()).is_ok());
}

/// A reload is judged by the listeners bound at startup (a changed `listen` applies only after
/// a restart): it cannot turn `mode = "none"` on for a client listener that is not loopback,
/// nor leave an admin listener that is not loopback without a token. Nothing is bound here:
/// the rules read addresses, and `reload` is called as the watcher calls it.
#[tokio::test]
async fn a_reload_cannot_open_a_listener_bound_in_public() {
    let key = crate::common::secret_file("reload-key", "0123456789abcdef-key");
    let token = crate::common::secret_file("reload-token", "0123456789abcdef-admin");
    let config = |listen: &str, auth: &str, admin: &str| {
        format!(
            "[server]\nlisten = \"{listen}\"\n{auth}{admin}\
             [[backends]]\nname = \"a\"\nbuiltin = \"demo\"\n"
        )
    };
    let keys = format!(
        "[auth]\nmode = \"api_keys\"\n[[auth.api_keys]]\nkey_file = {key:?}\nprincipal = \"p\"\n"
    );
    let admin = |listen: &str, token: Option<&std::path::Path>| match token {
        Some(t) => format!("[admin]\nlisten = \"{listen}\"\ntoken_file = {t:?}\n"),
        None => format!("[admin]\nlisten = \"{listen}\"\n"),
    };
    let start = config(
        "0.0.0.0:18787",
        &keys,
        &admin("0.0.0.0:19091", Some(&token)),
    );
    let path = crate::common::secret_file("reload-config", &start);
    let metrics = std::sync::Arc::new(portico::metrics::Metrics::new());
    let first = portico::config::load(&path).unwrap();
    let state = portico::State::build(first, metrics.clone()).unwrap();
    let shared = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(state));
    let reload = |text: String| {
        std::fs::write(&path, text).unwrap();
        portico::reload::reload(&path, &shared, metrics.clone())
    };
    let public_admin = admin("0.0.0.0:19091", Some(&token));

    // Each of these is a valid file on its own (startup would accept it) but not for the
    // listeners already bound.
    let none = reload(config("127.0.0.1:18787", "", &public_admin)).unwrap_err();
    assert!(
        none.starts_with("auth.mode:") && none.contains("0.0.0.0:18787"),
        "{none}"
    );
    let no_admin = reload(config("0.0.0.0:18787", &keys, "")).unwrap_err();
    assert!(
        no_admin.starts_with("admin:") && no_admin.contains("0.0.0.0:19091"),
        "{no_admin}"
    );
    let tokenless = reload(config(
        "0.0.0.0:18787",
        &keys,
        &admin("127.0.0.1:19091", None),
    ));
    assert!(tokenless.unwrap_err().starts_with("admin:"));
    // Nothing changed: the first generation, its keys and its admin token still hold.
    let now = shared.load();
    assert_eq!(now.generation.number, 1);
    assert!(now.auth.enabled());
    assert!(now.config.admin.as_ref().is_some_and(|a| a.token.is_some()));
    drop(now);

    // What stays safe reloads: the same listeners with another backend, or `none` forced by
    // the operator as at startup.
    reload(start.replace("name = \"a\"", "name = \"b\"")).unwrap();
    let forced = "[auth]\nallow_insecure_none = true\n";
    reload(config("0.0.0.0:18787", forced, &public_admin)).unwrap();
    assert_eq!(shared.load().generation.number, 3);
    for file in [key, token, path] {
        let _ = std::fs::remove_file(file);
    }
}

#[tokio::test]
async fn a_slowloris_connection_is_closed_after_the_header_timeout() {
    let gw = Gateway::start(
        "[server]\nheader_read_timeout_ms = 300\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
    )
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(b"POST /mcp/demo HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let start = std::time::Instant::now();
    let mut buf = Vec::new();
    // Keep dribbling one byte at a time; the server must still close the connection.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let mut chunk = [0u8; 512];
            tokio::select! {
                n = tcp.read(&mut chunk) => match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                },
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    if tcp.write_all(b"a").await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open");
    assert!(start.elapsed() < Duration::from_secs(3));
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413() {
    let gw = Gateway::start(
        "[server]\nmax_body_bytes = 1024\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
    )
    .await;
    let big = "x".repeat(2048);
    let r = mcp(
        &gw.url("/mcp/demo"),
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": big}}),
    )
    .await;
    assert_eq!(r.status, 413);
    gw.stop().await;
}

#[tokio::test]
async fn max_concurrent_refuses_the_excess_with_503() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\nmax_concurrent = 1\n",
        mock.url()
    ))
    .await;
    let url = gw.url("/mcp/m");
    let slow_url = url.clone();
    let slow = tokio::spawn(async move {
        mcp(
            &slow_url,
            json!(1),
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 1500}}),
        )
        .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while mock.count("tools/call") == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let excess = mcp(&url, json!(2), "tools/list", json!({})).await;
    assert_eq!(excess.status, 503);
    assert_eq!(excess.json()["error"]["code"], -32603);
    assert!(excess.header("retry-after").is_some());
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(
        mcp(&url, json!(3), "tools/list", json!({})).await.status,
        200
    );
    gw.stop().await;
}

fn legacy_headers<'a>(auth: &'a str, sid: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", auth),
    ];
    if let Some(s) = sid {
        h.push(("mcp-session-id", s));
        h.push(("mcp-protocol-version", "2025-11-25"));
    }
    h
}

/// A legacy client's session id is bound to the principal that opened it: presented by
/// another principal it is unknown, 404 like a foreign session, for requests and for DELETE.
#[tokio::test]
async fn a_legacy_session_belongs_to_the_principal_that_opened_it() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(&mock.url(), "")).await;
    let url = gw.url("/mcp/m");
    let (alice, bob) = (bearer(ALICE), bearer(BOB));
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    let r = send(
        "POST",
        &url,
        &legacy_headers(&alice, None),
        init.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let sid = r.header("mcp-session-id").unwrap().to_string();
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}).to_string();
    let mine = send(
        "POST",
        &url,
        &legacy_headers(&alice, Some(&sid)),
        list.clone(),
    )
    .await;
    assert_eq!(mine.status, 200, "{:?}", mine.body);
    let theirs = send(
        "POST",
        &url,
        &legacy_headers(&bob, Some(&sid)),
        list.clone(),
    )
    .await;
    assert_eq!(theirs.status, 404, "bob cannot use alice's session");
    let del = send("DELETE", &url, &legacy_headers(&bob, Some(&sid)), "").await;
    assert_eq!(del.status, 404, "nor end it");
    let still = send("POST", &url, &legacy_headers(&alice, Some(&sid)), list).await;
    assert_eq!(still.status, 200);
    gw.stop().await;
}

/// A config reload (here an unrelated change: a backend added) keeps the rate-limit buckets of
/// every rate it does not change — a tool rule's and a team's — so nobody's spent tokens come
/// back; a rule whose rate changes starts afresh. Through the real watcher, the file rewritten.
#[tokio::test]
async fn a_reload_does_not_refill_rate_limit_buckets() {
    let mock = MockMcp::modern().start().await;
    let config = |team_burst: u32, tool_burst: u32, extra_backend: bool| {
        let mut c = api_keys_config(
            &mock.url(),
            &format!(
                "[[auth.teams]]\nname = \"blue\"\n\
                 rate_limit = {{ per_second = 0.001, burst = {team_burst} }}\n\
                 [[auth.teams]]\nname = \"red\"\n\
                 [[auth.tool_limits]]\ntools = [\"echo\"]\n\
                 rate_limit = {{ per_second = 0.001, burst = {tool_burst} }}\n"
            ),
        );
        if extra_backend {
            c.push_str("[[backends]]\nname = \"n\"\nbuiltin = \"demo\"\n");
        }
        c
    };
    let path = crate::common::secret_file("reload-limits", &config(5, 2, false));
    let gw = Gateway::start_reloading(&path).await;
    let (alice, bob) = (bearer(ALICE), bearer(BOB));
    let call = |auth: &str, tool: &str| {
        let (url, auth, tool) = (gw.url("/mcp/m"), auth.to_string(), tool.to_string());
        async move {
            let r = mcp_with(
                &url,
                json!(1),
                "tools/call",
                json!({"name": tool, "arguments": {"text": "hi"}}),
                &[("authorization", &auth)],
            )
            .await;
            let reason = r.json()["error"]["message"].as_str().map(str::to_string);
            (r.status, reason)
        }
    };
    // Bob (team red: no rate of its own) tells when a generation is in: `/mcp/n` answers.
    let n_answers = || {
        let (url, auth) = (gw.url("/mcp/n"), bob.clone());
        async move {
            let r = mcp_with(
                &url,
                json!(2),
                "tools/list",
                json!({}),
                &[("authorization", &auth)],
            )
            .await;
            r.status == 200
        }
    };
    assert_eq!(call(&alice, "echo").await.0, 200);
    assert_eq!(call(&alice, "echo").await.0, 200);
    let (status, why) = call(&alice, "echo").await;
    assert_eq!(status, 429);
    assert!(
        why.unwrap().contains("\"echo\""),
        "the tool's rule refused it"
    );

    std::fs::write(&path, config(5, 2, true)).unwrap();
    crate::listen::until("the reload adding backend n", n_answers).await;
    // The tool rule's bucket is still empty, the team's has one token left (4 of 5 taken).
    let (status, why) = call(&alice, "echo").await;
    assert_eq!(status, 429, "a reload refilled the tool rule's bucket");
    assert!(why.unwrap().contains("\"echo\""));
    assert_eq!(call(&alice, "whoami").await.0, 200);
    let (status, why) = call(&alice, "whoami").await;
    assert_eq!(status, 429, "a reload refilled the team's bucket");
    assert!(
        !why.unwrap().contains("whoami"),
        "the team's rate refused it"
    );

    // New rates: new buckets.
    std::fs::write(&path, config(50, 3, false)).unwrap();
    crate::listen::until("the reload removing backend n", || async {
        !n_answers().await
    })
    .await;
    assert_eq!(call(&alice, "echo").await.0, 200);
    gw.stop().await;
    let _ = std::fs::remove_file(&path);
}

/// `[[auth.tool_limits]]`: a bucket per principal and rule, on the names the client sees and
/// charged on every way to the backend — its own URL, an aggregated endpoint, an
/// initialize-era session (re-initializing gets no fresh bucket); a rule for some teams leaves
/// the others alone; a caller under a rule has its body read, so headers that say otherwise
/// are refused, never forwarded.
#[tokio::test]
async fn tool_limits_hold_per_principal_on_the_names_the_client_sees() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&api_keys_config(
        &mock.url(),
        r#"
[metrics]
listen = "127.0.0.1:0"
[[auth.tool_limits]]
tools = ["*echo"]
rate_limit = { per_second = 0.001, burst = 3 }
[[auth.tool_limits]]
tools = ["add"]
teams = ["blue"]
rate_limit = { per_second = 0.001, burst = 1 }
[[endpoints]]
path = "/mcp/all"
backends = [{ name = "m", prefix = "p" }]
"#,
    ))
    .await;
    let (direct, all) = (gw.url("/mcp/m"), gw.url("/mcp/all"));
    let (alice, bob) = (bearer(ALICE), bearer(BOB));
    let call = |url: &str, auth: &str, tool: &str| {
        let (url, auth, tool) = (url.to_string(), auth.to_string(), tool.to_string());
        async move {
            mcp_with(
                &url,
                json!(5),
                "tools/call",
                json!({"name": tool, "arguments": {"a": 1, "b": 2, "text": "hi"}}),
                &[("authorization", &auth)],
            )
            .await
        }
    };
    // Alice's "*echo" bucket holds 3, across both URLs.
    assert_eq!(call(&direct, &alice, "echo").await.status, 200);
    assert_eq!(call(&all, &alice, "p__echo").await.status, 200);
    assert_eq!(call(&direct, &alice, "echo").await.status, 200);
    for (url, name) in [(&direct, "echo"), (&all, "p__echo")] {
        let limited = call(url, &alice, name).await;
        assert_eq!(limited.status, 429, "{name}: {:?}", limited.body);
        assert_eq!(limited.code(), -32600);
        assert_eq!(limited.json()["id"], 5);
        let message = limited.json()["error"]["message"].to_string();
        assert!(message.contains(&format!("\\\"{name}\\\"")), "{message}");
        let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
        assert!(retry >= 1, "retry-after {retry}");
    }
    assert_eq!(
        mock.count("tools/call"),
        3,
        "refused calls never reach the backend"
    );
    // Other tools are not counted by that rule; "add" is limited for team blue only.
    assert_eq!(call(&direct, &alice, "whoami").await.status, 200);
    assert_eq!(call(&direct, &alice, "add").await.status, 200);
    assert_eq!(call(&direct, &alice, "add").await.status, 429);
    for _ in 0..3 {
        assert_eq!(call(&direct, &bob, "add").await.status, 200, "bob is red");
    }
    // Headers that say "a list" over a body that calls the limited tool: read, and refused.
    let calls_before = mock.count("tools/call");
    let mut h = modern_headers("tools/list", None);
    h.push(("authorization", &alice));
    let body = modern_body(
        json!(9),
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "hi"}}),
    );
    let forged = send("POST", &direct, &h, body).await;
    assert_eq!(forged.status, 400, "{:?}", forged.body);
    assert_eq!(mock.count("tools/call"), calls_before, "never forwarded");
    // Bob's bucket is his own; his initialize-era sessions draw on it, a new session too.
    assert_eq!(call(&direct, &bob, "echo").await.status, 200);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    let echo = json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"hi"}}})
    .to_string();
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = send(
            "POST",
            &direct,
            &legacy_headers(&bob, None),
            init.to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let sid = r.header("mcp-session-id").unwrap().to_string();
        for _ in 0..2 {
            let r = send(
                "POST",
                &direct,
                &legacy_headers(&bob, Some(&sid)),
                echo.clone(),
            )
            .await;
            statuses.push(r.status);
        }
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    // Each refusal counted under its own reason, on the endpoint it came to.
    let scrape = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&scrape.body).to_string();
    let refused: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("portico_request_errors_total{")
                && l.contains("reason=\"tool_rate_limited\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 5.0, "{text}");
    gw.stop().await;
}

/// `[server] max_connections`: at the cap the listener stops accepting — a newcomer's
/// connect succeeds (the kernel's backlog) but its request waits, unanswered, until an open
/// connection closes; then it is served. Counted and exported.
#[tokio::test]
async fn max_connections_holds_newcomers_in_the_backlog_until_one_closes() {
    let gw = Gateway::start(
        "[server]\nmax_connections = 2\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
    )
    .await;
    let first = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    // The second is served (so both are accepted before the newcomer comes).
    let get = b"GET /no/such/route HTTP/1.1\r\nHost: x\r\n\r\n";
    second.write_all(get).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), second.read_exact(&mut head))
        .await
        .expect("the second connection is answered")
        .unwrap();
    assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
    let mut third = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(gw.addr),
    )
    .await
    .expect("the kernel completes the connect")
    .unwrap();
    third.write_all(get).await.unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(400), third.read(&mut byte)).await;
    assert!(
        waited.is_err(),
        "the third connection was served at the cap"
    );
    drop(first);
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), third.read_exact(&mut head))
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
    let scrape = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&scrape.body).to_string();
    assert!(
        text.contains("\nportico_client_connections_max 2\n"),
        "{text}"
    );
    let waits: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("portico_connection_limit_waits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no waits counter in\n{text}"));
    assert!(waits >= 1.0, "{waits}");
    assert!(text.contains("\nportico_client_connections "), "{text}");
    gw.stop().await;
}
