//! Unit tests of the cache (in a sibling file to keep `mod.rs` readable): the store's behaviour
//! here, what is cacheable, how an entry is rendered and how keys are built in `keys`.

use super::*;
use std::sync::atomic::AtomicUsize;

mod keys;

#[derive(Clone, Debug, PartialEq)]
struct Boom;

fn cfg(max_ttl_ms: u64, stale_if_error_ms: u64, max_bytes: u64) -> CacheConfig {
    CacheConfig {
        enabled: true,
        max_ttl_ms,
        max_bytes,
        stale_if_error_ms,
        ..CacheConfig::default()
    }
}

fn cache() -> Cache {
    Cache::new(&cfg(60_000, 0, 1 << 20))
}

fn input<'a>(method: &'a str, params: Option<&'a str>) -> KeyInput<'a> {
    KeyInput {
        backend: "b1",
        credential_id: "cred",
        method,
        params,
        protocol_version: "2026-07-28",
        capabilities: Some(r#"{"roots":{},"sampling":{}}"#),
        client_info: None,
        covers: &[],
    }
}

fn tools(ttl: &str, scope: Option<&str>) -> Bytes {
    let scope = scope.map_or(String::new(), |s| format!(r#","cacheScope":"{s}""#));
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":"upstream-9","result":{{"tools":[{{"name":"t","x":1.50}}],"ttlMs":{ttl}{scope}}}}}"#
    ))
}

fn id(n: u64) -> RequestId {
    RequestId::number(n)
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("valid JSON")
}

fn anon() -> Partition {
    Partition::Anonymous
}

/// One `get_or_fetch` whose fetch counts its calls and answers `message`.
async fn call(
    c: &Cache,
    key: &KeyInput<'_>,
    p: &Partition,
    n: u64,
    calls: &AtomicUsize,
    message: Bytes,
) -> Served {
    c.get_or_fetch(key, p, &id(n), false, || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Boom>(Fetched {
            status: 200,
            message,
        })
    })
    .await
    .expect("fetch succeeds")
}

// --- the cache ---

#[tokio::test]
async fn ttl_is_honoured() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let k = input("tools/list", None);
    let first = call(&c, &k, &anon(), 1, &calls, tools("200", Some("public"))).await;
    assert_eq!(first.outcome, Outcome::Miss);
    assert_eq!(
        json(&first.body)["id"],
        1,
        "the caller's id, not the upstream's"
    );
    let hit = call(&c, &k, &anon(), 2, &calls, tools("200", Some("public"))).await;
    assert_eq!(
        (hit.outcome, calls.load(Ordering::SeqCst)),
        (Outcome::Hit, 1)
    );
    assert_eq!(json(&hit.body)["id"], 2);
    let left = hit.ttl_remaining_ms.expect("ttl");
    assert!(left <= 200 && json(&hit.body)["result"]["ttlMs"] == left);
    tokio::time::sleep(Duration::from_millis(230)).await;
    let again = call(&c, &k, &anon(), 3, &calls, tools("200", Some("public"))).await;
    assert_eq!(
        (again.outcome, calls.load(Ordering::SeqCst)),
        (Outcome::Miss, 2)
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.inserts), (1, 2, 2));
}

#[tokio::test]
async fn remaining_ttl_decreases_on_hits() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let k = input("prompts/list", None);
    let body = Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"result":{"prompts":[],"ttlMs":1000,"cacheScope":"public"}}"#,
    );
    let first = call(&c, &k, &anon(), 1, &calls, body.clone()).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let second = call(&c, &k, &anon(), 2, &calls, body).await;
    let (a, b) = (
        first.ttl_remaining_ms.expect("ttl"),
        second.ttl_remaining_ms.expect("ttl"),
    );
    assert!(a <= 1000 && b + 50 <= a, "{a} then {b}");
    assert_eq!(json(&second.body)["result"]["ttlMs"], b);
}

#[tokio::test]
async fn uncacheable_answers_are_never_stored() {
    let k = input("resources/read", Some(r#""file:///a""#));
    for body in [
        tools("0", Some("public")),
        tools("-5", Some("public")),
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"contents":[],"cacheScope":"public"}}"#),
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"a":{}},"ttlMs":500,"cacheScope":"public"}}"#),
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}"#),
    ] {
        let c = cache();
        let calls = AtomicUsize::new(0);
        for n in 0..2 {
            let s = call(&c, &k, &anon(), n, &calls, body.clone()).await;
            assert_eq!(s.outcome, Outcome::Miss);
            assert_eq!(json(&s.body)["id"], n);
            assert_eq!(s.ttl_remaining_ms, None);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{body:?}");
        assert_eq!(c.stats().inserts, 0);
    }
    // Non-200 status.
    let c = cache();
    let calls = AtomicUsize::new(0);
    for n in 0..2 {
        let s = c
            .get_or_fetch(&k, &anon(), &id(n), false, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Boom>(Fetched {
                    status: 500,
                    message: tools("500", Some("public")),
                })
            })
            .await
            .expect("ok");
        assert_eq!(s.status, 500);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn retries_bypass_and_are_not_stored() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let k = input("resources/read", Some(r#""file:///a""#));
    for n in 0..2 {
        let s = c
            .get_or_fetch(&k, &anon(), &id(n), true, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: tools("500", Some("public")),
                })
            })
            .await
            .expect("ok");
        assert_eq!(
            (s.outcome, json(&s.body)["id"].as_u64()),
            (Outcome::Bypass, Some(n))
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(c.stats().inserts, 0);
    assert_eq!(c.stats().bypassed, 2);
    // And a retry doesn't see an entry stored by a plain request either.
    call(&c, &k, &anon(), 9, &calls, tools("500", Some("public"))).await;
    let s = c
        .get_or_fetch(&k, &anon(), &id(10), true, || async {
            Ok::<_, Boom>(Fetched {
                status: 200,
                message: tools("500", Some("public")),
            })
        })
        .await
        .expect("ok");
    assert_eq!(s.outcome, Outcome::Bypass);
}

#[tokio::test]
async fn disabled_cache_passes_everything_through() {
    let c = Cache::new(&CacheConfig {
        enabled: false,
        ..cfg(60_000, 0, 1 << 20)
    });
    let calls = AtomicUsize::new(0);
    let k = input("tools/list", None);
    for n in 0..3 {
        let s = call(&c, &k, &anon(), n, &calls, tools("500", Some("public"))).await;
        assert_eq!(
            (s.outcome, json(&s.body)["id"].as_u64()),
            (Outcome::Bypass, Some(n))
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn public_is_shared_private_is_not() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let (a, b) = (
        Partition::from_authorization(Some(b"Bearer a")),
        Partition::from_authorization(Some(b"Bearer b")),
    );
    let public = input("tools/list", None);
    call(&c, &public, &a, 1, &calls, tools("5000", Some("public"))).await;
    let s = call(&c, &public, &b, 2, &calls, tools("5000", Some("public"))).await;
    assert_eq!(s.outcome, Outcome::Hit, "public entries cross partitions");
    let s = call(
        &c,
        &public,
        &anon(),
        3,
        &calls,
        tools("5000", Some("public")),
    )
    .await;
    assert_eq!(s.outcome, Outcome::Hit);

    for scope in [Some("private"), None] {
        let c = cache();
        let calls = AtomicUsize::new(0);
        let k = input("resources/list", None);
        let body = Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"resources":[{{"uri":"secret-of-a"}}],"ttlMs":5000{}}}}}"#,
            scope.map_or(String::new(), |s| format!(r#","cacheScope":"{s}""#))
        ));
        call(&c, &k, &a, 1, &calls, body.clone()).await;
        assert_eq!(
            call(&c, &k, &a, 2, &calls, body.clone()).await.outcome,
            Outcome::Hit
        );
        let other = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"resources":[],"ttlMs":5000,"cacheScope":"private"}}"#);
        for p in [&b, &anon()] {
            let s = call(&c, &k, p, 3, &calls, other.clone()).await;
            assert_eq!(
                s.outcome,
                Outcome::Miss,
                "{scope:?}: A's private entry served to {p:?}"
            );
            assert!(!String::from_utf8_lossy(&s.body).contains("secret-of-a"));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}

#[tokio::test]
async fn concurrent_misses_share_one_fetch() {
    let c = Arc::new(cache());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..100u64 {
        let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
        tasks.push(tokio::spawn(async move {
            let k = input("tools/list", Some(r#""page-2""#));
            c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: tools("5000", Some("private")),
                })
            })
            .await
        }));
    }
    for (n, task) in tasks.into_iter().enumerate() {
        let s = task.await.expect("task").expect("served");
        let v = json(&s.body);
        assert_eq!(v["id"], n as u64, "every caller gets its own id");
        assert_eq!(v["result"]["tools"][0]["name"], "t");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let st = c.stats();
    assert_eq!((st.misses, st.coalesced + st.hits), (1, 99));
}

#[tokio::test]
async fn coalesced_waiters_share_an_uncacheable_answer() {
    let c = Arc::new(cache());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..10u64 {
        let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
        tasks.push(tokio::spawn(async move {
            let k = input("resources/read", Some(r#""file:///x""#));
            c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: Bytes::from_static(br#"{"jsonrpc":"2.0","id":"up","result":{"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create","params":{}}}}}"#),
                })
            })
            .await
        }));
    }
    for (n, task) in tasks.into_iter().enumerate() {
        let v = json(&task.await.expect("task").expect("served").body);
        assert_eq!(
            (v["id"].as_u64(), v["result"]["resultType"].as_str()),
            (Some(n as u64), Some("input_required"))
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.stats().inserts, 0);
}

#[tokio::test]
async fn waiters_share_the_leaders_error() {
    let c = Arc::new(cache());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..5u64 {
        let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
        tasks.push(tokio::spawn(async move {
            let k = input("tools/list", None);
            c.get_or_fetch(&k, &Partition::Anonymous, &id(n), false, || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                Err::<Fetched, _>(Boom)
            })
            .await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.expect("task").map(|s| s.outcome), Err(Boom));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_dropped_leader_does_not_strand_waiters() {
    let c = Arc::new(cache());
    let calls = Arc::new(AtomicUsize::new(0));
    let k = || input("tools/list", None);
    // The leader's fetch never finishes.
    let leader = {
        let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
        tokio::spawn(async move {
            c.get_or_fetch(&k(), &Partition::Anonymous, &id(0), false, || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<Fetched, Boom>>().await
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut waiters = Vec::new();
    for n in 1..=5u64 {
        let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
        waiters.push(tokio::spawn(async move {
            c.get_or_fetch(&k(), &Partition::Anonymous, &id(n), false, || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Boom>(Fetched {
                    status: 200,
                    message: tools("5000", Some("public")),
                })
            })
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    leader.abort();
    for (n, w) in (1u64..).zip(waiters) {
        let s = tokio::time::timeout(Duration::from_secs(1), w)
            .await
            .expect("no hang")
            .expect("task")
            .expect("served");
        assert_eq!(json(&s.body)["id"], n);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the stuck leader, then one successor"
    );
    assert!(c.lock_flights().is_empty(), "no flight left behind");
}

#[tokio::test]
async fn invalidate_drops_all_cursors_and_partitions_at_once() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let (a, b) = (
        Partition::from_authorization(Some(b"Bearer a")),
        Partition::from_authorization(Some(b"Bearer b")),
    );
    let pages = [
        input("tools/list", None),
        input("tools/list", Some(r#""c1""#)),
    ];
    let prompts = input("prompts/list", None);
    for k in &pages {
        for p in [&a, &b] {
            call(&c, k, p, 1, &calls, tools("5000", Some("private"))).await;
        }
    }
    call(&c, &pages[0], &a, 1, &calls, tools("5000", Some("public"))).await; // A public one too.
    call(&c, &prompts, &a, 1, &calls, tools("5000", Some("public"))).await;
    let before = calls.load(Ordering::SeqCst);
    for k in &pages {
        assert_eq!(
            call(&c, k, &b, 2, &calls, tools("5000", Some("private")))
                .await
                .outcome,
            Outcome::Hit
        );
    }

    c.invalidate("b1", "tools/list");
    // No maintenance has run: moka applies the predicate on `get`.
    for k in &pages {
        for p in [&a, &b] {
            let s = call(&c, k, p, 3, &calls, tools("5000", Some("private"))).await;
            assert_eq!(s.outcome, Outcome::Miss, "invalidated at once");
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), before + 4);
    assert_eq!(
        call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Hit
    );
    // Entries stored after the invalidation are served normally.
    assert_eq!(
        call(&c, &pages[0], &a, 5, &calls, tools("5000", Some("private")))
            .await
            .outcome,
        Outcome::Hit
    );
    c.invalidate("other-backend", "prompts/list");
    assert_eq!(
        call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Hit
    );
    c.purge_backend("b1");
    assert_eq!(
        call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Miss
    );
    c.purge_all();
    assert_eq!(
        call(&c, &prompts, &b, 4, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Miss
    );
    c.run_pending_tasks().await;
    assert_eq!(c.stats().entries, 1);
}

#[tokio::test]
async fn invalidate_resource_drops_only_that_uri() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let (x, y) = (
        input("resources/read", Some(r#""file:///x""#)),
        input("resources/read", Some(r#""file:///y""#)),
    );
    let body = || {
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"contents":[],"ttlMs":5000,"cacheScope":"public"}}"#)
    };
    call(&c, &x, &anon(), 1, &calls, body()).await;
    call(&c, &y, &anon(), 1, &calls, body()).await;
    c.invalidate_resource("b1", "file:///x");
    assert_eq!(
        call(&c, &x, &anon(), 2, &calls, body()).await.outcome,
        Outcome::Miss
    );
    assert_eq!(
        call(&c, &y, &anon(), 2, &calls, body()).await.outcome,
        Outcome::Hit
    );
}

#[tokio::test]
async fn a_fetch_in_flight_during_invalidation_is_not_stored() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let k = input("tools/list", None);
    let s = c
        .get_or_fetch(&k, &anon(), &id(1), false, || async {
            c.invalidate("b1", "tools/list"); // the list changed while we fetched it
            Ok::<_, Boom>(Fetched {
                status: 200,
                message: tools("5000", Some("public")),
            })
        })
        .await
        .expect("ok");
    assert_eq!(s.outcome, Outcome::Miss);
    assert_eq!(json(&s.body)["id"], 1);
    assert_eq!(
        call(&c, &k, &anon(), 2, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Miss
    );
}

#[tokio::test]
async fn stale_if_error_serves_inside_the_window_only() {
    let c = Cache::new(&cfg(60_000, 150, 1 << 20));
    let calls = AtomicUsize::new(0);
    let k = input("tools/list", None);
    call(&c, &k, &anon(), 1, &calls, tools("60", Some("public"))).await;
    async fn failing_call(c: &Cache, k: &KeyInput<'_>, n: u64) -> Result<Outcome, Boom> {
        c.get_or_fetch(k, &Partition::Anonymous, &id(n), false, || async {
            Err(Boom)
        })
        .await
        .map(|s| s.outcome)
    }
    let failing = |n| failing_call(&c, &k, n);
    // Fresh: the failing fetch is never called.
    assert_eq!(failing(2).await, Ok(Outcome::Hit));
    tokio::time::sleep(Duration::from_millis(90)).await;
    // Expired, inside the window: the old entry, with ttlMs 0.
    let s = c
        .get_or_fetch(&k, &anon(), &id(3), false, || async {
            Err::<Fetched, _>(Boom)
        })
        .await
        .expect("stale");
    assert_eq!((s.outcome, s.ttl_remaining_ms), (Outcome::Stale, Some(0)));
    let v = json(&s.body);
    assert_eq!(
        (v["id"].as_u64(), v["result"]["ttlMs"].as_u64()),
        (Some(3), Some(0))
    );
    tokio::time::sleep(Duration::from_millis(160)).await;
    // Past the window: the error.
    assert_eq!(failing(4).await, Err(Boom));
    assert_eq!(c.stats().stale, 1);
}

#[tokio::test]
async fn max_bytes_evicts_and_counts() {
    let c = Cache::new(&cfg(60_000, 0, 4096));
    let calls = AtomicUsize::new(0);
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"blob":"{}","ttlMs":5000,"cacheScope":"public"}}}}"#,
        "x".repeat(800)
    );
    let cursors: Vec<String> = (0..20).map(|n| format!("\"c{n}\"")).collect();
    for cursor in &cursors {
        call(
            &c,
            &input("tools/list", Some(cursor)),
            &anon(),
            1,
            &calls,
            Bytes::from(big.clone()),
        )
        .await;
    }
    c.run_pending_tasks().await;
    let s = c.stats();
    assert_eq!(s.inserts, 20);
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.bytes <= 4096, "{s:?}");
    assert_eq!(s.entries, 20 - s.evictions);
    // An entry bigger than the whole budget is not stored at all.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"blob":"{}","ttlMs":5000}}}}"#,
        "x".repeat(5000)
    );
    call(
        &c,
        &input("prompts/list", None),
        &anon(),
        1,
        &calls,
        Bytes::from(huge),
    )
    .await;
    assert_eq!(c.stats().inserts, 20);
}

#[tokio::test]
async fn replacing_an_entry_keeps_the_gauges_right() {
    let c = Cache::new(&cfg(60_000, 0, 1 << 20));
    let calls = AtomicUsize::new(0);
    let k = input("tools/list", None);
    call(&c, &k, &anon(), 1, &calls, tools("30", Some("public"))).await;
    tokio::time::sleep(Duration::from_millis(40)).await;
    call(&c, &k, &anon(), 2, &calls, tools("5000", Some("public"))).await;
    c.run_pending_tasks().await;
    let s = c.stats();
    assert_eq!((s.inserts, s.entries, s.evictions), (2, 1, 0));
    assert!(s.bytes > 0);
    // The replacement's lifetime is its own, not the remainder of the old one's.
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(
        call(&c, &k, &anon(), 3, &calls, tools("5000", Some("public")))
            .await
            .outcome,
        Outcome::Hit
    );
}

/// A merged answer (`KeyInput::covers`) has its own key, and dies with any member it was built
/// from — by method or by a purge of the backend — but not with another backend's change.
#[tokio::test]
async fn a_merged_entry_dies_with_any_member() {
    let c = cache();
    let calls = AtomicUsize::new(0);
    let members = ["b1".to_string(), "b2".to_string()];
    let merged = KeyInput {
        backend: "/mcp#0123",
        covers: &members,
        ..input("tools/list", None)
    };
    assert_ne!(
        cache_key(&merged, KeyScope::Public),
        cache_key(
            &KeyInput {
                covers: &[],
                ..merged
            },
            KeyScope::Public
        ),
        "the members are part of the key"
    );
    let body = || tools("5000", Some("public"));
    let hit = |s: Served| s.outcome == Outcome::Hit;
    call(&c, &merged, &anon(), 1, &calls, body()).await;
    assert!(hit(call(&c, &merged, &anon(), 2, &calls, body()).await));
    // Another backend, another method of a member: not this entry's business.
    c.invalidate("b3", "tools/list");
    c.invalidate("b2", "prompts/list");
    c.purge_backend("b3");
    assert!(hit(call(&c, &merged, &anon(), 3, &calls, body()).await));
    c.invalidate("b2", "tools/list");
    assert_eq!(
        call(&c, &merged, &anon(), 4, &calls, body()).await.outcome,
        Outcome::Miss
    );
    c.purge_backend("b1");
    assert_eq!(
        call(&c, &merged, &anon(), 5, &calls, body()).await.outcome,
        Outcome::Miss
    );
    assert!(hit(call(&c, &merged, &anon(), 6, &calls, body()).await));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
