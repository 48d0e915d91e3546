//! `Mcp-Param-*` headers (docs/protocol.md §4): a 2026-07-28 `tools/call` carries one header
//! per argument whose `inputSchema` property is annotated `"x-mcp-header": "{Name}"`, and a
//! strict server refuses the call (`-32020`) when one is missing. A client builds them from the
//! tool list; when portico writes the 2026-07-28 request itself (for an initialize-era client,
//! `portico stdio`, an aggregated endpoint's member) it is that client, so it builds them from
//! the tool list it holds ([`ToolParams`]).
//!
//! The rules, from docs/protocol.md §4: the header is `Mcp-Param-{Name}`; integers are written
//! in decimal, booleans `true`/`false`, strings as they are unless they need the
//! `=?base64?…?=` form (non-ASCII, control characters, edge whitespace, the sentinel); a null
//! or absent argument sends no header. Only `string`, `integer` and `boolean` properties may be
//! annotated, reached through `properties` steps only; a tool whose annotations break a rule
//! gets no headers from portico (a client MUST drop such a tool; its server will say why).

use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use tokio::time::Instant;

use crate::protocol::{encode_header_value, header as h};

/// Tools remembered per backend; a backend listing more is not given headers for the rest
/// (bounded memory against a hostile list).
pub const MAX_TOOLS: usize = 4096;
/// Deepest `properties` nesting walked in one schema.
const MAX_DEPTH: usize = 8;

/// One annotated argument: the header, and the path of property names leading to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub header: HeaderName,
    pub path: Vec<String>,
}

/// The annotated arguments of one tool's `inputSchema`: `Some(empty)` when none are annotated,
/// `None` when an annotation breaks the rules.
pub fn specs_of(input_schema: &Value) -> Option<Vec<ParamSpec>> {
    let mut out = Vec::new();
    walk(input_schema, &mut Vec::new(), &mut out, 0)?;
    Some(out)
}

fn walk(
    schema: &Value,
    path: &mut Vec<String>,
    out: &mut Vec<ParamSpec>,
    depth: usize,
) -> Option<()> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Some(());
    };
    if depth >= MAX_DEPTH {
        return Some(());
    }
    for (name, prop) in props {
        path.push(name.clone());
        if let Some(annotation) = prop.get("x-mcp-header") {
            let header = annotation.as_str().filter(|n| !n.is_empty())?;
            let allowed = matches!(
                prop.get("type").and_then(Value::as_str),
                Some("string" | "integer" | "boolean")
            );
            if !allowed {
                return None;
            }
            let header =
                HeaderName::from_bytes(format!("{}{header}", h::PARAM_PREFIX).as_bytes()).ok()?;
            out.push(ParamSpec {
                header,
                path: path.clone(),
            });
        } else {
            walk(prop, path, out, depth + 1)?;
        }
        path.pop();
    }
    Some(())
}

/// The headers a call with these `arguments` carries. An argument whose value does not fit
/// its annotated type is left out: the body is the source of truth, and the server judges it.
pub fn build(specs: &[ParamSpec], arguments: &Value) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let mut v = arguments;
        for step in &spec.path {
            v = &v[step.as_str()];
        }
        let text = match v {
            Value::String(s) => encode_header_value(s),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
            // An integer written as a float (`42.0`) is still the integer.
            Value::Number(n) => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => format!("{}", f as i64),
                _ => continue,
            },
            _ => continue,
        };
        if let Ok(value) = HeaderValue::from_str(&text) {
            out.push((spec.header.clone(), value));
        }
    }
    out
}

/// The `x-mcp-header` annotations of one backend's tools, learnt from every `tools/list`
/// answer portico parses for it (its own fetches included). Only which argument goes in which
/// header is kept; it shapes upstream headers and is never shown to a client.
#[derive(Default)]
pub struct ToolParams {
    tools: RwLock<HashMap<String, Arc<[ParamSpec]>>>,
    /// Held while a `tools/list` is fetched to learn annotations; when the last fetch began.
    fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl ToolParams {
    /// The fetch slot: one fetch at a time per backend, and when the last one began (so the
    /// caller can space them).
    pub async fn fetching(&self) -> tokio::sync::MutexGuard<'_, Option<Instant>> {
        self.fetch.lock().await
    }

    /// The annotations of `tool`, if a list portico read named it (empty: none annotated, or
    /// annotations that break the rules).
    pub fn get(&self, tool: &str) -> Option<Arc<[ParamSpec]>> {
        let tools = self.tools.read().unwrap_or_else(|p| p.into_inner());
        tools.get(tool).cloned()
    }

    /// Forgets one tool (the server refused the headers built for it: its schema moved on).
    pub fn forget(&self, tool: &str) {
        let mut tools = self.tools.write().unwrap_or_else(|p| p.into_inner());
        tools.remove(tool);
    }

    /// Learns the tools of one `tools/list` answer (a JSON-RPC response); anything else
    /// teaches nothing.
    pub fn learn_list(&self, answer: &[u8]) {
        #[derive(Deserialize)]
        struct Answer<'a> {
            #[serde(borrow)]
            result: Option<Listed<'a>>,
        }
        #[derive(Deserialize)]
        struct Listed<'a> {
            #[serde(borrow, default)]
            tools: Vec<Tool<'a>>,
        }
        #[derive(Deserialize)]
        struct Tool<'a> {
            #[serde(borrow)]
            name: Cow<'a, str>,
            #[serde(default, rename = "inputSchema")]
            input_schema: Value,
        }
        let Ok(Answer { result: Some(list) }) = serde_json::from_slice::<Answer<'_>>(answer) else {
            return;
        };
        let mut tools = self.tools.write().unwrap_or_else(|p| p.into_inner());
        for t in list.tools {
            if tools.len() >= MAX_TOOLS && !tools.contains_key(&*t.name) {
                continue;
            }
            let specs: Arc<[ParamSpec]> = specs_of(&t.input_schema).unwrap_or_default().into();
            tools.insert(t.name.into_owned(), specs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(schema: Value, args: Value) -> Vec<(String, String)> {
        let specs = specs_of(&schema).expect("valid annotations");
        build(&specs, &args)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect()
    }

    #[test]
    fn values_are_written_as_the_spec_says() {
        let schema = json!({"type":"object","properties":{
            "region":{"type":"string","x-mcp-header":"Region"},
            "n":{"type":"integer","x-mcp-header":"N"},
            "on":{"type":"boolean","x-mcp-header":"On"},
            "opts":{"type":"object","properties":{"tier":{"type":"string","x-mcp-header":"Tier"}}},
            "plain":{"type":"string"}}});
        let mut got = headers(
            schema.clone(),
            json!({"region":"eu-west","n":42,"on":true,"opts":{"tier":"gold"},"plain":"x"}),
        );
        got.sort();
        assert_eq!(
            got,
            [
                ("mcp-param-n", "42"),
                ("mcp-param-on", "true"),
                ("mcp-param-region", "eu-west"),
                ("mcp-param-tier", "gold"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        // Non-ASCII, edge whitespace and the sentinel take the base64 form; null and absent
        // arguments send nothing; 42.0 is 42.
        let mut got = headers(
            schema.clone(),
            json!({"region":"Zürich","n":42.0,"on":null}),
        );
        got.sort();
        assert_eq!(
            got,
            [
                ("mcp-param-n".to_string(), "42".to_string()),
                (
                    "mcp-param-region".to_string(),
                    "=?base64?WsO8cmljaA==?=".to_string()
                ),
            ]
        );
        let got = headers(schema, json!({"region":" padded"}));
        assert_eq!(got[0].1, "=?base64?IHBhZGRlZA==?=");
    }

    #[test]
    fn annotations_that_break_the_rules_give_no_headers() {
        for bad in [
            json!({"properties":{"x":{"type":"number","x-mcp-header":"X"}}}),
            json!({"properties":{"x":{"type":"array","x-mcp-header":"X"}}}),
            json!({"properties":{"x":{"type":"string","x-mcp-header":""}}}),
            json!({"properties":{"x":{"type":"string","x-mcp-header":"bad name"}}}),
            json!({"properties":{"x":{"type":"string","x-mcp-header":7}}}),
        ] {
            assert_eq!(specs_of(&bad), None, "{bad}");
        }
        assert_eq!(specs_of(&json!({"type":"object"})), Some(vec![]));
    }

    #[test]
    fn learnt_from_a_tools_list_answer() {
        let p = ToolParams::default();
        p.learn_list(
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"a","inputSchema":{"properties":{"r":{"type":"string","x-mcp-header":"R"}}}},
            {"name":"b","inputSchema":{"type":"object"}}]}}"#,
        );
        assert_eq!(p.get("a").unwrap().len(), 1);
        assert_eq!(p.get("b").unwrap().len(), 0);
        assert!(p.get("c").is_none());
        p.forget("a");
        assert!(p.get("a").is_none());
        p.learn_list(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#);
        assert!(p.get("b").is_some());
    }
}
