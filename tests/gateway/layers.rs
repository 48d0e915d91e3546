//! The layering rule (README "Layers"): every module of `src/` belongs to one layer, and a
//! module imports only from its own layer or the layers below it; the module graph has no
//! cycle. The layer map is read from the README's table, so it is written once.
//!
//! A module is a top-level file or folder of `src/` (`upstream/h1.rs` belongs to `upstream`);
//! an import is any `crate::<module>` path in its code (`use` lines, grouped `use crate::{…}`
//! and inline paths), comments left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → layer number, from the README's "Layers" table: rows `| L<n> … | `a`, `b` … |`.
fn layer_map(readme: &str) -> BTreeMap<String, u32> {
    let mut map = BTreeMap::new();
    let Some(start) = readme.find("### Layers") else {
        return map;
    };
    for line in readme[start..].lines().skip(1) {
        if line.starts_with("### ") {
            break;
        }
        let Some(rest) = line.strip_prefix("| L") else {
            continue;
        };
        let Some(n) = rest
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
        else {
            continue;
        };
        let modules = line.rsplit('|').nth(1).unwrap_or("");
        for m in modules.split('`').skip(1).step_by(2) {
            map.insert(m.to_string(), n);
        }
    }
    map
}

/// Removes `//` comments (line, doc and inner doc) so prose naming a module is no import.
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|l| match l.find("//") {
            // `//` inside a string literal is rare in this codebase's imports; a line whose
            // code part holds `"` before the comment is kept whole to stay safe.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a file's code names through `crate::`.
fn imports(src: &str) -> BTreeSet<String> {
    let code = strip_comments(src);
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_first(&item, &mut out);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            push_first(&item, &mut out);
        } else {
            push_first(rest, &mut out);
        }
    }
    out
}

fn push_first(path: &str, out: &mut BTreeSet<String>) {
    let first: String = path
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if !first.is_empty() {
        out.insert(first);
    }
}

/// The module a file belongs to: its top-level file or folder under `src/`.
fn module_of(rel: &str) -> String {
    let first = rel.split('/').next().unwrap_or(rel);
    first.trim_end_matches(".rs").to_string()
}

/// Every rule broken by `files` (path relative to `src/`, source) under `layers`, one line
/// each, naming the file and the import.
fn violations(files: &[(String, String)], layers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut out = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, src) in files {
        let module = module_of(rel);
        // `lib.rs` is the crate root (the faces' layer); `main.rs` is another crate.
        if module == "main" {
            continue;
        }
        let Some(&own) = layers.get(&module) else {
            out.push(format!(
                "src/{rel}: module `{module}` is in no layer of README's \"Layers\" table"
            ));
            continue;
        };
        for import in imports(src) {
            if import == module {
                continue;
            }
            // Names re-exported at the crate root (`crate::State`) are the root's.
            let target = if import.starts_with(char::is_uppercase) {
                "lib".to_string()
            } else {
                import.clone()
            };
            match layers.get(&target) {
                None => out.push(format!(
                    "src/{rel}: imports `crate::{import}`, which is in no layer"
                )),
                Some(&theirs) if theirs > own => out.push(format!(
                    "src/{rel}: `{module}` (L{own}) imports `crate::{import}` (L{theirs}), a higher layer"
                )),
                Some(_) => {}
            }
            graph.entry(module.clone()).or_default().insert(target);
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        out.push(format!("import cycle: {}", cycle.join(" -> ")));
    }
    out
}

/// One cycle of the module graph, if any (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn read_src(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src/")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_src(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(base).expect("under src/");
            let text = std::fs::read_to_string(&p).expect("read source");
            out.push((rel.to_string_lossy().replace('\\', "/"), text));
        }
    }
}

#[test]
fn modules_import_only_from_their_layer_or_below() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let layers = layer_map(&readme);
    assert!(
        layers.len() >= 20,
        "README's \"### Layers\" table lists too few modules: {layers:?}"
    );
    let mut files = Vec::new();
    read_src(&root.join("src"), &root.join("src"), &mut files);
    assert!(files.len() > 30, "read {} files under src/", files.len());
    let found = violations(&files, &layers);
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

/// The test of the test: an upward import, a module outside the map and a cycle are each
/// found and named.
#[test]
fn the_layering_check_names_what_breaks_it() {
    let readme = "## Architecture\n### Layers\n\n| layer | modules |\n|---|---|\n\
                  | L0 leaves | `error`, `config` |\n| L1 vocabulary | `protocol` |\n\
                  | L2 transports | `upstream`, `cache` |\n| L5 faces | `lib`, `server` |\n\
                  ### Next\n| L3 x | `ignored` |\n";
    let layers = layer_map(readme);
    assert_eq!(layers.get("upstream"), Some(&2));
    assert_eq!(
        layers.get("ignored"),
        None,
        "the table ends at the next heading"
    );
    let file = |p: &str, s: &str| (p.to_string(), s.to_string());
    let clean = vec![
        file(
            "error.rs",
            "//! uses crate::server in prose only\nuse std::fmt;",
        ),
        file("protocol.rs", "use crate::{error::GatewayError, config};"),
        file(
            "upstream/h1.rs",
            "use crate::protocol;\nfn f() { crate::cache::x(); }",
        ),
        file("cache.rs", "use crate::protocol::Kind;"),
        file("lib.rs", "pub mod server; use crate::upstream::h1;"),
        file("server/mod.rs", "use crate::State; use crate::upstream;"),
    ];
    assert_eq!(violations(&clean, &layers), Vec::<String>::new());

    let mut upward = clean.clone();
    upward.push(file(
        "upstream/http.rs",
        "use crate::{protocol, server::{self, PeerAddr}};",
    ));
    let found = violations(&upward, &layers);
    assert!(
        found.iter().any(|v| v.contains("src/upstream/http.rs")
            && v.contains("crate::server")
            && v.contains("higher layer")),
        "{found:?}"
    );

    let mut unmapped = clean.clone();
    unmapped.push(file("stray.rs", "use crate::error;"));
    let found = violations(&unmapped, &layers);
    assert!(
        found
            .iter()
            .any(|v| v.contains("src/stray.rs") && v.contains("no layer")),
        "{found:?}"
    );

    let mut cyclic = clean;
    cyclic.push(file("upstream/mod.rs", "use crate::cache;"));
    cyclic.push(file("cache/store.rs", "use crate::upstream::Reply;"));
    let found = violations(&cyclic, &layers);
    assert!(
        found.iter().any(|v| v.starts_with("import cycle")
            && v.contains("cache")
            && v.contains("upstream")),
        "{found:?}"
    );
}
