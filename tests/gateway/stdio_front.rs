//! `portico stdio`: the real binary as a stdio MCP server in front of HTTP backends — the
//! official SDK clients launching it, and raw lines written by the test for the edge cases
//! (bad input, EOF and SIGTERM with requests in flight, cancellation, a dead upstream).
//! Every stdout line is checked to be one JSON-RPC message: stdout carries nothing else.

use crate::common::mock::MockMcp;
use crate::common::modern_body;
use crate::interop::{py_client, py_server, ts_client, ts_server};
use serde_json::{Value, json};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

fn portico() -> &'static str {
    env!("CARGO_BIN_EXE_portico")
}

/// `portico stdio ARGS…` as a child, driven line by line.
struct StdioProc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl StdioProc {
    fn spawn(args: &[&str]) -> StdioProc {
        Self::spawn_env(args, &[])
    }

    fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> StdioProc {
        let mut child = Command::new(portico())
            .arg("stdio")
            .args(args)
            .env("RUST_LOG", "portico=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn portico stdio");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        StdioProc {
            child,
            stdin,
            stdout,
        }
    }

    async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.expect("write");
        stdin.write_all(b"\n").await.expect("write");
        stdin.flush().await.expect("flush");
    }

    /// A 2026-07-28 request line.
    async fn request(&mut self, id: Value, method: &str, params: Value) {
        self.send(&modern_body(id, method, params)).await;
    }

    /// The next stdout line, which must be one JSON object; `None` at EOF.
    async fn next(&mut self) -> Option<Value> {
        let v = self.next_json().await?;
        assert!(v.is_object(), "{v}");
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        Some(v)
    }

    /// The next line as JSON, object or array (a batch's answer).
    async fn next_json(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(20), self.stdout.next_line())
            .await
            .expect("a stdout line within 20 s")
            .expect("read stdout")?;
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        Some(v)
    }

    /// Lines up to and including the response with `id`.
    async fn until(&mut self, id: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v = self.next().await.expect("the answer before EOF");
            let done = v["id"] == *id && v.get("method").is_none();
            out.push(v);
            if done {
                return out;
            }
        }
    }

    async fn answer(&mut self, id: Value) -> Value {
        self.until(&id).await.pop().expect("one line")
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Every remaining line, then the exit status.
    async fn finish(mut self) -> (Vec<Value>, ExitStatus) {
        self.close_stdin();
        let mut rest = Vec::new();
        while let Some(v) = self.next().await {
            rest.push(v);
        }
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("exit within 20 s")
            .expect("wait");
        (rest, status)
    }
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("portico-stdio-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).expect("write config");
    p
}

#[tokio::test]
async fn python_sdk_client_over_stdio_reaches_python_and_typescript_servers() {
    let py = py_server(&[]).await;
    let ts = ts_server(&[]).await;
    for (url, who) in [(py.url(), "python"), (ts.url(), "typescript")] {
        for era in ["--modern", "--legacy"] {
            let via = py_client(&[era, "--stdio", "--", portico(), "stdio", "--url", &url]).await;
            let want = if era == "--modern" {
                "modern"
            } else {
                "legacy"
            };
            assert_eq!(via["era"], want, "{who} {era}: {via}");
            assert_eq!(via["echo"], "hi", "{who} {era}");
            assert_eq!(via["add"], "5", "{who} {era}");
            assert_eq!(via["progress_result"], "done 3", "{who} {era}");
            assert_eq!(via["progress_events"], 3, "{who} {era}: progress relayed");
            assert_eq!(via["resource"], format!("hello from {who}"), "{who} {era}");
            assert_eq!(via["prompt"], "Hello, Ada!", "{who} {era}");
            assert!(
                via["tools"]
                    .as_array()
                    .is_some_and(|t| t.contains(&json!("slow"))),
                "{via}"
            );
        }
    }
}

#[tokio::test]
async fn typescript_sdk_client_over_stdio_with_a_config_file() {
    let py = py_server(&[]).await;
    let ts = ts_server(&[]).await;
    let cfg = temp_config(
        "ts-client",
        &format!(
            "[log]\naccess = false\n[[backends]]\nname = \"py\"\nurl = \"{}\"\n[[backends]]\nname = \"ts\"\nurl = \"{}\"\n",
            py.url(),
            ts.url()
        ),
    );
    let cfg = cfg.display().to_string();
    for (endpoint, who) in [("/mcp/py", "python"), ("ts", "typescript")] {
        let via = ts_client(&[
            "--stdio",
            "--",
            portico(),
            "stdio",
            "--config",
            &cfg,
            "--endpoint",
            endpoint,
        ])
        .await;
        assert_eq!(via["era"], "legacy");
        assert_eq!(via["echo"], "hi", "{who}");
        assert_eq!(via["add"], "5", "{who}");
        assert_eq!(via["progress_result"], "done 3", "{who}");
        assert_eq!(via["progress_events"], 3, "{who}: progress relayed");
        assert_eq!(via["resource"], format!("hello from {who}"));
        assert_eq!(via["prompt"], "Hello, Ada!");
    }
    // The same client with --url.
    let via = ts_client(&["--stdio", "--", portico(), "stdio", "--url", &ts.url()]).await;
    assert_eq!(via["resource"], "hello from typescript");
    let _ = std::fs::remove_file(&cfg);
}

#[tokio::test]
async fn a_json_only_legacy_upstream_serves_a_modern_stdio_client() {
    let mock = MockMcp::legacy().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.request(json!("d"), "server/discover", json!({})).await;
    let d = p.answer(json!("d")).await;
    assert_eq!(d["result"]["resultType"], "complete", "{d}");
    assert!(d["result"]["supportedVersions"].is_array(), "{d}");
    p.request(json!(1), "tools/list", json!({})).await;
    let list = p.answer(json!(1)).await;
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    assert!(list["result"]["ttlMs"].is_u64(), "{list}");
    p.request(
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"over stdio"}}),
    )
    .await;
    let call = p.answer(json!(2)).await;
    assert_eq!(call["result"]["content"][0]["text"], "over stdio", "{call}");
    p.request(json!(3), "resources/read", json!({"uri":"mock://r"}))
        .await;
    let read = p.answer(json!(3)).await;
    assert_eq!(read["result"]["contents"][0]["text"], "mock resource");
    // The upstream was spoken to in its own era (after the probe), over one session.
    assert_eq!(mock.count("initialize"), 1);
    for s in mock.seen() {
        let m = s.body["method"].as_str().unwrap_or("");
        if ["tools/list", "tools/call", "resources/read"].contains(&m) {
            assert!(s.headers.get("mcp-session-id").is_some(), "{m}");
            assert!(
                s.body["params"]["_meta"]
                    .get("io.modelcontextprotocol/protocolVersion")
                    .is_none(),
                "{m}"
            );
        }
    }
    let (rest, status) = p.finish().await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn command_line_headers_reach_the_upstream_with_env_expanded() {
    let mock = MockMcp::modern().start().await;
    let mut p = StdioProc::spawn_env(
        &[
            "--url",
            &mock.url(),
            "--header",
            "Authorization: Bearer ${PORTICO_STDIO_TEST_TOKEN}",
        ],
        &[("PORTICO_STDIO_TEST_TOKEN", "s3cret")],
    );
    p.request(
        json!(1),
        "tools/call",
        json!({"name":"whoami","arguments":{}}),
    )
    .await;
    let who = p.answer(json!(1)).await;
    assert_eq!(
        who["result"]["content"][0]["text"], "Bearer s3cret",
        "{who}"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
}

#[tokio::test]
async fn an_initialize_client_gets_a_session_for_the_life_of_the_process() {
    let mock = MockMcp::modern().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#).await;
    let init = p.answer(json!(0)).await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "mock", "{init}");
    p.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    p.send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await;
    assert_eq!(p.answer(json!(1)).await["result"], json!({}));
    p.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#)
        .await;
    let list = p.answer(json!(2)).await;
    assert!(list["result"]["tools"].is_array(), "{list}");
    assert!(
        list["result"].get("resultType").is_none(),
        "legacy shape: {list}"
    );
    // The upstream got 2026-07-28 requests with _meta filled from the session.
    let seen = mock.seen();
    let tl = seen
        .iter()
        .find(|s| s.body["method"] == "tools/list")
        .expect("tools/list reached the mock");
    assert_eq!(
        tl.body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"],
        "raw"
    );
    let (rest, status) = p.finish().await;
    assert!(
        rest.is_empty(),
        "notifications are never answered: {rest:?}"
    );
    assert!(status.success());
}

/// What `initialize` advertises is delivered on stdout too: a list change, and an update of a
/// resource the client subscribed to, arrive as notification lines (an HTTP client would hear
/// them on its GET stream).
#[tokio::test]
async fn an_initialize_client_hears_list_changes_and_resource_updates() {
    let mock = MockMcp::modern()
        .list_changed()
        .subscribe_and_log()
        .start()
        .await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#).await;
    let init = p.answer(json!(0)).await;
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["tools"]["listChanged"], true, "{init}");
    assert_eq!(caps["resources"]["subscribe"], true, "{init}");
    p.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    p.send(
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"mock://r"}}"#,
    )
    .await;
    assert_eq!(p.answer(json!(1)).await["result"], json!({}));
    mock.add_tool("late");
    mock.update_resource("mock://r");
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let v = p.next().await.expect("a notification line before EOF");
        assert!(v.get("id").is_none(), "only notifications: {v}");
        heard.push(v);
    }
    let methods: Vec<&str> = heard.iter().filter_map(|v| v["method"].as_str()).collect();
    assert!(
        methods.contains(&"notifications/tools/list_changed"),
        "{heard:?}"
    );
    let update = heard
        .iter()
        .find(|v| v["method"] == "notifications/resources/updated")
        .unwrap_or_else(|| panic!("{heard:?}"));
    assert_eq!(update["params"]["uri"], "mock://r");
    assert!(
        update["params"].get("_meta").is_none(),
        "no subscription id for a legacy client: {update}"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
}

/// The session's GET stream is reopened when it ends — here cut every second by `[server]
/// max_stream_ms` — so a change long after `initialize` still reaches stdout, and the error
/// that ends each cut stream (a response to no request of the client's) never does.
#[tokio::test]
async fn an_ended_notification_stream_is_reopened() {
    let mock = MockMcp::modern().list_changed().start().await;
    let cfg = temp_config(
        "reopen",
        &format!(
            "[server]\nmax_stream_ms = 1000\n[log]\naccess = false\n[cache]\nenabled = false\n[[backends]]\nname = \"b\"\nurl = \"{}\"\n",
            mock.url()
        ),
    );
    let mut p = StdioProc::spawn(&["--config", &cfg.display().to_string()]);
    p.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#).await;
    let init = p.answer(json!(0)).await;
    assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);
    p.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    // Cut, then reopened (the upstream listen closes with it and comes back; the cache, whose
    // watcher would be a listener too, is off); the change
    // comes early in the reopened stream's second, so no cut falls between.
    for (open, what) in [(1, "opened"), (0, "cut"), (1, "reopened")] {
        let seen = tokio::time::timeout(Duration::from_secs(5), async {
            while mock.listen_streams() != open {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(seen.is_ok(), "the notification stream was not {what}");
    }
    mock.add_tool("late");
    let heard = p.next().await.expect("a line before EOF");
    assert_eq!(
        heard["method"], "notifications/tools/list_changed",
        "{heard}"
    );
    let (rest, status) = p.finish().await;
    assert!(
        rest.iter().all(|v| v.get("method").is_some()),
        "no error line from a cut stream: {rest:?}"
    );
    assert!(status.success());
    let _ = std::fs::remove_file(cfg);
}

/// A 2025-03-26 client's batch line is served (one array line back); a later revision's is
/// refused with -32600.
#[tokio::test]
async fn a_2025_03_26_client_batches_over_stdio() {
    let mock = MockMcp::legacy().start().await;
    for (version, served) in [("2025-03-26", true), ("2025-06-18", false)] {
        let mut p = StdioProc::spawn(&["--url", &mock.url()]);
        p.send(&format!(r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"raw","version":"1"}}}}}}"#)).await;
        assert_eq!(
            p.answer(json!(0)).await["result"]["protocolVersion"],
            version
        );
        p.send(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"b"}}},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#).await;
        let answer = p.next_json().await.expect("an answer line");
        if served {
            let all = answer.as_array().unwrap_or_else(|| panic!("{answer}"));
            assert_eq!(all.len(), 2, "{answer}");
            assert_eq!(all[0]["id"], 1);
            assert_eq!(all[0]["result"]["content"][0]["text"], "b");
            assert_eq!(all[1], json!({"jsonrpc":"2.0","id":2,"result":{}}));
        } else {
            assert_eq!(answer["error"]["code"], -32600, "{answer}");
        }
        let (_, status) = p.finish().await;
        assert!(status.success());
    }
}

/// A batch element over stdio is cancelled on its own: the cancel reaches that element's call
/// (the backend hears `notifications/cancelled` for it), the batch is answered without waiting
/// for it, and the other element's answer is there.
#[tokio::test]
async fn a_batch_element_is_cancelled_over_stdio() {
    let mock = MockMcp::legacy().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#).await;
    assert_eq!(
        p.answer(json!(0)).await["result"]["protocolVersion"],
        "2025-03-26"
    );
    p.send(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{"ms":8000,"tag":"one"}}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"two"}}}]"#).await;
    let t = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while mock.count("tools/call") < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both calls upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"user"}}"#).await;
    let answer = p.next_json().await.expect("an answer line");
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "not held for the cancelled call"
    );
    let all = answer.as_array().unwrap_or_else(|| panic!("{answer}"));
    let two = all
        .iter()
        .find(|m| m["id"] == 2)
        .unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(two["result"]["content"][0]["text"], "two", "{answer}");
    assert!(
        all.iter()
            .all(|m| m["id"] != 1 || m.get("result").is_none()),
        "the cancelled element has no result: {answer}"
    );
    let st = mock.state.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while st.cancelled_tags.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the backend heard the cancel"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*st.cancelled_tags.lock().unwrap(), ["one"]);
    let (_, status) = p.finish().await;
    assert!(status.success());
}

#[tokio::test]
async fn bad_lines_get_errors_and_the_process_keeps_going() {
    let mock = MockMcp::modern().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url(), "--max-line-bytes", "2048"]);
    p.send("this is not json").await;
    let e = p.next().await.expect("an error line");
    assert_eq!(e["error"]["code"], -32700, "{e}");
    assert_eq!(e["id"], Value::Null, "{e}");
    // An over-long line: refused, skipped, not buffered whole.
    let long = modern_body(
        json!(9),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"x".repeat(100_000)}}),
    );
    p.send(&long).await;
    let e = p.next().await.expect("an error line");
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2048")),
        "names the limit: {e}"
    );
    // A batch, and a request without _meta (checked by the pipeline).
    p.send(&format!(
        "[{}]",
        modern_body(json!(1), "tools/list", json!({}))
    ))
    .await;
    assert_eq!(
        p.next().await.expect("batch error")["error"]["code"],
        -32600
    );
    p.send(r#"{"jsonrpc":"2.0","id":"nometa","method":"tools/list","params":{}}"#)
        .await;
    assert_eq!(
        p.answer(json!("nometa")).await["error"]["code"],
        -32602,
        "_meta is required"
    );
    // Still alive and serving.
    p.request(
        json!(2),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"still here"}}),
    )
    .await;
    let ok = p.answer(json!(2)).await;
    assert_eq!(ok["result"]["content"][0]["text"], "still here", "{ok}");
    assert_eq!(
        mock.count("tools/call"),
        1,
        "the long line never went upstream"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
}

#[tokio::test]
async fn eof_with_requests_in_flight_still_answers_them_then_exits_0() {
    let mock = MockMcp::modern().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.request(
        json!("slow"),
        "tools/call",
        json!({"name":"slow","arguments":{"ms":600}}),
    )
    .await;
    p.request(
        json!("echo"),
        "tools/call",
        json!({"name":"echo","arguments":{"text":"e"}}),
    )
    .await;
    let (lines, status) = p.finish().await;
    assert!(status.success(), "{status}");
    let slow = lines
        .iter()
        .find(|v| v["id"] == "slow")
        .unwrap_or_else(|| panic!("the in-flight answer was written: {lines:?}"));
    assert_eq!(slow["result"]["content"][0]["text"], "slept 600");
    // Answered in any order: the quick request did not wait behind the slow one.
    let at = |id: &str| lines.iter().position(|v| v["id"] == id);
    assert!(
        at("echo").is_some_and(|e| Some(e) < at("slow")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits_0() {
    let mock = MockMcp::modern().start().await;
    let mut p = StdioProc::spawn(&["--url", &mock.url()]);
    p.request(json!(1), "tools/list", json!({})).await;
    p.answer(json!(1)).await; // up and probed
    p.request(
        json!("slow"),
        "tools/call",
        json!({"name":"slow","arguments":{"ms":600}}),
    )
    .await;
    // Let the request reach the mock before the signal.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mock.count("tools/call") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = p.child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    // stdin stays open: the signal alone ends the process.
    let slow = p.answer(json!("slow")).await;
    assert_eq!(slow["result"]["content"][0]["text"], "slept 600");
    let status = tokio::time::timeout(Duration::from_secs(20), p.child.wait())
        .await
        .expect("exit within 20 s")
        .expect("wait");
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn cancellation_drops_the_upstream_request() {
    for legacy in [false, true] {
        let mock = if legacy {
            MockMcp::legacy().sse().start().await
        } else {
            MockMcp::modern().sse().start().await
        };
        let mut p = StdioProc::spawn(&["--url", &mock.url()]);
        p.request(
            json!(7),
            "tools/call",
            json!({"name":"slow","arguments":{"ms":5000}}),
        )
        .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while mock.count("tools/call") == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "request never arrived"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        p.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user"}}"#).await;
        assert!(
            mock.wait_cancelled(Duration::from_secs(5)).await,
            "legacy={legacy}: the upstream saw the cancel"
        );
        if legacy {
            // A legacy server hears it as notifications/cancelled for its own request id.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while mock.state.cancel_notes.lock().unwrap().is_empty() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no notifications/cancelled upstream"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Other requests are unaffected.
        p.request(
            json!(8),
            "tools/call",
            json!({"name":"echo","arguments":{"text":"after"}}),
        )
        .await;
        let lines = p.until(&json!(8)).await;
        assert_eq!(
            lines.last().unwrap()["result"]["content"][0]["text"],
            "after"
        );
        let (rest, status) = p.finish().await;
        assert!(status.success());
        assert!(
            lines.iter().chain(&rest).all(|v| v["id"] != 7),
            "legacy={legacy}: no answer for a cancelled request: {lines:?} {rest:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_upstream_gives_errors_and_the_process_stays_up() {
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    drop(l);
    let mut p = StdioProc::spawn(&["--url", &url]);
    for id in [1, 2] {
        p.request(json!(id), "tools/list", json!({})).await;
        let e = p.answer(json!(id)).await;
        assert_eq!(e["error"]["code"], -32603, "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("upstream")),
            "{e}"
        );
    }
    let (_, status) = p.finish().await;
    assert!(status.success());
}

#[tokio::test]
async fn bad_command_lines_are_refused_with_usage() {
    for args in [
        &["stdio"][..],
        &["stdio", "--url", "http://x/", "--config", "a.toml"],
        &["stdio", "--config", "a.toml", "--header", "A: b"],
        &["stdio", "--max-line-bytes", "0", "--url", "http://x/"],
    ] {
        let out = Command::new(portico())
            .args(args)
            .output()
            .await
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // A config with several backends needs --endpoint.
    let cfg = temp_config(
        "two",
        "[[backends]]\nname='a'\nbuiltin='demo'\n[[backends]]\nname='b'\nbuiltin='demo'\n",
    );
    let out = Command::new(portico())
        .args(["stdio", "--config", &cfg.display().to_string()])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--endpoint"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&cfg);
}

/// A "modern" upstream that answers every POST with an SSE stream holding one progress
/// notification and then closes it: the answer never comes.
async fn truncating_upstream() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = tcp.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&req).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if req.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let event = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":1}}\n\n";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{event}",
                    event.len()
                );
                let _ = tcp.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn an_answer_stream_that_ends_without_a_response_becomes_an_error_line() {
    let (url, server) = truncating_upstream().await;
    let cfg = temp_config(
        "truncating",
        &format!(
            "[log]\naccess = false\n[[backends]]\nname = \"cut\"\nurl = \"{url}\"\nprotocol = \"modern\"\n"
        ),
    );
    let mut p = StdioProc::spawn(&["--config", &cfg.display().to_string()]);
    p.request(
        json!(5),
        "tools/call",
        json!({"name":"progress","arguments":{},"_meta":{"progressToken":"t"}}),
    )
    .await;
    let lines = p.until(&json!(5)).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[0]["method"], "notifications/progress",
        "relayed as it came"
    );
    assert_eq!(lines[1]["error"]["code"], -32603, "{lines:?}");
    assert!(
        lines[1]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cut") && m.contains("without a response")),
        "{lines:?}"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
    server.abort();
    let _ = std::fs::remove_file(&cfg);
}

/// `portico stdio` in front of a 2026-07-28 and an initialize-era backend: each method
/// 2026-07-28 removed, sent as a 2026-07-28 line (an `initialize` included: its `_meta` names
/// the revision, so it starts no session), is answered `-32601` (notifications: nothing), and
/// the backend's counter shows it never arrived; the process keeps serving.
#[tokio::test]
async fn removed_methods_are_refused() {
    let modern = MockMcp::modern().start().await;
    let legacy = MockMcp::legacy().start().await;
    let removed = [
        "ping",
        "initialize",
        "notifications/initialized",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
    ];
    for mock in [&modern, &legacy] {
        let mut p = StdioProc::spawn(&["--url", &mock.url()]);
        for (i, method) in removed.iter().enumerate() {
            let params = json!({"uri": "x://y", "level": "info"});
            if method.starts_with("notifications/") {
                let mut v: Value =
                    serde_json::from_str(&modern_body(json!(0), method, params)).unwrap();
                v.as_object_mut().unwrap().remove("id");
                p.send(&v.to_string()).await;
                continue;
            }
            p.request(json!(i), method, params).await;
            let answer = p.answer(json!(i)).await;
            assert_eq!(answer["error"]["code"], -32601, "{method}: {answer}");
        }
        p.request(json!("list"), "tools/list", json!({})).await;
        let answer = p.answer(json!("list")).await;
        assert!(answer["result"]["tools"].is_array(), "{answer}");
        let (rest, status) = p.finish().await;
        assert!(
            rest.is_empty(),
            "nothing answers the notifications: {rest:?}"
        );
        assert!(status.success());
    }
    for method in removed {
        assert_eq!(
            modern.count(method),
            0,
            "{method} reached the modern backend"
        );
        // The legacy backend's one session is portico's bridge's own (for tools/list).
        let own = u64::from(method == "initialize" || method == "notifications/initialized");
        assert_eq!(
            legacy.count(method),
            own,
            "{method} reached the legacy backend"
        );
    }
}

/// `portico stdio` stands for a Streamable HTTP client, so it builds the `Mcp-Param-*` headers
/// a strict 2026-07-28 backend requires (`x-mcp-header` arguments; base64 form for non-ASCII),
/// for 2026-07-28 lines and for an initialize-era session alike.
#[tokio::test]
async fn a_strict_backend_gets_its_param_headers() {
    let strict = MockMcp::modern().header_tools().start().await;
    let call =
        json!({"name":"regional","arguments":{"region":"Zürich","priority":3,"urgent":false}});
    let mut p = StdioProc::spawn(&["--url", &strict.url()]);
    p.request(json!(1), "tools/call", call.clone()).await;
    let answer = p.answer(json!(1)).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "Zürich 3 false",
        "{answer}"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
    // An initialize-era client of the same process kind.
    let mut p = StdioProc::spawn(&["--url", &strict.url()]);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"old","version":"1"}}});
    p.send(&init.to_string()).await;
    assert!(p.answer(json!(0)).await["result"]["protocolVersion"].is_string());
    let line = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":call});
    p.send(&line.to_string()).await;
    let answer = p.answer(json!(2)).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "Zürich 3 false",
        "{answer}"
    );
    let (_, status) = p.finish().await;
    assert!(status.success());
    for s in strict
        .seen()
        .iter()
        .filter(|s| s.body["method"] == "tools/call")
    {
        assert_eq!(s.headers["mcp-param-region"], "=?base64?WsO8cmljaA==?=");
        assert_eq!(s.headers["mcp-param-priority"], "3");
        assert_eq!(s.headers["mcp-param-urgent"], "false");
    }
}

/// A parent that stops reading portico's stdout does not keep `portico stdio` from exiting: at
/// EOF the answers still unwritten are given up after the drain time. (In process: a 64-byte
/// pipe nobody reads stands for the parent's full stdout.)
#[tokio::test]
async fn eof_exits_even_when_nobody_reads_stdout() {
    let config = portico::config::validate(
        portico::config::parse(
            "[server]\ndrain_timeout_ms = 300\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
        )
        .unwrap(),
    )
    .unwrap();
    let opts = portico::stdio_front::StdioOptions {
        endpoint: None,
        max_line_bytes: None,
        authorization: None,
    };
    let (stdout, _unread) = tokio::io::duplex(64);
    let mut lines = String::new();
    for id in 0..20 {
        lines.push_str(&modern_body(json!(id), "tools/list", json!({})));
        lines.push('\n');
    }
    let stdin = std::io::Cursor::new(lines.into_bytes());
    let run = portico::stdio_front::run(config, opts, stdin, stdout, std::future::pending());
    let done = tokio::time::timeout(Duration::from_secs(20), run).await;
    assert!(done.is_ok(), "portico stdio still running 20 s after EOF");
}
