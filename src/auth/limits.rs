//! Rate limits, keyed by principal: the caller's own bucket (`[auth] rate_limit`, or its team's
//! `rate_limit`), charged once per client request, and per-tool buckets
//! (`[[auth.tool_limits]]`), charged once per `tools/call` of a tool a rule names.
//!
//! Why per tool: one rate for everything a principal does is either too tight for cheap calls
//! (lists, reads) or too loose for the expensive or dangerous ones (a deploy, a bulk delete, a
//! paid API). A rule's globs are matched against the name the client sees — the same names as
//! the team policy (`policy`), so a rule on `github__create_*` holds on an aggregated endpoint
//! and not on another member whose tool happens to share the bare name.
//!
//! Invariants:
//! - Buckets are per principal (anonymous callers share one): re-initializing a session or
//!   opening another never yields a fresh bucket.
//! - A rule is only ever applied to a parsed, header-checked body: for a caller some rule
//!   covers, `can_pass_through` is false (as for a tool policy), so a forged `Mcp-Name` or
//!   `Mcp-Method` cannot slip a call past it.
//! - Memory is bounded: a limiter past `MAX_BUCKETS` principals forgets those whose bucket is
//!   full again.
//! - A config reload keeps the buckets of every rate it does not change ([`Limits::keep_from`]):
//!   a reload (often a deploy) must not hand every caller a fresh burst.

use crate::config::{AuthConfig, RateLimitConfig};
use crate::error::GatewayError;
use crate::policy::glob;

use super::Principal;
use std::collections::HashMap;
use std::sync::Arc;

/// Principals tracked per limiter before those whose state is back to full are forgotten
/// (bounds memory under many JWT subjects).
const MAX_BUCKETS: usize = 100_000;

/// One rate: a GCRA limiter (the `governor` crate) keyed by principal, with the rate it was
/// built for. Shared (`Arc`) so that a reload that keeps the rate keeps its buckets.
#[derive(Clone)]
struct Limiter {
    rate: RateLimitConfig,
    buckets: Arc<governor::DefaultKeyedRateLimiter<String>>,
}

/// A limiter for `rate` (`per_second` may be fractional; `burst` at least 1).
fn limiter(rate: &RateLimitConfig) -> Limiter {
    let period = std::time::Duration::from_secs_f64(1.0 / rate.per_second.max(1e-9));
    let burst = std::num::NonZeroU32::new(rate.burst.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    let quota = governor::Quota::with_period(period)
        .unwrap_or_else(|| governor::Quota::per_second(std::num::NonZeroU32::MIN))
        .allow_burst(burst);
    Limiter {
        rate: *rate,
        buckets: Arc::new(governor::RateLimiter::keyed(quota)),
    }
}

impl Limiter {
    /// The previous generation's buckets, when `old` was built for the same rate.
    fn keep_from(&mut self, old: &Limiter) {
        if self.rate == old.rate {
            self.buckets = old.buckets.clone();
        }
    }
}

/// Takes one token from `key`'s bucket, or says how many whole seconds to wait (at least 1).
fn take(limiter: &Limiter, key: &str) -> Result<(), u64> {
    let limiter = &limiter.buckets;
    if limiter.len() >= MAX_BUCKETS {
        limiter.retain_recent();
    }
    limiter.check_key(&key.to_string()).map_err(|not_until| {
        use governor::clock::Clock;
        let wait = not_until.wait_time_from(governor::clock::DefaultClock::default().now());
        wait.as_secs_f64().ceil().max(1.0) as u64
    })
}

/// One `[[auth.tool_limits]]` rule.
struct ToolLimit {
    tools: Vec<String>,
    /// Empty: every caller.
    teams: Vec<String>,
    limiter: Limiter,
}

impl ToolLimit {
    fn covers_caller(&self, team: Option<&str>) -> bool {
        self.teams.is_empty() || team.is_some_and(|t| self.teams.iter().any(|x| x == t))
    }
}

/// The rate limits of one config generation.
pub(super) struct Limits {
    /// `[auth] rate_limit`, and one per team with its own `rate_limit`.
    default: Option<Limiter>,
    teams: HashMap<String, Limiter>,
    tools: Vec<ToolLimit>,
}

fn key(principal: Option<&Principal>) -> &str {
    principal.map(|p| p.id.as_str()).unwrap_or("")
}

fn team(principal: Option<&Principal>) -> Option<&str> {
    principal.and_then(|p| p.team.as_deref())
}

impl Limits {
    pub(super) fn new(cfg: &AuthConfig) -> Limits {
        Limits {
            default: cfg.rate_limit.as_ref().map(limiter),
            teams: cfg
                .teams
                .iter()
                .filter_map(|t| Some((t.name.clone(), limiter(t.rate_limit.as_ref()?))))
                .collect(),
            tools: cfg
                .tool_limits
                .iter()
                .map(|l| ToolLimit {
                    tools: l.tools.clone(),
                    teams: l.teams.clone(),
                    limiter: limiter(&l.rate_limit),
                })
                .collect(),
        }
    }

    /// After a reload: the buckets of the previous generation `old` for every rate this one
    /// keeps — `[auth] rate_limit` unchanged, a team's by name, a tool rule with the same
    /// tools, teams and rate (each old rule's buckets go to one new rule at most) — so that
    /// nobody's spent tokens come back with a reload. A changed rate starts afresh.
    pub(super) fn keep_from(&mut self, old: &Limits) {
        if let (Some(new), Some(old)) = (self.default.as_mut(), old.default.as_ref()) {
            new.keep_from(old);
        }
        for (name, new) in &mut self.teams {
            if let Some(old) = old.teams.get(name) {
                new.keep_from(old);
            }
        }
        let mut taken = vec![false; old.tools.len()];
        for new in &mut self.tools {
            let same = old.tools.iter().enumerate().position(|(i, o)| {
                !taken[i]
                    && o.tools == new.tools
                    && o.teams == new.teams
                    && o.limiter.rate == new.limiter.rate
            });
            if let Some(i) = same {
                taken[i] = true;
                new.limiter.keep_from(&old.tools[i].limiter);
            }
        }
    }

    /// Takes one token from the caller's own bucket.
    pub(super) fn charge(&self, principal: Option<&Principal>) -> Result<(), GatewayError> {
        let Some(limiter) = team(principal)
            .and_then(|t| self.teams.get(t))
            .or(self.default.as_ref())
        else {
            return Ok(());
        };
        take(limiter, key(principal))
            .map_err(|retry_after_s| GatewayError::RateLimited { retry_after_s })
    }

    /// Whether some tool rule covers the caller (its `tools/call` bodies must then be read).
    pub(super) fn covers(&self, principal: Option<&Principal>) -> bool {
        let team = team(principal);
        self.tools.iter().any(|l| l.covers_caller(team))
    }

    /// Takes one token from each of the caller's buckets whose rule names `tool` (the name the
    /// client sees), in the order of the rules; refused at the first one that is empty (the
    /// tokens taken before it stay taken, as with any refused request's).
    pub(super) fn charge_tool(
        &self,
        principal: Option<&Principal>,
        tool: &str,
    ) -> Result<(), GatewayError> {
        let team = team(principal);
        for l in &self.tools {
            if l.covers_caller(team) && l.tools.iter().any(|g| glob(g, tool)) {
                take(&l.limiter, key(principal)).map_err(|retry_after_s| {
                    GatewayError::ToolRateLimited {
                        tool: tool.to_string(),
                        retry_after_s,
                    }
                })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(id: &str, team: Option<&str>) -> Principal {
        Principal {
            id: id.into(),
            team: team.map(Into::into),
        }
    }

    fn limits(toml_rules: &str) -> Limits {
        let cfg: AuthConfig = toml::from_str(toml_rules).unwrap();
        Limits::new(&cfg)
    }

    #[test]
    fn a_tool_rule_has_a_bucket_per_principal_and_names_what_it_refused() {
        let l = limits(
            "[[tool_limits]]\ntools = ['gh__create_*', 'deploy']\nrate_limit = { per_second = 0.001, burst = 2 }\n",
        );
        let (alice, bob) = (principal("alice", None), principal("bob", None));
        assert!(l.covers(Some(&alice)) && l.covers(None));
        for _ in 0..2 {
            l.charge_tool(Some(&alice), "gh__create_issue").unwrap();
        }
        // Other tools are not counted; the rule's other glob shares the bucket.
        l.charge_tool(Some(&alice), "gh__list_issues").unwrap();
        let e = l.charge_tool(Some(&alice), "deploy").unwrap_err();
        assert!(
            matches!(&e, GatewayError::ToolRateLimited { tool, retry_after_s }
                if tool == "deploy" && *retry_after_s >= 1),
            "{e:?}"
        );
        // Bob's bucket is his own.
        l.charge_tool(Some(&bob), "deploy").unwrap();
        // No `[auth] rate_limit`: the caller's own bucket is unlimited.
        for _ in 0..10 {
            l.charge(Some(&alice)).unwrap();
        }
    }

    /// A reload keeps the buckets of every rate it does not change, and only those.
    #[test]
    fn a_reload_keeps_the_buckets_of_unchanged_rates() {
        let slow = "{ per_second = 0.001, burst = 1 }";
        let cfg = |default: &str, tool_burst: u32| {
            format!(
                "rate_limit = {default}\n\
                 [[teams]]\nname = 'red'\nrate_limit = {slow}\n\
                 [[tool_limits]]\ntools = ['deploy']\nrate_limit = {{ per_second = 0.001, burst = {tool_burst} }}\n\
                 [[tool_limits]]\ntools = ['deploy']\nrate_limit = {{ per_second = 0.001, burst = {tool_burst} }}\n"
            )
        };
        let old = limits(&cfg(slow, 1));
        let (alice, red) = (principal("alice", None), principal("r", Some("red")));
        old.charge(Some(&alice)).unwrap();
        old.charge(Some(&red)).unwrap();
        // Both identical rules charged: each has its own bucket.
        old.charge_tool(Some(&alice), "deploy").unwrap();

        let mut same = limits(&cfg(slow, 1));
        same.keep_from(&old);
        assert!(
            same.charge(Some(&alice)).is_err(),
            "the default's bucket kept"
        );
        assert!(same.charge(Some(&red)).is_err(), "the team's bucket kept");
        assert!(same.charge_tool(Some(&alice), "deploy").is_err());
        // Kept, not copied: the old generation's still-running requests share them.
        assert!(old.charge(Some(&principal("bob", None))).is_ok());
        assert!(same.charge(Some(&principal("bob", None))).is_err());

        let mut changed = limits(&cfg("{ per_second = 0.001, burst = 2 }", 2));
        changed.keep_from(&same);
        assert!(
            changed.charge(Some(&alice)).is_ok(),
            "a new rate, new buckets"
        );
        assert!(
            changed.charge(Some(&red)).is_err(),
            "the team's rate unchanged"
        );
        assert!(changed.charge_tool(Some(&alice), "deploy").is_ok());
    }

    #[test]
    fn a_rule_for_some_teams_leaves_the_others_alone() {
        let l = limits(
            "[[tool_limits]]\ntools = ['*']\nteams = ['red']\nrate_limit = { per_second = 0.001, burst = 1 }\n",
        );
        let (red, blue) = (principal("r", Some("red")), principal("b", Some("blue")));
        assert!(l.covers(Some(&red)));
        assert!(!l.covers(Some(&blue)) && !l.covers(None));
        l.charge_tool(Some(&red), "x").unwrap();
        assert!(l.charge_tool(Some(&red), "x").is_err());
        for _ in 0..3 {
            l.charge_tool(Some(&blue), "x").unwrap();
            l.charge_tool(None, "x").unwrap();
        }
    }
}
