//! The pieces of identity that need no server: which JWKS keys are kept, and the
//! constant-time comparison of API keys (the rest runs against a live portico in
//! `tests/gateway`).

use super::*;

#[test]
fn jwks_keeps_signature_keys_of_the_three_algorithms_only() {
    use base64::Engine;
    let b = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let (n2048, n1024, p32) = (b(&[0xc5; 256]), b(&[0xc5; 128]), b(&[7; 32]));
    // 256 bytes, but the top byte 0x7f: a 2047-bit modulus.
    let mut short = [0xc5; 256];
    short[0] = 0x7f;
    let (n2047, n2048_padded) = (b(&short), b(&[&[0u8][..], &[0x80; 256][..]].concat()));
    let doc = serde_json::json!({"keys": [
        {"kty": "oct", "kid": "hs", "k": b(b"secret")},
        {"kty": "oct", "kid": "padded", "k": "c2VjcmV0MQ=="},
        {"kty": "oct", "kid": "enc", "use": "enc", "k": b(b"secret")},
        {"kty": "oct", "kid": "hs512", "alg": "HS512", "k": b(b"secret")},
        {"kty": "RSA", "kid": "rs", "alg": "RS256", "n": n2048, "e": "AQAB"},
        {"kty": "RSA", "kid": "weak", "n": n1024, "e": "AQAB"},
        {"kty": "RSA", "kid": "weak2047", "n": n2047, "e": "AQAB"},
        {"kty": "RSA", "kid": "rs-padded", "n": n2048_padded, "e": "AQAB"},
        {"kty": "EC", "kid": "es", "crv": "P-256", "x": p32, "y": p32},
        {"kty": "EC", "kid": "p384", "crv": "P-384", "x": b(&[7; 48]), "y": b(&[7; 48])},
        {"kty": "EC", "kid": "short", "crv": "P-256", "x": b(&[7; 31]), "y": p32},
        {"kty": "EC", "kid": "broken"},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": p32},
        "not a key",
    ]});
    let keys = parse_jwks(doc.to_string().as_bytes()).unwrap();
    let got: Vec<(&str, Algorithm)> = keys
        .iter()
        .map(|k| (k.kid.as_deref().unwrap_or(""), k.alg))
        .collect();
    assert_eq!(
        got,
        [
            ("hs", Algorithm::HS256),
            ("padded", Algorithm::HS256),
            ("rs", Algorithm::RS256),
            ("rs-padded", Algorithm::RS256),
            ("es", Algorithm::ES256),
        ]
    );
    assert!(parse_jwks(b"{\"nokeys\": []}").is_err());
}

#[test]
fn constant_time_eq() {
    let a = sha256(b"one");
    assert!(ring_eq(&a, &sha256(b"one")));
    assert!(!ring_eq(&a, &sha256(b"two")));
}
