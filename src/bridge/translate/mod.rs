//! Translation between the eras, both ways: a 2026 request goes up with a session-unique id
//! and progress token and without the reserved 2026 `_meta` keys; what comes back gets its
//! id and token restored, `resultType`, `ttlMs`/`cacheScope` (from config), serverInfo, and
//! `-32002` → `-32602`. Server-initiated requests are answered upstream (`ping`, unknown
//! methods) or handed to `input` (elicitation, sampling, roots). A [`CancelGuard`] sends
//! `notifications/cancelled` when the client goes away first.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use smallvec::SmallVec;
use std::ops::Range;
use std::sync::Arc;
use tokio::time::Instant;

use super::input::{Flow, FlowIo};
use super::send_raw;
use crate::backend::Backend;
use crate::backend::{LegacySession, ServerInfo};
use crate::config::CacheScope;
use crate::error::GatewayError;
use crate::jsonrpc::{
    At, Key, Members, Raw, Read, parse_members, scan_members, write_key, write_str,
};
use crate::protocol::{
    RequestId, ResponseMembers, Spans, code, is_cacheable_method, meta, status_for_code,
};
use crate::upstream::{MessageStream, Reply};

pub(super) fn scope_str(s: CacheScope) -> &'static str {
    match s {
        CacheScope::Public => "public",
        CacheScope::Private => "private",
    }
}

/// How one request was rewritten on its way up, to undo it on the way back.
#[derive(Clone)]
pub(super) struct Mapping {
    pub(super) client_id: RequestId,
    pub(super) upstream_id: u64,
    /// (upstream token, client token)
    pub(super) token: Option<(Value, Value)>,
    pub(super) method: String,
    pub(super) ttl_ms: u64,
    pub(super) scope: &'static str,
    pub(super) server_info: Option<Arc<ServerInfo>>,
    /// The request's `logLevel` rank: its `notifications/message` at or above it are relayed.
    pub(super) log_level: Option<u8>,
}

/// The rank of a 2026 request's `_meta` `logLevel`, if it set a valid one.
pub(super) fn log_level(body: &[u8]) -> Option<u8> {
    static LOG_LEVEL: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"logLevel"));
    if !LOG_LEVEL.is_in(body) {
        return None; // cheap skip: most requests carry none
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    crate::protocol::log_rank(v["params"]["_meta"][meta::LOG_LEVEL].as_str()?)
}

/// 2026 request → legacy request: new id, new progress token, reserved `_meta` keys removed.
/// Rewritten as text (issue #23 item 2) while it is read, in one pass: the top level, `params`
/// and `_meta` are split into members where they lie; the arguments and everything else are
/// copied as the client wrote them.
pub(super) fn to_legacy(
    body: &[u8],
    upstream_id: u64,
) -> Result<(Bytes, Option<(Value, Value)>), GatewayError> {
    let text = std::str::from_utf8(body).map_err(|e| GatewayError::Parse(e.to_string()))?;
    let mut token = None;
    let mut out = Vec::with_capacity(body.len() + 16);
    let mut obj = ObjectWriter::new(&mut out);
    let read = scan_members(text, |name, at| {
        let out = obj.member(&name);
        match name.as_str() {
            "id" => {
                out.extend_from_slice(itoa::Buffer::new().format(upstream_id).as_bytes());
                at.skip()
            }
            "params" if at.is_object() => legacy_params(out, at, upstream_id, &mut token),
            _ => copy(out, at),
        }
    });
    if read.is_none() {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Err(e) => GatewayError::Parse(e.to_string()),
            Ok(_) => GatewayError::InvalidRequest("not an object".into()),
        });
    }
    obj.end();
    Ok((Bytes::from(out), token))
}

/// A 2026 request on its way to an initialize-era server, read once for all its attempts from
/// where the envelope found its `id` and `_meta` ([`Spans`]): each attempt writes it with its
/// own upstream id ([`Upward::write`]), the rest copied byte for byte as the client wrote it —
/// what [`to_legacy`] gives, without reading the body again. `_meta` (a few members) is the
/// only part read here.
pub(super) struct Upward<'a> {
    body: &'a [u8],
    id: Option<Range<usize>>,
    meta: Option<MetaEdit<'a>>,
    /// The request's `logLevel` rank, if it set a valid one (as [`log_level`] reads it).
    pub(super) log_level: Option<u8>,
}

/// What becomes of `params._meta`: the bytes `cut` replaced by the members `kept`, or left
/// out when none is.
struct MetaEdit<'a> {
    cut: Range<usize>,
    kept: Vec<(Key<'a>, Raw<'a>)>,
}

impl<'a> Upward<'a> {
    /// `None` when the envelope did not read the body in one pass (no spans), or the spans
    /// are not this body's (a guard: every caller passes the envelope of the body it sends):
    /// the caller translates with [`to_legacy`].
    pub(super) fn read(body: &'a [u8], spans: Option<&Spans>) -> Option<Upward<'a>> {
        let spans = spans.filter(|s| s.len == body.len())?;
        if let Some(id) = &spans.id {
            body.get(id.clone())?;
        }
        let mut up = Upward {
            body,
            id: spans.id.clone(),
            meta: None,
            log_level: None,
        };
        let Some(m) = &spans.meta else {
            return Some(up);
        };
        let text = std::str::from_utf8(body.get(m.value.clone())?).ok()?;
        let Members(mut kept) = parse_members(text)?;
        if let Some((_, level)) = kept.iter().find(|(k, _)| k == meta::LOG_LEVEL) {
            up.log_level = serde_json::from_str::<&str>(level.get())
                .ok()
                .and_then(crate::protocol::log_rank);
        }
        kept.retain(|(k, _)| !RESERVED_META.contains(&k.as_str()));
        let cut = if !kept.is_empty() {
            m.value.clone()
        } else if !m.first {
            // `,"_meta":{…}` after the member before it.
            m.cut..m.value.end
        } else {
            // The first member: cut through the comma after it, if another follows.
            let rest = body.get(m.value.end..)?;
            let ws = rest
                .iter()
                .take_while(|b| matches!(b, b' ' | b'\n' | b'\t' | b'\r'))
                .count();
            let comma = usize::from(rest.get(ws) == Some(&b','));
            m.cut..m.value.end + if comma == 1 { ws + 1 } else { 0 }
        };
        // The two edits must not overlap (they cannot in a body the envelope read).
        if let Some(id) = &up.id
            && id.start < cut.end
            && cut.start < id.end
        {
            return None;
        }
        body.get(cut.clone())?;
        up.meta = Some(MetaEdit { cut, kept });
        Some(up)
    }

    /// The legacy request for one attempt, and its progress token's mapping (upstream, client).
    pub(super) fn write(&self, upstream_id: u64) -> (Bytes, Option<(Value, Value)>) {
        let mut out = Vec::with_capacity(self.body.len() + 16);
        let mut token = None;
        // The two edits in the order they lie in the body (the id is top-level, `_meta` in
        // `params`: they never overlap).
        let id = self.id.clone().map(|r| (r, None));
        let meta = self.meta.as_ref().map(|m| (m.cut.clone(), Some(&m.kept)));
        let mut edits = [id, meta];
        edits.sort_by_key(|e| e.as_ref().map(|(r, _)| r.start));
        let mut at = 0;
        for (cut, kept) in edits.into_iter().flatten() {
            out.extend_from_slice(&self.body[at..cut.start]);
            at = cut.end;
            let Some(kept) = kept else {
                out.extend_from_slice(itoa::Buffer::new().format(upstream_id).as_bytes());
                continue;
            };
            if kept.is_empty() {
                continue; // the member is left out
            }
            let mut obj = ObjectWriter::new(&mut out);
            for (k, v) in kept {
                meta_member(&mut obj, k, *v, upstream_id, &mut token);
            }
            obj.end();
        }
        out.extend_from_slice(&self.body[at..]);
        (Bytes::from(out), token)
    }
}

/// A value copied as it was written.
fn copy<'a>(out: &mut Vec<u8>, at: At<'a>) -> Option<Read<'a>> {
    let read = at.skip()?;
    out.extend_from_slice(read.raw().get().as_bytes());
    Some(read)
}

/// `params` for the legacy server: `_meta` without the reserved 2026 keys (left out when that
/// empties it), its progress token replaced by a session-unique one.
fn legacy_params<'a>(
    out: &mut Vec<u8>,
    at: At<'a>,
    upstream_id: u64,
    token: &mut Option<(Value, Value)>,
) -> Option<Read<'a>> {
    let mut obj = ObjectWriter::new(out);
    let read = at.members(|name, at| {
        if name != "_meta" || !at.is_object() {
            return copy(obj.member(&name), at);
        }
        let mark = obj.mark();
        let mut meta = ObjectWriter::new(obj.member(&name));
        let mut kept = false;
        let read = at.members(|k, v| {
            if RESERVED_META.contains(&k.as_str()) {
                return v.skip();
            }
            kept = true;
            let v = v.skip()?;
            meta_member(&mut meta, &k, v.raw(), upstream_id, token);
            Some(v)
        })?;
        meta.end();
        if !kept {
            obj.rewind(mark);
        }
        Some(read)
    })?;
    obj.end();
    Some(read)
}

/// One `_meta` member a legacy server gets: as the client wrote it, but a progress token
/// replaced by a session-unique one (`token` keeps the pair, upstream and client).
fn meta_member(
    meta: &mut ObjectWriter<'_>,
    key: &Key<'_>,
    value: Raw<'_>,
    upstream_id: u64,
    token: &mut Option<(Value, Value)>,
) {
    let out = meta.member(key);
    if key == "progressToken" && value.get() != "null" {
        let up = format!("portico-{upstream_id}");
        write_str(out, &up);
        let client = serde_json::from_str(value.get()).unwrap_or(Value::Null);
        *token = Some((json!(up), client));
    } else {
        out.extend_from_slice(value.get().as_bytes());
    }
}

/// The 2026 `_meta` keys a legacy server does not know.
const RESERVED_META: [&str; 4] = [
    meta::PROTOCOL_VERSION,
    meta::CLIENT_CAPABILITIES,
    meta::CLIENT_INFO,
    meta::LOG_LEVEL,
];

/// Writes an object member by member: `{`, then `"key":` per [`ObjectWriter::key`] (the
/// caller writes the value into what it returns), then `}`.
struct ObjectWriter<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> ObjectWriter<'o> {
    fn new(out: &'o mut Vec<u8>) -> ObjectWriter<'o> {
        out.push(b'{');
        ObjectWriter { out, first: true }
    }

    fn key(&mut self, name: &str) -> &mut Vec<u8> {
        self.next();
        write_str(self.out, name);
        self.out.push(b':');
        self.out
    }

    /// The separator before a member, unless it is the first.
    fn next(&mut self) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
    }

    /// [`ObjectWriter::key`] for a name read from a message (written as it was read).
    fn member(&mut self, name: &Key) -> &mut Vec<u8> {
        self.next();
        write_key(self.out, name);
        self.out.push(b':');
        self.out
    }

    fn end(self) {
        self.out.push(b'}');
    }

    /// Where the object stands, for [`ObjectWriter::rewind`].
    fn mark(&self) -> (usize, bool) {
        (self.out.len(), self.first)
    }

    /// Takes back what was written since `mark` (a member that turned out to be left out).
    fn rewind(&mut self, (len, first): (usize, bool)) {
        self.out.truncate(len);
        self.first = first;
    }
}

/// What to do with one message from the legacy server.
pub(super) enum Translated {
    /// Send to the client.
    Forward(Bytes),
    /// The server asked something; answer it upstream.
    Answer(Bytes),
    /// Not for this client (log lines, session-wide notifications).
    Drop,
}

/// One legacy message read once: its top-level members, a result's members read where they
/// lie (the last result; a repeated one is read again when written), and what makes it a
/// response (`protocol::ResponseMembers`, as the upstream's answer check counts them).
struct LegacyMessage<'a> {
    /// A response has three members (`jsonrpc`, `id`, `result` or `error`; rarely more): kept
    /// inline, as the message is read and dropped within one call.
    top: SmallVec<[(Key<'a>, Raw<'a>); 4]>,
    result: Option<(Raw<'a>, Vec<(Key<'a>, Raw<'a>)>)>,
    members: ResponseMembers,
    len: usize,
}

impl<'a> LegacyMessage<'a> {
    /// `None` when `msg` is not one JSON object.
    fn read(msg: &'a [u8]) -> Option<LegacyMessage<'a>> {
        let text = std::str::from_utf8(msg).ok()?;
        let mut top = SmallVec::new();
        let mut result: Option<(Raw, Vec<(Key, Raw)>)> = None;
        let mut members = ResponseMembers::default();
        scan_members(text, |name, at| {
            let read = if name == "result" && at.is_object() {
                let (read, Members(fields)) = at.member_texts()?;
                result = Some((read.raw(), fields));
                read
            } else {
                at.skip()?
            };
            members.note(&name, read.raw().get());
            top.push((name, read.raw()));
            Some(read)
        })?;
        Some(LegacyMessage {
            top,
            result,
            members,
            len: msg.len(),
        })
    }

    fn last(&self, key: &str) -> Option<Raw<'a>> {
        self.top
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    }

    /// The response to the call `m` describes, for the client: its id restored and its result
    /// made a 2026 one. `None` when it answers another id.
    fn response(mut self, m: &Mapping) -> Option<Bytes> {
        let id = self.last("id").filter(|v| v.get() != "null")?;
        if id.get().parse::<u64>() != Ok(m.upstream_id) {
            return None;
        }
        let mut out = Vec::with_capacity(self.len + 160);
        let mut obj = ObjectWriter::new(&mut out);
        for (name, value) in &self.top {
            let out = obj.member(name);
            match name.as_str() {
                "id" => out.extend_from_slice(m.client_id.json().as_bytes()),
                "result" => {
                    let fields = self
                        .result
                        .take_if(|(r, _)| std::ptr::eq(r.get(), value.get()))
                        .map(|(_, f)| f);
                    modern_result(out, value.get(), fields, m)
                }
                "error" => modern_error(out, value.get()),
                _ => out.extend_from_slice(value.get().as_bytes()),
            }
        }
        obj.end();
        Some(Bytes::from(out))
    }
}

/// The one JSON answer of a call, checked and translated in one reading: the upstream leaves
/// the check to this reader (`AnswerCheck::Caller`; README "One reader checks a JSON answer").
/// `Err` with the upstream's words when it is not one JSON-RPC response (the backend's fault);
/// `Ok(None)` when it answers another id.
pub(super) fn legacy_answer(msg: &[u8], m: &Mapping) -> Result<Option<Bytes>, String> {
    let Some(read) = LegacyMessage::read(msg) else {
        // Not one JSON object: the upstream's check gives the words.
        return Err(match crate::upstream::http::shape(msg) {
            Err(what) => format!("the answer {what}"),
            Ok(_) => "the answer is not a JSON-RPC response".into(),
        });
    };
    if read.members.repeated() {
        return Err("the answer is not a JSON-RPC message".into());
    }
    if !read.members.is_response() {
        return Err("the answer is not a JSON-RPC response".into());
    }
    Ok(read.response(m))
}

/// Legacy message → what the 2026 client gets. A response (the message of almost every call)
/// is rewritten as text: only its top level, the result's and `_meta`'s members are split, the
/// content is copied as the server wrote it.
pub(super) fn from_legacy(msg: &[u8], m: &Mapping) -> Translated {
    let Some(read) = LegacyMessage::read(msg).filter(|r| !r.members.repeated()) else {
        return Translated::Drop;
    };
    let method = read
        .last("method")
        .and_then(|v| serde_json::from_str::<String>(v.get()).ok());
    let id = read.last("id").filter(|v| v.get() != "null");
    match (method, id) {
        // A server-initiated request.
        (Some(method), Some(id)) => {
            let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
            let answer = if method == "ping" {
                Bytes::from(json!({"jsonrpc":"2.0","id":id,"result":{}}).to_string())
            } else {
                tracing::warn!(
                    method,
                    "legacy server sent a request a 2026-07-28 client cannot receive; refusing it"
                );
                let refusal = GatewayError::MethodNotFound(format!(
                    "{method} is not available: the client is behind portico (2026-07-28)"
                ));
                Bytes::from(refusal.to_message(RequestId::from_value(&id).as_ref()))
            };
            Translated::Answer(answer)
        }
        (Some(method), None) => notification(msg, &method, m),
        (None, Some(_)) => match read.response(m) {
            Some(out) => Translated::Forward(out),
            None => Translated::Drop,
        },
        (None, None) => Translated::Drop,
    }
}

/// A notification from the legacy server during a call: its progress (token restored) and
/// its log lines at the request's level reach the client.
fn notification(msg: &[u8], method: &str, m: &Mapping) -> Translated {
    let Ok(mut v) = serde_json::from_slice::<Value>(msg) else {
        return Translated::Drop;
    };
    if method == "notifications/progress" {
        if let (Some((up, client)), Some(p)) = (&m.token, v.get_mut("params"))
            && p.get("progressToken") == Some(up)
        {
            p["progressToken"] = client.clone();
            return Translated::Forward(Bytes::from(v.to_string()));
        }
        return Translated::Drop;
    }
    // A log line on this call's own stream is this call's: relayed when the request asked for
    // that level. Session-wide notifications (list changes, resource updates) come on the
    // session's own channel and reach listeners, never a call's stream.
    if method == "notifications/message"
        && let Some(min) = m.log_level
        && v["params"]["level"]
            .as_str()
            .and_then(crate::protocol::log_rank)
            .is_some_and(|l| l >= min)
    {
        return Translated::Forward(Bytes::copy_from_slice(msg));
    }
    Translated::Drop
}

/// [`modernize_result`] on the result's text: the members it lacks appended, the server's
/// `serverInfo` added to its `_meta`. Not an object: as is.
fn modern_result(out: &mut Vec<u8>, raw: &str, fields: Option<Vec<(Key, Raw)>>, m: &Mapping) {
    let Some(result) = fields.or_else(|| parse_members(raw).map(|Members(f)| f)) else {
        out.extend_from_slice(raw.as_bytes());
        return;
    };
    let has = |key: &str| result.iter().any(|(k, _)| k == key);
    let mut obj = ObjectWriter::new(out);
    for (name, value) in &result {
        let out = obj.member(name);
        match &m.server_info {
            Some(info) if name == "_meta" => meta_with_info(out, value.get(), info),
            _ => out.extend_from_slice(value.get().as_bytes()),
        }
    }
    if !has("resultType") {
        obj.key("resultType").extend_from_slice(b"\"complete\"");
    }
    if is_cacheable_method(&m.method) {
        if !has("ttlMs") {
            let ttl = m.ttl_ms.to_string();
            obj.key("ttlMs").extend_from_slice(ttl.as_bytes());
        }
        if !has("cacheScope") {
            write_str(obj.key("cacheScope"), m.scope);
        }
    }
    if let Some(info) = &m.server_info
        && !has("_meta")
    {
        let mut meta_obj = ObjectWriter::new(obj.key("_meta"));
        meta_obj
            .key(meta::SERVER_INFO)
            .extend_from_slice(info.json.as_bytes());
        meta_obj.end();
    }
    obj.end();
}

/// A result's `_meta` with `serverInfo` added when it has none. Not an object: as is.
fn meta_with_info(out: &mut Vec<u8>, raw: &str, info: &ServerInfo) {
    match parse_members(raw) {
        Some(Members(fields)) if !fields.iter().any(|(k, _)| k == meta::SERVER_INFO) => {
            let mut obj = ObjectWriter::new(out);
            for (name, value) in &fields {
                obj.member(name).extend_from_slice(value.get().as_bytes());
            }
            obj.key(meta::SERVER_INFO)
                .extend_from_slice(info.json.as_bytes());
            obj.end();
        }
        _ => out.extend_from_slice(raw.as_bytes()),
    }
}

/// An error object, with the legacy resource-not-found code (`-32002`) made `-32602`.
fn modern_error(out: &mut Vec<u8>, raw: &str) {
    let legacy_code =
        |v: &crate::jsonrpc::Raw| v.get().parse::<i64>() == Ok(code::LEGACY_RESOURCE_NOT_FOUND);
    match parse_members(raw) {
        Some(Members(fields))
            if fields
                .iter()
                .rev()
                .find(|(k, _)| k == "code")
                .is_some_and(|(_, v)| legacy_code(v)) =>
        {
            let mut obj = ObjectWriter::new(out);
            for (name, value) in &fields {
                let out = obj.member(name);
                if name == "code" {
                    out.extend_from_slice(code::INVALID_PARAMS.to_string().as_bytes());
                } else {
                    out.extend_from_slice(value.get().as_bytes());
                }
            }
            obj.end();
        }
        _ => out.extend_from_slice(raw.as_bytes()),
    }
}

pub(super) fn modernize_result(result: &mut Map<String, Value>, m: &Mapping) {
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if is_cacheable_method(&m.method) {
        result.entry("ttlMs").or_insert_with(|| json!(m.ttl_ms));
        result.entry("cacheScope").or_insert_with(|| json!(m.scope));
    }
    if let Some(info) = &m.server_info {
        let meta_obj = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(o) = meta_obj.as_object_mut() {
            o.entry(meta::SERVER_INFO)
                .or_insert_with(|| info.value.clone());
        }
    }
}

/// Applies `from_legacy` to every message of the answer; the server's requests are answered,
/// relayed or park the call (`input::Flow`, with the call's `io`, made only for a stream).
pub(super) fn translate(
    reply: Reply,
    m: Mapping,
    mut guard: CancelGuard,
    io: impl FnOnce() -> FlowIo,
) -> Reply {
    let status = reply.status;
    match reply.messages {
        MessageStream::Empty => {
            guard.armed = false;
            Reply {
                status,
                headers: HeaderMap::new(),
                messages: MessageStream::Empty,
            }
        }
        MessageStream::One(msg) => {
            guard.armed = false;
            let out = match from_legacy(&msg, &m) {
                Translated::Forward(out) => Some(out),
                _ => None,
            };
            answered(status, out, &m, &guard.backend)
        }
        MessageStream::Many(stream) => Reply {
            status,
            headers: HeaderMap::new(),
            messages: MessageStream::Many(
                Flow {
                    inner: stream,
                    m,
                    guard,
                    io: io(),
                }
                .into_stream(),
            ),
        },
    }
}

/// The reply one translated answer makes (`None`: it answered another id, a 502).
pub(super) fn answered(status: StatusCode, out: Option<Bytes>, m: &Mapping, b: &Backend) -> Reply {
    match out {
        Some(out) => Reply::one(error_status(&out).unwrap_or(status), out),
        None => Reply::one(
            StatusCode::BAD_GATEWAY,
            GatewayError::BackendFailed {
                backend: b.name.to_string(),
                detail: "answer did not match the request".into(),
            }
            .to_message(Some(&m.client_id)),
        ),
    }
}

/// The HTTP status a translated error answer should carry.
pub(super) fn error_status(msg: &[u8]) -> Option<StatusCode> {
    static ERROR: crate::protocol::Needle =
        crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"\"error\""));
    if !ERROR.is_in(msg) {
        return None; // cheap skip: results are not parsed again
    }
    let v: Value = serde_json::from_slice(msg).ok()?;
    let c = v.get("error")?.get("code")?.as_i64()?;
    StatusCode::from_u16(status_for_code(c)).ok()
}

/// Whether a request the envelope accepts goes up the same by [`Upward`] (from the envelope's
/// spans) as by [`to_legacy`] (reading the whole body): the same JSON, the same progress token
/// mapping, and the log level serde reads; panics on a disagreement, naming the text. The unit
/// tests' and the fuzz harness's check of the span path. Returns whether `msg` was compared.
pub fn upward_agrees(msg: &[u8]) -> bool {
    let Ok(env) = crate::protocol::parse_envelope(msg) else {
        return false;
    };
    if env.kind == crate::protocol::Kind::Response {
        return false;
    }
    let text = String::from_utf8_lossy(msg);
    let up = Upward::read(msg, env.spans.as_ref())
        .unwrap_or_else(|| panic!("no spans for an accepted request: {text:?}"));
    let (ours, our_token) = up.write(7);
    let (theirs, their_token) = to_legacy(msg, 7).expect("an accepted request translates");
    let json = |b: &[u8]| serde_json::from_slice::<Value>(b).ok();
    assert!(
        json(&ours).is_some(),
        "span path wrote invalid JSON for {text:?}"
    );
    assert_eq!(json(&ours), json(&theirs), "legacy request of {text:?}");
    assert_eq!(our_token, their_token, "progress token of {text:?}");
    let by_serde = serde_json::from_slice::<Value>(msg)
        .ok()
        .and_then(|v| crate::protocol::log_rank(v["params"]["_meta"][meta::LOG_LEVEL].as_str()?));
    assert_eq!(up.log_level, by_serde, "log level of {text:?}");
    true
}

/// Both translations of one message, as hostile as it comes (the fuzz entry points' view; no
/// I/O). What the text rewriters write from valid JSON must be valid JSON: a panic otherwise.
pub fn fuzz_both_ways(msg: &[u8]) {
    let valid = serde_json::from_slice::<serde::de::IgnoredAny>(msg).is_ok();
    let must_parse = |what: &str, out: &[u8]| {
        assert!(
            !valid || serde_json::from_slice::<serde::de::IgnoredAny>(out).is_ok(),
            "{what} wrote invalid JSON: {}",
            String::from_utf8_lossy(out)
        );
    };
    if let Ok((up, _)) = to_legacy(msg, 7) {
        must_parse("to_legacy", &up);
    }
    upward_agrees(msg);
    let m = Mapping {
        client_id: RequestId::number(1),
        upstream_id: 7,
        token: Some((json!("portico-7"), json!(1))),
        method: "tools/list".into(),
        ttl_ms: 5,
        scope: "public",
        server_info: ServerInfo::of(&json!({"serverInfo": {"name": "fuzz"}})),
        log_level: Some(0),
    };
    match from_legacy(msg, &m) {
        Translated::Forward(out) => {
            must_parse("from_legacy", &out);
            let _ = error_status(&out);
        }
        Translated::Answer(out) => must_parse("an answer upstream", &out),
        Translated::Drop => {}
    }
}

/// Sends `notifications/cancelled` upstream when dropped while armed.
pub(super) struct CancelGuard {
    pub(super) backend: Arc<Backend>,
    pub(super) session: Arc<LegacySession>,
    pub(super) upstream_id: u64,
    pub(super) armed: bool,
    /// Holds the owner's pool slot while the answer streams (not reaped or evicted meanwhile).
    pub(super) _slot: super::session::Held,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let session = self.session.clone();
        let note = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{
            "requestId": self.upstream_id, "reason": "the client went away"}});
        rt.spawn(async move {
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            let body = Bytes::from(note.to_string());
            if let Err(error) = send_raw(&backend, &session, body, &HeaderMap::new(), &[], deadline, super::How::OWN).await {
                tracing::debug!(backend = %backend.name, %error, "could not send notifications/cancelled");
            }
        });
    }
}

#[cfg(test)]
mod tests;
