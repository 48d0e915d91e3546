//! Security, JWT: HS256/RS256/ES256 signature, expiry and audience checks, JWKS fetched over
//! http and https (a private CA) and refreshed on rotation, and the hardening rules (the team
//! claim, `crit`, refetch on an unknown `kid`). Real gateway, real mock backend, real sockets.

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::common::mock::MockMcp;
use crate::common::{Gateway, send};
use crate::security::{TEAMS, bearer, list_as, tool_names};

const HS_SECRET: &[u8] = b"a-test-hmac-secret-of-32-bytes!!";

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A compact JWS over `claims`, signed by `sign`.
fn mint(alg: &str, kid: &str, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let head = b64(json!({"alg": alg, "kid": kid, "typ": "JWT"})
        .to_string()
        .as_bytes());
    let body = b64(claims.to_string().as_bytes());
    let signed = format!("{head}.{body}");
    let sig = sign(signed.as_bytes());
    format!("{signed}.{}", b64(&sig))
}

/// Signing keys for the three algorithms, and the JWKS that publishes them.
pub(crate) struct Keys {
    es: signature::EcdsaKeyPair,
    rsa: signature::RsaKeyPair,
    rng: SystemRandom,
}

impl Keys {
    pub(crate) fn new() -> Keys {
        let rng = SystemRandom::new();
        let pk8 = signature::EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let es = signature::EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pk8.as_ref(),
            &rng,
        )
        .unwrap();
        let rsa =
            signature::RsaKeyPair::from_pkcs8(include_bytes!("fixtures/jwt-test-rsa2048.pk8"))
                .unwrap();
        Keys { es, rsa, rng }
    }

    pub(crate) fn jwks(&self) -> Value {
        let point = self.es.public_key().as_ref();
        let rsa = signature::RsaPublicKeyComponents::<Vec<u8>>::from(self.rsa.public());
        json!({"keys": [
            {"kty": "oct", "kid": "hs", "k": b64(HS_SECRET)},
            {"kty": "EC", "kid": "es", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])},
            {"kty": "RSA", "kid": "rs",
             "n": b64(&rsa.n), "e": b64(&rsa.e)},
        ]})
    }

    /// The JWKS with only the key `kid` in it.
    fn jwks_of(&self, kid: &str) -> Value {
        let mut doc = self.jwks();
        doc["keys"]
            .as_array_mut()
            .unwrap()
            .retain(|k| k["kid"] == kid);
        doc
    }

    fn hs(&self, claims: &Value) -> String {
        mint("HS256", "hs", claims, |m| {
            ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, HS_SECRET), m)
                .as_ref()
                .to_vec()
        })
    }

    pub(crate) fn es(&self, claims: &Value) -> String {
        mint("ES256", "es", claims, |m| {
            self.es.sign(&self.rng, m).unwrap().as_ref().to_vec()
        })
    }

    fn rs(&self, claims: &Value) -> String {
        mint("RS256", "rs", claims, |m| {
            let mut sig = vec![0; self.rsa.public().modulus_len()];
            self.rsa
                .sign(&signature::RSA_PKCS1_SHA256, &self.rng, m, &mut sig)
                .unwrap();
            sig
        })
    }
}

#[tokio::test]
async fn jwt_checks_signature_expiry_audience_for_hs256_rs256_es256() {
    let keys = Keys::new();
    let jwks = crate::common::secret_file("jwks", &keys.jwks().to_string());
    // No ttlMs: every accepted list must reach the backend (the counter below counts them).
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    let gw = Gateway::start(&format!(
        r#"
[auth]
mode = "jwt"
[auth.jwt]
jwks_file = "{}"
issuer = "https://idp.example"
audience = "https://gw.example"
team_claim = "grp"
leeway_s = 5
[[backends]]
name = "m"
url = "{}"
protocol = "modern"
"#,
        jwks.display(),
        mock.url()
    ))
    .await;
    let url = gw.url("/mcp/m");
    let good = json!({"sub": "alice", "iss": "https://idp.example", "aud": ["https://gw.example"],
                      "exp": now() + 300, "nbf": now() - 10, "grp": "blue"});
    for (alg, token) in [
        ("HS256", keys.hs(&good)),
        ("ES256", keys.es(&good)),
        ("RS256", keys.rs(&good)),
    ] {
        let r = list_as(&url, &bearer(&token)).await;
        assert_eq!(r.status, 200, "{alg}: {:?}", r.body);
        // A flipped signature byte.
        let mut bad = token.clone().into_bytes();
        let last = bad.len() - 3;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        let r = list_as(&url, &bearer(std::str::from_utf8(&bad).unwrap())).await;
        assert_eq!(r.status, 401, "{alg} bad signature");
    }
    let mut expired = good.clone();
    expired["exp"] = json!(now() - 60);
    let mut future = good.clone();
    future["nbf"] = json!(now() + 600);
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = json!("https://other.example");
    let mut wrong_iss = good.clone();
    wrong_iss["iss"] = json!("https://evil.example");
    // Required claims: `exp` and `sub` always, `iss` and `aud` because they are configured.
    let without = |claim: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(claim);
        c
    };
    // Beyond `leeway_s = 5`: expired 30 s ago.
    let mut past_leeway = good.clone();
    past_leeway["exp"] = json!(now() - 30);
    for (what, claims) in [
        ("expired", expired),
        ("not yet valid", future),
        ("audience", wrong_aud),
        ("issuer", wrong_iss),
        ("no exp", without("exp")),
        ("no sub", without("sub")),
        ("no iss", without("iss")),
        ("no aud", without("aud")),
        ("past the leeway", past_leeway),
    ] {
        let r = list_as(&url, &bearer(&keys.es(&claims))).await;
        assert_eq!(r.status, 401, "{what}");
        assert!(
            r.header("www-authenticate")
                .unwrap()
                .starts_with("Bearer resource_metadata=")
        );
    }
    // alg=none and a token signed with an HMAC key pretending to be the RSA key id.
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(good.to_string().as_bytes())
    );
    assert_eq!(list_as(&url, &bearer(&none)).await.status, 401);
    let confused = mint("HS256", "rs", &good, |m| {
        ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"guess"), m)
            .as_ref()
            .to_vec()
    });
    assert_eq!(list_as(&url, &bearer(&confused)).await.status, 401);
    // Within the leeway: expired 2 s ago, valid from 2 s ahead.
    let mut within = good.clone();
    within["exp"] = json!(now() - 2);
    within["nbf"] = json!(now() + 2);
    let r = list_as(&url, &bearer(&keys.es(&within))).await;
    assert_eq!(r.status, 200, "within leeway_s: {:?}", r.body);
    assert_eq!(
        mock.count("tools/list"),
        4,
        "only the three good tokens and the one within the leeway got through"
    );
    gw.stop().await;
    let _ = std::fs::remove_file(&jwks);
}

#[tokio::test]
async fn jwks_url_is_fetched_and_refreshed() {
    let keys = Keys::new();
    let doc = Arc::new(Mutex::new(keys.jwks_of("rs").to_string()));
    let addr = jwks_server(doc.clone()).await;
    let mock = MockMcp::modern().start().await;
    let gw = Gateway::start(&format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_url = \"http://{addr}/jwks\"\njwks_refresh_ms = 1000\n{}",
        format_args!("[[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n", mock.url())
    ))
    .await;
    let url = gw.url("/mcp/m");
    let claims = json!({"sub": "carol", "exp": now() + 300});
    let until = |want: u16, token: String| {
        let url = url.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(8);
            loop {
                let s = list_as(&url, &bearer(&token)).await.status;
                if s == want {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "still {s}, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until(200, keys.rs(&claims)).await;
    assert_eq!(list_as(&url, &bearer(&keys.es(&claims))).await.status, 401);
    // Rotation: the EC key is published, the RSA key withdrawn.
    let mut only_ec = keys.jwks();
    only_ec["keys"]
        .as_array_mut()
        .unwrap()
        .retain(|k| k["kid"] == "es");
    *doc.lock().unwrap() = only_ec.to_string();
    until(200, keys.es(&claims)).await;
    assert_eq!(list_as(&url, &bearer(&keys.rs(&claims))).await.status, 401);
    gw.stop().await;
}

/// `jwks_url` over https: trusted through `ca_file`; without it the private CA is refused and
/// no key is loaded.
#[tokio::test]
async fn jwks_url_over_https_with_a_private_ca() {
    let (_dir, ca, tls) = crate::tls::private_ca_acceptor("pki");
    let keys = Keys::new();
    let doc = keys.jwks().to_string();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (tls, doc) = (tls.clone(), doc.clone());
            tokio::spawn(async move {
                let Ok(mut tcp) = tls.accept(tcp).await else {
                    return;
                };
                serve_json(&mut tcp, &doc).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    let mock = MockMcp::modern().start().await;
    let config = |ca_line: &str| {
        format!(
            "[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_url = \"https://localhost:{}/jwks\"\n{ca_line}\n\
             [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
            addr.port(),
            mock.url()
        )
    };
    let token = keys.rs(&json!({"sub": "carol", "exp": now() + 300}));
    let gw = Gateway::start(&config(&format!(
        "ca_file = {:?}",
        ca.display().to_string()
    )))
    .await;
    let url = gw.url("/mcp/m");
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    loop {
        let s = list_as(&url, &bearer(&token)).await.status;
        if s == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.stop().await;
    let gw = Gateway::start(&config("")).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        list_as(&gw.url("/mcp/m"), &bearer(&token)).await.status,
        401,
        "an unknown CA is not trusted"
    );
    gw.stop().await;
    server.abort();
}

// === JWT hardening: team claim rules, `crit`, refetch on an unknown `kid` ===

fn hs_sign(m: &[u8]) -> Vec<u8> {
    ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, HS_SECRET), m)
        .as_ref()
        .to_vec()
}

/// A compact JWS with exactly the protected header `header`.
fn mint_header(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let signed = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let sig = sign(signed.as_bytes());
    format!("{signed}.{}", b64(&sig))
}

/// A JWT gateway over the three test keys (a JWKS file), `team_claim = "grp"`, with `jwt_extra`
/// lines in `[auth.jwt]` and `extra` after it (teams).
async fn jwt_gateway(keys: &Keys, mock_url: &str, jwt_extra: &str, extra: &str) -> Gateway {
    let jwks = crate::common::secret_file("jwt-teams-jwks", &keys.jwks().to_string());
    Gateway::start(&format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_file = \"{}\"\nteam_claim = \"grp\"\n{jwt_extra}\n{extra}\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        jwks.display(),
        mock_url
    ))
    .await
}

/// RFC 8707: a client asks its authorization server for a token for the `resource` a path's
/// Protected Resource Metadata names; such a token is accepted on that path beside the
/// configured `audience`, and on no other path.
#[tokio::test]
async fn a_token_for_the_advertised_resource_is_accepted_on_its_path_only() {
    let keys = Keys::new();
    let mock = MockMcp::modern().start().await;
    let gw = jwt_gateway(
        &keys,
        &mock.url(),
        "audience = \"https://gw.example\"",
        &format!(
            "[[backends]]\nname = \"n\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
            mock.url()
        ),
    )
    .await;
    let prm = send(
        "GET",
        &gw.url("/.well-known/oauth-protected-resource/mcp/m"),
        &[],
        "",
    )
    .await;
    assert_eq!(prm.status, 200);
    let resource = prm.json()["resource"].as_str().unwrap().to_string();
    assert!(resource.ends_with("/mcp/m"), "{resource}");
    let claims = |aud: Value| json!({"sub": "alice", "aud": aud, "exp": now() + 300});
    let for_m = keys.es(&claims(json!(resource)));
    let r = list_as(&gw.url("/mcp/m"), &bearer(&for_m)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // Among other audiences too.
    let among = keys.es(&claims(json!(["https://api.example", resource])));
    assert_eq!(
        list_as(&gw.url("/mcp/m"), &bearer(&among)).await.status,
        200
    );
    // Not a token for another path's resource, nor for the gateway's origin alone.
    assert_eq!(
        list_as(&gw.url("/mcp/n"), &bearer(&for_m)).await.status,
        401
    );
    let origin = resource.trim_end_matches("/mcp/m").to_string();
    let bare = keys.es(&claims(json!(origin)));
    assert_eq!(list_as(&gw.url("/mcp/m"), &bearer(&bare)).await.status, 401);
    // The configured audience still is accepted everywhere.
    let configured = keys.es(&claims(json!("https://gw.example")));
    assert_eq!(
        list_as(&gw.url("/mcp/n"), &bearer(&configured))
            .await
            .status,
        200
    );
    gw.stop().await;
}

/// With `[[auth.teams]]`, a token maps to exactly one team or is refused with 403 naming why:
/// no claim (and no `default_team`), several teams, or a claim of the wrong shape. One string,
/// or an array of one string, is that team, and its policy applies.
#[tokio::test]
async fn jwt_team_claim_must_name_one_team_when_teams_are_configured() {
    let keys = Keys::new();
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    let gw = jwt_gateway(&keys, &mock.url(), "", TEAMS).await;
    let url = gw.url("/mcp/m");
    let token = |grp: Option<Value>| {
        let mut c = json!({"sub": "dave", "exp": now() + 300});
        if let Some(g) = grp {
            c["grp"] = g;
        }
        bearer(&keys.hs(&c))
    };
    for (grp, want) in [
        (None, "default_team"),
        (Some(json!(null)), "default_team"),
        (Some(json!([])), "default_team"),
        (Some(json!("")), "default_team"),
        (Some(json!(["blue", "red"])), "ambiguous team claim"),
        (Some(json!(["blue", 7])), "neither a string"),
        (Some(json!([7])), "neither a string"),
        (Some(json!(7)), "neither a string"),
        (Some(json!({"name": "blue"})), "neither a string"),
    ] {
        let r = list_as(&url, &token(grp.clone())).await;
        assert_eq!(r.status, 403, "{grp:?}: {:?}", r.body);
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains(want), "{grp:?}: {message}");
        assert!(message.contains("\"grp\""), "names the claim: {message}");
        assert!(r.header("www-authenticate").is_none(), "not a 401");
    }
    assert_eq!(
        mock.count("tools/list"),
        0,
        "no refused token reached the backend"
    );
    for grp in [json!("blue"), json!(["blue"])] {
        let r = list_as(&url, &token(Some(grp.clone()))).await;
        assert_eq!(tool_names(&r), ["echo", "whoami"], "{grp:?}");
    }
    assert_eq!(
        tool_names(&list_as(&url, &token(Some(json!(["red"])))).await),
        ["add"]
    );
    gw.stop().await;
}

/// `default_team` gives a token without the claim a team (and that team's policy); without
/// `[[auth.teams]]` and without `default_team` a token needs no team at all, as before.
#[tokio::test]
async fn jwt_default_team_applies_to_a_token_without_the_claim() {
    let keys = Keys::new();
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    let claims = json!({"sub": "erin", "exp": now() + 300});
    let gw = jwt_gateway(&keys, &mock.url(), "default_team = \"red\"", TEAMS).await;
    let url = gw.url("/mcp/m");
    assert_eq!(
        tool_names(&list_as(&url, &bearer(&keys.es(&claims))).await),
        ["add"]
    );
    // A claim, when present, still wins over the default.
    let mut blue = claims.clone();
    blue["grp"] = json!("blue");
    assert_eq!(
        tool_names(&list_as(&url, &bearer(&keys.es(&blue))).await),
        ["echo", "whoami"]
    );
    gw.stop().await;

    let gw = jwt_gateway(&keys, &mock.url(), "", "").await;
    let r = list_as(&gw.url("/mcp/m"), &bearer(&keys.es(&claims))).await;
    assert_eq!(r.status, 200, "no teams configured: {:?}", r.body);
    gw.stop().await;
}

#[tokio::test]
async fn jwt_default_team_must_name_a_configured_team() {
    let cfg = |default: &str, teams: &str| {
        format!(
            "[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_file = \"j.json\"\ndefault_team = \"{default}\"\n{teams}"
        )
    };
    let check = |toml: String| portico::config::validate(portico::config::parse(&toml).unwrap());
    let err = check(cfg("green", TEAMS)).unwrap_err().to_string();
    assert!(
        err.starts_with("auth.jwt.default_team:") && err.contains("green"),
        "{err}"
    );
    assert!(
        check(cfg("", ""))
            .unwrap_err()
            .to_string()
            .starts_with("auth.jwt.default_team:")
    );
    assert!(check(cfg("blue", TEAMS)).is_ok());
    // No teams configured: any name (it can still match a backend's allow_teams).
    assert!(check(cfg("green", "")).is_ok());
}

/// RFC 7515 §4.1.11: a `crit` header names extensions the recipient must understand; portico
/// implements none, so any token carrying one is refused with 401.
#[tokio::test]
async fn jwt_with_a_crit_header_is_refused() {
    let keys = Keys::new();
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    let gw = jwt_gateway(&keys, &mock.url(), "", "").await;
    let url = gw.url("/mcp/m");
    let claims = json!({"sub": "frank", "exp": now() + 300});
    let plain = json!({"alg": "HS256", "kid": "hs", "typ": "JWT"});
    assert_eq!(
        list_as(&url, &bearer(&mint_header(&plain, &claims, hs_sign)))
            .await
            .status,
        200,
        "the same token without crit"
    );
    for extra in [
        json!({"crit": ["urn:example:policy"], "urn:example:policy": "x"}),
        json!({"crit": ["exp"], "exp": now() + 300}),
        json!({"crit": []}),
        json!({"crit": ["b64"], "b64": true}),
        json!({"crit": "b64"}),
    ] {
        let mut header = plain.clone();
        for (k, v) in extra.as_object().unwrap() {
            header[k] = v.clone();
        }
        let r = list_as(&url, &bearer(&mint_header(&header, &claims, hs_sign))).await;
        assert_eq!(r.status, 401, "{header}");
        assert!(
            r.header("www-authenticate")
                .unwrap()
                .contains("invalid_token")
        );
    }
    assert_eq!(mock.count("tools/list"), 1);
    gw.stop().await;
}

/// Reads one request from `tcp` (a JWKS fetch fits in one read) and answers it with `doc`.
async fn serve_json<S: AsyncRead + AsyncWrite + Unpin>(tcp: &mut S, doc: &str) {
    let mut buf = [0u8; 2048];
    let _ = tcp.read(&mut buf).await;
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{doc}",
        doc.len()
    );
    let _ = tcp.write_all(resp.as_bytes()).await;
}

/// A one-route HTTP server for a JWKS document that can be swapped (key rotation).
async fn jwks_server(doc: Arc<Mutex<String>>) -> std::net::SocketAddr {
    counting_jwks_server(doc, Arc::default()).await
}

/// [`jwks_server`], counting the documents it serves.
async fn counting_jwks_server(
    doc: Arc<Mutex<String>>,
    served: Arc<std::sync::atomic::AtomicUsize>,
) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let doc = doc.lock().unwrap().clone();
            tokio::spawn(async move {
                serve_json(&mut tcp, &doc).await;
            });
        }
    });
    addr
}

/// A token whose `kid` is not in the JWKS makes portico fetch `jwks_url` again at once (the
/// IdP rotated keys), so it is accepted without waiting for the periodic refresh; a second
/// unknown `kid` within `JWKS_UNKNOWN_KID_MIN_INTERVAL` fetches nothing.
#[tokio::test]
async fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    assert!(portico::auth::JWKS_UNKNOWN_KID_MIN_INTERVAL >= Duration::from_secs(5));
    let keys = Keys::new();
    let doc = Arc::new(Mutex::new(keys.jwks_of("rs").to_string()));
    let served = Arc::new(AtomicUsize::new(0));
    let addr = counting_jwks_server(doc.clone(), served.clone()).await;
    let mock = MockMcp::modern().ttl_ms(None).start().await;
    // The periodic refresh is an hour away: every fetch after the first is for a kid.
    let gw = Gateway::start(&format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\njwks_url = \"http://{addr}/jwks\"\njwks_refresh_ms = 3600000\n\
         [[backends]]\nname = \"m\"\nurl = \"{}\"\nprotocol = \"modern\"\n",
        mock.url()
    ))
    .await;
    let url = gw.url("/mcp/m");
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while served.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no JWKS fetch at start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claims = json!({"sub": "grace", "exp": now() + 300});
    // The start-up fetch's keys (waited for, not fetched again, if it is still in flight).
    assert_eq!(list_as(&url, &bearer(&keys.rs(&claims))).await.status, 200);
    assert_eq!(served.load(Ordering::SeqCst), 1);

    // The IdP publishes new keys: a token signed with one is accepted at once.
    *doc.lock().unwrap() = keys.jwks().to_string();
    let r = list_as(&url, &bearer(&keys.es(&claims))).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "one fetch for the new kid"
    );
    // Keys it brought along need no fetch.
    assert_eq!(list_as(&url, &bearer(&keys.hs(&claims))).await.status, 200);
    // Within the interval, unknown kids are refused without fetching, however many.
    for kid in ["nope", "nope-2", "nope-3"] {
        let stranger = mint("HS256", kid, &claims, hs_sign);
        assert_eq!(list_as(&url, &bearer(&stranger)).await.status, 401, "{kid}");
    }
    assert_eq!(served.load(Ordering::SeqCst), 2, "rate limited");
    gw.stop().await;
}

/// A legacy client's subscription is renewed only while the credentials it was opened with
/// still authenticate: once its token has expired, a backend restart ends the subscription
/// rather than renewing it in the name of a token portico would now refuse.
#[tokio::test]
async fn a_subscription_is_not_renewed_on_an_expired_token() {
    let keys = Keys::new();
    let mock = MockMcp::modern().subscribe_and_log().start().await;
    let gw = jwt_gateway(&keys, &mock.url(), "leeway_s = 0", "").await;
    let url = gw.url("/mcp/m");
    let token = keys.hs(&json!({"sub": "alice", "exp": now() + 2}));
    let old = crate::sessions::Old::connect(&url, Some(&token), "{}").await;
    let r = old
        .call(json!(1), "resources/subscribe", json!({"uri": "mock://r"}))
        .await;
    assert_eq!(r.json()["result"], json!({}), "{:?}", r.body);
    assert_eq!(mock.resource_listens(), 1);
    // Past `exp` (whole seconds) with no leeway.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let r = old.call(json!(2), "ping", json!({})).await;
    assert_eq!(r.status, 401, "the token has expired: {:?}", r.body);
    mock.end_listens();
    // A renewal would come after 0.25 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(mock.resource_listens(), 0, "not renewed");
    gw.stop().await;
}
