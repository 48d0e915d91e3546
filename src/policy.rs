//! Tool policy, the one implementation: glob matching and `allow`/`deny` lists (`ToolFilter`),
//! used for team policies (`[[auth.teams]] tools`) and for an aggregated member's own `tools`
//! filter, plus the filter that removes hidden tools from a `tools/list` answer. Pure: no IO.
//!
//! A team policy is always matched against the name the *client* sees (on an aggregated
//! endpoint, `<prefix><separator><name>`); a member's own filter against the backend's name.
//! Callers say which by the name they pass.

use bytes::Bytes;
use serde_json::Value;

use crate::config::ToolFilter;

/// `*` matches any run of characters, `?` exactly one; everything else literally (the
/// `wildmatch` crate).
pub fn glob(pattern: &str, text: &str) -> bool {
    wildmatch::WildMatch::new(pattern).matches(text)
}

impl ToolFilter {
    /// Whether the filter admits `name`: allowed (or no allow list) and not denied.
    pub fn allows(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|g| glob(g, name)))
            && !self.deny.iter().any(|g| glob(g, name))
    }

    /// Whether the filter restricts anything at all.
    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// Removes from a `tools/list` response every tool `keep` refuses by name; a tool whose name
/// is not a string is removed too (no policy can vouch for it). The result is labelled
/// `cacheScope: "private"`: it is one team's view, and a client must not share it. Anything
/// that is not such a response passes unchanged.
pub fn filter_tools(msg: Bytes, keep: impl Fn(&str) -> bool) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(&msg) else {
        return msg;
    };
    let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else {
        return msg;
    };
    let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
        return msg;
    };
    tools.retain(|t| t.get("name").and_then(Value::as_str).is_some_and(&keep));
    if result.contains_key("cacheScope") || result.contains_key("ttlMs") {
        result.insert("cacheScope".into(), Value::from("private"));
    }
    serde_json::to_vec(&v).map(Bytes::from).unwrap_or(msg)
}

/// A result that says `cacheScope: "public"` labelled `"private"` instead: what portico
/// fetched with the caller's own credential (`[backends.token_exchange]`) is that caller's
/// view, whatever the backend said. Anything else passes unchanged.
pub fn private_scope(msg: Bytes) -> Bytes {
    if memchr::memmem::find(&msg, b"\"public\"").is_none() {
        return msg;
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(&msg) else {
        return msg;
    };
    let Some(result) = v.get_mut("result").and_then(Value::as_object_mut) else {
        return msg;
    };
    if result.get("cacheScope").and_then(Value::as_str) != Some("public") {
        return msg;
    }
    result.insert("cacheScope".into(), Value::from("private"));
    serde_json::to_vec(&v).map(Bytes::from).unwrap_or(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_result_is_labelled_private_and_nothing_else_changes() {
        let public = Bytes::from(
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"cacheScope":"public","ttlMs":5}}"#,
        );
        let v: Value = serde_json::from_slice(&private_scope(public)).unwrap();
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["ttlMs"], 5);
        for same in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"cacheScope":"private"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"public"}]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"public"}}"#,
        ] {
            assert_eq!(private_scope(Bytes::from(same)), same.as_bytes());
        }
    }

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("*", "anything", true),
            ("*", "", true),
            ("delete_*", "delete_repo", true),
            ("delete_*", "create_repo", false),
            ("*delete*", "bulk_delete_all", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("a*b*c", "a_x_b_y_c", true),
            ("a*b*c", "a_x_c", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("r__*", "r__secret_tool", true),
        ] {
            assert_eq!(glob(p, t), want, "{p} vs {t}");
        }
    }

    #[test]
    fn filters_allow_then_deny() {
        let f = ToolFilter {
            allow: vec!["gh__*".into()],
            deny: vec!["*delete*".into()],
        };
        assert!(f.allows("gh__create"));
        assert!(!f.allows("gh__delete_repo"));
        assert!(!f.allows("fs__read"));
        assert!(ToolFilter::default().allows("x") && ToolFilter::default().is_open());
    }

    #[test]
    fn filters_list_messages() {
        let msg = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"name":"b"},{"name":7},{}]}}"#,
        );
        let out = filter_tools(msg, |n| n == "a");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["result"]["tools"], serde_json::json!([{"name": "a"}]));
        let public = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"}],"ttlMs":5,"cacheScope":"public"}}"#,
        );
        let v: Value = serde_json::from_slice(&filter_tools(public, |_| true)).unwrap();
        assert_eq!(
            v["result"]["cacheScope"], "private",
            "a team's view is private"
        );
        let other = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#);
        assert_eq!(filter_tools(other.clone(), |_| false), other);
    }
}
