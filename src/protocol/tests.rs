//! Both eras' wire rules, case by case: the envelope reading and its audit, versions,
//! header values.

use super::envelope::fold;
use super::*;

fn env(s: &str) -> Result<Envelope, EnvelopeError> {
    parse_envelope(s.as_bytes())
}

#[test]
fn envelope_reads_routing_fields() {
    let e = env(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_weather","arguments":{"x":1},
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":"p"}}}"#).unwrap();
    assert_eq!(e.kind, Kind::Request);
    assert_eq!(e.id.as_ref().unwrap().json(), "7");
    assert_eq!(e.method, "tools/call");
    assert_eq!(e.name.as_deref(), Some("get_weather"));
    assert_eq!(e.protocol_version.as_deref(), Some("2026-07-28"));
    assert_eq!(e.client_capabilities.as_deref(), Some("{}"));
    assert!(e.has_progress_token && e.has_meta && !e.is_retry);
}

#[test]
fn envelope_rejects_what_it_must() {
    assert_eq!(env("[1,2]").unwrap_err(), EnvelopeError::Batch);
    assert!(matches!(env("{nope").unwrap_err(), EnvelopeError::Parse(_)));
    assert!(matches!(env("").unwrap_err(), EnvelopeError::Parse(_)));
    assert!(matches!(env("[1,").unwrap_err(), EnvelopeError::Parse(_)));
    assert!(matches!(env("42").unwrap_err(), EnvelopeError::Invalid(..)));
    assert!(matches!(
        env(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#).unwrap_err(),
        EnvelopeError::Invalid(_, Some(_))
    ));
    assert!(matches!(
        env(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#).unwrap_err(),
        EnvelopeError::Invalid(_, None)
    ));
    assert!(matches!(
        env(r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#).unwrap_err(),
        EnvelopeError::Invalid(..)
    ));
    // Integers beyond 64 bits could not be echoed exactly: refused, never answered under
    // another id. Both ends of the 64-bit ranges are ids, and come back as they were written.
    for big in [
        "18446744073709551616",
        "-9223372036854775809",
        &"9".repeat(400),
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{big},"method":"x"}}"#);
        assert!(
            matches!(env(&text).unwrap_err(), EnvelopeError::Invalid(_, None)),
            "{big}"
        );
    }
    for edge in ["18446744073709551615", "-9223372036854775808", "0", "-1"] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{edge},"method":"x"}}"#);
        let id = env(&text).unwrap().id.expect("an id");
        let body = crate::jsonrpc::error_body(Some(&id), -32601, "m", None);
        let back: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(back["id"].to_string(), edge, "echoed exactly");
    }
    assert!(matches!(
        env(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#).unwrap_err(),
        EnvelopeError::Invalid(..)
    ));
}

#[test]
fn envelope_kinds() {
    assert_eq!(
        env(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#)
            .unwrap()
            .kind,
        Kind::Notification
    );
    assert_eq!(
        env(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#)
            .unwrap()
            .kind,
        Kind::Response
    );
    let retry = env(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","requestState":"s"}}"#).unwrap();
    assert!(retry.is_retry);
}

#[test]
fn header_values_decode() {
    assert_eq!(
        decode_header_value(b"get_weather").as_deref(),
        Some("get_weather")
    );
    assert_eq!(
        decode_header_value(b"=?base64?w6lsw6lwaGFudA==?=").as_deref(),
        Some("éléphant")
    );
    assert_eq!(decode_header_value(b" lead"), None);
    assert_eq!(decode_header_value(b"=?base64?***?="), None);
    for v in ["plain", "with space", " lead", "éléphant", "=?base64?x?="] {
        assert_eq!(
            decode_header_value(encode_header_value(v).as_bytes()).as_deref(),
            Some(v)
        );
    }
}

#[test]
fn accept_rules() {
    assert!(accept_ok(None));
    assert!(accept_ok(Some(b"application/json, text/event-stream")));
    assert!(accept_ok(Some(b"*/*")));
    assert!(accept_ok(Some(b"application/json;q=0.9, text/*")));
    assert!(!accept_ok(Some(b"application/json")));
    assert!(!accept_ok(Some(b"text/event-stream")));
}

#[test]
fn member_names_that_other_parsers_read_differently_are_refused() {
    let ok = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Name2":1,"_meta":{"progressToken":1}}}"#;
    assert!(env(ok).is_ok());
    for bad in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"Params":{"name":"b"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","paramſ":{"name":"b"},"params":{"name":"a"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","param\u017f":{"name":"b"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","extra":1,"extra":2}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","_meta":{"progressToken":1,"ProgressToken":2}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","\u006eame":"b"}}"#,
    ] {
        assert!(
            matches!(env(bad), Err(EnvelopeError::Invalid(..))),
            "{bad} must be refused"
        );
    }
    assert_eq!(fold("paramſ"), "params");
    assert_eq!(fold("\u{212A}ey"), "key");
}

#[test]
fn one_pass_reads_levels_as_serde_reads_them() {
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
    };
    let mut texts: Vec<String> = [
        r#"{"name":"a","arguments":{"x":[1,{"_meta":{}}]},"_meta":{"progressToken":"p","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        r#"{"name":"a","_meta":{"progressToken":1,"ProgressToken":2}}"#,
        r#"{"name":"a","_meta":{"x":1,"x":2},"cursor":"c"}"#,
        r#"{"name":"a","_meta":{"a":1},"_meta":{"b":2}}"#,
        r#"{"name":"a","_meta":null}"#,
        r#"{"name":"a","_meta":[1]}"#,
        r#"{"uri":"u","NAME":"b"}"#,
        r#"{"name":"b", "_meta" : { "progressToken" : 1 } }"#,
        r#"{"cursor":"c","_meta":{"io.modelcontextprotocol/logLevel":"debug"}}"#,
        r#"{}"#,
        r#"null"#,
        r#""text""#,
    ]
    .into_iter()
    .map(call)
    .collect();
    texts.extend(
        [
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1},"params":{"b":{"_meta":{}}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","Params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":"a","result":{"_meta":{}}}"#,
            r#" { "jsonrpc" : "2.0" , "method" : "notifications/x" } "#,
            r#"{}"#,
        ]
        .map(String::from),
    );
    for text in &texts {
        assert!(levels_agree(text), "{text} is valid JSON");
    }
    for broken in [
        r#"{"params":{"_meta":{"a":}}}"#,
        r#"{"params":{} "#,
        "[]",
        "{} x",
    ] {
        assert!(!levels_agree(broken), "{broken} is not an object");
    }
}

#[test]
fn ids() {
    let raw: Box<RawValue> = serde_json::from_str("\"abc\"").unwrap();
    assert_eq!(RequestId::from_raw(&raw).unwrap().json(), "\"abc\"");
    assert_eq!(sniff_id(br#"{"id":12,"x":[1]}"#).unwrap().json(), "12");
    assert_eq!(sniff_id(b"{bad"), None);
}
