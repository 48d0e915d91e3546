//! Resumable SSE streams for initialize-era clients (docs/protocol.md §7, "Resumability").
//!
//! In those revisions disconnecting is not cancelling, and a client that lost a stream may
//! take it up again with a `GET` carrying `Last-Event-ID`. So a legacy client's SSE answer
//! stream and its GET stream are not driven by its connection: a task of their own ([`pump`])
//! reads the messages, numbers each event (`id: <kind><token>-<seq>`) and keeps it; the
//! connection only reads what the task kept ([`Reader`]). When the connection drops, the task
//! goes on — the call still runs, the listen still hears — and a `GET` in the same session
//! naming one of the stream's ids gets everything after that event, then the rest as it comes.
//! With `[sessions] advertise_url` each id also names this replica (`.<tag>`: the address,
//! sealed under the shared key), so a resume that lands on another replica is forwarded
//! here (`legacy::forward_resume`).
//! A newer reader takes the stream over from an older one (the client knows which connection
//! it still reads; portico may not have noticed the old one break yet).
//!
//! Bounds: nobody reading for `[sessions] resume_ms` ends the stream, which drops what it
//! carried (the upstream call is cancelled, the listen closed) as a closed connection did
//! before; an ended stream is kept that long after its last reader left (the final event may
//! have been lost with the connection), [`READ_TO_END_KEEP`] at most once a connection read it
//! to its end. At most [`MAX_UNSENT`] events wait for a reader (then
//! the task stops reading: the backpressure reaches the upstream), and of those already handed
//! to a connection the last [`KEEP_SENT`] (at most [`KEEP_SENT_BYTES`]) are kept for a resume.
//! [`MAX_HELD`] streams per process, [`MAX_HELD_PER_SESSION`] per session and
//! [`MAX_HELD_PER_PRINCIPAL`] per authenticated principal (one client's streams, however many
//! sessions it opens, never use up the room of the others); past any of them a stream is served
//! as before, bound to its connection and without ids.
//!
//! Sessions of 2025-11-25 get the priming event first (an id with empty data), after which
//! their SDKs resume whatever ends the connection; older revisions mishandle it
//! (docs/protocol.md §7) and get ids on their messages only. There `[server] max_stream_ms`
//! ends the connection with a `retry` hint, not the call (`body::Resumable`).
//!
//! Which answers are held is decided here too ([`answer`], [`resumable`]): SSE answers to a
//! client's own connection (not `portico stdio`'s or an HTTP+SSE session's in-process
//! requests), and a call still running after [`STREAM_AFTER`] is answered as such a stream
//! even when its server answers JSON, so its client holds an id while it waits.
//!
//! Held per replica and per server (`Metrics::instance`, like the HTTP+SSE sessions): without
//! `advertise_url` a resume that lands on another replica finds nothing (README "Scale-out").

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::Response;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::{Body, Resumable, sse_event, sse_response};
use crate::error::GatewayError;
use crate::metrics::{HeldStream, Metrics};
use crate::pool::OwnerKey;
use crate::protocol::RequestId;
use crate::session::SessionData;
use crate::step::{Core, FinishLater, RequestCtx};

/// Events that may wait for a reader before the stream stops reading its source.
pub const MAX_UNSENT: usize = 128;
/// Events already handed to a connection that are kept for a client resuming before them.
pub const KEEP_SENT: usize = 64;
/// ... and at most this many bytes of them.
pub const KEEP_SENT_BYTES: usize = 256 * 1024;
/// Streams held at once in a process.
pub const MAX_HELD: usize = 10_000;
/// Streams one session may have held at once.
pub const MAX_HELD_PER_SESSION: usize = 256;
/// Streams the sessions of one authenticated principal may have held at once: a quarter of
/// [`MAX_HELD`] (sessions are free to open, so the per-session bound alone is no share).
pub const MAX_HELD_PER_PRINCIPAL: usize = 2_500;
/// How long a stream a connection read to its end is kept (`resume_ms` at most): its last
/// event may still have been lost with the connection, but a client that lost it reconnects
/// within its `retry` (1 s in both SDKs), and a busy session's finished answers should not
/// fill [`MAX_HELD`].
pub const READ_TO_END_KEEP: Duration = Duration::from_secs(5);

/// Which stream a resume names: a request's answer, or the session's GET stream. A GET stream
/// that cannot be resumed is simply opened again; an answer that cannot is lost to the client.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Answer,
    Get,
}

impl Kind {
    fn letter(self) -> u8 {
        match self {
            Kind::Answer => b'a',
            Kind::Get => b'g',
        }
    }
}

/// Longest replica tag an id may carry: a sealed `advertise_url` (itself at most a URL's
/// length) in base64; anything longer is no id of portico's.
const MAX_TAG: usize = 4096;

/// A `Last-Event-ID` portico could have written.
#[derive(Debug, PartialEq, Eq)]
pub struct EventId {
    pub kind: Kind,
    token: u64,
    seq: u64,
    /// The replica holding the stream, sealed (`Sessions::stream_tag`); `None` when the
    /// replica that wrote the id had no `advertise_url`.
    pub replica: Option<Arc<str>>,
}

impl EventId {
    /// `<a|g><16 hex>-<seq>[.<tag>]`; anything else is no id of portico's.
    pub fn parse(v: &[u8]) -> Option<EventId> {
        let (&letter, rest) = v.split_first()?;
        let kind = match letter {
            b'a' => Kind::Answer,
            b'g' => Kind::Get,
            _ => return None,
        };
        let (rest, replica) = match memchr::memchr(b'.', rest) {
            Some(dot) => {
                let tag = &rest[dot + 1..];
                let url_safe = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_');
                if tag.is_empty() || tag.len() > MAX_TAG || !tag.iter().all(url_safe) {
                    return None;
                }
                (
                    &rest[..dot],
                    Some(Arc::from(std::str::from_utf8(tag).ok()?)),
                )
            }
            None => (rest, None),
        };
        let (token, seq) = rest.split_at_checked(16)?;
        let seq = seq.strip_prefix(b"-")?;
        // Digits only: `from_str_radix` would also take a sign.
        if !token.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let token = u64::from_str_radix(std::str::from_utf8(token).ok()?, 16).ok()?;
        if seq.is_empty() || seq.len() > 19 || !seq.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let seq = std::str::from_utf8(seq).ok()?.parse().ok()?;
        Some(EventId {
            kind,
            token,
            seq,
            replica,
        })
    }
}

/// The id as written on the wire.
impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let letter = char::from(self.kind.letter());
        write!(f, "{letter}{:016x}-{}", self.token, self.seq)?;
        match &self.replica {
            Some(tag) => write!(f, ".{tag}"),
            None => Ok(()),
        }
    }
}

/// What a new stream needs to know.
pub struct Hold<'a> {
    pub metrics: &'a Metrics,
    /// Names the stream in its event ids: 64 random bits (`Sealer::random`).
    pub token: u64,
    /// The session it belongs to: only that session may resume it.
    pub owner: OwnerKey,
    /// The authenticated principal whose share it counts against (`None`: anonymous).
    pub principal: Option<OwnerKey>,
    pub kind: Kind,
    /// `[sessions] resume_ms`.
    pub window: Duration,
    /// Send the priming event first (a 2025-11-25 session).
    pub priming: bool,
    /// This replica, sealed, for the ids (`Sessions::stream_tag`).
    pub replica: Option<Arc<str>>,
}

/// One held stream.
struct Held {
    owner: OwnerKey,
    principal: Option<OwnerKey>,
    kind: Kind,
    token: u64,
    replica: Option<Arc<str>>,
    buf: Mutex<Buf>,
    /// Bumped on every change (an event kept, the end, a reader come or gone).
    changed: watch::Sender<()>,
}

struct Buf {
    /// Framed events, `first` the sequence number of the front one.
    events: VecDeque<Bytes>,
    first: u64,
    /// Events before this number were handed to a connection.
    sent: u64,
    ended: bool,
    /// A connection read the ended stream to its last event.
    read_to_end: bool,
    /// The reader that may read (0: none).
    reader: u64,
    readers: u64,
    /// When the last reader left (or the stream began).
    idle_since: Instant,
}

impl Buf {
    /// When the stream is given up if nobody reads it meanwhile (`None`: a reader has it).
    fn given_up_at(&self, window: Duration) -> Option<Instant> {
        let keep = if self.read_to_end {
            window.min(READ_TO_END_KEEP)
        } else {
            window
        };
        (self.reader == 0).then(|| self.idle_since + keep)
    }
}

impl Held {
    fn buf(&self) -> MutexGuard<'_, Buf> {
        // Never held across anything that can panic; recover from poison anyway.
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn frame(&self, seq: u64, event: &[u8]) -> Bytes {
        let id = EventId {
            kind: self.kind,
            token: self.token,
            seq,
            replica: self.replica.clone(),
        };
        let tag = self.replica.as_deref().map_or(0, str::len);
        let mut out = BytesMut::with_capacity(event.len() + 48 + tag);
        out.extend_from_slice(format!("id: {id}\n").as_bytes());
        out.extend_from_slice(event);
        out.freeze()
    }

    /// A new reader from `after` on (the id the client saw last; `None`: from the start).
    fn attach(self: &Arc<Held>, after: Option<u64>) -> Reader {
        let me = {
            let mut b = self.buf();
            b.readers += 1;
            b.reader = b.readers;
            b.reader
        };
        self.changed.send_replace(());
        Reader {
            held: self.clone(),
            me,
            next: after.map_or(0, |s| s.saturating_add(1)),
            rx: self.changed.subscribe(),
        }
    }
}

type Key = (u64, u64);

/// The streams held, by server and token, and how many each session and each principal holds
/// (one map: session and principal keys are digests under different labels, `bridge::owner`).
#[derive(Default)]
struct Registry {
    streams: HashMap<Key, Arc<Held>>,
    shares: HashMap<(u64, OwnerKey), usize>,
}

impl Registry {
    /// The shares `held` counts against on server `server`, with their bounds.
    fn shares_of(server: u64, held: &Held) -> impl Iterator<Item = ((u64, OwnerKey), usize)> {
        std::iter::once(((server, held.owner), MAX_HELD_PER_SESSION)).chain(
            held.principal
                .map(|p| ((server, p), MAX_HELD_PER_PRINCIPAL)),
        )
    }

    /// Takes `held` in under `key`, unless the process, its session or its principal is at its
    /// bound.
    fn insert(&mut self, key: Key, held: &Arc<Held>) -> bool {
        let full = Self::shares_of(key.0, held)
            .any(|(share, bound)| self.shares.get(&share).copied().unwrap_or(0) >= bound);
        if full || self.streams.len() >= MAX_HELD || self.streams.contains_key(&key) {
            return false;
        }
        self.streams.insert(key, held.clone());
        for (share, _) in Self::shares_of(key.0, held) {
            *self.shares.entry(share).or_default() += 1;
        }
        true
    }

    fn remove(&mut self, key: &Key) {
        let Some(held) = self.streams.remove(key) else {
            return;
        };
        for (share, _) in Self::shares_of(key.0, &held) {
            if let Some(n) = self.shares.get_mut(&share) {
                *n -= 1;
                if *n == 0 {
                    self.shares.remove(&share);
                }
            }
        }
    }
}

static HELD: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

fn registry() -> MutexGuard<'static, Registry> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// `events` (whole SSE events, as `sse_event` writes them) as a resumable stream: the body the
/// connection reads. When [`MAX_HELD`] streams are held (or [`MAX_HELD_PER_SESSION`] of its
/// session's, or [`MAX_HELD_PER_PRINCIPAL`] of its principal's), `events` is given back (`Err`)
/// for the caller to serve as before.
pub fn hold(
    how: Hold<'_>,
    events: BoxStream<'static, Bytes>,
) -> Result<BoxStream<'static, Bytes>, BoxStream<'static, Bytes>> {
    let token = how.token;
    let key = (how.metrics.instance(), token);
    let held = Arc::new(Held {
        owner: how.owner,
        principal: how.principal,
        kind: how.kind,
        token,
        replica: how.replica,
        buf: Mutex::new(Buf {
            events: VecDeque::new(),
            first: 0,
            sent: 0,
            ended: false,
            read_to_end: false,
            reader: 0,
            readers: 0,
            idle_since: Instant::now(),
        }),
        changed: watch::channel(()).0,
    });
    {
        if !registry().insert(key, &held) {
            return Err(events);
        }
    }
    let source = if how.priming {
        // The priming event: an id, no data (SEP-1699).
        futures_util::stream::once(async { Bytes::from_static(b"data: \n\n") })
            .chain(events)
            .boxed()
    } else {
        events
    };
    let reader = held.attach(None);
    tokio::spawn(pump(
        key,
        held,
        source,
        how.window,
        how.metrics.held_stream(),
    ));
    Ok(reader.into_stream())
}

/// What a `GET` with `Last-Event-ID` gets.
pub enum Resumed {
    /// The stream from after that event.
    Stream(BoxStream<'static, Bytes>),
    /// Not one of portico's ids, or no stream of this session held here under it.
    Unknown,
}

/// The stream `last` names, when `owner`'s session holds it on this server.
pub fn resume(metrics: &Metrics, owner: &OwnerKey, last: &EventId) -> Resumed {
    // Attached under the registry's lock: the stream is either still held, and then its pump
    // sees the reader before it gives up on it ([`pump`]), or already forgotten.
    let reader = {
        let map = registry();
        map.streams
            .get(&(metrics.instance(), last.token))
            .filter(|h| h.owner == *owner && h.kind == last.kind)
            .map(|h| h.attach(Some(last.seq)))
    };
    match reader {
        Some(reader) => {
            metrics.stream_resume("resumed");
            Resumed::Stream(reader.into_stream())
        }
        None => {
            metrics.stream_resume("unknown");
            Resumed::Unknown
        }
    }
}

/// Drives one held stream: keeps what `source` yields until it ends, and ends it (dropping
/// `source`, which cancels what it carries) once nobody has read it for `window`.
async fn pump(
    key: Key,
    held: Arc<Held>,
    source: BoxStream<'static, Bytes>,
    window: Duration,
    _gauge: HeldStream,
) {
    let mut rx = held.changed.subscribe();
    let mut source = Some(source);
    loop {
        rx.borrow_and_update();
        let (idle_until, room) = {
            let b = held.buf();
            let unsent = (b.first + b.events.len() as u64).saturating_sub(b.sent.max(b.first));
            (b.given_up_at(window), unsent < MAX_UNSENT as u64)
        };
        let next = async {
            match source.as_mut() {
                Some(s) if room => s.next().await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            event = next => {
                let mut b = held.buf();
                match event {
                    Some(event) => {
                        let seq = b.first + b.events.len() as u64;
                        let framed = held.frame(seq, &event);
                        b.events.push_back(framed);
                        trim(&mut b);
                    }
                    None => b.ended = true,
                }
                let ended = b.ended;
                drop(b);
                if ended {
                    source = None;
                }
                held.changed.send_replace(());
            }
            () = sleep_until(idle_until) => {
                // Nobody came back in time — unless a resume attached (or came and went) just
                // now: checked again under the registry's lock, which a resume takes first too.
                let mut map = registry();
                let mut b = held.buf();
                if b.given_up_at(window).is_some_and(|at| at <= Instant::now()) {
                    map.remove(&key);
                    b.ended = true;
                    break;
                }
            }
            _ = rx.changed() => {}
        }
    }
    // Forgotten: with `source` goes whatever it carried.
    held.changed.send_replace(());
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Drops the oldest events already handed to a connection past [`KEEP_SENT`] /
/// [`KEEP_SENT_BYTES`].
fn trim(b: &mut Buf) {
    loop {
        let sent = b.sent.saturating_sub(b.first) as usize;
        if sent == 0 {
            return;
        }
        let bytes: usize = b.events.iter().take(sent).map(Bytes::len).sum();
        if sent <= KEEP_SENT && bytes <= KEEP_SENT_BYTES {
            return;
        }
        b.events.pop_front();
        b.first += 1;
    }
}

/// One connection reading a held stream.
struct Reader {
    held: Arc<Held>,
    me: u64,
    /// The next sequence number it wants.
    next: u64,
    rx: watch::Receiver<()>,
}

impl Reader {
    fn into_stream(self) -> BoxStream<'static, Bytes> {
        futures_util::stream::unfold(self, |mut r| async move {
            loop {
                r.rx.borrow_and_update();
                {
                    let held = r.held.clone();
                    let mut b = held.buf();
                    if b.reader != r.me {
                        // Taken over by a newer connection, or the stream was forgotten.
                        return None;
                    }
                    // Kept no longer: the client gets what there is from the oldest kept on.
                    r.next = r.next.max(b.first);
                    let i = (r.next - b.first) as usize;
                    if let Some(event) = b.events.get(i).cloned() {
                        r.next += 1;
                        if r.next > b.sent {
                            b.sent = r.next;
                            trim(&mut b);
                            drop(b);
                            // Room again for the pump, perhaps.
                            held.changed.send_replace(());
                        }
                        return Some((event, r));
                    }
                    if b.ended {
                        b.read_to_end = true;
                        return None;
                    }
                }
                if r.rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .boxed()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut b = self.held.buf();
        if b.reader == self.me {
            b.reader = 0;
            b.idle_since = Instant::now();
            drop(b);
            self.held.changed.send_replace(());
        }
    }
}

// === The legacy face: which answers are held, and when a call is answered as a stream ===

/// How long an initialize-era client's call may run before it is answered as an SSE stream
/// (when its answer could be held for a resume): most calls answer sooner, as JSON.
pub const STREAM_AFTER: Duration = Duration::from_secs(1);

/// The answer to an initialize-era client's call (`work`: the call, run to its response, with
/// the request's context as it left it). A call still running after [`STREAM_AFTER`] is
/// answered as a stream from then on: its client gets event ids (and keep-alives) while it
/// waits, so a connection lost meanwhile (a load balancer's idle timeout) loses nothing.
pub(super) async fn answer<W>(
    core: &Core,
    ctx: &mut RequestCtx,
    session: &SessionData,
    id: &RequestId,
    work: W,
) -> Result<Response<Body>, GatewayError>
where
    W: Future<Output = (RequestCtx, Result<Response<Body>, GatewayError>)> + Send + 'static,
{
    // Its POST's `Accept` admits SSE (`frontend::check_content`).
    if !ctx.remote || core.config.sessions.resume_ms == 0 {
        let (done, resp) = work.await;
        *ctx = done;
        return Ok(resumable(core, ctx, session, Kind::Answer, resp?));
    }
    let mut task = Task(tokio::spawn(work));
    // The request is recorded when the call is done, with its own outcome (`FinishLater`).
    let (done, finished) = tokio::sync::oneshot::channel();
    let mut done = Some(done);
    let events = match tokio::time::timeout(STREAM_AFTER, &mut task.0).await {
        Ok(joined) => {
            let (done, resp) = joined.map_err(|_| task_failed())?;
            *ctx = done;
            return Ok(resumable(core, ctx, session, Kind::Answer, resp?));
        }
        Err(_) => {
            let id = id.clone();
            futures_util::stream::once(task)
                .flat_map(move |joined| as_events(joined, &id, done.take()))
                .boxed()
        }
    };
    let mut resp = resumable(
        core,
        ctx,
        session,
        Kind::Answer,
        sse_response(Body::Stream(events)),
    );
    resp.extensions_mut()
        .insert(FinishLater(Arc::new(Mutex::new(Some(finished)))));
    Ok(resp)
}

/// An SSE response to an initialize-era client over the network, as a stream it can resume
/// with `Last-Event-ID` (this module; off with `[sessions] resume_ms = 0`). Messages of
/// portico's in-process fronts (`portico stdio`, an HTTP+SSE session) have no connection to
/// lose.
pub(super) fn resumable(
    core: &Core,
    ctx: &RequestCtx,
    session: &SessionData,
    kind: Kind,
    resp: Response<Body>,
) -> Response<Body> {
    let window = core.config.sessions.resume_ms;
    let Some(owner) = ctx.client.as_ref().filter(|_| window > 0 && ctx.remote) else {
        return resp;
    };
    let (parts, body) = resp.into_parts();
    let Body::Stream(events) = body else {
        return Response::from_parts(parts, body);
    };
    let how = Hold {
        metrics: &core.metrics,
        token: u64::from_le_bytes(core.sessions.links.random()),
        owner: owner.key,
        principal: match owner.group {
            Some(crate::bridge::Group::Principal(p)) => Some(p),
            _ => None,
        },
        kind,
        window: std::time::Duration::from_millis(window),
        priming: primed(session),
        replica: core.sessions.stream_tag.clone(),
    };
    let priming = how.priming;
    let mut resp = match hold(how, events) {
        Ok(held) => Response::from_parts(parts, Body::Stream(held)),
        Err(events) => return Response::from_parts(parts, Body::Stream(events)),
    };
    if priming {
        resp.extensions_mut().insert(Resumable);
    }
    resp
}

/// Whether a session's client resumes whatever ends its stream's connection: from 2025-11-25,
/// after the priming event (revisions are dates).
pub(super) fn primed(session: &SessionData) -> bool {
    session.v.as_str() >= "2025-11-25"
}

/// A spawned call, aborted when dropped (its client left before it was answered).
struct Task(tokio::task::JoinHandle<(RequestCtx, Result<Response<Body>, GatewayError>)>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::future::Future for Task {
    type Output =
        Result<(RequestCtx, Result<Response<Body>, GatewayError>), tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

fn task_failed() -> GatewayError {
    GatewayError::Internal("a legacy client's call ended abnormally".into())
}

/// A finished call's answer as SSE events, once the response head has gone out as a stream:
/// a JSON answer (or error) becomes one event, a streamed one its events.
///
/// `done` gets the call's context as it left it, with the outcome the client gets in the
/// stream (what the request is recorded with).
fn as_events(
    joined: Result<(RequestCtx, Result<Response<Body>, GatewayError>), tokio::task::JoinError>,
    id: &RequestId,
    done: Option<tokio::sync::oneshot::Sender<RequestCtx>>,
) -> futures_util::stream::BoxStream<'static, Bytes> {
    let one = |msg: Bytes| futures_util::stream::once(async move { msg }).boxed();
    let Ok((mut ctx, result)) = joined else {
        return one(sse_event(&task_failed().to_message(Some(id))));
    };
    // The context moves to the exit: the stream needs only the result.
    if let Some(done) = done {
        match &result {
            Ok(resp) => ctx.status = resp.status().as_u16(),
            Err(e) => {
                ctx.status = e.status().as_u16();
                ctx.error = Some(e.reason());
            }
        }
        let _ = done.send(ctx);
    }
    match result {
        Ok(resp) => match resp.into_body() {
            Body::Full(Some(msg)) => one(sse_event(&msg)),
            Body::Stream(events) => events,
            Body::Empty | Body::Full(None) => futures_util::stream::empty().boxed(),
            Body::Relay(_) | Body::Limited(_) => {
                one(sse_event(&task_failed().to_message(Some(id))))
            }
        },
        Err(e) => one(sse_event(&e.to_message(Some(id)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token per stream, as `Sealer::random` would give.
    fn token() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// How a test holds a stream: an answer of session `owner`, held 30 s, no priming, no
    /// principal, no replica tag (a test changes what it is about).
    fn held_by(metrics: &Metrics, owner: OwnerKey) -> Hold<'_> {
        Hold {
            metrics,
            token: token(),
            owner,
            principal: None,
            kind: Kind::Answer,
            window: Duration::from_secs(30),
            priming: false,
            replica: None,
        }
    }

    fn ev(n: u32) -> Bytes {
        crate::sse::sse_event(format!("{{\"n\":{n}}}").as_bytes())
    }

    fn hold_it(
        m: &Metrics,
        rx: tokio::sync::mpsc::Receiver<Bytes>,
        window: Duration,
        priming: bool,
    ) -> BoxStream<'static, Bytes> {
        let events = tokio_stream_from(rx);
        hold(
            Hold {
                window,
                priming,
                ..held_by(m, [7; 32])
            },
            events,
        )
        .ok()
        .expect("held")
    }

    fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<Bytes>) -> BoxStream<'static, Bytes> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    fn id_of(event: &Bytes) -> EventId {
        let line = event.split(|b| *b == b'\n').next().unwrap();
        EventId::parse(line.strip_prefix(b"id: ").unwrap()).unwrap()
    }

    #[test]
    fn ids_parse_only_in_portico_s_shape() {
        let id = EventId::parse(b"a00000000000000ff-12").unwrap();
        assert_eq!((id.kind, id.token, id.seq), (Kind::Answer, 255, 12));
        assert_eq!(id.to_string(), "a00000000000000ff-12", "written as read");
        assert_eq!(
            EventId::parse(b"g0000000000000001-0").unwrap().kind,
            Kind::Get
        );
        for bad in [
            &b""[..],
            b"a",
            b"x00000000000000ff-1",
            b"a00000000000000ff",
            b"a00000000000000ff-",
            b"a00000000000000ff-1x",
            b"a00000000000000zz-1",
            b"a+00000000000000f-1",
            b"a00000000000000ff-99999999999999999999",
            b"\xff",
            b"a00000000000000ff-1.",
            b"a00000000000000ff-1.a+b",
            b"a00000000000000ff-1.a.b",
            b"a00000000000000ff.x-1",
        ] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
        let far = [b'A'; MAX_TAG + 1];
        assert_eq!(
            EventId::parse(&[&b"a00000000000000ff-1."[..], &far].concat()),
            None
        );
        // With the replica's tag (a sealed advertise_url, URL-safe base64).
        let id = EventId::parse(b"g00000000000000ff-7.Zm9v_-Ba").unwrap();
        assert_eq!((id.kind, id.token, id.seq), (Kind::Get, 255, 7));
        assert_eq!(id.replica.as_deref(), Some("Zm9v_-Ba"));
        assert_eq!(
            id.to_string(),
            "g00000000000000ff-7.Zm9v_-Ba",
            "written as read"
        );
    }

    /// A held stream's ids carry the replica's tag, and parse back to it.
    #[tokio::test]
    async fn ids_name_the_replica_holding_the_stream() {
        let m = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut held = hold(
            Hold {
                kind: Kind::Get,
                replica: Some(Arc::from("c2VhbGVk")),
                ..held_by(&m, [9; 32])
            },
            tokio_stream_from(rx),
        )
        .ok()
        .expect("held");
        tx.send(ev(1)).await.unwrap();
        let id = id_of(&held.next().await.unwrap());
        assert_eq!((id.kind, id.seq), (Kind::Get, 0));
        assert_eq!(id.replica.as_deref(), Some("c2VhbGVk"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_reader_is_taken_over_after_the_last_event_it_saw() {
        let m = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut first = hold_it(&m, rx, Duration::from_secs(30), true);
        let priming = first.next().await.unwrap();
        assert!(priming.ends_with(b"\ndata: \n\n"), "{priming:?}");
        tx.send(ev(1)).await.unwrap();
        let one = first.next().await.unwrap();
        assert!(one.ends_with(&ev(1)[..]));
        let seen = id_of(&one);
        tx.send(ev(2)).await.unwrap();
        tx.send(ev(3)).await.unwrap();
        tokio::task::yield_now().await;
        drop(first); // the connection broke; 2 and 3 were never read
        tokio::time::sleep(Duration::from_secs(10)).await;
        let Resumed::Stream(mut again) = resume(&m, &[7; 32], &seen) else {
            panic!("not held")
        };
        assert!(again.next().await.unwrap().ends_with(&ev(2)[..]));
        assert!(again.next().await.unwrap().ends_with(&ev(3)[..]));
        // Another session's resume, or the wrong kind, finds nothing.
        assert!(matches!(resume(&m, &[8; 32], &seen), Resumed::Unknown));
        let wrong = EventId {
            kind: Kind::Get,
            ..seen
        };
        assert!(matches!(resume(&m, &[7; 32], &wrong), Resumed::Unknown));
        drop(tx);
        assert!(again.next().await.is_none(), "the source ended");
    }

    #[tokio::test(start_paused = true)]
    async fn one_session_cannot_use_up_the_room_of_the_others() {
        let m = Metrics::new();
        let how = |owner: u8| held_by(&m, [owner; 32]);
        let pending = || futures_util::stream::pending::<Bytes>().boxed();
        let mut kept = Vec::new();
        for _ in 0..MAX_HELD_PER_SESSION {
            kept.push(hold(how(1), pending()).ok().expect("room for this session"));
        }
        assert!(
            hold(how(1), pending()).is_err(),
            "the session is at its bound"
        );
        kept.push(
            hold(how(2), pending())
                .ok()
                .expect("another session still has room"),
        );
        // One of the first session's streams ends: room again.
        drop(kept.swap_remove(0));
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert!(hold(how(1), pending()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn one_principal_opening_sessions_cannot_use_up_the_room_of_the_others() {
        let m = Metrics::new();
        let how = |session: u16, principal: u8| {
            let mut owner = [0; 32];
            owner[..2].copy_from_slice(&session.to_le_bytes());
            Hold {
                principal: Some([principal; 32]),
                ..held_by(&m, owner)
            }
        };
        let pending = || futures_util::stream::pending::<Bytes>().boxed();
        let mut kept = Vec::new();
        // Alice's sessions, each well within its own bound, fill her share.
        for n in 0..MAX_HELD_PER_PRINCIPAL {
            let session = (n / 100) as u16;
            kept.push(
                hold(how(session, 1), pending())
                    .ok()
                    .expect("room for alice"),
            );
        }
        assert!(
            hold(how(999, 1), pending()).is_err(),
            "a new session of hers is no new share"
        );
        kept.push(
            hold(how(1000, 2), pending())
                .ok()
                .expect("bob still has room"),
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_reader_takes_over_and_the_older_one_ends() {
        let m = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut old = hold_it(&m, rx, Duration::from_secs(30), false);
        tx.send(ev(1)).await.unwrap();
        let one = old.next().await.unwrap();
        let Resumed::Stream(mut new) = resume(&m, &[7; 32], &id_of(&one)) else {
            panic!("not held")
        };
        tx.send(ev(2)).await.unwrap();
        assert!(new.next().await.unwrap().ends_with(&ev(2)[..]));
        assert!(old.next().await.is_none(), "the older reader ends");
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_back_within_the_window_drops_the_source() {
        let m = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut first = hold_it(&m, rx, Duration::from_secs(30), false);
        tx.send(ev(1)).await.unwrap();
        let one = first.next().await.unwrap();
        drop(first);
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert!(tx.is_closed(), "the source was dropped");
        assert!(matches!(
            resume(&m, &[7; 32], &id_of(&one)),
            Resumed::Unknown
        ));
        let scrape = String::from_utf8(
            prometheus::TextEncoder::new()
                .encode_to_string(&m.registry.gather())
                .unwrap()
                .into_bytes(),
        )
        .unwrap();
        assert!(scrape.contains("portico_resumable_streams 0"), "{scrape}");
        assert!(
            scrape.contains("portico_stream_resumes_total{outcome=\"unknown\"} 1"),
            "{scrape}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unread_events_hold_the_source_back_and_sent_ones_are_trimmed() {
        let m = Metrics::new();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut r = hold_it(&m, rx, Duration::from_secs(300), false);
        let mut sent = 0;
        // Nobody reads: the pump takes MAX_UNSENT, then stops reading.
        while tokio::time::timeout(Duration::from_secs(1), tx.send(ev(sent)))
            .await
            .is_ok()
        {
            sent += 1;
            assert!(sent < 1000, "no backpressure");
        }
        assert_eq!(
            sent as usize,
            MAX_UNSENT + 1,
            "one more sits in the channel"
        );
        // Reading them all keeps only the last KEEP_SENT for a resume.
        let mut last = None;
        for _ in 0..MAX_UNSENT {
            last = r.next().await;
        }
        let last = id_of(&last.unwrap());
        drop(r);
        let from_start = EventId { seq: 0, ..last };
        let Resumed::Stream(mut again) = resume(&m, &[7; 32], &from_start) else {
            panic!("not held")
        };
        let first_kept = id_of(&again.next().await.unwrap());
        assert_eq!(first_kept.seq, last.seq + 1 - KEEP_SENT as u64);
    }
}
