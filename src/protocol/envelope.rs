//! The envelope: the cheap view of a JSON-RPC message that routing, admission and the cache
//! read (method, id, the selected name, the `_meta` a key needs), taken in one pass over the
//! raw text — and the member-name audit that makes "forward what you judged" hold.

use std::ops::Range;

use super::*;

/// What kind of JSON-RPC message a body holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    /// A result or error (clients send these only in the legacy era, answering server requests).
    Response,
}

/// The parts of one JSON-RPC message that routing, header checks and cache keys need, read
/// without building a `serde_json::Value` of the whole body. Params stay raw.
#[derive(Debug)]
pub struct Envelope {
    pub kind: Kind,
    pub id: Option<RequestId>,
    pub method: String,
    /// `params.name` / `params.uri` / `params.taskId`, whichever `Mcp-Name` mirrors for this method.
    pub name: Option<String>,
    /// `params.cursor` as raw JSON, for list cache keys.
    pub cursor: Option<String>,
    /// `params._meta[protocolVersion]`.
    pub protocol_version: Option<String>,
    /// `params._meta[clientCapabilities]` as raw JSON.
    pub client_capabilities: Option<String>,
    /// `params._meta` was present at all.
    pub has_meta: bool,
    /// `params._meta.progressToken` is present.
    pub has_progress_token: bool,
    /// An MRTR retry (`inputResponses` or `requestState` present): never cached.
    pub is_retry: bool,
    /// `params` holds a member beyond the result's selector (`cursor`/`uri`) and `_meta`.
    pub params_beyond_selector: bool,
    /// `_meta` holds a member the cache key does not cover.
    pub meta_beyond_keyed: bool,
    /// `params._meta[clientInfo]` as raw JSON (part of the cache key).
    pub client_info: Option<String>,
    /// For `initialize`: the revision the client asked for.
    pub init_version: Option<String>,
    /// Where the members a bridge rewrites lie in the body, when it was read in one pass.
    pub spans: Option<Spans>,
}

/// Where, in a request's body, the values the era bridge and an aggregated endpoint rewrite lie
/// (byte offsets), so that they copy the rest as the client wrote it without reading the body
/// again (`bridge::translate::Upward`, `aggregate::call`). The levels they lie on were audited
/// (no member repeats), so each is the only one of its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    /// The length of the body they were found in.
    pub len: usize,
    /// The `id` value.
    pub id: Option<Range<usize>>,
    /// The selected name's value (`params.name`, `uri` or `taskId`, as `Envelope::name`), when
    /// it is a string.
    pub name: Option<Range<usize>>,
    /// `params._meta`, when it is an object.
    pub meta: Option<MetaSpan>,
}

/// `params._meta` in the body: its value, and from where the whole member can be cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaSpan {
    pub value: Range<usize>,
    /// The end of the member before it (so the cut takes the comma between), or, when `_meta`
    /// is the first member of `params`, the byte after `params`' `{` (the cut then takes the
    /// comma after the value, if another member follows).
    pub cut: usize,
    pub first: bool,
}

/// Why a body is not a single well-formed JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// Not JSON at all (`-32700`).
    Parse(String),
    /// A JSON array: batches were removed in 2025-06-18.
    Batch,
    /// JSON, but not a valid JSON-RPC message (`-32600`). Carries the id when one was readable.
    Invalid(String, Option<RequestId>),
}

// === Forward what you judged: member-name audit ===
//
// portico decides on what its strict, case-sensitive parser reads; a backend may read the same
// bytes differently (Go's encoding/json matches member names case-insensitively with Unicode
// folding, many parsers take the last of duplicate keys). So at every level portico inspects,
// a body is refused (400 -32600) when a member name repeats, or when a name that is not a
// protocol member equals one under case folding (`"Params"`, `"paramſ"`): then every reader
// agrees with portico's, and the backend gets bytes that mean what portico judged (README
// "Security model").

/// Protocol members of a message's top level.
pub(super) const TOP_MEMBERS: &[&str; 6] =
    &["jsonrpc", "id", "method", "params", "result", "error"];
/// Protocol members of `params` that portico (or a backend) reads.
pub(super) const PARAMS_MEMBERS: &[&str] = &[
    "name",
    "uri",
    "taskId",
    "cursor",
    "_meta",
    "arguments",
    "inputResponses",
    "requestState",
    "protocolVersion",
    "capabilities",
    "clientInfo",
    "ref",
    "argument",
    "level",
    "notifications",
];
/// The params a cacheable request may carry and still be cached: what selects the result (a
/// list's cursor, a read's uri) and `_meta`. Anything else might shape the answer, and is not in
/// the cache key: such a request goes around the cache.
pub(super) const SELECTOR_PARAMS: &[&str] = &["cursor", "uri", "_meta"];
/// The `_meta` members a cacheable request may carry and still be cached: those in the key
/// (version, capabilities, clientInfo) and those that never shape a result.
pub(super) const KEYED_META: &[&str] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    meta::LOG_LEVEL,
    "progressToken",
];
/// The `params` members an envelope reads, in the order `parse_envelope` takes them apart.
pub(super) const WANTED_PARAMS: &[&str; 8] = &[
    "name",
    "uri",
    "taskId",
    "cursor",
    "_meta",
    "inputResponses",
    "requestState",
    "protocolVersion",
];
/// The `_meta` members an envelope reads.
pub(super) const WANTED_META: &[&str; 4] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    "progressToken",
];
/// Protocol members of `_meta`.
pub(super) const META_MEMBERS: &[&str] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    meta::LOG_LEVEL,
    meta::SUBSCRIPTION_ID,
    "progressToken",
];

/// A member name under Unicode case folding (upper then lower, so `ſ` → `s`, `K` → `k`).
pub(super) fn fold(name: &str) -> String {
    name.chars()
        .flat_map(char::to_uppercase)
        .flat_map(char::to_lowercase)
        .collect()
}

/// One JSON object read in a single pass: the member audit (see the comment above), whether it
/// has a member outside `plain` (which the cache needs to know: such a member may shape the
/// answer), and the raw values of the members named in `wanted`, borrowed from the text.
/// Reading and auditing in one pass matters on the paths that read every request's envelope
/// (the bridge, `verify_body`): two passes per level cost ~9 k instructions of a bridged
/// `tools/call`'s ~76 k (callgrind, issue #23 item 2).
#[derive(Debug, PartialEq)]
pub(super) struct Object<'de, const N: usize> {
    beyond: bool,
    /// `None` for a member that is absent; a `null` is kept (see [`non_null`]).
    values: [Option<Raw<'de>>; N],
}

/// One level of a message as the audit reads it: its protocol members, which of them leave it
/// "plain" (bit `i` for `members[i]`), and for each wanted value the index of its member.
/// Built at compile time from name lists, so that a member's name is compared once, with the
/// member list, and the rest is bit tests (callgrind: ~28 string comparisons a checked request
/// before, when each list was searched by name).
pub(super) struct Level<const N: usize> {
    members: &'static [&'static str],
    plain: u32,
    wanted: [usize; N],
}

impl<const N: usize> Level<N> {
    const fn new(members: &'static [&'static str], plain: &[&str], wanted: &[&str; N]) -> Level<N> {
        assert!(members.len() <= 32, "a level's members are bits of a u32");
        let mut mask = 0;
        let mut i = 0;
        while i < plain.len() {
            mask |= 1 << index_of(members, plain[i]);
            i += 1;
        }
        let mut at = [0; N];
        let mut j = 0;
        while j < N {
            at[j] = index_of(members, wanted[j]);
            j += 1;
        }
        Level {
            members,
            plain: mask,
            wanted: at,
        }
    }
}

/// Where `name` is in `members` (compile time: a name that is not there fails the build).
pub(super) const fn index_of(members: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < members.len() {
        let (m, n) = (members[i].as_bytes(), name.as_bytes());
        if m.len() == n.len() {
            let mut k = 0;
            while k < m.len() && m[k] == n[k] {
                k += 1;
            }
            if k == m.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("a plain or wanted name that is not a member of its level")
}

/// The top level: every member is plain, each is wanted.
pub(super) const TOP: Level<6> = Level::new(TOP_MEMBERS, TOP_MEMBERS, TOP_MEMBERS);
pub(super) const PARAMS: Level<8> = Level::new(PARAMS_MEMBERS, SELECTOR_PARAMS, WANTED_PARAMS);
pub(super) const META: Level<4> = Level::new(META_MEMBERS, KEYED_META, WANTED_META);

/// What one object's members add up to, member by member ([`Object`]): the first refusal is
/// kept, the rest of the object still read.
pub(super) struct Judge<'de, const N: usize> {
    level: &'static Level<N>,
    /// Protocol members met so far (bit `i` for `level.members[i]`).
    known: u32,
    /// Other names met so far; an envelope's levels have few, kept off the heap.
    others: SmallVec<[Key<'de>; 4]>,
    refused: Option<String>,
    out: Object<'de, N>,
}

impl<'de, const N: usize> Judge<'de, N> {
    fn new(level: &'static Level<N>) -> Self {
        Judge {
            level,
            known: 0,
            others: SmallVec::new(),
            refused: None,
            out: Object {
                beyond: false,
                values: [None; N],
            },
        }
    }

    /// One member: its value kept when it is wanted, its name audited.
    fn member(&mut self, key: Key<'de>, value: Raw<'de>) {
        let members = self.level.members;
        let Some(i) = members.iter().position(|m| *m == key.as_str()) else {
            self.out.beyond = true;
            if self.refused.is_some() {
                return;
            }
            if self.others.contains(&key) {
                self.refused = Some(format!("member {key:?} appears twice"));
                return;
            }
            // ASCII names that are not members fold to nothing of interest unless they
            // differ from a member only in case; the fold is computed only for those.
            if !key.is_ascii() || members.iter().any(|m| m.eq_ignore_ascii_case(&key)) {
                let folded = fold(&key);
                if let Some(m) = members.iter().find(|m| fold(m) == folded) {
                    self.refused = Some(format!(
                        "member {key:?} differs from the protocol member {m:?} only in case"
                    ));
                    return;
                }
            }
            self.others.push(key);
            return;
        };
        let bit = 1 << i;
        self.out.beyond |= self.level.plain & bit == 0;
        if let Some(slot) = self.level.wanted.iter().position(|w| *w == i) {
            self.out.values[slot] = Some(value);
        }
        if self.refused.is_none() && self.known & bit != 0 {
            self.refused = Some(format!("member {key:?} appears twice"));
        }
        self.known |= bit;
    }

    fn end(self) -> Result<Object<'de, N>, String> {
        match self.refused {
            Some(why) => Err(why),
            None => Ok(self.out),
        }
    }
}

/// Reads the object that is all of `text` by serde: `Err` when it is not JSON or not an object
/// (serde's words), `Ok(Err)` with the audit's words when a member name is refused. The whole
/// object is read either way, so broken JSON after a refused name is still a parse error. Text
/// the scanner refused ([`read_levels`]) comes here, for the words of its error; valid text only
/// in [`levels_agree`], as the reference.
pub(super) fn read_object<'de, const N: usize>(
    text: &'de str,
    level: &'static Level<N>,
) -> Result<Result<Object<'de, N>, String>, serde_json::Error> {
    let judge = Judge::new(level);
    struct Read<'de, const N: usize>(Judge<'de, N>);
    impl<'de, const N: usize> serde::de::Visitor<'de> for Read<'de, N> {
        type Value = Result<Object<'de, N>, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            mut self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            while let Some((key, value)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                self.0.member(key, Raw::from(value));
            }
            Ok(self.0.end())
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let object = serde::Deserializer::deserialize_map(&mut de, Read(judge))?;
    de.end()?;
    Ok(object)
}

/// A member's value unless it is `null`, which the protocol reads as absent (except for `id`).
pub(super) fn non_null(v: Option<Raw<'_>>) -> Option<Raw<'_>> {
    v.filter(|v| v.get() != "null")
}

/// [`read_object`] on a nested object's text (already checked to be JSON), its failures as
/// words.
pub(super) fn read_nested<'de, const N: usize>(
    text: &'de str,
    level: &'static Level<N>,
) -> Result<Object<'de, N>, String> {
    read_object(text, level).map_err(|e| e.to_string())?
}

/// The three levels an envelope reads, judged in one pass over valid JSON ([`read_levels`]):
/// `params` and its `_meta` are read where they lie (the last of each, as the level above keeps
/// the last value of a name; a repeated name is refused there anyway), not skipped as values
/// and scanned again as objects. `None` for a level that is absent or not an object.
pub(super) struct Levels<'de> {
    top: Result<Object<'de, 6>, String>,
    params: Option<Result<Object<'de, 8>, String>>,
    meta: Option<Result<Object<'de, 4>, String>>,
    /// Where an object `_meta` member of `params` can be cut from ([`MetaSpan`]).
    meta_cut: Option<(usize, bool)>,
}

/// [`Levels`] of a message that is valid JSON (`None` otherwise: [`read_object`] and
/// [`read_nested`] then read it level by level, serde giving a parse error its words). Each
/// level is judged as [`read_object`] judges it; what is refused first is decided by
/// `parse_envelope`, in the same order either way. Reading `params` and `_meta` in place saves
/// rescanning them (callgrind, `verify_body = "always"`: README "Benchmarks").
pub(super) fn read_levels(text: &str) -> Option<Levels<'_>> {
    let mut top = Judge::new(&TOP);
    let mut params = None;
    let mut meta = None;
    let mut meta_cut = None;
    scan_members(text, |key, at| {
        let read = if key == "params" && at.is_object() {
            // The end of the member before the one being read (none yet: after the `{`).
            let mut before = (at.start() + 1, true);
            let (read, judged) = judge_in_place(at, &PARAMS, |key, at| {
                let read = if key != "_meta" || !at.is_object() {
                    at.skip()?
                } else {
                    let (read, judged) = judge_in_place(at, &META, |_, at| at.skip())?;
                    meta = Some(judged);
                    meta_cut = Some(before);
                    read
                };
                before = (read.end(), false);
                Some(read)
            })?;
            params = Some(judged);
            read
        } else {
            at.skip()?
        };
        top.member(key, read.raw());
        Some(read)
    })?;
    Some(Levels {
        top: top.end(),
        params,
        meta,
        meta_cut,
    })
}

/// The object at `at` read and judged as one `level`, each value read by `value` (skipped, or
/// a nested level judged in place).
pub(super) fn judge_in_place<'de, const N: usize>(
    at: At<'de>,
    level: &'static Level<N>,
    mut value: impl FnMut(&Key<'de>, At<'de>) -> Option<Read<'de>>,
) -> Option<(Read<'de>, Result<Object<'de, N>, String>)> {
    let mut judge = Judge::new(level);
    let read = at.members(|key, at| {
        let read = value(&key, at)?;
        judge.member(key, read.raw());
        Some(read)
    })?;
    Some((read, judge.end()))
}

/// Whether [`read_levels`] judges `text` as serde, reading level by level, judges it (the same
/// values, the same refusal); panics on a disagreement, naming the text. The unit tests' and the
/// fuzz harness's check of the one-pass reading. Returns whether the text was read.
pub fn levels_agree(text: &str) -> bool {
    let Some(one_pass) = read_levels(text) else {
        return false;
    };
    fn object(v: Option<Raw<'_>>) -> Option<Raw<'_>> {
        non_null(v).filter(|v| v.get().starts_with('{'))
    }
    let by_serde = read_object(text, &TOP).expect("serde reads what the scanner reads");
    let params = by_serde.as_ref().ok().and_then(|top| object(top.values[3]));
    let params = params.map(|p| read_nested(p.get(), &PARAMS));
    let meta = match &params {
        Some(Ok(p)) => object(p.values[4]).map(|m| read_nested(m.get(), &META)),
        _ => None,
    };
    assert_eq!(one_pass.top, by_serde, "top level of {text:?}");
    if by_serde.is_ok() {
        assert_eq!(one_pass.params, params, "params of {text:?}");
        if matches!(params, Some(Ok(_))) {
            assert_eq!(one_pass.meta, meta, "_meta of {text:?}");
        }
    }
    true
}

/// First non-whitespace byte of a body; the cheapest batch and garbage detector.
pub fn first_byte(body: &[u8]) -> Option<u8> {
    body.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// Reads the envelope of one JSON-RPC message.
pub fn parse_envelope(body: &[u8]) -> Result<Envelope, EnvelopeError> {
    match first_byte(body) {
        Some(b'[') => {
            // Still must be JSON to be called a batch; otherwise it is a parse error.
            return match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => Err(EnvelopeError::Batch),
                Err(e) => Err(EnvelopeError::Parse(e.to_string())),
            };
        }
        Some(b'{') => {}
        None => return Err(EnvelopeError::Parse("empty body".into())),
        Some(_) => {
            return match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => Err(EnvelopeError::Invalid(
                    "a JSON-RPC message must be a JSON object".into(),
                    None,
                )),
                Err(e) => Err(EnvelopeError::Parse(e.to_string())),
            };
        }
    }
    let text = std::str::from_utf8(body).map_err(|e| EnvelopeError::Parse(e.to_string()))?;
    // One pass for valid JSON; text the scanner refuses is read level by level, serde giving
    // the words of the parse error.
    let (
        Levels {
            top,
            params,
            meta,
            meta_cut,
        },
        one_pass,
    ) = match read_levels(text) {
        Some(levels) => (levels, true),
        None => (
            Levels {
                meta_cut: None,
                top: match read_object(text, &TOP) {
                    Ok(top) => top,
                    Err(e) if e.is_syntax() || e.is_eof() => {
                        return Err(EnvelopeError::Parse(e.to_string()));
                    }
                    Err(e) => return Err(EnvelopeError::Invalid(e.to_string(), None)),
                },
                params: None,
                meta: None,
            },
            false,
        ),
    };
    let (read_params, read_meta) = (params, meta);
    let top = top.map_err(|e| EnvelopeError::Invalid(e, None))?;
    let [jsonrpc, id, method, params, result, error] = top.values;
    let [jsonrpc, method, params, result, error] =
        [jsonrpc, method, params, result, error].map(non_null);
    let id_span = id.and_then(|raw| raw.span_in(text));
    // A present but null id is kept as such, so that it is refused here.
    let id = match id {
        None => None,
        Some(raw) => match RequestId::of(raw) {
            Some(id) => Some(id),
            None => {
                return Err(EnvelopeError::Invalid(
                    "id must be a string or an integer".into(),
                    None,
                ));
            }
        },
    };
    let invalid = |m: &str| EnvelopeError::Invalid(m.to_string(), id.clone());
    if jsonrpc.and_then(raw_str).as_deref() != Some("2.0") {
        return Err(invalid("jsonrpc must be \"2.0\""));
    }
    let Some(method) = method else {
        if result.is_some() || error.is_some() {
            if id.is_none() {
                return Err(invalid("a response needs an id"));
            }
            return Ok(Envelope::response(id));
        }
        return Err(invalid("missing method"));
    };
    let Some(method) = raw_str(method) else {
        return Err(invalid("method must be a string"));
    };
    let kind = if id.is_some() {
        Kind::Request
    } else {
        Kind::Notification
    };
    let mut env = Envelope::new(kind, id, method.into_owned());
    // Read in one pass: the scan knows where `_meta` can be cut.
    env.spans = one_pass.then_some(Spans {
        len: body.len(),
        id: id_span,
        name: None,
        meta: None,
    });
    let Some(params) = params else {
        return Ok(env);
    };
    if first_byte(params.get().as_bytes()) != Some(b'{') {
        return Err(EnvelopeError::Invalid(
            "params must be an object".into(),
            env.id,
        ));
    }
    let p = read_params
        .unwrap_or_else(|| read_nested(params.get(), &PARAMS))
        .map_err(|e| EnvelopeError::Invalid(format!("params: {e}"), env.id.clone()))?;
    env.params_beyond_selector = p.beyond;
    let [
        name,
        uri,
        task_id,
        cursor,
        meta,
        input_responses,
        request_state,
        protocol_version,
    ] = p.values.map(non_null);
    if let Some(field) = name_field(&env.method) {
        let raw = match field {
            "name" => name,
            "uri" => uri,
            _ => task_id,
        };
        env.name = raw.and_then(json_string);
        if let (Some(spans), Some(_), Some(raw)) = (&mut env.spans, &env.name, raw) {
            spans.name = raw.span_in(text);
        }
    }
    env.cursor = cursor.map(|c| c.get().to_string());
    env.is_retry = input_responses.is_some() || request_state.is_some();
    if env.method == "initialize" {
        env.init_version = protocol_version.and_then(json_string);
    }
    if let Some(meta) = meta
        && first_byte(meta.get().as_bytes()) == Some(b'{')
    {
        env.has_meta = true;
        let m = read_meta
            .unwrap_or_else(|| read_nested(meta.get(), &META))
            .map_err(|e| EnvelopeError::Invalid(format!("_meta: {e}"), env.id.clone()))?;
        env.meta_beyond_keyed = m.beyond;
        let [
            protocol_version,
            client_capabilities,
            client_info,
            progress_token,
        ] = m.values.map(non_null);
        env.protocol_version = protocol_version.and_then(json_string);
        env.client_capabilities = client_capabilities
            .filter(|c| first_byte(c.get().as_bytes()) == Some(b'{'))
            .map(|c| c.get().to_string());
        env.has_progress_token = progress_token.is_some();
        env.client_info = client_info.map(|c| c.get().to_string());
        if let (Some(spans), Some((cut, first)), Some(value)) =
            (&mut env.spans, meta_cut, meta.span_in(text))
        {
            spans.meta = Some(MetaSpan { value, cut, first });
        }
    }
    Ok(env)
}

impl Envelope {
    fn response(id: Option<RequestId>) -> Envelope {
        Envelope::new(Kind::Response, id, String::new())
    }

    /// A message of `kind` with nothing read beyond its id and method.
    fn new(kind: Kind, id: Option<RequestId>, method: String) -> Envelope {
        Envelope {
            kind,
            id,
            method,
            name: None,
            cursor: None,
            protocol_version: None,
            client_capabilities: None,
            has_meta: false,
            has_progress_token: false,
            is_retry: false,
            params_beyond_selector: false,
            meta_beyond_keyed: false,
            client_info: None,
            init_version: None,
            spans: None,
        }
    }
}

pub(super) fn json_string(raw: Raw<'_>) -> Option<String> {
    raw_str(raw).map(Cow::into_owned)
}

/// A raw JSON value as the string it is (`None`: not a string). Without escapes it is the text
/// between the quotes, not copied.
pub(super) fn raw_str(raw: Raw<'_>) -> Option<Cow<'_, str>> {
    let t = raw.get();
    let inner = t.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(t).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}
