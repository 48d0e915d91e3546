//! Pure fan-in for aggregated endpoints (`aggregate`): name exposure and stripping, the members' tool filters,
//! merging list pages and discover results, and URI-template matching for `resources/read`
//! routing. No IO, no clock, no globals: every function is a value in, a value out.

use serde_json::{Map, Value, json};

use crate::config::ToolFilter;
use std::collections::HashMap;

/// How one member's names appear on the endpoint.
#[derive(Debug, Clone)]
pub struct Naming {
    pub backend: String,
    /// `""` = names exposed bare.
    pub prefix: String,
    /// The member's own tool filter (on the backend's names); open = every tool.
    pub tools: ToolFilter,
}

impl Naming {
    /// The name a client sees for upstream `name`.
    pub fn expose(&self, sep: &str, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}{sep}{name}", self.prefix)
        }
    }

    /// The upstream name behind an exposed one, when this (prefixed) member owns it.
    pub fn strip<'a>(&self, sep: &str, exposed: &'a str) -> Option<&'a str> {
        if self.prefix.is_empty() {
            return None;
        }
        exposed
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(sep)
    }

    /// `tools.allow` / `tools.deny`, matched against the upstream tool name.
    pub fn tool_allowed(&self, name: &str) -> bool {
        self.tools.allows(name)
    }
}

/// The four list methods an endpoint merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
    Templates,
}

impl ListKind {
    pub fn from_method(method: &str) -> Option<ListKind> {
        match method {
            "tools/list" => Some(ListKind::Tools),
            "prompts/list" => Some(ListKind::Prompts),
            "resources/list" => Some(ListKind::Resources),
            "resources/templates/list" => Some(ListKind::Templates),
            _ => None,
        }
    }

    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "tools/list",
            ListKind::Prompts => "prompts/list",
            ListKind::Resources => "resources/list",
            ListKind::Templates => "resources/templates/list",
        }
    }

    /// The result field holding the items.
    pub fn field(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
            ListKind::Templates => "resourceTemplates",
        }
    }

    /// The item field that identifies it: a name (rewritten) or a URI (kept as is).
    fn key(self) -> &'static str {
        match self {
            ListKind::Tools | ListKind::Prompts => "name",
            ListKind::Resources => "uri",
            ListKind::Templates => "uriTemplate",
        }
    }

    fn renamed(self) -> bool {
        matches!(self, ListKind::Tools | ListKind::Prompts)
    }
}

/// One member's page: its index in the endpoint and the `result` object it returned.
pub struct PartPage {
    pub member: usize,
    pub result: Map<String, Value>,
}

/// A merged page.
#[derive(Debug, Default)]
pub struct Merged {
    pub items: Vec<Value>,
    /// Minimum of the parts' `ttlMs` (a missing or negative one counts as 0).
    pub ttl_ms: u64,
    /// Any part private, or without a `cacheScope` (docs/protocol.md §3: absent is treated as private).
    pub private: bool,
    /// Members with pages left, and their upstream cursors.
    pub next: Vec<(usize, String)>,
    /// Exposed name (tools, prompts) or URI (resources, templates) → member.
    pub owners: Vec<(String, usize)>,
    /// Items dropped because an earlier member already listed the same URI.
    pub shadowed: usize,
}

/// Two members expose the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub name: String,
    pub first: String,
    pub second: String,
}

/// Merges member pages, in the order given (the caller passes config order), rewriting names.
/// A name two members both expose is an error naming both, never a silent overwrite; a URI two
/// members both list is routed to the first, so the later duplicate is left out.
pub fn merge_list(
    kind: ListKind,
    members: &[Naming],
    sep: &str,
    parts: Vec<PartPage>,
) -> Result<Merged, Collision> {
    let mut out = Merged {
        ttl_ms: u64::MAX,
        ..Merged::default()
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for part in parts {
        let Some(naming) = members.get(part.member) else {
            continue;
        };
        let mut result = part.result;
        out.ttl_ms = out.ttl_ms.min(result.get("ttlMs").map_or(0, ttl_of));
        out.private |= result.get("cacheScope").and_then(Value::as_str) != Some("public");
        if let Some(Value::String(c)) = result.get("nextCursor") {
            out.next.push((part.member, c.clone()));
        }
        let Some(Value::Array(items)) = result.remove(kind.field()) else {
            continue;
        };
        for mut item in items {
            let Some(key) = item
                .get(kind.key())
                .and_then(Value::as_str)
                .map(String::from)
            else {
                continue; // malformed item: nothing to route it by
            };
            if kind == ListKind::Tools && !naming.tool_allowed(&key) {
                continue;
            }
            let exposed = if kind.renamed() {
                naming.expose(sep, &key)
            } else {
                key
            };
            if let Some(&first) = seen.get(&exposed) {
                if kind.renamed() {
                    return Err(Collision {
                        name: exposed,
                        first: members[first].backend.clone(),
                        second: naming.backend.clone(),
                    });
                }
                out.shadowed += 1;
                continue;
            }
            seen.insert(exposed.clone(), part.member);
            if kind.renamed() {
                item[kind.key()] = json!(exposed);
            }
            out.owners.push((exposed, part.member));
            out.items.push(item);
        }
    }
    if out.ttl_ms == u64::MAX {
        out.ttl_ms = 0;
    }
    Ok(out)
}

fn ttl_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Merged `server/discover` facts: union of capabilities, instructions labelled by backend,
/// `ttlMs`/`cacheScope` as for lists.
pub fn merge_discover(
    members: &[Naming],
    parts: &[(usize, Map<String, Value>)],
) -> Map<String, Value> {
    let mut caps = json!({});
    let mut instructions = Vec::new();
    let mut ttl = u64::MAX;
    let mut private = false;
    for (i, r) in parts {
        if let Some(c) = r.get("capabilities") {
            union(&mut caps, c);
        }
        if let (Some(Value::String(text)), Some(n)) = (r.get("instructions"), members.get(*i))
            && !text.trim().is_empty()
        {
            instructions.push(format!("[{}] {}", n.backend, text.trim()));
        }
        ttl = ttl.min(r.get("ttlMs").map_or(0, ttl_of));
        private |= r.get("cacheScope").and_then(Value::as_str) != Some("public");
    }
    let mut out = Map::new();
    out.insert("capabilities".into(), caps);
    if !instructions.is_empty() {
        out.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    out.insert("ttlMs".into(), json!(if ttl == u64::MAX { 0 } else { ttl }));
    out.insert(
        "cacheScope".into(),
        json!(if private || parts.is_empty() {
            "private"
        } else {
            "public"
        }),
    );
    out
}

/// Deep union of capability objects: objects merge key by key, booleans are OR-ed, anything
/// else keeps the first value seen.
pub fn union(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => union(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Bool(a), Value::Bool(b)) => *a |= *b,
        _ => {}
    }
}

/// Whether `uri` could come from an RFC 6570 template: literal text must match exactly; a
/// `{var}` expression matches any run without `/`, and a reserved (`{+var}`, `{#var}`) or
/// path-style expression any run at all. Good enough to pick the owner of a URI, which is all
/// it is used for.
pub fn template_matches(template: &str, uri: &str) -> bool {
    enum Piece<'a> {
        Lit(&'a str),
        Var { slash: bool },
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Lit(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        pieces.push(Piece::Var {
            slash: expr.starts_with(['+', '#', '/', '.', ';', '?', '&']),
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Lit(rest));
    }
    fn go(pieces: &[Piece], uri: &str) -> bool {
        match pieces.split_first() {
            None => uri.is_empty(),
            Some((Piece::Lit(l), more)) => uri.strip_prefix(l).is_some_and(|u| go(more, u)),
            Some((Piece::Var { slash }, more)) => {
                let mut end = 0;
                loop {
                    if go(more, &uri[end..]) {
                        return true;
                    }
                    let Some(c) = uri[end..].chars().next() else {
                        return false;
                    };
                    if c == '/' && !slash {
                        return false;
                    }
                    end += c.len_utf8();
                }
            }
        }
    }
    go(&pieces, uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming(backend: &str, prefix: &str) -> Naming {
        Naming {
            backend: backend.into(),
            prefix: prefix.into(),
            tools: ToolFilter::default(),
        }
    }

    fn page(member: usize, v: Value) -> PartPage {
        PartPage {
            member,
            result: v.as_object().unwrap().clone(),
        }
    }

    #[test]
    fn names_are_prefixed_filtered_and_merged_in_order() {
        let mut gh = naming("github", "gh");
        gh.tools.deny = vec!["delete_*".into()];
        let members = vec![gh, naming("files", "")];
        let m = merge_list(
            ListKind::Tools,
            &members,
            "__",
            vec![
                page(0, json!({"tools":[{"name":"search"},{"name":"delete_repo"}],"ttlMs":500,"cacheScope":"public","nextCursor":"c2"})),
                page(1, json!({"tools":[{"name":"read"}],"ttlMs":100})),
            ],
        )
        .unwrap();
        let names: Vec<_> = m
            .items
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gh__search", "read"]);
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
        let e = merge_list(
            ListKind::Prompts,
            &members,
            "__",
            vec![
                page(0, json!({"prompts":[{"name":"greet"}]})),
                page(1, json!({"prompts":[{"name":"greet"}]})),
            ],
        )
        .unwrap_err();
        assert_eq!((e.first.as_str(), e.second.as_str()), ("a", "b"));
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
    }
}
