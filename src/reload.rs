//! Hot reload: on SIGHUP, and when the config file's content changes (checked every second),
//! the file goes through the same steps as at startup — load → parse → validate →
//! `State::build` — and the new state is swapped in atomically.
//!
//! Requests already running keep the `Arc<State>` they started with and finish on it; the old
//! generation's upstream resources (stdio children, legacy sessions) are released once the last
//! of them is done, or after the drain time. An invalid file changes nothing: the old config
//! stays and the log says why. Rate-limit buckets whose rate is unchanged carry over (a reload
//! must not refill them), as do tokens exchanged for callers (RFC 8693) under an unchanged
//! exchange. The listener, TLS and HTTP/1 limits are bound at startup; a change
//! to `[server]` needs a restart (logged). What is refused for a listener at startup is refused
//! for it on reload too, judged by the address it is bound to until the restart: `[auth] mode =
//! "none"` on a listener that is not loopback, an admin listener that is not loopback without a
//! token (fail closed: README "Security model").

use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config;
use crate::metrics::Metrics;
use crate::state::State;

/// How often the file is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Watches `path` and SIGHUP until aborted.
pub async fn watch(path: PathBuf, shared: Arc<ArcSwap<State>>) {
    let mut last = std::fs::read(&path).ok();
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hup.as_mut() {
                Some(h) => h.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<bool>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            s = signalled => s,
        };
        let now = std::fs::read(&path).ok();
        if !forced && (now.is_none() || now == last) {
            continue;
        }
        last = now;
        let metrics = shared.load().metrics.clone();
        match reload(&path, &shared, metrics.clone()) {
            Ok(()) => {
                metrics.reload(true);
                tracing::info!(path = %path.display(), "config reloaded");
            }
            Err(error) => {
                metrics.reload(false);
                tracing::error!(path = %path.display(), %error, "config reload failed; keeping the old config");
            }
        }
    }
}

/// One reload: build a new generation from `path` and swap it in. On error nothing changes.
pub fn reload(
    path: &Path,
    shared: &Arc<ArcSwap<State>>,
    metrics: Arc<Metrics>,
) -> Result<(), String> {
    let config = config::load(path).map_err(|e| e.to_string())?;
    let current = shared.load();
    bound_listeners_stay_safe(&config, &current.config)?;
    let old_server = &current.config.server;
    if config.server.listen != old_server.listen
        || config.server.tls_cert != old_server.tls_cert
        || config.server.header_read_timeout_ms != old_server.header_read_timeout_ms
    {
        tracing::warn!("[server] listen/TLS/header limits changed: they apply after a restart");
    }
    let mut state = State::build(config, metrics).map_err(|e| e.to_string())?;
    // A reload is no reason to refill anyone's rate-limit buckets, nor to exchange every
    // caller's token again.
    state.core.auth.carry_over(&current.core.auth);
    let old = shared.swap(Arc::new(state));
    tokio::spawn(retire(old));
    Ok(())
}

/// The listeners keep the addresses they were bound to at startup until a restart, so a new
/// config is judged against those, not against the addresses it names: a reload must not turn
/// `mode = "none"` on for a public client listener, nor leave a public admin listener without a
/// token (or without `[admin]`, whose token it checks).
fn bound_listeners_stay_safe(new: &config::Config, bound: &config::Config) -> Result<(), String> {
    fn loopback(listen: &str) -> bool {
        listen
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback())
    }
    if new.auth.mode == config::AuthMode::None
        && !new.auth.allow_insecure_none
        && !loopback(&bound.server.listen)
    {
        return Err(format!(
            "auth.mode: \"none\" on the client listener bound to {}, which is not loopback \
             (a changed server.listen applies only after a restart)",
            bound.server.listen
        ));
    }
    if let Some(admin) = &bound.admin
        && !loopback(&admin.listen)
        && new.admin.as_ref().is_none_or(|a| a.token.is_none())
    {
        return Err(format!(
            "admin: the admin listener bound to {} is not loopback and needs a token \
             (token_env or token_file); [admin] changes apply only after a restart",
            admin.listen
        ));
    }
    Ok(())
}

/// Releases an old generation once no request holds it any more (or the drain time is over).
async fn retire(old: Arc<State>) {
    let drain = Duration::from_millis(old.config.server.drain_timeout_ms);
    let until = tokio::time::Instant::now() + drain;
    while Arc::strong_count(&old) > 1 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    old.shutdown().await;
}
