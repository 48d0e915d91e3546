//! Who is calling, and what they may do (docs/protocol.md §4, Auth; §8 items 3, 4, 19).
//!
//! Owns: authentication of the client's `Authorization: Bearer` credential (static API keys or
//! JWTs checked against a JWKS), the Protected Resource Metadata document (RFC 9728), team
//! authorization (`allow_teams`, tool allow/deny), per-principal rate limits, and the cache
//! partition of a caller.
//! Must not: forward the client's credential anywhere (`frontend::forwardable` already drops
//! it; upstream credentials come from config only), or build error responses (it returns
//! `GatewayError`s).
//! Called by: `proxy::handle_inner` right after routing (before the body is read), and by
//! `proxy::answer` for the tool policy, which needs the parsed body.
//!
//! Invariants:
//! - A key comparison never exits early on the secret: presented keys are hashed and every
//!   configured digest is compared in constant time.
//! - A tool policy is only ever applied to a parsed, header-checked body (`can_pass_through`
//!   is false for a governed caller), so a forged `Mcp-Name` cannot steer it.

use arc_swap::ArcSwap;
use base64::Engine;
use bytes::Bytes;

use http::HeaderMap;
use ring::{digest, hmac, signature};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cache::Partition;
use crate::config::{AuthConfig, AuthMode, JwtConfig, RateLimitConfig, ToolFilter};
use crate::error::GatewayError;

/// Path of the Protected Resource Metadata document; per-resource documents append the path.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Buckets kept before idle, full ones are dropped (bounds memory under many JWT subjects).
const MAX_BUCKETS: usize = 100_000;

/// How long a JWKS fetch may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// API key `principal`, or the JWT `sub`.
    pub id: String,
    pub team: Option<String>,
}

/// A verification key from a JWKS.
enum VerifyKey {
    Hmac(hmac::Key),
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed P-256 point (`0x04 || x || y`).
    Ec(Vec<u8>),
}

pub struct Jwk {
    kid: Option<String>,
    key: VerifyKey,
}

struct Jwt {
    cfg: JwtConfig,
    keys: ArcSwap<Vec<Jwk>>,
    /// For an `https://` `jwks_url`: the same rustls setup as backends (`ca_file` honoured).
    tls: Option<tokio_rustls::TlsConnector>,
}

/// One token bucket.
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Authentication and authorization state for one config generation.
pub struct Auth {
    mode: AuthMode,
    public_url: Option<String>,
    authorization_servers: Vec<String>,
    scopes_supported: Vec<String>,
    /// SHA-256 of each configured key, with who it belongs to.
    api_keys: Vec<([u8; 32], Arc<Principal>)>,
    jwt: Option<Arc<Jwt>>,
    teams: HashMap<String, crate::config::TeamConfig>,
    default_rate: Option<RateLimitConfig>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Why a credential was refused (logged; the client sees one generic 401 text per reason).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthFailure {
    #[error("missing bearer token")]
    Missing,
    #[error("invalid token")]
    Invalid,
    #[error("token expired")]
    Expired,
    #[error("token not yet valid")]
    NotYetValid,
    #[error("bad token signature")]
    BadSignature,
    #[error("token issuer or audience not accepted")]
    WrongIssuerOrAudience,
}

impl Auth {
    /// Builds from a validated config. JWKS files are read here; a JWKS URL is fetched by the
    /// refresh task (`spawn_refresh`).
    pub fn build(cfg: &AuthConfig) -> Result<Auth, String> {
        let api_keys = cfg
            .api_keys
            .iter()
            .map(|k| {
                (
                    sha256(k.key.as_bytes()),
                    Arc::new(Principal {
                        id: k.principal.clone(),
                        team: k.team.clone(),
                    }),
                )
            })
            .collect();
        let jwt = match (&cfg.mode, &cfg.jwt) {
            (AuthMode::Jwt, Some(j)) => {
                let keys = match &j.jwks_file {
                    Some(path) => {
                        let text = std::fs::read(path)
                            .map_err(|e| format!("auth.jwt.jwks_file {}: {e}", path.display()))?;
                        parse_jwks(&text)
                            .map_err(|e| format!("auth.jwt.jwks_file {}: {e}", path.display()))?
                    }
                    None => Vec::new(),
                };
                let tls = match &j.jwks_url {
                    Some(u) if u.starts_with("https://") => Some(
                        crate::upstream::http::tls_connector(j.ca_file.as_deref(), &[b"http/1.1"])
                            .map_err(|e| format!("auth.jwt.ca_file: {e}"))?,
                    ),
                    _ => None,
                };
                Some(Arc::new(Jwt {
                    cfg: j.clone(),
                    keys: ArcSwap::from_pointee(keys),
                    tls,
                }))
            }
            _ => None,
        };
        Ok(Auth {
            mode: cfg.mode,
            public_url: cfg.public_url.clone(),
            authorization_servers: cfg.authorization_servers.clone(),
            scopes_supported: cfg.scopes_supported.clone(),
            api_keys,
            jwt,
            teams: cfg
                .teams
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect(),
            default_rate: cfg.rate_limit,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// Starts the JWKS URL refresh task, if one is configured. It holds only a weak reference
    /// and ends when this config generation is dropped.
    pub fn spawn_refresh(&self) {
        let Some(jwt) = &self.jwt else { return };
        let Some(url) = jwt.cfg.jwks_url.clone() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tls = jwt.tls.clone();
        let weak: Weak<Jwt> = Arc::downgrade(jwt);
        let every = Duration::from_millis(jwt.cfg.jwks_refresh_ms.max(1000));
        rt.spawn(async move {
            loop {
                let fetched = fetch_jwks(&url, tls.as_ref()).await;
                let Some(jwt) = weak.upgrade() else { return };
                match fetched {
                    Ok(keys) => jwt.keys.store(Arc::new(keys)),
                    // Keep the old keys: a flaky IdP must not log everybody out.
                    Err(error) => tracing::warn!(%url, %error, "JWKS refresh failed"),
                }
                drop(jwt);
                tokio::time::sleep(every).await;
            }
        });
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Step 1b of the pipeline: who is calling. `Ok(None)` only in mode `none`.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Option<Arc<Principal>>, GatewayError> {
        let result = match self.mode {
            AuthMode::None => return Ok(None),
            AuthMode::ApiKeys => bearer(headers).and_then(|t| self.check_key(t)),
            AuthMode::Jwt => bearer(headers).and_then(|t| self.check_jwt(t, unix_now())),
        };
        result.map(Some).map_err(|failure| {
            tracing::debug!(%failure, path, "authentication failed");
            GatewayError::Unauthorized {
                reason: failure.to_string(),
                token_given: failure != AuthFailure::Missing,
                resource_metadata: self.metadata_url(headers, path),
            }
        })
    }

    fn check_key(&self, token: &str) -> Result<Arc<Principal>, AuthFailure> {
        let presented = sha256(token.as_bytes());
        let mut found = None;
        // No early exit: every configured digest is compared, each in constant time.
        for (digest, principal) in &self.api_keys {
            if ring_eq(digest, &presented) {
                found = Some(principal.clone());
            }
        }
        found.ok_or(AuthFailure::Invalid)
    }

    /// Verifies a compact JWS and its claims at time `now` (seconds since the epoch).
    pub fn check_jwt(&self, token: &str, now: u64) -> Result<Arc<Principal>, AuthFailure> {
        let jwt = self.jwt.as_ref().ok_or(AuthFailure::Invalid)?;
        let mut parts = token.split('.');
        let (Some(h64), Some(c64), Some(s64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthFailure::Invalid);
        };
        let header: JwsHeader =
            serde_json::from_slice(&b64(h64)?).map_err(|_| AuthFailure::Invalid)?;
        let sig = b64(s64)?;
        let signed = &token.as_bytes()[..h64.len() + 1 + c64.len()];
        let keys = jwt.keys.load();
        let candidates = keys.iter().filter(|k| match (&header.kid, &k.kid) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        });
        let mut verified = false;
        for k in candidates {
            let ok = match (header.alg.as_str(), &k.key) {
                ("HS256", VerifyKey::Hmac(key)) => hmac::verify(key, signed, &sig).is_ok(),
                ("RS256", VerifyKey::Rsa { n, e }) => signature::RsaPublicKeyComponents { n, e }
                    .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, &sig)
                    .is_ok(),
                ("ES256", VerifyKey::Ec(point)) => {
                    signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                        .verify(signed, &sig)
                        .is_ok()
                }
                _ => false,
            };
            if ok {
                verified = true;
                break;
            }
        }
        if !verified {
            return Err(AuthFailure::BadSignature);
        }
        let claims: Value = serde_json::from_slice(&b64(c64)?).map_err(|_| AuthFailure::Invalid)?;
        let leeway = jwt.cfg.leeway_s;
        let Some(exp) = claims.get("exp").and_then(Value::as_f64) else {
            return Err(AuthFailure::Invalid);
        };
        if exp + (leeway as f64) < now as f64 {
            return Err(AuthFailure::Expired);
        }
        if let Some(nbf) = claims.get("nbf").and_then(Value::as_f64)
            && nbf > (now + leeway) as f64
        {
            return Err(AuthFailure::NotYetValid);
        }
        if let Some(iss) = &jwt.cfg.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(iss.as_str())
        {
            return Err(AuthFailure::WrongIssuerOrAudience);
        }
        if let Some(aud) = &jwt.cfg.audience {
            let ok = match claims.get("aud") {
                Some(Value::String(a)) => a == aud,
                Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(aud)),
                _ => false,
            };
            if !ok {
                return Err(AuthFailure::WrongIssuerOrAudience);
            }
        }
        let Some(sub) = claims.get("sub").and_then(Value::as_str) else {
            return Err(AuthFailure::Invalid);
        };
        let team = match claims.get(&jwt.cfg.team_claim) {
            Some(Value::String(t)) => Some(t.clone()),
            Some(Value::Array(list)) => list.iter().find_map(|t| t.as_str().map(String::from)),
            _ => None,
        };
        Ok(Arc::new(Principal {
            id: sub.to_string(),
            team,
        }))
    }

    /// `allow_teams` of a backend or endpoint: an empty list admits everyone authenticated.
    pub fn check_team(
        principal: Option<&Principal>,
        allow_teams: &[String],
        route: &str,
    ) -> Result<(), GatewayError> {
        if allow_teams.is_empty() {
            return Ok(());
        }
        match principal.and_then(|p| p.team.as_deref()) {
            Some(t) if allow_teams.iter().any(|a| a == t) => Ok(()),
            _ => Err(GatewayError::Forbidden(format!(
                "your team may not use {route}"
            ))),
        }
    }

    /// The tool policy governing a caller, if any.
    pub fn policy(&self, principal: Option<&Principal>) -> Option<&ToolFilter> {
        let team = principal?.team.as_deref()?;
        let t = self.teams.get(team)?;
        (!t.tools.is_open()).then_some(&t.tools)
    }

    /// Takes one token from the caller's bucket, or says how long to wait.
    pub fn rate_limit(&self, principal: Option<&Principal>) -> Result<(), GatewayError> {
        let team = principal.and_then(|p| p.team.as_deref());
        let Some(rate) = team
            .and_then(|t| self.teams.get(t))
            .and_then(|t| t.rate_limit)
            .or(self.default_rate)
        else {
            return Ok(());
        };
        let key = principal.map(|p| p.id.as_str()).unwrap_or("");
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.last).as_secs_f64() * rate.per_second
                    < f64::from(rate.burst)
            });
        }
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: f64::from(rate.burst),
            last: now,
        });
        let burst = f64::from(rate.burst);
        b.tokens =
            (b.tokens + now.duration_since(b.last).as_secs_f64() * rate.per_second).min(burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - b.tokens) / rate.per_second;
        Err(GatewayError::RateLimited {
            retry_after_s: wait.ceil().max(1.0) as u64,
        })
    }

    /// The base URL of the protected resource: configured, or from the request's `Host`.
    fn base_url(&self, headers: &HeaderMap) -> String {
        if let Some(u) = &self.public_url {
            return u.clone();
        }
        let host = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| h.bytes().all(|c| c.is_ascii_graphic()) && !h.contains('"'))
            .unwrap_or("localhost");
        format!("http://{host}")
    }

    /// Where the metadata of the resource at `path` lives (the `resource_metadata` parameter).
    pub fn metadata_url(&self, headers: &HeaderMap, path: &str) -> String {
        format!("{}{METADATA_PATH}{path}", self.base_url(headers))
    }

    /// The RFC 9728 document for `/.well-known/oauth-protected-resource[/<resource path>]`.
    /// `None` when the path names no resource portico serves.
    pub fn metadata(
        &self,
        headers: &HeaderMap,
        well_known_path: &str,
        exists: impl Fn(&str) -> bool,
    ) -> Option<Bytes> {
        let rest = well_known_path.strip_prefix(METADATA_PATH)?;
        if !rest.is_empty() && !exists(rest) {
            return None;
        }
        let mut doc = serde_json::json!({
            "resource": format!("{}{rest}", self.base_url(headers)),
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
        });
        if !self.scopes_supported.is_empty() {
            doc["scopes_supported"] = serde_json::json!(self.scopes_supported);
        }
        Some(Bytes::from(doc.to_string()))
    }
}

/// The cache partition of a caller: the principal when portico authenticated one, otherwise
/// the raw credential (mode `none`: whatever `Authorization` the client sent, hashed).
pub fn partition(principal: Option<&Principal>, headers: &HeaderMap) -> Partition {
    match principal {
        Some(p) => Partition::Principal(p.id.clone()),
        None => Partition::from_authorization(
            headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        ),
    }
}

#[derive(Deserialize)]
struct JwsHeader {
    alg: String,
    kid: Option<String>,
}

#[derive(Deserialize)]
struct JwksDoc {
    keys: Vec<JwkDoc>,
}

#[derive(Deserialize)]
struct JwkDoc {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    k: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// Parses a JWKS document. Keys of unknown types (or not for signatures) are skipped.
pub fn parse_jwks(text: &[u8]) -> Result<Vec<Jwk>, String> {
    let doc: JwksDoc = serde_json::from_slice(text).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut out = Vec::new();
    for k in doc.keys {
        if k.use_.as_deref().is_some_and(|u| u != "sig") {
            continue;
        }
        let dec = |f: &Option<String>| f.as_deref().and_then(|s| b64(s).ok());
        let key = match k.kty.as_str() {
            "oct" => dec(&k.k).map(|s| VerifyKey::Hmac(hmac::Key::new(hmac::HMAC_SHA256, &s))),
            "RSA" => match (dec(&k.n), dec(&k.e)) {
                (Some(n), Some(e)) => Some(VerifyKey::Rsa { n, e }),
                _ => None,
            },
            "EC" if k.crv.as_deref() == Some("P-256") => match (dec(&k.x), dec(&k.y)) {
                (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
                    let mut p = vec![4u8];
                    p.extend_from_slice(&x);
                    p.extend_from_slice(&y);
                    Some(VerifyKey::Ec(p))
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(key) = key {
            out.push(Jwk { kid: k.kid, key });
        }
    }
    Ok(out)
}

/// Fetches a JWKS over HTTP or, with `tls`, HTTPS: one HTTP/1.1 GET on a fresh connection
/// (a refresh every few minutes needs no pool), bounded in time and size.
async fn fetch_jwks(
    url: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Vec<Jwk>, String> {
    let body = tokio::time::timeout(JWKS_FETCH_TIMEOUT, get(url, tls))
        .await
        .map_err(|_| "timed out".to_string())??;
    parse_jwks(&body)
}

async fn get(url: &str, tls: Option<&tokio_rustls::TlsConnector>) -> Result<Bytes, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let host = uri.host().ok_or("no host")?.to_string();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            uri.authority().map_or(host.as_str(), |a| a.as_str()),
        )
        .header(http::header::ACCEPT, "application/json")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    // `[::1]` → `::1` for the socket address and the TLS name.
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    match (https, tls) {
        (true, Some(tls)) => {
            let name = rustls_pki_types::ServerName::try_from(bare).map_err(|e| e.to_string())?;
            let stream = tls.connect(name, tcp).await.map_err(|e| e.to_string())?;
            send_get(hyper_util::rt::TokioIo::new(stream), req).await
        }
        (true, None) => Err("https:// without a TLS setup".into()),
        (false, _) => send_get(hyper_util::rt::TokioIo::new(tcp), req).await,
    }
}

async fn send_get<IO>(
    io: IO,
    req: http::Request<http_body_util::Empty<Bytes>>,
) -> Result<Bytes, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    use http_body_util::{BodyExt, Limited};
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    Ok(Limited::new(resp.into_body(), MAX_JWKS_BYTES)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes())
}

/// The bearer token of a request.
fn bearer(headers: &HeaderMap) -> Result<&str, AuthFailure> {
    let v = headers
        .get(http::header::AUTHORIZATION)
        .ok_or(AuthFailure::Missing)?
        .to_str()
        .map_err(|_| AuthFailure::Invalid)?;
    let (scheme, token) = v.split_once(' ').ok_or(AuthFailure::Invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthFailure::Invalid);
    }
    Ok(token.trim())
}

fn b64(s: &str) -> Result<Vec<u8>, AuthFailure> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| AuthFailure::Invalid)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Constant-time equality of two digests.
fn ring_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    // XOR-fold: no branch depends on where the digests differ.
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq() {
        let a = sha256(b"one");
        assert!(ring_eq(&a, &sha256(b"one")));
        assert!(!ring_eq(&a, &sha256(b"two")));
    }
}
