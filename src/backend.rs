//! One configured backend and the state portico keeps about it: how it is reached (the
//! transport), what era it speaks (the probe verdict), its health, breaker and limits, and the
//! data of its upstream initialize-era sessions (one per client, pooled). Data only: the behaviour lives above — the
//! bridge (`bridge`) drives the session, the checker (`health`) writes the health, the
//! per-backend step (`step`) admits requests.
//!
//! Built once per config generation by [`Backend::build`] (startup and every reload).

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::{BackendConfig, Protocol, Transport};
use crate::pool::Pool;
use crate::resilience::Resilience;
use crate::upstream::demo::Demo;
use crate::upstream::{Upstream, http::HttpUpstream, sse::SseTarget, stdio::StdioUpstream};

/// Session-wide notifications buffered per subscriber of [`BridgeState::subscribe`].
pub const NOTES_QUEUE: usize = 64;

/// What a backend has been found to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not probed yet.
    Unknown = 0,
    Modern = 1,
    Legacy = 2,
}

impl Verdict {
    /// The era as a label (`portico_backend_protocol`, `/readyz`).
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Modern => "modern",
            Verdict::Legacy => "legacy",
            Verdict::Unknown => "unknown",
        }
    }
}

/// One configured backend.
pub struct Backend {
    pub name: Arc<str>,
    pub cfg: BackendConfig,
    pub upstream: Upstream,
    /// An `auto` backend whose URL turned out to serve the 2024-11-05 HTTP+SSE transport
    /// (the probe's fallback, `bridge::probe`): the link its sessions use from then on.
    sse_found: std::sync::OnceLock<Upstream>,
    /// Probe verdict, shared by every request (an atomic: read on the hot path, written rarely).
    verdict: AtomicU8,
    pub timeout: Duration,
    /// Legacy-bridge state: probe lock and the upstream session.
    pub bridge: BridgeState,
    /// Last health check, for `/readyz` and `portico_backend_up`.
    pub health: Health,
    /// Breaker, retry budget, concurrency limit.
    pub resilience: Resilience,
    /// `team_headers`, parsed: sent upstream (over `headers`) for callers of that team.
    pub team_headers: HashMap<String, Vec<(HeaderName, HeaderValue)>>,
    /// What the status page shows: latency window, in-flight count, last error, tool catalogue.
    pub stats: crate::stats::BackendStats,
    /// The `x-mcp-header` annotations of its tools, for the `Mcp-Param-*` headers portico
    /// builds when it writes a 2026-07-28 `tools/call` itself.
    pub tool_params: crate::param_headers::ToolParams,
    /// The last `tools/list` result learnt from ([`Backend::learn_tools_list`]).
    tools_list_seen: std::sync::Mutex<Bytes>,
}

impl Backend {
    /// The backend `cfg` describes (a valid config: what can still fail here is a header value
    /// or an upstream URL the HTTP client refuses).
    pub fn build(cfg: &BackendConfig) -> Result<Backend, String> {
        let configured = match cfg.protocol {
            Protocol::Modern => Verdict::Modern,
            Protocol::Legacy => Verdict::Legacy,
            Protocol::Auto => Verdict::Unknown,
        };
        let (upstream, verdict) = if let (Some(url), Transport::Sse) = (&cfg.url, cfg.transport) {
            // The 2024-11-05 HTTP+SSE transport: a message link like a stdio child's, one
            // session (event stream) per owner (`upstream::sse`).
            let up = Arc::new(HttpUpstream::new(cfg, url).map_err(|e| e.to_string())?);
            let target = Arc::new(SseTarget::new(up, url)?);
            let up = StdioUpstream::new_sse(cfg, target);
            (Upstream::Stdio(Arc::new(up)), Verdict::Legacy)
        } else if let Some(url) = &cfg.url {
            let up = HttpUpstream::new(cfg, url).map_err(|e| e.to_string())?;
            (Upstream::Http(Arc::new(up)), configured)
        } else if let Some(cmd) = &cfg.command {
            let up = StdioUpstream::new(cfg, cmd.clone());
            (Upstream::Stdio(Arc::new(up)), configured)
        } else {
            (Upstream::Builtin(Demo), Verdict::Modern)
        };
        let mut team_headers = HashMap::new();
        for (team, headers) in &cfg.team_headers {
            let mut parsed = Vec::with_capacity(headers.len());
            for (k, v) in headers {
                let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
                let value = HeaderValue::from_str(v).map_err(|e| e.to_string())?;
                parsed.push((name, value));
            }
            team_headers.insert(team.clone(), parsed);
        }
        Ok(Backend {
            name: cfg.name.as_str().into(),
            cfg: cfg.clone(),
            upstream,
            sse_found: Default::default(),
            verdict: AtomicU8::new(verdict as u8),
            timeout: Duration::from_millis(cfg.timeout_ms),
            bridge: BridgeState::new(cfg),
            health: Default::default(),
            resilience: Resilience::new(cfg),
            team_headers,
            stats: Default::default(),
            tool_params: Default::default(),
            tools_list_seen: Default::default(),
        })
    }

    /// Learns the tool names (per-tool metric labels, `stats::tools`) and `x-mcp-header`
    /// annotations (`param_headers`) from a `tools/list` answer — unless the answer's result
    /// is the one learnt from last time. A list is mostly the same list again: without the
    /// check, every uncached list (an aggregated endpoint asks each member for one per client
    /// list) paid two full parses of it; a comparison of the text from `"result"` on (the id,
    /// written before it, does not count) costs a `memcmp`.
    pub fn learn_tools_list(&self, answer: &Bytes) {
        static RESULT: crate::protocol::Needle =
            crate::protocol::Needle::new(|| memchr::memmem::Finder::new(b"\"result\""));
        let from = RESULT.find(answer).unwrap_or(0);
        let result = answer.slice(from..);
        {
            let mut seen = self
                .tools_list_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if *seen == result {
                return;
            }
            *seen = result;
        }
        self.stats.tools.learn_list(answer);
        self.tool_params.learn_list(answer);
    }

    /// How the backend's messages travel: the configured transport, or the HTTP+SSE link the
    /// probe found at its URL.
    pub fn transport(&self) -> &Upstream {
        self.sse_found.get().unwrap_or(&self.upstream)
    }

    /// Records that the URL serves the 2024-11-05 HTTP+SSE transport (once; the probe holds
    /// the backend's probe lock).
    pub fn found_sse(&self, link: StdioUpstream) {
        let _ = self.sse_found.set(Upstream::Stdio(Arc::new(link)));
    }

    pub fn verdict(&self) -> Verdict {
        match self.verdict.load(Ordering::Relaxed) {
            1 => Verdict::Modern,
            2 => Verdict::Legacy,
            _ => Verdict::Unknown,
        }
    }

    pub fn set_verdict(&self, v: Verdict) {
        self.verdict.store(v as u8, Ordering::Relaxed);
    }
}

/// A backend's state as of its last check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not checked yet.
    Unknown = 0,
    Up = 1,
    Down = 2,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Up => "up",
            Status::Down => "down",
        }
    }
}

/// Per-backend health, written by the checker and read by `/readyz` and scrapes.
#[derive(Default)]
pub struct Health {
    status: AtomicU8,
    /// When the last check finished, and why it failed (if it did). Locked briefly, never across
    /// an await.
    last: Mutex<Option<(Instant, Option<String>)>>,
}

impl Health {
    pub fn status(&self) -> Status {
        match self.status.load(Ordering::Relaxed) {
            1 => Status::Up,
            2 => Status::Down,
            _ => Status::Unknown,
        }
    }

    /// Time since the last check and its failure reason.
    pub fn last(&self) -> Option<(Duration, Option<String>)> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().map(|(at, why)| (at.elapsed(), why.clone()))
    }

    /// Records one check's result (a failure after success is logged once).
    pub fn set(&self, backend: &str, result: Result<(), String>) {
        let status = if result.is_ok() {
            Status::Up
        } else {
            Status::Down
        };
        let prev = self.status.swap(status as u8, Ordering::Relaxed);
        if let Err(why) = &result
            && prev != Status::Down as u8
        {
            tracing::warn!(backend, why = %why, "backend health check failed");
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), result.err()));
    }
}

/// Per-backend bridge state.
pub struct BridgeState {
    /// One probe at a time per backend.
    pub(crate) probe_lock: tokio::sync::Mutex<()>,
    /// The last probe's failure and when (`bridge::probe`): the requests that queued behind it
    /// fail with it instead of each probing again.
    pub(crate) probe_failed:
        std::sync::Mutex<Option<(tokio::time::Instant, crate::error::GatewayError)>>,
    /// The upstream legacy sessions, one per owner (a client's authorization context and
    /// declared capabilities, a legacy-client session, or portico itself), capped and reaped
    /// when idle (`crate::pool`).
    pub(crate) pool: Pool<SessionSlot>,
    /// Whether the idle reaper of `pool` runs (started with the first session).
    pub(crate) reaper: AtomicBool,
    /// Gateway-unique request ids and progress tokens within the upstream sessions.
    pub(crate) next_id: AtomicU64,
    /// Session-wide messages of an HTTP legacy session (its standalone GET stream, read by
    /// the cache watcher), for whoever else needs them: aggregated `subscriptions/listen`.
    /// One GET stream per session serves both (servers may allow only one).
    pub(crate) notes: tokio::sync::broadcast::Sender<Bytes>,
    /// What an HTTP server said of its sessions' GET stream ([`GetStream`]): asked before the
    /// first `server/discover` is answered (`bridge::listen::learn_channel`) and learned again
    /// from every GET portico opens; once refused (HTTP 405, the spec's way to offer none),
    /// list changes and resource updates — which only that stream carries — are not
    /// advertised (`bridge::delivered`).
    get_stream: AtomicU8,
    /// Held while the GET-stream question is asked: discovers that come meanwhile wait for its
    /// answer instead of each opening a stream of their own.
    pub(crate) asking_get_stream: tokio::sync::Mutex<()>,
    /// Calls parked for a 2026-07-28 client's answers (`bridge::input`), now.
    pub parked: AtomicU64,
    /// Parked calls whose hold ran out.
    pub parked_expired: AtomicU64,
    /// The last `InitializeResult` a session of this backend was given, with its `serverInfo`:
    /// shared by every later session given the same one, so that ten thousand sessions of one
    /// server hold one copy of it rather than one each (README, "Scale").
    last_init: Mutex<Option<InitResult>>,
}

/// What a server said when asked for a session's GET stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum GetStream {
    /// Not asked yet, or the question never reached it (a connection error, a timeout).
    Unknown = 0,
    /// It served one (or refused a second one with 409: it has one).
    Offered = 1,
    /// HTTP 405: it offers none.
    Refused = 2,
    /// It answered neither (another status): not asked again, and — as before anything was
    /// known — not held against it; a later GET that is served or refused 405 settles it.
    Unclear = 3,
}

impl GetStream {
    /// What the status of an answer to a session's GET says: one place for the bridge's
    /// question, its listens and the cache watcher.
    pub fn said(status: StatusCode) -> GetStream {
        match status {
            s if s.is_success() || s == StatusCode::CONFLICT => GetStream::Offered,
            StatusCode::METHOD_NOT_ALLOWED => GetStream::Refused,
            _ => GetStream::Unclear,
        }
    }
}

/// A server's `InitializeResult` and its `serverInfo` ([`ServerInfo::of`]), shared by the
/// sessions it was given to ([`BridgeState::shared_init`]).
#[derive(Clone)]
pub struct InitResult {
    pub init: Arc<Value>,
    pub server_info: Option<Arc<ServerInfo>>,
}

impl BridgeState {
    /// What the server said of its GET stream so far.
    pub fn get_stream(&self) -> GetStream {
        match self.get_stream.load(Ordering::Relaxed) {
            1 => GetStream::Offered,
            2 => GetStream::Refused,
            3 => GetStream::Unclear,
            _ => GetStream::Unknown,
        }
    }

    /// Records what the server said when asked for a GET stream: `Offered` and `Refused`
    /// always (the latest answer holds), `Unclear` only over `Unknown`, `Unknown` never.
    pub fn learn_get_stream(&self, said: GetStream) {
        match said {
            GetStream::Unknown => {}
            GetStream::Unclear => {
                let _ = self.get_stream.compare_exchange(
                    GetStream::Unknown as u8,
                    said as u8,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            GetStream::Offered | GetStream::Refused => {
                self.get_stream.store(said as u8, Ordering::Relaxed)
            }
        }
    }

    pub fn new(cfg: &BackendConfig) -> BridgeState {
        BridgeState {
            probe_lock: Default::default(),
            probe_failed: Default::default(),
            pool: Pool::new(
                cfg.max_upstream_sessions,
                Duration::from_millis(cfg.upstream_idle_ms),
            ),
            reaper: AtomicBool::new(false),
            next_id: Default::default(),
            notes: tokio::sync::broadcast::channel(NOTES_QUEUE).0,
            get_stream: AtomicU8::new(GetStream::Unknown as u8),
            asking_get_stream: Default::default(),
            parked: AtomicU64::new(0),
            parked_expired: AtomicU64::new(0),
            last_init: Mutex::new(None),
        }
    }

    /// `init` as a session keeps it: the copy the last session holds when the server gave the
    /// same result (the usual case: a server answers every `initialize` alike), else a new one
    /// that later sessions share. Sharing crosses no client's boundary: a session only ever
    /// holds a value equal to the one its own `initialize` was answered with.
    pub fn shared_init(&self, init: Value) -> InitResult {
        let mut last = self.last_init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = last.as_ref().filter(|l| *l.init == init) {
            return l.clone();
        }
        let fresh = InitResult {
            server_info: ServerInfo::of(&init),
            init: Arc::new(init),
        };
        *last = Some(fresh.clone());
        fresh
    }

    /// Publishes one session-wide message from the upstream GET stream (cheap without
    /// subscribers).
    pub fn publish(&self, message: &Bytes) {
        if self.notes.receiver_count() > 0 {
            let _ = self.notes.send(message.clone());
        }
    }

    /// Session-wide messages of the upstream legacy session from now on (see `publish`).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Bytes> {
        self.notes.subscribe()
    }

    /// Upstream legacy sessions open now (for the metrics gauge and the status page).
    pub fn session_count(&self) -> usize {
        self.pool.len()
    }
}

/// The standalone GET stream of one upstream HTTP session while someone listens in it (the
/// owner's `subscriptions/listen` streams, an initialize-era client's own GET stream): one per
/// session, since servers may allow only one. The reading task holds the only sender, so its
/// end (the server closed the stream) ends every subscriber; dropping the last holder of this
/// stops the task, which closes the upstream stream.
pub struct SessionStream {
    /// A receiver kept to make more from (`resubscribe`); never read.
    pub rx: Mutex<tokio::sync::broadcast::Receiver<Bytes>>,
    pub task: tokio::task::AbortHandle,
}

impl SessionStream {
    /// The session's messages from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Bytes> {
        self.rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resubscribe()
    }
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One owner's upstream session: initialized on first use, re-made when lost.
pub struct SessionSlot {
    /// The session, once initialized.
    pub session: ArcSwapOption<LegacySession>,
    /// One `initialize` at a time per slot.
    pub init_lock: tokio::sync::Mutex<()>,
    /// The owner's own stdio child (`isolation = "per_client"`); `None`: the backend's
    /// transport (HTTP, or the shared / portico-own child).
    pub child: Option<Arc<StdioUpstream>>,
    /// An upstream session another replica opened for this owner (sealed in a legacy
    /// client's session id): adopted instead of a fresh `initialize`, once.
    pub adopt: Mutex<Option<(HeaderValue, HeaderValue)>>,
    /// The owner's upstream credentials when the slot was made (its team's `team_headers`, a
    /// token exchanged for it): its `DELETE` carries them, as its requests did.
    pub credentials: Vec<(http::HeaderName, HeaderValue)>,
}

/// An initialized upstream session.
pub struct LegacySession {
    /// `Mcp-Session-Id`, when the server issued one (stateless servers don't).
    pub id: Option<HeaderValue>,
    /// The negotiated revision, sent as `MCP-Protocol-Version` on every later request.
    pub version: HeaderValue,
    /// The server's `InitializeResult` (capabilities, serverInfo, instructions); one copy for
    /// every session given the same ([`BridgeState::shared_init`]).
    pub init: Arc<Value>,
    /// Its `serverInfo`, as the bridge adds it to every answer ([`ServerInfo::of`] of `init`).
    pub server_info: Option<Arc<ServerInfo>>,
    /// stdio child generation the session belongs to (0 for HTTP).
    pub generation: u64,
    /// The owner's own stdio child the session lives in; `None`: the backend's transport.
    pub child: Option<Arc<StdioUpstream>>,
    /// The level last set upstream with `logging/setLevel`, as 1 + its rank in
    /// `protocol::LOG_LEVELS`; 0 = never set (the server's default).
    pub log_level: AtomicU8,
    /// Its GET stream while someone listens (HTTP); see [`SessionStream`]. The session's own,
    /// not its slot's: a session that replaces a lost one opens its own stream, and listeners
    /// of the lost one keep nothing of theirs in it.
    pub stream: tokio::sync::Mutex<std::sync::Weak<SessionStream>>,
    /// Resource URIs subscribed upstream (`resources/subscribe`) in this session, with how many
    /// listeners want each: unsubscribed when the last one leaves.
    pub subscribed: Mutex<HashMap<String, usize>>,
}

/// A legacy server's `serverInfo`, with its JSON text: the bridge adds it to every answer's
/// `_meta`, and copying the text is cheaper than cloning and serializing the value each time.
#[derive(Debug)]
pub struct ServerInfo {
    pub value: Value,
    pub json: Box<str>,
}

impl ServerInfo {
    /// The `serverInfo` of an `InitializeResult`, if it has one.
    pub fn of(init: &Value) -> Option<Arc<ServerInfo>> {
        init.get("serverInfo").map(|v| {
            Arc::new(ServerInfo {
                value: v.clone(),
                json: v.to_string().into(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(id: u64, tools: &[&str]) -> Bytes {
        let tools: Vec<_> = tools
            .iter()
            .map(|t| serde_json::json!({"name": t, "inputSchema": {"type": "object"}}))
            .collect();
        Bytes::from(
            serde_json::json!({"jsonrpc":"2.0","id":id,"result":{"tools":tools}}).to_string(),
        )
    }

    /// A backend to test its own state on (the built-in demo server).
    fn demo() -> Backend {
        let cfg = crate::config::validate(
            crate::config::parse("[[backends]]\nname='d'\nbuiltin='demo'\n").expect("parse"),
        )
        .expect("valid");
        Backend::build(&cfg.backends[0]).expect("backend")
    }

    /// What a server said of its GET stream: the latest clear answer holds; an unclear one
    /// only marks that it was asked (so it is not asked on every discover), and never
    /// overrides a clear one; a question that never arrived changes nothing.
    #[test]
    fn the_latest_clear_answer_about_the_get_stream_holds() {
        use GetStream::*;
        let b = demo();
        assert_eq!(b.bridge.get_stream(), Unknown);
        // (what the server said, what is known after it)
        let steps = [
            (Unknown, Unknown),
            (Unclear, Unclear),
            (Refused, Refused),
            (Unclear, Refused),
            (Offered, Offered),
            (Unknown, Offered),
        ];
        for (said, known) in steps {
            b.bridge.learn_get_stream(said);
            assert_eq!(b.bridge.get_stream(), known, "after {said:?}");
        }
    }

    /// Sessions answered with the same `InitializeResult` share one copy of it and of its
    /// `serverInfo`; a different result is kept apart (and is the one shared from then on).
    #[test]
    fn sessions_answered_alike_share_one_initialize_result() {
        let b = demo();
        let init = |instructions: &str| {
            serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "s", "version": "1"}, "instructions": instructions})
        };
        let first = b.bridge.shared_init(init("a"));
        let same = b.bridge.shared_init(init("a"));
        assert!(Arc::ptr_eq(&first.init, &same.init), "one copy for both");
        let (Some(i1), Some(i2)) = (&first.server_info, &same.server_info) else {
            panic!("serverInfo read from the result");
        };
        assert!(Arc::ptr_eq(i1, i2));
        assert_eq!(&*i1.json, r#"{"name":"s","version":"1"}"#);
        let other = b.bridge.shared_init(init("b"));
        assert!(!Arc::ptr_eq(&first.init, &other.init), "kept apart");
        assert_eq!(other.init["instructions"], "b");
        assert_eq!(first.init["instructions"], "a", "the first is unchanged");
        let again = b.bridge.shared_init(init("b"));
        assert!(Arc::ptr_eq(&other.init, &again.init));
    }

    /// The same list again (under another id) is not learnt twice; a changed one is, at once,
    /// and so is a list seen before the last one.
    #[test]
    fn a_tool_list_is_learnt_when_it_changes() {
        let b = demo();
        b.learn_tools_list(&list(1, &["a"]));
        assert!(b.stats.tools.knows("a"));
        let seen = b.tools_list_seen.lock().unwrap().clone();
        b.learn_tools_list(&list(2, &["a"]));
        assert_eq!(
            b.tools_list_seen.lock().unwrap().as_ptr(),
            seen.as_ptr(),
            "the same result under another id is the one learnt"
        );
        b.learn_tools_list(&list(3, &["a", "b"]));
        assert!(b.stats.tools.knows("b"));
        b.tool_params.forget("a");
        b.learn_tools_list(&list(4, &["a"]));
        assert!(
            b.tool_params.get("a").is_some(),
            "a list seen before the last one"
        );
    }
}
