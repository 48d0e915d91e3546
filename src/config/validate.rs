//! The third step of loading a config: rules that span fields or sections (addresses that
//! must differ, names that must resolve, modes that need their keys) and `${ENV}` expansion of
//! the values that may carry secrets. Every error names the key path.

use super::*;

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
    if config.server.max_sse_sessions_per_principal == 0 {
        return Err(invalid(
            "server.max_sse_sessions_per_principal",
            "must be greater than 0 (max_sse_sessions = 0 turns the transport off)",
        ));
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
    if let Some(url) = &config.sessions.advertise_url {
        // Each replica names its own address from its environment (`http://${POD_IP}:8787`
        // in deploy/k8s), so one config serves every replica.
        let url = expand_env(url).map_err(|v| {
            invalid(
                "sessions.advertise_url",
                format!("environment variable {v} is not set"),
            )
        })?;
        let parsed = url.parse::<http::Uri>().ok().filter(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        });
        if parsed.is_none() {
            return Err(invalid(
                "sessions.advertise_url",
                format!("{url:?} is not an http:// or https:// URL with a host"),
            ));
        }
        config.sessions.advertise_url = Some(url);
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
        if b.max_upstream_sessions_per_context == 0 {
            return Err(invalid(
                key("max_upstream_sessions_per_context"),
                "must be greater than 0",
            ));
        }
        if b.max_upstream_sessions_per_principal == 0 {
            return Err(invalid(
                key("max_upstream_sessions_per_principal"),
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
        if let Some(tx) = &b.token_exchange {
            let k = |field: &str| key(&format!("token_exchange.{field}"));
            if b.url.is_none() || b.transport != Transport::Http || b.protocol == Protocol::Auto {
                return Err(invalid(
                    key("token_exchange"),
                    "needs a Streamable HTTP url with protocol = \"modern\" or \"legacy\" (the \
                     \"auto\" probe has no caller whose token it could carry)",
                ));
            }
            if config.auth.mode != AuthMode::Jwt {
                return Err(invalid(
                    key("token_exchange"),
                    "needs [auth] mode = \"jwt\": the caller's JWT is the subject token",
                ));
            }
            let url = tx.token_url.parse::<http::Uri>().ok();
            if !url.as_ref().is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            }) {
                return Err(invalid(k("token_url"), "want an http:// or https:// URL"));
            }
            if tx.client_secret_env.is_some() && tx.client_secret_file.is_some() {
                return Err(invalid(
                    k("client_secret_env"),
                    "give client_secret_env or client_secret_file, not both",
                ));
            }
            if (tx.client_secret_env.is_some() || tx.client_secret_file.is_some())
                && tx.client_id.is_none()
            {
                return Err(invalid(
                    k("client_id"),
                    "a client secret needs its client_id",
                ));
            }
            if tx.timeout_ms == 0 || tx.max_ttl_ms == 0 {
                return Err(invalid(
                    k("timeout_ms"),
                    "timeout_ms and max_ttl_ms must be greater than 0",
                ));
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
        .chain(
            a.tool_limits
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("auth.tool_limits[{i}].rate_limit"), &l.rate_limit)),
        )
    {
        if !(r.per_second > 0.0 && r.per_second.is_finite()) || r.burst == 0 {
            return Err(invalid(k, "per_second and burst must be greater than 0"));
        }
    }
    for (i, l) in a.tool_limits.iter().enumerate() {
        let k = |f: &str| format!("auth.tool_limits[{i}].{f}");
        if l.tools.is_empty() || l.tools.iter().any(String::is_empty) {
            return Err(invalid(k("tools"), "must name at least one non-empty glob"));
        }
        if let Some(t) = l.teams.iter().find(|t| t.is_empty()) {
            return Err(invalid(k("teams"), format!("{t:?} is not a team name")));
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
