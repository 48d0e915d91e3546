//! The tool catalogue of each backend, for the status page, and who may see each tool.
//!
//! Fetched lazily by portico itself rather than copied from client traffic: a `tools/list`
//! that portico relays unread (pass-through, or any list while the cache is off) is never
//! parsed, so "the last list a client got" would be missing exactly where nobody set the cache
//! up. Here the list is always the backend's complete, unfiltered one (every page), which is
//! what the per-team view below must start from.
//!
//! Cost control, because `/status` is read by people and refreshes itself:
//! - a backend is asked only while someone looks (a `/status` or `/status.json` read starts the
//!   fetch; the page shows the result on its next refresh);
//! - at most one fetch per backend at a time, and at most one every [`REFRESH`];
//! - only a backend whose last health check was good and whose era is known (the health
//!   checker probes it first), within `min(timeout_ms, FETCH_TIMEOUT)` for all pages;
//! - bounded: [`MAX_PAGES`] pages, [`MAX_TOOLS`] tools, descriptions cut to
//!   [`MAX_DESCRIPTION`] characters.
//!
//! The fetch sends the backend's configured `headers` only (no client's, no team's
//! `team_headers`), goes around the cache, the breaker and the request metrics, and for an
//! initialize-era backend uses the bridge's upstream session like any client request would.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crate::backend::{Backend, Status, Verdict};
use crate::bridge::{self, Bridged};
use crate::config::TeamConfig;
use crate::protocol::{self, LATEST_VERSION, meta};
pub use crate::stats::{Catalogue, Listing, Tool};
use crate::upstream::{AnswerCheck, Outgoing};

/// A catalogue is fetched again once it is this old (and someone is looking).
pub const REFRESH: Duration = Duration::from_secs(30);
/// Upper bound for one whole fetch (all pages), below the backend's own timeout.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Pages followed per fetch (`nextCursor`), then the list is marked truncated.
const MAX_PAGES: usize = 20;
/// Tools kept per backend, then the list is marked truncated.
const MAX_TOOLS: usize = 2000;
/// Characters of a tool's description kept for display.
const MAX_DESCRIPTION: usize = 160;

/// Where a catalogue stands, as the page says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A list is shown (maybe refreshing in the background).
    Listed,
    /// A fetch is running and nothing was listed yet.
    Fetching,
    /// Not asked: the backend is not up, or its era is not known yet.
    Waiting,
    /// The last attempt failed and nothing was listed before.
    Failed,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Listed => "listed",
            Phase::Fetching => "fetching",
            Phase::Waiting => "waiting",
            Phase::Failed => "failed",
        }
    }
}

impl Catalogue {
    /// What is known now; starts a background fetch of `b` when one is due.
    pub fn view(&self, b: &Arc<Backend>) -> (Listing, Phase) {
        let listing = self.lock().clone();
        let due = listing.attempted.is_none_or(|t| t.elapsed() >= REFRESH);
        let askable = b.health.status() == Status::Up && b.verdict() != Verdict::Unknown;
        if due && askable {
            start(b);
        }
        let fetching = self.fetching.load(Ordering::Acquire);
        let phase = if listing.tools.is_some() {
            Phase::Listed
        } else if fetching {
            Phase::Fetching
        } else if listing.error.is_some() {
            Phase::Failed
        } else {
            Phase::Waiting
        };
        (listing, phase)
    }
}

/// Clears the single-flight flag however the fetch task ends (finished, failed, or dropped
/// with the runtime).
struct Flight(Arc<Backend>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0
            .stats
            .catalogue
            .fetching
            .store(false, Ordering::Release);
    }
}

/// Starts one fetch of `b`'s catalogue unless one is running.
fn start(b: &Arc<Backend>) {
    let cat = &b.stats.catalogue;
    if cat
        .fetching
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    cat.lock().attempted = Some(Instant::now());
    let flight = Flight(b.clone());
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return; // `flight` drops: the flag is cleared
    };
    rt.spawn(async move {
        let b = &flight.0;
        let budget = b.timeout.min(FETCH_TIMEOUT);
        let result = match tokio::time::timeout(budget, fetch_all(b, budget)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no complete answer within {} ms",
                budget.as_millis()
            )),
        };
        let mut listing = b.stats.catalogue.lock();
        match result {
            Ok((tools, truncated)) => {
                // The catalogue is a listing like any other: its names label the per-tool
                // metrics too (`stats::tools`).
                b.stats.tools.learn(tools.iter().map(|t| t.name.as_str()));
                listing.tools = Some(tools.into());
                listing.fetched_at = Some(SystemTime::now());
                listing.truncated = truncated;
                listing.error = None;
            }
            Err(why) => {
                tracing::debug!(backend = %b.name, why = %why, "status: tools/list failed");
                listing.error = Some((SystemTime::now(), why));
            }
        }
    });
}

/// Every page of `b`'s `tools/list`, within the bounds. `true` = truncated.
async fn fetch_all(b: &Arc<Backend>, budget: Duration) -> Result<(Vec<Tool>, bool), String> {
    let deadline = tokio::time::Instant::now() + budget;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let answer = list_page(b, cursor.as_deref(), deadline).await?;
        if let Some(e) = answer.get("error") {
            let message = e["message"].as_str().unwrap_or("(no message)");
            return Err(format!("tools/list answered an error: {message}"));
        }
        let result = &answer["result"];
        let Some(page) = result["tools"].as_array() else {
            return Err("tools/list result has no tools array".into());
        };
        for t in page {
            // A tool without a string name is the backend's bug; clients cannot call it either.
            let Some(name) = t["name"].as_str() else {
                continue;
            };
            if tools.len() == MAX_TOOLS {
                return Ok((tools, true));
            }
            tools.push(Tool {
                name: name.to_string(),
                description: t["description"].as_str().map(short),
            });
        }
        match result["nextCursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
            _ => return Ok((tools, false)),
        }
    }
    Ok((tools, true))
}

/// A description's first line, cut to `MAX_DESCRIPTION` characters.
fn short(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("");
    let mut out: String = line.chars().take(MAX_DESCRIPTION).collect();
    if line.chars().nth(MAX_DESCRIPTION).is_some() || text.trim().lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

/// One `tools/list` page from `b`, by the same transport and era logic a client request takes:
/// the bridge for an initialize-era backend, the message path for the rest.
async fn list_page(
    b: &Arc<Backend>,
    cursor: Option<&str>,
    deadline: tokio::time::Instant,
) -> Result<Value, String> {
    let mut params = json!({"_meta": {
        meta::PROTOCOL_VERSION: LATEST_VERSION,
        meta::CLIENT_CAPABILITIES: {},
    }});
    if let Some(c) = cursor {
        params["cursor"] = Value::from(c);
    }
    let body = Bytes::from(
        json!({"jsonrpc": "2.0", "id": "portico-status", "method": "tools/list", "params": params})
            .to_string(),
    );
    let env = protocol::parse_envelope(&body).map_err(|e| format!("{e:?}"))?;
    let none = HeaderMap::new();
    let verdict = bridge::ensure_verdict(b).await.map_err(|e| e.to_string())?;
    let bridged = if verdict == Verdict::Legacy {
        match bridge::call(
            b,
            &bridge::Owner::portico(),
            &env,
            &body,
            &none,
            &[],
            deadline,
        )
        .await
        .map_err(|e| e.to_string())?
        {
            Bridged::Answer(reply) => Some(reply),
            // Re-probed as modern: nothing was sent; ask on the message path below.
            Bridged::Modern => None,
        }
    } else {
        None
    };
    let reply = match bridged {
        Some(reply) => reply,
        None => {
            let mut extra = crate::step::mirror_headers(&env);
            extra.extend(crate::protocol::header::post_headers());
            b.upstream
                .call(Outgoing {
                    body,
                    client_headers: &none,
                    extra,
                    deadline,
                    check: AnswerCheck::Upstream,
                })
                .await
                .map_err(|e| e.to_string())?
        }
    };
    reply
        .final_response(&b.name, b.cfg.timeout_ms)
        .await
        .map_err(|e| e.to_string())
}

/// Who may see a tool on one route.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Visibility {
    /// Configured teams whose callers see it.
    pub teams: Vec<String>,
    /// Whether callers without a team see it (every caller, with `auth.mode = "none"`).
    pub teamless: bool,
}

/// Who sees tool `name` at `/mcp/<backend>`: the backend's `allow_teams`, then the team's tool
/// globs — the checks `proxy` makes (`Auth::check_team`, `auth::tool_allowed`). With
/// `teams_apply = false` (auth mode none) nobody has a team.
pub fn on_backend(
    teams: &[TeamConfig],
    teams_apply: bool,
    allow_teams: &[String],
    name: &str,
) -> Visibility {
    let admitted = |team: &str| allow_teams.is_empty() || allow_teams.iter().any(|a| a == team);
    Visibility {
        teams: teams
            .iter()
            .filter(|t| teams_apply && admitted(&t.name) && t.tools.allows(name))
            .map(|t| t.name.clone())
            .collect(),
        teamless: allow_teams.is_empty(),
    }
}

/// Who sees a tool exposed as `exposed` on an aggregated endpoint: only the team tool globs
/// (matched against the exposed name) — endpoints have no `allow_teams` of their own, and
/// their members' is not consulted there.
pub fn on_endpoint(teams: &[TeamConfig], teams_apply: bool, exposed: &str) -> Visibility {
    Visibility {
        teams: teams
            .iter()
            .filter(|t| teams_apply && t.tools.allows(exposed))
            .map(|t| t.name.clone())
            .collect(),
        teamless: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ToolFilter;

    fn team(name: &str, allow: &[&str], deny: &[&str]) -> TeamConfig {
        TeamConfig {
            name: name.into(),
            tools: ToolFilter {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            },
            rate_limit: None,
        }
    }

    #[test]
    fn visibility_follows_allow_teams_and_globs() {
        let teams = [
            team("blue", &["git*"], &["*delete*"]),
            team("red", &[], &[]),
            team("green", &[], &["*"]),
        ];
        let v = on_backend(&teams, true, &[], "git_log");
        assert_eq!(v.teams, ["blue", "red"]);
        assert!(v.teamless);
        let v = on_backend(&teams, true, &[], "git_delete_branch");
        assert_eq!(v.teams, ["red"]);
        let v = on_backend(&teams, true, &["blue".into()], "git_log");
        assert_eq!(v.teams, ["blue"]);
        assert!(!v.teamless, "allow_teams shuts out callers without a team");
        let v = on_backend(&teams, false, &[], "git_log");
        assert!(v.teams.is_empty() && v.teamless, "auth none: no teams");
        let v = on_endpoint(&teams, true, "gh__git_log");
        assert_eq!(v.teams, ["red"], "globs match the exposed name");
    }

    #[test]
    fn descriptions_are_cut() {
        assert_eq!(short("  one line  "), "one line");
        assert_eq!(short("first\nsecond"), "first…");
        let long = "é".repeat(MAX_DESCRIPTION + 5);
        assert_eq!(short(&long).chars().count(), MAX_DESCRIPTION + 1);
    }
}
