//! Interop over stdio: the official SDK servers as stdio children of portico. The TypeScript SDK
//! v1 server is initialize-era only, so portico probes it, bridges it and keeps its legacy
//! session bound to the child process; the Python SDK server speaks 2026-07-28 on stdio, so it
//! takes the modern path with only ids and progress tokens rewritten. Both share one pipe among
//! many clients, survive a killed child, and die with portico.

use super::legacy::check_shapes;
use super::*;
use crate::common::*;
use serde_json::{Value, json};
use std::time::Instant;

/// One stdio backend `name` running `command`, tagged through its environment so a test can
/// find its own child among the processes other tests start in this same test process.
fn stdio_backend(name: &str, command: &[String], tag: &str) -> String {
    format!(
        "[[backends]]\nname = \"{name}\"\ncommand = {}\nenv = {{ PORTICO_TEST_TAG = \"{tag}\" }}\n\
         probe_timeout_ms = 10000\n",
        serde_json::to_string(command).unwrap()
    )
}

fn config(backends: &[String]) -> String {
    format!("[log]\naccess = false\n{}", backends.concat())
}

/// The pid of this test process's child whose environment carries `PORTICO_TEST_TAG=<tag>`
/// (portico runs in-process, so its stdio children are ours).
fn child_with_tag(tag: &str) -> Option<u32> {
    let me = std::process::id();
    let needle = format!("PORTICO_TEST_TAG={tag}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Whether `pid` still exists (reaped children disappear from /proc).
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

async fn echo(url: &str, id: Value, text: &str) -> Resp {
    mcp(
        url,
        id,
        "tools/call",
        json!({"name":"echo","arguments":{"text":text}}),
    )
    .await
}

fn text_of(r: &Resp) -> String {
    r.result()["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {:?}", String::from_utf8_lossy(&r.body)))
        .to_string()
}

/// A raw `tools/call progress` with a progress token: the progress arrives on this request's
/// SSE stream with the client's own token, then the result.
async fn check_progress(url: &str) {
    let r = mcp(
        url,
        json!("p-call"),
        "tools/call",
        json!({"name":"progress","arguments":{"steps":3},"_meta":{"progressToken":"my-token"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(r.is_sse(), "progress makes the answer a stream");
    let msgs = r.messages();
    let progress: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{msgs:?}");
    for (i, p) in progress.iter().enumerate() {
        assert_eq!(p["params"]["progressToken"], "my-token");
        assert_eq!(p["params"]["progress"], i as u64 + 1);
    }
    let last = msgs.last().unwrap();
    assert_eq!(last["id"], "p-call");
    assert_eq!(last["result"]["resultType"], "complete");
    assert_eq!(last["result"]["content"][0]["text"], "done 3");
}

#[tokio::test]
async fn typescript_sdk_stdio_server_is_bridged_for_modern_clients() {
    let gw = Gateway::start(&config(&[stdio_backend(
        "ts",
        &ts_stdio_command(),
        "ts-bridged",
    )]))
    .await;
    let url = gw.url("/mcp/ts");
    check_shapes(&url, "demo://greeting").await;
    // portico answers discover from the InitializeResult: the bridge's defaults, not a server's.
    let d = mcp(&url, json!(1), "server/discover", json!({}))
        .await
        .result();
    assert_eq!(d["result"]["cacheScope"], "private", "{d}");
    assert_eq!(d["result"]["ttlMs"], 0);
    assert_eq!(
        d["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "portico-interop-typescript"
    );
    check_progress(&url).await;
    let via = py_client(&["--modern", "--url", &url]).await;
    assert_eq!(via["era"], "modern");
    assert_eq!(via["echo"], "hi");
    assert_eq!(via["add"], "5");
    assert_eq!(via["progress_result"], "done 3");
    assert_eq!(via["progress_events"], 3);
    assert_eq!(via["resource"], "hello from typescript");
    assert_eq!(via["prompt"], "Hello, Ada!");
    gw.stop().await;
}

#[tokio::test]
async fn python_sdk_stdio_server_takes_the_modern_path() {
    let gw = Gateway::start(&config(&[stdio_backend(
        "py",
        &py_stdio_command(),
        "py-modern",
    )]))
    .await;
    let url = gw.url("/mcp/py");
    check_shapes(&url, "demo://greeting").await;
    // The server's own discover result and cache hints (py_server.py: 60000 ms, public) come
    // through: no bridge in between. Only `supportedVersions` is portico's (what its URL
    // serves, as its -32022 says).
    let d = mcp(&url, json!(1), "server/discover", json!({}))
        .await
        .result();
    assert_eq!(
        d["result"]["supportedVersions"],
        json!(portico::protocol::SUPPORTED_VERSIONS),
        "{d}"
    );
    // A cache hit (check_shapes fetched it): the remaining freshness, at most the server's.
    let ttl = d["result"]["ttlMs"].as_u64().unwrap_or(0);
    assert!(ttl > 0 && ttl <= 60000, "{d}");
    assert_eq!(d["result"]["cacheScope"], "public");
    let l = mcp(&url, json!(2), "tools/list", json!({})).await.result();
    let ttl = l["result"]["ttlMs"].as_u64().unwrap_or(0);
    assert!(ttl > 0 && ttl <= 60000, "{l}");
    check_progress(&url).await;
    let via = py_client(&["--modern", "--url", &url]).await;
    assert_eq!(via["era"], "modern");
    assert_eq!(via["echo"], "hi");
    assert_eq!(via["add"], "5");
    assert_eq!(via["progress_result"], "done 3");
    assert_eq!(via["progress_events"], 3);
    assert_eq!(via["resource"], "hello from python");
    assert_eq!(via["prompt"], "Hello, Ada!");
    gw.stop().await;
}

/// 100 concurrent `tools/call`s from separate clients through one stdio pipe, every one with
/// JSON-RPC id 1 and progress token "tok": 50 `add`s with unique operands, 50 `progress` calls
/// with differing step counts. Each client gets its own answer and only its own progress.
async fn multiplex(url: &str) {
    let mut tasks = Vec::new();
    for k in 0..50u64 {
        let add_url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let r = mcp(
                &add_url,
                json!(1),
                "tools/call",
                json!({"name":"add","arguments":{"a":k,"b":1000 * k},"_meta":{"progressToken":"tok"}}),
            )
            .await;
            assert_eq!(r.status, 200, "add {k}: {:?}", r.body);
            let last = r.result();
            assert_eq!(last["id"], 1);
            assert_eq!(
                last["result"]["content"][0]["text"],
                (1001 * k).to_string(),
                "add {k}"
            );
        }));
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let steps = 2 + k % 3;
            let r = mcp(
                &url,
                json!(1),
                "tools/call",
                json!({"name":"progress","arguments":{"steps":steps},"_meta":{"progressToken":"tok"}}),
            )
            .await;
            assert_eq!(r.status, 200, "progress {k}: {:?}", r.body);
            let msgs = r.messages();
            let (last, notes) = msgs.split_last().expect("messages");
            assert_eq!(last["id"], 1);
            assert_eq!(
                last["result"]["content"][0]["text"],
                format!("done {steps}"),
                "progress {k}"
            );
            assert_eq!(notes.len() as u64, steps, "only its own progress: {msgs:?}");
            for (i, n) in notes.iter().enumerate() {
                assert_eq!(n["method"], "notifications/progress");
                assert_eq!(n["params"]["progressToken"], "tok");
                assert_eq!(n["params"]["progress"], i as u64 + 1);
                assert_eq!(n["params"]["total"], steps, "{n}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_pipe_is_shared_by_concurrent_clients_with_one_id_and_token() {
    let gw = Gateway::start(&config(&[
        stdio_backend("ts", &ts_stdio_command(), "ts-mux"),
        stdio_backend("py", &py_stdio_command(), "py-mux"),
    ]))
    .await;
    for name in ["ts", "py"] {
        let url = gw.url(&format!("/mcp/{name}"));
        // Warm up (probe, handshake) so the burst measures the pipe, not the first spawn.
        assert_eq!(text_of(&echo(&url, json!(0), "warm").await), "warm");
        let started = Instant::now();
        multiplex(&url).await;
        eprintln!("{name}: 100 concurrent calls in {:?}", started.elapsed());
    }
    gw.stop().await;
}

/// Kills the child mid-call: the in-flight call fails within a second, a later call succeeds on
/// the restarted child (for the bridged server that needs a fresh `initialize`).
async fn survive_kill(url: &str, tag: &str) {
    assert_eq!(text_of(&echo(url, json!(1), "before").await), "before");
    let pid = child_with_tag(tag).expect("the stdio child is running");
    let slow = {
        let url = url.to_string();
        tokio::spawn(async move {
            let r = mcp(
                &url,
                json!("slow"),
                "tools/call",
                json!({"name":"slow","arguments":{"ms":20000}}),
            )
            .await;
            (r, Instant::now())
        })
    };
    // Let the call reach the child before killing it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!slow.is_finished(), "the slow call is in flight");
    let killed_at = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let (r, failed_at) = tokio::time::timeout(std::time::Duration::from_secs(5), slow)
        .await
        .expect("the in-flight call does not hang")
        .unwrap();
    eprintln!(
        "{tag}: the in-flight call failed {:?} after the kill",
        failed_at - killed_at
    );
    assert!(
        failed_at - killed_at < std::time::Duration::from_secs(1),
        "error after {:?}",
        failed_at - killed_at
    );
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.json()["id"], "slow");
    assert!(r.json()["error"]["code"].is_i64(), "{:?}", r.body);

    let give_up = Instant::now() + std::time::Duration::from_secs(10);
    let mut n = 0;
    loop {
        n += 1;
        let r = echo(url, json!(n), "after").await;
        if r.status == 200 {
            assert_eq!(text_of(&r), "after");
            break;
        }
        assert!(
            Instant::now() < give_up,
            "no success after the restart: {:?}",
            r.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "{tag}: first success {:?} after the kill ({n} attempts)",
        killed_at.elapsed()
    );
    let new_pid = child_with_tag(tag).expect("a restarted child");
    assert_ne!(new_pid, pid);
    assert!(!alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_stdio_child_fails_the_call_at_once_and_is_restarted() {
    // One child per backend, so the tag finds the one the calls reach (under the default
    // `per_client` isolation the bridged TypeScript server would have a second, per-client
    // child beside the probe's).
    let shared = "isolation = \"shared\"\n";
    let gw = Gateway::start(&config(&[
        stdio_backend("ts", &ts_stdio_command(), "ts-kill") + shared,
        stdio_backend("py", &py_stdio_command(), "py-kill") + shared,
    ]))
    .await;
    survive_kill(&gw.url("/mcp/ts"), "ts-kill").await;
    survive_kill(&gw.url("/mcp/py"), "py-kill").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_children_die_with_portico() {
    let gw = Gateway::start(&config(&[
        stdio_backend("ts", &ts_stdio_command(), "ts-stop"),
        stdio_backend("py", &py_stdio_command(), "py-stop"),
    ]))
    .await;
    let mut pids = Vec::new();
    for (name, tag) in [("ts", "ts-stop"), ("py", "py-stop")] {
        let url = gw.url(&format!("/mcp/{name}"));
        assert_eq!(text_of(&echo(&url, json!(1), "up").await), "up");
        pids.push(child_with_tag(tag).expect("child running"));
    }
    assert!(pids.iter().all(|p| alive(*p)));
    gw.stop().await;
    for pid in pids {
        assert!(!alive(pid), "child {pid} outlived portico");
    }
}
