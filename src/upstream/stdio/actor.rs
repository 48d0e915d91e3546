//! The actor behind a [`StdioUpstream`](super::StdioUpstream) handle: one task that owns the
//! child (or the HTTP+SSE session), its in-flight requests by gateway id, and the restarts.

use super::wire::{ErrorCode, Incoming, OutResponse, gateway_id, line_of, preview};
use super::*;
use crate::upstream::Unqueued;

/// What a handle asks of its actor.
pub(super) enum Cmd {
    Request {
        gid: u64,
        line: Bytes,
        pending: Pending,
    },
    /// A client's line (a notification, or an answer to the server's request); `ack` hears
    /// whether it was queued (or kept for the next child) or refused (`Overloaded`).
    Notify {
        line: Bytes,
        ack: Option<oneshot::Sender<Result<(), UpstreamError>>>,
    },
    Cancel {
        gid: u64,
        reason: &'static str,
    },
    /// Stop; the sender (if any) learns when the child is gone.
    Shutdown(Option<oneshot::Sender<()>>),
}

/// An in-flight request, keyed by gateway id.
pub(super) struct Pending {
    pub(super) orig_id: Box<RawValue>,
    pub(super) orig_token: Option<Box<RawValue>>,
    /// The request asked for log lines (`_meta` `logLevel`, 2026-07-28).
    pub(super) logs: bool,
    pub(super) cancellable: bool,
    pub(super) generation: Option<u64>,
    pub(super) tx: mpsc::Sender<Outcome>,
}

impl Pending {
    /// Queues a notification unless only the slot reserved for the final answer is left.
    fn note(&self, body: Bytes) {
        if self.tx.capacity() > 1 {
            let _ = self.tx.try_send(Ok(Event::Note(body)));
        }
    }

    /// Always fits: the actor is the only sender and `note` keeps one slot free.
    fn finish(self, outcome: Outcome) {
        let _ = self.tx.try_send(outcome);
    }
}

/// Why a session ended.
pub(super) enum End {
    Exited(String),
    Stop(Option<oneshot::Sender<()>>),
}

pub(super) struct Actor {
    pub(super) name: Arc<str>,
    pub(super) program: String,
    pub(super) args: Vec<String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) cwd: Option<PathBuf>,
    pub(super) max_line: usize,
    pub(super) rx: mpsc::UnboundedReceiver<Cmd>,
    pub(super) status: watch::Sender<Status>,
    pub(super) notes: broadcast::Sender<Bytes>,
    pub(super) pending: HashMap<u64, Pending>,
    /// Commands received while no child runs (backoff); replayed in order after the spawn.
    pub(super) backlog: VecDeque<Cmd>,
    /// What the server writes wrong is logged within a budget.
    pub(super) warnings: crate::upstream::WarnBudget,
    /// The child serves one client (`isolation = "per_client"`): any call in flight is that
    /// client's, so a server request can go to the newest one.
    pub(super) owned: bool,
    /// An HTTP+SSE session instead of a child (`sse.rs`).
    pub(super) sse: Option<Arc<SseTarget>>,
}

/// What the actor talks to.
pub(super) enum Link {
    Child(Child),
    Sse(SseConn, Writer),
}

pub(super) type Writer = crate::upstream::LineQueue;

impl Actor {
    pub(super) async fn run(mut self) {
        let mut backoff = INITIAL_BACKOFF;
        let mut first = true;
        loop {
            if !first {
                self.status.send_modify(|s| s.restarts += 1);
            }
            first = false;
            let end = match self.open().await {
                Ok(link) => {
                    let started = Instant::now();
                    let end = match link {
                        Link::Child(child) => self.session(child).await,
                        Link::Sse(conn, out) => self.sse_session(conn, out).await,
                    };
                    if started.elapsed() >= STABLE_AFTER {
                        backoff = INITIAL_BACKOFF;
                    }
                    end
                }
                Err(msg) => self.refuse_waiting(msg),
            };
            let why = match end {
                End::Stop(ack) => {
                    if let Some(ack) = ack {
                        let _ = ack.send(());
                    }
                    return;
                }
                End::Exited(why) => why,
            };
            let restarts = self.status.borrow().restarts;
            let backoff_ms = backoff.as_millis() as u64;
            if self.sse.is_some() {
                warn!(backend = %self.name, reason = %why, restarts, backoff_ms,
                    "SSE session ended; opening a new one after backoff");
            } else {
                warn!(backend = %self.name, reason = %why, restarts, backoff_ms,
                    "stdio server is down; restarting after backoff");
            }
            if !self.wait_backoff(Instant::now() + backoff).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// After a failed spawn, fails every request waiting for a child at once (the next attempt
    /// may be up to `MAX_BACKOFF` away), while still honouring a queued shutdown.
    fn refuse_waiting(&mut self, msg: String) -> End {
        while let Ok(cmd) = self.rx.try_recv() {
            self.backlog.push_back(cmd);
        }
        let mut end = End::Exited(msg.clone());
        for cmd in std::mem::take(&mut self.backlog) {
            match cmd {
                Cmd::Request { pending, .. } => {
                    pending.finish(Err(UpstreamError::Connect(msg.clone())))
                }
                Cmd::Shutdown(ack) => end = End::Stop(ack),
                Cmd::Notify { ack, .. } => {
                    if let Some(ack) = ack {
                        let _ = ack.send(Err(UpstreamError::Connect(msg.clone())));
                    }
                }
                Cmd::Cancel { .. } => {}
            }
        }
        end
    }

    /// Starts the link: spawns the child, or opens an SSE session (bounded by `timeout_ms`).
    async fn open(&self) -> Result<Link, String> {
        if let Some(t) = &self.sse {
            return match crate::upstream::sse::connect(t).await {
                Ok((conn, out)) => Ok(Link::Sse(conn, out)),
                Err(why) => {
                    warn!(backend = %self.name, %why, "cannot open the SSE session");
                    Err(format!("cannot open the SSE session: {why}"))
                }
            };
        }
        self.spawn().map(Link::Child).map_err(|error| {
            let program = &self.program;
            warn!(backend = %self.name, %error, %program, "cannot start stdio server");
            format!("cannot start stdio server {program:?}: {error}")
        })
    }

    /// Runs one HTTP+SSE session until its stream ends, a POST fails or portico stops it;
    /// fails whatever is still in flight (the next session is a new generation).
    async fn sse_session(&mut self, mut conn: SseConn, out: Writer) -> End {
        let mut dead = std::mem::replace(&mut conn.dead, mpsc::unbounded_channel().1);
        let (generation, end) = self.begin_session(None, &out);
        info!(backend = %self.name, generation, "SSE session opened");
        let end = match end {
            Some(end) => end,
            None => loop {
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        None => break End::Stop(None),
                        Some(cmd) => {
                            if let Some(end) = self.command(cmd, &out, generation) {
                                break end;
                            }
                        }
                    },
                    msg = conn.next_message() => match msg {
                        Ok(Some(m)) => self.on_stdout(Line::Text(m.to_vec()), &out),
                        Ok(None) => break End::Exited("the SSE stream ended".into()),
                        Err(why) => break End::Exited(why),
                    },
                    why = dead.recv() => break End::Exited(
                        why.unwrap_or_else(|| "the SSE poster stopped".into())
                    ),
                }
            },
        };
        drop(out);
        drop(conn);
        self.end_session(match &end {
            End::Exited(why) => format!("SSE session ended: {why}"),
            End::Stop(_) => "SSE backend is shutting down".into(),
        });
        end
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(&self.env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd.spawn()
    }

    /// Sleeps until `until`, keeping commands for the next child. `false` = stop.
    async fn wait_backoff(&mut self, until: Instant) -> bool {
        loop {
            tokio::select! {
                _ = sleep_until(until) => return true,
                cmd = self.rx.recv() => match cmd {
                    None => return false,
                    Some(Cmd::Shutdown(ack)) => {
                        if let Some(ack) = ack {
                            let _ = ack.send(());
                        }
                        return false;
                    }
                    Some(Cmd::Cancel { gid, .. }) => self
                        .backlog
                        .retain(|c| !matches!(c, Cmd::Request { gid: g, .. } if *g == gid)),
                    // A client's line is kept for the next child, and the client told so now
                    // rather than after the backoff.
                    Some(Cmd::Notify { line, ack }) => {
                        if let Some(ack) = ack {
                            let _ = ack.send(Ok(()));
                        }
                        self.backlog.push_back(Cmd::Notify { line, ack: None });
                    }
                    Some(cmd) => self.backlog.push_back(cmd),
                },
            }
        }
    }

    /// Runs one child until it exits or portico stops it; fails whatever is still in flight.
    async fn session(&mut self, mut child: Child) -> End {
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill().await;
            return End::Exited("stdio pipes missing".into());
        };
        let (out, wrx) = crate::upstream::LineQueue::new();
        tokio::spawn(write_lines(stdin, wrx));
        tokio::spawn(log_stderr(stderr, self.name.clone()));
        let mut stdout = LineReader::new(stdout, self.max_line);
        let pid = child.id();
        let (generation, end) = self.begin_session(pid, &out);
        info!(backend = %self.name, pid, generation, "stdio server started");
        let end = match end {
            Some(end) => end,
            None => loop {
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        None => break End::Stop(None),
                        Some(cmd) => {
                            if let Some(end) = self.command(cmd, &out, generation) {
                                break end;
                            }
                        }
                    },
                    line = stdout.next_line() => match line {
                        Ok(Some(line)) => self.on_stdout(line, &out),
                        // Usually the child exiting; its status makes the better message.
                        Ok(None) => break match timeout(EXIT_GRACE, child.wait()).await {
                            Ok(Ok(st)) => End::Exited(format!("stdio server exited ({st})")),
                            _ => End::Exited("stdio server closed its stdout".into()),
                        },
                        Err(e) => break End::Exited(format!("reading stdout failed: {e}")),
                    },
                    status = child.wait() => {
                        // Answers written just before exiting are still in the pipe.
                        let until = Instant::now() + EXIT_DRAIN;
                        while let Ok(Ok(Some(line))) = timeout_at(until, stdout.next_line()).await {
                            self.on_stdout(line, &out);
                        }
                        break End::Exited(match status {
                            Ok(s) => format!("stdio server exited ({s})"),
                            Err(e) => format!("stdio server exited (wait failed: {e})"),
                        });
                    }
                }
            },
        };
        // Closing stdin is the polite stop for an MCP stdio server; kill it if it lingers.
        drop(out);
        if timeout(EXIT_GRACE, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
        self.end_session(match &end {
            End::Exited(why) => why.clone(),
            End::Stop(_) => "stdio backend is shutting down".into(),
        });
        end
    }

    /// A session (child or SSE connection) is over: the status says so, and every request
    /// still in flight fails with `why`.
    fn end_session(&mut self, why: String) {
        self.status.send_modify(|s| {
            s.up = false;
            s.pid = None;
        });
        let err = UpstreamError::Closed(why);
        for (_, p) in self.pending.drain() {
            p.finish(Err(err.clone()));
        }
    }

    /// A session (child or SSE connection) is up: the status says so under a new generation,
    /// and what was asked while none ran is sent. The generation, and the end a replayed
    /// command asked for.
    fn begin_session(&mut self, pid: Option<u32>, out: &Writer) -> (u64, Option<End>) {
        self.status.send_modify(|s| {
            s.up = true;
            s.generation += 1;
            s.pid = pid;
        });
        let generation = self.status.borrow().generation;
        let mut end = None;
        for cmd in std::mem::take(&mut self.backlog) {
            end = end.or(self.command(cmd, out, generation));
        }
        (generation, end)
    }

    fn command(&mut self, cmd: Cmd, out: &Writer, generation: u64) -> Option<End> {
        match cmd {
            Cmd::Request { gid, line, pending } => {
                if pending.tx.is_closed() {
                    return None; // the caller left before it was ever sent
                }
                if pending.generation.is_some_and(|g| g != generation) {
                    pending.finish(Err(UpstreamError::Restarted));
                    return None;
                }
                match out.send(line) {
                    // Closed: the link is closing, and the session's end fails what is in flight.
                    Ok(()) | Err(Unqueued::Closed) => {
                        self.pending.insert(gid, pending);
                    }
                    Err(Unqueued::Full) => {
                        if self.warnings.allow() {
                            warn!(backend = %self.name, unwritten = out.unwritten(),
                                "the server is not reading what portico writes to it; request refused");
                        }
                        pending.finish(Err(UpstreamError::Overloaded));
                    }
                }
            }
            Cmd::Notify { line, ack: None } => self.write_own(out, line),
            Cmd::Notify {
                line,
                ack: Some(ack),
            } => {
                // Closed: the link is closing; the line goes the way of the child, as it would
                // have a moment later.
                let outcome = match out.send(line) {
                    Ok(()) | Err(Unqueued::Closed) => Ok(()),
                    Err(Unqueued::Full) => {
                        if self.warnings.allow() {
                            warn!(backend = %self.name, unwritten = out.unwritten(),
                                "the server is not reading what portico writes to it; a client's message refused");
                        }
                        Err(UpstreamError::Overloaded)
                    }
                };
                let _ = ack.send(outcome);
            }
            Cmd::Cancel { gid, reason } => {
                if let Some(p) = self.pending.remove(&gid)
                    && p.cancellable
                {
                    debug!(backend = %self.name, gid, reason, "cancelling stdio request");
                    let params = json!({"requestId": gid, "reason": reason});
                    let method = "notifications/cancelled";
                    let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
                    self.write_own(out, line_of(serde_json::to_vec(&msg).unwrap_or_default()));
                }
            }
            Cmd::Shutdown(ack) => return Some(End::Stop(ack)),
        }
        None
    }

    /// Writes a line no caller waits on (a cancellation, the answer to a server's ping, a
    /// client's line kept while no child ran): dropped, and said so, when the server has
    /// stopped reading.
    fn write_own(&mut self, out: &Writer, line: Bytes) {
        if out.send(line) == Err(Unqueued::Full) && self.warnings.allow() {
            warn!(backend = %self.name, unwritten = out.unwritten(),
                "the server is not reading what portico writes to it; a message dropped");
        }
    }

    fn on_stdout(&mut self, line: Line, out: &Writer) {
        let line = match line {
            Line::Text(t) => t,
            Line::TooLong(bytes) => {
                if self.warnings.allow() {
                    let max = self.max_line;
                    let name = &self.name;
                    warn!(backend = %name, bytes, max, "stdio server wrote an oversized line; skipped");
                }
                return;
            }
        };
        let msg = match serde_json::from_slice::<Incoming>(&line) {
            Ok(m) if first_byte(&line) == Some(b'{') => m,
            _ => {
                if self.warnings.allow() {
                    let line = preview(&line);
                    let name = &self.name;
                    warn!(backend = %name, %line, "stdio server wrote a non-JSON-RPC line; skipped");
                }
                return;
            }
        };
        match (msg.method.as_deref(), msg.id) {
            (Some(method), Some(id)) => self.server_request(method, id, &line, out),
            (Some(method), None) => self.notification(method, msg.params, &line),
            (None, Some(id)) if msg.result.is_some() || msg.error.is_some() => {
                self.response(id, msg.result, msg.error)
            }
            _ if self.warnings.allow() => {
                let line = preview(&line);
                warn!(backend = %self.name, %line, "stdio server wrote an invalid message; skipped")
            }
            _ => {}
        }
    }

    fn response(&mut self, id: &RawValue, result: Option<&RawValue>, error: Option<&RawValue>) {
        let Some(p) = gateway_id(id).and_then(|gid| self.pending.remove(&gid)) else {
            if self.warnings.allow() {
                warn!(backend = %self.name, id = id.get(), "reply with an unknown id dropped");
            }
            return;
        };
        let status = match (result, error) {
            (None, Some(e)) => {
                let code = serde_json::from_str::<ErrorCode>(e.get())
                    .map_or(code::INTERNAL_ERROR, |c| c.code);
                StatusCode::from_u16(status_for_code(code)).unwrap_or(StatusCode::OK)
            }
            _ => StatusCode::OK,
        };
        let body = OutResponse {
            jsonrpc: "2.0",
            id: &p.orig_id,
            result,
            error: result.is_none().then_some(error).flatten(),
        };
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        p.finish(Ok(Event::Response(status, body)));
    }

    /// A server's request: `ping` is answered here; a request a client can be asked
    /// (`protocol::INPUT_REQUESTS`) joins the stream of the call it belongs to, where the bridge
    /// relays or parks it (`bridge::input`) and answers through [`StdioUpstream::respond`];
    /// anything else, or one no call can be found for, is refused at once rather than leave
    /// the server waiting.
    fn server_request(&mut self, method: &str, id: &RawValue, line: &[u8], out: &Writer) {
        if crate::protocol::input_capability(method).is_some()
            && let Some(call) = self.call_for_input()
            && call.tx.capacity() > 1
            && call
                .tx
                .try_send(Ok(Event::Note(Bytes::copy_from_slice(line))))
                .is_ok()
        {
            debug!(backend = %self.name, method, "server request joins its call's stream");
            return;
        }
        let reply = if method == "ping" {
            debug!(backend = %self.name, "answering server ping");
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            warn!(backend = %self.name, method, "server-initiated request refused");
            let error = json!({"code": code::METHOD_NOT_FOUND, "message": NO_SERVER_REQUESTS});
            json!({"jsonrpc": "2.0", "id": id, "error": error})
        };
        self.write_own(out, line_of(serde_json::to_vec(&reply).unwrap_or_default()));
    }

    /// The call a server request made now belongs to: stdio says nothing about it, so only
    /// when the answer is certain — the newest client call on a child that serves one client,
    /// or the only one in flight on a shared child. portico's own handshakes never qualify.
    fn call_for_input(&self) -> Option<&Pending> {
        let mut calls = self.pending.iter().filter(|(_, p)| p.cancellable);
        if self.owned {
            return calls.max_by_key(|(gid, _)| **gid).map(|(_, p)| p);
        }
        let only = calls.next()?;
        calls.next().is_none().then_some(only.1)
    }

    /// Progress goes to the request whose gateway token it carries, with the caller's token
    /// restored; every other notification is broadcast to subscribers as the child sent it.
    fn notification(&mut self, method: &str, params: Option<&RawValue>, line: &[u8]) {
        // A log line on stdio names no request. A 2026-07-28 server emits one only for a
        // request that set `logLevel` (docs/protocol.md §1), so when exactly one such request
        // is in flight the line is its own; with several it cannot be told whose, and is
        // nobody's (never another client's).
        if method == "notifications/message" {
            let mut asking = self.pending.values().filter(|p| p.logs);
            if let Some(p) = asking.next() {
                if asking.next().is_none() {
                    p.note(Bytes::copy_from_slice(line));
                } else {
                    debug!(backend = %self.name, "a log line with several requests asking: dropped");
                }
                return;
            }
        }
        if method != "notifications/progress" {
            let _ = self.notes.send(Bytes::copy_from_slice(line));
            return;
        }
        let routed = params.and_then(|p| {
            let mut map = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(p.get()).ok()?;
            let token = serde_json::from_str::<String>(map.get("progressToken")?.get()).ok()?;
            let gid = token.strip_prefix(TOKEN_PREFIX)?.parse::<u64>().ok()?;
            let pending = self.pending.get(&gid)?;
            map.insert("progressToken".into(), pending.orig_token.clone()?);
            let msg = json!({"jsonrpc": "2.0", "method": method, "params": map});
            Some((pending, serde_json::to_vec(&msg).ok()?))
        });
        match routed {
            Some((pending, body)) => pending.note(Bytes::from(body)),
            // Normal after a cancel or a timeout: the server had not seen it yet.
            None => debug!(backend = %self.name, "progress for no in-flight request dropped"),
        }
    }
}

/// Writes queued lines to the child's stdin; ends (closing stdin) when the queue closes.
pub(super) async fn write_lines(mut stdin: ChildStdin, mut rx: crate::upstream::LineRx) {
    while let Some(line) = rx.recv().await {
        let wrote = stdin.write_all(&line).await;
        rx.written(line.len());
        if wrote.is_err() {
            return; // the child is gone; the actor learns that from its exit
        }
    }
}

/// Logs the child's stderr under the backend's name, at most `STDERR_LINES_PER_SEC` lines a
/// second: a chatty or crash-looping server must not flood portico's log.
pub(super) async fn log_stderr(stderr: ChildStderr, name: Arc<str>) {
    let mut lines = LineReader::new(stderr, MAX_STDERR_LINE);
    let mut window = Instant::now();
    let (mut shown, mut suppressed) = (0u32, 0u64);
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                if window.elapsed() >= Duration::from_secs(1) {
                    window = Instant::now();
                    shown = 0;
                }
                if shown >= STDERR_LINES_PER_SEC {
                    suppressed += 1;
                    continue;
                }
                shown += 1;
                match line {
                    Line::Text(t) => {
                        let line = String::from_utf8_lossy(&t);
                        info!(backend = %name, %line, "stdio server stderr");
                    }
                    Line::TooLong(bytes) => {
                        info!(backend = %name, bytes, "stdio server stderr line too long; skipped");
                    }
                }
            }
            _ = sleep_until(window + Duration::from_secs(1)), if suppressed > 0 => {
                warn!(backend = %name, suppressed, "stdio server stderr rate-limited");
                suppressed = 0;
            }
        }
    }
    if suppressed > 0 {
        warn!(backend = %name, suppressed, "stdio server stderr rate-limited");
    }
}
