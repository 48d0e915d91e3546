//! The official SDKs' initialize-era clients resume an answer stream portico held for them
//! (`src/legacy/resume.rs`): a proxy between client and gateway cuts the connection that
//! carries the call's first progress notification; the client reconnects by `GET` with the
//! last event id it saw, and gets the rest — the other progress notifications and the result.
//! Before portico numbered its events, both clients failed that call ("SSE stream ended
//! without a response"; the TypeScript client waits out its timeout).

use super::*;
use crate::common::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `target` that closes the first connection whose answer bytes contain
/// `marker`, right after passing that chunk on. Stops with the test (its task is aborted on
/// drop).
struct Cutter {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cutter {
    async fn start(target: SocketAddr, marker: &'static [u8]) -> Cutter {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let flag = flag.clone();
                conns.spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let hit = buf[..n].windows(marker.len()).any(|w| w == marker);
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        if hit && !flag.swap(true, Ordering::SeqCst) {
                            break; // the cut: both directions close here
                        }
                    }
                    up.abort();
                });
            }
        });
        Cutter { addr, cut, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

#[tokio::test]
async fn sdk_clients_resume_an_answer_stream_cut_under_them() {
    // An initialize-era server (TypeScript SDK) and a 2026-07-28 one (Python SDK) behind.
    let ts = ts_server(&[]).await;
    let py = py_server(&[]).await;
    let gw = Gateway::start(&format!(
        "[metrics]\n[log]\naccess = false\n\
         [[backends]]\nname = \"ts\"\nurl = \"{}\"\n\
         [[backends]]\nname = \"py\"\nurl = \"{}\"\n",
        ts.url(),
        py.url()
    ))
    .await;
    let mut runs = 0;
    for backend in ["ts", "py"] {
        for client in ["python", "typescript"] {
            let cutter = Cutter::start(gw.addr, b"notifications/progress").await;
            let url = cutter.url(&format!("/mcp/{backend}"));
            let out = match client {
                "python" => py_client(&["--legacy", "--url", &url]).await,
                _ => ts_client(&["--url", &url]).await,
            };
            let what = format!("{client} client, {backend} server");
            assert!(
                cutter.cut.load(Ordering::SeqCst),
                "{what}: no connection was cut"
            );
            assert_eq!(out["progress_result"], "done 3", "{what}: {out}");
            assert_eq!(out["progress_events"], 3, "{what}: {out}");
            assert_eq!(out["echo"], "hi", "{what}: {out}");
            runs += 1;
        }
    }
    let r = send("GET", &gw.metrics_url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&r.body);
    let resumed = text
        .lines()
        .find_map(|l| l.strip_prefix("portico_stream_resumes_total{outcome=\"resumed\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(resumed, Some(runs), "{text}");
    gw.stop().await;
}
