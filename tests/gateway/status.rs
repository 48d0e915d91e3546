//! The status page on the metrics listener (`/status`, `/status.json`): the JSON lists every
//! backend with the health, era, breaker, cache and session numbers `/metrics` reports for the
//! same moment, and per-backend latency counts equal to `portico_upstream_duration_seconds`;
//! the HTML is served under a strict CSP, escapes what backends send (a tool named like markup),
//! refuses writes; a reload bumps the config generation; and headless Chromium renders the page
//! without a console error, shows a down backend as down, and leaves a screenshot in `target/`.

use crate::common::mock::MockMcp;
use crate::common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A tool name that would be markup if the page did not escape it.
const EVIL_TOOL: &str = "<img src=x onerror=alert(1)>";

/// A port nothing listens on (bound, then released).
async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Two backends: `live` (the HTTP mock) and `dead` (a closed loopback port), and an aggregated
/// endpoint over both. Health checks every 200 ms so the verdicts settle fast.
fn two_backends(live: &str, dead_port: u16, extra: &str) -> String {
    format!(
        r#"
[log]
access = false

[metrics]
health_interval_ms = 200
health_timeout_ms = 2000
[admin]
listen = "127.0.0.1:0"
{extra}
[[backends]]
name = "live"
url = "{live}"

[[backends]]
name = "dead"
url = "http://127.0.0.1:{dead_port}/mcp"
protocol = "modern"
timeout_ms = 1000

[[endpoints]]
path = "/mcp"
backends = ["live", {{ name = "dead", prefix = "d" }}]
"#
    )
}

async fn status_json(gw: &Gateway) -> Value {
    let r = send("GET", &gw.admin_url("/status.json"), &[], "").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

fn backend<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["backends"]
        .as_array()
        .expect("backends array")
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("backend {name} missing from {status}"))
}

/// Reads `/status.json` until `cond` holds (health checks and catalogue fetches settle in the
/// background); bounded.
async fn status_until(gw: &Gateway, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = status_json(gw).await;
        if cond(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last status: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn settled(s: &Value) -> bool {
    backend(s, "live")["health"]["status"] == "up"
        && backend(s, "dead")["health"]["status"] == "down"
        && backend(s, "live")["tools"]["state"] == "listed"
}

/// `name{labels} value` lines of a scrape, as (series, value); only what these tests compare.
fn metric(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
}

async fn scrape(gw: &Gateway) -> String {
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body.to_vec()).expect("UTF-8 exposition")
}

#[tokio::test]
async fn status_json_lists_both_backends_and_agrees_with_metrics() {
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&two_backends(&mock.url(), closed_port().await, "")).await;
    // Traffic: one cache miss and two hits on live, three pass-through calls, one failed call
    // on dead (connect refused → 502).
    for i in 0..3 {
        let r = mcp(&gw.url("/mcp/live"), json!(i), "tools/list", json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    for i in 0..3 {
        let r = mcp(
            &gw.url("/mcp/live"),
            json!(i),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let r = mcp(
        &gw.url("/mcp/dead"),
        json!(9),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
    )
    .await;
    assert_eq!(r.status, 502, "{:?}", r.body);

    let s = status_until(&gw, "live up, dead down, live's tools listed", settled).await;
    let m = scrape(&gw).await;
    // Re-read after the scrape: nothing moves any more, so both describe the same moment.
    let s2 = status_json(&gw).await;
    assert_eq!(
        s["backends"].as_array().map(Vec::len),
        Some(2),
        "both backends: {s:#}"
    );
    for name in ["live", "dead"] {
        let b = backend(&s2, name);
        let up = if b["health"]["status"] == "up" {
            1.0
        } else {
            0.0
        };
        assert_eq!(
            metric(&m, "portico_backend_up", &[("backend", name)]),
            Some(up),
            "{name}: backend_up"
        );
        assert_eq!(
            metric(
                &m,
                "portico_backend_up",
                &[("backend", name), ("transport", "http")]
            ),
            Some(up),
            "{name}: transport label agrees"
        );
        let protocol = b["protocol"].as_str().unwrap();
        assert_eq!(
            metric(
                &m,
                "portico_backend_protocol",
                &[("backend", name), ("protocol", protocol)]
            ),
            Some(1.0),
            "{name}: protocol {protocol}"
        );
        assert_eq!(
            metric(&m, "portico_backend_circuit_state", &[("backend", name)]),
            b["breaker"]["value"].as_f64(),
            "{name}: breaker"
        );
        assert_eq!(
            metric(&m, "portico_legacy_sessions", &[("backend", name)]),
            b["legacy_sessions"].as_f64(),
            "{name}: legacy sessions"
        );
        // The latency window and the upstream histogram see the same requests.
        assert_eq!(
            metric(
                &m,
                "portico_upstream_duration_seconds_count",
                &[("backend", name)]
            ),
            b["latency"]["requests"].as_f64(),
            "{name}: upstream requests"
        );
        assert_eq!(b["in_flight"], 0, "{name}: nothing in flight");
    }
    let live = backend(&s2, "live");
    assert_eq!(live["protocol"], "modern");
    assert_eq!(live["transport"], "http");
    assert_eq!(live["latency"]["requests"], 4, "one miss + three calls");
    assert_eq!(live["latency"]["errors"], 0);
    assert!(live["latency"]["p50_ms"].as_f64().is_some_and(|v| v > 0.0));
    assert!(live["last_error"].is_null());
    let tools: Vec<&str> = live["tools"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"echo"), "{tools:?}");
    let echo = &live["tools"]["tools"][0];
    assert_eq!(echo["endpoints"][0]["path"], "/mcp");
    assert_eq!(
        echo["endpoints"][0]["name"], "live__echo",
        "prefixed with the member's name by default"
    );

    let dead = backend(&s2, "dead");
    assert_eq!(dead["health"]["status"], "down");
    assert!(dead["health"]["error"].is_string(), "{dead:#}");
    assert_eq!(dead["latency"]["requests"], 1);
    assert_eq!(dead["latency"]["errors"], 1);
    assert_eq!(dead["last_error"]["reason"], "backend_unreachable");
    assert_eq!(
        dead["tools"]["state"], "waiting",
        "a down backend is not asked"
    );
    assert_eq!(s2["backends_up"], 1);

    let c = &s2["cache"];
    assert_eq!(
        metric(&m, "portico_cache_entries", &[]),
        c["entries"].as_f64()
    );
    assert_eq!(metric(&m, "portico_cache_bytes", &[]), c["bytes"].as_f64());
    for (outcome, key) in [("hit", "hits"), ("miss", "misses"), ("bypass", "bypassed")] {
        assert_eq!(
            metric(&m, "portico_cache_requests_total", &[("outcome", outcome)]),
            c[key].as_f64(),
            "cache {outcome}"
        );
    }
    assert_eq!(
        (c["hits"].as_u64(), c["misses"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(c["entries"].as_u64().is_some_and(|n| n >= 1));
    assert!((c["hit_ratio"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(c["redis"]["configured"], false);

    assert_eq!(s2["endpoints"][0]["path"], "/mcp");
    let members: Vec<&str> = s2["endpoints"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["backend"].as_str())
        .collect();
    assert_eq!(members, ["live", "dead"]);
    assert_eq!(s2["endpoints"][0]["members"][1]["prefix"], "d");
    assert_eq!(s2["config"]["generation"], 1);
    assert!(s2["config"]["last_reload_unix_ms"].is_null());
    assert_eq!(s2["sessions"]["parked_calls"], 0);
    assert!(s2["sessions"]["legacy_client_sessions"].is_null());
    gw.stop().await;
}

/// A fresh directory per call: tests run concurrently and must not rewrite each other's files.
fn fresh_dir(what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "portico-status-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A key file for `[[auth.api_keys]]` (the key never sits in the config).
fn key_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{name}-key-0123456789abcdef\n")).unwrap();
    path
}

/// API-key auth with two teams: `blue` sees `echo` and anything starting with `<`, `red` sees
/// everything but that. alice is blue.
fn teams_auth() -> String {
    let dir = fresh_dir("keys");
    format!(
        r#"
[auth]
mode = "api_keys"
[[auth.api_keys]]
key_file = "{a}"
principal = "alice"
team = "blue"
[[auth.api_keys]]
key_file = "{b}"
principal = "bob"
team = "red"
[[auth.teams]]
name = "blue"
tools = {{ allow = ["echo", "<*"] }}
[[auth.teams]]
name = "red"
tools = {{ deny = ["<*"] }}
"#,
        a = key_file(&dir, "alice").display(),
        b = key_file(&dir, "bob").display(),
    )
}

const ALICE: &str = "Bearer alice-key-0123456789abcdef";

#[tokio::test]
async fn status_html_is_escaped_under_a_strict_csp_and_read_only() {
    let mock = MockMcp::modern().start().await;
    mock.add_tool(EVIL_TOOL);
    let gw = Gateway::start(&two_backends(
        &mock.url(),
        closed_port().await,
        &teams_auth(),
    ))
    .await;
    let s = status_until(&gw, "live's tools listed", settled).await;
    assert_eq!(s["auth_mode"], "api_keys");
    assert_eq!(s["teams"], json!(["blue", "red"]));
    let tools = backend(&s, "live")["tools"]["tools"].as_array().unwrap();
    let evil = tools
        .iter()
        .find(|t| t["name"] == EVIL_TOOL)
        .expect("the markup-named tool is listed as it is");
    assert_eq!(evil["visible"]["teams"], json!(["blue"]), "red denies <*");
    let echo = tools.iter().find(|t| t["name"] == "echo").unwrap();
    assert_eq!(echo["visible"]["teams"], json!(["blue", "red"]));
    let add = tools.iter().find(|t| t["name"] == "add").unwrap();
    assert_eq!(
        add["visible"]["teams"],
        json!(["red"]),
        "blue allows only echo and <*"
    );

    let r = send("GET", &gw.admin_url("/status"), &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r.header("content-security-policy").expect("a CSP header");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(
        !csp.contains("script-src"),
        "no script is allowed at all: {csp}"
    );
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let html = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
    assert!(
        html.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the tool name appears, escaped"
    );
    assert!(!html.contains("<img"), "never as markup");
    assert!(!html.contains("<script"), "the page has no script");
    // Self-contained: no URL that would load anything (links to the JSON and /metrics are
    // navigations, not loads).
    for needle in ["src=\"http", "href=\"http", "url(", "@import"] {
        assert!(!html.contains(needle), "external asset: {needle}");
    }
    assert!(html.contains("id=\"backend-live\"") && html.contains("id=\"backend-dead\""));

    for method in ["POST", "PUT", "DELETE"] {
        let r = send(method, &gw.admin_url("/status"), &[], "x").await;
        assert_eq!(r.status, 405, "{method} /status");
        let r = send(method, &gw.admin_url("/status.json"), &[], "x").await;
        assert_eq!(r.status, 405, "{method} /status.json");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_reload_bumps_the_config_generation() {
    let dir = fresh_dir("reload");
    let path = dir.join("portico.toml");
    let config = |name: &str| format!("[[backends]]\nname = \"{name}\"\nbuiltin = \"demo\"\n");
    std::fs::write(&path, config("a")).unwrap();
    let metrics = Arc::new(portico::metrics::Metrics::new());
    let first = portico::config::load(&path).unwrap();
    let state = portico::State::build(first, metrics.clone()).unwrap();
    assert_eq!(state.generation.number, 1);
    let shared = Arc::new(arc_swap::ArcSwap::from_pointee(state));
    std::fs::write(&path, config("b")).unwrap();
    portico::reload::reload(&path, &shared, metrics.clone()).unwrap();
    let snap = portico::status::Snapshot::build(&shared.load(), false);
    assert_eq!(snap.config.generation, 2);
    assert!(snap.config.last_reload_unix_ms.is_some());
    assert_eq!(snap.backends[0].name, "b");
    // An invalid file changes nothing, the generation included.
    std::fs::write(&path, "[[backends]]\nname = 7\n").unwrap();
    assert!(portico::reload::reload(&path, &shared, metrics).is_err());
    assert_eq!(shared.load().generation.number, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

// === The browser test ===

/// The Chromium binary: `$PORTICO_CHROMIUM`, else `chromium` on `PATH`. Missing is a failure,
/// never a skip: `.ci/run` installs it.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("PORTICO_CHROMIUM") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "chromium not found on PATH (or PORTICO_CHROMIUM): the status-page browser test \
             needs it. Install the Debian package: apt-get install -y chromium (.ci/run does)"
        )
    })
}

/// What one headless Chromium run produced.
struct BrowserRun {
    stdout: String,
    stderr: String,
}

impl BrowserRun {
    /// Lines of Chromium's log that report a page problem: every console message (the page
    /// has no script, so any message is a problem — CSP violations and failed loads are
    /// reported there), uncaught exceptions and refusals.
    fn console_problems(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| {
                l.contains(":CONSOLE")
                    || l.contains("Uncaught")
                    || l.contains("Refused to")
                    || l.contains("Content Security Policy")
                    || l.contains("Content-Security-Policy")
            })
            .collect()
    }
}

/// Runs headless Chromium with `args` + `url` in a fresh profile, bounded by 60 s, in its own
/// process group, which is killed afterwards whatever happened (renderer and GPU helpers
/// included).
async fn run_chromium(args: &[String], url: &str) -> BrowserRun {
    let profile = fresh_dir("chromium-profile");
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0)
    .kill_on_drop(true);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium ({:?}): {e}", chromium()));
    let group = child.id();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await;
    // The whole group: the browser's helpers must not outlive the test.
    if let Some(pgid) = group {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_dir_all(&profile);
    let out = out
        .expect("chromium finished within 60 s")
        .expect("chromium ran");
    BrowserRun {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The `<tr>` of one backend in the rendered DOM.
fn row<'a>(dom: &'a str, backend: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"backend-{backend}\""))
        .unwrap_or_else(|| panic!("no row for {backend} in the DOM"));
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

#[tokio::test]
async fn status_page_renders_in_headless_chromium() {
    // First prove the console check catches something with this Chromium: a page whose inline
    // script the same CSP blocks.
    let control = fresh_dir("control").join("control.html");
    std::fs::write(
        &control,
        format!(
            "<!doctype html><html><head><meta http-equiv=\"Content-Security-Policy\" \
             content=\"{}\"></head><body><p>control</p><script>console.log(1)</script></body>\
             </html>",
            portico::status::CSP
        ),
    )
    .unwrap();
    let run = run_chromium(
        &["--dump-dom".into()],
        &format!("file://{}", control.display()),
    )
    .await;
    let _ = std::fs::remove_dir_all(control.parent().unwrap());
    assert!(run.stdout.contains("control"), "chromium rendered nothing");
    assert!(
        !run.console_problems().is_empty(),
        "the console check must see the control page's CSP violation; stderr:\n{}",
        run.stderr
    );

    // Teams and a markup-named tool, so the page shows per-team visibility and a real browser
    // gets the chance to misread a tool name as markup.
    let mock = MockMcp::modern().start().await;
    mock.add_tool(EVIL_TOOL);
    let gw = Gateway::start(&two_backends(
        &mock.url(),
        closed_port().await,
        &teams_auth(),
    ))
    .await;
    // Some traffic, so the chart and counters have something to show.
    let alice = [("authorization", ALICE)];
    for i in 0..8 {
        let r = mcp_with(
            &gw.url("/mcp/live"),
            json!(i),
            "tools/list",
            json!({}),
            &alice,
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let r = mcp_with(
            &gw.url("/mcp/live"),
            json!(i),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
            &alice,
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let r = mcp_with(
        &gw.url("/mcp/dead"),
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
        &alice,
    )
    .await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    status_until(&gw, "live up, dead down, tools listed", settled).await;
    let url = gw.admin_url("/status");

    let run = run_chromium(&["--dump-dom".into()], &url).await;
    let dom = &run.stdout;
    assert!(dom.contains("portico"), "page rendered: {dom}");
    assert!(
        row(dom, "live").contains(">up<"),
        "live shows up: {}",
        row(dom, "live")
    );
    let dead = row(dom, "dead");
    assert!(dead.contains("b-down") && dead.contains(">down<"), "{dead}");
    assert!(dead.contains("class=\"name\">dead<"), "{dead}");
    assert!(dom.contains("class=\"name\">live<"));
    assert!(dom.contains("<svg"), "latency charts are drawn");
    assert!(
        dom.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the markup-named tool is text in the DOM"
    );
    assert!(!dom.contains("<img"), "and never an element");
    assert!(
        dom.contains("class=\"team\">blue<"),
        "team visibility is shown"
    );
    let problems = run.console_problems();
    assert!(
        problems.is_empty(),
        "console errors on /status:\n{}",
        problems.join("\n")
    );

    // Named per test process: two suites sharing a target directory must not take each other's.
    let shot = target_dir().join(format!("status-page-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&shot);
    std::fs::create_dir_all(target_dir()).unwrap();
    let run = run_chromium(
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1440,1700".into(),
            "--hide-scrollbars".into(),
            "--run-all-compositor-stages-before-draw".into(),
        ],
        &url,
    )
    .await;
    let problems = run.console_problems();
    assert!(
        problems.is_empty(),
        "console errors while taking the screenshot:\n{}",
        problems.join("\n")
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {} ({e}); stderr:\n{}",
            shot.display(),
            run.stderr
        )
    });
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        png.len() > 20_000,
        "a real page, not a blank: {} bytes",
        png.len()
    );
    let _ = std::fs::remove_file(&shot);
    gw.stop().await;
}
