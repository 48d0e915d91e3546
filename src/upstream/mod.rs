//! Upstreams: how portico reaches a backend. Transports are an enum, so every difference between
//! them shows up in a `match` here rather than behind a trait object.
//!
//! Two ways to use an upstream:
//! - pass-through (`Upstream::Http` only): the client's bytes go up and the backend's bytes come
//!   back untouched (`http::HttpUpstream::exchange` + `relay`);
//! - the message path (`Upstream::call`): one JSON-RPC request goes up and a `Reply` of decoded
//!   JSON-RPC messages comes back, for everything that must look at or change messages
//!   (bridging, caching, aggregation, stdio, the built-in demo).
//!
//! Upstreams never see the client's `http::Request`: only the message, and the client's headers
//! filtered through `frontend::forwardable`.

pub mod h1;
pub mod http;
pub mod stdio;

use ::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use std::sync::Arc;
use tokio::time::Instant;

use crate::demo::Demo;

/// Why an upstream exchange failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect (refused, DNS, TLS).
    #[error("connect failed: {0}")]
    Connect(String),
    /// The deadline passed.
    #[error("timed out")]
    Timeout,
    /// The connection, stream or child process ended before the answer did.
    #[error("closed: {0}")]
    Closed(String),
    /// The backend answered something that is not MCP.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Too many requests in flight to this backend.
    #[error("overloaded")]
    Overloaded,
    /// The request was pinned to a stdio child generation that is gone: the child restarted
    /// before the request was written, so the backend never saw it and it is safe to resend
    /// after a new handshake.
    #[error("closed: stdio server restarted; handshake needed")]
    Restarted,
}

/// Decoded JSON-RPC messages of one answer, in arrival order: notifications about the request
/// (progress, log), then the response.
pub enum MessageStream {
    /// Nothing (a notification was accepted).
    Empty,
    /// Exactly one message, known at once.
    One(Bytes),
    /// Messages arriving over time; an `Err` item ends the stream.
    Many(BoxStream<'static, Result<Bytes, UpstreamError>>),
}

/// A backend's answer on the message path.
pub struct Reply {
    /// HTTP status the backend used (or the one portico assigns for non-HTTP transports).
    pub status: StatusCode,
    /// Response headers (HTTP backends), e.g. a legacy `Mcp-Session-Id`.
    pub headers: HeaderMap,
    pub messages: MessageStream,
}

impl Reply {
    pub fn one(status: StatusCode, message: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            headers: HeaderMap::new(),
            messages: MessageStream::One(message.into()),
        }
    }
}

/// One request on the message path, already in the form the backend expects.
pub struct Outgoing<'a> {
    /// The JSON-RPC message to send.
    pub body: Bytes,
    /// The client's headers (filtered by `frontend::forwardable` before use).
    pub client_headers: &'a HeaderMap,
    /// Headers this message needs (MCP mirrors, session id), set over the forwarded ones.
    pub extra: Vec<(HeaderName, HeaderValue)>,
    pub deadline: Instant,
}

/// How a backend is reached.
pub enum Upstream {
    Http(Arc<http::HttpUpstream>),
    Stdio(Arc<stdio::StdioUpstream>),
    Builtin(Demo),
}

impl Upstream {
    /// Message path: send one message, get the decoded answer.
    pub async fn call(&self, out: Outgoing<'_>) -> Result<Reply, UpstreamError> {
        match self {
            Upstream::Http(h) => {
                let req = h.request(out.client_headers, &out.extra, out.body);
                h.call(req, out.deadline).await
            }
            Upstream::Stdio(s) => s.call(out.body, out.deadline).await,
            Upstream::Builtin(d) => Ok(d.call(&out.body)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Upstream::Http(_) => "http",
            Upstream::Stdio(_) => "stdio",
            Upstream::Builtin(_) => "builtin",
        }
    }
}
