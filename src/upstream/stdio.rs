//! stdio upstreams: one child process per backend, newline-delimited JSON-RPC.

use bytes::Bytes;
use tokio::time::Instant;

use super::{Reply, UpstreamError};
use crate::config::BackendConfig;

pub struct StdioUpstream {
    pub name: String,
}

impl StdioUpstream {
    pub fn new(cfg: &BackendConfig, _command: Vec<String>) -> StdioUpstream {
        StdioUpstream {
            name: cfg.name.clone(),
        }
    }

    pub async fn call(&self, _body: Bytes, _deadline: Instant) -> Result<Reply, UpstreamError> {
        Err(UpstreamError::Closed(
            "stdio backends are not implemented yet".into(),
        ))
    }
}
