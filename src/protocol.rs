//! MCP and JSON-RPC vocabulary: header names, versions, error codes, request ids, and the cheap
//! "envelope" view of a message that the gateway uses to route and check requests.
//!
//! Pure: no IO, no clock, no globals. Everything here is safe to call on hostile input — parsers
//! return errors, never panic — which is why the fuzz targets start here.

use serde::Deserialize;

use crate::jsonrpc::{At, Key, Raw, Read, scan_members};
pub use crate::jsonrpc::{RequestId, code, error_body};
use serde_json::value::RawValue;
use smallvec::SmallVec;
use std::borrow::Cow;

/// The revision portico speaks natively (and asks modern backends for).
pub const LATEST_VERSION: &str = "2026-07-28";
/// Initialize-era revisions portico can serve to legacy clients and speak to legacy backends,
/// newest first (the order `initialize` offers them in).
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// What `server/discover` advertises: portico serves both eras on every endpoint.
pub const SUPPORTED_VERSIONS: [&str; 4] =
    [LATEST_VERSION, "2025-11-25", "2025-06-18", "2025-03-26"];

/// Reserved `_meta` keys (exact spelling from the 2026-07-28 schema).
pub mod meta {
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
}

/// HTTP header names, lower-case as `http` wants them.
pub mod header {
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    pub const METHOD: &str = "mcp-method";
    pub const NAME: &str = "mcp-name";
    pub const SESSION_ID: &str = "mcp-session-id";
    pub const PARAM_PREFIX: &str = "mcp-param-";

    /// The same names as `HeaderName`s, built at compile time: a lookup or insert by `&str`
    /// (or a `from_static` call at run time) parses and validates the name on every request.
    pub mod names {
        use http::HeaderName;
        pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static(super::PROTOCOL_VERSION);
        pub const METHOD: HeaderName = HeaderName::from_static(super::METHOD);
        pub const NAME: HeaderName = HeaderName::from_static(super::NAME);
        pub const SESSION_ID: HeaderName = HeaderName::from_static(super::SESSION_ID);
    }
}

/// Which revisions define a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eras {
    /// 2026-07-28 only (e.g. `server/discover`, `subscriptions/listen`).
    Modern,
    /// The initialize era only: removed in 2026-07-28 (docs/protocol.md §2).
    Legacy,
    Both,
}

/// What portico knows about one method.
#[derive(Clone, Copy, Debug)]
pub struct MethodInfo {
    pub name: &'static str,
    pub eras: Eras,
    /// The body field `Mcp-Name` mirrors, if any.
    pub name_field: Option<&'static str>,
    /// Its `complete` results carry `ttlMs`/`cacheScope` (docs/protocol.md §2); such a method changes
    /// nothing upstream, so it is also safe to retry.
    pub cacheable: bool,
}

const fn m(
    name: &'static str,
    eras: Eras,
    name_field: Option<&'static str>,
    cacheable: bool,
) -> MethodInfo {
    MethodInfo {
        name,
        eras,
        name_field,
        cacheable,
    }
}

/// The one list of methods, per era. Anything else is `"other"` in metrics, so a client can
/// never mint label values.
pub const METHODS: &[MethodInfo] = &[
    m("server/discover", Eras::Modern, None, true),
    m("tools/list", Eras::Both, None, true),
    m("tools/call", Eras::Both, Some("name"), false),
    m("prompts/list", Eras::Both, None, true),
    m("prompts/get", Eras::Both, Some("name"), false),
    m("resources/list", Eras::Both, None, true),
    m("resources/templates/list", Eras::Both, None, true),
    m("resources/read", Eras::Both, Some("uri"), true),
    m("completion/complete", Eras::Both, None, false),
    m("subscriptions/listen", Eras::Modern, None, false),
    m("tasks/get", Eras::Both, Some("taskId"), false),
    m("tasks/update", Eras::Both, Some("taskId"), false),
    m("tasks/cancel", Eras::Both, Some("taskId"), false),
    m("initialize", Eras::Legacy, None, false),
    m("ping", Eras::Legacy, None, false),
    m("logging/setLevel", Eras::Legacy, None, false),
    m("resources/subscribe", Eras::Legacy, None, false),
    m("resources/unsubscribe", Eras::Legacy, None, false),
    m("notifications/initialized", Eras::Legacy, None, false),
    m("notifications/cancelled", Eras::Both, None, false),
];

/// What portico knows of `method`, if it knows it.
pub fn method_info(method: &str) -> Option<&'static MethodInfo> {
    METHODS.iter().find(|m| m.name == method)
}

/// The metric label for a method name: itself when known, else `"other"`.
pub fn method_label(method: &str) -> &'static str {
    method_info(method).map_or("other", |m| m.name)
}

/// Methods whose `Mcp-Name` header mirrors a body field, and which field.
pub fn name_field(method: &str) -> Option<&'static str> {
    method_info(method).and_then(|m| m.name_field)
}

/// Methods whose `complete` results carry `ttlMs`/`cacheScope` (docs/protocol.md §2).
pub fn is_cacheable_method(method: &str) -> bool {
    method_info(method).is_some_and(|m| m.cacheable)
}

/// Methods whose repetition changes nothing upstream: safe to retry after a connect failure.
pub fn is_idempotent(method: &str) -> bool {
    is_cacheable_method(method)
}

/// Methods the initialize era has and 2026-07-28 removed (docs/protocol.md §2).
pub fn is_removed_in_modern(method: &str) -> bool {
    method_info(method).is_some_and(|m| m.eras == Eras::Legacy)
}

/// `LoggingLevel`s from least to most severe (RFC 5424 order): a client asking for one gets it
/// and everything after it.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// A `LoggingLevel`'s rank in [`LOG_LEVELS`] (`None`: not a level).
pub fn log_rank(level: &str) -> Option<u8> {
    LOG_LEVELS.iter().position(|l| *l == level).map(|i| i as u8)
}

/// Whether `v` is an initialize-era revision portico can speak.
pub fn is_legacy_version(v: &str) -> bool {
    LEGACY_VERSIONS.contains(&v) || v == "2024-11-05"
}

/// HTTP status for a JSON-RPC error code that portico itself synthesises or bridges (the spec
/// fixes only some of these; docs/protocol.md §4 and §8 item 9).
pub fn status_for_code(code: i64) -> u16 {
    match code {
        code::PARSE_ERROR | code::INVALID_REQUEST | code::INVALID_PARAMS => 400,
        code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH => 400,
        code::METHOD_NOT_FOUND => 404,
        _ => 200,
    }
}

// === Envelope: the cheap view of a message ===

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
const TOP_MEMBERS: &[&str; 6] = &["jsonrpc", "id", "method", "params", "result", "error"];
/// Protocol members of `params` that portico (or a backend) reads.
const PARAMS_MEMBERS: &[&str] = &[
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
const SELECTOR_PARAMS: &[&str] = &["cursor", "uri", "_meta"];
/// The `_meta` members a cacheable request may carry and still be cached: those in the key
/// (version, capabilities, clientInfo) and those that never shape a result.
const KEYED_META: &[&str] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    meta::LOG_LEVEL,
    "progressToken",
];
/// The `params` members an envelope reads, in the order `parse_envelope` takes them apart.
const WANTED_PARAMS: &[&str; 8] = &[
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
const WANTED_META: &[&str; 4] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    "progressToken",
];
/// Protocol members of `_meta`.
const META_MEMBERS: &[&str] = &[
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    meta::LOG_LEVEL,
    meta::SUBSCRIPTION_ID,
    "progressToken",
];

/// A member name under Unicode case folding (upper then lower, so `ſ` → `s`, `K` → `k`).
fn fold(name: &str) -> String {
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
struct Object<'de, const N: usize> {
    beyond: bool,
    /// `None` for a member that is absent; a `null` is kept (see [`non_null`]).
    values: [Option<Raw<'de>>; N],
}

/// One level of a message as the audit reads it: its protocol members, which of them leave it
/// "plain" (bit `i` for `members[i]`), and for each wanted value the index of its member.
/// Built at compile time from name lists, so that a member's name is compared once, with the
/// member list, and the rest is bit tests (callgrind: ~28 string comparisons a checked request
/// before, when each list was searched by name).
struct Level<const N: usize> {
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
const fn index_of(members: &[&str], name: &str) -> usize {
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
const TOP: Level<6> = Level::new(TOP_MEMBERS, TOP_MEMBERS, TOP_MEMBERS);
const PARAMS: Level<8> = Level::new(PARAMS_MEMBERS, SELECTOR_PARAMS, WANTED_PARAMS);
const META: Level<4> = Level::new(META_MEMBERS, KEYED_META, WANTED_META);

/// What one object's members add up to, member by member ([`Object`]): the first refusal is
/// kept, the rest of the object still read.
struct Judge<'de, const N: usize> {
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
fn read_object<'de, const N: usize>(
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
fn non_null(v: Option<Raw<'_>>) -> Option<Raw<'_>> {
    v.filter(|v| v.get() != "null")
}

/// [`read_object`] on a nested object's text (already checked to be JSON), its failures as
/// words.
fn read_nested<'de, const N: usize>(
    text: &'de str,
    level: &'static Level<N>,
) -> Result<Object<'de, N>, String> {
    read_object(text, level).map_err(|e| e.to_string())?
}

/// The three levels an envelope reads, judged in one pass over valid JSON ([`read_levels`]):
/// `params` and its `_meta` are read where they lie (the last of each, as the level above keeps
/// the last value of a name; a repeated name is refused there anyway), not skipped as values
/// and scanned again as objects. `None` for a level that is absent or not an object.
struct Levels<'de> {
    top: Result<Object<'de, 6>, String>,
    params: Option<Result<Object<'de, 8>, String>>,
    meta: Option<Result<Object<'de, 4>, String>>,
}

/// [`Levels`] of a message that is valid JSON (`None` otherwise: [`read_object`] and
/// [`read_nested`] then read it level by level, serde giving a parse error its words). Each
/// level is judged as [`read_object`] judges it; what is refused first is decided by
/// `parse_envelope`, in the same order either way. Reading `params` and `_meta` in place saves
/// rescanning them (callgrind, `verify_body = "always"`: README "Benchmarks").
fn read_levels(text: &str) -> Option<Levels<'_>> {
    let mut top = Judge::new(&TOP);
    let mut params = None;
    let mut meta = None;
    scan_members(text, |key, at| {
        let read = if key == "params" && at.is_object() {
            let (read, judged) = judge_in_place(at, &PARAMS, |key, at| {
                if key != "_meta" || !at.is_object() {
                    return at.skip();
                }
                let (read, judged) = judge_in_place(at, &META, |_, at| at.skip())?;
                meta = Some(judged);
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
    })
}

/// The object at `at` read and judged as one `level`, each value read by `value` (skipped, or
/// a nested level judged in place).
fn judge_in_place<'de, const N: usize>(
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
    let Levels { top, params, meta } = match read_levels(text) {
        Some(levels) => levels,
        None => Levels {
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
    };
    let (read_params, read_meta) = (params, meta);
    let top = top.map_err(|e| EnvelopeError::Invalid(e, None))?;
    let [jsonrpc, id, method, params, result, error] = top.values;
    let [jsonrpc, method, params, result, error] =
        [jsonrpc, method, params, result, error].map(non_null);
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
    let mut env = Envelope {
        kind,
        id,
        method: method.into_owned(),
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
    };
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
    }
    Ok(env)
}

impl Envelope {
    fn response(id: Option<RequestId>) -> Envelope {
        Envelope {
            kind: Kind::Response,
            id,
            method: String::new(),
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
        }
    }
}

fn json_string(raw: Raw<'_>) -> Option<String> {
    raw_str(raw).map(Cow::into_owned)
}

/// A raw JSON value as the string it is (`None`: not a string). Without escapes it is the text
/// between the quotes, not copied.
fn raw_str(raw: Raw<'_>) -> Option<Cow<'_, str>> {
    let t = raw.get();
    let inner = t.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(t).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// portico's own name and version, as `serverInfo`/`clientInfo` carry them.
pub fn portico_info() -> serde_json::Value {
    serde_json::json!({"name": "portico", "version": env!("CARGO_PKG_VERSION")})
}

/// The `server/discover` portico sends on its own account (the era probe, health checks): a
/// well-formed 2026-07-28 request, harmless to a server of either era. The one builder of it.
pub fn discover_probe(id: &str) -> bytes::Bytes {
    let msg = serde_json::json!({"jsonrpc":"2.0","id":id,"method":"server/discover","params":{"_meta":{
        meta::PROTOCOL_VERSION: LATEST_VERSION,
        meta::CLIENT_CAPABILITIES: {},
        meta::CLIENT_INFO: portico_info(),
    }}});
    bytes::Bytes::from(serde_json::to_vec(&msg).unwrap_or_default())
}

/// The HTTP headers of [`discover_probe`].
pub fn discover_probe_headers() -> Vec<(http::HeaderName, http::HeaderValue)> {
    use http::HeaderValue;
    vec![
        (
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        ),
        (
            header::names::PROTOCOL_VERSION,
            HeaderValue::from_static(LATEST_VERSION),
        ),
        (
            header::names::METHOD,
            HeaderValue::from_static("server/discover"),
        ),
    ]
}

/// A substring a message is tested for before it is parsed: most messages lack it and skip
/// the parse (a byte-window scan cost ~13 instructions a byte; callgrind, bridged
/// `tools/call`). The searcher is built once, on first use: building one costs more than a
/// search.
pub struct Needle(std::sync::LazyLock<memchr::memmem::Finder<'static>>);

impl Needle {
    pub const fn new(build: fn() -> memchr::memmem::Finder<'static>) -> Needle {
        Needle(std::sync::LazyLock::new(build))
    }

    /// Whether the needle occurs in `hay`.
    pub fn is_in(&self, hay: &[u8]) -> bool {
        self.find(hay).is_some()
    }

    /// Where the needle first occurs in `hay`.
    pub fn find(&self, hay: &[u8]) -> Option<usize> {
        self.0.find(hay)
    }
}

/// The requests a server may send a client during a call, with the client capability each
/// needs (digest §2: embedded input requests). The bridge relays or parks them; the stdio
/// transport routes them to the call they belong to.
pub const INPUT_REQUESTS: [(&str, &str); 3] = [
    ("elicitation/create", "elicitation"),
    ("sampling/createMessage", "sampling"),
    ("roots/list", "roots"),
];

/// The capability a server request needs, when it is one a client can be asked.
pub fn input_capability(method: &str) -> Option<&'static str> {
    INPUT_REQUESTS
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, c)| *c)
}

/// The members that make a JSON-RPC message a response — `method`, `result`, `error` — as a
/// one-pass reader meets them (the upstream's answer check, an aggregated list's reading), read
/// as serde's derive reads them: a `null` is absent, a name given twice makes no message.
#[derive(Default)]
pub struct ResponseMembers {
    seen: [bool; 3],
    present: [bool; 3],
    twice: bool,
}

impl ResponseMembers {
    /// Notes one top-level member, `value` its JSON text (other names are not counted).
    pub fn note(&mut self, name: &str, value: &str) {
        let i = match name {
            "method" => 0,
            "result" => 1,
            "error" => 2,
            _ => return,
        };
        self.twice |= std::mem::replace(&mut self.seen[i], true);
        self.present[i] = value != "null";
    }

    /// `method`, `result` or `error` given twice: no JSON-RPC message.
    pub fn repeated(&self) -> bool {
        self.twice
    }

    /// A `method` that is not null: a request or a notification, not a response.
    pub fn has_method(&self) -> bool {
        self.present[0]
    }

    /// No method, and a result or an error.
    pub fn is_response(&self) -> bool {
        let [method, result, error] = self.present;
        !method && (result || error)
    }
}

/// Whether a decoded message is a JSON-RPC response (the end of an answer) rather than a
/// notification about the request.
pub fn is_response(msg: &[u8]) -> bool {
    matches!(parse_envelope(msg), Ok(e) if e.kind == Kind::Response)
}

/// Reads just the id of a message, for echoing it in an error built after the fact.
pub fn sniff_id(body: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    if first_byte(body) != Some(b'{') {
        return None;
    }
    let m: IdOnly = serde_json::from_slice(body).ok()?;
    m.id.and_then(RequestId::from_raw)
}

// === Header values ===

/// Decodes an `Mcp-Name` / `Mcp-Param-*` header value: plain visible ASCII, or the
/// `=?base64?…?=` form for anything else (docs/protocol.md §4). `None` when the value is invalid.
pub fn decode_header_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    use base64::Engine;
    if let Some(inner) = raw
        .strip_prefix(b"=?base64?")
        .and_then(|r| r.strip_suffix(b"?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    let valid = !raw.is_empty()
        && raw.iter().all(|b| (0x20..0x7f).contains(b))
        && raw.first() != Some(&b' ')
        && raw.last() != Some(&b' ');
    if !valid {
        return None;
    }
    // The plain form (the usual one) is borrowed, not copied.
    std::str::from_utf8(raw).ok().map(Cow::Borrowed)
}

/// Encodes a value for an `Mcp-Name` header, using the base64 form when plain ASCII won't do.
pub fn encode_header_value(value: &str) -> String {
    use base64::Engine;
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| (0x21..0x7f).contains(&b) || b == b' ')
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with("=?base64?");
    if plain {
        value.to_string()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value.as_bytes())
        )
    }
}

/// Whether an `Accept` header admits both JSON and SSE (an absent header admits anything).
pub fn accept_ok(accept: Option<&[u8]>) -> bool {
    let Some(accept) = accept else { return true };
    // What the SDKs send, verbatim: settled without splitting.
    if accept == b"application/json, text/event-stream"
        || accept == b"text/event-stream, application/json"
    {
        return true;
    }
    let (mut json, mut sse) = (false, false);
    for range in accept.split(|b| *b == b',') {
        let media = range
            .split(|b| *b == b';')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        let is = |m: &[u8]| media.eq_ignore_ascii_case(m);
        if is(b"*/*") {
            json = true;
            sse = true;
        } else if is(b"application/*") || is(b"application/json") {
            json = true;
        } else if is(b"text/*") || is(b"text/event-stream") {
            sse = true;
        }
    }
    json && sse
}

/// Whether a `Content-Type` header says JSON.
pub fn content_type_is_json(ct: Option<&[u8]>) -> bool {
    let Some(ct) = ct else { return false };
    let media = ct.split(|b| *b == b';').next().unwrap_or(b"");
    media.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

#[cfg(test)]
mod tests {
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
}
