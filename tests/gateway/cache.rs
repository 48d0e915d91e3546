//! The shared list cache, end to end: portico on loopback in front of the in-repo mock, whose
//! per-method request counter is the ground truth for "did this reach the backend".

use crate::common::mock::{MockHandle, MockMcp};
use crate::common::*;
use serde_json::json;
use std::time::Duration;

fn config(url: &str, cache: &str) -> String {
    format!(
        "[log]\naccess = false\n[cache]\n{cache}\n[[backends]]\nname = \"m\"\nurl = \"{url}\"\ntimeout_ms = 3000\n"
    )
}

/// A modern mock whose lists carry `ttl` and `scope`.
async fn backend(ttl: Option<u64>, scope: Option<&'static str>) -> MockHandle {
    MockMcp::modern()
        .ttl_ms(ttl)
        .cache_scope(scope)
        .start()
        .await
}

async fn list(gw: &Gateway, id: i64, auth: Option<&str>) -> Resp {
    let bearer;
    let extra: Vec<(&str, &str)> = match auth {
        Some(a) => {
            bearer = format!("Bearer {a}");
            vec![("authorization", bearer.as_str())]
        }
        None => vec![],
    };
    let r = mcp_with(
        &gw.url("/mcp/m"),
        json!(id),
        "tools/list",
        json!({}),
        &extra,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["id"], id, "the caller's own id, hit or miss");
    r
}

#[tokio::test]
async fn fresh_entries_are_served_without_the_backend_and_expire_with_ttl() {
    let mock = backend(Some(400), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    let first = list(&gw, 1, None).await;
    assert_eq!(first.json()["result"]["ttlMs"], 400);
    let second = list(&gw, 2, None).await;
    assert_eq!(
        mock.count("tools/list"),
        1,
        "a hit never reaches the backend"
    );
    // Same result, remaining freshness instead of the original ttlMs.
    assert_eq!(
        second.json()["result"]["tools"],
        first.json()["result"]["tools"]
    );
    let left = second.json()["result"]["ttlMs"].as_u64().unwrap();
    assert!(left <= 400 && left > 0, "remaining ttl {left}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    list(&gw, 3, None).await;
    assert_eq!(
        mock.count("tools/list"),
        2,
        "after ttlMs the backend is asked again"
    );
}

#[tokio::test]
async fn ttl_zero_and_missing_ttl_are_never_cached() {
    for ttl in [Some(0), None] {
        let mock = backend(ttl, Some("public")).await;
        let gw = Gateway::start(&config(&mock.url(), "")).await;
        for id in 1..=3 {
            list(&gw, id, None).await;
        }
        assert_eq!(mock.count("tools/list"), 3, "ttlMs {ttl:?}: not stored");
    }
}

#[tokio::test]
async fn max_ttl_caps_the_servers_ttl() {
    let mock = backend(Some(600_000), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "max_ttl_ms = 300")).await;
    list(&gw, 1, None).await;
    let r = list(&gw, 2, None).await;
    assert!(r.json()["result"]["ttlMs"].as_u64().unwrap() <= 300);
    assert_eq!(mock.count("tools/list"), 1);
    tokio::time::sleep(Duration::from_millis(350)).await;
    list(&gw, 3, None).await;
    assert_eq!(mock.count("tools/list"), 2, "capped at max_ttl_ms");
}

#[tokio::test]
async fn private_lists_are_never_shared_across_credentials() {
    // Explicit "private", and a missing cacheScope (read as private).
    for scope in [Some("private"), None] {
        let mock = backend(Some(60_000), scope).await;
        let gw = Gateway::start(&config(&mock.url(), "")).await;
        list(&gw, 1, Some("alice-token")).await;
        list(&gw, 2, Some("alice-token")).await;
        assert_eq!(
            mock.count("tools/list"),
            1,
            "{scope:?}: alice hits her own entry"
        );
        list(&gw, 3, Some("bob-token")).await;
        assert_eq!(
            mock.count("tools/list"),
            2,
            "{scope:?}: bob's request reached the backend"
        );
        list(&gw, 4, None).await;
        assert_eq!(
            mock.count("tools/list"),
            3,
            "{scope:?}: anonymous is its own partition"
        );
        // The client's token itself never reached the backend.
        assert!(
            mock.seen()
                .iter()
                .all(|s| !format!("{s:?}").contains("alice-token"))
        );
    }
}

#[tokio::test]
async fn public_lists_are_fetched_once_for_everyone() {
    let mock = backend(Some(60_000), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    list(&gw, 1, Some("alice-token")).await;
    list(&gw, 2, Some("bob-token")).await;
    list(&gw, 3, None).await;
    assert_eq!(mock.count("tools/list"), 1);
}

#[tokio::test]
async fn input_required_and_mrtr_retries_are_never_cached() {
    let mock = backend(Some(60_000), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    for id in 1..=2 {
        let r = mcp(
            &gw.url("/mcp/m"),
            json!(id),
            "resources/read",
            json!({"uri":"mock://needs-input"}),
        )
        .await;
        assert_eq!(r.json()["result"]["resultType"], "input_required");
        assert_eq!(r.json()["id"], id);
    }
    assert_eq!(
        mock.count("resources/read"),
        2,
        "input_required is not stored"
    );
    // A retry carrying inputResponses / requestState bypasses the cache even for a method
    // whose plain answer is cached.
    list(&gw, 10, None).await;
    for (id, extra) in [
        (11, json!({"inputResponses": {"q": {"ok": true}}})),
        (12, json!({"requestState": "s1"})),
    ] {
        let r = mcp(&gw.url("/mcp/m"), json!(id), "tools/list", extra).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    assert_eq!(
        mock.count("tools/list"),
        3,
        "retries always reach the backend"
    );
    list(&gw, 13, None).await;
    assert_eq!(mock.count("tools/list"), 3, "the plain request still hits");
}

#[tokio::test]
async fn a_hundred_concurrent_misses_send_one_upstream_request() {
    let mock = MockMcp::modern()
        .ttl_ms(Some(60_000))
        .cache_scope(Some("public"))
        .list_delay(Duration::from_millis(300))
        .start()
        .await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    let url = gw.url("/mcp/m");
    let calls = (0..100).map(|i| {
        let url = url.clone();
        async move { mcp(&url, json!(i), "tools/list", json!({})).await }
    });
    let answers = futures_util::future::join_all(calls).await;
    for (i, r) in answers.iter().enumerate() {
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["id"], i, "each waiter gets its own id");
        assert!(r.json()["result"]["tools"].is_array());
    }
    assert_eq!(mock.count("tools/list"), 1, "single flight");
}

#[tokio::test]
async fn stale_if_error_serves_the_old_entry_while_the_backend_is_down() {
    let mock = backend(Some(200), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "stale_if_error_ms = 10000")).await;
    let fresh = list(&gw, 1, None).await;
    drop(mock); // the backend goes away
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stale = list(&gw, 2, None).await;
    assert_eq!(
        stale.json()["result"]["tools"],
        fresh.json()["result"]["tools"]
    );
    assert_eq!(
        stale.json()["result"]["ttlMs"],
        0,
        "served stale: no freshness left"
    );
    // Without the window, the same outage is an error.
    let mock = backend(Some(200), Some("public")).await;
    let gw2 = Gateway::start(&config(&mock.url(), "")).await;
    list(&gw2, 1, None).await;
    drop(mock);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = mcp(&gw2.url("/mcp/m"), json!(2), "tools/list", json!({})).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
}

#[tokio::test]
async fn list_changed_drops_the_entry_at_once() {
    let mock = MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .list_changed()
        .start()
        .await;
    let gw = Gateway::start(&config(&mock.url(), "")).await;
    list(&gw, 1, None).await;
    // portico opens its own listen stream once something is stored.
    wait_until(|| mock.count("subscriptions/listen") >= 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the ack is read
    list(&gw, 2, None).await;
    assert_eq!(mock.count("tools/list"), 1);
    mock.add_tool("fresh_tool");
    let mut seen = false;
    for id in 3..50 {
        let r = list(&gw, id, None).await;
        if String::from_utf8_lossy(&r.body).contains("fresh_tool") {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "the new tool shows up long before the 10-minute ttl");
}

#[tokio::test]
async fn admin_purge_clears_entries() {
    let mock = backend(Some(600_000), Some("public")).await;
    let gw = Gateway::start(&format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        config(&mock.url(), "")
    ))
    .await;
    // Nothing admin on the client listener.
    let r = send("POST", &gw.url("/admin/cache/purge"), &[], "").await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    list(&gw, 1, None).await;
    list(&gw, 2, None).await;
    assert_eq!(mock.count("tools/list"), 1);
    let r = send(
        "POST",
        &gw.admin_url("/admin/cache/purge?backend=m"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    list(&gw, 3, None).await;
    assert_eq!(mock.count("tools/list"), 2);
    let r = send("POST", &gw.admin_url("/admin/cache/purge"), &[], "").await;
    assert_eq!(r.status, 200);
    list(&gw, 4, None).await;
    assert_eq!(mock.count("tools/list"), 3);
    let r = send(
        "POST",
        &gw.admin_url("/admin/cache/purge?backend=nope"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 404);
    let r = send("GET", &gw.admin_url("/admin/cache/purge"), &[], "").await;
    assert_eq!(r.status, 405);
}

#[tokio::test]
async fn disabled_cache_passes_everything_through() {
    let mock = backend(Some(600_000), Some("public")).await;
    let gw = Gateway::start(&config(&mock.url(), "enabled = false")).await;
    for id in 1..=3 {
        list(&gw, id, None).await;
    }
    assert_eq!(mock.count("tools/list"), 3);
}

async fn wait_until(mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 2 s");
}
