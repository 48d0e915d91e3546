//! Interop tests: the official SDKs as real servers behind portico and as real clients in front
//! of it. The SDKs are installed by `tests/interop/setup.sh` (the README's test command runs it
//! first); a missing install fails the tests loudly, never skips them.

#![allow(dead_code)]

mod aggregate;
mod cache;
mod core;
mod input;
mod legacy;
mod listen;
mod notes;
mod resume;
mod sse;
mod sse_front;
mod stdio;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop")
}

pub fn python() -> PathBuf {
    let p = interop_dir().join(".venv/bin/python");
    assert!(
        p.exists(),
        "the interop SDKs are not installed: run tests/interop/setup.sh (the README's test command does)"
    );
    p
}

fn node_ready() {
    assert!(
        interop_dir()
            .join("node/node_modules/@modelcontextprotocol/sdk")
            .exists(),
        "the TypeScript SDK is not installed: run tests/interop/setup.sh"
    );
}

/// A fixture server process, killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The fixture's `/stats` counters.
    pub async fn stats(&self) -> Value {
        let r = crate::common::send(
            "GET",
            &format!("http://127.0.0.1:{}/stats", self.port),
            &[],
            "",
        )
        .await;
        r.json()
    }

    /// How many JSON-RPC requests of `method` reached the server (counted before the SDK
    /// validates anything).
    pub async fn count(&self, method: &str) -> u64 {
        self.stats().await["requests"][method].as_u64().unwrap_or(0)
    }
}

async fn spawn_server(mut cmd: Command) -> Server {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn fixture server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("fixture server printed LISTENING within 30 s")
        .expect("read stdout")
        .expect("a line");
    let port = line
        .strip_prefix("LISTENING ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server { child, port }
}

/// The Python SDK server (`mcp` 2.3.0): 2026-07-28 and legacy on one endpoint.
pub async fn py_server(args: &[&str]) -> Server {
    let mut cmd = Command::new(python());
    cmd.arg(interop_dir().join("py_server.py")).args(args);
    spawn_server(cmd).await
}

/// The TypeScript SDK v1 server (legacy only).
pub async fn ts_server(args: &[&str]) -> Server {
    node_ready();
    let mut cmd = Command::new("node");
    cmd.arg(interop_dir().join("ts_server.mjs")).args(args);
    spawn_server(cmd).await
}

/// The command line that starts a fixture server over stdio.
pub fn py_stdio_command() -> Vec<String> {
    vec![
        python().display().to_string(),
        interop_dir().join("py_server.py").display().to_string(),
        "--transport".into(),
        "stdio".into(),
    ]
}

pub fn ts_stdio_command() -> Vec<String> {
    node_ready();
    vec![
        "node".into(),
        interop_dir().join("ts_server.mjs").display().to_string(),
        "--transport".into(),
        "stdio".into(),
    ]
}

async fn run_client(mut cmd: Command) -> Value {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("client finished within 60 s")
        .expect("client ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!(
            "client printed no JSON.\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        v["ok"],
        true,
        "client failed: {v}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

/// Runs the Python SDK client scenario; returns its JSON report (asserting `ok`).
pub async fn py_client(args: &[&str]) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(interop_dir().join("py_client.py")).args(args);
    run_client(cmd).await
}

/// Runs the TypeScript SDK client scenario.
pub async fn ts_client(args: &[&str]) -> Value {
    node_ready();
    let mut cmd = Command::new("node");
    cmd.arg(interop_dir().join("ts_client.mjs")).args(args);
    run_client(cmd).await
}

/// The scenario results both clients report, minus fields that legitimately differ by path.
pub fn scenario(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("server_name");
        o.remove("protocol_version");
    }
    v
}
