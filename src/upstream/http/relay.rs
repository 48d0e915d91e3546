//! A backend's answer on its way to the client: relayed frame by frame within its deadline
//! ([`RelayBody`]), split into messages when it is an event stream, and the small generator
//! the streams are written with.

use super::*;

/// The body error a relay ends with when the deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("backend answer exceeded the deadline")]
pub struct TimedOut;

/// An upstream answer relayed to the client as it arrives.
pub struct RelayBody {
    pub(super) inner: UpBody,
    pub(super) upstream: Arc<HttpUpstream>,
    /// Back to the pool once the answer has been read to its end; dropped (closing the
    /// connection, which the backend sees as cancellation) if the client leaves first.
    pub(super) conn: Option<Sender>,
    pub(super) deadline: Instant,
    /// Armed only when the upstream makes us wait, so a body that is already there costs no timer.
    pub(super) sleep: Option<Pin<Box<Sleep>>>,
    /// For SSE answers: the request body, to address an error event to the request's id if the
    /// stream breaks or times out (a 200 has been sent, so only an in-stream error can tell the
    /// client).
    pub(super) on_break: Option<Bytes>,
    /// For SSE answers: the call's clock and the event boundaries that move it.
    pub(super) clock: Option<(CallClock, EventEnds)>,
    /// For SSE answers: the bytes relayed so far end an event (or none were relayed). An error
    /// event appended to half an event would merge into it, so a break mid-event aborts instead.
    pub(super) at_boundary: bool,
    /// Bytes relayed since the clock was last read. The timer is polled only when the backend
    /// makes us wait, and a backend that never does (an endless body at full speed) would
    /// never be cut; reading the clock every `CLOCK_EVERY` bytes enforces the deadline there
    /// too, at the cost of a counter per frame.
    pub(super) unclocked: usize,
    pub(super) done: bool,
}

/// Bytes relayed between two looks at the clock while the backend keeps the relay busy.
pub(super) const CLOCK_EVERY: usize = 64 * 1024;

impl RelayBody {
    pub(super) fn finish_ok(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            self.upstream.release(conn);
        }
        if let UpBody::H1(b) = &mut self.inner {
            h1::recycle(&self.upstream.lean, b);
        }
    }

    fn fail(&mut self, why: &str, err: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.done = true;
        self.conn = None;
        // Drops the upstream connection now (H1: the socket; hyper: the body, which closes
        // its connection), rather than when the client's response is dropped.
        self.inner = UpBody::H1(h1::H1Body::ended());
        match self.on_break.take() {
            Some(req) if self.at_boundary => {
                let id = sniff_id(&req);
                let msg = GatewayError::BackendFailed {
                    backend: self.upstream.name.to_string(),
                    detail: why.to_string(),
                }
                .to_message(id.as_ref());
                Poll::Ready(Some(Ok(Frame::data(sse_event(&msg)))))
            }
            _ => Poll::Ready(Some(Err(err))),
        }
    }

    fn timed_out(&mut self, err: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let ms = self.upstream.timeout.as_millis();
        let why = match &self.clock {
            Some((clock, _)) if clock.past_hard() => format!(
                "did not finish within max_call_ms ({} ms)",
                self.upstream.max_call.unwrap_or_default().as_millis()
            ),
            Some(_) => format!("sent no message for {ms} ms"),
            None => format!("did not finish within {ms} ms"),
        };
        self.fail(&why, err)
    }

    /// A message went by on an SSE answer: the deadline moves on (never past the hard bound).
    fn message_seen(&mut self) {
        let Some((clock, _)) = &self.clock else {
            return;
        };
        let next = clock.after_message();
        self.deadline = next;
        if let UpBody::H1(b) = &mut self.inner {
            b.set_deadline(next);
        }
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(next);
        }
    }
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.unclocked += data.len();
                    if this.unclocked >= CLOCK_EVERY {
                        this.unclocked = 0;
                        if Instant::now() >= this.deadline {
                            return this.timed_out(Box::new(TimedOut));
                        }
                    }
                    if this.on_break.is_some() && !data.is_empty() {
                        this.at_boundary = data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n");
                    }
                    if let Some((_, ends)) = &mut this.clock
                        && ends.feed(data)
                    {
                        this.message_seen();
                    }
                }
                if this.inner.is_end_stream() {
                    this.finish_ok();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish_ok();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) if e.downcast_ref::<TimedOut>().is_some() => {
                this.timed_out(e)
            }
            Poll::Ready(Some(Err(e))) => this.fail("closed the stream", e),
            // The lean client's body watches the deadline itself.
            Poll::Pending if matches!(this.inner, UpBody::H1(_)) => Poll::Pending,
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => this.timed_out(Box::new(TimedOut)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// The first pause before resuming a stream whose server named no `retry:`.
const DEFAULT_RESUME_WAIT: Duration = Duration::from_millis(500);
/// The longest pause a server's `retry:` gets before a resumption (the call's deadline bounds
/// it too).
const MAX_RESUME_WAIT: Duration = Duration::from_secs(10);
/// Resumptions in a row that brought no message: past this the stream is given up (a server
/// that keeps closing at once must not be asked again and again until the deadline).
const MAX_RESUMES_WITHOUT_MESSAGE: u32 = 8;

/// How an initialize-era answer stream that its server closed before the response is picked
/// up again (2025-11-25 resumability, docs/protocol.md §7): a GET in the same session naming the
/// last event seen (`Last-Event-ID`), after the pause the server asked for (`retry:`).
pub(super) struct Resume {
    /// The request's session headers (`MCP-Protocol-Version`, `Mcp-Session-Id`).
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) clock: CallClock,
    pub(super) deadline: Instant,
}

impl Resume {
    /// The headers that name an initialize-era session among a request's (found by `get`), for
    /// resuming its answer stream; `None` for a 2026-07-28 request, whose streams do not resume.
    pub(super) fn session_headers(
        get: impl Fn(&HeaderName) -> Option<HeaderValue>,
    ) -> Option<Vec<(HeaderName, HeaderValue)>> {
        let version = get(&h::names::PROTOCOL_VERSION)?;
        if version.as_bytes() == LATEST_VERSION.as_bytes() {
            return None;
        }
        let mut headers = vec![(h::names::PROTOCOL_VERSION, version)];
        if let Some(id) = get(&h::names::SESSION_ID) {
            headers.push((h::names::SESSION_ID, id));
        }
        Some(headers)
    }

    /// The stream again, from after `last_id`, on `up`; why not when it cannot be had.
    async fn reopen(
        &self,
        up: &Arc<HttpUpstream>,
        last_id: &[u8],
        retry_ms: Option<u64>,
    ) -> Result<RelayBody, String> {
        if self.clock.past_hard() {
            return Err("the call reached max_call_ms".into());
        }
        let wait = retry_ms
            .map_or(DEFAULT_RESUME_WAIT, Duration::from_millis)
            .min(MAX_RESUME_WAIT);
        if Instant::now() + wait >= self.deadline {
            return Err("the server's pause runs past the call's deadline".into());
        }
        tokio::time::sleep(wait).await;
        let id = HeaderValue::from_bytes(last_id)
            .map_err(|_| "its last event id is no header value".to_string())?;
        let mut extra = self.headers.clone();
        extra.push((LAST_EVENT_ID, id));
        let ex = up
            .exchange(up.get_events(&extra), self.deadline)
            .await
            .map_err(|e| format!("the GET naming its last event failed: {e}"))?;
        let status = ex.response.status();
        let (parts, mut body) = up.relay(ex, self.deadline, Bytes::new());
        if !status.is_success() || !is_event_stream(&parts.headers) {
            return Err(format!(
                "the GET naming its last event was answered HTTP {}",
                status.as_u16()
            ));
        }
        body.on_break = None;
        Ok(body)
    }
}

/// A message came: the call's clock restarts for a resumption, and the resumptions that
/// brought nothing are counted afresh.
fn heard(resume: &mut Option<Resume>, resumed_without_message: &mut u32) {
    *resumed_without_message = 0;
    if let Some(r) = resume {
        r.deadline = r.clock.after_message();
    }
}

/// The header a client resuming an event stream names its last event in.
const LAST_EVENT_ID: HeaderName = HeaderName::from_static(crate::protocol::header::LAST_EVENT_ID);

/// Decodes an SSE answer into JSON-RPC messages, ending with an error item if the stream breaks,
/// an event passes `limit` bytes or is not a JSON-RPC message, or (for a POSTed request, given
/// as `request`) the stream ends without the response (docs/protocol.md §4) — unless it can be
/// resumed (`resume`: an initialize-era request whose server gave its events ids; a stream its
/// server closed early, or whose connection broke), and then the messages of the resumed
/// stream follow.
pub(super) fn sse_messages(
    mut body: RelayBody,
    limit: usize,
    request: Option<Bytes>,
    mut resume: Option<Resume>,
) -> impl futures_util::Stream<Item = Result<Bytes, UpstreamError>> + Send {
    async_stream(move |tx| async move {
        let mut dec = SseDecoder::new(limit);
        let mut answered = false;
        // What a resumption names and waits for, kept over the streams of one answer.
        let (mut last_id, mut retry_ms) = (None::<Vec<u8>>, None);
        let mut resumed_without_message = 0;
        // Checks one event; `false` once the stream must end (an error was sent, or nobody
        // listens any more).
        let deliver = async |ev: Bytes, answered: &mut bool| {
            let item = match shape(&ev) {
                Ok(response) => {
                    *answered |= response;
                    Ok(ev)
                }
                Err(what) => Err(UpstreamError::Protocol(format!("an SSE event {what}"))),
            };
            let go_on = item.is_ok();
            tx.send(item).await.is_ok() && go_on
        };
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            let ended = match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        dec.push(&data);
                        loop {
                            match dec.next_event() {
                                Ok(Some(ev)) => {
                                    if !deliver(ev, &mut answered).await {
                                        return;
                                    }
                                    heard(&mut resume, &mut resumed_without_message);
                                }
                                Ok(None) => break,
                                Err(_) => {
                                    let _ = tx
                                        .send(Err(UpstreamError::Protocol(format!(
                                            "an SSE event exceeds max_answer_bytes ({limit} bytes)"
                                        ))))
                                        .await;
                                    return;
                                }
                            }
                        }
                    }
                    continue;
                }
                Some(Err(e)) => {
                    // A connection that broke (not the call's clock running out, nor bad
                    // framing) is resumed like a stream its server closed: the event it broke
                    // in was never dispatched, so the resumption names the one before, and the
                    // server sends the broken one again.
                    let broke = match body_error(e) {
                        UpstreamError::Closed(why) if resume.is_some() && !answered => why,
                        other => {
                            let _ = tx.send(Err(other)).await;
                            return;
                        }
                    };
                    if request.as_deref().and_then(sniff_id).is_none() {
                        let _ = tx.send(Err(UpstreamError::Closed(broke))).await;
                        return;
                    }
                    End::Broke(broke)
                }
                None => {
                    if let Some(ev) = dec.finish() {
                        if !deliver(ev, &mut answered).await {
                            return;
                        }
                        heard(&mut resume, &mut resumed_without_message);
                    }
                    if answered || request.as_deref().and_then(sniff_id).is_none() {
                        return;
                    }
                    End::Closed
                }
            };
            // Owed a response and not given one: resumed when the server gave its events ids,
            // else (or when that fails) an error naming why.
            if let Some(id) = dec.last_event_id() {
                last_id = Some(id.to_vec());
            }
            retry_ms = dec.retry_ms().or(retry_ms);
            let why = match (&resume, &last_id) {
                (Some(r), Some(id)) if resumed_without_message < MAX_RESUMES_WITHOUT_MESSAGE => {
                    match r.reopen(&body.upstream, id, retry_ms).await {
                        Ok(next) => {
                            body = next;
                            dec = SseDecoder::new(limit);
                            resumed_without_message += 1;
                            continue;
                        }
                        Err(why) => format!(", and could not be resumed: {why}"),
                    }
                }
                (Some(_), Some(_)) => format!(
                    ", and {MAX_RESUMES_WITHOUT_MESSAGE} resumptions in a row brought no message"
                ),
                _ => String::new(),
            };
            let err = match ended {
                End::Closed => {
                    UpstreamError::Protocol(format!("the SSE stream ended without a response{why}"))
                }
                End::Broke(broke) => UpstreamError::Closed(format!("{broke}{why}")),
            };
            let _ = tx.send(Err(err)).await;
            return;
        }
    })
}

/// How an answer stream ended before the response it owed.
enum End {
    /// Its server closed it.
    Closed,
    /// The connection broke (why).
    Broke(String),
}

/// A tiny generator: runs `f` with a sender and yields what it sends. Lazily started, and the
/// producing future lives inside the stream, so dropping the stream drops the work (and with it
/// the upstream connection) — no detached task.
pub fn async_stream<T, F, Fut>(f: F) -> impl futures_util::Stream<Item = T> + Send
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<T>(16);
    let producer = f(tx);
    GenStream {
        producer: Some(Box::pin(producer)),
        rx,
    }
}

pub(super) struct GenStream<T> {
    producer: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    rx: tokio::sync::mpsc::Receiver<T>,
}

impl<T> futures_util::Stream for GenStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(p) = self.producer.as_mut()
            && p.as_mut().poll(cx).is_ready()
        {
            self.producer = None;
        }
        // Once the producer is done its sender is dropped, so this ends with `None`.
        self.rx.poll_recv(cx)
    }
}
