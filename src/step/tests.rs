//! Unit tests of the per-backend step: its fixed order (each check wins over the ones after
//! it), exposure of names to team policies, the once-per-request rate charge and the one retry
//! loop. Backends here are the built-in demo (answers in process) or an HTTP backend on a
//! closed port (fails to connect), so no network is involved.

use super::*;
use crate::backend::Backend;
use crate::config;
use crate::protocol::parse_envelope;

const AUTH: &str = r#"
[auth]
mode = "api_keys"
allow_insecure_none = true
rate_limit = { per_second = 0.001, burst = 1 }
[[auth.api_keys]]
key_file = "KEYFILE"
principal = "bea"
team = "blue"
[[auth.teams]]
name = "blue"
tools = { deny = ["r__secret_*", "nope"] }
"#;

fn core(extra: &str) -> Core {
    // One file per call: tests run in parallel and must not read each other's half-written one.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = std::env::temp_dir().join(format!("portico-step-key-{}-{n}", std::process::id()));
    std::fs::write(&key, "k-blue-000000000000000000").expect("key file");
    let auth = AUTH.replace("KEYFILE", &key.display().to_string());
    let cfg =
        config::validate(config::parse(&format!("{auth}{extra}")).expect("parse")).expect("valid");
    Core {
        sessions: Sessions::new(&cfg.sessions),
        metrics: Arc::new(Metrics::new()),
        cache: Arc::new(Cache::new(&cfg.cache)),
        watchers: Watchers::default(),
        calls: Default::default(),
        clients: Default::default(),
        auth: Auth::build(&cfg.auth, "http://127.0.0.1:8787".into()).expect("auth"),
        config: cfg,
    }
}

fn backend(core: &Core, name: &str) -> Arc<Backend> {
    let cfg = core
        .config
        .backends
        .iter()
        .find(|b| b.name == name)
        .expect("configured");
    Arc::new(Backend::build(cfg).expect("backend"))
}

fn blue() -> RequestCtx {
    RequestCtx {
        principal: Some(Arc::new(Principal {
            id: "bea".into(),
            team: Some("blue".into()),
        })),
        ..RequestCtx::new()
    }
}

fn call_body(name: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{"text":"hi"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    ))
}

async fn run(
    core: &Core,
    ctx: &mut RequestCtx,
    b: &Arc<Backend>,
    exposure: Exposure<'_>,
    tool: &str,
) -> Result<Reply, GatewayError> {
    let body = call_body(tool);
    let env = parse_envelope(&body).expect("envelope");
    let headers = HeaderMap::new();
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    call(core, ctx, b, exposure, &headers, &env, body, deadline).await
}

const DEMO: &str = r#"
[[backends]]
name = "d"
builtin = "demo"
max_concurrent = 1
breaker_failures = 1
breaker_open_ms = 600000
allow_teams = ["red"]
[[backends]]
name = "open"
builtin = "demo"
"#;

#[tokio::test]
async fn the_checks_run_in_their_fixed_order() {
    let core = core(DEMO);
    let d = backend(&core, "d");
    // Every later check is primed to refuse: a slot taken, the breaker open, a denied tool.
    let _slot = d.resilience.admit("d").expect("first slot");
    d.resilience.record(false);
    // 1. allow_teams wins over everything after it.
    let err = run(&core, &mut blue(), &d, Exposure::DIRECT, "nope")
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(err, GatewayError::Forbidden(ref m) if m.contains("/mcp/d")),
        "{err}"
    );

    let open = backend(&core, "open");
    // 2. the rate limit (burst 1) comes before the policy: the first request spends the token
    //    and is refused by policy; the second is refused by the rate limit.
    let err = run(&core, &mut blue(), &open, Exposure::DIRECT, "nope")
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(err, GatewayError::Forbidden(ref m) if m.contains("nope")),
        "{err}"
    );
    let err = run(&core, &mut blue(), &open, Exposure::DIRECT, "echo")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, GatewayError::RateLimited { .. }), "{err}");
}

#[tokio::test]
async fn policy_precedes_the_concurrency_limit_which_precedes_the_breaker() {
    // No rate limit here: each check is seen on its own.
    let core = core(
        r#"
[[backends]]
name = "d"
builtin = "demo"
max_concurrent = 1
breaker_failures = 1
breaker_open_ms = 600000
"#,
    );
    let ctx = || RequestCtx {
        rate_charged: true,
        ..blue()
    };
    let d = backend(&core, "d");
    let slot = d.resilience.admit("d").expect("first slot");
    d.resilience.record(false);
    // 3. policy before 4. max_concurrent
    let err = run(&core, &mut ctx(), &d, Exposure::DIRECT, "nope")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, GatewayError::Forbidden(_)), "{err}");
    // 4. max_concurrent before 5. the breaker
    let err = run(&core, &mut ctx(), &d, Exposure::DIRECT, "echo")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, GatewayError::Overloaded { .. }), "{err}");
    drop(slot);
    // 5. the breaker, open: fails fast.
    let err = run(&core, &mut ctx(), &d, Exposure::DIRECT, "echo")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, GatewayError::CircuitOpen { .. }), "{err}");
}

#[tokio::test]
async fn team_policies_judge_the_names_the_client_sees() {
    let core = core(DEMO);
    let open = backend(&core, "open");
    let mut ctx = RequestCtx {
        rate_charged: true,
        ..blue()
    };
    // The demo's own name is `echo`; `deny = ["r__secret_*"]` concerns the prefixed names.
    let r = run(&core, &mut ctx, &open, Exposure::member("r", "__"), "echo").await;
    assert!(r.is_ok(), "{:?}", r.err());
    // Directly, `nope` is denied; behind prefix `r`, the client sees `r__nope`, not denied.
    let err = run(&core, &mut ctx, &open, Exposure::DIRECT, "nope")
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, GatewayError::Forbidden(_)));
    let r = run(&core, &mut ctx, &open, Exposure::member("r", "__"), "nope").await;
    assert!(
        !matches!(r, Err(GatewayError::Forbidden(_))),
        "{:?}",
        r.err()
    );
    let err = run(
        &core,
        &mut ctx,
        &open,
        Exposure::member("r", "__"),
        "secret_tool",
    )
    .await
    .err()
    .expect("refused");
    assert!(
        matches!(err, GatewayError::Forbidden(ref m) if m.contains("r__secret_tool")),
        "{err}"
    );
    // Under a policy, a tool name that is not a string is refused, never judged as "".
    let body = Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
    );
    let env = parse_envelope(&body).expect("envelope");
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let err = call(
        &core,
        &mut ctx,
        &open,
        Exposure::DIRECT,
        &HeaderMap::new(),
        &env,
        body.clone(),
        deadline,
    )
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, GatewayError::InvalidParams(_)), "{err}");
    assert_eq!(Exposure::member("", "__").name("x"), "x");
    assert_eq!(Exposure::DIRECT.name("x"), "x");
}

#[tokio::test]
async fn listed_tools_are_filtered_by_their_exposed_names() {
    let reply = Reply::one(
        http::StatusCode::OK,
        r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"secret_tool"},{"name":"echo"},{"name":7}]}}"#,
    );
    let filter = ToolFilter {
        allow: vec![],
        deny: vec!["r__secret_*".into()],
    };
    let out = filter_tools_reply(reply, &filter, Exposure::member("r", "__"));
    let msg = out.final_message("b", 1000).await.expect("one message");
    let v: Value = serde_json::from_slice(&msg).unwrap();
    assert_eq!(v["result"]["tools"], serde_json::json!([{"name": "echo"}]));
}

#[tokio::test]
async fn the_rate_limit_is_charged_once_per_request() {
    let core = core(DEMO);
    let mut ctx = blue();
    assert!(charge(&core, &mut ctx).is_ok());
    // The same request reaching a second backend (an aggregated fan-out) is not charged again.
    assert!(charge(&core, &mut ctx).is_ok());
    assert!(matches!(
        charge(&core, &mut blue()),
        Err(GatewayError::RateLimited { .. })
    ));
}

#[tokio::test]
async fn the_retry_loop_resends_only_idempotent_methods_on_connect_failure() {
    let core = core(
        r#"
[[backends]]
name = "h"
url = "http://127.0.0.1:9/mcp"
retries = 2
"#,
    );
    let h = backend(&core, "h");
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let send = || {
        attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async { Err::<(), _>(UpstreamError::Connect("refused".into())) }
    };
    assert!(with_retry(&h, "tools/list", send).await.is_err());
    assert_eq!(attempts.swap(0, std::sync::atomic::Ordering::Relaxed), 3);
    assert!(with_retry(&h, "tools/call", send).await.is_err());
    assert_eq!(
        attempts.swap(0, std::sync::atomic::Ordering::Relaxed),
        1,
        "a call may have reached the backend: never resent"
    );
    let timeouts = || {
        attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async { Err::<(), _>(UpstreamError::Timeout) }
    };
    assert!(with_retry(&h, "tools/list", timeouts).await.is_err());
    assert_eq!(attempts.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn pass_through_is_only_for_modern_http_backends_without_policy() {
    let core = core(
        r#"
[[backends]]
name = "h"
url = "http://127.0.0.1:9/mcp"
protocol = "modern"
[[backends]]
name = "demo"
builtin = "demo"
"#,
    );
    let h = backend(&core, "h");
    let demo = backend(&core, "demo");
    let head = crate::frontend::Head {
        version: Some(LATEST_VERSION),
        method: Some("tools/call"),
        name: Some(Ok(Cow::Borrowed("echo"))),
        session: None,
    };
    let mh = crate::frontend::check_modern_head(&head).expect("head");
    let anonymous = RequestCtx::new();
    assert!(can_pass_through(&core, &anonymous, &h, &mh));
    assert!(!can_pass_through(&core, &anonymous, &demo, &mh), "built-in");
    assert!(
        !can_pass_through(&core, &blue(), &h, &mh),
        "under a tool policy"
    );
    // A body nobody judged is refused by the step itself, never forwarded.
    let req = StepRequest {
        headers: &HeaderMap::new(),
        message: Message::Unread {
            method: "tools/call",
            name: Some("echo"),
        },
        body: call_body("echo"),
        exposure: Exposure::DIRECT,
        deadline: Instant::now() + std::time::Duration::from_secs(1),
        check: AnswerCheck::Upstream,
    };
    let mut ctx = RequestCtx {
        rate_charged: true,
        ..blue()
    };
    assert!(matches!(
        step(&core, &mut ctx, &h, &req).await,
        Err(GatewayError::Internal(_))
    ));
}
