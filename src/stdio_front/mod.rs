//! The stdio front end: portico as the local bridge for MCP clients that can only launch a
//! command and talk to it over stdin/stdout (`portico stdio …`, docs/protocol.md §5 and §7).
//!
//! Each stdin line becomes an in-process `http::Request` — a POST to the served endpoint with
//! exactly the headers a Streamable HTTP client would send — and goes through the same pipeline
//! as HTTP (`proxy::handle`): era detection, header and `_meta` checks, the legacy-client
//! translation, the cache, the backend bridge. The `Response` is turned back into lines: a JSON
//! body is one line, an SSE body is one line per event as it arrives, 202 is nothing. So
//! everything the HTTP front end does, this one does, with no second dispatch to keep in step.
//!
//! What is stdio's own:
//! - **Era per process.** A client that starts with `initialize` gets a legacy session for the
//!   life of the process: the session id the pipeline mints is kept here and sent (with the
//!   negotiated `MCP-Protocol-Version`) on every later line. Before that, lines are 2026-07-28
//!   requests, served statelessly; their mirrored headers are copied from the body, so the
//!   pipeline's `_meta` checks decide, not this module. An `initialize` whose `_meta` names
//!   2026-07-28 is such a request (refused as removed, `-32601`), not the start of a session.
//!   What such a client would hear on its GET stream (list changes, resource updates, log
//!   lines) is written to stdout as it comes: the stream is opened in-process right after the
//!   `initialize` answer, so what `initialize` advertises is delivered here too, and reopened
//!   when it ends (`[server] max_stream_ms`, a backend restart) as an HTTP client reconnects.
//! - **`Mcp-Param-*`.** A 2026-07-28 `tools/call` line is marked [`frontend::BuiltByPortico`]:
//!   the pipeline then takes the message path, where the per-backend step adds the headers a
//!   Streamable HTTP client would have built from the tool's `inputSchema`.
//! - **Concurrency.** One task per request line, answered in any order; one writer task owns
//!   stdout so lines never interleave. `initialize` runs inline, so the session exists before
//!   its answer is written and before the client can send anything that needs it.
//! - **Cancellation.** `notifications/cancelled` aborts the matching task: dropping its answer
//!   closes the upstream stream (and the bridge tells a legacy upstream `notifications/cancelled`).
//!   It is never forwarded to a backend: on HTTP, closing the stream *is* the cancel. A batch
//!   element has no task of its own: its cancel goes to the pipeline in the session, as an HTTP
//!   client's would, which drops that element's call (`step::calls`).
//! - **Bad input.** A non-JSON line gets `-32700` (id null), an over-long line a `-32600` naming
//!   the limit — skipped without buffering it — and the process keeps going. Notifications and
//!   responses are never answered, even when the pipeline refuses them (JSON-RPC forbids it).
//! - **Endings.** EOF on stdin or the shutdown signal stops reading; in-flight requests get up to
//!   `server.drain_timeout_ms` to finish and be written, then the rest are dropped.
//!
//! Logs go to stderr (set up in `main`); stdout carries protocol lines only.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, header};
use http_body_util::Full;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use crate::config::{self, Config, ConfigError};
use crate::error::GatewayError;
use crate::frontend;
use crate::metrics::Metrics;
use crate::protocol::{self, EnvelopeError, Kind, LATEST_VERSION, RequestId, header as h};
use crate::state::{StartError, State};
use crate::upstream::stdio::{Line, LineReader};

mod lines;
use lines::{NotesLink, relay, relay_batch, relay_notes, write_lines};

/// The backend name `portico stdio --url` gives the one upstream it synthesizes.
pub const URL_BACKEND_NAME: &str = "upstream";
/// A stdio session lives as long as the process, so its sealed id must not expire first.
pub const STDIO_SESSION_TTL_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;
/// Lines waiting for stdout; beyond this, producers wait (backpressure from a slow reader).
const OUT_QUEUE: usize = 256;
/// Requests handled at once; past this, stdin is not read until one finishes (backpressure on a
/// client that pipes faster than the backend answers).
const MAX_IN_FLIGHT: usize = 1024;

/// How a stdio front end serves.
#[derive(Debug, Clone)]
pub struct StdioOptions {
    /// The endpoint path (or backend name) to serve; `None` = the only one configured.
    pub endpoint: Option<String>,
    /// Longest stdin line accepted; `None` = `server.max_body_bytes`.
    pub max_line_bytes: Option<usize>,
    /// The `Authorization` value the stdio client stands behind (`--token`): sent with every
    /// line's in-process request, so `[auth]`, team policies, `allow_teams` and rate limits
    /// apply to a stdio client exactly as to an HTTP one. Checked once at start.
    pub authorization: Option<String>,
}

/// Why the stdio front end could not start.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("{0}")]
    Endpoint(String),
}

/// The config `portico stdio --url URL [--header "K: V"]…` stands for: one backend named
/// [`URL_BACKEND_NAME`] at `url`, built through the same parse and validation as a file (so
/// `${ENV}` in header values is expanded and every rule applies). Access logs are off: a stdio
/// client usually shows stderr to its user.
pub fn url_config(url: &str, headers: &[String]) -> Result<Config, ConfigError> {
    let mut map = serde_json::Map::new();
    for (i, line) in headers.iter().enumerate() {
        let Some((k, v)) = line.split_once(':') else {
            return Err(ConfigError::Invalid {
                key: format!("--header[{i}]"),
                message: format!("{line:?}: want \"Name: value\""),
            });
        };
        map.insert(k.trim().to_string(), Value::String(v.trim().to_string()));
    }
    let raw = serde_json::json!({
        "log": {"access": false},
        "backends": [{"name": URL_BACKEND_NAME, "url": url, "headers": map}],
    });
    let config: Config =
        serde_json::from_value(raw).map_err(|e| ConfigError::Parse(e.to_string()))?;
    config::validate(config)
}

/// Builds state from `config`, serves the chosen endpoint over `reader`/`writer` until EOF or
/// `shutdown`, then ends upstream sessions and stdio children. `main` and tests call this.
pub async fn run<R, W>(
    mut config: Config,
    opts: StdioOptions,
    reader: R,
    writer: W,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StdioError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // Sessions here are this process's alone: they must outlive nothing but the process, and a
    // fresh random key needs no warning about replicas.
    config.sessions.ttl_ms = STDIO_SESSION_TTL_MS;
    if config.sessions.key.is_none() {
        config.sessions.key = random_key();
    }
    let max_line = opts.max_line_bytes.unwrap_or(config.server.max_body_bytes);
    let drain = Duration::from_millis(config.server.drain_timeout_ms);
    let state = Arc::new(State::build(config, Arc::new(Metrics::new()))?);
    let path = endpoint_path(&state, opts.endpoint.as_deref())?;
    let caller = caller(&state, &path, opts.authorization.as_deref()).await?;
    tracing::info!(endpoint = %path, max_line, "portico stdio: serving");
    serve_stdio(
        state.clone(),
        path,
        caller,
        max_line,
        drain,
        reader,
        writer,
        shutdown,
    )
    .await;
    state.shutdown().await;
    Ok(())
}

/// Who the stdio client is: its credential, authenticated once against `[auth]` (a refused one
/// stops the start, naming why), and the principal its legacy session is bound to.
#[derive(Clone, Default)]
pub struct Caller {
    authorization: Option<HeaderValue>,
    principal: Option<String>,
}

impl Caller {
    /// A client that authenticated elsewhere (the HTTP+SSE transport's `GET`): the credential
    /// its messages carry, and the principal it was found to be.
    pub(crate) fn new(authorization: Option<HeaderValue>, principal: Option<String>) -> Caller {
        Caller {
            authorization,
            principal,
        }
    }

    /// The principal the client authenticated as (`None` without `[auth]`).
    pub(crate) fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }
}

async fn caller(
    state: &State,
    path: &str,
    authorization: Option<&str>,
) -> Result<Caller, StdioError> {
    let mut headers = HeaderMap::new();
    let value = match authorization {
        Some(a) => Some(HeaderValue::from_str(a).map_err(|_| {
            StdioError::Endpoint("the credential is not a valid header value".into())
        })?),
        None => None,
    };
    if let Some(v) = &value {
        headers.insert(header::AUTHORIZATION, v.clone());
    }
    let principal = state
        .auth
        .authenticate(&headers, path)
        .await
        .map_err(|e| StdioError::Endpoint(format!("portico stdio: {e}")))?;
    Ok(Caller {
        authorization: value,
        principal: principal.map(|p| p.id.clone()),
    })
}

/// 32 random bytes as hex, or `None` (then `session` makes its own, with a warning).
fn random_key() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut k = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut k).ok()?;
    Some(k.iter().map(|b| format!("{b:02x}")).collect())
}

/// Which route to serve: the one asked for (a path, or a backend name), else the only one.
fn endpoint_path(state: &State, asked: Option<&str>) -> Result<String, StdioError> {
    let mut known: Vec<&str> = state.routes.routes.keys().map(String::as_str).collect();
    known.sort_unstable();
    let path = match asked {
        Some(p) if p.starts_with('/') => p.to_string(),
        Some(name) => format!("/mcp/{name}"),
        None => match known.as_slice() {
            [only] => only.to_string(),
            _ => {
                return Err(StdioError::Endpoint(format!(
                    "the config serves {} endpoints; choose one with --endpoint ({})",
                    known.len(),
                    known.join(", ")
                )));
            }
        },
    };
    if !state.routes.routes.contains_key(&path) {
        return Err(StdioError::Endpoint(format!(
            "--endpoint {path}: no such endpoint (known: {})",
            known.join(", ")
        )));
    }
    Ok(path)
}

/// The legacy session a client opened with `initialize`.
struct LegacyClient {
    session_id: HeaderValue,
    version: HeaderValue,
    /// The task relaying the session's GET stream to stdout; stopped when input ends.
    notes: Option<AbortHandle>,
}

/// Requests in flight, by JSON-RPC id, so a cancel can find its task.
#[derive(Default)]
struct InFlight {
    by_id: HashMap<RequestId, (tokio::task::Id, AbortHandle)>,
    by_task: HashMap<tokio::task::Id, RequestId>,
}

impl InFlight {
    fn insert(&mut self, id: RequestId, handle: AbortHandle) {
        self.by_task.insert(handle.id(), id.clone());
        self.by_id.insert(id, (handle.id(), handle));
    }

    fn finished(&mut self, task: tokio::task::Id) {
        if let Some(id) = self.by_task.remove(&task)
            && self.by_id.get(&id).is_some_and(|(t, _)| *t == task)
        {
            self.by_id.remove(&id);
        }
    }

    fn cancel(&mut self, id: &RequestId) -> bool {
        match self.by_id.remove(id) {
            Some((task, handle)) => {
                self.by_task.remove(&task);
                handle.abort();
                true
            }
            None => false,
        }
    }
}

/// Serves `path` of `state` over newline-delimited JSON-RPC until EOF or `shutdown`, then lets
/// in-flight requests finish for up to `drain` and flushes `writer`.
#[allow(clippy::too_many_arguments)]
pub async fn serve_stdio<R, W>(
    state: Arc<State>,
    path: String,
    caller: Caller,
    max_line: usize,
    drain: Duration,
    reader: R,
    writer: W,
    shutdown: impl Future<Output = ()>,
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, rx) = mpsc::channel::<Bytes>(OUT_QUEUE);
    let writer_task = tokio::spawn(write_lines(writer, rx));
    let input = Input::Lines(LineReader::new(reader, max_line));
    let current: Current = Arc::new(move || state.clone());
    serve_link(
        current, path, caller, max_line, drain, input, &out, shutdown,
    )
    .await;
    drop(out);
    // The last answers go out within the drain time too: a parent that stopped reading stdout
    // must not keep portico from exiting.
    let mut writer_task = writer_task;
    if tokio::time::timeout(drain, &mut writer_task).await.is_err() {
        tracing::warn!("stdout not drained within the drain time; exiting without it");
        writer_task.abort();
    }
}

/// The config generation a link's next message is served by: `portico stdio`'s one, or the
/// one in force now (an HTTP+SSE session outlives reloads, and each of its messages is served as
/// an HTTP client's request arriving then would be).
pub(crate) type Current = Arc<dyn Fn() -> Arc<State> + Send + Sync>;

/// Where a link's client messages come from: stdin lines, or the bodies POSTed to a 2024-11-05
/// HTTP+SSE session (`sse_front`), one message each.
pub(crate) enum Input<R> {
    Lines(LineReader<R>),
    Posts(mpsc::Receiver<Post>),
}

/// One message POSTed to an HTTP+SSE session, with the credential it came with (already
/// authenticated as the session's principal): a client whose token was refreshed goes on with
/// the new one.
pub(crate) struct Post {
    pub body: Bytes,
    pub authorization: Option<HeaderValue>,
}

impl<R: AsyncRead + Unpin> Input<R> {
    /// The next message, and the credential it brings (`None`: the caller's stands); `None` at
    /// the end of input. Cancel-safe, like both sources.
    async fn next(&mut self) -> std::io::Result<Option<(Line, Option<HeaderValue>)>> {
        match self {
            Input::Lines(lines) => Ok(lines.next_line().await?.map(|l| (l, None))),
            Input::Posts(rx) => Ok(rx
                .recv()
                .await
                .map(|p| (Line::Text(p.body.into()), p.authorization))),
        }
    }
}

/// A message link's loop: each message from `input` goes through the pipeline as a Streamable
/// HTTP client's request would (one task per request), and what the client is owed — answers,
/// the server's requests and notifications during calls, its session's GET stream — goes to
/// `out`, one JSON-RPC message per item. Ends at the end of input or at `shutdown`, then lets
/// in-flight requests finish for up to `drain`. `portico stdio` and the HTTP+SSE transport
/// (`sse_front`) are this loop over two links.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_link<R>(
    current: Current,
    path: String,
    mut caller: Caller,
    max_line: usize,
    drain: Duration,
    mut input: Input<R>,
    out: &mpsc::Sender<Bytes>,
    shutdown: impl Future<Output = ()>,
) where
    R: AsyncRead + Unpin + Send,
{
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut inflight = InFlight::default();
    let mut session: Option<LegacyClient> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => {
                tracing::info!("shutdown signal: no more input read");
                break;
            }
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let task = match done {
                    Ok((task, ())) => task,
                    Err(e) => e.id(),
                };
                inflight.finished(task);
            }
            line = input.next(), if tasks.len() < MAX_IN_FLIGHT => match line {
                Ok(Some((Line::Text(text), credential))) => {
                    if credential.is_some() {
                        caller.authorization = credential;
                    }
                    let state = current();
                    let mut line = LineCtx {
                        state: &state,
                        current: &current,
                        path: &path,
                        out,
                        tasks: &mut tasks,
                        inflight: &mut inflight,
                        session: &mut session,
                        caller: &caller,
                    };
                    // Usually quick (parse, spawn); `initialize` waits for the backend, and a
                    // signal must not wait for it.
                    tokio::select! {
                        _ = line.serve(Bytes::from(text)) => {}
                        _ = &mut shutdown => {
                            tracing::info!("shutdown signal: no more input read");
                            break;
                        }
                    }
                }
                Ok(Some((Line::TooLong(len), _))) => {
                    tracing::warn!(len, limit = max_line, "stdin line too long; skipped");
                    let err = GatewayError::InvalidRequest(format!(
                        "message of {len} bytes is longer than the {max_line}-byte line limit; skipped"
                    ));
                    let _ = out.send(Bytes::from(err.to_message(None))).await;
                }
                Ok(None) => {
                    tracing::debug!("input closed");
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read input");
                    break;
                }
            },
        }
    }
    // Nothing more is asked, so nothing more is heard: the GET stream ends first.
    if let Some(notes) = session.as_ref().and_then(|s| s.notes.as_ref()) {
        notes.abort();
    }
    // Finish what is in flight, within the drain time.
    let pending = tasks.len();
    if pending > 0 {
        tracing::info!(
            pending,
            drain_ms = drain.as_millis() as u64,
            "draining in-flight requests"
        );
        let finished =
            tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(
                left = tasks.len(),
                "drain time over; dropping unfinished requests"
            );
            tasks.shutdown().await;
        }
    }
}

/// One stdin line and what it may touch. (A struct so the helpers share the borrows.)
struct LineCtx<'a> {
    state: &'a Arc<State>,
    current: &'a Current,
    path: &'a str,
    out: &'a mpsc::Sender<Bytes>,
    tasks: &'a mut JoinSet<()>,
    inflight: &'a mut InFlight,
    session: &'a mut Option<LegacyClient>,
    caller: &'a Caller,
}

impl LineCtx<'_> {
    /// The line's request, in the client's session when it has one.
    fn in_session(&self, env: Option<&protocol::Envelope>, body: Bytes) -> Request<Full<Bytes>> {
        request(self.path, env, body, self.session.as_ref(), self.caller)
    }

    async fn serve(&mut self, body: Bytes) {
        // A JSON-RPC batch within a session: the pipeline serves it when the session's revision
        // has batches (2025-03-26) and refuses it otherwise; either way its answer is relayed.
        if protocol::first_byte(&body) == Some(b'[') && self.session.is_some() {
            let req = self.in_session(None, body);
            let (state, out) = (self.state.clone(), self.out.clone());
            self.tasks.spawn(async move {
                let resp = crate::proxy::handle(state, req).await;
                relay_batch(resp, &out).await;
            });
            return;
        }
        let env = match protocol::parse_envelope(&body) {
            Ok(env) => env,
            Err(e) => {
                let id = match &e {
                    EnvelopeError::Invalid(_, id) => id.clone(),
                    _ => None,
                };
                let err = frontend::envelope_error(e);
                tracing::debug!(error = %err, "unreadable stdin line");
                let _ = self
                    .out
                    .send(Bytes::from(err.to_message(id.as_ref())))
                    .await;
                return;
            }
        };
        if env.kind == Kind::Notification && env.method == "notifications/cancelled" {
            if !self.cancel(&body) && self.session.is_some() {
                // No line of its own here: an element of a batch (one request to the pipeline),
                // cancelled there as an HTTP client's cancel is (`step::calls`).
                let req = self.in_session(Some(&env), body);
                let _ = crate::proxy::handle(self.state.clone(), req).await;
            }
            return;
        }
        let answers = env.kind == Kind::Request;
        let id = env.id.clone();
        if answers && starts_session(&env) {
            // Inline: the session must exist before the answer reaches the client.
            let req = request(self.path, Some(&env), body, None, self.caller);
            let resp = crate::proxy::handle(self.state.clone(), req).await;
            if let Some(sid) = resp.headers().get(h::SESSION_ID)
                && let Ok(text) = sid.to_str()
                && let Some(data) =
                    self.state
                        .sessions
                        .open(text, self.path, self.caller.principal.as_deref())
                && let Ok(version) = HeaderValue::from_str(&data.v)
            {
                let before = self.session.replace(LegacyClient {
                    session_id: sid.clone(),
                    version,
                    notes: None,
                });
                // A second `initialize` starts over: the old session's stream is not heard.
                if let Some(notes) = before.and_then(|s| s.notes) {
                    notes.abort();
                }
            }
            relay(resp, id.as_ref(), true, self.path, self.out).await;
            self.open_notes().await;
            return;
        }
        if let Some(rid) = &id
            && answers
            && self.inflight.by_id.contains_key(rid)
        {
            let err = GatewayError::InvalidRequest(format!(
                "id {} is already used by a request in flight",
                rid.json()
            ));
            let _ = self.out.send(Bytes::from(err.to_message(Some(rid)))).await;
            return;
        }
        let req = self.in_session(Some(&env), body);
        let state = self.state.clone();
        let out = self.out.clone();
        let task_id = id.clone();
        let route: Arc<str> = self.path.into();
        let handle = self.tasks.spawn(async move {
            let resp = crate::proxy::handle(state, req).await;
            relay(resp, task_id.as_ref(), answers, &route, &out).await;
        });
        if let (Some(id), true) = (id, answers) {
            self.inflight.insert(id, handle);
        }
    }

    /// What an HTTP client of the session hears on its GET stream — list changes, resource
    /// updates, log lines at its `logging/setLevel` — goes to stdout too: the stream is opened
    /// through the pipeline as that client would, once the session exists. Its head is awaited
    /// before the next line is read, so a `resources/subscribe` that follows has a listener for
    /// its updates.
    async fn open_notes(&mut self) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let mut headers = HeaderMap::with_capacity(4);
        if let Some(a) = &self.caller.authorization {
            headers.insert(header::AUTHORIZATION, a.clone());
        }
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(h::names::SESSION_ID, session.session_id.clone());
        headers.insert(h::names::PROTOCOL_VERSION, session.version.clone());
        let link = NotesLink {
            current: self.current.clone(),
            path: self.path.into(),
            headers,
        };
        let body = match link.open().await {
            Ok(body) => body,
            Err(status) => {
                tracing::info!(
                    status = status.as_u16(),
                    "no notification stream for the session"
                );
                return;
            }
        };
        let out = self.out.clone();
        session.notes = Some(tokio::spawn(relay_notes(link, body, out)).abort_handle());
    }

    /// `notifications/cancelled {requestId}`: drop the matching task (its upstream stream with
    /// it); whether there was one.
    fn cancel(&mut self, body: &[u8]) -> bool {
        let id = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| RequestId::from_value(&v["params"]["requestId"]));
        match id {
            Some(id) => {
                let found = self.inflight.cancel(&id);
                tracing::debug!(id = id.json(), found, "client cancelled a request");
                found
            }
            None => {
                tracing::debug!("notifications/cancelled without a usable requestId");
                true
            }
        }
    }
}

/// Whether a line starts a legacy session: `initialize`, unless its `_meta` names a 2026-07-28
/// revision — then it is a 2026-07-28 request like any other, and the pipeline refuses it as
/// removed (docs/protocol.md §2), as it would on HTTP.
fn starts_session(env: &protocol::Envelope) -> bool {
    env.method == "initialize" && env.protocol_version.is_none()
}

/// The in-process request a Streamable HTTP client would have sent for this message.
fn request(
    path: &str,
    env: Option<&protocol::Envelope>,
    body: Bytes,
    session: Option<&LegacyClient>,
    caller: &Caller,
) -> Request<Full<Bytes>> {
    let mut headers = HeaderMap::with_capacity(7);
    if let Some(a) = &caller.authorization {
        headers.insert(header::AUTHORIZATION, a.clone());
    }
    for (name, value) in h::post_headers() {
        headers.insert(name, value);
    }
    let version = h::names::PROTOCOL_VERSION;
    match (session, env) {
        (Some(s), _) => {
            headers.insert(h::names::SESSION_ID, s.session_id.clone());
            headers.insert(version, s.version.clone());
        }
        // `initialize` goes without a version header, as on HTTP (a batch, `env` `None`, is
        // only ever sent in a session).
        (None, None) => {}
        (None, Some(env)) if starts_session(env) => {}
        (None, Some(env)) => {
            // Mirror the body; a body that lies or lacks `_meta` is the pipeline's to refuse.
            let v = env.protocol_version.as_deref().unwrap_or(LATEST_VERSION);
            if let Ok(v) = HeaderValue::from_str(v) {
                headers.insert(version, v);
            }
            if let Ok(m) = HeaderValue::from_str(&env.method) {
                headers.insert(h::names::METHOD, m);
            }
            if let Some(name) = &env.name
                && let Ok(n) = HeaderValue::from_str(&protocol::encode_header_value(name))
            {
                headers.insert(h::names::NAME, n);
            }
        }
    }
    let mut req = Request::new(Full::new(body));
    if session.is_none() {
        req.extensions_mut().insert(frontend::BuiltByPortico);
    } else {
        req.extensions_mut().insert(frontend::InProcess);
    }
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::try_from(path).unwrap_or_else(|_| http::Uri::from_static("/"));
    *req.headers_mut() = headers;
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_config_goes_through_validation() {
        let c = url_config("http://127.0.0.1:1/mcp", &["X-Token: abc".into()]).unwrap();
        assert_eq!(c.backends.len(), 1);
        assert_eq!(c.backends[0].name, URL_BACKEND_NAME);
        assert_eq!(c.backends[0].headers["X-Token"], "abc");
        assert!(!c.log.access);
        let bad = url_config("ftp://x/", &[]).unwrap_err();
        assert!(bad.to_string().contains("backends[0].url"), "{bad}");
        let hdr = url_config("http://x/", &["no colon".into()]).unwrap_err();
        assert!(hdr.to_string().contains("--header[0]"), "{hdr}");
        let env = url_config("http://x/", &["A: ${PORTICO_SURELY_UNSET_VAR}".into()]).unwrap_err();
        assert!(
            env.to_string().contains("PORTICO_SURELY_UNSET_VAR"),
            "{env}"
        );
    }

    #[test]
    fn requests_carry_the_headers_of_an_http_client() {
        let body = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"caf\u00e9","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        );
        let env = protocol::parse_envelope(&body).unwrap();
        let req = request("/mcp/x", Some(&env), body.clone(), None, &Caller::default());
        let hd = req.headers();
        assert_eq!(hd[h::PROTOCOL_VERSION], "2026-07-28");
        assert_eq!(hd[h::METHOD], "tools/call");
        assert_eq!(
            protocol::decode_header_value(hd[h::NAME].as_bytes()).as_deref(),
            Some("café")
        );
        assert_eq!(hd[header::ACCEPT], h::ACCEPT_BOTH);
        let s = LegacyClient {
            session_id: HeaderValue::from_static("p1.abc"),
            version: HeaderValue::from_static("2025-06-18"),
            notes: None,
        };
        let req = request("/mcp/x", Some(&env), body, Some(&s), &Caller::default());
        assert_eq!(req.headers()[h::SESSION_ID], "p1.abc");
        assert_eq!(req.headers()[h::PROTOCOL_VERSION], "2025-06-18");
        assert!(req.headers().get(h::METHOD).is_none());
    }
}
