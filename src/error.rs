//! `GatewayError`: every way a request can fail, and the HTTP status and JSON-RPC error the
//! client gets. Only this module decides statuses, codes and error bodies, so the table lives in
//! one place (README "Errors"). A leaf: it knows JSON-RPC (`jsonrpc`) and nothing else of
//! portico's; `upstream` turns its own failures into these (`GatewayError::from_upstream`) and
//! `body` wraps [`GatewayError::into_http`] into the response type.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::jsonrpc::{RequestId, code, error_body};

/// Errors a body can end with; hyper only needs to know the stream broke.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("method not allowed: MCP endpoints accept POST")]
    MethodNotAllowed,
    #[error("Not Acceptable: Accept must admit both application/json and text/event-stream")]
    NotAcceptable,
    #[error("Unsupported Media Type: Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("request body not received in time (server.body_read_timeout_ms)")]
    BodyTimeout,
    #[error("Forbidden: origin not allowed")]
    OriginForbidden,
    #[error("no MCP endpoint at {path}")]
    NoRoute { path: String },
    #[error("Parse error: {0}")]
    Parse(String),
    #[error(
        "Invalid Request: batches are served only in a 2025-03-26 session; send one JSON-RPC message per POST"
    )]
    Batch,
    #[error("Invalid Request: {0}")]
    InvalidRequest(String),
    #[error("Header mismatch: {0}")]
    HeaderMismatch(String),
    /// What a server's request needs of the client and the client did not declare (its
    /// `initialize` capabilities): `-32021` with `data.requiredCapabilities`, as a 2026-07-28
    /// server answers a client that lacks one (docs/protocol.md's table of statuses).
    #[error(
        "Missing required client capability: the server needs input through {method}, but this client did not declare the `{capability}` capability at initialize"
    )]
    MissingCapability {
        method: String,
        capability: &'static str,
    },
    #[error("Invalid params: {0}")]
    InvalidParams(String),
    /// `supported` is what the URL's `server/discover` advertises (the two must agree).
    #[error("Unsupported protocol version: {requested}")]
    UnsupportedVersion {
        requested: String,
        supported: &'static [&'static str],
    },
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    #[error("Bad Request: {0}")]
    BadRequest(String),
    #[error("Session not found")]
    SessionNotFound,
    #[error("backend {backend} is unreachable")]
    BackendUnreachable { backend: String },
    #[error("backend {backend} did not answer within {timeout_ms} ms")]
    BackendTimeout { backend: String, timeout_ms: u64 },
    #[error("backend {backend} failed: {detail}")]
    BackendFailed { backend: String, detail: String },
    #[error("backend {backend} is overloaded")]
    Overloaded { backend: String },
    /// `[server] max_sse_sessions` HTTP+SSE client sessions are open on this replica.
    #[error("too many HTTP+SSE sessions are open ({limit}, server.max_sse_sessions); retry later")]
    TooManySseSessions { limit: usize },
    /// The caller's principal holds `[server] max_sse_sessions_per_principal` of them.
    #[error(
        "your principal has too many HTTP+SSE sessions open ({limit}, server.max_sse_sessions_per_principal); close one first"
    )]
    PrincipalSseSessions { limit: usize },
    #[error("Unauthorized: {reason}")]
    Unauthorized {
        reason: String,
        /// A credential was presented (and refused): `error="invalid_token"` (RFC 6750).
        token_given: bool,
        /// The Protected Resource Metadata URL for `WWW-Authenticate`.
        resource_metadata: String,
        /// The challenge's `scope`: `[auth] scopes_supported`, space-separated (empty = left
        /// out; docs/protocol.md's table of statuses shows both on a 401).
        scope: String,
    },
    #[error("Forbidden: {0}")]
    Forbidden(String),
    #[error("rate limit exceeded; retry after {retry_after_s} s")]
    RateLimited { retry_after_s: u64 },
    /// An `[[auth.tool_limits]]` bucket of the caller's is empty.
    #[error("rate limit for tool {tool:?} exceeded; retry after {retry_after_s} s")]
    ToolRateLimited { tool: String, retry_after_s: u64 },
    /// `[backends.token_exchange]`: the identity provider refused to exchange the caller's
    /// token for one for `backend` (403: the caller's affair), or could not (502).
    #[error("token exchange for backend {backend}: {detail}")]
    TokenExchange {
        backend: String,
        detail: String,
        refused: bool,
    },
    #[error("backend {backend} is failing; its circuit breaker is open")]
    CircuitOpen { backend: String },
    #[error("internal error")]
    Internal(String),
    /// Two members of an aggregated endpoint expose the same name: a configuration problem
    /// surfaced when the lists arrive, never resolved by silently dropping one.
    #[error(
        "name collision: {name:?} is exposed by both backend {first:?} and backend {second:?}; give one of them a prefix"
    )]
    NameCollision {
        name: String,
        first: String,
        second: String,
    },
    #[error("Resource not found: {uri}")]
    ResourceNotFound { uri: String },
    /// The client cancelled the request (`notifications/cancelled`); the answer it no longer
    /// waits for still has to close the HTTP exchange.
    #[error("Request cancelled by the client")]
    Cancelled,
    /// A response stream ran into `[server] max_stream_ms` and was ended by portico.
    #[error("response stream ended after {max_ms} ms (server.max_stream_ms); re-issue the request")]
    StreamLimit { max_ms: u64 },
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            OriginForbidden => StatusCode::FORBIDDEN,
            NoRoute { .. } | MethodNotFound(_) | SessionNotFound => StatusCode::NOT_FOUND,
            Cancelled => StatusCode::OK,
            BodyRead(_)
            | Parse(_)
            | Batch
            | InvalidRequest(_)
            | HeaderMismatch(_)
            | MissingCapability { .. }
            | InvalidParams(_)
            | UnsupportedVersion { .. }
            | ResourceNotFound { .. }
            | BadRequest(_) => StatusCode::BAD_REQUEST,
            BackendUnreachable { .. } | BackendFailed { .. } => StatusCode::BAD_GATEWAY,
            BackendTimeout { .. } | StreamLimit { .. } => StatusCode::GATEWAY_TIMEOUT,
            Overloaded { .. } | CircuitOpen { .. } | TooManySseSessions { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Forbidden(_) => StatusCode::FORBIDDEN,
            TokenExchange { refused: true, .. } => StatusCode::FORBIDDEN,
            TokenExchange { .. } => StatusCode::BAD_GATEWAY,
            RateLimited { .. } | ToolRateLimited { .. } | PrincipalSseSessions { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Internal(_) | NameCollision { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> i64 {
        use GatewayError::*;
        match self {
            Parse(_) => code::PARSE_ERROR,
            HeaderMismatch(_) => code::HEADER_MISMATCH,
            MissingCapability { .. } => code::MISSING_CAPABILITY,
            InvalidParams(_) | ResourceNotFound { .. } => code::INVALID_PARAMS,
            UnsupportedVersion { .. } => code::UNSUPPORTED_VERSION,
            MethodNotFound(_) => code::METHOD_NOT_FOUND,
            MethodNotAllowed
            | NotAcceptable
            | UnsupportedMediaType
            | BodyTooLarge { .. }
            | BodyRead(_)
            | BodyTimeout
            | Batch
            | InvalidRequest(_)
            | NoRoute { .. }
            | OriginForbidden
            | Unauthorized { .. }
            | Forbidden(_)
            | TokenExchange { refused: true, .. }
            | RateLimited { .. }
            | ToolRateLimited { .. }
            | PrincipalSseSessions { .. } => code::INVALID_REQUEST,
            // What the TypeScript SDK sends; legacy clients re-initialize on the 404 itself.
            SessionNotFound => code::SESSION_NOT_FOUND,
            Cancelled => code::REQUEST_CANCELLED,
            BadRequest(_) => code::SERVER_ERROR,
            BackendUnreachable { .. }
            | BackendTimeout { .. }
            | BackendFailed { .. }
            | TokenExchange { .. }
            | Overloaded { .. }
            | TooManySseSessions { .. }
            | CircuitOpen { .. }
            | Internal(_)
            | NameCollision { .. }
            | StreamLimit { .. } => code::INTERNAL_ERROR,
        }
    }

    /// A short, fixed label for metrics and logs (never client input).
    pub fn reason(&self) -> &'static str {
        use GatewayError::*;
        match self {
            MethodNotAllowed => "method_not_allowed",
            NotAcceptable => "not_acceptable",
            UnsupportedMediaType => "unsupported_media_type",
            BodyTooLarge { .. } => "body_too_large",
            BodyRead(_) => "body_read",
            BodyTimeout => "body_timeout",
            OriginForbidden => "origin_forbidden",
            NoRoute { .. } => "no_route",
            Parse(_) => "parse_error",
            Batch => "batch",
            InvalidRequest(_) => "invalid_request",
            HeaderMismatch(_) => "header_mismatch",
            MissingCapability { .. } => "missing_capability",
            InvalidParams(_) => "invalid_params",
            UnsupportedVersion { .. } => "unsupported_version",
            MethodNotFound(_) => "method_not_found",
            BadRequest(_) => "bad_request",
            SessionNotFound => "session_not_found",
            BackendUnreachable { .. } => "backend_unreachable",
            BackendTimeout { .. } => "backend_timeout",
            BackendFailed { .. } => "backend_failed",
            Overloaded { .. } => "overloaded",
            TooManySseSessions { .. } => "too_many_sse_sessions",
            PrincipalSseSessions { .. } => "principal_sse_sessions",
            Unauthorized { .. } => "unauthorized",
            Forbidden(_) => "forbidden",
            TokenExchange { refused: true, .. } => "token_exchange_refused",
            TokenExchange { .. } => "token_exchange_failed",
            RateLimited { .. } => "rate_limited",
            ToolRateLimited { .. } => "tool_rate_limited",
            CircuitOpen { .. } => "circuit_open",
            Internal(_) => "internal",
            NameCollision { .. } => "name_collision",
            ResourceNotFound { .. } => "resource_not_found",
            StreamLimit { .. } => "stream_limit",
            Cancelled => "cancelled",
        }
    }

    fn data(&self) -> Option<serde_json::Value> {
        match self {
            GatewayError::UnsupportedVersion {
                requested,
                supported,
            } => Some(serde_json::json!({
                "supported": supported,
                "requested": requested,
            })),
            GatewayError::ResourceNotFound { uri } => Some(serde_json::json!({ "uri": uri })),
            GatewayError::MissingCapability { capability, .. } => Some(serde_json::json!({
                "requiredCapabilities": { *capability: {} },
            })),
            _ => None,
        }
    }

    /// The JSON-RPC error message object (for SSE streams and bridged answers).
    pub fn to_message(&self, id: Option<&RequestId>) -> Vec<u8> {
        error_body(id, self.code(), &self.to_string(), self.data().as_ref())
    }

    /// The full HTTP response (`body::Body` wraps it: `GatewayError::into_response`). The only
    /// place error responses are built.
    pub fn into_http(self, id: Option<&RequestId>) -> Response<Bytes> {
        let body = self.to_message(id);
        let mut resp = Response::new(Bytes::from(body));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match &self {
            GatewayError::MethodNotAllowed => {
                h.insert(header::ALLOW, HeaderValue::from_static("POST"));
            }
            GatewayError::Unauthorized {
                token_given,
                resource_metadata,
                scope,
                ..
            } => {
                let error = if *token_given {
                    ", error=\"invalid_token\""
                } else {
                    ""
                };
                let mut v = format!("Bearer resource_metadata=\"{resource_metadata}\"");
                if !scope.is_empty() {
                    v.push_str(&format!(", scope=\"{scope}\""));
                }
                v.push_str(error);
                if let Ok(v) = HeaderValue::from_str(&v) {
                    h.insert(header::WWW_AUTHENTICATE, v);
                }
            }
            GatewayError::RateLimited { retry_after_s }
            | GatewayError::ToolRateLimited { retry_after_s, .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
            }
            GatewayError::CircuitOpen { .. }
            | GatewayError::Overloaded { .. }
            | GatewayError::TooManySseSessions { .. }
            | GatewayError::PrincipalSseSessions { .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}
