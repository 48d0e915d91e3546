//! RFC 8693 token exchange: per-user identity to a backend (`[backends.token_exchange]`).
//!
//! A backend that must know who is calling gets neither the client's own token (which was
//! issued for portico, and must not travel further: README "Security model") nor one shared
//! service credential, but a token the identity provider issues for that backend on the
//! caller's behalf: portico posts the caller's verified JWT as the `subject_token` to the
//! IdP's token endpoint, with the backend's `audience`/`resource`/`scope`, and sends the
//! `access_token` it gets as the upstream `Authorization`.
//!
//! Invariants:
//! - Exchanged tokens are cached per subject token (a SHA-256 of it: the token itself is not
//!   kept) and backend, so one caller's token is never another's; until `expires_in` less a
//!   margin, at most `max_ttl_ms`, and [`MAX_TOKENS`] per backend.
//! - Concurrent requests with one subject token share one exchange (moka's `try_get_with`);
//!   a failed exchange is not cached — the next request asks again.
//! - The IdP refusing (4xx) is the caller's affair: 403 naming the IdP's `error`. The IdP
//!   failing (unreachable, 5xx, slow past `timeout_ms`, an answer that is no token) is
//!   portico's side: 502, and the backend is not asked.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::TokenExchangeConfig;

/// Exchanged tokens kept per backend (one per caller token in use).
pub const MAX_TOKENS: u64 = 10_000;
/// An exchanged token is dropped this long before the IdP said it expires (half its
/// lifetime when that is shorter), so it is never sent upstream already expired.
pub const EXPIRY_MARGIN: Duration = Duration::from_secs(60);
/// Most of an IdP's answer that is read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";

/// Why no token came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// The IdP refused the exchange (4xx): `error` and `error_description` as it said them.
    Refused(String),
    /// The IdP could not be asked, failed, or answered something that is no token.
    Failed(String),
}

/// One exchanged token and how long it may be used.
struct Exchanged {
    authorization: HeaderValue,
    ttl: Duration,
}

struct TokenTtl;

impl moka::Expiry<[u8; 32], Arc<Exchanged>> for TokenTtl {
    fn expire_after_create(
        &self,
        _key: &[u8; 32],
        value: &Arc<Exchanged>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// The token exchange of one backend.
pub struct Exchanger {
    cfg: TokenExchangeConfig,
    /// `Authorization: Basic …` for the client id and secret, when configured.
    client_auth: Option<HeaderValue>,
    tls: Option<tokio_rustls::TlsConnector>,
    tokens: moka::future::Cache<[u8; 32], Arc<Exchanged>>,
    /// When a failure was last logged (ms since `epoch`): an IdP outage fails every request,
    /// and the log says so once per [`WARN_EVERY`], not once per request.
    warned_at: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

/// How often an ongoing failure of the IdP is logged.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

impl Exchanger {
    /// Reads the client secret and sets up TLS; `backend` names errors.
    pub fn new(backend: &str, cfg: &TokenExchangeConfig) -> Result<Exchanger, String> {
        let key = format!("backends.{backend}.token_exchange");
        let secret = match (&cfg.client_secret_env, &cfg.client_secret_file) {
            (Some(var), _) => Some(std::env::var(var).map_err(|_| {
                format!("{key}.client_secret_env: environment variable {var} is not set")
            })?),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("{key}.client_secret_file {}: {e}", path.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            (None, None) => None,
        };
        let client_auth = match &cfg.client_id {
            Some(id) => Some(basic(id, secret.as_deref().unwrap_or_default()).ok_or_else(
                || format!("{key}.client_id: not usable in an Authorization header"),
            )?),
            None => None,
        };
        let tls = if cfg.token_url.starts_with("https://") {
            Some(
                crate::upstream::http::tls_connector(cfg.ca_file.as_deref(), &[b"http/1.1"])
                    .map_err(|e| format!("{key}.ca_file: {e}"))?,
            )
        } else {
            None
        };
        Ok(Exchanger {
            cfg: cfg.clone(),
            client_auth,
            tls,
            tokens: moka::future::Cache::builder()
                .max_capacity(MAX_TOKENS)
                .expire_after(TokenTtl)
                .build(),
            warned_at: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Whether a failure now should be logged (the first, then one per [`WARN_EVERY`]).
    pub fn should_warn(&self) -> bool {
        use std::sync::atomic::Ordering;
        // +1: the first failure, at 0 ms, is logged too.
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.warned_at.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64)
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// After a reload: the tokens the previous generation's exchanger `old` holds, when it
    /// asked the same IdP the same way with the same client credentials.
    pub fn keep_from(&mut self, old: &Exchanger) {
        if self.cfg == old.cfg && self.client_auth == old.client_auth {
            self.tokens = old.tokens.clone();
        }
    }

    /// The upstream `Authorization` for the caller whose JWT is `subject`: from the cache, or
    /// exchanged now (`true`: the IdP was asked for it).
    pub async fn authorization(&self, subject: &str) -> Result<(HeaderValue, bool), ExchangeError> {
        let key = super::sha256(subject.as_bytes());
        let asked = std::sync::atomic::AtomicBool::new(false);
        let token = self
            .tokens
            .try_get_with(key, async {
                asked.store(true, std::sync::atomic::Ordering::Relaxed);
                self.exchange(subject).await.map(Arc::new)
            })
            .await
            .map_err(|e| (*e).clone())?;
        Ok((
            token.authorization.clone(),
            asked.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    /// The RFC 8693 request's form body.
    fn form(&self, subject: &str) -> String {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", GRANT_TYPE)
            .append_pair("subject_token", subject)
            .append_pair("subject_token_type", ACCESS_TOKEN)
            .append_pair("requested_token_type", ACCESS_TOKEN);
        for (name, value) in [
            ("audience", &self.cfg.audience),
            ("resource", &self.cfg.resource),
            ("scope", &self.cfg.scope),
        ] {
            if let Some(v) = value {
                form.append_pair(name, v);
            }
        }
        form.finish()
    }

    /// One exchange at the IdP.
    async fn exchange(&self, subject: &str) -> Result<Exchanged, ExchangeError> {
        let form = self.form(subject);
        let mut headers = vec![
            (
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            ),
            (
                http::header::ACCEPT,
                HeaderValue::from_static("application/json"),
            ),
        ];
        if let Some(auth) = &self.client_auth {
            headers.push((http::header::AUTHORIZATION, auth.clone()));
        }
        let once = super::one_exchange(
            &self.cfg.token_url,
            self.tls.as_ref(),
            http::Method::POST,
            &headers,
            Bytes::from(form),
            MAX_ANSWER_BYTES,
        );
        let limit = Duration::from_millis(self.cfg.timeout_ms);
        let (status, body) = tokio::time::timeout(limit, once)
            .await
            .map_err(|_| {
                ExchangeError::Failed(format!(
                    "the token endpoint did not answer within {} ms",
                    self.cfg.timeout_ms
                ))
            })?
            .map_err(|e| ExchangeError::Failed(format!("the token endpoint: {e}")))?;
        read_answer(status, &body, Duration::from_millis(self.cfg.max_ttl_ms))
    }
}

/// The `Authorization: Basic` of RFC 6749 §2.3.1 (id and secret form-encoded first).
fn basic(id: &str, secret: &str) -> Option<HeaderValue> {
    use base64::Engine;
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let pair = format!("{}:{}", enc(id), enc(secret));
    let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
    HeaderValue::from_str(&format!("Basic {b64}")).ok()
}

/// What the token endpoint answered: a token (RFC 8693 §2.2.1) or a refusal (§2.2.2, RFC 6749
/// §5.2), with how long the token may be cached.
fn read_answer(
    status: StatusCode,
    body: &[u8],
    max_ttl: Duration,
) -> Result<Exchanged, ExchangeError> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if status.is_client_error() {
        let error = v["error"].as_str().unwrap_or("refused");
        let why = match v["error_description"].as_str() {
            Some(d) => format!("{error}: {d}"),
            None => error.to_string(),
        };
        // Printable and short: it goes into the client's error message.
        let why: String = why.chars().filter(|c| !c.is_control()).take(200).collect();
        return Err(ExchangeError::Refused(why));
    }
    if !status.is_success() {
        return Err(ExchangeError::Failed(format!(
            "the token endpoint answered HTTP {status}"
        )));
    }
    let Some(token) = v["access_token"].as_str().filter(|t| !t.is_empty()) else {
        return Err(ExchangeError::Failed(
            "the token endpoint's answer has no access_token".into(),
        ));
    };
    // RFC 8693 §2.2.1: "N_A" when the token is not an OAuth access token; either way it is
    // presented as a bearer token.
    let kind = v["token_type"].as_str().unwrap_or("Bearer");
    if !kind.eq_ignore_ascii_case("bearer") && kind != "N_A" {
        return Err(ExchangeError::Failed(format!(
            "the token endpoint issued a {kind:?} token; only bearer tokens can be sent upstream"
        )));
    }
    let authorization = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        ExchangeError::Failed("the issued token is not usable in an Authorization header".into())
    })?;
    let ttl = match v["expires_in"].as_u64() {
        Some(s) => {
            let life = Duration::from_secs(s);
            life.saturating_sub(EXPIRY_MARGIN.min(life / 2))
                .min(max_ttl)
        }
        None => max_ttl,
    };
    Ok(Exchanged { authorization, ttl })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(300);

    #[test]
    fn a_token_answer_is_a_bearer_kept_until_shortly_before_it_expires() {
        let ok = |body: &str| read_answer(StatusCode::OK, body.as_bytes(), MAX);
        let t = ok(r#"{"access_token":"abc","token_type":"Bearer","expires_in":3600}"#).unwrap();
        assert_eq!(t.authorization, "Bearer abc");
        assert_eq!(t.ttl, MAX, "capped at max_ttl");
        let t = ok(r#"{"access_token":"abc","token_type":"N_A","expires_in":120}"#).unwrap();
        assert_eq!(t.ttl, Duration::from_secs(60), "a minute's margin");
        let t = ok(r#"{"access_token":"abc","token_type":"bearer","expires_in":10}"#).unwrap();
        assert_eq!(t.ttl, Duration::from_secs(5), "half of a short life");
        assert_eq!(ok(r#"{"access_token":"abc"}"#).unwrap().ttl, MAX);
        for bad in [
            r#"{"token_type":"Bearer"}"#,
            r#"{"access_token":""}"#,
            r#"{"access_token":"abc","token_type":"DPoP"}"#,
            r#"{"access_token":"a\nb"}"#,
            "not json",
        ] {
            assert!(matches!(ok(bad), Err(ExchangeError::Failed(_))), "{bad}");
        }
    }

    #[test]
    fn a_refusal_names_the_idps_error_and_a_failure_is_porticos() {
        let refused = read_answer(
            StatusCode::BAD_REQUEST,
            br#"{"error":"invalid_grant","error_description":"subject\u0007 not allowed"}"#,
            MAX,
        );
        assert_eq!(
            refused.err(),
            Some(ExchangeError::Refused(
                "invalid_grant: subject not allowed".into()
            ))
        );
        let refused = read_answer(StatusCode::UNAUTHORIZED, b"", MAX);
        assert_eq!(
            refused.err(),
            Some(ExchangeError::Refused("refused".into()))
        );
        let failed = read_answer(StatusCode::BAD_GATEWAY, b"{}", MAX);
        assert!(matches!(failed, Err(ExchangeError::Failed(m)) if m.contains("502")));
    }

    /// A reload keeps the tokens exchanged under an unchanged exchange, and only then.
    #[tokio::test]
    async fn a_reload_keeps_tokens_only_under_the_same_exchange() {
        let cfg: TokenExchangeConfig =
            toml::from_str("token_url = 'http://127.0.0.1:1/token'\naudience = 'a'\n").unwrap();
        let old = Exchanger::new("b", &cfg).unwrap();
        let token = Arc::new(Exchanged {
            authorization: HeaderValue::from_static("Bearer t"),
            ttl: Duration::from_secs(60),
        });
        old.tokens.insert([1; 32], token).await;
        let mut same = Exchanger::new("b", &cfg).unwrap();
        same.keep_from(&old);
        assert!(same.tokens.get(&[1; 32]).await.is_some());
        let other = TokenExchangeConfig {
            audience: Some("another".into()),
            ..cfg
        };
        let mut changed = Exchanger::new("b", &other).unwrap();
        changed.keep_from(&old);
        assert!(changed.tokens.get(&[1; 32]).await.is_none());
    }

    #[test]
    fn an_outage_is_logged_once_per_interval() {
        let cfg: TokenExchangeConfig =
            toml::from_str("token_url = 'http://127.0.0.1:1/token'\n").unwrap();
        let ex = Exchanger::new("b", &cfg).unwrap();
        assert!(ex.should_warn(), "the first failure");
        assert!(!ex.should_warn() && !ex.should_warn(), "not the next ones");
    }

    #[test]
    fn client_credentials_are_form_encoded_then_base64() {
        // RFC 6749 §2.3.1: "a b" → "a+b", ":" → "%3A".
        let v = basic("portico gw", "s:cret").unwrap();
        use base64::Engine;
        let raw = v.to_str().unwrap().strip_prefix("Basic ").unwrap();
        let pair = base64::engine::general_purpose::STANDARD
            .decode(raw)
            .unwrap();
        assert_eq!(pair, b"portico+gw:s%3Acret");
    }
}
