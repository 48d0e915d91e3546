//! What ships beside the binary (issue 7): `promtool` accepts a scrape taken under load and the
//! alert rules; the dashboard and the alerts name only metrics a real scrape has; the
//! Kubernetes manifests parse and their portico.toml passes `portico --check`.

use crate::common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

use crate::observe::{ROOT, full_setup, scrape, scrape_text, temp_file};

// === promtool ===

/// `promtool` with `args`, `stdin` piped in; panics (never skips) when it is not installed.
async fn promtool(args: &[&str], stdin: &[u8]) -> (bool, String) {
    let mut child = tokio::process::Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is required for this test ({e}); install the Debian package `prometheus`"
            )
        });
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("promtool within 60 s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn promtool_accepts_a_scrape_taken_under_load() {
    let (_mock, _legacy, gw) = full_setup().await;
    let gw = Arc::new(gw);
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for (i, path) in [
        "/mcp/m",
        "/mcp/demo",
        "/mcp/s",
        "/mcp/old",
        "/mcp/dead",
        "/mcp/m",
    ]
    .into_iter()
    .enumerate()
    {
        let (gw, stop) = (gw.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let method = if i % 2 == 0 {
                    "tools/list"
                } else {
                    "tools/call"
                };
                let params = if method == "tools/call" {
                    json!({"name":"echo","arguments":{"text":"x"}})
                } else {
                    json!({})
                };
                mcp(&gw.url(path), json!(n), method, params).await;
                n += 1;
            }
            n
        }));
    }
    let mut scrapes = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        scrapes.push(scrape_text(&gw).await);
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for l in load {
        total += l.await.unwrap();
    }
    assert!(total > 10, "the load ran ({total} requests)");
    for text in &scrapes {
        let (ok, out) = promtool(&["check", "metrics"], text.as_bytes()).await;
        assert!(ok, "promtool check metrics: {out}\n--- scrape ---\n{text}");
        assert!(text.contains("portico_requests_total{"), "{text}");
    }
}

#[tokio::test]
async fn promtool_accepts_the_alert_rules() {
    let rules = format!("{ROOT}/deploy/prometheus/alerts.yml");
    let (ok, out) = promtool(&["check", "rules", &rules], b"").await;
    assert!(ok, "promtool check rules: {out}");
}

// === Dashboard and alerts name only real metrics ===

/// Every `portico_*` identifier in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("portico_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn dashboard_and_alerts_name_only_metrics_a_scrape_has() {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/deploy/grafana/portico-dashboard.json")).unwrap(),
    )
    .expect("dashboard is JSON");
    let alerts: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(format!("{ROOT}/deploy/prometheus/alerts.yml")).unwrap(),
    )
    .expect("alert rules are YAML");
    let mut from_dashboard = Vec::new();
    exprs(&dashboard, &mut from_dashboard);
    let mut from_alerts = Vec::new();
    exprs(&alerts, &mut from_alerts);
    assert!(from_dashboard.len() >= 10, "{from_dashboard:?}");
    assert!(from_alerts.len() >= 4, "{from_alerts:?}");
    let named: BTreeSet<String> = from_dashboard
        .iter()
        .chain(&from_alerts)
        .flat_map(|e| metric_names(e))
        .collect();

    // A real scrape after traffic of every kind (so every labelled series exists).
    let (_mock, _legacy, gw) = full_setup().await;
    for path in ["/mcp/m", "/mcp/demo", "/mcp/s", "/mcp/old", "/mcp/dead"] {
        mcp(&gw.url(path), json!(1), "tools/list", json!({})).await;
    }
    let s = scrape(&gw).await;
    let present: BTreeSet<&str> = s.iter().map(|x| x.name.as_str()).collect();
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !present.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/ but absent from a scrape: {missing:?}\npresent: {present:?}"
    );
    // And the other way round: every metric portico exports is on the dashboard.
    let families: BTreeSet<String> = present
        .iter()
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    n.strip_suffix(suffix)
                        .filter(|base| present.contains(format!("{base}_bucket").as_str()))
                })
                .unwrap_or(n)
                .to_string()
        })
        .collect();
    let dashboard_text = from_dashboard.join("\n");
    for f in &families {
        assert!(
            dashboard_text.contains(f.as_str()),
            "{f} is exported but not on the dashboard"
        );
    }
}

// === Kubernetes manifests ===

fn k8s_documents() -> Vec<(PathBuf, Value)> {
    let dir = Path::new(ROOT).join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", f.display()));
            if !v.is_null() {
                docs.push((f.clone(), v));
            }
        }
    }
    docs
}

/// The one document of kind `k` that belongs to portico (redis.yaml adds Redis's own).
fn kind<'a>(docs: &'a [(PathBuf, Value)], k: &str) -> &'a Value {
    let found: Vec<_> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == k && d["metadata"]["name"] == "portico")
        .collect();
    assert_eq!(found.len(), 1, "exactly one portico {k}");
    &found[0].1
}

#[tokio::test]
async fn kubernetes_manifests_parse_and_their_config_passes_check() {
    let docs = k8s_documents();
    let mut kinds: Vec<&str> = docs
        .iter()
        .map(|(_, d)| d["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    // portico's own objects, the scale-out HPA, and the optional Redis (Deployment, Service,
    // Secret) of deploy/k8s/redis.yaml.
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service"
        ]
    );
    let hpa = kind(&docs, "HorizontalPodAutoscaler");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "portico");
    for (f, d) in &docs {
        assert!(d["apiVersion"].is_string(), "{}", f.display());
        assert!(d["metadata"]["name"].is_string(), "{}", f.display());
    }

    let deploy = kind(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"];
    let ann = &pod["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], "9464");
    assert_eq!(ann["prometheus.io/path"], "/metrics");
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "metrics");
    let ports: Vec<(&str, u64)> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [("http", 8787), ("metrics", 9464)]);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    let pdb = kind(&docs, "PodDisruptionBudget");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    let svc = kind(&docs, "Service");
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );

    // The ConfigMap's portico.toml: the real binary's --check accepts it, and it binds every
    // interface (in a pod, loopback is unreachable from the Service and the kubelet).
    let cm = kind(&docs, "ConfigMap");
    let toml = cm["data"]["portico.toml"]
        .as_str()
        .expect("portico.toml key");
    // In the pod, POD_IP comes from the downward API (deployment.yaml).
    let in_pod = toml.replace("${POD_IP}", "10.0.0.5");
    let config = portico::config::validate(portico::config::parse(&in_pod).unwrap()).unwrap();
    assert!(config.server.listen.starts_with("0.0.0.0:"));
    assert_eq!(config.metrics.as_ref().unwrap().listen, "0.0.0.0:9464");
    assert_eq!(
        config.sessions.advertise_url.as_deref(),
        Some("http://10.0.0.5:8787"),
        "each pod advertises itself on the client port"
    );
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for var in ["POD_IP", "PORTICO_SESSION_KEY"] {
        assert!(env.contains(&var), "the pod sets {var}: {env:?}");
        assert!(
            toml.contains(&format!("${{{var}}}")),
            "the config reads {var}"
        );
    }
    let file = temp_file("configmap-portico.toml", toml);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["--check", "--config"])
        .arg(&file)
        .env("POD_IP", "10.0.0.5")
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "portico --check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And the volume mount puts it where the container's args look.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["--config", "/etc/portico/portico.toml"]);
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/portico");
}
