//! The tool names a backend listed: the bounded label set of the per-tool metrics
//! (`portico_tool_calls_total`, `portico_tool_call_duration_seconds`; README, "Metrics").
//!
//! A `tools/call` is counted under its tool's name only when the backend has listed that name
//! in a `tools/list` answer portico parsed (the per-backend step's cache and message paths —
//! bridged and aggregated lists included — and the status page's catalogue); any other name is
//! `other`. The name in a call is the client's to choose, so labelling calls by it directly
//! would let a client mint series without end; the backend's own list bounds them, and
//! [`MAX_KNOWN_TOOLS`] bounds a backend that lists without end.

use serde::Deserialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use crate::metrics::{Metrics, ToolSeries};

/// Tool names remembered per backend; past this, newly listed names count as `other`.
pub const MAX_KNOWN_TOOLS: usize = 1000;

/// Longest tool name kept as a label (longer ones count as `other`): well past any real tool
/// name, short enough that [`MAX_KNOWN_TOOLS`] labels stay small.
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// The label of calls to names the backend has not listed.
pub const OTHER: &str = "other";

/// One backend's known tool names and their metric series. Lives in `BackendStats`, so it
/// belongs to one config generation (a reload starts empty, like the cache whose answers fill
/// it).
#[derive(Default)]
pub struct KnownTools {
    /// foldhash: every `tools/call` looks its name up here, and SipHash cost more than the rest
    /// of the lookup. Its per-process random seed keeps lookups of client-chosen names
    /// unpredictable; the backend's list alone decides what is inserted.
    names: RwLock<HashMap<Box<str>, ToolSeries, foldhash::fast::RandomState>>,
    other: ToolSeries,
}

impl KnownTools {
    /// Remembers listed names, within the bounds. Names already known cost a read lock only.
    pub fn learn<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let fresh: Vec<&str> = {
            let known = self.names.read().unwrap_or_else(|p| p.into_inner());
            if known.len() >= MAX_KNOWN_TOOLS {
                return;
            }
            names
                .into_iter()
                .filter(|n| !n.is_empty() && n.len() <= MAX_TOOL_NAME_BYTES)
                .filter(|n| !known.contains_key(*n))
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let mut known = self.names.write().unwrap_or_else(|p| p.into_inner());
        for n in fresh {
            if known.len() >= MAX_KNOWN_TOOLS {
                break;
            }
            known.entry(n.into()).or_default();
        }
    }

    /// Learns the names of one `tools/list` answer (a JSON-RPC response); anything that is not
    /// a list result teaches nothing.
    pub fn learn_list(&self, answer: &[u8]) {
        #[derive(Deserialize)]
        struct Answer<'a> {
            #[serde(borrow)]
            result: Option<Listed<'a>>,
        }
        #[derive(Deserialize)]
        struct Listed<'a> {
            #[serde(borrow, default)]
            tools: Vec<Named<'a>>,
        }
        #[derive(Deserialize)]
        struct Named<'a> {
            #[serde(borrow)]
            name: Cow<'a, str>,
        }
        if let Ok(Answer { result: Some(r) }) = serde_json::from_slice::<Answer<'_>>(answer) {
            self.learn(r.tools.iter().map(|t| &*t.name));
        }
    }

    /// Whether `name` is counted under its own label.
    pub fn knows(&self, name: &str) -> bool {
        let known = self.names.read().unwrap_or_else(|p| p.into_inner());
        known.contains_key(name)
    }

    /// How many names are known.
    pub fn len(&self) -> usize {
        self.names.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records one call of `tool` on `backend`: under its name if known, else `other`.
    pub fn record(
        &self,
        metrics: &Metrics,
        backend: &str,
        tool: &str,
        status: u16,
        took: Duration,
    ) {
        let known = self.names.read().unwrap_or_else(|p| p.into_inner());
        match known.get_key_value(tool) {
            Some((name, series)) => metrics.tool_call(series, backend, name, status, took),
            None => metrics.tool_call(&self.other, backend, OTHER, status, took),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_listed_names_within_bounds() {
        let k = KnownTools::default();
        k.learn_list(br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"echo","inputSchema":{}},{"name":"a\"b"}],"nextCursor":"x"}}"#);
        assert!(k.knows("echo") && k.knows("a\"b"));
        assert!(!k.knows("other_one"));
        // Errors and other shapes teach nothing.
        k.learn_list(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}"#);
        k.learn_list(b"not json");
        assert_eq!(k.len(), 2);
        let long = "x".repeat(MAX_TOOL_NAME_BYTES + 1);
        k.learn([long.as_str(), ""]);
        assert_eq!(k.len(), 2);
        let many: Vec<String> = (0..MAX_KNOWN_TOOLS + 10).map(|i| format!("t{i}")).collect();
        k.learn(many.iter().map(String::as_str));
        assert_eq!(k.len(), MAX_KNOWN_TOOLS);
    }

    #[test]
    fn unknown_names_are_recorded_as_other() {
        let m = Metrics::new();
        let k = KnownTools::default();
        k.learn(["echo"]);
        let ms = Duration::from_millis(1);
        k.record(&m, "b", "echo", 200, ms);
        k.record(&m, "b", "made-up", 200, ms);
        k.record(&m, "b", "made-up-too", 502, ms);
        let text = String::from_utf8(m.render(&crate::metrics::Mirrors {
            backends: Vec::new(),
            cache: Default::default(),
        }))
        .unwrap();
        for line in [
            r#"portico_tool_calls_total{backend="b",outcome="ok",tool="echo"} 1"#,
            r#"portico_tool_calls_total{backend="b",outcome="ok",tool="other"} 1"#,
            r#"portico_tool_calls_total{backend="b",outcome="backend_error",tool="other"} 1"#,
            r#"portico_tool_call_duration_seconds_count{backend="b",tool="other"} 2"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(!text.contains("made-up"), "{text}");
    }
}
