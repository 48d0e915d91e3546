//! The 2024-11-05 HTTP+SSE transport for clients, on every route: a client that still speaks it
//! (many desktop and agent frameworks do) opens `GET <route>/sse`, learns from its first event
//! (`endpoint`) where to POST, and sends each message to `POST <route>/messages?sessionId=…`,
//! which is accepted with 202; every answer, server request and notification comes back as an
//! `event: message` on the GET stream.
//!
//! A session here is `portico stdio`'s link with another pair of pipes: the POSTed messages go
//! through [`serve_link`] exactly as stdin lines do, so each is one in-process Streamable HTTP
//! request through the one pipeline (`proxy::handle`) — `initialize` opens an initialize-era
//! session, later messages carry its id, server requests during calls are relayed and their
//! answers routed back, what the session's GET stream carries (list changes, resource updates,
//! log lines) is written to the stream, and admission, policy, the cache and the bridge apply
//! as they do to any client. Nothing here speaks MCP.
//!
//! What is the transport's own:
//! - **Who may post.** The stream is opened by an authenticated caller (`[auth]`, the same
//!   checks and `Origin` rule as any request); a POST must present the session id and, under
//!   `[auth]`, authenticate — against the config in force, so a revoked key stops at once — as
//!   the same principal, else 403. Each message goes on with the credential it came with (a
//!   refreshed token replaces the old one). Session ids are 128 random bits (sealed with the
//!   replica's address when it has one, below).
//! - **Reloads.** Each message is served by the config generation in force when it arrives, as
//!   an HTTP client's next request would be; the session itself (and its stream's limits) is
//!   of the generation it was opened in.
//! - **Bounds.** At most `[server] max_sse_sessions` open at once on a replica (503 beyond;
//!   0 turns the transport off), `max_sse_sessions_per_principal` of them one authenticated
//!   principal's (429 beyond: one caller cannot take the transport from the others), each
//!   POST one message within `max_body_bytes`, a POST waits at most [`ENQUEUE_WAIT`] for the
//!   session to take it (503), and the stream keeps `sse_keepalive_ms` and `max_stream_ms`
//!   like every SSE response.
//! - **Endings.** The session ends when its client closes the stream (or `max_stream_ms` does):
//!   its id is forgotten at once (a later POST → 404), requests in flight get
//!   `drain_timeout_ms` to finish, and its upstream sessions are closed as idle ones are.
//! - **Replicas.** The stream lives on the replica that opened it. With `[sessions]
//!   advertise_url` set, the session id seals that replica's address (under the shared key), and
//!   a POST that lands on another replica is forwarded there once, with the client's own
//!   credential (the owner authenticates it again), as a parked call's retry is; without it, a
//!   POST elsewhere finds no session (404).
//!
//! A route of its own wins: `/mcp/sse` is a backend named `sse` if one is configured.

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures_util::Stream;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

use crate::body::{Body, SseLimits, sse_event, sse_response};
use crate::bridge::FORWARDED;
use crate::error::{BodyError, GatewayError};
use crate::frontend;
use crate::metrics::SseSession;
use crate::state::State;
use crate::stdio_front::{Caller, Current, Input, Post, serve_link};

/// `GET <route>` + this opens a session.
pub const OPEN_SUFFIX: &str = "/sse";
/// `POST <route>` + this + `?sessionId=…` sends it a message.
pub const POST_SUFFIX: &str = "/messages";
/// The query parameter naming the session (the TypeScript SDK's name for it).
const SESSION_PARAM: &str = "sessionId";
/// Messages POSTed and not yet taken by the session's loop.
const POST_QUEUE: usize = 64;
/// Messages waiting for the client's stream; beyond this the session's requests wait
/// (backpressure from a slow reader).
const OUT_QUEUE: usize = 256;
/// How long a POST waits for a session whose queue is full (its loop is busy with an
/// `initialize`, or at its in-flight limit) before it is refused with 503.
pub const ENQUEUE_WAIT: Duration = Duration::from_secs(10);
/// A forwarded POST's wait beyond the owner's own [`ENQUEUE_WAIT`].
const FORWARD_SLACK: Duration = Duration::from_secs(5);

/// An open session, as a POST finds it.
struct Link {
    route: Arc<str>,
    /// Who opened it (`None` without `[auth]`).
    principal: Option<String>,
    posts: mpsc::Sender<Post>,
}

/// Sessions open, by server (`Metrics::instance`: one per server, kept across its reloads) and
/// id. Not per config generation: a session outlives a reload, and its messages are served by
/// the generation in force. Per server, so two servers in one process are two replicas.
type Links = HashMap<(u64, String), Link>;
static LINKS: LazyLock<Mutex<Links>> = LazyLock::new(Default::default);

fn links() -> std::sync::MutexGuard<'static, Links> {
    // Never held across anything that can panic; recover from poison anyway.
    LINKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which of the transport's two URLs a path is.
#[derive(Clone, Copy)]
enum Url {
    Open,
    Post,
}

/// The route and URL a path names, when it is one of the transport's (and no route of its own).
fn split<'a>(state: &State, path: &'a str) -> Option<(&'a str, Url)> {
    let (route, url) = if let Some(r) = path.strip_suffix(OPEN_SUFFIX) {
        (r, Url::Open)
    } else if let Some(r) = path.strip_suffix(POST_SUFFIX) {
        (r, Url::Post)
    } else {
        return None;
    };
    let routes = &state.routes.routes;
    (state.config.server.max_sse_sessions > 0
        && !routes.contains_key(path)
        && routes.contains_key(route))
    .then_some((route, url))
}

/// Whether the listener hands this request to [`serve`] rather than the pipeline. Two suffix
/// checks for any other path, so the request path pays nothing measurable.
pub fn claims(state: &State, path: &str) -> bool {
    (path.ends_with(OPEN_SUFFIX) || path.ends_with(POST_SUFFIX)) && split(state, path).is_some()
}

/// Serves one request to a transport URL ([`claims`]); `shared` holds the config generation
/// in force, which a session's messages are served by as they come.
pub async fn serve<B>(shared: Arc<ArcSwap<State>>, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BodyError>,
{
    let state = shared.load_full();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let result = match split(&state, path) {
        None => Err(GatewayError::NoRoute {
            path: path.to_string(),
        }),
        Some((route, Url::Open)) if parts.method == Method::GET => {
            open(&state, shared, route, &parts.headers).await
        }
        Some((route, Url::Post)) if parts.method == Method::POST => {
            post(&state, route, &parts, body).await
        }
        Some(_) => Err(GatewayError::MethodNotAllowed),
    };
    match result {
        Ok(resp) => resp,
        Err(e) => {
            tracing::info!(path, method = %parts.method, error = %e, "HTTP+SSE transport: refused");
            let not_allowed = matches!(e, GatewayError::MethodNotAllowed);
            let mut resp = e.into_response(None);
            if not_allowed {
                let allow = if path.ends_with(OPEN_SUFFIX) {
                    "GET"
                } else {
                    "POST"
                };
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            resp
        }
    }
}

/// `GET <route>/sse`: authenticates the caller, starts the session's loop and answers with its
/// stream, whose first event names the URL to POST to.
async fn open(
    state: &State,
    shared: Arc<ArcSwap<State>>,
    route: &str,
    headers: &HeaderMap,
) -> Result<Response<Body>, GatewayError> {
    let server = &state.config.server;
    frontend::check_origin(&frontend::Seen::scan(headers), &server.allowed_origins)?;
    let principal = if state.auth.enabled() {
        state.auth.authenticate(headers, route).await?
    } else {
        None
    };
    let caller = Caller::new(
        headers.get(header::AUTHORIZATION).cloned(),
        principal.map(|p| p.id.clone()),
    );
    let id = session_id(state);
    let counted = state.metrics.sse_session(server.max_sse_sessions).ok_or(
        GatewayError::TooManySseSessions {
            limit: server.max_sse_sessions,
        },
    )?;
    let (posts, inbox) = mpsc::channel(POST_QUEUE);
    let server_id = state.metrics.instance();
    {
        // Counted and inserted under one lock: two racing opens cannot both take the last one.
        let mut links = links();
        if let Some(p) = caller.principal() {
            let theirs = links
                .iter()
                .filter(|((s, _), l)| *s == server_id && l.principal.as_deref() == Some(p))
                .count();
            if theirs >= server.max_sse_sessions_per_principal {
                return Err(GatewayError::PrincipalSseSessions {
                    limit: server.max_sse_sessions_per_principal,
                });
            }
        }
        links.insert(
            (server_id, id.clone()),
            Link {
                route: route.into(),
                principal: caller.principal().map(str::to_owned),
                posts,
            },
        );
    }
    tracing::info!(route, session = %id, "HTTP+SSE transport: session opened");
    let (out, outbox) = mpsc::channel::<Bytes>(OUT_QUEUE);
    let drain = Duration::from_millis(server.drain_timeout_ms);
    let max = server.max_body_bytes;
    let path = route.to_string();
    let current: Current = Arc::new(move || shared.load_full());
    tokio::spawn(async move {
        // The client's stream is gone once every receiver of `out` is: then nothing more is
        // read, and what is in flight gets the drain time.
        let gone = out.clone();
        let input: Input<tokio::io::Empty> = Input::Posts(inbox);
        serve_link(current, path, caller, max, drain, input, &out, async move {
            gone.closed().await
        })
        .await;
    });
    let endpoint = format!("event: endpoint\ndata: {route}{POST_SUFFIX}?{SESSION_PARAM}={id}\n\n");
    let events = Events {
        first: Some(Bytes::from(endpoint)),
        outbox,
        _counted: counted,
        _open: Open(server_id, id),
    };
    let body = SseLimits::new(
        Body::Stream(Box::pin(events)),
        Duration::from_millis(server.sse_keepalive_ms),
        Duration::from_millis(server.max_stream_ms),
        Bytes::from_static(b": the stream reached server.max_stream_ms; reconnect\n\n"),
    );
    Ok(sse_response(Body::Limited(Box::new(body))))
}

/// `POST <route>/messages?sessionId=…`: one JSON-RPC message (or batch) for the session's loop.
async fn post<B>(
    state: &State,
    route: &str,
    parts: &http::request::Parts,
    body: B,
) -> Result<Response<Body>, GatewayError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BodyError>,
{
    let server = &state.config.server;
    let seen = frontend::Seen::scan(&parts.headers);
    frontend::check_origin(&seen, &server.allowed_origins)?;
    let id = session_param(parts.uri.query()).ok_or_else(|| {
        GatewayError::BadRequest(format!("the {SESSION_PARAM} query parameter is required"))
    })?;
    // Who is asking, before anything about the session is told.
    let principal = if state.auth.enabled() {
        state.auth.authenticate(&parts.headers, route).await?
    } else {
        None
    };
    let clock = frontend::BodyClock::start(server);
    let body = frontend::read_body(body, &parts.headers, server.max_body_bytes, clock).await?;
    let found = links()
        .get(&(state.metrics.instance(), id.to_string()))
        .filter(|l| &*l.route == route)
        .map(|l| (l.principal.clone(), l.posts.clone()));
    let Some((owner, posts)) = found else {
        // Another replica's session: forwarded there, which authenticates it again.
        return match holder(state, id, &parts.headers) {
            Some(replica) => forward(&replica, route, id, parts, body).await,
            None => Err(GatewayError::SessionNotFound),
        };
    };
    if state.auth.enabled() && owner.as_deref() != principal.as_ref().map(|p| &*p.id) {
        return Err(GatewayError::Forbidden(
            "the session belongs to another principal".into(),
        ));
    }
    if !crate::protocol::content_type_is_json(seen.content_type.map(|v| v.as_bytes())) {
        return Err(GatewayError::UnsupportedMediaType);
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
        return Err(GatewayError::Parse("the body is not JSON".into()));
    }
    let message = Post {
        body,
        authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
    };
    match tokio::time::timeout(ENQUEUE_WAIT, posts.send(message)).await {
        Ok(Ok(())) => {}
        // The client closed its stream in between.
        Ok(Err(_)) => return Err(GatewayError::SessionNotFound),
        Err(_) => {
            return Err(GatewayError::Overloaded {
                backend: route.to_string(),
            });
        }
    }
    let mut resp = Response::new(Body::Empty);
    *resp.status_mut() = StatusCode::ACCEPTED;
    Ok(resp)
}

/// The value of `sessionId` in a query string.
fn session_param(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(SESSION_PARAM)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
}

/// A new session's id: 128 random bits as hex, sealed with this replica's address when it has
/// one (`[sessions] advertise_url`), so the other replicas know where to forward its POSTs.
fn session_id(state: &State) -> String {
    let random = random_id(&state.sessions.links);
    match &state.config.sessions.advertise_url {
        Some(me) => {
            let sealed = serde_json::json!({"r": me, "n": random}).to_string();
            state.sessions.links.seal(sealed.as_bytes())
        }
        None => random,
    }
}

/// 128 random bits as hex.
fn random_id(sealer: &crate::session::Sealer) -> String {
    hex::encode(sealer.random::<16>())
}

/// The replica holding session `id`'s stream, when the id names another one (sealed under the
/// shared key) and the POST was not forwarded already.
fn holder(state: &State, id: &str, headers: &HeaderMap) -> Option<String> {
    if headers.contains_key(FORWARDED) {
        return None;
    }
    let plain = state.sessions.links.open(id)?;
    let v: serde_json::Value = serde_json::from_slice(&plain).ok()?;
    let replica = v["r"].as_str()?;
    (state.config.sessions.advertise_url.as_deref() != Some(replica)).then(|| replica.to_string())
}

/// Forwards a POST to the replica holding its session's stream, once (marked [`FORWARDED`]),
/// with the client's credential and content type, and answers as that replica answered.
async fn forward(
    replica: &str,
    route: &str,
    id: &str,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    let url = format!(
        "{}{route}{POST_SUFFIX}?{SESSION_PARAM}={id}",
        replica.trim_end_matches('/')
    );
    let unreachable = |why: String| GatewayError::BackendFailed {
        backend: replica.to_string(),
        detail: format!("forwarding a message to the replica holding its HTTP+SSE session: {why}"),
    };
    let peer = crate::bridge::replica_peer(&url).map_err(unreachable)?;
    let extra = crate::bridge::forwarded_headers(
        &parts.headers,
        &[header::AUTHORIZATION, header::CONTENT_TYPE],
    );
    tracing::debug!(
        replica,
        "HTTP+SSE transport: message forwarded to the session's replica"
    );
    let req = peer.request(&HeaderMap::new(), &extra, body);
    let deadline = tokio::time::Instant::now() + ENQUEUE_WAIT + FORWARD_SLACK;
    let reply = Arc::new(peer)
        .call(req, deadline)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let answer = match reply.messages {
        crate::upstream::MessageStream::One(m) => m,
        _ => Bytes::new(),
    };
    let mut resp = Response::new(if answer.is_empty() {
        Body::Empty
    } else {
        Body::full(answer)
    });
    *resp.status_mut() = reply.status;
    if let Some(ct) = reply.headers.get(header::CONTENT_TYPE) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    Ok(resp)
}

/// Forgets the session when its stream is dropped: the id stops taking POSTs at once, and the
/// loop's input ends with the last sender.
struct Open(u64, String);

impl Drop for Open {
    fn drop(&mut self) {
        links().remove(&(self.0, self.1.clone()));
        tracing::info!(session = %self.1, "HTTP+SSE transport: session closed");
    }
}

/// The session's stream: the `endpoint` event, then each message as `event: message`.
struct Events {
    first: Option<Bytes>,
    outbox: mpsc::Receiver<Bytes>,
    // Dropped in this order: uncounted before the id is forgotten, so once a POST finds no
    // session the gauge has no session either.
    _counted: SseSession,
    _open: Open,
}

impl Stream for Events {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(first));
        }
        self.outbox.poll_recv(cx).map(|m| m.map(|m| sse_event(&m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_read_from_the_query() {
        assert_eq!(session_param(Some("sessionId=ab12")), Some("ab12"));
        assert_eq!(session_param(Some("x=1&sessionId=ab12&y=2")), Some("ab12"));
        assert_eq!(session_param(Some("sessionIdx=1")), None);
        assert_eq!(session_param(Some("sessionId=")), None);
        assert_eq!(session_param(None), None);
        let sessions = crate::session::Sessions::new(&Default::default());
        let id = random_id(&sessions.links);
        assert_eq!(id.len(), 32);
        assert_ne!(id, random_id(&sessions.links));
    }
}
