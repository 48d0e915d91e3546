//! What is cacheable (`classify`), how a stored answer is rendered for a caller, and how keys
//! are built: canonical, length-prefixed, never shared across scopes or partitions.

use super::*;

// --- classify ---

#[test]
fn classify_table() {
    use Decision::NotCacheable as No;
    let m = "tools/list";
    let check = |body: &str| classify(m, false, body.as_bytes(), 60_000);
    let ok = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"ttlMs":500,"cacheScope":"public"}}"#;
    assert_eq!(
        check(ok),
        Decision::Cacheable {
            ttl_ms: 500,
            scope: Scope::Public,
            result: Bytes::from_static(br#"{"tools":[],"cacheScope":"public"}"#),
        }
    );
    // resultType complete or absent; anything else is not stored.
    for (body, want) in [
        (
            r#"{"id":1,"result":{"resultType":"complete","ttlMs":5}}"#,
            None,
        ),
        (
            r#"{"id":1,"result":{"resultType":"input_required","inputRequests":{},"ttlMs":5}}"#,
            Some(Uncacheable::NotComplete),
        ),
        (
            r#"{"id":1,"result":{"resultType":"task","ttlMs":5}}"#,
            Some(Uncacheable::NotComplete),
        ),
        (
            r#"{"id":1,"error":{"code":-32603,"message":"x"}}"#,
            Some(Uncacheable::Error),
        ),
        (r#"{"id":1,"result":{"ttlMs":0}}"#, Some(Uncacheable::NoTtl)),
        (
            r#"{"id":1,"result":{"tools":[]}}"#,
            Some(Uncacheable::NoTtl),
        ),
        (
            r#"{"id":1,"result":{"ttlMs":-5}}"#,
            Some(Uncacheable::NoTtl),
        ),
        (
            r#"{"id":1,"result":{"ttlMs":"500"}}"#,
            Some(Uncacheable::NoTtl),
        ),
        (
            r#"{"id":1,"result":{"ttlMs":0.4}}"#,
            Some(Uncacheable::NoTtl),
        ),
        (
            r#"{"id":1,"result":{"ttlMs":5,"ttlMs":6}}"#,
            Some(Uncacheable::Malformed),
        ),
        (
            r#"{"id":1,"result":{"ttlMs":5,"cacheScope":"private","cacheScope":"public"}}"#,
            Some(Uncacheable::Malformed),
        ),
        (r#"{"id":1,"result":[1]}"#, Some(Uncacheable::Malformed)),
        (r#"{"id":1}"#, Some(Uncacheable::Malformed)),
        (
            r#"{"id":1,"result":{"ttlMs":5}"#,
            Some(Uncacheable::Malformed),
        ),
        ("\u{0}garbage", Some(Uncacheable::Malformed)),
    ] {
        match (check(body), want) {
            (Decision::Cacheable { .. }, None) => {}
            (No(got), Some(want)) => assert_eq!(got, want, "{body}"),
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }
    assert_eq!(
        classify("tools/call", false, ok.as_bytes(), 60_000),
        No(Uncacheable::Method)
    );
    assert_eq!(
        classify(m, true, ok.as_bytes(), 60_000),
        No(Uncacheable::Retry)
    );
}

#[test]
fn classify_caps_floors_and_defaults_scope() {
    let ttl_scope = |body: &str| match classify("resources/read", false, body.as_bytes(), 1000) {
        Decision::Cacheable { ttl_ms, scope, .. } => (ttl_ms, scope),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ttl_scope(r#"{"result":{"ttlMs":99999999}}"#),
        (1000, Scope::Private)
    );
    assert_eq!(
        ttl_scope(r#"{"result":{"ttlMs":1e300}}"#),
        (1000, Scope::Private)
    );
    assert_eq!(
        ttl_scope(r#"{"result":{"ttlMs":250.9,"cacheScope":"private"}}"#),
        (250, Scope::Private)
    );
    assert_eq!(
        ttl_scope(r#"{"result":{"ttlMs":5,"cacheScope":"shared"}}"#),
        (5, Scope::Private)
    );
    assert_eq!(
        ttl_scope(r#"{"result":{"ttlMs":5,"cacheScope":"public"}}"#),
        (5, Scope::Public)
    );
}

// --- rendering ---

#[test]
fn render_rewrites_remaining_ttl_and_id() {
    let Decision::Cacheable { result, .. } =
        classify("tools/list", false, &tools("1000", Some("public")), 60_000)
    else {
        panic!("cacheable")
    };
    let entry = Entry::new(
        &input("tools/list", None),
        result,
        Duration::from_millis(1000),
        Duration::ZERO,
    );
    let at = |ms| entry.fresh_until - Duration::from_millis(1000) + Duration::from_millis(ms);
    let first = json(&entry.render(&id(7), at(100)));
    let later = json(&entry.render(&RequestId::from_value(&"abc".into()).expect("id"), at(600)));
    let after = json(&entry.render(&id(8), at(5000)));
    assert_eq!(first["id"], 7);
    assert_eq!(later["id"], "abc");
    assert_eq!(first["jsonrpc"], "2.0");
    assert_eq!(first["result"]["ttlMs"], 900);
    assert_eq!(later["result"]["ttlMs"], 400);
    assert_eq!(after["result"]["ttlMs"], 0, "never negative");
    assert_eq!(first["result"]["cacheScope"], "public");
    assert_eq!(first["result"]["tools"][0]["name"], "t");
    // Member values are spliced byte for byte (no float reformatting).
    let body = entry.render(&id(1), at(0));
    assert!(std::str::from_utf8(&body).expect("utf8").contains("1.50"));
    assert!(body.ends_with(b",\"ttlMs\":1000}}"));
}

#[test]
fn render_empty_result_is_valid_json() {
    let Decision::Cacheable { result, .. } = classify(
        "tools/list",
        false,
        br#"{"jsonrpc":"2.0","id":1,"result":{"ttlMs":50}}"#,
        60_000,
    ) else {
        panic!("cacheable")
    };
    assert_eq!(&result[..], b"{}");
    let entry = Entry::new(
        &input("tools/list", None),
        result,
        Duration::from_millis(50),
        Duration::ZERO,
    );
    let body = entry.render(&id(3), Instant::now());
    let v = json(&body);
    assert_eq!(v["id"], 3);
    assert_eq!(v["result"].as_object().map(|o| o.len()), Some(1));
    assert!(v["result"]["ttlMs"].as_u64().is_some_and(|t| t <= 50));
}

#[test]
fn splice_id_replaces_only_the_id() {
    let msg =
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":"up","result":{"a":1.50,"id":"inner"}}"#);
    let out = splice_id(&msg, &id(42));
    assert_eq!(
        &out[..],
        br#"{"jsonrpc":"2.0","id":42,"result":{"a":1.50,"id":"inner"}}"#
    );
    // Already right: same buffer back.
    let same = Bytes::from_static(br#"{"jsonrpc":"2.0","id":42,"result":{}}"#);
    assert_eq!(splice_id(&same, &id(42)).as_ptr(), same.as_ptr());
    // No id at all: one is added.
    assert_eq!(
        json(&splice_id(
            &Bytes::from_static(br#"{"jsonrpc":"2.0","result":{}}"#),
            &id(1)
        ))["id"],
        1
    );
    // Not JSON: left alone.
    assert_eq!(
        &splice_id(&Bytes::from_static(b"nope"), &id(1))[..],
        b"nope"
    );
}

// --- keys ---

#[test]
fn key_canonicalisation() {
    let base = input("tools/list", None);
    let k = |i: &KeyInput<'_>| cache_key(i, KeyScope::Public);
    let reordered = KeyInput {
        capabilities: Some("{ \"sampling\" : {}, \"roots\":{ } }"),
        client_info: None,
        ..base
    };
    assert_eq!(
        k(&base),
        k(&reordered),
        "key order and whitespace don't matter"
    );
    let nested_a = KeyInput {
        capabilities: Some(r#"{"x":{"b":1,"a":[{"d":2,"c":"\u0041"}]}}"#),
        client_info: None,
        ..base
    };
    let nested_b = KeyInput {
        capabilities: Some(r#"{"x":{"a":[{"c":"A","d":2}],"b":1}}"#),
        client_info: None,
        ..base
    };
    assert_eq!(k(&nested_a), k(&nested_b), "recursive, escapes normalised");
    let num_a = KeyInput {
        capabilities: Some(r#"{"n":1.0}"#),
        client_info: None,
        ..base
    };
    let num_b = KeyInput {
        capabilities: Some(r#"{"n":1}"#),
        client_info: None,
        ..base
    };
    assert_ne!(k(&num_a), k(&num_b), "numbers are kept as written");
    assert_ne!(
        k(&base),
        k(&KeyInput {
            capabilities: None,
            client_info: None,
            ..base
        })
    );
    assert_ne!(
        k(&base),
        k(&KeyInput {
            capabilities: Some("{}"),
            client_info: None,
            ..base
        })
    );

    let c1 = KeyInput {
        params: Some(r#""c1""#),
        ..base
    };
    let c2 = KeyInput {
        params: Some(r#""c2""#),
        ..base
    };
    assert_ne!(k(&c1), k(&c2), "each page has its own key");
    assert_ne!(k(&base), k(&c1));
    assert_eq!(
        k(&c1),
        k(&KeyInput {
            params: Some(r#" "\u0063\u0031" "#),
            ..base
        })
    );
    assert_ne!(
        k(&base),
        k(&KeyInput {
            protocol_version: "2025-11-25",
            ..base
        })
    );
    assert_ne!(
        k(&base),
        k(&KeyInput {
            credential_id: "other",
            ..base
        })
    );
    assert_ne!(
        k(&base),
        k(&KeyInput {
            method: "prompts/list",
            ..base
        })
    );
    // Invalid JSON still keys, distinctly.
    assert_ne!(
        k(&KeyInput {
            params: Some("{bad"),
            ..base
        }),
        k(&KeyInput {
            params: Some("{bad2"),
            ..base
        })
    );
}

#[test]
fn key_length_prefixes_prevent_concatenation_collisions() {
    let base = input("tools/list", None);
    let a = KeyInput {
        backend: "ab",
        credential_id: "c",
        ..base
    };
    let b = KeyInput {
        backend: "a",
        credential_id: "bc",
        ..base
    };
    assert_ne!(
        cache_key(&a, KeyScope::Public),
        cache_key(&b, KeyScope::Public)
    );
}

#[test]
fn key_scopes_and_partitions_never_collide() {
    let i = input("tools/list", None);
    let a = Partition::from_authorization(Some(b"Bearer a"));
    let b = Partition::from_authorization(Some(b"Bearer b"));
    assert_eq!(a, Partition::from_authorization(Some(b"Bearer a")));
    assert_eq!(Partition::from_authorization(None), Partition::Anonymous);
    assert_eq!(
        Partition::from_authorization(Some(b"")),
        Partition::Anonymous
    );
    let keys = [
        cache_key(&i, KeyScope::Public),
        cache_key(&i, KeyScope::Private(&a)),
        cache_key(&i, KeyScope::Private(&b)),
        cache_key(&i, KeyScope::Private(&Partition::Anonymous)),
        cache_key(&i, KeyScope::Private(&Partition::Principal("alice".into()))),
    ];
    for (x, kx) in keys.iter().enumerate() {
        for ky in &keys[x + 1..] {
            assert_ne!(kx, ky);
        }
    }
    // The secret itself never appears in a partition.
    assert!(!format!("{a:?}").contains("Bearer"));
}
