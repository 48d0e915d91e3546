//! The era translation both ways, as text: what changes, what is kept byte for byte, and the
//! answers it refuses in the upstream's words.

use super::*;
use crate::protocol::RequestId;

/// The mapping of a call with client id `id` (`upstream_id` 9, private, no token or level).
fn mapping(id: Value, method: &str, server_info: Option<Arc<ServerInfo>>) -> Mapping {
    Mapping {
        client_id: RequestId::from_value(&id).unwrap(),
        upstream_id: 9,
        token: None,
        method: method.into(),
        ttl_ms: 0,
        scope: "private",
        server_info,
        log_level: None,
    }
}

#[test]
fn requests_go_up_in_legacy_shape() {
    let body = br#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t","arguments":{},"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},
        "io.modelcontextprotocol/clientInfo":{"name":"x"},"progressToken":7,"custom":1}}}"#;
    let (up, token) = to_legacy(body, 42).unwrap();
    let v: Value = serde_json::from_slice(&up).unwrap();
    assert_eq!(v["id"], 42);
    assert_eq!(
        v["params"]["_meta"],
        json!({"progressToken":"portico-42","custom":1})
    );
    assert_eq!(token, Some((json!("portico-42"), json!(7))));
    let (up, token) = to_legacy(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#, 3).unwrap();
    let v: Value = serde_json::from_slice(&up).unwrap();
    assert!(v["params"].get("_meta").is_none(), "empty _meta removed");
    assert!(token.is_none());
}

#[test]
fn content_crosses_the_bridge_byte_for_byte() {
    // Up: the arguments as the client wrote them (no float rounding, no key reordering).
    let body = br#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t","arguments":{"z":1.50,"a":[1e3,"\u00e9"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":null}}}"#;
    let (up, token) = to_legacy(body, 9).unwrap();
    assert_eq!(
        std::str::from_utf8(&up).unwrap(),
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t","arguments":{"z":1.50,"a":[1e3,"\u00e9"]},"_meta":{"progressToken":null}}}"#
    );
    assert!(token.is_none(), "a null token is no token");
    assert!(matches!(
        to_legacy(b"[1]", 1),
        Err(GatewayError::InvalidRequest(_))
    ));
    assert!(matches!(
        to_legacy(b"{nope", 1),
        Err(GatewayError::Parse(_))
    ));
    // Down: the content as the server wrote it, the modern members appended, serverInfo
    // added to the server's own _meta.
    let info = ServerInfo::of(&json!({"serverInfo": {"name":"legacy"}}));
    let m = mapping(json!(7), "tools/call", info);
    let Translated::Forward(out) = from_legacy(
        br#"{"result":{"content":[{"type":"text","text":"x","n":1.50}],"_meta":{"k":1}},"jsonrpc":"2.0","id":9}"#,
        &m,
    ) else {
        panic!("forwarded")
    };
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"result":{"content":[{"type":"text","text":"x","n":1.50}],"_meta":{"k":1,"io.modelcontextprotocol/serverInfo":{"name":"legacy"}},"resultType":"complete"},"jsonrpc":"2.0","id":7}"#
    );
    assert_eq!(error_status(&out), None);
    // An id that only looks like ours is someone else's answer.
    for id in ["9.0", "\"9\"", "90"] {
        let msg = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#);
        assert!(
            matches!(from_legacy(msg.as_bytes(), &m), Translated::Drop),
            "{id}"
        );
    }
}

#[test]
fn a_meta_left_empty_is_left_out_wherever_it_stands() {
    let reserved = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/logLevel":"info"}"#;
    for (params, up) in [
        (
            format!(r#"{{"_meta":{reserved},"name":"t"}}"#),
            r#"{"name":"t"}"#,
        ),
        (
            format!(r#"{{"name":"t", "_meta" : {reserved} ,"arguments":{{"a":[1]}}}}"#),
            r#"{"name":"t","arguments":{"a":[1]}}"#,
        ),
        (format!(r#"{{"_meta":{reserved}}}"#), "{}"),
        (
            r#"{"_meta":{"progressToken":"p","io.modelcontextprotocol/clientInfo":{}},"name":"t"}"#
                .into(),
            r#"{"_meta":{"progressToken":"portico-5"},"name":"t"}"#,
        ),
        (
            r#"{"_meta":[1],"name":"t"}"#.into(),
            r#"{"_meta":[1],"name":"t"}"#,
        ),
    ] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
        let (out, _) = to_legacy(body.as_bytes(), 5).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{up}}}"#),
            "{params}"
        );
    }
}

#[test]
fn the_span_path_writes_what_the_whole_reading_writes() {
    // Up from the envelope's spans (`Upward`), the rest copied byte for byte: the member
    // `_meta` is cut with its comma wherever it stands, the id replaced wherever it stands.
    let reserved = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/logLevel":"warning"}"#;
    for (body, up) in [
        (
            format!(r#"{{"jsonrpc": "2.0", "method": "tools/call", "params": {{"_meta": {reserved} , "name": "t"}}, "id": 1}}"#),
            r#"{"jsonrpc": "2.0", "method": "tools/call", "params": { "name": "t"}, "id": 5}"#,
        ),
        (
            format!(r#"{{"id":"x","jsonrpc":"2.0","method":"tools/call","params":{{"name":"t","_meta":{reserved}}}}}"#),
            r#"{"id":5,"jsonrpc":"2.0","method":"tools/call","params":{"name":"t"}}"#,
        ),
        (
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{ "_meta" : {reserved} }}}}"#),
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{ }}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{"progressToken":3,"k":[1]},"progress":1}}"#.into(),
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{"progressToken":"portico-5","k":[1]},"progress":1}}"#,
        ),
    ] {
        let env = crate::protocol::parse_envelope(body.as_bytes()).unwrap();
        let upward = Upward::read(body.as_bytes(), env.spans.as_ref()).unwrap();
        assert_eq!(std::str::from_utf8(&upward.write(5).0).unwrap(), up, "{body}");
        assert!(upward_agrees(body.as_bytes()), "{body}");
    }
    // The log level, read where `_meta` is.
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{reserved}}}}}"#
    );
    let env = crate::protocol::parse_envelope(body.as_bytes()).unwrap();
    let upward = Upward::read(body.as_bytes(), env.spans.as_ref()).unwrap();
    assert_eq!(upward.log_level, crate::protocol::log_rank("warning"));
    // Spans of another body are not used (the caller then reads the body whole).
    let other = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    assert!(Upward::read(other, env.spans.as_ref()).is_none());
    // Every request the other tests send up agrees with the whole reading.
    for body in [
        r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t","arguments":{"z":1.50,"a":[1e3,"\u00e9"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":null}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"progressToken":"p","io.modelcontextprotocol/clientInfo":{}},"name":"t"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":[1],"name":"t"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":null,"name":"t"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{}}}"#,
        r#" { "params" : { "_meta" : { "a" : 1 } } , "method" : "x" , "jsonrpc" : "2.0" , "id" : 2 } "#,
    ] {
        assert!(upward_agrees(body.as_bytes()), "{body}");
    }
}

#[test]
fn a_repeated_result_makes_no_message() {
    let m = mapping(json!(7), "tools/call", None);
    let twice = br#"{"jsonrpc":"2.0","id":9,"result":{"a":1},"result":{"b":2}}"#;
    assert!(matches!(from_legacy(twice, &m), Translated::Drop));
    assert_eq!(
        legacy_answer(twice, &m).unwrap_err(),
        "the answer is not a JSON-RPC message"
    );
}

/// A call's one JSON answer is checked in the reading that translates it, with the words
/// the upstream's check would have used (`upstream::http::shape`).
#[test]
fn a_json_answer_is_checked_where_it_is_translated() {
    let m = mapping(json!(7), "tools/call", None);
    for (answer, words) in [
        (&b"<html>oops</html>"[..], "the answer is not valid JSON"),
        (
            br#"{"jsonrpc":"2.0","id":9,"result":{"#,
            "the answer is truncated JSON",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9,"result":{"a":[1,]}}"#,
            "the answer is not valid JSON",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9,"result":{}} x"#,
            "the answer is not valid JSON",
        ),
        (
            br#"[{"jsonrpc":"2.0","id":9,"result":{}}]"#,
            "the answer is not a JSON-RPC message",
        ),
        (
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
            "the answer is not a JSON-RPC response",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9,"method":"ping","result":{}}"#,
            "the answer is not a JSON-RPC response",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9}"#,
            "the answer is not a JSON-RPC response",
        ),
        (
            br#"{"jsonrpc":"2.0","id":9,"error":{},"error":{}}"#,
            "the answer is not a JSON-RPC message",
        ),
    ] {
        let got = legacy_answer(answer, &m);
        assert_eq!(
            got.as_ref().err().map(String::as_str),
            Some(words),
            "{:?}",
            String::from_utf8_lossy(answer)
        );
        // What the upstream's own check says of it, where it has words.
        if let Err(what) = crate::upstream::http::shape(answer) {
            assert_eq!(format!("the answer {what}"), words);
        }
    }
    // Another id: no answer to this call (the caller's 502).
    let other = br#"{"jsonrpc":"2.0","id":8,"result":{}}"#;
    assert_eq!(legacy_answer(other, &m), Ok(None));
    let ok = br#"{"jsonrpc":"2.0","id":9,"method":null,"result":{"content":[]}}"#;
    let out = legacy_answer(ok, &m).unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"jsonrpc":"2.0","id":7,"method":null,"result":{"content":[],"resultType":"complete"}}"#
    );
}

#[test]
fn results_come_back_in_modern_shape() {
    let info = ServerInfo::of(&json!({"serverInfo": {"name":"legacy"}}));
    let m = Mapping {
        upstream_id: 42,
        token: Some((json!("portico-42"), json!(7))),
        ttl_ms: 5000,
        log_level: crate::protocol::log_rank("info"),
        ..mapping(json!("c1"), "tools/list", info)
    };
    let Translated::Forward(out) =
        from_legacy(br#"{"jsonrpc":"2.0","id":42,"result":{"tools":[]}}"#, &m)
    else {
        panic!("forwarded")
    };
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["id"], "c1");
    assert_eq!(v["result"]["resultType"], "complete");
    assert_eq!(v["result"]["ttlMs"], 5000);
    assert_eq!(v["result"]["cacheScope"], "private");
    assert_eq!(v["result"]["_meta"][meta::SERVER_INFO]["name"], "legacy");
    let Translated::Forward(out) = from_legacy(
        br#"{"jsonrpc":"2.0","id":42,"error":{"code":-32002,"message":"Resource not found"}}"#,
        &m,
    ) else {
        panic!()
    };
    assert_eq!(
        serde_json::from_slice::<Value>(&out).unwrap()["error"]["code"],
        -32602
    );
    let Translated::Forward(out) = from_legacy(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"portico-42","progress":1}}"#, &m) else {
        panic!()
    };
    assert_eq!(
        serde_json::from_slice::<Value>(&out).unwrap()["params"]["progressToken"],
        7
    );
    assert!(matches!(
        from_legacy(
            br#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#,
            &m
        ),
        Translated::Answer(_)
    ));
    assert!(
        matches!(
            from_legacy(br#"{"jsonrpc":"2.0","id":99,"result":{}}"#, &m),
            Translated::Drop
        ),
        "someone else's answer"
    );
    assert!(matches!(
        from_legacy(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
            &m
        ),
        Translated::Drop
    ));
    assert!(matches!(
        from_legacy(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"debug","data":"x"}}"#,
            &m
        ),
        Translated::Drop
    ));
    assert!(matches!(
        from_legacy(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"x"}}"#,
            &m
        ),
        Translated::Forward(_)
    ));
}
