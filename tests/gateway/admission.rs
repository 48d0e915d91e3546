//! One per-backend step on every path (README "The per-backend step"): `allow_teams`, team tool
//! policy on the names the client sees, `max_concurrent` and the circuit breaker hold for a
//! member reached through an aggregated endpoint — by a 2026-07-28 client, by an
//! initialize-era client's session, and by `portico stdio` — exactly as on `/mcp/<name>`.

use crate::common::mock::MockMcp;
use crate::common::{Gateway, Resp, mcp_with, send};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const BLUE_KEY: &str = "blue-key-0123456789abcdef";
const RED_KEY: &str = "red-key-0123456789abcdef0";

/// An endpoint over four members, two API keys (teams blue and red):
/// - `r`: tools `echo`, `slow`, `secret_tool`, …; `max_concurrent = 1`;
/// - `x`: only team red may use it (`allow_teams`);
/// - `d`: nothing listens; its breaker opens after one failure and stays open;
/// - blue denies `r__secret_*`; red allows `r__*` and `x__*` only.
fn config(r: &str, x: &str, dead: &str) -> String {
    format!(
        r#"
{keys}public_url = "https://gw.example"
[[auth.teams]]
name = "blue"
tools = {{ deny = ["r__secret_*"] }}
[[auth.teams]]
name = "red"
tools = {{ allow = ["r__*", "x__*"] }}

[[backends]]
name = "r"
url = "{r}"
protocol = "modern"
max_concurrent = 1

[[backends]]
name = "x"
url = "{x}"
protocol = "modern"
allow_teams = ["red"]

[[backends]]
name = "d"
url = "{dead}"
protocol = "modern"
breaker_failures = 1
breaker_open_ms = 600000
retries = 0
timeout_ms = 2000

[[endpoints]]
path = "/mcp"
backends = ["r", "x", "d"]
"#,
        keys = api_keys(),
    )
}

/// `[auth]` with blue's and red's API keys (each in a file of its own), open for more `[auth]`
/// keys.
fn api_keys() -> String {
    let b = crate::common::secret_file("admission-blue", BLUE_KEY);
    let rd = crate::common::secret_file("admission-red", RED_KEY);
    format!(
        "[[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"bea\"\nteam = \"blue\"\n\
         [[auth.api_keys]]\nkey_file = \"{}\"\nprincipal = \"rob\"\nteam = \"red\"\n\
         [auth]\nmode = \"api_keys\"\n",
        b.display(),
        rd.display()
    )
}

/// A URL nothing listens on.
async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}/mcp")
}

struct Setup {
    gw: Gateway,
    r: crate::common::mock::MockHandle,
    x: crate::common::mock::MockHandle,
    toml: String,
}

async fn setup() -> Setup {
    let r = MockMcp::modern().ttl_ms(None).start().await;
    r.add_tool("secret_tool");
    let x = MockMcp::modern().ttl_ms(None).start().await;
    let toml = config(&r.url(), &x.url(), &dead_url().await);
    let gw = Gateway::start(&toml).await;
    Setup { gw, r, x, toml }
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

async fn as_team(url: &str, key: &str, id: u64, method: &str, params: Value) -> Resp {
    mcp_with(
        url,
        json!(id),
        method,
        params,
        &[("authorization", &bearer(key))],
    )
    .await
}

fn names(r: &Resp) -> Vec<String> {
    r.result()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {:?}", String::from_utf8_lossy(&r.body)))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn an_aggregated_member_keeps_its_admission_and_policy() {
    let s = setup().await;
    let url = s.gw.url("/mcp");

    // allow_teams: blue never sees x's tools, and a call is refused before reaching x.
    let blue_list = as_team(&url, BLUE_KEY, 1, "tools/list", json!({})).await;
    assert_eq!(blue_list.status, 200, "{:?}", blue_list.body);
    let blue = names(&blue_list);
    assert!(blue.iter().all(|n| !n.starts_with("x__")), "{blue:?}");
    assert!(blue.contains(&"r__echo".to_string()), "{blue:?}");
    let before = s.x.count("tools/call");
    let r = as_team(
        &url,
        BLUE_KEY,
        2,
        "tools/call",
        json!({"name":"x__echo","arguments":{"text":"hi"}}),
    )
    .await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(s.x.count("tools/call"), before, "x never saw blue's call");
    // Red may use x.
    let red = names(&as_team(&url, RED_KEY, 3, "tools/list", json!({})).await);
    assert!(red.contains(&"x__echo".to_string()), "{red:?}");
    let r = as_team(
        &url,
        RED_KEY,
        4,
        "tools/call",
        json!({"name":"x__echo","arguments":{"text":"hi"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // Team globs judge the prefixed names: blue's deny hides and refuses r__secret_tool...
    assert!(!blue.contains(&"r__secret_tool".to_string()), "{blue:?}");
    let r = as_team(
        &url,
        BLUE_KEY,
        5,
        "tools/call",
        json!({"name":"r__secret_tool"}),
    )
    .await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("r__secret_tool")
    );
    // ...and red's allow = ["r__*", "x__*"] admits it.
    assert!(red.contains(&"r__secret_tool".to_string()), "{red:?}");
    assert!(
        red.iter()
            .all(|n| n.starts_with("r__") || n.starts_with("x__")),
        "{red:?}"
    );
    let r = as_team(
        &url,
        RED_KEY,
        6,
        "tools/call",
        json!({"name":"r__secret_tool"}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // max_concurrent = 1 on r: a second concurrent call through the aggregate gets 503.
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            as_team(
                &url,
                RED_KEY,
                7,
                "tools/call",
                json!({"name":"r__slow","arguments":{"ms":1500}}),
            )
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.r.count("tools/call") < 2 {
        assert!(Instant::now() < deadline, "the slow call never reached r");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = as_team(
        &url,
        BLUE_KEY,
        8,
        "tools/call",
        json!({"name":"r__echo","arguments":{"text":"x"}}),
    )
    .await;
    assert_eq!(second.status, 503, "{:?}", second.body);
    assert!(second.header("retry-after").is_some());
    assert_eq!(slow.await.unwrap().status, 200);

    // The breaker of d: the first call finds it dead, the second fails fast with 503.
    let first = as_team(&url, RED_KEY, 9, "tools/list", json!({})).await;
    assert_eq!(first.status, 200, "a failing member is left out of lists");
    let r = as_team(
        &url,
        BLUE_KEY,
        10,
        "tools/call",
        json!({"name":"d__anything"}),
    )
    .await;
    assert_eq!(r.status, 503, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("circuit breaker"),
        "{:?}",
        r.body
    );
    s.gw.stop().await;
}

/// An initialize-era client, by hand, on the aggregated endpoint.
async fn legacy_session(url: &str, key: &str) -> (String, String) {
    let auth = bearer(key);
    let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    let h = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", auth.as_str()),
    ];
    let r = send("POST", url, &h, body.to_string()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let sid = r.header("mcp-session-id").expect("session id").to_string();
    (sid, "2025-06-18".to_string())
}

async fn legacy_call(
    url: &str,
    key: &str,
    sid: &str,
    id: u64,
    method: &str,
    params: Value,
) -> Resp {
    let auth = bearer(key);
    let h = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", auth.as_str()),
        ("mcp-session-id", sid),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
    send("POST", url, &h, body.to_string()).await
}

#[tokio::test]
async fn a_legacy_session_on_the_endpoint_gets_the_same_checks() {
    let s = setup().await;
    let url = s.gw.url("/mcp");
    let (sid, _) = legacy_session(&url, BLUE_KEY).await;
    let list = legacy_call(&url, BLUE_KEY, &sid, 1, "tools/list", json!({})).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    let blue = names(&list);
    assert!(blue.contains(&"r__echo".to_string()), "{blue:?}");
    assert!(
        !blue
            .iter()
            .any(|n| n.starts_with("x__") || n == "r__secret_tool"),
        "{blue:?}"
    );
    for tool in ["x__echo", "r__secret_tool"] {
        let r = legacy_call(&url, BLUE_KEY, &sid, 2, "tools/call", json!({"name": tool})).await;
        assert_eq!(r.status, 403, "{tool}: {:?}", r.body);
    }
    // The breaker member fails fast for a legacy client too.
    let _ = legacy_call(
        &url,
        BLUE_KEY,
        &sid,
        3,
        "tools/call",
        json!({"name":"d__x"}),
    )
    .await;
    let r = legacy_call(
        &url,
        BLUE_KEY,
        &sid,
        4,
        "tools/call",
        json!({"name":"d__x"}),
    )
    .await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    // The red team's session may use x.
    let (sid, _) = legacy_session(&url, RED_KEY).await;
    let r = legacy_call(
        &url,
        RED_KEY,
        &sid,
        5,
        "tools/call",
        json!({"name":"x__echo","arguments":{"text":"hi"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    s.gw.stop().await;
}

/// An initialize-era client's `initialize` on an endpoint opens its upstream sessions at once
/// (so another replica can adopt them) — only on the members the step would admit it to: blue
/// opens none on `lx`, which only red may use, and red does.
#[tokio::test]
async fn a_legacy_initialize_opens_sessions_only_where_the_step_admits() {
    let l = MockMcp::legacy().start().await;
    let lx = MockMcp::legacy().start().await;
    let toml = format!(
        r#"
{keys}
[[backends]]
name = "l"
url = "{l}"
protocol = "legacy"

[[backends]]
name = "lx"
url = "{lx}"
protocol = "legacy"
allow_teams = ["red"]

[[endpoints]]
path = "/mcp"
backends = ["l", "lx"]
"#,
        keys = api_keys(),
        l = l.url(),
        lx = lx.url(),
    );
    let gw = Gateway::start(&toml).await;
    let url = gw.url("/mcp");
    let (l0, lx0) = (l.count("initialize"), lx.count("initialize"));
    legacy_session(&url, BLUE_KEY).await;
    assert_eq!(
        l.count("initialize"),
        l0 + 1,
        "blue's session on l opens at once"
    );
    assert_eq!(
        lx.count("initialize"),
        lx0,
        "lx never sees blue's initialize"
    );
    legacy_session(&url, RED_KEY).await;
    assert_eq!(
        lx.count("initialize"),
        lx0 + 1,
        "red's session on lx opens at once"
    );
    gw.stop().await;
}

/// `portico stdio --config F` (the library entry `main` calls) with blue's credential.
#[tokio::test]
async fn portico_stdio_gets_the_same_checks() {
    let s = setup().await;
    let config = portico::config::validate(portico::config::parse(&s.toml).unwrap()).unwrap();
    let opts = portico::stdio_front::StdioOptions {
        endpoint: Some("/mcp".into()),
        max_line_bytes: None,
        authorization: Some(bearer(BLUE_KEY)),
    };
    let (client, server) = tokio::io::duplex(1 << 20);
    let (server_read, server_write) = tokio::io::split(server);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(portico::stdio_front::run(
        config,
        opts,
        server_read,
        server_write,
        async {
            let _ = stop_rx.await;
        },
    ));
    let (read, mut write) = tokio::io::split(client);
    let mut lines = BufReader::new(read).lines();
    let mut ask = async |id: u64, method: &str, params: Value| -> Value {
        let line = crate::common::modern_body(json!(id), method, params);
        write.write_all(line.as_bytes()).await.unwrap();
        write.write_all(b"\n").await.unwrap();
        loop {
            let l = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .expect("an answer within 20 s")
                .unwrap()
                .expect("a line");
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    };
    let list = ask(1, "tools/list", json!({})).await;
    let tools: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"r__echo"), "{tools:?}");
    assert!(
        !tools
            .iter()
            .any(|n| n.starts_with("x__") || *n == "r__secret_tool"),
        "{tools:?}"
    );
    for (id, tool) in [(2, "x__echo"), (3, "r__secret_tool")] {
        let r = ask(id, "tools/call", json!({"name": tool})).await;
        assert_eq!(r["error"]["code"], json!(-32600), "{tool}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Forbidden"),
            "{r}"
        );
    }
    let r = ask(
        4,
        "tools/call",
        json!({"name":"r__echo","arguments":{"text":"ok"}}),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    let _ = ask(5, "tools/call", json!({"name":"d__x"})).await;
    let r = ask(6, "tools/call", json!({"name":"d__x"})).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("circuit breaker"),
        "{r}"
    );
    let _ = stop_tx.send(());
    drop(write);
    let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    s.gw.stop().await;
}

/// A stdio client whose credential `[auth]` refuses does not start.
#[tokio::test]
async fn portico_stdio_refuses_a_bad_credential_at_start() {
    let s = setup().await;
    let config = portico::config::validate(portico::config::parse(&s.toml).unwrap()).unwrap();
    let opts = portico::stdio_front::StdioOptions {
        endpoint: Some("/mcp".into()),
        max_line_bytes: None,
        authorization: Some(bearer("wrong-key-000000000000000")),
    };
    let (_client, server) = tokio::io::duplex(1024);
    let (r, w) = tokio::io::split(server);
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        portico::stdio_front::run(config, opts, r, w, std::future::pending()),
    )
    .await
    .expect("refused at once");
    let err = out.expect_err("a wrong key must not start");
    assert!(err.to_string().contains("Unauthorized"), "{err}");
    s.gw.stop().await;
}

/// A cached merged page is one team's view. With the cache on and public member lists:
/// - without team tool policies, both teams' pages are `public`, yet only red may use `x`:
///   the team is part of the key, so neither gets the other's page from the cache;
/// - with them (blue hides `r__secret_*`), the pages are private to each caller.
///
/// Either way, each team gets its own page on every round, and every repeat is a hit.
#[tokio::test]
async fn a_cached_merged_page_never_crosses_teams() {
    for policies in [false, true] {
        let r = MockMcp::modern()
            .ttl_ms(Some(600_000))
            .cache_scope(Some("public"))
            .start()
            .await;
        r.add_tool("secret_tool");
        let x = MockMcp::modern()
            .ttl_ms(Some(600_000))
            .cache_scope(Some("public"))
            .start()
            .await;
        let mut toml = config(&r.url(), &x.url(), &dead_url().await).replace(
            "backends = [\"r\", \"x\", \"d\"]",
            "backends = [\"r\", \"x\"]",
        );
        if !policies {
            toml = toml
                .replace("tools = { deny = [\"r__secret_*\"] }", "")
                .replace("tools = { allow = [\"r__*\", \"x__*\"] }", "");
        }
        let gw = Gateway::start(&toml).await;
        let url = gw.url("/mcp");
        // Blue first in one round, red first in the next: whoever fills the cache.
        for round in 0..4 {
            let (mut blue, mut red) = (Value::Null, Value::Null);
            for key in if round % 2 == 0 {
                [BLUE_KEY, RED_KEY]
            } else {
                [RED_KEY, BLUE_KEY]
            } {
                let got = as_team(&url, key, round, "tools/list", json!({}))
                    .await
                    .result();
                if key == BLUE_KEY {
                    blue = got
                } else {
                    red = got
                }
            }
            let (scope, blue, red) = (
                blue["result"]["cacheScope"].clone(),
                names_of(&blue),
                names_of(&red),
            );
            assert_eq!(scope, if policies { "private" } else { "public" });
            let why = format!("policies {policies}, round {round}: blue {blue:?}, red {red:?}");
            assert!(blue.contains(&"r__echo".to_string()), "{why}");
            assert_eq!(
                blue.contains(&"r__secret_tool".to_string()),
                !policies,
                "{why}"
            );
            assert!(!blue.iter().any(|n| n.starts_with("x__")), "{why}");
            assert!(red.contains(&"r__secret_tool".to_string()), "{why}");
            assert!(red.contains(&"x__echo".to_string()), "{why}");
        }
        // Every repeat came from the cache: each member was asked once.
        assert_eq!((r.count("tools/list"), x.count("tools/list")), (1, 1));
        gw.stop().await;
    }
}

fn names_of(v: &Value) -> Vec<String> {
    v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect()
}
