//! `/status` as HTML: one self-contained document (inline CSS, inline SVG charts, no script,
//! no external asset), readable without JavaScript and refreshing itself every
//! [`REFRESH_SECS`] seconds.
//!
//! Every value that comes from config, a backend or the network (names, tool names and
//! descriptions, error text) goes through [`esc`] before it reaches the document; numbers are
//! formatted here. The page is served under a CSP that allows nothing but the inline
//! stylesheet, so even a missed escape could not run script — but nothing is missed on purpose.

use std::fmt::Write;

use super::{BackendInfo, REFRESH_SECS, Snapshot, ToolInfo, Visibility};
use crate::stats::window::{SLOT_SECS, SLOTS};

/// HTML-escapes text for element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// At most `max` characters of `text` (for table cells; the whole text goes in a `title`).
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.2} ms")
    } else if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

fn fmt_opt_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| "–".to_string(), fmt_ms)
}

fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn fmt_ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => "just now".into(),
        1..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        7200..=172_799 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// `YYYY-MM-DD hh:mm:ss UTC` from Unix milliseconds.
fn fmt_time(unix_ms: u64) -> String {
    let (year, month, day, h, m, s) = crate::logsink::civil(unix_ms / 1000);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02} UTC")
}

const STYLE: &str = r#"
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;--ok:#1a7f37;--okbg:#dafbe1;
--bad:#cf222e;--badbg:#ffebe9;--warn:#9a6700;--warnbg:#fff8c5;--p50:#0969da;--p99:#bc4c00;--link:#0969da}
*{box-sizing:border-box}
body{margin:0;color:var(--fg);background:#fff;
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Liberation Sans","DejaVu Sans",sans-serif}
a{color:var(--link);text-decoration:none}a:hover{text-decoration:underline}
header{padding:14px 28px 12px;background:var(--soft);border-bottom:1px solid var(--line)}
header h1{margin:0;font-size:20px;font-weight:650;display:flex;align-items:center;gap:10px}
header h1 small{font-weight:400;color:var(--muted);font-size:14px}
.meta{margin-top:4px;color:var(--muted);font-size:13px}
.meta b{color:var(--fg);font-weight:600}
main{padding:6px 28px 28px;max-width:1500px}
h2{font-size:16px;margin:26px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:18px 0 6px}
h3 small,.muted{color:var(--muted);font-weight:400}
.tiles{display:flex;flex-wrap:wrap;gap:12px;margin-top:18px}
.tile{border:1px solid var(--line);border-radius:8px;padding:10px 16px;min-width:170px;background:#fff}
.tile .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.tile .v{font-size:24px;font-weight:650;font-variant-numeric:tabular-nums;line-height:1.3}
.tile .s{font-size:12px;color:var(--muted)}
.tile.bad{border-color:#ff8182;background:var(--badbg)}.tile.bad .v{color:var(--bad)}
.tile.warn{border-color:#d4a72c;background:var(--warnbg)}.tile.warn .v{color:var(--warn)}
table{border-collapse:collapse;width:100%;margin:4px 0 8px}
th,td{padding:7px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-size:11.5px;font-weight:600;color:var(--muted);text-transform:uppercase;letter-spacing:.04em;
background:var(--soft);white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.down td{background:#fffafa}
td.name{font-weight:600;white-space:nowrap}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:600;
line-height:20px;white-space:nowrap;border:1px solid transparent}
.b-up,.b-closed{background:var(--okbg);color:var(--ok)}
.b-down,.b-open{background:var(--badbg);color:var(--bad)}
.b-half_open,.b-warn{background:var(--warnbg);color:var(--warn)}
.b-unknown,.b-none{background:var(--soft);color:var(--muted);border-color:var(--line)}
.team{display:inline-block;margin:0 4px 2px 0;padding:0 7px;border-radius:4px;font-size:12px;
background:#ddf4ff;color:#0550ae;line-height:19px}
.team.nt{background:var(--soft);color:var(--muted);border:1px solid var(--line)}
.why{display:block;font-size:12px;color:var(--bad);max-width:340px;overflow-wrap:anywhere}
.sub{display:block;font-size:12px;color:var(--muted)}
code{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;
background:var(--soft);padding:1px 4px;border-radius:4px}
dl.grid{display:grid;grid-template-columns:max-content auto;gap:4px 18px;margin:6px 0}
dl.grid dt{color:var(--muted)}dl.grid dd{margin:0;font-variant-numeric:tabular-nums}
.cols{display:flex;flex-wrap:wrap;gap:12px 56px}
.legend{font-size:12px;color:var(--muted);margin:2px 0 0}
.legend i{display:inline-block;width:16px;height:3px;vertical-align:middle;margin:0 4px 0 12px}
.l50{background:var(--p50)}.l99{background:var(--p99)}.legend i.lerr{background:var(--bad);width:6px;height:6px}
.note{font-size:13px;color:var(--muted);margin:6px 0}
.warn{color:var(--warn)}
svg{display:block}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"#;

/// Renders the whole page.
pub fn render(s: &Snapshot) -> String {
    let mut o = String::with_capacity(32 * 1024);
    let _ = write!(
        o,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>portico status</title><link rel=\"icon\" href=\"data:,\">\
         <style>{STYLE}</style></head><body>"
    );
    header(&mut o, s);
    o.push_str("<main>");
    tiles(&mut o, s);
    backends(&mut o, s);
    endpoints(&mut o, s);
    cache_and_sessions(&mut o, s);
    catalogue(&mut o, s);
    let _ = writeln!(
        o,
        "<footer>Generated {} · all values from this process; the page refreshes every \
         {REFRESH_SECS} s and needs no JavaScript.</footer></main></body></html>",
        fmt_time(s.generated_at_unix_ms)
    );
    o
}

fn header(o: &mut String, s: &Snapshot) {
    let _ = write!(
        o,
        "<header><h1>portico <small>status</small> <span class=\"badge b-none\">v{}</span>",
        esc(s.version)
    );
    if s.draining {
        o.push_str(" <span class=\"badge b-down\">draining</span>");
    }
    let reload = match s.config.last_reload_unix_ms {
        Some(t) => format!("last reload <b>{}</b>", fmt_time(t)),
        None => "last reload <b>never</b> (startup config)".to_string(),
    };
    let _ = write!(
        o,
        "</h1><div class=\"meta\">config generation <b>{}</b>, built {} ({}) · {reload} · \
         auth <b>{}</b> · refreshes every {REFRESH_SECS} s · \
         <a href=\"status.json\">status.json</a> · <a href=\"metrics\">metrics</a></div></header>",
        s.config.generation,
        fmt_time(s.config.built_at_unix_ms),
        fmt_ago(s.config.age_ms),
        esc(s.auth_mode),
    );
}

/// One summary tile; `tone` is `""`, `"warn"` or `"bad"`.
fn tile(o: &mut String, tone: &str, key: &str, value: &str, sub: &str) {
    let _ = write!(
        o,
        "<div class=\"tile {tone}\"><div class=\"k\">{key}</div><div class=\"v\">{value}</div>\
         <div class=\"s\">{sub}</div></div>"
    );
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn tiles(o: &mut String, s: &Snapshot) {
    let total = s.backends.len();
    let requests: u64 = s.backends.iter().map(|b| b.latency.requests).sum();
    let errors: u64 = s.backends.iter().map(|b| b.latency.errors).sum();
    let in_flight: usize = s.backends.iter().map(|b| b.in_flight).sum();
    let open = s.backends.iter().filter(|b| b.breaker.value != 0).count();
    o.push_str("<section class=\"tiles\">");
    tile(
        o,
        if s.backends_up < total { "bad" } else { "" },
        "Backends up",
        &format!("{} / {total}", s.backends_up),
        &if s.backends_up < total {
            format!("{} not up", total - s.backends_up)
        } else {
            "all healthy".to_string()
        },
    );
    tile(
        o,
        if errors > 0 { "warn" } else { "" },
        "Upstream requests · 5 min",
        &requests.to_string(),
        &format!("{errors} failed"),
    );
    tile(
        o,
        if open > 0 { "bad" } else { "" },
        "Open breakers",
        &open.to_string(),
        &format!(
            "{} in flight",
            plural(in_flight as u64, "request", "requests")
        ),
    );
    let ratio = s
        .cache
        .hit_ratio
        .map_or_else(|| "–".to_string(), |r| format!("{:.1} %", r * 100.0));
    tile(
        o,
        "",
        "Cache hit ratio",
        &ratio,
        &format!(
            "{} · {}",
            plural(s.cache.entries, "entry", "entries"),
            fmt_bytes(s.cache.bytes)
        ),
    );
    tile(
        o,
        "",
        "Upstream legacy sessions",
        &s.sessions.upstream_legacy_sessions.to_string(),
        &plural(s.sessions.parked_calls, "parked call", "parked calls"),
    );
    o.push_str("</section>");
}

fn badge(o: &mut String, class: &str, text: &str) {
    let _ = write!(
        o,
        "<span class=\"badge b-{}\">{}</span>",
        esc(class),
        esc(text)
    );
}

fn backends(o: &mut String, s: &Snapshot) {
    o.push_str(
        "<h2 id=\"backends\">Backends</h2><table class=\"backends\"><thead><tr>\
         <th>Backend</th><th>Era</th><th>Transport</th><th>Health</th><th>Breaker</th>\
         <th class=\"num\">In flight</th><th class=\"num\">p50</th><th class=\"num\">p99</th>\
         <th class=\"num\">Req · fail</th><th>Latency, last 5 min (log scale)</th>\
         <th>Last failed request</th></tr></thead><tbody>",
    );
    for b in &s.backends {
        backend_row(o, b);
    }
    o.push_str(
        "</tbody></table><p class=\"legend\">Chart: one point per 10 s\
         <i class=\"l50\"></i>p50<i class=\"l99\"></i>p99\
         <i class=\"lerr\"></i>failed requests in that \
         slot. Upstream time of requests on each backend's own route; cache hits have none.</p>",
    );
}

fn backend_row(o: &mut String, b: &BackendInfo) {
    let _ = write!(
        o,
        "<tr class=\"{}\" id=\"backend-{}\"><td class=\"name\">{}</td><td>",
        if b.health.status == "down" {
            "down"
        } else {
            "ok"
        },
        esc(&b.name),
        esc(&b.name)
    );
    badge(o, "none", b.protocol);
    let _ = write!(o, "</td><td>{}</td><td>", esc(b.transport));
    badge(o, b.health.status, b.health.status);
    match b.health.checked_ms_ago {
        Some(ago) => {
            let _ = write!(o, "<span class=\"sub\">checked {}</span>", fmt_ago(ago));
        }
        None => o.push_str("<span class=\"sub\">not checked yet</span>"),
    }
    if let Some(why) = &b.health.error {
        let _ = write!(
            o,
            "<span class=\"why\" title=\"{}\">{}</span>",
            esc(why),
            esc(&clip(why, 110))
        );
    }
    o.push_str("</td><td>");
    if b.breaker.failures_to_open == 0 {
        badge(o, "unknown", "none");
    } else {
        badge(o, b.breaker.state, &b.breaker.state.replace('_', "-"));
    }
    let limit = if b.max_concurrent > 0 {
        format!("<span class=\"sub\">of {}</span>", b.max_concurrent)
    } else {
        String::new()
    };
    let _ = write!(
        o,
        "</td><td class=\"num\">{}{limit}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
         <td class=\"num\">{} · {}</td><td>",
        b.in_flight,
        fmt_opt_ms(b.latency.p50_ms),
        fmt_opt_ms(b.latency.p99_ms),
        b.latency.requests,
        b.latency.errors,
    );
    chart(o, b);
    o.push_str("</td><td>");
    match &b.last_error {
        Some(e) => {
            let _ = write!(
                o,
                "<code>{}</code><span class=\"sub\">{}</span>",
                esc(e.reason),
                fmt_ago(e.ms_ago)
            );
        }
        None => o.push_str("<span class=\"muted\">none</span>"),
    }
    o.push_str("</td></tr>");
}

/// The per-backend latency chart: p50 and p99 per slot on a log scale, failed-request marks
/// along the bottom. Pure SVG, sized for a table cell.
fn chart(o: &mut String, b: &BackendInfo) {
    const W: f64 = 250.0;
    const H: f64 = 50.0;
    const LEFT: f64 = 52.0;
    const TOP: f64 = 5.0;
    const BOTTOM: f64 = 41.0;
    let slots = &b.latency.slots;
    let values: Vec<f64> = slots
        .iter()
        .flat_map(|s| [s.p50_ms, s.p99_ms])
        .flatten()
        .filter(|v| *v > 0.0)
        .collect();
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"latency of {}\">\
         <title>p50 and p99 per {SLOT_SECS} s over the last {} min</title>\
         <rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\" fill=\"#f6f8fa\" \
         stroke=\"#d1d9e0\" stroke-width=\"1\"/>",
        esc(&b.name),
        SLOTS as u64 * SLOT_SECS / 60,
        W - LEFT - 1.0,
        BOTTOM - TOP,
    );
    if values.is_empty() {
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#59636e\" text-anchor=\"middle\">\
             no upstream traffic</text></svg>",
            (LEFT + W) / 2.0,
            (TOP + BOTTOM) / 2.0 + 4.0
        );
        return;
    }
    let (mut lo, mut hi) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    // At least a factor of 4 between bottom and top, so a flat line sits mid-chart and small
    // jitter does not fill the whole height.
    if hi / lo < 4.0 {
        let mid = (hi * lo).sqrt();
        lo = mid / 2.0;
        hi = mid * 2.0;
    }
    let (llo, lhi) = (lo.ln(), hi.ln());
    let x = |i: usize| LEFT + 3.0 + i as f64 * (W - LEFT - 7.0) / (SLOTS - 1) as f64;
    let y = |v: f64| BOTTOM - 3.0 - (v.ln() - llo) / (lhi - llo) * (BOTTOM - TOP - 6.0);
    let _ = write!(
        o,
        "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#59636e\" text-anchor=\"end\">{}</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#59636e\" text-anchor=\"end\">{}</text>",
        LEFT - 4.0,
        TOP + 8.0,
        fmt_ms(hi),
        LEFT - 4.0,
        BOTTOM,
        fmt_ms(lo),
    );
    for (pick, color, width) in [(0usize, "#0969da", 1.6f64), (1usize, "#bc4c00", 1.6f64)] {
        let value = |i: usize| {
            let s = &slots[i];
            if pick == 0 { s.p50_ms } else { s.p99_ms }
        };
        // Runs of consecutive slots with traffic are lines; a lone slot is a dot.
        let mut i = 0;
        while i < slots.len() {
            if value(i).is_none() {
                i += 1;
                continue;
            }
            let start = i;
            while i < slots.len() && value(i).is_some() {
                i += 1;
            }
            if i - start == 1 {
                if let Some(v) = value(start) {
                    let _ = write!(
                        o,
                        "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{color}\"/>",
                        x(start),
                        y(v)
                    );
                }
                continue;
            }
            let points: Vec<String> = (start..i)
                .filter_map(|j| value(j).map(|v| format!("{:.1},{:.1}", x(j), y(v))))
                .collect();
            let _ = write!(
                o,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" \
                 stroke-width=\"{width}\" stroke-linejoin=\"round\"/>",
                points.join(" ")
            );
        }
    }
    for (i, s) in slots.iter().enumerate() {
        if s.errors > 0 {
            let _ = write!(
                o,
                "<rect x=\"{:.1}\" y=\"{}\" width=\"5\" height=\"5\" fill=\"#cf222e\"/>",
                x(i) - 2.5,
                BOTTOM + 2.5
            );
        }
    }
    o.push_str("</svg>");
}

fn endpoints(o: &mut String, s: &Snapshot) {
    o.push_str("<h2 id=\"endpoints\">Aggregated endpoints</h2>");
    if s.endpoints.is_empty() {
        o.push_str("<p class=\"note\">No <code>[[endpoints]]</code> configured.</p>");
        return;
    }
    o.push_str(
        "<table><thead><tr><th>Path</th><th>Failure mode</th><th>Member</th><th>Health</th>\
         <th>Exposed as</th><th>Tool filter</th></tr></thead><tbody>",
    );
    for ep in &s.endpoints {
        for (i, m) in ep.members.iter().enumerate() {
            o.push_str("<tr>");
            if i == 0 {
                let _ = write!(
                    o,
                    "<td rowspan=\"{n}\"><code>{}</code></td><td rowspan=\"{n}\">{}</td>",
                    esc(&ep.path),
                    esc(ep.failure_mode),
                    n = ep.members.len().max(1)
                );
            }
            let _ = write!(o, "<td class=\"name\">{}", esc(&m.backend));
            if !m.allow_teams.is_empty() {
                let _ = write!(
                    o,
                    "<span class=\"sub\">teams: {}</span>",
                    esc(&m.allow_teams.join(", "))
                );
            }
            o.push_str("</td><td>");
            badge(o, m.health, m.health);
            let exposed = if m.prefix.is_empty() {
                "bare names".to_string()
            } else {
                format!("<code>{}{}*</code>", esc(&m.prefix), esc(&ep.separator))
            };
            let mut filter = String::new();
            if !m.allow.is_empty() {
                let _ = write!(filter, "allow <code>{}</code> ", esc(&m.allow.join(", ")));
            }
            if !m.deny.is_empty() {
                let _ = write!(filter, "deny <code>{}</code>", esc(&m.deny.join(", ")));
            }
            if filter.is_empty() {
                filter.push_str("<span class=\"muted\">every tool</span>");
            }
            let _ = write!(o, "</td><td>{exposed}</td><td>{filter}</td></tr>");
        }
    }
    o.push_str("</tbody></table>");
}

fn cache_and_sessions(o: &mut String, s: &Snapshot) {
    let c = &s.cache;
    o.push_str("<div class=\"cols\"><section><h2 id=\"cache\">Cache</h2><dl class=\"grid\">");
    let mut row = |k: &str, v: String| {
        let _ = write!(o, "<dt>{k}</dt><dd>{v}</dd>");
    };
    row(
        "State",
        if c.enabled { "enabled" } else { "disabled" }.to_string(),
    );
    row("Entries", c.entries.to_string());
    row(
        "Bytes",
        format!(
            "{} <span class=\"muted\">of {} ({:.1} %)</span>",
            fmt_bytes(c.bytes),
            fmt_bytes(c.max_bytes),
            if c.max_bytes > 0 {
                c.bytes as f64 * 100.0 / c.max_bytes as f64
            } else {
                0.0
            }
        ),
    );
    row(
        "Hit ratio",
        c.hit_ratio.map_or_else(
            || "– (no cacheable requests yet)".into(),
            |r| format!("{:.1} %", r * 100.0),
        ),
    );
    row(
        "Lookups",
        format!(
            "{} hit · {} shared hit · {} miss · {} coalesced · {} stale · {} bypass",
            c.hits, c.shared_hits, c.misses, c.coalesced, c.stale, c.bypassed
        ),
    );
    row(
        "Inserts / evictions",
        format!("{} / {}", c.inserts, c.evictions),
    );
    let redis = if !c.redis.configured {
        "<span class=\"muted\">not configured</span>".to_string()
    } else {
        let mut r = format!(
            "configured · {} hit · {} miss · {} writes · {} errors",
            c.redis.hits, c.redis.misses, c.redis.writes, c.redis.errors
        );
        match (&c.redis.last_error, c.redis.last_error_unix_ms) {
            (Some(e), Some(at)) => {
                let _ = write!(
                    r,
                    "<span class=\"why\">last error {}: {}</span>",
                    fmt_time(at),
                    esc(&clip(e, 160))
                );
            }
            _ => r.push_str("<span class=\"sub\">no errors</span>"),
        }
        r
    };
    row("Redis tier", redis);
    o.push_str("</dl></section><section><h2 id=\"sessions\">Sessions</h2><dl class=\"grid\">");
    let ss = &s.sessions;
    let mut row = |k: &str, v: String| {
        let _ = write!(o, "<dt>{k}</dt><dd>{v}</dd>");
    };
    row(
        "Legacy-client sessions",
        match ss.legacy_client_sessions {
            Some(n) => n.to_string(),
            None => "<span class=\"muted\">not counted</span>".into(),
        },
    );
    row(
        "Upstream legacy sessions",
        ss.upstream_legacy_sessions.to_string(),
    );
    row("Parked calls", ss.parked_calls.to_string());
    o.push_str("</dl>");
    for n in &ss.notes {
        let _ = write!(o, "<p class=\"note\">{}</p>", esc(n));
    }
    o.push_str("</section></div>");
}

fn visibility(o: &mut String, v: &Visibility, auth_none: bool) {
    if auth_none {
        o.push_str("<span class=\"muted\">every caller</span>");
        return;
    }
    for t in &v.teams {
        let _ = write!(o, "<span class=\"team\">{}</span>", esc(t));
    }
    if v.teamless {
        o.push_str(
            "<span class=\"team nt\" title=\"callers authenticated without a team\">no team</span>",
        );
    }
    if v.teams.is_empty() && !v.teamless {
        o.push_str("<span class=\"warn\">nobody</span>");
    }
}

fn catalogue(o: &mut String, s: &Snapshot) {
    let auth_none = s.auth_mode == "none";
    o.push_str("<h2 id=\"tools\">Tool catalogue</h2>");
    if auth_none {
        o.push_str(
            "<p class=\"note\">auth mode <code>none</code>: callers have no team, so every \
             caller sees every tool; team tool rules apply once <code>[auth]</code> is on.</p>",
        );
    } else if s.teams.is_empty() {
        o.push_str("<p class=\"note\">No teams configured: no tool rules apply.</p>");
    }
    for b in &s.backends {
        let t = &b.tools;
        let _ = write!(o, "<h3>{} <small>", esc(&b.name));
        match t.state {
            "listed" => {
                let _ = write!(
                    o,
                    "{} tool{}{}",
                    t.tools.len(),
                    if t.tools.len() == 1 { "" } else { "s" },
                    if t.truncated { " (truncated)" } else { "" }
                );
                if let Some(at) = t.fetched_at_unix_ms {
                    let _ = write!(o, " · listed {}", fmt_time(at));
                }
            }
            "fetching" => o.push_str("fetching tools/list…"),
            "failed" => o.push_str("tools/list failed"),
            _ => o.push_str("waiting for the backend to be up and probed"),
        }
        o.push_str("</small></h3>");
        if let Some(e) = &t.error {
            let _ = write!(
                o,
                "<p class=\"note\"><span class=\"why\">last tools/list failed: {}</span></p>",
                esc(&clip(e, 200))
            );
        }
        if t.tools.is_empty() {
            continue;
        }
        let _ = write!(
            o,
            "<table><thead><tr><th>Tool</th><th>Description</th><th>Who sees it at \
             <code>/mcp/{}</code></th><th>Through endpoints</th></tr></thead><tbody>",
            esc(&b.name)
        );
        for tool in &t.tools {
            tool_row(o, tool, auth_none);
        }
        o.push_str("</tbody></table>");
    }
}

fn tool_row(o: &mut String, t: &ToolInfo, auth_none: bool) {
    let _ = write!(
        o,
        "<tr><td><code>{}</code></td><td>{}</td><td>",
        esc(&t.name),
        t.description
            .as_deref()
            .map_or_else(|| "<span class=\"muted\">–</span>".to_string(), esc)
    );
    visibility(o, &t.visible, auth_none);
    o.push_str("</td><td>");
    if t.endpoints.is_empty() {
        o.push_str("<span class=\"muted\">–</span>");
    }
    for e in &t.endpoints {
        match &e.name {
            Some(n) => {
                let _ = write!(
                    o,
                    "<div><code>{}</code> as <code>{}</code> ",
                    esc(&e.path),
                    esc(n)
                );
                visibility(o, &e.visible, auth_none);
                o.push_str("</div>");
            }
            None => {
                let _ = write!(
                    o,
                    "<div><code>{}</code> <span class=\"muted\">hidden by the member's tool \
                     filter</span></div>",
                    esc(&e.path)
                );
            }
        }
    }
    o.push_str("</td></tr>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<img src=x onerror=\"alert('1')\">&"),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"
        );
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(fmt_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(fmt_time(1_796_395_845_000), "2026-12-04 14:50:45 UTC");
        assert_eq!(fmt_ms(0.4231), "0.42 ms");
        assert_eq!(fmt_ms(4.26), "4.3 ms");
        assert_eq!(fmt_ms(1234.0), "1.23 s");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_ago(125_000), "2 min ago");
        assert_eq!(clip("abcdef", 3), "abc…");
    }
}
