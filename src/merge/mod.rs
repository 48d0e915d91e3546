//! Pure fan-in for aggregated endpoints (`aggregate`): name exposure and stripping, the members' tool filters,
//! merging list pages and discover results, and URI-template matching for `resources/read`
//! routing. No IO, no clock, no globals: every function is a value in, a value out.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::fmt;

use crate::config::ToolFilter;
use crate::jsonrpc::{Members, Raw, parse_members, write_key, write_replaced, write_str};

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
        let mut exposed = String::with_capacity(self.prefix.len() + sep.len() + name.len());
        if !self.prefix.is_empty() {
            exposed.push_str(&self.prefix);
            exposed.push_str(sep);
        }
        exposed.push_str(name);
        exposed
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

/// One member's list page, read from its answer in one pass ([`read_list_answer`]): what the
/// merge needs of the result, the items as raw members.
#[derive(Debug, Default)]
pub struct PartPage<'a> {
    /// The member's index in the endpoint.
    pub member: usize,
    /// `ttlMs`: a non-negative integer, else 0 (missing included).
    pub ttl_ms: u64,
    /// `cacheScope` is `"public"` (absent is treated as private, docs/protocol.md §3).
    pub public: bool,
    /// `nextCursor`, when it is a string.
    pub next: Option<String>,
    /// The items (`None`: not an object).
    pub items: Vec<Option<Item<'a>>>,
    /// The length of the list's JSON text: what the merge reserves for it.
    pub text_len: usize,
}

/// One list item that is an object, as the merge needs it: its text as the member wrote it, and
/// its key member (`name`, `uri` or `uriTemplate`: the last of them, as a tree's lookup reads it)
/// with how many the item has. The merge copies the text around the key, not member by member
/// (callgrind: a `Vec` of members per item and a write per member cost ~7 k instructions of an
/// uncached 3-member `tools/list`).
#[derive(Debug, PartialEq)]
pub struct Item<'a> {
    pub text: &'a str,
    pub key: Option<Raw<'a>>,
    pub keys: usize,
}

impl<'a> Item<'a> {
    /// An item with no key member yet.
    fn new(text: &'a str) -> Self {
        Item {
            text,
            key: None,
            keys: 0,
        }
    }

    /// One member, as it is read: kept when it is the key.
    fn member(&mut self, is_key: bool, value: Raw<'a>) {
        if is_key {
            self.key = Some(value);
            self.keys += 1;
        }
    }
}

/// What a member answered to a list request.
#[derive(Debug)]
pub enum ListAnswer<'a> {
    /// A result object (with or without the list field).
    Page(PartPage<'a>),
    /// A JSON-RPC error (the `error` member).
    Error(Value),
    /// Neither: not JSON, or no object result and no error.
    Neither,
}

/// Reads a member's answer to a list request of `kind` in one pass over its text: the items'
/// members are cut out as raw text, so nothing is parsed into a tree or scanned twice (an
/// aggregated list is one such read per member per uncached request). The reading is also the
/// answer's only check as JSON: the fan-out asks the upstream not to scan it first
/// (`aggregate::fan_out`).
///
/// Our scanner's visitor form (`jsonrpc::scan_members`), not serde: the same reading through
/// serde's visitors cost ~37 k instructions for a 2 KB `tools/list` answer, the scanner ~22 k
/// (callgrind, README "Crates, and what portico writes itself"). [`list_answers_agree`] checks
/// the two readings against each other (unit tests, fuzz harness).
pub fn read_list_answer(kind: ListKind, member: usize, message: &[u8]) -> ListAnswer<'_> {
    let Ok(text) = std::str::from_utf8(message) else {
        return ListAnswer::Neither;
    };
    let (mut page, mut error) = (None, None);
    // As the upstream's check reads a response: a `method` that is not null makes it a
    // request, and `method`, `result` or `error` given twice is no JSON-RPC message.
    let mut members = crate::protocol::ResponseMembers::default();
    let read = crate::jsonrpc::scan_members(text, |name, at| {
        let read = if name == "result" && at.is_object() {
            let mut p = PartPage {
                member,
                ..PartPage::default()
            };
            let read = read_page(kind, &mut p, at)?;
            page = Some(p);
            read
        } else {
            let read = at.skip()?;
            match &*name {
                "result" => page = None,
                "error" => error = serde_json::from_str::<Value>(read.raw().get()).ok(),
                _ => {}
            }
            read
        };
        members.note(&name, read.raw().get());
        Some(read)
    });
    if members.repeated() || members.has_method() {
        return ListAnswer::Neither;
    }
    match (read, page, error) {
        (Some(()), Some(page), _) => ListAnswer::Page(page),
        (Some(()), None, Some(error)) => ListAnswer::Error(error),
        _ => ListAnswer::Neither,
    }
}

/// A `result` object's members into `page`; as a tree's lookup would, the last of duplicate
/// members counts.
fn read_page<'a>(
    kind: ListKind,
    page: &mut PartPage<'a>,
    at: crate::jsonrpc::At<'a>,
) -> Option<crate::jsonrpc::Read<'a>> {
    at.members(|name, at| {
        if name == kind.field() && at.is_array() {
            let mut items = Vec::with_capacity(16);
            let read = at.elements(|at| {
                if !at.is_object() {
                    items.push(None);
                    return at.skip();
                }
                let mut item = Item::new("");
                let read = at.members(|name, at| {
                    let read = at.skip()?;
                    item.member(name == kind.key(), read.raw());
                    Some(read)
                })?;
                item.text = read.raw().get();
                items.push(Some(item));
                Some(read)
            })?;
            page.items = items;
            page.text_len = read.raw().get().len();
            return Some(read);
        }
        let read = at.skip()?;
        let raw = read.raw().get();
        match &*name {
            "ttlMs" => page.ttl_ms = ttl_of(raw),
            "cacheScope" => page.public = raw == "\"public\"",
            "nextCursor" => page.next = serde_json::from_str::<String>(raw).ok(),
            // A list field that is not an array holds no items.
            field if field == kind.field() => page.items = Vec::new(),
            _ => {}
        }
        Some(read)
    })
}

/// [`read_list_answer`] through serde's visitors: the reference the scanner's reading is
/// checked against.
fn read_list_answer_by_serde(kind: ListKind, member: usize, message: &[u8]) -> ListAnswer<'_> {
    let mut de = serde_json::Deserializer::from_slice(message);
    let read = (MessageSeed { kind, member })
        .deserialize(&mut de)
        .and_then(|read| de.end().map(|()| read));
    match read {
        Ok((Some(page), _)) => ListAnswer::Page(page),
        Ok((None, Some(error))) => ListAnswer::Error(error),
        _ => ListAnswer::Neither,
    }
}

/// Whether [`read_list_answer`] reads `message` as serde does (the same page, error or
/// neither); panics on a disagreement, naming the text. The unit tests' and the fuzz harness's
/// check. Text nested deeper than serde's recursion limit (128) is not compared: serde refuses
/// it where a value is read as a tree, the scanner has no such limit.
pub fn list_answers_agree(kind: ListKind, message: &[u8]) -> bool {
    if nesting(message) > 120 {
        return false;
    }
    let mut ours = read_list_answer(kind, 0, message);
    if let ListAnswer::Page(page) = &mut ours {
        page.text_len = 0; // serde's reading does not measure the list
    }
    let ours = format!("{ours:?}");
    let serde = format!("{:?}", read_list_answer_by_serde(kind, 0, message));
    assert_eq!(
        ours,
        serde,
        "read_list_answer and serde disagree on {:?}",
        String::from_utf8_lossy(message)
    );
    !ours.starts_with("Neither")
}

/// The deepest nesting of brackets in `text` outside strings (an upper bound when it is not
/// valid JSON).
fn nesting(text: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &c in text {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, ..) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'{' | b'[') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b'}' | b']') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The visits of the value kinds a lenient reader does not want: the value is skipped and
/// `$none` returned, so a member of the wrong kind reads as nothing rather than failing the
/// whole answer. `seq` or `map` names the compound kind that is unwanted too.
macro_rules! skip_others {
    (seq, $none:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($none)
        }
        skip_others!(@scalars $none);
    };
    (map, $none:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($none)
        }
        skip_others!(@scalars $none);
    };
    (@scalars $none:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }
    };
}

/// The message object: its `result` (as a page) and `error`; the rest skipped.
struct MessageSeed {
    kind: ListKind,
    member: usize,
}

impl<'de> DeserializeSeed<'de> for MessageSeed {
    type Value = (Option<PartPage<'de>>, Option<Value>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed {
    type Value = (Option<PartPage<'de>>, Option<Value>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-RPC response")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let (mut result, mut error) = (None, None);
        let (mut seen, mut twice, mut method) = ([false; 3], false, false);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "method" => {
                    twice |= std::mem::replace(&mut seen[0], true);
                    method = map.next_value::<&RawValue>()?.get() != "null";
                }
                "result" => {
                    twice |= std::mem::replace(&mut seen[1], true);
                    result = map.next_value_seed(PageSeed {
                        kind: self.kind,
                        member: self.member,
                    })?
                }
                "error" => {
                    twice |= std::mem::replace(&mut seen[2], true);
                    error = Some(map.next_value::<Value>()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if twice || method {
            return Err(A::Error::custom("not a JSON-RPC response"));
        }
        Ok((result, error))
    }
}

/// A `result`: a page when it is an object, `None` for anything else.
struct PageSeed {
    kind: ListKind,
    member: usize,
}

impl<'de> DeserializeSeed<'de> for PageSeed {
    type Value = Option<PartPage<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PageSeed {
    type Value = Option<PartPage<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a result")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut page = PartPage {
            member: self.member,
            ..PartPage::default()
        };
        // As a tree's lookup would: the last of duplicate members counts.
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "ttlMs" => page.ttl_ms = ttl_of(map.next_value::<&RawValue>()?.get()),
                "cacheScope" => {
                    page.public = map.next_value::<&RawValue>()?.get() == "\"public\"";
                }
                "nextCursor" => {
                    let raw = map.next_value::<&RawValue>()?;
                    page.next = serde_json::from_str::<String>(raw.get()).ok();
                }
                k if k == self.kind.field() => {
                    page.items = map.next_value_seed(ItemsSeed(self.kind))?.0;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(page))
    }
    skip_others!(seq, None);
}

/// The list field: the items of an array (anything else: none).
struct Items<'a>(Vec<Option<Item<'a>>>);

/// [`Items`] of a list of `kind`.
struct ItemsSeed(ListKind);

impl<'de> DeserializeSeed<'de> for ItemsSeed {
    type Value = Items<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed {
    type Value = Items<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items<'de>, A::Error> {
        use serde::de::Error;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(16).min(4096));
        // Each item's text, then (an object) its members read by serde from that text.
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            let text = raw.get();
            if !text.starts_with('{') {
                items.push(None);
                continue;
            }
            let Members(fields) =
                serde_json::from_str::<Members<'de>>(text).map_err(A::Error::custom)?;
            let mut item = Item::new(text);
            for (name, value) in fields {
                item.member(name == self.0.key(), value);
            }
            items.push(Some(item));
        }
        Ok(Items(items))
    }
    skip_others!(map, Items(Vec::new()));
}

/// A merged page.
#[derive(Debug, Default)]
pub struct Merged {
    /// The merged items as one JSON array text. Items are copied as the members wrote them;
    /// only a renamed item's name member is rewritten.
    pub items: Vec<u8>,
    /// How many items `items` holds.
    pub count: usize,
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
///
/// Works on the text, not on `Value` trees: the merged array is written from the items' raw
/// members, so a tool's schema is copied, never parsed into a tree and written again. An item
/// that is not an object or has no string key is left out (nothing to route it by).
pub fn merge_list(
    kind: ListKind,
    members: &[Naming],
    sep: &str,
    parts: &[PartPage<'_>],
) -> Result<Merged, Collision> {
    let mut out = Merged {
        ttl_ms: u64::MAX,
        ..Merged::default()
    };
    // The parts' lists as they were written, and room for the renames: the merged array is
    // written without growing (callgrind: six reallocations of a 6 KB merge otherwise).
    let room: usize = parts
        .iter()
        .map(|p| {
            let prefix = members
                .get(p.member)
                .map_or(0, |n| n.prefix.len() + sep.len());
            p.text_len + prefix * p.items.len()
        })
        .sum();
    out.items.reserve(room + 2);
    out.items.push(b'[');
    // A seeded fast hash, not SipHash: the names are the members' own, and a merge hashes
    // every item of every part (callgrind: SipHash was ~4 % of an uncached aggregated list).
    // Sized for every item up front: growing it rehashed three times a 3-member merge.
    let items: usize = parts.iter().map(|p| p.items.len()).sum();
    let mut seen: HashMap<String, usize, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(items, Default::default());
    out.owners.reserve(items);
    for part in parts {
        let Some(naming) = members.get(part.member) else {
            continue;
        };
        out.ttl_ms = out.ttl_ms.min(part.ttl_ms);
        out.private |= !part.public;
        if let Some(c) = &part.next {
            out.next.push((part.member, c.clone()));
        }
        for item in part.items.iter().flatten() {
            let Some(raw_key) = item.key else {
                continue; // malformed item: nothing to route it by
            };
            let Some(key) = string_of(raw_key.get()) else {
                continue;
            };
            if kind == ListKind::Tools && !naming.tool_allowed(&key) {
                continue;
            }
            let exposed = if kind.renamed() {
                naming.expose(sep, &key)
            } else {
                key.into_owned()
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
            if out.count > 0 {
                out.items.push(b',');
            }
            let rename = kind.renamed() && !naming.prefix.is_empty();
            write_item(&mut out.items, item, kind.key(), rename.then_some(&exposed));
            out.count += 1;
            seen.insert(exposed.clone(), part.member);
            out.owners.push((exposed, part.member));
        }
    }
    out.items.push(b']');
    if out.ttl_ms == u64::MAX {
        out.ttl_ms = 0;
    }
    Ok(out)
}

/// Writes an item as the member wrote it; with `rename`, every `key` member set to it.
fn write_item(out: &mut Vec<u8>, item: &Item<'_>, key: &str, rename: Option<&String>) {
    let Some(name) = rename else {
        out.extend_from_slice(item.text.as_bytes());
        return;
    };
    let text = item.text;
    if let (1, Some(at)) = (item.keys, item.key.and_then(|k| k.span_in(text)))
        && write_replaced(out, text.as_bytes(), at, name)
    {
        return;
    }
    // The key given more than once (rare): every one rewritten, member by member.
    // (The text was read as an object, so it reads again.)
    let Some(Members(fields)) = parse_members(text) else {
        out.extend_from_slice(text.as_bytes());
        return;
    };
    out.push(b'{');
    for (i, (field, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // A name as read (no escape to redo), a rewritten name escaped as it is written.
        write_key(out, field);
        out.push(b':');
        if field == key {
            write_str(out, name);
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    out.push(b'}');
}

/// A JSON string's text (`raw` is valid JSON): borrowed when it holds no escape, else
/// unescaped by serde; `None` when `raw` is not a string.
fn string_of(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Some(std::borrow::Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(raw)
            .ok()
            .map(std::borrow::Cow::Owned),
    }
}

/// A `ttlMs` as raw text: a non-negative integer, else 0 (as `Value::as_u64` reads it).
fn ttl_of(raw: &str) -> u64 {
    raw.trim().parse().unwrap_or(0)
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
        ttl = ttl.min(r.get("ttlMs").and_then(Value::as_u64).unwrap_or(0));
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

/// The longest URI [`template_matches`] reads: a resource URI is short, and the match is linear
/// in the URI's length per template, on every aggregated `resources/read` a client sends.
pub const MAX_TEMPLATE_URI_BYTES: usize = 16 * 1024;

/// Whether `uri` could come from an RFC 6570 template: literal text must match exactly; a
/// `{var}` expression matches any run without `/`, and a reserved (`{+var}`, `{#var}`) or
/// path-style expression any run at all. Good enough to pick the owner of a URI, which is all
/// it is used for. One pass per piece over the positions the pieces before it can reach, so
/// its cost is linear in the URI whatever the template (a backtracking match was exponential in
/// the number of expressions: a client's long URI could hold a worker for good). A URI over
/// [`MAX_TEMPLATE_URI_BYTES`] matches no template.
pub fn template_matches(template: &str, uri: &str) -> bool {
    if uri.len() > MAX_TEMPLATE_URI_BYTES {
        return false;
    }
    let bytes = uri.as_bytes();
    // `at[p]`: the pieces read so far can end at byte `p` of the URI.
    let mut at = vec![false; bytes.len() + 1];
    at[0] = true;
    let mut rest = template;
    let literal = |at: &mut Vec<bool>, lit: &str| {
        for p in (0..at.len()).rev() {
            at[p] = p >= lit.len()
                && at[p - lit.len()]
                && bytes[p - lit.len()..].starts_with(lit.as_bytes());
        }
    };
    loop {
        let Some(open) = rest.find('{') else {
            literal(&mut at, rest);
            return at[bytes.len()];
        };
        literal(&mut at, &rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let slash = rest[open + 1..].starts_with(['+', '#', '/', '.', ';', '?', '&']);
        // A variable extends every reachable end over any run (without `/` unless reserved),
        // ending on a character boundary.
        let mut open_run = false;
        for (p, reach) in at.iter_mut().enumerate() {
            open_run |= *reach;
            *reach = open_run && uri.is_char_boundary(p);
            if !slash && bytes.get(p) == Some(&b'/') {
                open_run = false;
            }
        }
        rest = &rest[open + close + 1..];
    }
}

#[cfg(test)]
mod tests;
