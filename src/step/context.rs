//! What the step is given and gives back: the config generation's [`Core`], the
//! per-request [`RequestCtx`], how a backend's names are exposed ([`Exposure`]), the
//! [`Message`] to send and the [`Answer`].

use super::*;

/// What a request needs of its config generation besides the routes: the parts the
/// per-backend step, aggregation and the legacy-client front consult.
pub struct Core {
    pub config: Config,
    /// Seals and opens legacy-client session ids (and aggregated cursors).
    pub sessions: Sessions,
    /// Outlives config generations, so counters survive reloads.
    pub metrics: Arc<Metrics>,
    /// The shared list cache of this generation (a reload starts empty: the config that
    /// shaped the entries may have changed).
    pub cache: Arc<Cache>,
    /// Change-notification streams that keep `cache` honest.
    pub watchers: Watchers,
    /// Authentication, team policy and rate limits.
    pub auth: Auth,
    /// Calls in flight on shared upstreams, so a client's cancel finds its own (`calls`).
    pub calls: Arc<calls::Calls>,
    /// What initialize-era clients asked to hear (`clients`).
    pub clients: Arc<clients::Clients>,
}

/// A response extension: the request's context as it will be once its answer is done, for an
/// answer that outlives the request's handler (an initialize-era client's call answered as a
/// stream before it finished, `legacy::resume`). The pipeline's exit then records the request
/// (`State::observe`) when that context arrives — with the call's own status, error and
/// upstream time — instead of at the response head; if the answer is dropped first, with the
/// context it had at the head.
#[derive(Clone)]
pub struct FinishLater(
    pub Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<RequestCtx>>>>,
);

impl FinishLater {
    /// The receiver, taken once.
    pub fn take(&self) -> Option<tokio::sync::oneshot::Receiver<RequestCtx>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The most of a tool's name the access log and the trace keep (the spec's names are at most
/// 128 characters; a longer one is cut here, not refused).
pub const MAX_LOGGED_TOOL_BYTES: usize = 128;

/// Everything known about one request, filled in as it moves through the phases and read once
/// at the exit by metrics and the access log. `Clone` so an aggregated endpoint can give each
/// concurrent part request its own copy.
#[derive(Clone)]
pub struct RequestCtx {
    pub start: StdInstant,
    /// Backend or endpoint name serving the request.
    pub route: Option<Arc<str>>,
    /// The backend the request went to (for a backend route, the route itself).
    pub backend: Option<Arc<str>>,
    /// The client's W3C `traceparent`, when well-formed (forwarded upstream by the allowlist).
    pub traceparent: Option<HeaderValue>,
    /// The request's span, when `[tracing]` is on: upstream attempts become its children and
    /// carry their own `traceparent` instead of the client's.
    pub trace: Option<Trace>,
    /// Time spent waiting for upstream answers.
    pub upstream: Option<std::time::Duration>,
    /// The MCP method (from the header or the body).
    pub method: Option<String>,
    /// The tool a `tools/call` names, as the client named it (the access log's and the
    /// trace's audit of who called what; `note_tool`).
    pub tool: Option<Box<str>>,
    /// The exit writes `tool` somewhere (the access log, a trace): only then is it noted, so
    /// a gateway with neither pays no allocation for it.
    pub audited: bool,
    /// The JSON-RPC id, once read.
    pub id: Option<RequestId>,
    /// The request body, kept (a cheap `Bytes` clone) so an error can echo the id lazily.
    pub body: Bytes,
    pub era: Option<Era>,
    /// Whether the body went upstream untouched.
    pub passthrough: bool,
    /// Failure reason label, if any.
    pub error: Option<&'static str>,
    /// How the shared cache answered (`hit`, `miss`, …), when it was consulted.
    pub cache: Option<&'static str>,
    pub status: u16,
    /// Who is calling, once authenticated (`None` in auth mode `none`).
    pub principal: Option<Arc<Principal>>,
    /// When the backend last answered this request (`upstream_since`).
    pub answered: Option<StdInstant>,
    /// The caller's rate limit has been charged for this request (once, however many
    /// backends the request reaches).
    pub rate_charged: bool,
    /// The `[[auth.tool_limits]]` buckets have been charged for this request's `tools/call`
    /// (once, though the step may be taken again for it after a re-probe).
    pub tool_charged: bool,
    /// The upstream `Authorization` exchanged for the caller (`[backends.token_exchange]`) on
    /// the backend named: taken in the step before the request goes out, and used only there.
    /// Boxed: rare, and the context moves with every request.
    pub exchanged: Option<Box<(Arc<str>, HeaderValue)>>,
    /// portico wrote this 2026-07-28 request on a client's behalf (`portico stdio`), so it also
    /// builds the headers such a client would (`Mcp-Param-*`, `params::param_headers`).
    pub built_by_portico: bool,
    /// An initialize-era client's request came over a connection of its own, not from
    /// portico's in-process fronts (`frontend::InProcess`): only then can a connection break
    /// under its SSE answer, which is then held for a resume (`legacy`).
    pub remote: bool,
    /// An initialize-era client's session (set by `legacy`): whose upstream sessions the
    /// request uses and which calls its cancel may reach. `None`: a 2026-07-28 client, whose
    /// owner is its authorization context and declared capabilities.
    pub client: Option<Arc<bridge::Owner>>,
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestCtx {
    pub fn new() -> RequestCtx {
        RequestCtx {
            start: StdInstant::now(),
            route: None,
            backend: None,
            traceparent: None,
            trace: None,
            upstream: None,
            method: None,
            tool: None,
            audited: false,
            id: None,
            body: Bytes::new(),
            era: None,
            passthrough: false,
            error: None,
            cache: None,
            status: 0,
            principal: None,
            answered: None,
            rate_charged: false,
            tool_charged: false,
            exchanged: None,
            built_by_portico: false,
            remote: false,
            client: None,
        }
    }

    /// Notes the tool a `tools/call` names (the first name heard: the client's, before an
    /// aggregated endpoint rewrites it), cut to `MAX_LOGGED_TOOL_BYTES` — the log line must not
    /// grow with whatever a client puts there.
    pub fn note_tool(&mut self, method: Option<&str>, name: Option<&str>) {
        if self.tool.is_none() {
            self.note_body_tool(method, name);
        }
    }

    /// Notes the tool the body names, in place of a header's that said otherwise (a request
    /// whose headers disagree is recorded as what it would have called); the name noted
    /// already costs nothing.
    pub fn note_body_tool(&mut self, method: Option<&str>, name: Option<&str>) {
        if !self.audited || method != Some("tools/call") {
            return;
        }
        let Some(name) = name else { return };
        let mut end = name.len().min(MAX_LOGGED_TOOL_BYTES);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let name = &name[..end];
        if self.tool.as_deref() != Some(name) {
            self.tool = Some(name.into());
        }
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.start.elapsed()
    }

    /// Adds the time since `since` to the upstream wait; the clock reading is kept as the
    /// moment the backend last answered (`answered`).
    pub fn upstream_since(&mut self, since: StdInstant) {
        let now = StdInstant::now();
        self.add_upstream(now.duration_since(since), now);
    }

    /// Adds `took` of upstream wait that ended at `at` (the one place both fields change).
    pub fn add_upstream(&mut self, took: std::time::Duration, at: StdInstant) {
        self.upstream = Some(self.upstream.unwrap_or_default() + took);
        self.answered = Some(at);
    }

    /// The request's age at the backend's last answer, or now when none answered (a cache
    /// hit, a refusal): the per-tool time without another clock read on the usual path.
    pub fn age_at_answer(&self) -> std::time::Duration {
        match self.answered {
            Some(at) => at.duration_since(self.start),
            None => self.elapsed(),
        }
    }

    /// The id an error answer carries: the parsed one, else whatever the body shows.
    pub fn error_id(&self) -> Option<RequestId> {
        self.id.clone().or_else(|| protocol::sniff_id(&self.body))
    }
}

/// How a backend's names appear to the client: bare on `/mcp/<name>`, `<prefix><separator>`
/// before tool and prompt names on an aggregated endpoint. Team policies judge these names.
#[derive(Clone, Copy, Debug)]
pub struct Exposure<'a> {
    pub(super) prefix: &'a str,
    pub(super) separator: &'a str,
}

impl<'a> Exposure<'a> {
    /// A backend on its own URL.
    pub const DIRECT: Exposure<'static> = Exposure {
        prefix: "",
        separator: "",
    };

    /// A member of an aggregated endpoint (`prefix` `""` = bare names).
    pub fn member(prefix: &'a str, separator: &'a str) -> Exposure<'a> {
        Exposure { prefix, separator }
    }

    /// Whether this is a backend on its own URL (not a member of an aggregated endpoint).
    pub fn is_direct(&self) -> bool {
        self.prefix.is_empty() && self.separator.is_empty()
    }

    /// The name the client sees for the backend's `name`.
    pub fn name<'n>(&self, name: &'n str) -> Cow<'n, str> {
        if self.prefix.is_empty() {
            Cow::Borrowed(name)
        } else {
            Cow::Owned(format!("{}{}{name}", self.prefix, self.separator))
        }
    }
}

/// What the step is asked to send.
#[derive(Clone, Copy)]
pub enum Message<'a> {
    /// The client's body, unread (pass-through; see [`can_pass_through`]): only what the
    /// headers name is known — the method, and for a `tools/call` the decoded `Mcp-Name`.
    Unread {
        method: &'a str,
        name: Option<&'a str>,
    },
    /// A parsed message; the body is its exact bytes.
    Parsed(&'a Envelope),
    /// A parsed message the caller has judged (its headers agree with it; see [`can_relay`]):
    /// after the admission checks, its exact bytes are forwarded and the answer relayed like a
    /// pass-through's, since nothing after the judgement depends on the body.
    Judged(&'a Envelope),
}

/// One request for one backend.
pub struct StepRequest<'a> {
    /// The client's headers (upstreams forward only an allowlist of them).
    pub headers: &'a HeaderMap,
    pub message: Message<'a>,
    pub body: Bytes,
    pub exposure: Exposure<'a>,
    pub deadline: Instant,
    /// Who checks a modern backend's JSON answer (and then records the outcome on the
    /// backend's breaker): the upstream, or the caller that reads it whole anyway. A cached
    /// fetch is always checked by the upstream, since what it stores is served to others.
    pub check: AnswerCheck,
}

/// What the step produced.
pub enum Answer {
    /// The backend's answer relayed byte for byte (pass-through). Boxed, as is the reply: the
    /// answer climbs four async frames, and a 16-byte `Answer` moves in registers where a
    /// 256-byte one took a `memcpy` at each (callgrind: ~11 per pass-through request).
    Relayed(Box<Response<Body>>),
    /// Decoded messages, for the caller to render or merge.
    Reply(Box<Reply>),
    /// The unread body was refused the way only an initialize-era server refuses: the backend
    /// has been re-probed. The caller parses the body and takes the step again.
    Reprobed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_noted_tool_is_the_first_named_cut_at_a_character() {
        let mut ctx = RequestCtx::new();
        ctx.note_tool(Some("tools/call"), Some("echo"));
        assert_eq!(ctx.tool, None, "nothing records it: not noted");
        ctx.audited = true;
        ctx.note_tool(Some("tools/list"), Some("x"));
        assert_eq!(ctx.tool, None, "only calls name a tool");
        ctx.note_tool(Some("tools/call"), Some("echo"));
        ctx.note_tool(Some("tools/call"), Some("p__echo"));
        assert_eq!(
            ctx.tool.as_deref(),
            Some("echo"),
            "the client's name, first heard"
        );
        ctx.note_body_tool(Some("tools/call"), Some("add"));
        assert_eq!(ctx.tool.as_deref(), Some("add"), "the body's name wins");
        let mut ctx = RequestCtx::new();
        ctx.audited = true;
        let long = format!("{}é", "a".repeat(MAX_LOGGED_TOOL_BYTES - 1));
        ctx.note_tool(Some("tools/call"), Some(&long));
        assert_eq!(
            ctx.tool.as_deref(),
            Some("a".repeat(MAX_LOGGED_TOOL_BYTES - 1).as_str()),
            "never more than the bound, never half a character"
        );
    }
}
