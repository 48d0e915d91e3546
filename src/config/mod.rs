//! Configuration: TOML → typed structs, in three steps — `load` (read the file), `parse` (serde,
//! unknown keys rejected), `validate` (cross-field rules, `${ENV}` expansion). `portico --check`
//! runs exactly these steps and nothing else, so a file that passes `--check` starts.
//!
//! Every default is a named `DEFAULT_*` constant; every error names the offending key path
//! (`backends[2].url`) so an operator can fix the file without reading code.

use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The longest a streamed call runs when `max_call_ms` is not set (never below `timeout_ms`):
/// progress keeps a call alive, and a backend that reports forever must still end.
pub const DEFAULT_MAX_CALL_MS: u64 = 3_600_000;
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// A request body must be in within this long, plus time for its size at
/// [`DEFAULT_BODY_MIN_BYTES_PER_S`] (slow-body defence, on every listener and protocol).
pub const DEFAULT_BODY_READ_TIMEOUT_MS: u64 = 10_000;
/// The slowest body rate that earns extra time beyond `body_read_timeout_ms`.
pub const DEFAULT_BODY_MIN_BYTES_PER_S: u64 = 1024;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Idle time before an SSE response gets a keep-alive comment (below common 30-60 s proxy
/// idle timeouts).
pub const DEFAULT_SSE_KEEPALIVE_MS: u64 = 15_000;
/// Client sessions open at once on the 2024-11-05 HTTP+SSE transport (`<route>/sse`); each
/// holds a stream and a task for as long as its client stays.
pub const DEFAULT_MAX_SSE_SESSIONS: usize = 1024;
/// Of those, the sessions one authenticated principal may hold: a quarter of the default, so
/// one caller cannot take the transport from everybody else.
pub const DEFAULT_MAX_SSE_SESSIONS_PER_PRINCIPAL: usize = 256;
pub const DEFAULT_SESSION_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// How long an initialize-era client's SSE stream outlives its connection, waiting for the
/// client's `GET` with `Last-Event-ID`: the SDKs reconnect within a few seconds (their
/// `retry`, 1 s by default, and a short backoff).
pub const DEFAULT_RESUME_MS: u64 = 30_000;
pub const DEFAULT_CACHE_MAX_TTL_MS: u64 = 5 * 60 * 1000;
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 64 * 1024 * 1024;
pub const DEFAULT_STALE_IF_ERROR_MS: u64 = 0;
pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 50;
pub const DEFAULT_REDIS_PREFIX: &str = "portico";
pub const DEFAULT_SEPARATOR: &str = "__";
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 3_000;
pub const DEFAULT_MAX_LINE_BYTES: usize = 4 * 1024 * 1024;
/// Largest upstream answer portico holds in memory (README "Security model", Limits).
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_DEBOUNCE_MS: u64 = 200;
pub const DEFAULT_MAX_IDLE_CONNECTIONS: usize = 256;
/// Upstream sessions (HTTP sessions, or stdio children under `isolation = "per_client"`) one
/// initialize-era backend keeps open for clients at once; beyond it the least recently used
/// is closed.
pub const DEFAULT_MAX_UPSTREAM_SESSIONS: usize = 64;
/// Of those, the sessions one 2026-07-28 client's authorization context may hold (one per set
/// of capabilities it declares); beyond it the context's own least recently used is closed.
pub const DEFAULT_MAX_UPSTREAM_SESSIONS_PER_CONTEXT: usize = 8;
/// Of those, the sessions one authenticated principal's initialize-era clients may hold (one
/// per client session, which it can open at will); beyond it the principal's own least
/// recently used is closed. Half the default cap: one principal cannot take the whole pool.
pub const DEFAULT_MAX_UPSTREAM_SESSIONS_PER_PRINCIPAL: usize = 32;
/// An upstream session unused this long is closed (its client's next request opens a new one).
pub const DEFAULT_UPSTREAM_IDLE_MS: u64 = 10 * 60 * 1000;
/// How long a call of an initialize-era backend waits parked for the client's answers to the
/// server's requests (elicitation, sampling, roots) before the server gets an error.
pub const DEFAULT_INPUT_HOLD_MS: u64 = 60_000;
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
pub const DEFAULT_READY_MIN_BACKENDS: usize = 1;
pub const DEFAULT_HEALTH_INTERVAL_MS: u64 = 10_000;
pub const DEFAULT_HEALTH_TIMEOUT_MS: u64 = 2_000;
pub const DEFAULT_JWT_LEEWAY_S: u64 = 60;
pub const DEFAULT_JWKS_REFRESH_MS: u64 = 5 * 60 * 1000;
pub const DEFAULT_TEAM_CLAIM: &str = "team";
pub const DEFAULT_RETRIES: u32 = 1;
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
pub const DEFAULT_BREAKER_OPEN_MS: u64 = 5_000;
/// `[tracing] sampling_ratio`: every trace that starts at portico is recorded.
pub const DEFAULT_SAMPLING_RATIO: f64 = 1.0;
/// `[tracing] service_name`: the OpenTelemetry `service.name` of the spans.
pub const DEFAULT_SERVICE_NAME: &str = "portico";
/// The `tracing` filter when neither `[log] level` nor `RUST_LOG` gives one.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// A configuration problem, always naming the key (or file) at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub sessions: SessionsConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[metrics]`: absent = no metrics/health listener.
    pub metrics: Option<MetricsConfig>,
    /// `[admin]`: absent = no admin listener (no cache purge, no status page).
    pub admin: Option<AdminConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// `[tracing]`: OpenTelemetry spans over OTLP/HTTP; off without `otlp_endpoint`.
    #[serde(default)]
    pub tracing: TracingConfig,
}

/// `[server]`: the client-facing listener.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to bind, `host:port`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// PEM certificate chain; with `tls_key`, turns on TLS (h1 + h2 by ALPN).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Tokio worker threads; 0 = one per CPU.
    #[serde(default)]
    pub workers: usize,
    /// Largest request body accepted (413 beyond).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Browser origins allowed to call portico. Empty = loopback origins only. `"*"` = any.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// How long in-flight requests may run after SIGTERM before the process exits anyway.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// A connection must deliver its request headers within this time (slowloris defence).
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// A request body must be complete within this time of its head, plus one second per
    /// `body_min_bytes_per_s` bytes received (so a large body on a slow link still makes it,
    /// while a body that trickles never does). Every listener and protocol.
    #[serde(default = "default_body_read_timeout_ms")]
    pub body_read_timeout_ms: u64,
    /// See `body_read_timeout_ms`.
    #[serde(default = "default_body_min_bytes_per_s")]
    pub body_min_bytes_per_s: u64,
    /// Largest request head accepted on HTTP/1.1.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// An SSE response idle this long gets a `: keep-alive` comment line (0 = never), so
    /// proxies and load balancers do not cut quiet streams (listen streams, slow tools).
    #[serde(default = "default_sse_keepalive_ms")]
    pub sse_keepalive_ms: u64,
    /// An SSE response is ended after this long, with a JSON-RPC error for the request
    /// (0 = unlimited).
    #[serde(default)]
    pub max_stream_ms: u64,
    /// Client sessions on the 2024-11-05 HTTP+SSE transport (`GET <route>/sse`, then
    /// `POST <route>/messages`) open at once on this replica; 0 turns the transport off.
    #[serde(default = "default_max_sse_sessions")]
    pub max_sse_sessions: usize,
    /// Of `max_sse_sessions`, how many one authenticated principal may hold (429 beyond).
    /// Anonymous clients cannot be told apart: `max_sse_sessions` alone.
    #[serde(default = "default_max_sse_sessions_per_principal")]
    pub max_sse_sessions_per_principal: usize,
    /// Client connections open at once on the listener; past it new ones wait in the
    /// kernel's listen backlog until one closes. 0 = automatic: half the process's open-file
    /// limit (the rest stays for upstream connections, stdio children, Redis and files).
    #[serde(default)]
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            tls_cert: None,
            tls_key: None,
            workers: 0,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            allowed_origins: Vec::new(),
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            body_read_timeout_ms: DEFAULT_BODY_READ_TIMEOUT_MS,
            body_min_bytes_per_s: DEFAULT_BODY_MIN_BYTES_PER_S,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            sse_keepalive_ms: DEFAULT_SSE_KEEPALIVE_MS,
            max_stream_ms: 0,
            max_sse_sessions: DEFAULT_MAX_SSE_SESSIONS,
            max_sse_sessions_per_principal: DEFAULT_MAX_SSE_SESSIONS_PER_PRINCIPAL,
            max_connections: 0,
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// One line per request (method, backend, status, duration).
    #[serde(default = "default_true")]
    pub access: bool,
    /// `"text"` or `"json"` (JSON lines).
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter such as `"info"` or `"portico=debug"`; `RUST_LOG` overrides it.
    #[serde(default = "default_level")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: true,
            format: LogFormat::Text,
            level: default_level(),
        }
    }
}

#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[admin]`: the operators' listener, serving `POST /admin/cache/purge`, `GET /status` and
/// `GET /status.json`. Nothing of it is served on the client listener.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address to bind, `host:port`. A loopback address, unless a token is configured: then
    /// any address (still plain HTTP: keep it off the public network).
    pub listen: String,
    /// Environment variable holding the bearer token every admin request must carry.
    pub token_env: Option<String>,
    /// File holding that token (surrounding whitespace trimmed).
    pub token_file: Option<PathBuf>,
    /// Filled in by `validate` from `token_env` / `token_file`.
    #[serde(skip)]
    pub token: Option<String>,
}

/// `[tracing]`: one span per request (and one per upstream attempt), exported over OTLP/HTTP
/// with protobuf bodies (README, "Traces").
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP traces URL (`http://host:4318/v1/traces`; a URL without a
    /// path gets `/v1/traces`). Absent: tracing is off and no span is ever made.
    pub otlp_endpoint: Option<String>,
    /// Share of traces starting at portico that are recorded, 0.0–1.0. A client's
    /// `traceparent` decides for its own requests (its sampled flag is followed).
    #[serde(default = "default_sampling_ratio")]
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans.
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            sampling_ratio: DEFAULT_SAMPLING_RATIO,
            service_name: default_service_name(),
        }
    }
}

/// `[metrics]`: the second listener, serving `/metrics`, `/healthz` and `/readyz`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address to bind, `host:port` (plain HTTP; keep it off the public network).
    #[serde(default = "default_metrics_listen")]
    pub listen: String,
    /// `/readyz` answers 200 when at least this many backends are up.
    #[serde(default = "default_ready_min_backends")]
    pub ready_min_backends: usize,
    /// How often every backend is health-checked (the state `/readyz` and `portico_backend_up`
    /// report).
    #[serde(default = "default_health_interval_ms")]
    pub health_interval_ms: u64,
    /// How long one health check may take before the backend counts as down.
    #[serde(default = "default_health_timeout_ms")]
    pub health_timeout_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: default_metrics_listen(),
            ready_min_backends: DEFAULT_READY_MIN_BACKENDS,
            health_interval_ms: DEFAULT_HEALTH_INTERVAL_MS,
            health_timeout_ms: DEFAULT_HEALTH_TIMEOUT_MS,
        }
    }
}

/// `[sessions]`: legacy-client session ids.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// 32 bytes, base64 or hex; `${ENV}` expanded. Absent or empty: a random key per process.
    pub key: Option<String>,
    /// Lifetime of a session id.
    #[serde(default = "default_session_ttl_ms")]
    pub ttl_ms: u64,
    /// This replica's own base URL as the other replicas reach it (`http://10.0.0.5:8080`),
    /// sealed into the `requestState` of calls parked here. A parked call lives in the memory
    /// of the replica that parked it; a retry that lands on another replica is forwarded to
    /// this URL (`/mcp/<backend>`, with the client's credential) once. Absent: such a retry is
    /// refused with `-32602` (README "Scale-out"). Sealed likewise into HTTP+SSE session ids
    /// (`sse_front`) and the event ids of streams held for a `Last-Event-ID` (`legacy::resume`),
    /// whose POSTs and resumes are forwarded the same way. `${ENV}` expanded (an unset variable
    /// is an error), so each replica can name its own address.
    pub advertise_url: Option<String>,
    /// How long an initialize-era client's SSE stream (a request's answer stream, its GET
    /// stream) is kept after its connection drops, for a `GET` with `Last-Event-ID` to take it
    /// up again; its events carry ids. 0: no ids, and a dropped connection drops the stream.
    #[serde(default = "default_resume_ms")]
    pub resume_ms: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            key: None,
            ttl_ms: DEFAULT_SESSION_TTL_MS,
            advertise_url: None,
            resume_ms: DEFAULT_RESUME_MS,
        }
    }
}

/// `[cache]`: the shared list cache.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Upper bound on any entry's freshness, whatever the server's `ttlMs` says.
    #[serde(default = "default_cache_max_ttl_ms")]
    pub max_ttl_ms: u64,
    /// Memory budget for cached bodies.
    #[serde(default = "default_cache_max_bytes")]
    pub max_bytes: u64,
    /// How long past expiry an entry may be served while the backend is failing.
    #[serde(default = "default_stale_if_error_ms")]
    pub stale_if_error_ms: u64,
    /// A Redis shared by every replica: second cache tier and invalidation channel
    /// (`redis://[:password@]host:port[/db]`, `rediss://` for TLS; `${ENV}` expanded).
    pub redis_url: Option<String>,
    /// Budget for each Redis call; past it the request goes on without Redis.
    #[serde(default = "default_redis_timeout_ms")]
    pub redis_timeout_ms: u64,
    /// Namespace of portico's Redis keys and channel, so deployments can share one Redis.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// Keep the in-process tier in front of Redis. `false` (only with `redis_url`) sends every
    /// lookup to Redis: for measuring the Redis tier, or when replicas must never disagree.
    #[serde(default = "default_true")]
    pub local: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            max_ttl_ms: DEFAULT_CACHE_MAX_TTL_MS,
            max_bytes: DEFAULT_CACHE_MAX_BYTES,
            stale_if_error_ms: DEFAULT_STALE_IF_ERROR_MS,
            redis_url: None,
            redis_timeout_ms: DEFAULT_REDIS_TIMEOUT_MS,
            redis_prefix: DEFAULT_REDIS_PREFIX.to_string(),
            local: true,
        }
    }
}

/// Which revision a backend speaks.
#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Probe with `server/discover` on first use.
    #[default]
    Auto,
    Modern,
    Legacy,
}

/// When the gateway reads the request body of a pass-through request.
#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum VerifyBody {
    /// Only when a gateway decision depends on it.
    #[default]
    Auto,
    /// Always: check the mirrored headers against the body before forwarding; the bytes judged
    /// then go on, and the answer comes back relayed, as on pass-through.
    Always,
}

/// `cacheScope` values.
#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Public,
    #[default]
    Private,
}

/// How a stdio backend's children are shared between clients (one child is one session).
#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// One child per authorization context (initialize-era server) or legacy-client session:
    /// no client sees another's session state.
    #[default]
    PerClient,
    /// One child for everyone: only for servers known to keep no per-session state.
    Shared,
}

/// How a `url` backend is spoken to.
#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Streamable HTTP (POST to the URL), both eras.
    #[default]
    Http,
    /// The 2024-11-05 HTTP+SSE transport: GET the URL for an event stream whose `endpoint`
    /// event names where to POST; every answer arrives on the stream. One stream per upstream
    /// session. Implies `protocol = "legacy"`.
    Sse,
}

/// `[[backends]]`: one upstream MCP server, served at `/mcp/<name>`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub name: String,
    /// Streamable HTTP endpoint (`http://` or `https://`).
    pub url: Option<String>,
    /// A built-in server (`"demo"`).
    pub builtin: Option<String>,
    /// A stdio server: program and arguments.
    pub command: Option<Vec<String>>,
    /// Extra environment for `command`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory for `command`.
    pub cwd: Option<PathBuf>,
    /// Deadline for one request, from arrival to the last byte of the answer. For an answer
    /// streamed as SSE it is an idle limit: it counts from the last JSON-RPC message the
    /// backend sent (a progress notification restarts it; keep-alive comments do not).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest a streamed call may run in all, from the request's arrival, however often the
    /// backend sends progress. At least `timeout_ms`; absent = `DEFAULT_MAX_CALL_MS` (1 hour),
    /// or `timeout_ms` if that is longer.
    #[serde(default)]
    pub max_call_ms: Option<u64>,
    /// Static headers sent upstream (`${ENV}` expanded). The client's own credentials never are.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub protocol: Protocol,
    /// `url` backends: `"http"` (Streamable HTTP, default) or `"sse"` (the 2024-11-05
    /// HTTP+SSE transport; implies `protocol = "legacy"`).
    #[serde(default)]
    pub transport: Transport,
    #[serde(default)]
    pub verify_body: VerifyBody,
    /// `ttlMs` given to results of a legacy backend (which sends none).
    #[serde(default)]
    pub default_ttl_ms: u64,
    /// `cacheScope` given to results of a legacy backend.
    #[serde(default)]
    pub default_cache_scope: CacheScope,
    /// Extra PEM CA bundle for an https backend (in addition to the web PKI roots).
    pub ca_file: Option<PathBuf>,
    /// Idle upstream connections kept per backend.
    #[serde(default = "default_max_idle_connections")]
    pub max_idle_connections: usize,
    /// Longest stdout line accepted from a stdio backend.
    #[serde(default = "default_max_line_bytes")]
    pub max_line_bytes: usize,
    /// Largest answer portico holds from this HTTP backend: a JSON answer on the message path
    /// (decoded, cached, aggregated or bridged) and each SSE event it decodes. Beyond it, 502
    /// and the connection is closed. Relayed (pass-through) answers are streamed, not held, and
    /// are not capped by it.
    #[serde(default = "default_max_answer_bytes")]
    pub max_answer_bytes: usize,
    /// How long a protocol probe waits for an answer before calling a stdio server legacy.
    #[serde(default = "default_probe_timeout_ms")]
    pub probe_timeout_ms: u64,
    /// Teams whose principals may use this backend. Empty = every caller `[auth]` admits.
    #[serde(default)]
    pub allow_teams: Vec<String>,
    /// Headers sent upstream for callers of one team, over `headers` (`${ENV}` expanded):
    /// `team_headers = { blue = { Authorization = "Bearer ${BLUE_TOKEN}" } }`.
    #[serde(default)]
    pub team_headers: BTreeMap<String, BTreeMap<String, String>>,
    /// Requests in flight to this backend at once; beyond it, 503. 0 = no limit.
    #[serde(default)]
    pub max_concurrent: usize,
    /// Extra attempts for idempotent methods when the connection could not be made.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Consecutive failures that open the circuit breaker. 0 = no breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker fails fast before letting one probe request through.
    #[serde(default = "default_breaker_open_ms")]
    pub breaker_open_ms: u64,
    /// Period of the active health probe (`server/discover`). 0 = no probe.
    #[serde(default)]
    pub health_interval_ms: u64,
    /// stdio only: `"per_client"` (default; a child per authorization context or legacy-client
    /// session of an initialize-era server) or `"shared"` (one child; stateless servers only).
    pub isolation: Option<Isolation>,
    /// Upstream sessions open at once for clients of an initialize-era backend (HTTP sessions,
    /// or stdio children under `per_client`); beyond it the least recently used is closed.
    #[serde(default = "default_max_upstream_sessions")]
    pub max_upstream_sessions: usize,
    /// Of `max_upstream_sessions`, how many one 2026-07-28 client's authorization context may
    /// hold (its key includes the capabilities it declares, which it may vary); beyond it the
    /// context's own least recently used is closed, never another client's.
    #[serde(default = "default_max_upstream_sessions_per_context")]
    pub max_upstream_sessions_per_context: usize,
    /// Of `max_upstream_sessions`, how many the initialize-era client sessions of one
    /// authenticated principal may hold (each `initialize` is a session of its own, so a
    /// principal may open any number); beyond it the principal's own least recently used is
    /// closed, never another principal's. Anonymous clients cannot be told apart: the cap alone.
    #[serde(default = "default_max_upstream_sessions_per_principal")]
    pub max_upstream_sessions_per_principal: usize,
    /// An upstream session (or per-client stdio child) unused this long is closed.
    #[serde(default = "default_upstream_idle_ms")]
    pub upstream_idle_ms: u64,
    /// Initialize-era backends: how long a call whose server asked the client something
    /// (`elicitation/create`, `sampling/createMessage`, `roots/list`) waits for the answer —
    /// parked for a 2026-07-28 client's retry, or relayed to an initialize-era client — before
    /// the server's request is answered with an error. Also bounded by `timeout_ms`.
    #[serde(default = "default_input_hold_ms")]
    pub input_hold_ms: u64,
    /// RFC 8693 token exchange: each caller's verified JWT is exchanged at the IdP for a token
    /// for this backend, sent upstream as its `Authorization` (README "Security model").
    pub token_exchange: Option<TokenExchangeConfig>,
}

/// `[backends.token_exchange]`: per-user identity upstream. The caller's own JWT (the
/// subject token, `[auth] mode = "jwt"`) is exchanged at `token_url` for a token meant for
/// this backend (`audience`/`resource`/`scope`), cached per caller token until shortly
/// before it expires. The client's token itself never reaches the backend.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenExchangeConfig {
    /// The IdP's token endpoint (`http://` or `https://`).
    pub token_url: String,
    /// portico's client id at the IdP (HTTP Basic with the secret; absent = no client auth).
    pub client_id: Option<String>,
    /// The client secret, from an environment variable ...
    pub client_secret_env: Option<String>,
    /// ... or a file (trailing newline trimmed).
    pub client_secret_file: Option<std::path::PathBuf>,
    /// RFC 8693 `audience` of the token asked for.
    pub audience: Option<String>,
    /// RFC 8693 `resource` (RFC 8707) of the token asked for.
    pub resource: Option<String>,
    /// RFC 8693 `scope`, space-separated.
    pub scope: Option<String>,
    /// Extra PEM CA certificates for an `https://` token_url (besides webpki roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// The IdP must answer within this.
    #[serde(default = "default_token_exchange_timeout_ms")]
    pub timeout_ms: u64,
    /// Exchanged tokens kept at most this long (also `expires_in` less a minute's margin).
    #[serde(default = "default_token_exchange_max_ttl_ms")]
    pub max_ttl_ms: u64,
}

/// How long the IdP has to answer a token exchange.
pub const DEFAULT_TOKEN_EXCHANGE_TIMEOUT_MS: u64 = 5_000;
/// Longest an exchanged token is reused (and the TTL of one whose `expires_in` is absent).
pub const DEFAULT_TOKEN_EXCHANGE_MAX_TTL_MS: u64 = 300_000;

fn default_token_exchange_timeout_ms() -> u64 {
    DEFAULT_TOKEN_EXCHANGE_TIMEOUT_MS
}

fn default_token_exchange_max_ttl_ms() -> u64 {
    DEFAULT_TOKEN_EXCHANGE_MAX_TTL_MS
}

impl BackendConfig {
    /// The stdio isolation in effect (`per_client` unless configured `shared`).
    pub fn isolation(&self) -> Isolation {
        self.isolation.unwrap_or_default()
    }
}

impl BackendConfig {
    /// The bound on a whole streamed call: `max_call_ms`, or [`DEFAULT_MAX_CALL_MS`], never
    /// below `timeout_ms`.
    pub fn max_call(&self) -> std::time::Duration {
        let ms = self.max_call_ms.unwrap_or(DEFAULT_MAX_CALL_MS);
        std::time::Duration::from_millis(ms.max(self.timeout_ms))
    }
}

/// `[auth]`: who may call portico (docs/protocol.md §4, Auth).
#[derive(Debug, Clone, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub mode: AuthMode,
    /// Allow `mode = "none"` on a non-loopback listener.
    #[serde(default)]
    pub allow_insecure_none: bool,
    /// The base URL clients use to reach portico (`https://gw.example`); names the protected
    /// resource in metadata and in `WWW-Authenticate`. Default: from the request's `Host`.
    pub public_url: Option<String>,
    /// OAuth authorization servers listed in the Protected Resource Metadata.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Scopes listed in the Protected Resource Metadata.
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    pub jwt: Option<JwtConfig>,
    /// Default per-principal rate limit (a team's own overrides it).
    pub rate_limit: Option<RateLimitConfig>,
    #[serde(default)]
    pub teams: Vec<TeamConfig>,
    /// Per-tool rate limits, each principal a bucket of its own per rule.
    #[serde(default)]
    pub tool_limits: Vec<ToolLimitConfig>,
}

/// `[[auth.tool_limits]]`: a rate for calls of some tools, on top of the principal's
/// `rate_limit` — for the expensive or dangerous ones.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolLimitConfig {
    /// Globs (`*`, `?`) over the tool names a client sees (prefixed on an aggregated endpoint).
    pub tools: Vec<String>,
    /// Each principal's bucket for its calls of these tools (anonymous callers share one).
    pub rate_limit: RateLimitConfig,
    /// Only these teams' principals are limited (empty = every caller).
    #[serde(default)]
    pub teams: Vec<String>,
}

#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    #[default]
    None,
    ApiKeys,
    Jwt,
}

/// `[[auth.api_keys]]`: one static bearer key. The key itself never sits in the file.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Environment variable holding the key.
    pub key_env: Option<String>,
    /// File holding the key (surrounding whitespace trimmed).
    pub key_file: Option<PathBuf>,
    pub principal: String,
    pub team: Option<String>,
    /// Filled in by `validate` from `key_env` / `key_file`.
    #[serde(skip)]
    pub key: String,
}

/// `[auth.jwt]`: bearer JWTs signed with HS256, RS256 or ES256.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// A JWKS (`{"keys":[…]}`) file.
    pub jwks_file: Option<PathBuf>,
    /// A JWKS URL (`http://` or `https://`), fetched at start and every `jwks_refresh_ms`.
    pub jwks_url: Option<String>,
    /// Extra PEM CA certificates trusted for an `https://` `jwks_url` (besides webpki roots).
    pub ca_file: Option<PathBuf>,
    #[serde(default = "default_jwks_refresh_ms")]
    pub jwks_refresh_ms: u64,
    /// Required `iss`.
    pub issuer: Option<String>,
    /// Required `aud` (one of the token's audiences).
    pub audience: Option<String>,
    /// Claim naming the caller's team.
    #[serde(default = "default_team_claim")]
    pub team_claim: String,
    /// Team of a token that carries no `team_claim`. Without it such a token is refused (403)
    /// when `[[auth.teams]]` are configured, so a missing claim never escapes a team's policy.
    pub default_team: Option<String>,
    /// Clock skew tolerated on `exp` / `nbf`, in seconds.
    #[serde(default = "default_jwt_leeway_s")]
    pub leeway_s: u64,
}

/// A token bucket: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub per_second: f64,
    pub burst: u32,
}

/// `[[auth.teams]]`: what a team's principals may do.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    pub name: String,
    /// Tool allow/deny globs over the tool names a client sees; lists are filtered, calls refused.
    #[serde(default)]
    pub tools: ToolFilter,
    pub rate_limit: Option<RateLimitConfig>,
}

/// `[[endpoints]]`: several backends served as one MCP server.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub path: String,
    pub backends: Vec<EndpointBackend>,
    #[serde(default = "default_separator")]
    pub separator: String,
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Window in which repeated `list_changed` notifications are folded into one.
    #[serde(default = "default_debounce_ms")]
    pub debounce_ms: u64,
}

/// A member of an endpoint: a backend name, or a table with options.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum EndpointBackend {
    Name(String),
    Detailed(EndpointBackendDetail),
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointBackendDetail {
    pub name: String,
    /// Name prefix for this backend's tools and prompts; default: the backend name. `""` = bare.
    pub prefix: Option<String>,
    #[serde(default)]
    pub tools: ToolFilter,
}

/// Glob allow/deny lists over tool names (`*` and `?`).
#[derive(Debug, Clone, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

impl EndpointBackend {
    pub fn name(&self) -> &str {
        match self {
            EndpointBackend::Name(n) => n,
            EndpointBackend::Detailed(d) => &d.name,
        }
    }
}

#[derive(
    Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Leave a failing backend out of merged lists.
    #[default]
    Open,
    /// Fail the whole list when any backend fails.
    Closed,
}

// serde's `default = "…"` takes a function's name, so each default the structs use gets a
// one-line accessor here; the values themselves are the `DEFAULT_*` constants above.
macro_rules! default_fns {
    ($($name:ident: $ty:ty = $value:expr;)*) => {
        $(fn $name() -> $ty {
            $value
        })*
    };
}

default_fns! {
    default_listen: String = DEFAULT_LISTEN.to_string();
    default_max_body_bytes: usize = DEFAULT_MAX_BODY_BYTES;
    default_timeout_ms: u64 = DEFAULT_TIMEOUT_MS;
    default_drain_timeout_ms: u64 = DEFAULT_DRAIN_TIMEOUT_MS;
    default_header_read_timeout_ms: u64 = DEFAULT_HEADER_READ_TIMEOUT_MS;
    default_body_read_timeout_ms: u64 = DEFAULT_BODY_READ_TIMEOUT_MS;
    default_body_min_bytes_per_s: u64 = DEFAULT_BODY_MIN_BYTES_PER_S;
    default_sse_keepalive_ms: u64 = DEFAULT_SSE_KEEPALIVE_MS;
    default_max_header_bytes: usize = DEFAULT_MAX_HEADER_BYTES;
    default_true: bool = true;
    default_level: String = DEFAULT_LOG_LEVEL.to_string();
    default_session_ttl_ms: u64 = DEFAULT_SESSION_TTL_MS;
    default_resume_ms: u64 = DEFAULT_RESUME_MS;
    default_cache_max_ttl_ms: u64 = DEFAULT_CACHE_MAX_TTL_MS;
    default_cache_max_bytes: u64 = DEFAULT_CACHE_MAX_BYTES;
    default_stale_if_error_ms: u64 = DEFAULT_STALE_IF_ERROR_MS;
    default_redis_timeout_ms: u64 = DEFAULT_REDIS_TIMEOUT_MS;
    default_redis_prefix: String = DEFAULT_REDIS_PREFIX.to_string();
    default_separator: String = DEFAULT_SEPARATOR.to_string();
    default_probe_timeout_ms: u64 = DEFAULT_PROBE_TIMEOUT_MS;
    default_max_line_bytes: usize = DEFAULT_MAX_LINE_BYTES;
    default_max_answer_bytes: usize = DEFAULT_MAX_ANSWER_BYTES;
    default_debounce_ms: u64 = DEFAULT_DEBOUNCE_MS;
    default_max_idle_connections: usize = DEFAULT_MAX_IDLE_CONNECTIONS;
    default_max_upstream_sessions: usize = DEFAULT_MAX_UPSTREAM_SESSIONS;
    default_max_sse_sessions: usize = DEFAULT_MAX_SSE_SESSIONS;
    default_max_sse_sessions_per_principal: usize = DEFAULT_MAX_SSE_SESSIONS_PER_PRINCIPAL;
    default_max_upstream_sessions_per_context: usize = DEFAULT_MAX_UPSTREAM_SESSIONS_PER_CONTEXT;
    default_max_upstream_sessions_per_principal: usize = DEFAULT_MAX_UPSTREAM_SESSIONS_PER_PRINCIPAL;
    default_upstream_idle_ms: u64 = DEFAULT_UPSTREAM_IDLE_MS;
    default_input_hold_ms: u64 = DEFAULT_INPUT_HOLD_MS;
    default_sampling_ratio: f64 = DEFAULT_SAMPLING_RATIO;
    default_service_name: String = DEFAULT_SERVICE_NAME.to_string();
    default_metrics_listen: String = DEFAULT_METRICS_LISTEN.to_string();
    default_ready_min_backends: usize = DEFAULT_READY_MIN_BACKENDS;
    default_health_interval_ms: u64 = DEFAULT_HEALTH_INTERVAL_MS;
    default_health_timeout_ms: u64 = DEFAULT_HEALTH_TIMEOUT_MS;
    default_jwks_refresh_ms: u64 = DEFAULT_JWKS_REFRESH_MS;
    default_team_claim: String = DEFAULT_TEAM_CLAIM.to_string();
    default_jwt_leeway_s: u64 = DEFAULT_JWT_LEEWAY_S;
    default_retries: u32 = DEFAULT_RETRIES;
    default_breaker_failures: u32 = DEFAULT_BREAKER_FAILURES;
    default_breaker_open_ms: u64 = DEFAULT_BREAKER_OPEN_MS;
}

/// The built-in servers `builtin = "…"` may name.
pub const BUILTINS: &[&str] = &["demo"];

/// load → parse → validate.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let config = parse(&text)?;
    validate(config)
}

/// TOML text → structs. Unknown keys are errors (serde names the key and the line).
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string().trim_end().to_string()))
}

mod validate;
pub use validate::{expand_env, validate};

#[cfg(test)]
mod tests;
