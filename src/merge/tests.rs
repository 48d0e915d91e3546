//! List merging case by case: prefixes and filters, bare-name collisions, text kept byte for
//! byte, answers of every shape read in one pass (and as serde reads them), discover and
//! templates.

use super::*;

fn naming(backend: &str, prefix: &str) -> Naming {
    Naming {
        backend: backend.into(),
        prefix: prefix.into(),
        tools: ToolFilter::default(),
    }
}

/// Each part as a member's answer (`{"result": …}`), read and merged as the endpoint does.
fn merge_texts(
    kind: ListKind,
    members: &[Naming],
    parts: &[(usize, &str)],
) -> Result<Merged, Collision> {
    let messages: Vec<(usize, String)> = parts
        .iter()
        .map(|(m, r)| (*m, format!(r#"{{"jsonrpc":"2.0","id":1,"result":{r}}}"#)))
        .collect();
    let pages: Vec<PartPage> = messages
        .iter()
        .filter_map(
            |(m, text)| match read_list_answer(kind, *m, text.as_bytes()) {
                ListAnswer::Page(p) => Some(p),
                _ => None,
            },
        )
        .collect();
    merge_list(kind, members, "__", &pages)
}

fn merge(
    kind: ListKind,
    members: &[Naming],
    parts: &[(usize, Value)],
) -> Result<Merged, Collision> {
    let texts: Vec<(usize, String)> = parts.iter().map(|(m, v)| (*m, v.to_string())).collect();
    let texts: Vec<(usize, &str)> = texts.iter().map(|(m, t)| (*m, t.as_str())).collect();
    merge_texts(kind, members, &texts)
}

fn items(m: &Merged) -> Vec<Value> {
    serde_json::from_slice(&m.items).unwrap()
}

#[test]
fn names_are_prefixed_filtered_and_merged_in_order() {
    let mut gh = naming("github", "gh");
    gh.tools.deny = vec!["delete_*".into()];
    let members = vec![gh, naming("files", "")];
    let m = merge(
        ListKind::Tools,
        &members,
        &[
            (0, json!({"tools":[{"name":"search","inputSchema":{"type":"object"}},{"name":"delete_repo"}],"ttlMs":500,"cacheScope":"public","nextCursor":"c2"})),
            (1, json!({"tools":[{"name":"read"}],"ttlMs":100})),
        ],
    )
    .unwrap();
    let names: Vec<_> = items(&m)
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["gh__search", "read"]);
    assert_eq!(m.count, 2);
    assert_eq!(items(&m)[0]["inputSchema"], json!({"type":"object"}));
    assert_eq!(m.ttl_ms, 100);
    assert!(
        m.private,
        "a part without cacheScope makes the page private"
    );
    assert_eq!(m.next, vec![(0, "c2".to_string())]);
    assert_eq!(members[0].strip("__", "gh__search"), Some("search"));
    assert_eq!(members[0].strip("__", "ghx__search"), None);
}

#[test]
fn bare_collision_names_both_backends() {
    let members = vec![naming("a", ""), naming("b", "")];
    let e = merge(
        ListKind::Prompts,
        &members,
        &[
            (0, json!({"prompts":[{"name":"greet"}]})),
            (1, json!({"prompts":[{"name":"greet"}]})),
        ],
    )
    .unwrap_err();
    assert_eq!((e.first.as_str(), e.second.as_str()), ("a", "b"));
}

#[test]
fn an_item_is_copied_whole_around_its_renamed_name() {
    let members = vec![naming("a", "p"), naming("b", "")];
    // Whitespace, escapes and a nested `name` kept; only the item's own name rewritten.
    let a = r#"{"tools":[ { "description" : "say \"hi\"" , "name" : "t" , "x" : [ 1 , {"name":"in"} ] } ]}"#;
    // The name given twice: the last one counts, and both are rewritten to it.
    let twice = r#"{"tools":[{"name":"s","k":1,"name":"u"}]}"#;
    // A member exposed bare: its item copied as written.
    let b = r#"{"tools":[ {"name" : "v", "y":{ }} ]}"#;
    let m = merge_texts(ListKind::Tools, &members, &[(0, a), (0, twice), (1, b)]).unwrap();
    assert_eq!(
        std::str::from_utf8(&m.items).unwrap(),
        concat!(
            r#"[{ "description" : "say \"hi\"" , "name" : "p__t" , "x" : [ 1 , {"name":"in"} ] },"#,
            r#"{"name":"p__u","k":1,"name":"p__u"},"#,
            r#"{"name" : "v", "y":{ }}]"#
        )
    );
    assert_eq!(
        m.owners,
        [("p__t".into(), 0), ("p__u".into(), 0), ("v".to_string(), 1)]
    );
}

#[test]
fn text_is_kept_byte_for_byte_except_the_name() {
    let members = vec![naming("a", "a"), naming("b", "")];
    // Numbers as written (no float rounding), member order kept, escapes in names decoded
    // and re-escaped, malformed items and parts left out.
    let a = r#"{"tools":[{"x":1.50,"name":"t\u00e9","y":[1e3]},7,{"name":3}],"ttlMs":9,"cacheScope":"public"}"#;
    let b = r#"{"tools":[{"name":"u","z":{"k":"v"}}],"ttlMs":4.5,"cacheScope":"public"}"#;
    let m = merge_texts(ListKind::Tools, &members, &[(0, a), (1, "[]"), (1, b)]).unwrap();
    assert_eq!(
        std::str::from_utf8(&m.items).unwrap(),
        r#"[{"x":1.50,"name":"a__té","y":[1e3]},{"name":"u","z":{"k":"v"}}]"#
    );
    assert_eq!(m.count, 2);
    assert_eq!(m.ttl_ms, 0, "a ttlMs that is not an integer counts as 0");
    assert!(!m.private);
    assert_eq!(m.owners, [("a__té".to_string(), 0), ("u".to_string(), 1)]);
    // URIs: kept as written, a later member's duplicate left out.
    let r = merge(
        ListKind::Resources,
        &members,
        &[
            (0, json!({"resources":[{"uri":"f:///1"}],"ttlMs":5,"cacheScope":"public"})),
            (1, json!({"resources":[{"uri":"f:///1"},{"uri":"f:///2"}],"ttlMs":5,"cacheScope":"public"})),
        ],
    )
    .unwrap();
    assert_eq!(r.shadowed, 1);
    assert_eq!(
        items(&r),
        [json!({"uri":"f:///1"}), json!({"uri":"f:///2"})]
    );
    assert_eq!(r.ttl_ms, 5);
    // An empty merge is still an array.
    let e = merge(ListKind::Prompts, &members, &[]).unwrap();
    assert_eq!((&e.items[..], e.count, e.ttl_ms), (&b"[]"[..], 0, 0));
}

#[test]
fn answers_are_read_in_one_pass_whatever_their_shape() {
    let read = |text: &'static str| read_list_answer(ListKind::Tools, 0, text.as_bytes());
    assert!(matches!(read("not json"), ListAnswer::Neither));
    assert!(matches!(
        read(r#"{"id":1,"result":[1]}"#),
        ListAnswer::Neither
    ));
    assert!(matches!(read(r#"{"id":1}"#), ListAnswer::Neither));
    let ListAnswer::Error(e) = read(r#"{"id":1,"error":{"code":-32601,"message":"no"}}"#) else {
        panic!("an error");
    };
    assert_eq!(e["code"], -32601);
    // Members before and after the result, items of every kind: read, not refused.
    let ListAnswer::Page(p) = read(
        r#"{"jsonrpc":"2.0","result":{"x":[{"y":null}],"tools":[{"name":"a"},[],"s",1,-1,1.5,true,null],"nextCursor":"c","cacheScope":"public","ttlMs":7},"id":"q"}"#,
    ) else {
        panic!("a page");
    };
    assert_eq!(
        (p.ttl_ms, p.public, p.next.as_deref()),
        (7, true, Some("c"))
    );
    assert_eq!(p.items.len(), 8);
    assert_eq!(p.items.iter().flatten().count(), 1);
    // A list field that is not an array: no items.
    let ListAnswer::Page(p) = read(r#"{"result":{"tools":{"name":"a"},"cacheScope":"private"}}"#)
    else {
        panic!("a page");
    };
    assert!(p.items.is_empty() && !p.public && p.ttl_ms == 0);
}

#[test]
fn the_scanner_reads_list_answers_as_serde_does() {
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    // (answer, read: a page or an error rather than neither)
    let texts = [
        (r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","x":{"y":[1,2.5e3,"\u00e9"]}}],"ttlMs":5,"cacheScope":"public","nextCursor":"n"}}"#.to_string(), true),
        (r#"{"result":{"tools":[1,"s",null,true,[],{},{"name":"b","name":"c"}]},"method":null}"#.into(), true),
        (r#"{"result":{"tools":[]},"result":{"tools":[]}}"#.into(), false),
        (r#"{"error":{"code":1},"error":{"code":1}}"#.into(), false),
        (r#"{"method":"x","result":{"tools":[]}}"#.into(), false),
        (r#"{"method":null,"method":null,"result":{"tools":[]}}"#.into(), false),
        (r#"{"result":{"tools":[]}} x"#.into(), false),
        (r#"  {"result" : { "tools" : [ { "name" : "a" } , { } ] , "ttlMs" : -1 } }  "#.into(), true),
        (r#"{"result":{"tools":{"name":"a"},"tools":"x","ttlMs":"7","nextCursor":7}}"#.into(), true),
        (r#"{"result":{"tools":[{"na\u006de":"a"}]}}"#.into(), true),
        (r#"{"result":{"tools":[{"\ud800":"a"}]}}"#.into(), false),
        (r#"{"result":{"tools":[{"name":"\ud800"}]}}"#.into(), true),
        (r#"{"error":{"code":-32601,"message":"no"},"id":null}"#.into(), true),
        (r#"{"error":null}"#.into(), true),
        (r#"{"result":[],"error":{"code":1}}"#.into(), true),
        (r#"{"result":{"tools":[1,]}}"#.into(), false),
        (r#"{"result":{"tools":[01]}}"#.into(), false),
        (r#"{"result":{"tools":["#.into(), false),
        (r#"[{"result":{}}]"#.into(), false),
        ("{\"result\":{\"tools\":[\"\u{1}\"]}}".into(), false),
        // Deeper than serde's limit: not compared.
        (format!(r#"{{"result":{{"tools":[{{"name":"a","x":{deep}}}]}}}}"#), false),
    ];
    for (text, read) in &texts {
        assert_eq!(
            list_answers_agree(ListKind::Tools, text.as_bytes()),
            *read,
            "{text}"
        );
    }
    assert!(!list_answers_agree(
        ListKind::Tools,
        b"{\"result\":{\"tools\":[\xff]}}"
    ));
}

#[test]
fn discover_union() {
    let members = vec![naming("a", "a"), naming("b", "b")];
    let d = merge_discover(
        &members,
        &[
            (0, json!({"capabilities":{"tools":{"listChanged":false}},"instructions":"use a","ttlMs":10,"cacheScope":"public"}).as_object().unwrap().clone()),
            (1, json!({"capabilities":{"tools":{"listChanged":true},"prompts":{}},"ttlMs":5,"cacheScope":"public"}).as_object().unwrap().clone()),
        ],
    );
    assert_eq!(
        d["capabilities"],
        json!({"tools":{"listChanged":true},"prompts":{}})
    );
    assert_eq!(d["instructions"], "[a] use a");
    assert_eq!(d["ttlMs"], 5);
    assert_eq!(d["cacheScope"], "public");
}

#[test]
fn templates() {
    assert!(template_matches("file:///{path}", "file:///x"));
    assert!(!template_matches("file:///{path}", "file:///x/y"));
    assert!(template_matches("file:///{+path}", "file:///x/y"));
    assert!(template_matches(
        "users://{id}/profile",
        "users://42/profile"
    ));
    assert!(!template_matches(
        "users://{id}/profile",
        "users://42/other"
    ));
    assert!(!template_matches("a{", "a"));
    assert!(template_matches("x://{a}/{+b}.{c}", "x://é/ü/v.w"));
    assert!(!template_matches("x://{a}.{b}", "x://a/b.c"));
    assert!(template_matches("{a}{b}{c}", ""));
}

/// A template of many expressions against a long URI that almost matches: a backtracking match
/// takes exponential time here (a client's `resources/read` held a worker); this one is linear.
/// Run on a thread of its own, waited for with a bound.
#[test]
fn templates_match_in_bounded_time() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let template = "x://r{/o}{/r}{/p}{/q}/contents{/s}{/t}{+u}{v}{w}";
        let uri = format!("x://r{}", "/a".repeat(4000));
        let long = "x".repeat(MAX_TEMPLATE_URI_BYTES + 1);
        let _ = tx.send((
            template_matches(template, &uri),
            template_matches("{+all}", &long),
            template_matches("{+all}", &long[1..]),
        ));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("a match within 20 s");
    assert_eq!(got, (false, false, true));
}
