//! Who is calling, and what they may do (docs/protocol.md §4, Auth; §8 items 3, 4, 19).
//!
//! Owns: authentication of the client's `Authorization: Bearer` credential (static API keys or
//! JWTs checked against a JWKS, verified by the `jsonwebtoken` crate), the mapping of a JWT's
//! team claim to a team, the Protected Resource Metadata document (RFC 9728), team
//! authorization (`allow_teams`, tool allow/deny), per-principal and per-tool rate limits
//! (`limits`), and the cache partition of a caller.
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
//! - With `[[auth.teams]]` configured, a JWT principal always has a team: its one team claim or
//!   `default_team`; otherwise it is refused (403), so a token cannot shed its team's policy by
//!   leaving the claim out.
//! - An unknown `kid` fetches the JWKS URL again at most once per
//!   `JWKS_UNKNOWN_KID_MIN_INTERVAL`, whatever the tokens say.

mod exchange;
mod limits;

use arc_swap::ArcSwap;
use bytes::Bytes;

use http::HeaderMap;
use jsonwebtoken::errors::ErrorKind as JwtError;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ring::digest;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::cache::Partition;
use crate::config::{AuthConfig, AuthMode, JwtConfig, ToolFilter};
use crate::error::GatewayError;

/// Path of the Protected Resource Metadata document; per-resource documents append the path.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// How long a JWKS fetch may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// A token whose `kid` is not in the JWKS fetches `jwks_url` again (the IdP may have rotated
/// keys since the last periodic refresh), but at most once per this interval: the `kid` is
/// chosen by whoever sends the token, so it must not drive the IdP's load.
pub const JWKS_UNKNOWN_KID_MIN_INTERVAL: Duration = Duration::from_secs(10);

/// The algorithms accepted, one per key type: `oct` → HS256, `RSA` → RS256, `EC` P-256 → ES256
/// (README, Security model).
const ALGORITHMS: [Algorithm; 3] = [Algorithm::HS256, Algorithm::RS256, Algorithm::ES256];

/// Smallest RSA modulus accepted, in bits.
const MIN_RSA_MODULUS_BITS: usize = 2048;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// API key `principal`, or the JWT `sub`.
    pub id: String,
    pub team: Option<String>,
}

/// A verification key from a JWKS, with the one algorithm it verifies.
pub struct Jwk {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

struct Jwt {
    cfg: JwtConfig,
    keys: ArcSwap<Vec<Jwk>>,
    /// The claim checks for each accepted algorithm (`jsonwebtoken` wants the algorithm in
    /// them), built once from `cfg`.
    validations: [Validation; 3],
    /// For an `https://` `jwks_url`: the same rustls setup as backends (`ca_file` honoured).
    tls: Option<tokio_rustls::TlsConnector>,
    /// Taken for every JWKS fetch, periodic or for an unknown `kid`: a burst of tokens with a
    /// new `kid` waits for one fetch instead of starting many. Holds when the last fetch for an
    /// unknown `kid` started (`JWKS_UNKNOWN_KID_MIN_INTERVAL`).
    fetch: tokio::sync::Mutex<Option<Instant>>,
}

/// Authentication and authorization state for one config generation.
pub struct Auth {
    mode: AuthMode,
    /// The protected resource's base URL: `public_url`, else the configured listen address.
    /// Never the request's `Host`: a client must not choose the URL portico tells others to
    /// trust (README "Security model").
    base_url: String,
    authorization_servers: Vec<String>,
    scopes_supported: Vec<String>,
    /// The 401 challenge's `scope`: the supported scopes that are valid scope tokens (RFC 6749
    /// §3.3: no space, `"` or `\`, which would break the quoted string), space-separated.
    challenge_scope: String,
    /// SHA-256 of each configured key, with who it belongs to.
    api_keys: Vec<([u8; 32], Arc<Principal>)>,
    jwt: Option<Arc<Jwt>>,
    teams: HashMap<String, crate::config::TeamConfig>,
    /// The per-principal and per-tool rate limits.
    limits: limits::Limits,
    /// `[backends.token_exchange]`, by backend name.
    exchanges: HashMap<String, exchange::Exchanger>,
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
    #[error("token algorithm not accepted")]
    UnsupportedAlgorithm,
    #[error("token has a critical header parameter portico does not implement")]
    CriticalHeader,
    #[error("no key for the token's kid")]
    UnknownKey,
    // The token is genuine but names no usable team: 403, not 401 (a new token from the same
    // IdP would say the same).
    #[error("the token has no {claim:?} claim and [auth.jwt] default_team is not set")]
    NoTeam { claim: String },
    #[error("ambiguous team claim {claim:?}: the token names several teams, portico needs one")]
    AmbiguousTeam { claim: String },
    #[error("team claim {claim:?} is neither a string nor an array of one string")]
    MalformedTeam { claim: String },
}

impl AuthFailure {
    /// Authenticated, but not allowed in: 403 rather than 401.
    fn is_forbidden(&self) -> bool {
        matches!(
            self,
            AuthFailure::NoTeam { .. }
                | AuthFailure::AmbiguousTeam { .. }
                | AuthFailure::MalformedTeam { .. }
        )
    }
}

impl Auth {
    /// Builds from a validated config. JWKS files are read here; a JWKS URL is fetched by the
    /// refresh task (`spawn_refresh`).
    /// `fallback_base_url` names the resource when `public_url` is not configured (the
    /// listener's own address).
    pub fn build(cfg: &AuthConfig, fallback_base_url: String) -> Result<Auth, String> {
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
                    validations: ALGORITHMS.map(|alg| validation(j, alg)),
                    cfg: j.clone(),
                    keys: ArcSwap::from_pointee(keys),
                    tls,
                    fetch: tokio::sync::Mutex::new(None),
                }))
            }
            _ => None,
        };
        Ok(Auth {
            mode: cfg.mode,
            base_url: cfg.public_url.clone().unwrap_or(fallback_base_url),
            authorization_servers: cfg.authorization_servers.clone(),
            scopes_supported: cfg.scopes_supported.clone(),
            challenge_scope: cfg
                .scopes_supported
                .iter()
                .filter(|s| {
                    !s.is_empty()
                        && s.bytes()
                            .all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
                })
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            api_keys,
            jwt,
            teams: cfg
                .teams
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect(),
            limits: limits::Limits::new(cfg),
            exchanges: HashMap::new(),
        })
    }

    /// With the token exchange of each of `backends` that has one (`[backends.token_exchange]`:
    /// its client secret read, its TLS set up).
    pub fn with_exchanges(
        mut self,
        backends: &[crate::config::BackendConfig],
    ) -> Result<Auth, String> {
        for b in backends {
            if let Some(tx) = &b.token_exchange {
                self.exchanges
                    .insert(b.name.clone(), exchange::Exchanger::new(&b.name, tx)?);
            }
        }
        Ok(self)
    }

    /// The upstream `Authorization` for this caller on `backend` when the backend exchanges
    /// tokens (`None`: it does not): the caller's bearer token exchanged at the IdP, or the
    /// token exchanged for it before. Refused by the IdP: 403; the IdP failing: 502.
    pub async fn exchanged(
        &self,
        metrics: &crate::metrics::Metrics,
        backend: &str,
        headers: &HeaderMap,
    ) -> Result<Option<http::HeaderValue>, GatewayError> {
        let Some(exchanger) = self.exchanges.get(backend) else {
            return Ok(None);
        };
        let fail = |detail: String, refused: bool| GatewayError::TokenExchange {
            backend: backend.to_string(),
            detail,
            refused,
        };
        let Ok(subject) = bearer(headers) else {
            metrics.token_exchange(backend, "refused");
            return Err(fail(
                "the caller presented no bearer token to exchange".into(),
                true,
            ));
        };
        match exchanger.authorization(subject).await {
            Ok((authorization, asked)) => {
                metrics.token_exchange(backend, if asked { "exchanged" } else { "cached" });
                Ok(Some(authorization))
            }
            Err(exchange::ExchangeError::Refused(why)) => {
                metrics.token_exchange(backend, "refused");
                Err(fail(
                    format!("the identity provider refused it ({why})"),
                    true,
                ))
            }
            Err(exchange::ExchangeError::Failed(why)) => {
                metrics.token_exchange(backend, "failed");
                if exchanger.should_warn() {
                    tracing::warn!(backend, error = %why, "token exchange failed (logged at most every 10 s; portico_token_exchanges_total counts each)");
                }
                Err(fail(
                    format!("the identity provider could not be asked: {why}"),
                    false,
                ))
            }
        }
    }

    /// Whether `backend` exchanges its callers' tokens (then what it answers depends on the
    /// caller: its cache entries are the caller's own).
    pub fn exchanges_for(&self, backend: &str) -> bool {
        // On every request: no hashing at all when no backend exchanges tokens.
        !self.exchanges.is_empty() && self.exchanges.contains_key(backend)
    }

    /// On a reload: keeps the previous generation's rate-limit buckets for every rate this
    /// one does not change (`limits::Limits::keep_from`), and the tokens exchanged for callers
    /// of every backend whose token exchange is unchanged (`exchange::Exchanger::keep_from`).
    pub fn carry_over(&mut self, old: &Auth) {
        self.limits.keep_from(&old.limits);
        for (backend, exchanger) in &mut self.exchanges {
            if let Some(old) = old.exchanges.get(backend) {
                exchanger.keep_from(old);
            }
        }
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
        let weak: Weak<Jwt> = Arc::downgrade(jwt);
        let every = Duration::from_millis(jwt.cfg.jwks_refresh_ms.max(1000));
        rt.spawn(async move {
            loop {
                let Some(jwt) = weak.upgrade() else { return };
                {
                    // Held during the fetch: a token that arrives before the first fetch ends
                    // waits for its keys instead of fetching them a second time.
                    let _turn = jwt.fetch.lock().await;
                    match fetch_jwks(&url, jwt.tls.as_ref()).await {
                        Ok(keys) => jwt.keys.store(Arc::new(keys)),
                        // Keep the old keys: a flaky IdP must not log everybody out.
                        Err(error) => tracing::warn!(%url, %error, "JWKS refresh failed"),
                    }
                }
                drop(jwt);
                tokio::time::sleep(every).await;
            }
        });
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Whether requests are authenticated at all (mode other than `none`): the pipeline skips
    /// the (async) step 1b otherwise.
    pub fn enabled(&self) -> bool {
        self.mode != AuthMode::None
    }

    /// Step 1b of the pipeline: who is calling. `Ok(None)` only in mode `none`. Async only for
    /// a JWT with an unknown `kid`, which may wait for a JWKS fetch.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Option<Arc<Principal>>, GatewayError> {
        let result = match self.mode {
            AuthMode::None => return Ok(None),
            AuthMode::ApiKeys => bearer(headers).and_then(|t| self.check_key(t)),
            AuthMode::Jwt => match bearer(headers) {
                // Boxed: a key fetch is rare, and its state inline made every request's
                // future ~4.7 KB larger.
                Ok(token) => Box::pin(self.check_jwt_refetching(token, path)).await,
                Err(e) => Err(e),
            },
        };
        result.map(Some).map_err(|failure| {
            tracing::debug!(%failure, path, "authentication failed");
            if failure.is_forbidden() {
                return GatewayError::Forbidden(failure.to_string());
            }
            GatewayError::Unauthorized {
                reason: failure.to_string(),
                token_given: failure != AuthFailure::Missing,
                resource_metadata: self.metadata_url(path),
                scope: self.challenge_scope.clone(),
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

    /// Verifies a compact JWS and its claims against the keys held now, for the resource at
    /// `path`, and maps it to a principal. Never fetches: an unknown `kid` is
    /// `AuthFailure::UnknownKey`.
    pub fn check_jwt(&self, token: &str, path: &str) -> Result<Arc<Principal>, AuthFailure> {
        let jwt = self.jwt.as_ref().ok_or(AuthFailure::Invalid)?;
        let claims = jwt.verify(&jwt.keys.load(), token)?;
        self.audience_ok(&jwt.cfg, &claims, path)?;
        self.principal_of(&jwt.cfg, &claims)
    }

    /// `check_jwt`, and on an unknown `kid` one JWKS fetch (rate limited) and a second try.
    async fn check_jwt_refetching(
        &self,
        token: &str,
        path: &str,
    ) -> Result<Arc<Principal>, AuthFailure> {
        let jwt = self.jwt.as_ref().ok_or(AuthFailure::Invalid)?;
        let seen = jwt.keys.load_full();
        let claims = match jwt.verify(&seen, token) {
            Err(AuthFailure::UnknownKey) if jwt.refetch_for_unknown_kid(&seen).await => {
                jwt.verify(&jwt.keys.load(), token)?
            }
            other => other?,
        };
        self.audience_ok(&jwt.cfg, &claims, path)?;
        self.principal_of(&jwt.cfg, &claims)
    }

    /// With `audience` configured, one of the token's audiences must be it or the resource the
    /// token is presented to: `resource` in that path's Protected Resource Metadata
    /// (`metadata`), which is what a client asks its authorization server for (RFC 8707).
    /// Without it, `aud` is not portico's to judge.
    fn audience_ok(&self, cfg: &JwtConfig, claims: &Value, path: &str) -> Result<(), AuthFailure> {
        let Some(want) = &cfg.audience else {
            return Ok(());
        };
        let is_ours = |a: &str| a == want || a.strip_prefix(self.base_url.as_str()) == Some(path);
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => is_ours(a),
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).any(is_ours),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(AuthFailure::WrongIssuerOrAudience)
        }
    }

    /// `sub` and the team of verified claims. The team claim is a string, or an array of
    /// exactly one string (README, Security model); absent, `null`, `""` or `[]` mean no team,
    /// which is `default_team`, or a refusal when `[[auth.teams]]` exist (a policy would be
    /// escaped otherwise).
    fn principal_of(&self, cfg: &JwtConfig, claims: &Value) -> Result<Arc<Principal>, AuthFailure> {
        let Some(sub) = claims.get("sub").and_then(Value::as_str) else {
            return Err(AuthFailure::Invalid);
        };
        let claim = &cfg.team_claim;
        let malformed = || AuthFailure::MalformedTeam {
            claim: claim.clone(),
        };
        let named = match claims.get(claim) {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Array(list)) => match list.as_slice() {
                [] => None,
                [Value::String(t)] => Some(t.as_str()),
                [_] => return Err(malformed()),
                _ if list.iter().all(Value::is_string) => {
                    return Err(AuthFailure::AmbiguousTeam {
                        claim: claim.clone(),
                    });
                }
                _ => return Err(malformed()),
            },
            Some(_) => return Err(malformed()),
        }
        .filter(|t| !t.is_empty());
        let team = match named {
            Some(t) => Some(t.to_string()),
            None => match &cfg.default_team {
                Some(t) => Some(t.clone()),
                None if !self.teams.is_empty() => {
                    return Err(AuthFailure::NoTeam {
                        claim: claim.clone(),
                    });
                }
                None => None,
            },
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
        self.limits.charge(principal)
    }

    /// Whether an `[[auth.tool_limits]]` rule covers the caller: its `tools/call` bodies are
    /// then read and judged before anything is forwarded.
    pub fn tool_limited(&self, principal: Option<&Principal>) -> bool {
        self.limits.covers(principal)
    }

    /// Charges the caller's buckets of the rules naming `tool` (the name the client sees).
    pub fn charge_tool(
        &self,
        principal: Option<&Principal>,
        tool: &str,
    ) -> Result<(), GatewayError> {
        self.limits.charge_tool(principal, tool)
    }

    /// Where the metadata of the resource at `path` lives (the `resource_metadata` parameter).
    pub fn metadata_url(&self, path: &str) -> String {
        format!("{}{METADATA_PATH}{path}", self.base_url)
    }

    /// The RFC 9728 document for `/.well-known/oauth-protected-resource[/<resource path>]`.
    /// `None` when the path names no resource portico serves.
    pub fn metadata(&self, well_known_path: &str, exists: impl Fn(&str) -> bool) -> Option<Bytes> {
        let rest = well_known_path.strip_prefix(METADATA_PATH)?;
        if !rest.is_empty() && !exists(rest) {
            return None;
        }
        let mut doc = serde_json::json!({
            "resource": format!("{}{rest}", self.base_url),
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

impl Jwt {
    /// Checks the signature with the keys `keys` and the claims (`exp`, `nbf`, `iss`, `aud`
    /// with `leeway_s`; `exp` and `sub` required), and returns the claims.
    fn verify(&self, keys: &[Jwk], token: &str) -> Result<Value, AuthFailure> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthFailure::Invalid)?;
        // RFC 7515 §4.1.11: a recipient must refuse a token whose `crit` lists a parameter it
        // does not implement, and portico implements no JWS extension.
        if header.crit.is_some() {
            return Err(AuthFailure::CriticalHeader);
        }
        let Some(i) = ALGORITHMS.iter().position(|a| *a == header.alg) else {
            return Err(AuthFailure::UnsupportedAlgorithm);
        };
        let kid = header.kid.as_deref();
        let mut failure = match kid {
            Some(want) if !keys.iter().any(|k| k.kid.as_deref() == Some(want)) => {
                AuthFailure::UnknownKey
            }
            _ => AuthFailure::BadSignature,
        };
        // A key without `kid` is tried for any token of its algorithm; one with a `kid` only
        // for tokens naming it.
        let candidates = keys
            .iter()
            .filter(|k| k.alg == header.alg)
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid);
        for k in candidates {
            match jsonwebtoken::decode::<Value>(token, &k.key, &self.validations[i]) {
                Ok(data) => return Ok(data.claims),
                // Not this key (the signature is checked before the claims, and a key the
                // crypto backend cannot use fails before either): try the next one.
                Err(e)
                    if matches!(
                        e.kind(),
                        JwtError::InvalidSignature
                            | JwtError::InvalidKeyFormat
                            | JwtError::InvalidRsaKey(_)
                            | JwtError::InvalidEcdsaKey
                    ) => {}
                Err(e) => {
                    failure = claim_failure(e.kind());
                    break;
                }
            }
        }
        Err(failure)
    }

    /// Fetches `jwks_url` again for a token whose `kid` is not in `seen`, unless the keys
    /// changed meanwhile or the last such fetch is younger than
    /// `JWKS_UNKNOWN_KID_MIN_INTERVAL`. True when the keys may now hold the `kid`.
    async fn refetch_for_unknown_kid(&self, seen: &Arc<Vec<Jwk>>) -> bool {
        let Some(url) = &self.cfg.jwks_url else {
            return false;
        };
        let mut last = self.fetch.lock().await;
        if !Arc::ptr_eq(&self.keys.load_full(), seen) {
            return true;
        }
        if last.is_some_and(|t| t.elapsed() < JWKS_UNKNOWN_KID_MIN_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        match fetch_jwks(url, self.tls.as_ref()).await {
            Ok(keys) => {
                tracing::info!(%url, "JWKS fetched for an unknown kid");
                self.keys.store(Arc::new(keys));
                true
            }
            Err(error) => {
                tracing::warn!(%url, %error, "JWKS fetch for an unknown kid failed");
                false
            }
        }
    }
}

/// The claim checks of `[auth.jwt]` for tokens signed with `alg`.
fn validation(cfg: &JwtConfig, alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = cfg.leeway_s;
    v.validate_exp = true;
    v.validate_nbf = true;
    // `jsonwebtoken` checks `iss`/`aud` only when present: a configured one is also required.
    let mut required = vec!["exp", "sub"];
    if let Some(iss) = &cfg.issuer {
        v.set_issuer(&[iss]);
        required.push("iss");
    }
    // `aud` is judged per request, against the resource presented to (`Auth::audience_ok`);
    // here only its presence, when an audience is configured.
    v.validate_aud = false;
    if cfg.audience.is_some() {
        required.push("aud");
    }
    v.set_required_spec_claims(&required);
    v
}

/// The failure for a token whose signature verified but whose claims did not.
fn claim_failure(kind: &JwtError) -> AuthFailure {
    match kind {
        JwtError::ExpiredSignature => AuthFailure::Expired,
        JwtError::ImmatureSignature => AuthFailure::NotYetValid,
        JwtError::InvalidIssuer | JwtError::InvalidAudience => AuthFailure::WrongIssuerOrAudience,
        JwtError::MissingRequiredClaim(c) if c == "iss" || c == "aud" => {
            AuthFailure::WrongIssuerOrAudience
        }
        _ => AuthFailure::Invalid,
    }
}

#[derive(Deserialize)]
struct JwksDoc {
    keys: Vec<Value>,
}

/// Parses a JWKS document. Keys that are not for signatures, of other types or algorithms, or
/// malformed are skipped, so one odd key cannot hide the others.
pub fn parse_jwks(text: &[u8]) -> Result<Vec<Jwk>, String> {
    let doc: JwksDoc = serde_json::from_slice(text).map_err(|e| format!("not a JWKS: {e}"))?;
    Ok(doc
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value(k).ok())
        .filter_map(verification_key)
        .collect())
}

fn verification_key(jwk: jsonwebtoken::jwk::Jwk) -> Option<Jwk> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return None;
    }
    // Built from the decoded members rather than with `DecodingKey::from_jwk`, which refuses
    // padded base64url (accepted before, so a JWKS that loaded still loads).
    let (alg, named, key) = match &jwk.algorithm {
        AlgorithmParameters::OctetKey(p) => (
            Algorithm::HS256,
            KeyAlgorithm::HS256,
            DecodingKey::from_secret(&b64(&p.value)?).ok()?,
        ),
        AlgorithmParameters::RSA(p) => {
            let (n, e) = (b64(&p.n)?, b64(&p.e)?);
            // The modulus' length in bits, from its first non-zero byte (a 256-byte modulus
            // whose top byte is small is still under 2048 bits).
            let significant = &n[n.iter().take_while(|b| **b == 0).count()..];
            let bits = significant.first().map_or(0, |top| {
                (significant.len() - 1) * 8 + (8 - top.leading_zeros() as usize)
            });
            if bits < MIN_RSA_MODULUS_BITS {
                return None;
            }
            let key = DecodingKey::from_rsa_raw_components(&n, &e);
            (Algorithm::RS256, KeyAlgorithm::RS256, key)
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
            let (x, y) = (p.x.trim_end_matches('='), p.y.trim_end_matches('='));
            if b64(x)?.len() != 32 || b64(y)?.len() != 32 {
                return None;
            }
            let key = DecodingKey::from_ec_components(x, y).ok()?;
            (Algorithm::ES256, KeyAlgorithm::ES256, key)
        }
        _ => return None,
    };
    // RFC 7517 §4.4: a key that names its algorithm is for that algorithm only.
    if jwk.common.key_algorithm.is_some_and(|a| a != named) {
        return None;
    }
    Some(Jwk {
        kid: jwk.common.key_id,
        alg,
        key,
    })
}

/// Fetches a JWKS over HTTP or, with `tls`, HTTPS: one HTTP/1.1 GET on a fresh connection
/// (a refresh every few minutes needs no pool), bounded in time and size.
async fn fetch_jwks(
    url: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Vec<Jwk>, String> {
    let accept = [(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/json"),
    )];
    let once = one_exchange(
        url,
        tls,
        http::Method::GET,
        &accept,
        Bytes::new(),
        MAX_JWKS_BYTES,
    );
    let (status, body) = tokio::time::timeout(JWKS_FETCH_TIMEOUT, once)
        .await
        .map_err(|_| "timed out".to_string())??;
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    parse_jwks(&body)
}

/// One HTTP/1.1 request to the identity provider on a fresh connection (`tls` for
/// `https://`): the answer's status and body, at most `max` bytes of it. The caller bounds
/// the time. The JWKS fetch and the token exchange (`exchange`).
async fn one_exchange(
    url: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
    method: http::Method,
    headers: &[(http::HeaderName, http::HeaderValue)],
    body: Bytes,
    max: usize,
) -> Result<(http::StatusCode, Bytes), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let host = uri.host().ok_or("no host")?.to_string();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            uri.authority().map_or(host.as_str(), |a| a.as_str()),
        )
        .body(http_body_util::Full::new(body))
        .map_err(|e| e.to_string())?;
    for (name, value) in headers {
        req.headers_mut().insert(name.clone(), value.clone());
    }
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
            send_once(hyper_util::rt::TokioIo::new(stream), req, max).await
        }
        (true, None) => Err("https:// without a TLS setup".into()),
        (false, _) => send_once(hyper_util::rt::TokioIo::new(tcp), req, max).await,
    }
}

async fn send_once<IO>(
    io: IO,
    req: http::Request<http_body_util::Full<Bytes>>,
    max: usize,
) -> Result<(http::StatusCode, Bytes), String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    use http_body_util::{BodyExt, Limited};
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
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

/// A base64url JWK member (padding tolerated).
fn b64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
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

#[cfg(test)]
mod tests;
