//! The configuration's load → parse → validate rules, case by case.

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
    let dup =
        check("[[backends]]\nname='a'\nbuiltin='demo'\n[[backends]]\nname='a'\nbuiltin='demo'\n")
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
    let many = check("[metrics]\nready_min_backends=2\n[[backends]]\nname='a'\nbuiltin='demo'\n")
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
    let on =
        check("[tracing]\notlp_endpoint='http://127.0.0.1:4318'\nsampling_ratio=0.25\n").unwrap();
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
    let two = "[[backends]]\nname='a'\nbuiltin='demo'\n[[backends]]\nname='b'\nbuiltin='demo'\n";
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
    let env = check("[cache]\nredis_url = 'redis://:${PORTICO_SURELY_UNSET_VAR}@x'\n").unwrap_err();
    assert!(
        env.to_string().contains("PORTICO_SURELY_UNSET_VAR"),
        "{env}"
    );
    let local = check("[cache]\nlocal = false\n").unwrap_err();
    assert!(local.to_string().contains("cache.local"), "{local}");
    let timeout = check("[cache]\nredis_url = 'redis://x'\nredis_timeout_ms = 0\n").unwrap_err();
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

/// `[sessions] advertise_url` takes `${VAR}` (each replica names itself from its environment);
/// an unset variable, or what is not an http(s) URL with a host, names the key.
#[test]
fn advertise_url_is_expanded_and_checked() {
    let with = |url: &str| {
        check(&format!(
            "[sessions]\nadvertise_url = \"{url}\"\n[[backends]]\nname='a'\nbuiltin='demo'\n"
        ))
    };
    // cargo sets CARGO_PKG_NAME for the tests it runs.
    let c = with("http://${CARGO_PKG_NAME}:8787").unwrap();
    assert_eq!(
        c.sessions.advertise_url.as_deref(),
        Some("http://portico:8787")
    );
    for bad in [
        "http://${PORTICO_SURELY_UNSET_VAR}:8787",
        "10.0.0.5:8787",
        "ftp://10.0.0.5/",
    ] {
        let err = with(bad).unwrap_err().to_string();
        assert!(err.starts_with("sessions.advertise_url"), "{bad}: {err}");
    }
}

/// The pool's quotas: one per 2026-07-28 context, one per principal's legacy sessions, each at
/// least 1.
#[test]
fn upstream_session_quotas() {
    let b = "[[backends]]\nname='a'\nurl='http://127.0.0.1:1/'\n";
    let c = check(b).unwrap();
    let a = &c.backends[0];
    assert_eq!(
        a.max_upstream_sessions_per_context,
        DEFAULT_MAX_UPSTREAM_SESSIONS_PER_CONTEXT
    );
    assert_eq!(
        a.max_upstream_sessions_per_principal,
        DEFAULT_MAX_UPSTREAM_SESSIONS_PER_PRINCIPAL
    );
    for k in [
        "max_upstream_sessions_per_context",
        "max_upstream_sessions_per_principal",
    ] {
        let e = check(&format!("{b}{k} = 0\n")).unwrap_err();
        assert!(e.to_string().contains(k), "{e}");
    }
}

#[test]
fn sse_sessions_per_principal_is_at_least_one() {
    let c = check("").unwrap();
    assert_eq!(
        c.server.max_sse_sessions_per_principal,
        DEFAULT_MAX_SSE_SESSIONS_PER_PRINCIPAL
    );
    let e = check("[server]\nmax_sse_sessions_per_principal = 0\n").unwrap_err();
    assert!(
        e.to_string().contains("max_sse_sessions_per_principal"),
        "{e}"
    );
}

/// `[backends.token_exchange]` needs JWT auth (the subject token) and a Streamable HTTP
/// backend of a configured era (the `auto` probe has no caller); its defaults are named
/// constants, and a secret without a client id, both secret sources, a bad URL or a zero
/// bound are refused naming the key.
#[test]
fn token_exchange_needs_jwt_and_a_modern_http_backend() {
    let jwt = "[auth]\nmode = 'jwt'\n[auth.jwt]\njwks_file = 'j.json'\n";
    let cfg = |auth: &str, backend: &str, tx: &str| {
        check(&format!(
            "{auth}[[backends]]\nname = 'b'\n{backend}\n[backends.token_exchange]\n\
             token_url = 'https://idp.example/token'\n{tx}\n"
        ))
    };
    let modern = "url = 'http://127.0.0.1:1/mcp'\nprotocol = 'modern'";
    let legacy = "url = 'http://127.0.0.1:1/mcp'\nprotocol = 'legacy'";
    assert!(
        cfg(jwt, legacy, "").is_ok(),
        "an initialize-era HTTP backend"
    );
    let c = cfg(jwt, modern, "").unwrap();
    let tx = c.backends[0].token_exchange.as_ref().unwrap();
    assert_eq!(tx.timeout_ms, DEFAULT_TOKEN_EXCHANGE_TIMEOUT_MS);
    assert_eq!(tx.max_ttl_ms, DEFAULT_TOKEN_EXCHANGE_MAX_TTL_MS);
    for (auth, backend, tx, key) in [
        ("", modern, "", "backends[0].token_exchange"),
        (
            jwt,
            "url = 'http://127.0.0.1:1/mcp'",
            "",
            "backends[0].token_exchange",
        ),
        (jwt, "command = ['srv']", "", "backends[0].token_exchange"),
        (
            jwt,
            "url = 'http://127.0.0.1:1/sse'\ntransport = 'sse'",
            "",
            "backends[0].token_exchange",
        ),
        (
            jwt,
            modern,
            "client_secret_env = 'X'",
            "backends[0].token_exchange.client_id",
        ),
        (
            jwt,
            modern,
            "client_id = 'p'\nclient_secret_env = 'X'\nclient_secret_file = 'f'",
            "backends[0].token_exchange.client_secret_env",
        ),
        (
            jwt,
            modern,
            "timeout_ms = 0",
            "backends[0].token_exchange.timeout_ms",
        ),
    ] {
        let err = cfg(auth, backend, tx).unwrap_err().to_string();
        assert!(err.contains(key), "{backend} {tx}: {err}");
    }
    let bad_url = check(&format!(
        "{jwt}[[backends]]\nname = 'b'\n{modern}\n[backends.token_exchange]\ntoken_url = 'idp/token'\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        bad_url.starts_with("backends[0].token_exchange.token_url"),
        "{bad_url}"
    );
}
