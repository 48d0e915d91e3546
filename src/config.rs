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
pub const DEFAULT_SESSION_TTL_MS: u64 = 24 * 60 * 60 * 1000;
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
    /// refused with `-32602` (README "Scale-out").
    pub advertise_url: Option<String>,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            key: None,
            ttl_ms: DEFAULT_SESSION_TTL_MS,
            advertise_url: None,
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
    /// An upstream session (or per-client stdio child) unused this long is closed.
    #[serde(default = "default_upstream_idle_ms")]
    pub upstream_idle_ms: u64,
    /// Initialize-era backends: how long a call whose server asked the client something
    /// (`elicitation/create`, `sampling/createMessage`, `roots/list`) waits for the answer —
    /// parked for a 2026-07-28 client's retry, or relayed to an initialize-era client — before
    /// the server's request is answered with an error. Also bounded by `timeout_ms`.
    #[serde(default = "default_input_hold_ms")]
    pub input_hold_ms: u64,
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
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
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

fn default_listen() -> String {
    DEFAULT_LISTEN.to_string()
}
fn default_max_body_bytes() -> usize {
    DEFAULT_MAX_BODY_BYTES
}
fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}
fn default_drain_timeout_ms() -> u64 {
    DEFAULT_DRAIN_TIMEOUT_MS
}
fn default_header_read_timeout_ms() -> u64 {
    DEFAULT_HEADER_READ_TIMEOUT_MS
}
fn default_body_read_timeout_ms() -> u64 {
    DEFAULT_BODY_READ_TIMEOUT_MS
}
fn default_body_min_bytes_per_s() -> u64 {
    DEFAULT_BODY_MIN_BYTES_PER_S
}
fn default_sse_keepalive_ms() -> u64 {
    DEFAULT_SSE_KEEPALIVE_MS
}

fn default_max_header_bytes() -> usize {
    DEFAULT_MAX_HEADER_BYTES
}
fn default_true() -> bool {
    true
}
fn default_level() -> String {
    "info".to_string()
}
fn default_session_ttl_ms() -> u64 {
    DEFAULT_SESSION_TTL_MS
}
fn default_cache_max_ttl_ms() -> u64 {
    DEFAULT_CACHE_MAX_TTL_MS
}
fn default_cache_max_bytes() -> u64 {
    DEFAULT_CACHE_MAX_BYTES
}
fn default_stale_if_error_ms() -> u64 {
    DEFAULT_STALE_IF_ERROR_MS
}
fn default_redis_timeout_ms() -> u64 {
    DEFAULT_REDIS_TIMEOUT_MS
}
fn default_redis_prefix() -> String {
    DEFAULT_REDIS_PREFIX.to_string()
}
fn default_separator() -> String {
    DEFAULT_SEPARATOR.to_string()
}
fn default_probe_timeout_ms() -> u64 {
    DEFAULT_PROBE_TIMEOUT_MS
}
fn default_max_line_bytes() -> usize {
    DEFAULT_MAX_LINE_BYTES
}
fn default_max_answer_bytes() -> usize {
    DEFAULT_MAX_ANSWER_BYTES
}
fn default_debounce_ms() -> u64 {
    DEFAULT_DEBOUNCE_MS
}
fn default_max_idle_connections() -> usize {
    DEFAULT_MAX_IDLE_CONNECTIONS
}
fn default_max_upstream_sessions() -> usize {
    DEFAULT_MAX_UPSTREAM_SESSIONS
}
fn default_upstream_idle_ms() -> u64 {
    DEFAULT_UPSTREAM_IDLE_MS
}
fn default_input_hold_ms() -> u64 {
    DEFAULT_INPUT_HOLD_MS
}
fn default_sampling_ratio() -> f64 {
    DEFAULT_SAMPLING_RATIO
}
fn default_service_name() -> String {
    DEFAULT_SERVICE_NAME.to_string()
}
fn default_metrics_listen() -> String {
    DEFAULT_METRICS_LISTEN.to_string()
}
fn default_ready_min_backends() -> usize {
    DEFAULT_READY_MIN_BACKENDS
}
fn default_health_interval_ms() -> u64 {
    DEFAULT_HEALTH_INTERVAL_MS
}
fn default_health_timeout_ms() -> u64 {
    DEFAULT_HEALTH_TIMEOUT_MS
}
fn default_jwks_refresh_ms() -> u64 {
    DEFAULT_JWKS_REFRESH_MS
}
fn default_team_claim() -> String {
    DEFAULT_TEAM_CLAIM.to_string()
}
fn default_jwt_leeway_s() -> u64 {
    DEFAULT_JWT_LEEWAY_S
}
fn default_retries() -> u32 {
    DEFAULT_RETRIES
}
fn default_breaker_failures() -> u32 {
    DEFAULT_BREAKER_FAILURES
}
fn default_breaker_open_ms() -> u64 {
    DEFAULT_BREAKER_OPEN_MS
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

/// Cross-field rules and `${ENV}` expansion. Returns the config ready to build state from.
pub fn validate(mut config: Config) -> Result<Config, ConfigError> {
    let s = &config.server;
    s.listen
        .parse::<SocketAddr>()
        .map_err(|e| invalid("server.listen", format!("{e} (want host:port)")))?;
    if s.tls_cert.is_some() != s.tls_key.is_some() {
        return Err(invalid(
            "server.tls_cert",
            "tls_cert and tls_key must be given together",
        ));
    }
    if s.max_body_bytes == 0 {
        return Err(invalid("server.max_body_bytes", "must be greater than 0"));
    }
    if let Some(m) = &config.metrics {
        validate_metrics(m, &config.server.listen, config.backends.len())?;
    }
    if let Some(a) = &mut config.admin {
        validate_admin(a, &config.server.listen, config.metrics.as_ref())?;
    }
    if let Some(key) = &config.sessions.key {
        // An unset variable means "no key configured": a random one is generated (with a warning).
        config.sessions.key = expand_env(key).ok().filter(|k| !k.is_empty());
    }

    validate_cache(&mut config.cache)?;
    validate_tracing(&config.tracing)?;

    let mut names = HashSet::new();
    for (i, b) in config.backends.iter_mut().enumerate() {
        let key = |field: &str| format!("backends[{i}].{field}");
        if b.name.is_empty()
            || !b
                .name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        {
            return Err(invalid(
                key("name"),
                format!("{:?}: use letters, digits, '-', '_' or '.'", b.name),
            ));
        }
        if !names.insert(b.name.clone()) {
            return Err(invalid(
                key("name"),
                format!("duplicate backend name {:?}", b.name),
            ));
        }
        let kinds = [b.url.is_some(), b.builtin.is_some(), b.command.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if kinds != 1 {
            return Err(invalid(
                format!("backends[{i}]"),
                format!(
                    "backend {:?} needs exactly one of url, builtin or command",
                    b.name
                ),
            ));
        }
        if let Some(url) = &b.url {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| invalid(key("url"), format!("{url:?}: {e}")))?;
            match uri.scheme_str() {
                Some("http") | Some("https") => {}
                _ => {
                    return Err(invalid(
                        key("url"),
                        format!("{url:?}: want http:// or https://"),
                    ));
                }
            }
            if uri.host().is_none() {
                return Err(invalid(key("url"), format!("{url:?}: no host")));
            }
        }
        if let Some(builtin) = &b.builtin
            && !BUILTINS.contains(&builtin.as_str())
        {
            return Err(invalid(
                key("builtin"),
                format!(
                    "unknown builtin {builtin:?} (known: {})",
                    BUILTINS.join(", ")
                ),
            ));
        }
        if let Some(cmd) = &b.command
            && cmd.first().is_none_or(|c| c.is_empty())
        {
            return Err(invalid(key("command"), "needs a program name"));
        }
        if b.timeout_ms == 0 {
            return Err(invalid(key("timeout_ms"), "must be greater than 0"));
        }
        if let Some(max) = b.max_call_ms
            && max < b.timeout_ms
        {
            return Err(invalid(
                key("max_call_ms"),
                format!("must be at least timeout_ms ({} ms)", b.timeout_ms),
            ));
        }
        if b.max_answer_bytes == 0 {
            return Err(invalid(key("max_answer_bytes"), "must be greater than 0"));
        }
        if b.max_upstream_sessions == 0 {
            return Err(invalid(
                key("max_upstream_sessions"),
                "must be greater than 0",
            ));
        }
        if b.input_hold_ms == 0 {
            return Err(invalid(key("input_hold_ms"), "must be greater than 0"));
        }
        if b.upstream_idle_ms == 0 {
            return Err(invalid(key("upstream_idle_ms"), "must be greater than 0"));
        }
        if b.transport == Transport::Sse {
            if b.url.is_none() {
                return Err(invalid(
                    key("transport"),
                    "\"sse\" needs a url (the event stream to GET)",
                ));
            }
            if b.protocol == Protocol::Modern {
                return Err(invalid(
                    key("transport"),
                    "\"sse\" is the 2024-11-05 transport: it cannot go with protocol = \"modern\"",
                ));
            }
            b.protocol = Protocol::Legacy;
        }
        if b.isolation.is_some() && b.command.is_none() {
            return Err(invalid(
                key("isolation"),
                "only stdio backends (command) have an isolation; HTTP sessions are always per client",
            ));
        }
        for (name, value) in b.headers.iter_mut() {
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(key(&format!("headers.{name}")), "not a valid header name"))?;
            *value = expand_env(value).map_err(|var| {
                invalid(
                    key(&format!("headers.{name}")),
                    format!("environment variable {var} is not set"),
                )
            })?;
            http::HeaderValue::from_str(value).map_err(|_| {
                invalid(key(&format!("headers.{name}")), "not a valid header value")
            })?;
        }
        for (team, headers) in b.team_headers.iter_mut() {
            for (name, value) in headers.iter_mut() {
                let k = key(&format!("team_headers.{team}.{name}"));
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid(&k, "not a valid header name"))?;
                *value = expand_env(value)
                    .map_err(|var| invalid(&k, format!("environment variable {var} is not set")))?;
                http::HeaderValue::from_str(value)
                    .map_err(|_| invalid(&k, "not a valid header value"))?;
            }
        }
        for (name, value) in b.env.iter_mut() {
            *value = expand_env(value).map_err(|var| {
                invalid(
                    key(&format!("env.{name}")),
                    format!("environment variable {var} is not set"),
                )
            })?;
        }
    }

    validate_auth(&mut config.auth, &config.server.listen)?;

    let mut paths = HashSet::new();
    for (i, e) in config.endpoints.iter().enumerate() {
        let key = |field: &str| format!("endpoints[{i}].{field}");
        if !e.path.starts_with('/') || e.path.len() < 2 || e.path.ends_with('/') {
            return Err(invalid(
                key("path"),
                format!("{:?}: want a path like /mcp", e.path),
            ));
        }
        if e.path.starts_with("/mcp/") && names.contains(&e.path["/mcp/".len()..]) {
            return Err(invalid(
                key("path"),
                format!(
                    "{:?} is already the path of backend {:?}",
                    e.path,
                    &e.path[5..]
                ),
            ));
        }
        if e.path.starts_with("/admin") || e.path.starts_with("/.well-known") {
            return Err(invalid(key("path"), format!("{:?} is reserved", e.path)));
        }
        if !paths.insert(e.path.clone()) {
            return Err(invalid(
                key("path"),
                format!("duplicate endpoint path {:?}", e.path),
            ));
        }
        if e.backends.is_empty() {
            return Err(invalid(key("backends"), "needs at least one backend"));
        }
        if e.separator.is_empty() {
            return Err(invalid(key("separator"), "must not be empty"));
        }
        let mut members = HashSet::new();
        let mut prefixes: Vec<(&str, &str)> = Vec::new();
        for (j, m) in e.backends.iter().enumerate() {
            if !names.contains(m.name()) {
                return Err(invalid(
                    format!("endpoints[{i}].backends[{j}]"),
                    format!("no backend named {:?}", m.name()),
                ));
            }
            if !members.insert(m.name()) {
                return Err(invalid(
                    format!("endpoints[{i}].backends[{j}]"),
                    format!("backend {:?} listed twice", m.name()),
                ));
            }
            let prefix = match m {
                EndpointBackend::Detailed(d) => d.prefix.as_deref().unwrap_or(&d.name),
                EndpointBackend::Name(n) => n,
            };
            if !prefix.is_empty() && prefix.contains(e.separator.as_str()) {
                return Err(invalid(
                    format!("endpoints[{i}].backends[{j}].prefix"),
                    format!("prefix {prefix:?} contains the separator {:?}", e.separator),
                ));
            }
            if let Some((other, _)) = prefixes.iter().find(|(_, p)| !p.is_empty() && *p == prefix) {
                return Err(invalid(
                    format!("endpoints[{i}].backends[{j}].prefix"),
                    format!(
                        "prefix {prefix:?} is used by both {other:?} and {:?}",
                        m.name()
                    ),
                ));
            }
            prefixes.push((m.name(), prefix));
            if let EndpointBackend::Detailed(d) = m {
                for (list, globs) in [("allow", &d.tools.allow), ("deny", &d.tools.deny)] {
                    if globs.iter().any(|g| g.is_empty()) {
                        return Err(invalid(
                            format!("endpoints[{i}].backends[{j}].tools.{list}"),
                            "empty pattern (use \"*\" for every tool)",
                        ));
                    }
                }
            }
        }
        // Bare names can only be compared once the lists arrive (list-time error), except when
        // two bare members both allow the same literal tool name: that collision is certain.
        let mut literals: Vec<(&str, &str)> = Vec::new();
        for (j, m) in e.backends.iter().enumerate() {
            let EndpointBackend::Detailed(d) = m else {
                continue;
            };
            if d.prefix.as_deref() != Some("") {
                continue;
            }
            for name in d.tools.allow.iter().filter(|g| !g.contains(['*', '?'])) {
                if let Some((other, _)) = literals.iter().find(|(_, n)| *n == name) {
                    return Err(invalid(
                        format!("endpoints[{i}].backends[{j}].tools.allow"),
                        format!(
                            "bare tool name {name:?} would be exposed by both {other:?} and {:?}",
                            d.name
                        ),
                    ));
                }
                literals.push((&d.name, name));
            }
        }
    }
    Ok(config)
}

fn validate_metrics(
    m: &MetricsConfig,
    server_listen: &str,
    backends: usize,
) -> Result<(), ConfigError> {
    let addr = m
        .listen
        .parse::<SocketAddr>()
        .map_err(|e| invalid("metrics.listen", format!("{e} (want host:port)")))?;
    if m.ready_min_backends > backends {
        return Err(invalid(
            "metrics.ready_min_backends",
            format!(
                "{} but only {backends} backends are configured",
                m.ready_min_backends
            ),
        ));
    }
    if m.health_interval_ms == 0 {
        return Err(invalid(
            "metrics.health_interval_ms",
            "must be greater than 0",
        ));
    }
    if m.health_timeout_ms == 0 {
        return Err(invalid(
            "metrics.health_timeout_ms",
            "must be greater than 0",
        ));
    }
    if addr.port() != 0 && server_listen.parse::<SocketAddr>().ok() == Some(addr) {
        return Err(invalid(
            "metrics.listen",
            format!("{addr} is also server.listen; give metrics its own port"),
        ));
    }
    Ok(())
}

/// `[admin]` rules: its own address, and fail closed — a non-loopback address needs a token.
fn validate_admin(
    a: &mut AdminConfig,
    server_listen: &str,
    metrics: Option<&MetricsConfig>,
) -> Result<(), ConfigError> {
    let addr = a
        .listen
        .parse::<SocketAddr>()
        .map_err(|e| invalid("admin.listen", format!("{e} (want host:port)")))?;
    a.token = match (&a.token_env, &a.token_file) {
        (None, None) => None,
        (Some(var), None) => Some(std::env::var(var).map_err(|_| {
            invalid(
                "admin.token_env",
                format!("environment variable {var} is not set"),
            )
        })?),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| invalid("admin.token_file", format!("{}: {e}", path.display())))?
                .trim()
                .to_string(),
        ),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "admin",
                "give at most one of token_env or token_file",
            ));
        }
    };
    if a.token.as_ref().is_some_and(|t| t.len() < 16) {
        return Err(invalid(
            "admin.token_env",
            "the token must be at least 16 characters",
        ));
    }
    if a.token.is_none() && !addr.ip().is_loopback() {
        return Err(invalid(
            "admin.listen",
            format!("{addr} is not a loopback address: configure token_env or token_file"),
        ));
    }
    let taken = |other: &str| other.parse::<SocketAddr>().ok() == Some(addr);
    if addr.port() != 0 && (taken(server_listen) || metrics.is_some_and(|m| taken(&m.listen))) {
        return Err(invalid(
            "admin.listen",
            format!("{addr} is taken by another listener; give admin its own port"),
        ));
    }
    Ok(())
}

/// `[tracing]` rules. Only `http://`: the exporter is built without TLS (a collector agent on
/// the host or as a sidecar is the usual place to send spans).
fn validate_tracing(t: &TracingConfig) -> Result<(), ConfigError> {
    if let Some(url) = &t.otlp_endpoint {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| invalid("tracing.otlp_endpoint", format!("{url:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(invalid(
                "tracing.otlp_endpoint",
                format!("{url:?}: want http://host:port[/path] (no TLS; use a local collector)"),
            ));
        }
    }
    if !(0.0..=1.0).contains(&t.sampling_ratio) {
        return Err(invalid(
            "tracing.sampling_ratio",
            format!("{}: want a number from 0.0 to 1.0", t.sampling_ratio),
        ));
    }
    if t.service_name.trim().is_empty() {
        return Err(invalid("tracing.service_name", "must not be empty"));
    }
    Ok(())
}

/// `[cache]` rules: the Redis tier's URL (after `${ENV}` expansion) and its knobs.
fn validate_cache(c: &mut CacheConfig) -> Result<(), ConfigError> {
    if let Some(url) = &c.redis_url {
        let url = expand_env(url).map_err(|var| {
            invalid(
                "cache.redis_url",
                format!("environment variable {var} is not set"),
            )
        })?;
        // The URL may carry a password: errors name the scheme, never the URL.
        let scheme = url.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("redis") | Some("rediss")) {
            return Err(invalid(
                "cache.redis_url",
                "want redis://host:port or rediss://host:port",
            ));
        }
        redis::Client::open(url.as_str()).map_err(|e| {
            invalid(
                "cache.redis_url",
                format!("not a usable Redis URL ({:?})", e.kind()),
            )
        })?;
        c.redis_url = Some(url);
    }
    if c.redis_timeout_ms == 0 {
        return Err(invalid("cache.redis_timeout_ms", "must be greater than 0"));
    }
    if c.redis_prefix.is_empty() || c.redis_prefix.bytes().any(|b| b.is_ascii_whitespace()) {
        return Err(invalid(
            "cache.redis_prefix",
            "must be non-empty, without whitespace",
        ));
    }
    if !c.local && c.redis_url.is_none() {
        return Err(invalid(
            "cache.local",
            "local = false needs redis_url (there would be no cache at all)",
        ));
    }
    Ok(())
}

/// `[auth]` rules: `none` only on loopback (unless forced), keys resolved, JWT key source given.
fn validate_auth(a: &mut AuthConfig, listen: &str) -> Result<(), ConfigError> {
    let loopback = listen
        .parse::<SocketAddr>()
        .is_ok_and(|s| s.ip().is_loopback());
    match a.mode {
        AuthMode::None if !loopback && !a.allow_insecure_none => {
            return Err(invalid(
                "auth.mode",
                format!(
                    "\"none\" lets anyone on the network call every backend, but server.listen \
                     {listen:?} is not loopback: choose \"api_keys\" or \"jwt\", or set \
                     auth.allow_insecure_none = true"
                ),
            ));
        }
        AuthMode::ApiKeys if a.api_keys.is_empty() => {
            return Err(invalid(
                "auth.api_keys",
                "mode \"api_keys\" needs at least one key",
            ));
        }
        AuthMode::Jwt => {
            let Some(j) = &a.jwt else {
                return Err(invalid(
                    "auth.jwt",
                    "mode \"jwt\" needs an [auth.jwt] table",
                ));
            };
            if j.jwks_file.is_none() == j.jwks_url.is_none() {
                return Err(invalid(
                    "auth.jwt.jwks_file",
                    "give exactly one of jwks_file or jwks_url",
                ));
            }
            if let Some(u) = &j.jwks_url
                && !u.starts_with("http://")
                && !u.starts_with("https://")
            {
                return Err(invalid(
                    "auth.jwt.jwks_url",
                    format!("{u:?}: want http:// or https://"),
                ));
            }
        }
        _ => {}
    }
    if let Some(u) = &a.public_url {
        let uri: http::Uri = u
            .parse()
            .map_err(|e| invalid("auth.public_url", format!("{u:?}: {e}")))?;
        if uri.host().is_none() || uri.scheme().is_none() {
            return Err(invalid(
                "auth.public_url",
                format!("{u:?}: want scheme://host"),
            ));
        }
        a.public_url = Some(u.trim_end_matches('/').to_string());
    }
    let mut keys = HashSet::new();
    for (i, k) in a.api_keys.iter_mut().enumerate() {
        let key = |f: &str| format!("auth.api_keys[{i}].{f}");
        k.key = match (&k.key_env, &k.key_file) {
            (Some(var), None) => std::env::var(var).map_err(|_| {
                invalid(
                    key("key_env"),
                    format!("environment variable {var} is not set"),
                )
            })?,
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| invalid(key("key_file"), format!("{}: {e}", path.display())))?
                .trim()
                .to_string(),
            _ => {
                return Err(invalid(
                    format!("auth.api_keys[{i}]"),
                    "give exactly one of key_env or key_file",
                ));
            }
        };
        if k.key.len() < 16 {
            return Err(invalid(
                key("key_env"),
                "the key must be at least 16 characters",
            ));
        }
        if !keys.insert(k.key.clone()) {
            return Err(invalid(
                format!("auth.api_keys[{i}]"),
                "the same key is configured twice",
            ));
        }
        if k.principal.is_empty() {
            return Err(invalid(key("principal"), "must not be empty"));
        }
    }
    let mut teams = HashSet::new();
    for (i, t) in a.teams.iter().enumerate() {
        if !teams.insert(t.name.as_str()) {
            return Err(invalid(
                format!("auth.teams[{i}].name"),
                format!("duplicate team {:?}", t.name),
            ));
        }
    }
    if let Some(t) = a.jwt.as_ref().and_then(|j| j.default_team.as_deref()) {
        if t.is_empty() {
            return Err(invalid("auth.jwt.default_team", "must not be empty"));
        }
        if !teams.is_empty() && !teams.contains(t) {
            return Err(invalid(
                "auth.jwt.default_team",
                format!("{t:?} is not a configured [[auth.teams]] name"),
            ));
        }
    }
    for (k, r) in a
        .rate_limit
        .iter()
        .map(|r| ("auth.rate_limit".to_string(), r))
        .chain(a.teams.iter().enumerate().filter_map(|(i, t)| {
            t.rate_limit
                .as_ref()
                .map(|r| (format!("auth.teams[{i}].rate_limit"), r))
        }))
    {
        if !(r.per_second > 0.0 && r.per_second.is_finite()) || r.burst == 0 {
            return Err(invalid(k, "per_second and burst must be greater than 0"));
        }
    }
    Ok(())
}

/// Expands `${VAR}` references. `Err(var)` names the first unset variable.
pub fn expand_env(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let var = &after[..end];
        match std::env::var(var) {
            Ok(v) => out.push_str(&v),
            Err(_) => return Err(var.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Config, ConfigError> {
        validate(parse(text)?)
    }

    #[test]
    fn minimal_and_defaults() {
        let c = check("[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n").unwrap();
        assert_eq!(c.server.listen, DEFAULT_LISTEN);
        assert_eq!(c.backends[0].timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(c.server.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn errors_name_the_key() {
        let unknown = check("[server]\nlisten = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
        assert!(unknown.to_string().contains("listen_port"), "{unknown}");
        let dup = check(
            "[[backends]]\nname='a'\nbuiltin='demo'\n[[backends]]\nname='a'\nbuiltin='demo'\n",
        )
        .unwrap_err();
        assert!(dup.to_string().contains("backends[1].name"), "{dup}");
        let both = check("[[backends]]\nname='a'\nbuiltin='demo'\nurl='http://x/'\n").unwrap_err();
        assert!(both.to_string().contains("backends[0]"), "{both}");
        let neither = check("[[backends]]\nname='a'\n").unwrap_err();
        assert!(neither.to_string().contains("exactly one"), "{neither}");
        let env = check(
            "[[backends]]\nname='a'\nurl='http://x/'\nheaders={A='${PORTICO_SURELY_UNSET_VAR}'}\n",
        )
        .unwrap_err();
        assert!(env.to_string().contains("backends[0].headers.A"), "{env}");
        let ep = check(
            "[[backends]]\nname='a'\nbuiltin='demo'\n[[endpoints]]\npath='/mcp'\nbackends=['b']\n",
        )
        .unwrap_err();
        assert!(ep.to_string().contains("endpoints[0].backends[0]"), "{ep}");
    }

    #[test]
    fn metrics_section() {
        let none = check("[[backends]]\nname='a'\nbuiltin='demo'\n").unwrap();
        assert!(none.metrics.is_none(), "no [metrics], no listener");
        let m = check("[metrics]\n[[backends]]\nname='a'\nbuiltin='demo'\n").unwrap();
        let m = m.metrics.unwrap();
        assert_eq!(m.listen, DEFAULT_METRICS_LISTEN);
        assert_eq!(m.ready_min_backends, DEFAULT_READY_MIN_BACKENDS);
        let bad = check("[metrics]\nlisten='nope'\n").unwrap_err();
        assert!(bad.to_string().contains("metrics.listen"), "{bad}");
        let many =
            check("[metrics]\nready_min_backends=2\n[[backends]]\nname='a'\nbuiltin='demo'\n")
                .unwrap_err();
        assert!(
            many.to_string().contains("metrics.ready_min_backends"),
            "{many}"
        );
        let same = check("[server]\nlisten='127.0.0.1:9000'\n[metrics]\nlisten='127.0.0.1:9000'\nready_min_backends=0\n")
            .unwrap_err();
        assert!(same.to_string().contains("metrics.listen"), "{same}");
        let unknown = check("[metrics]\nport=3\n").unwrap_err();
        assert!(unknown.to_string().contains("port"), "{unknown}");
    }

    #[test]
    fn tracing_section() {
        let off = check("[[backends]]\nname='a'\nbuiltin='demo'\n").unwrap();
        assert!(
            off.tracing.otlp_endpoint.is_none(),
            "no endpoint, no tracing"
        );
        assert_eq!(off.tracing.sampling_ratio, DEFAULT_SAMPLING_RATIO);
        assert_eq!(off.tracing.service_name, DEFAULT_SERVICE_NAME);
        let on = check("[tracing]\notlp_endpoint='http://127.0.0.1:4318'\nsampling_ratio=0.25\n")
            .unwrap();
        assert_eq!(on.tracing.sampling_ratio, 0.25);
        for (text, key) in [
            ("[tracing]\nsampling_ratio=1.5\n", "tracing.sampling_ratio"),
            ("[tracing]\nsampling_ratio=-0.1\n", "tracing.sampling_ratio"),
            ("[tracing]\nsampling_ratio=nan\n", "tracing.sampling_ratio"),
            (
                "[tracing]\notlp_endpoint='https://c:4318'\n",
                "tracing.otlp_endpoint",
            ),
            (
                "[tracing]\notlp_endpoint='c:4318'\n",
                "tracing.otlp_endpoint",
            ),
            ("[tracing]\nservice_name=' '\n", "tracing.service_name"),
            ("[tracing]\nendpoint='http://c'\n", "endpoint"),
        ] {
            let e = check(text).unwrap_err();
            assert!(e.to_string().contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn endpoint_rules() {
        let two =
            "[[backends]]\nname='a'\nbuiltin='demo'\n[[backends]]\nname='b'\nbuiltin='demo'\n";
        let ok = check(&format!(
            "{two}[[endpoints]]\npath='/mcp'\nbackends=['a',{{name='b',prefix='',tools={{deny=['x*']}}}}]\n"
        ))
        .unwrap();
        assert_eq!(ok.endpoints[0].separator, DEFAULT_SEPARATOR);
        assert_eq!(ok.endpoints[0].failure_mode, FailureMode::Open);
        let clash = check(&format!(
            "{two}[[endpoints]]\npath='/mcp/a'\nbackends=['a','b']\n"
        ))
        .unwrap_err();
        assert!(clash.to_string().contains("endpoints[0].path"), "{clash}");
        let bare = check(&format!(
            "{two}[[endpoints]]\npath='/mcp'\nbackends=[{{name='a',prefix='',tools={{allow=['t']}}}},{{name='b',prefix='',tools={{allow=['t']}}}}]\n"
        ))
        .unwrap_err();
        let msg = bare.to_string();
        assert!(msg.contains("\"a\"") && msg.contains("\"b\""), "{msg}");
        let same_prefix = check(&format!(
            "{two}[[endpoints]]\npath='/mcp'\nbackends=['a',{{name='b',prefix='a'}}]\n"
        ))
        .unwrap_err();
        assert!(same_prefix.to_string().contains("prefix"), "{same_prefix}");
        let sep = check(&format!(
            "{two}[[endpoints]]\npath='/mcp'\nbackends=[{{name='a',prefix='x__y'}}]\n"
        ))
        .unwrap_err();
        assert!(sep.to_string().contains("separator"), "{sep}");
        let empty_glob = check(&format!(
            "{two}[[endpoints]]\npath='/mcp'\nbackends=[{{name='a',tools={{deny=['']}}}}]\n"
        ))
        .unwrap_err();
        assert!(
            empty_glob.to_string().contains("tools.deny"),
            "{empty_glob}"
        );
    }

    #[test]
    fn cache_redis_keys() {
        let c = check("[cache]\nredis_url = 'rediss://:pw@redis.example:6380/2'\n").unwrap();
        assert_eq!(c.cache.redis_timeout_ms, DEFAULT_REDIS_TIMEOUT_MS);
        assert_eq!(c.cache.redis_prefix, DEFAULT_REDIS_PREFIX);
        assert!(c.cache.local);
        let scheme = check("[cache]\nredis_url = 'http://:secret@x:1'\n").unwrap_err();
        assert!(scheme.to_string().contains("cache.redis_url"), "{scheme}");
        assert!(!scheme.to_string().contains("secret"), "{scheme}");
        let env =
            check("[cache]\nredis_url = 'redis://:${PORTICO_SURELY_UNSET_VAR}@x'\n").unwrap_err();
        assert!(
            env.to_string().contains("PORTICO_SURELY_UNSET_VAR"),
            "{env}"
        );
        let local = check("[cache]\nlocal = false\n").unwrap_err();
        assert!(local.to_string().contains("cache.local"), "{local}");
        let timeout =
            check("[cache]\nredis_url = 'redis://x'\nredis_timeout_ms = 0\n").unwrap_err();
        assert!(
            timeout.to_string().contains("cache.redis_timeout_ms"),
            "{timeout}"
        );
    }

    #[test]
    fn env_expansion() {
        // SAFETY of the test: PATH is always set in a test environment.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand_env("a${PATH}b").unwrap(), format!("a{path}b"));
        assert_eq!(expand_env("no vars").unwrap(), "no vars");
        assert_eq!(
            expand_env("${PORTICO_SURELY_UNSET_VAR}").unwrap_err(),
            "PORTICO_SURELY_UNSET_VAR"
        );
    }
}
