//! Aggregated endpoints: several backends served as one MCP server (`[[endpoints]]`).
//!
//! Who calls it: `proxy::handle_inner` sends a modern request on an endpoint path to [`serve`];
//! `legacy::serve` reaches [`answer`] through `router::dispatch` after translating an
//! initialize-era request. Aggregation is a dispatcher: every request to a member takes the
//! per-backend step (`step::step`) as a well-formed 2026-07-28 request of its own, with the
//! member's [`Exposure`] so team policies judge the prefixed names clients see. So a member
//! keeps its `allow_teams`, concurrency limit and breaker behind the endpoint, aggregation works
//! over every backend kind, and each part is cached on its own. A member the caller's team may
//! not use is left out of lists (not counted as a failure) and refused for calls.
//!
//! What an endpoint does, by method:
//! - `server/discover`: one answer — the versions portico serves, the union of the members'
//!   capabilities, portico's serverInfo, each member's instructions labelled by backend.
//! - the four lists (`lists`): fan out to the members in parallel (each with its own timeout),
//!   merge in config order, rewrite tool and prompt names to `<prefix><separator><name>`
//!   (`merge`), sign a cursor for the pages still to come (`cursor`); with the cache on, the
//!   merged page is cached whole. `failure_mode` decides what a failing
//!   member does to the list: left out and counted (`open`) or a JSON-RPC error naming it
//!   (`closed`). A member answering `-32601` simply has no such list and is not a failure.
//! - `tools/call`, `prompts/get`: routed by name (the body's, which `frontend::verify_modern` has
//!   checked the `Mcp-Name` header against) to the member owning the prefix; the prefix is
//!   stripped from the body and the header. Bare names are found in the name index the lists
//!   fill (a miss re-walks the list once). Results, `input_required` included, pass through
//!   untouched, so an MRTR retry (same name) reaches the same member.
//! - `resources/read` (and `completion/complete` on a resource): routed by URI. Fallback order:
//!   the URI index from `resources/list` → a member whose resource
//!   template matches the URI → the same two after re-walking both lists once → `-32602`
//!   "Resource not found" with `data.uri`. A URI listed by two members belongs to the first.
//! - `subscriptions/listen`: `listen`.

pub mod cursor;
mod listen;
mod lists;

use lists::{list, walk};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;
use tokio::time::Instant;

use crate::backend::Backend;
use crate::body::{Body, render};
use crate::config::{EndpointBackend, EndpointConfig, FailureMode};
use crate::error::GatewayError;
use crate::frontend::{self, Head};
use crate::jsonrpc::{Members, parse_members, write_replaced, write_str};
use crate::merge::{self, ListKind, Naming};
use crate::protocol::{self, Envelope, Kind, SUPPORTED_VERSIONS, code, header as h, meta};
use crate::step::{self, Core, Exposure, RequestCtx};
use crate::upstream::{AnswerCheck, Reply};

/// Entries the name and URI indexes hold at most per endpoint; a member listing more than this
/// still works for prefixed names, the rest fall back to re-walking the lists.
const MAX_INDEX_ENTRIES: usize = 100_000;
/// Pages an internal re-walk of a list follows at most (a member that keeps returning cursors
/// must not pin a request forever).
const MAX_WALK_PAGES: usize = 64;

/// One member of an endpoint.
pub struct Member {
    pub backend: Arc<Backend>,
    pub naming: Naming,
}

/// An aggregated endpoint, built once per config generation.
pub struct Endpoint {
    pub path: Arc<str>,
    pub members: Vec<Member>,
    /// The members' naming rules, in member order (what the pure `merge` functions take).
    namings: Vec<Naming>,
    pub separator: String,
    pub failure_mode: FailureMode,
    /// Window in which repeated `list_changed` notifications are folded into one.
    pub debounce: Duration,
    /// The slowest member's timeout: the budget of a request that involves every member.
    pub timeout: Duration,
    /// What a cursor is bound to: the path and the member names, so a cursor from before a
    /// reload that changed the members (and with them the indexes) no longer opens.
    cursor_scope: Vec<u8>,
    /// What the merged answers are cached under: the path and a digest of the endpoint's
    /// config, so replicas sharing Redis with a different config for the path (a rolling
    /// update) never serve each other's merges. Backend names cannot hold `/` or `#`.
    pub cache_name: String,
    /// The members' backend names, in member order: what a merged page covers
    /// (`KeyInput::covers`).
    member_names: Vec<String>,
    index: RwLock<Index>,
}

/// What the lists taught us about who owns what.
#[derive(Default)]
struct Index {
    /// Exposed tool/prompt name → member, for bare members.
    names: HashMap<(ListKind, String), usize>,
    /// Resource URI → member (the first member listing it).
    uris: HashMap<String, usize>,
    /// Resource templates, in member order.
    templates: Vec<(String, usize)>,
}

impl Endpoint {
    pub fn build(
        cfg: &EndpointConfig,
        backends: &HashMap<String, Arc<Backend>>,
    ) -> Result<Endpoint, String> {
        let mut members = Vec::with_capacity(cfg.backends.len());
        let mut scope = cfg.path.as_bytes().to_vec();
        for m in &cfg.backends {
            let backend = backends
                .get(m.name())
                .ok_or_else(|| format!("no backend named {:?}", m.name()))?
                .clone();
            let naming = match m {
                EndpointBackend::Name(n) => Naming {
                    backend: n.clone(),
                    prefix: n.clone(),
                    tools: Default::default(),
                },
                EndpointBackend::Detailed(d) => Naming {
                    backend: d.name.clone(),
                    prefix: d.prefix.clone().unwrap_or_else(|| d.name.clone()),
                    tools: d.tools.clone(),
                },
            };
            scope.push(0);
            scope.extend_from_slice(naming.backend.as_bytes());
            members.push(Member { backend, naming });
        }
        let timeout = members
            .iter()
            .map(|m| m.backend.timeout)
            .max()
            .unwrap_or(Duration::from_millis(crate::config::DEFAULT_TIMEOUT_MS));
        Ok(Endpoint {
            path: cfg.path.as_str().into(),
            namings: members.iter().map(|m| m.naming.clone()).collect(),
            member_names: members.iter().map(|m| m.naming.backend.clone()).collect(),
            members,
            separator: cfg.separator.clone(),
            failure_mode: cfg.failure_mode,
            debounce: Duration::from_millis(cfg.debounce_ms),
            timeout,
            cursor_scope: scope,
            cache_name: format!("{}#{}", cfg.path, config_digest(cfg)),
            index: RwLock::new(Index::default()),
        })
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The member owning an exposed tool/prompt name, and the upstream name. Prefixes decide
    /// first (they are unique per endpoint); bare names come from the index.
    fn owner(&self, kind: ListKind, exposed: &str) -> Option<(usize, String)> {
        for (i, n) in self.namings.iter().enumerate() {
            if let Some(name) = n.strip(&self.separator, exposed) {
                return Some((i, name.to_string()));
            }
        }
        let i = *self.index().names.get(&(kind, exposed.to_string()))?;
        Some((i, exposed.to_string()))
    }

    /// How member `i`'s names appear on this endpoint (what team policies judge).
    fn exposure(&self, i: usize) -> Exposure<'_> {
        Exposure::member(&self.namings[i].prefix, &self.separator)
    }

    fn has_bare_member(&self) -> bool {
        self.namings.iter().any(|n| n.prefix.is_empty())
    }

    /// The member owning a resource URI: listed, else matched by a template.
    fn uri_owner(&self, uri: &str) -> Option<usize> {
        let idx = self.index();
        if let Some(i) = idx.uris.get(uri) {
            return Some(*i);
        }
        idx.templates
            .iter()
            .find(|(t, _)| t == uri || merge::template_matches(t, uri))
            .map(|(_, i)| *i)
    }

    /// Records who owns what after a merged page. The first page of a list starts the kind's
    /// entries afresh (a tool may have moved between bare members); a bare name that another
    /// member already owns (seen on an earlier page) is a collision.
    fn learn(
        &self,
        kind: ListKind,
        first_page: bool,
        owners: &[(String, usize)],
    ) -> Result<(), GatewayError> {
        let mut idx = self.index_mut();
        if first_page {
            match kind {
                ListKind::Tools | ListKind::Prompts => idx.names.retain(|(k, _), _| *k != kind),
                ListKind::Resources => idx.uris.clear(),
                ListKind::Templates => idx.templates.clear(),
            }
        }
        for (key, i) in owners {
            match kind {
                ListKind::Tools | ListKind::Prompts => {
                    if !self.namings[*i].prefix.is_empty() {
                        continue; // the prefix routes it
                    }
                    if let Some(&other) = idx.names.get(&(kind, key.clone()))
                        && other != *i
                    {
                        return Err(GatewayError::NameCollision {
                            name: key.clone(),
                            first: self.namings[other].backend.clone(),
                            second: self.namings[*i].backend.clone(),
                        });
                    }
                    if idx.names.len() < MAX_INDEX_ENTRIES {
                        idx.names.insert((kind, key.clone()), *i);
                    }
                }
                ListKind::Resources => {
                    if idx.uris.len() < MAX_INDEX_ENTRIES {
                        idx.uris.entry(key.clone()).or_insert(*i);
                    }
                }
                ListKind::Templates => {
                    if idx.templates.len() < MAX_INDEX_ENTRIES {
                        idx.templates.push((key.clone(), *i));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A short digest of an endpoint's config (its `Debug` text: every field, in order).
fn config_digest(cfg: &EndpointConfig) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("{cfg:?}").as_bytes());
    hex::encode(&d.as_ref()[..12])
}

/// A modern (2026-07-28) request on an endpoint. Unlike a single backend there is no
/// pass-through: portico acts on every message (fan-out, renaming, routing), so the body is
/// always parsed and the mirrored headers always checked against it.
pub async fn serve(
    core: &Core,
    ctx: &mut RequestCtx,
    ep: &Arc<Endpoint>,
    headers: &HeaderMap,
    head: Head<'_>,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    let mh = frontend::check_modern_head(&head)?;
    ctx.method = mh.method.map(str::to_owned);
    let env = protocol::parse_envelope(&body).map_err(frontend::envelope_error)?;
    ctx.id = env.id.clone();
    if ctx.method.is_none() {
        ctx.method = Some(env.method.clone());
    }
    ctx.note_tool(Some(&env.method), env.name.as_deref());
    frontend::verify_modern(&head, &mh, &env)?;
    let deadline = Instant::now() + ep.timeout;
    let reply = answer(core, ctx, ep, headers, &env, body, deadline).await?;
    // A stream that breaks is blamed on the member it came from (a routed call); a merged
    // answer is the endpoint's own.
    let blamed = ctx.backend.as_deref().unwrap_or(&ep.path);
    Ok(render(
        reply,
        env.id.as_ref(),
        blamed,
        ep.timeout.as_millis() as u64,
    )
    .await)
}

/// The endpoint's dispatch: one `match` on the method. Returns decoded messages, like
/// `proxy::answer` does for one backend.
pub async fn answer(
    core: &Core,
    ctx: &mut RequestCtx,
    ep: &Arc<Endpoint>,
    headers: &HeaderMap,
    env: &Envelope,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    match env.kind {
        // Client notifications concern no member in particular (the core protocol defines none
        // over HTTP); accepted and dropped.
        Kind::Notification => return Ok(Reply::accepted()),
        Kind::Response => {
            return Err(GatewayError::InvalidRequest(
                "clients do not send responses in 2026-07-28".into(),
            ));
        }
        Kind::Request => {}
    }
    // Charged once here, so the fan-out does not charge per member.
    step::charge(core, ctx)?;
    let list_kind = ListKind::from_method(&env.method);
    // The fan-out methods build their part requests from the raw `_meta`, a routed call
    // rewrites the name where it lies in the text (`call`) and a read forwards the body as it
    // came; only a completion (whose name is nested in `ref`) and the listen read it as a tree.
    let client: Value = if matches!(
        env.method.as_str(),
        "completion/complete" | "subscriptions/listen"
    ) {
        serde_json::from_slice(&body).map_err(|e| GatewayError::Parse(e.to_string()))?
    } else {
        Value::Null
    };
    let req = Req {
        core,
        ctx: ctx.clone(),
        ep,
        headers,
        env,
        client: &client,
        part_meta: OnceLock::new(),
        body: &body,
    };
    if let Some(kind) = list_kind {
        return list(&req, ctx, kind).await;
    }
    match env.method.as_str() {
        "server/discover" => discover(&req).await,
        "tools/call" => call(&req, ListKind::Tools, ctx, deadline).await,
        "prompts/get" => call(&req, ListKind::Prompts, ctx, deadline).await,
        "resources/read" => read(&req, ctx, deadline).await,
        "completion/complete" => complete(&req, ctx, deadline).await,
        "subscriptions/listen" => listen::listen(&req).await,
        other => Err(GatewayError::MethodNotFound(other.to_string())),
    }
}

/// One client request on an endpoint, as the helpers below need it.
struct Req<'a> {
    core: &'a Core,
    /// A copy of the request's context for the parts (which run concurrently); routed calls
    /// use the request's own.
    ctx: RequestCtx,
    ep: &'a Arc<Endpoint>,
    headers: &'a HeaderMap,
    env: &'a Envelope,
    /// The client's body, parsed for the methods that read it as a tree (`answer`), else `Null`.
    client: &'a Value,
    /// The client's `params._meta` as JSON text, for the part requests: cut from the body the
    /// first time a part is sent (a routed call needs it only when it must walk a list).
    part_meta: OnceLock<String>,
    /// The client's body as it came.
    body: &'a Bytes,
}

/// The client's `_meta` for a part request: protocol version, capabilities, clientInfo, trace
/// context — everything but the progress token, which belongs to the client's own request
/// (lists do not report progress). Cut from the body's text: nothing else is parsed.
fn part_meta(body: &[u8], has_progress_token: bool) -> String {
    // The body was judged whole (`protocol::parse_envelope`): no member is repeated.
    let mut meta = None;
    let _ = std::str::from_utf8(body).ok().and_then(|text| {
        crate::jsonrpc::scan_members(text, |name, at| {
            if name != "params" || !at.is_object() {
                return at.skip();
            }
            at.members(|name, at| {
                let read = at.skip()?;
                if name == "_meta" {
                    meta = Some(read.raw().get()).filter(|m| *m != "null");
                }
                Some(read)
            })
        })
    });
    let meta = meta.unwrap_or("{}");
    if !has_progress_token {
        return meta.to_string();
    }
    let Some(Members(fields)) = parse_members(meta) else {
        return "{}".into();
    };
    let mut out = Vec::with_capacity(meta.len());
    out.push(b'{');
    for (name, value) in fields.iter().filter(|(n, _)| n != "progressToken") {
        if out.len() > 1 {
            out.push(b',');
        }
        write_str(&mut out, name);
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
    String::from_utf8(out).unwrap_or_else(|_| "{}".into())
}

impl Req<'_> {
    fn id(&self) -> Value {
        self.env.id.as_ref().map_or(Value::Null, |i| i.to_value())
    }

    /// The request's id as JSON text (`null` for none).
    fn id_json(&self) -> &str {
        self.env.id.as_ref().map_or("null", |i| i.json())
    }

    /// A 2026-07-28 request for one member: `params` plus the client's `_meta`, written as
    /// text (one body per member per request on the fan-out path).
    fn part_body(&self, method: &str, params: &Map<String, Value>) -> Bytes {
        let meta = self
            .part_meta
            .get_or_init(|| part_meta(self.body, self.env.has_progress_token));
        let mut out = Vec::with_capacity(96 + method.len() + meta.len());
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        out.extend_from_slice(self.id_json().as_bytes());
        out.extend_from_slice(b",\"method\":");
        write_str(&mut out, method);
        out.extend_from_slice(b",\"params\":{");
        for (name, value) in params.iter().filter(|(n, _)| *n != "_meta") {
            write_str(&mut out, name);
            out.push(b':');
            // Values built here: serializing them cannot fail.
            let _ = serde_json::to_writer(&mut out, value);
            out.push(b',');
        }
        out.extend_from_slice(b"\"_meta\":");
        out.extend_from_slice(meta.as_bytes());
        out.extend_from_slice(b"}}");
        Bytes::from(out)
    }

    /// [`Req::part_body`] and the envelope read from it: what the step judges and forwards.
    fn judged_part(&self, method: &str, params: &Map<String, Value>) -> Judged {
        let body = self.part_body(method, params);
        let env = protocol::parse_envelope(&body).map_err(frontend::envelope_error)?;
        Ok((body, env))
    }
}

/// The client's headers minus the mirrors of the client's message: the step sets the mirrors
/// of the part's own message (e.g. the stripped `Mcp-Name`).
fn part_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    out.remove(h::NAME);
    out.remove(h::METHOD);
    out
}

/// What one member answered: the message, read by the caller (a list page in one pass,
/// `merge::read_list_answer`; a discover result as a tree).
type Answer = Result<Bytes, GatewayError>;

/// Sends one request to one member through the per-backend step and reads its final message,
/// all within the member's own timeout.
async fn part(
    req: &Req<'_>,
    headers: &HeaderMap,
    member: usize,
    (body, env): &(Bytes, Envelope),
    check: AnswerCheck,
) -> Answer {
    let b = &req.ep.members[member].backend;
    let deadline = Instant::now() + b.timeout;
    let body = body.clone();
    // Each part gets its own copy of the context: parts run concurrently.
    let mut ctx = req.ctx.clone();
    let exposure = req.ep.exposure(member);
    let work = async {
        let reply = step::call_checked(
            req.core, &mut ctx, b, exposure, headers, env, body, deadline, check,
        )
        .await;
        if check == AnswerCheck::Caller && reply.is_err() {
            // The step left the breaker to us (`AnswerCheck::Caller`); an answer is counted
            // once the caller has read it (`lists::page`).
            b.resilience.record_result(&reply);
        }
        reply?.final_message(&b.name, b.cfg.timeout_ms).await
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .map_err(|_| GatewayError::BackendTimeout {
            backend: b.name.to_string(),
            timeout_ms: b.cfg.timeout_ms,
        })?
}

/// A part request's body and the envelope read from it, or why it could not be read.
type Judged = Result<(Bytes, Envelope), GatewayError>;

/// Sends one request to each of `targets` in parallel; the answers in target order. Members the
/// caller's team may not use are not asked, and their absence is no failure. With
/// `AnswerCheck::Caller` the caller reads each answer whole and records it on the member's
/// breaker.
async fn fan_out(
    req: &Req<'_>,
    method: &str,
    targets: Vec<(usize, Map<String, Value>)>,
    check: AnswerCheck,
) -> Vec<(usize, Answer)> {
    let ep = req.ep;
    // One copy of the client's headers for every part (the step reads them, never changes them).
    let headers = &part_headers(req.headers);
    // One body per distinct `params`, judged once (`protocol::parse_envelope`): every member's
    // first page is the same request, so its members share the bytes and the envelope read
    // from them (callgrind: ~4.3 k instructions a part to write and read it again).
    let mut bodies: Vec<(Map<String, Value>, Judged)> = Vec::with_capacity(targets.len());
    let mut plan = Vec::with_capacity(targets.len());
    for (i, params) in targets {
        if step::may_use(&req.ctx, &ep.members[i].backend).is_err() {
            continue;
        }
        let k = match bodies.iter().position(|(p, _)| *p == params) {
            Some(k) => k,
            None => {
                let judged = req.judged_part(method, &params);
                bodies.push((params, judged));
                bodies.len() - 1
            }
        };
        plan.push((i, k));
    }
    let bodies = &bodies;
    let calls = plan.into_iter().map(|(i, k)| async move {
        let answer = match &bodies[k].1 {
            Ok(judged) => part(req, headers, i, judged, check).await,
            Err(e) => Err(e.clone()),
        };
        (i, answer)
    });
    futures_util::future::join_all(calls).await
}

/// What a member's JSON-RPC error means for the merge: `None` when the member simply has no
/// such list (`-32601`, e.g. no prompts capability: nothing to merge), else its failure.
fn error_failure(backend: &str, method: &str, e: &Value) -> Option<GatewayError> {
    if e["code"].as_i64() == Some(code::METHOD_NOT_FOUND) {
        return None;
    }
    Some(GatewayError::BackendFailed {
        backend: backend.to_string(),
        detail: format!(
            "{method} answered error {}: {}",
            e["code"],
            e["message"].as_str().unwrap_or("")
        ),
    })
}

fn neither(backend: &str) -> GatewayError {
    GatewayError::BackendFailed {
        backend: backend.to_string(),
        // Not valid JSON, no result object or error, a `method`, a member given twice: the
        // fan-out leaves the whole reading of a list answer to `merge::read_list_answer`.
        detail: "the answer is not a valid JSON-RPC response with a result or an error".into(),
    }
}

/// Applies the failure mode to member `i`'s failure: the request fails (`closed`), or the
/// member is left out, logged and counted, and the answer marked `degraded` (`open`).
fn left_out(
    req: &Req<'_>,
    i: usize,
    method: &str,
    failure: GatewayError,
    degraded: &mut bool,
) -> Result<(), GatewayError> {
    let ep = req.ep;
    let backend = &ep.namings[i].backend;
    match ep.failure_mode {
        FailureMode::Closed => Err(failure),
        FailureMode::Open => {
            tracing::warn!(endpoint = %ep.path, backend = %backend, method, error = %failure,
                "member left out of the aggregated answer");
            req.core.metrics.aggregate_omitted(&ep.path, backend);
            *degraded = true;
            Ok(())
        }
    }
}

/// `server/discover` for the endpoint.
async fn discover(req: &Req<'_>) -> Result<Reply, GatewayError> {
    #[derive(serde::Deserialize)]
    struct Message {
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<Value>,
    }
    const METHOD: &str = "server/discover";
    let targets = (0..req.ep.members.len()).map(|i| (i, Map::new())).collect();
    let mut parts = Vec::new();
    let mut degraded = false;
    for (i, answer) in fan_out(req, METHOD, targets, AnswerCheck::Upstream).await {
        let backend = &req.ep.namings[i].backend;
        let failure = match answer.map(|m| serde_json::from_slice::<Message>(&m)) {
            Ok(Ok(Message {
                result: Some(Value::Object(r)),
                ..
            })) => {
                parts.push((i, r));
                continue;
            }
            Ok(Ok(Message { error: Some(e), .. })) => match error_failure(backend, METHOD, &e) {
                None => continue,
                Some(f) => f,
            },
            Ok(_) => neither(backend),
            Err(e) => e,
        };
        left_out(req, i, METHOD, failure, &mut degraded)?;
    }
    let mut r = merge::merge_discover(&req.ep.namings, &parts);
    // Advertised = delivered (issue #20 item 4): tasks (`tasks/*`) are not routed to members,
    // nor are a member's `experimental` methods (the endpoint routes the methods it knows).
    // (`resources.subscribe` is: the listen routes each URI to its member, `listen`.)
    if let Some(caps) = r.get_mut("capabilities").and_then(Value::as_object_mut) {
        caps.remove("tasks");
        caps.remove("experimental");
        if let Some(ext) = caps.get_mut("extensions").and_then(Value::as_object_mut) {
            ext.remove("io.modelcontextprotocol/tasks");
        }
    }
    if degraded {
        r.insert("ttlMs".into(), json!(0));
    }
    r.insert("resultType".into(), json!("complete"));
    r.insert("supportedVersions".into(), json!(SUPPORTED_VERSIONS));
    r.insert("_meta".into(), server_meta());
    Ok(result(req, r))
}

fn server_meta() -> Value {
    json!({ meta::SERVER_INFO: {"name": "portico", "version": env!("CARGO_PKG_VERSION")} })
}

fn result(req: &Req<'_>, result: Map<String, Value>) -> Reply {
    Reply::one(
        StatusCode::OK,
        to_json(&json!({"jsonrpc":"2.0","id":req.id(),"result":result})),
    )
}

/// Serializes a value built here (maps with string keys: cannot fail).
fn to_json(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// `tools/call` / `prompts/get`: to the member owning the name, with the prefix stripped.
async fn call(
    req: &Req<'_>,
    kind: ListKind,
    ctx: &mut RequestCtx,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let ep = req.ep;
    let what = if kind == ListKind::Tools {
        "tool"
    } else {
        "prompt"
    };
    let unknown = |name: &str| GatewayError::InvalidParams(format!("Unknown {what}: {name}"));
    let name = req.env.name.as_deref().ok_or_else(|| {
        GatewayError::InvalidParams(format!("params.name is required for {}", req.env.method))
    })?;
    let mut owner = ep.owner(kind, name);
    if owner.is_none() && ep.has_bare_member() {
        walk(req, kind, deadline).await?;
        owner = ep.owner(kind, name);
    }
    let Some((i, upstream)) = owner else {
        return Err(unknown(name));
    };
    let m = &ep.members[i];
    if kind == ListKind::Tools && !m.naming.tool_allowed(&upstream) {
        return Err(unknown(name));
    }
    // The name replaced where it lies, the rest copied as the client wrote it (the body was
    // judged whole: `params.name` is its only name member). `forward` judges the new body again.
    let text = &req.body[..];
    let at = req.env.spans.as_ref().filter(|s| s.len == text.len());
    let mut body = Vec::with_capacity(text.len() + upstream.len());
    if !at
        .and_then(|s| s.name.clone())
        .is_some_and(|at| write_replaced(&mut body, text, at, &upstream))
    {
        return Err(GatewayError::InvalidParams(format!(
            "params.name of {} could not be read in place",
            req.env.method
        )));
    }
    forward(req, ctx, i, Bytes::from(body), deadline).await
}

/// Sends a (rewritten) client request to one member and returns its answer untouched.
async fn forward(
    req: &Req<'_>,
    ctx: &mut RequestCtx,
    member: usize,
    body: Bytes,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let b = &req.ep.members[member].backend;
    let env = protocol::parse_envelope(&body).map_err(frontend::envelope_error)?;
    let headers = part_headers(req.headers);
    let deadline = deadline.min(Instant::now() + b.timeout);
    let exposure = req.ep.exposure(member);
    step::call(req.core, ctx, b, exposure, &headers, &env, body, deadline).await
}

/// Finds the member serving a resource URI (see the module doc for the fallback order).
async fn resource_owner(
    req: &Req<'_>,
    uri: &str,
    deadline: Instant,
) -> Result<Option<usize>, GatewayError> {
    if req.ep.members.len() == 1 {
        return Ok(Some(0));
    }
    if let Some(i) = req.ep.uri_owner(uri) {
        return Ok(Some(i));
    }
    walk(req, ListKind::Resources, deadline).await?;
    walk(req, ListKind::Templates, deadline).await?;
    Ok(req.ep.uri_owner(uri))
}

/// `resources/read`, routed by URI.
async fn read(
    req: &Req<'_>,
    ctx: &mut RequestCtx,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let uri = req
        .env
        .name
        .clone()
        .ok_or_else(|| GatewayError::InvalidParams("params.uri is required".into()))?;
    let Some(i) = resource_owner(req, &uri, deadline).await? else {
        return Err(GatewayError::ResourceNotFound { uri });
    };
    forward(req, ctx, i, req.body.clone(), deadline).await
}

/// `completion/complete`: routed by what it completes — a prompt by name (prefix stripped), a
/// resource template by URI.
async fn complete(
    req: &Req<'_>,
    ctx: &mut RequestCtx,
    deadline: Instant,
) -> Result<Reply, GatewayError> {
    let r = &req.client["params"]["ref"];
    let mut body = req.client.clone();
    let member = match r["type"].as_str() {
        Some("ref/prompt") => {
            let name = r["name"].as_str().unwrap_or("");
            let mut owner = req.ep.owner(ListKind::Prompts, name);
            if owner.is_none() && req.ep.has_bare_member() {
                walk(req, ListKind::Prompts, deadline).await?;
                owner = req.ep.owner(ListKind::Prompts, name);
            }
            let (i, upstream) = owner
                .ok_or_else(|| GatewayError::InvalidParams(format!("Unknown prompt: {name}")))?;
            body["params"]["ref"]["name"] = json!(upstream);
            i
        }
        Some("ref/resource") => {
            let uri = r["uri"].as_str().unwrap_or("").to_string();
            resource_owner(req, &uri, deadline)
                .await?
                .ok_or(GatewayError::ResourceNotFound { uri })?
        }
        _ => {
            return Err(GatewayError::InvalidParams(
                "params.ref must be a ref/prompt or a ref/resource".into(),
            ));
        }
    };
    forward(req, ctx, member, Bytes::from(to_json(&body)), deadline).await
}

#[cfg(test)]
mod tests;
