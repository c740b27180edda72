//! Every crate of memsight keeps its modules in one direction: no top-level module of a crate
//! imports (through `crate::…`, or `super::…` from a top-level module) one that imports it back,
//! directly or around a circle. Doc comments and the crate root's re-exports are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates' source directories, relative to the workspace root.
const CRATES: &[&str] = &[
    "profiler/src",
    "profiler/format/src",
    "profiler/analysis/src",
    "profiler/sidecar/src",
    "tui/src",
    "integrations/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's top-level module a file belongs to (`None` for the crate root and `main.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Is `file` the top-level module's own file (`x.rs` or `x/mod.rs`), where `super` is the root?
fn is_top_file(src: &Path, file: &Path) -> bool {
    let depth = file.strip_prefix(src).unwrap().components().count();
    depth == 1 || (depth == 2 && file.file_name().is_some_and(|n| n == "mod.rs"))
}

/// Identifiers named right after `prefix` in `code`: `prefix::x` and `prefix::{x, y::z}`.
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let id: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(id);
            }
        } else {
            out.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    out
}

fn graph(root: &Path, krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = root.join(krate);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(!files.is_empty(), "no sources under {}", src.display());
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(from) = module_of(&src, f) else {
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut targets = named_after(&code, "crate::");
        if is_top_file(&src, f) {
            targets.extend(named_after(&code, "super::"));
        }
        for to in targets {
            if to != from && modules.contains(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// A circle through the graph, if there is one.
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_a_circle_of_imports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in CRATES {
        let edges = graph(&root, krate);
        if let Some(c) = circle(&edges) {
            panic!(
                "{krate}: modules import each other in a circle: {}",
                c.join(" → ")
            );
        }
    }
}

#[test]
fn the_checker_sees_a_circle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges
        .entry("session".into())
        .or_default()
        .insert("devices".into());
    edges
        .entry("devices".into())
        .or_default()
        .insert("phases".into());
    assert_eq!(circle(&edges), None);
    edges
        .entry("phases".into())
        .or_default()
        .insert("session".into());
    assert_eq!(
        circle(&edges).unwrap().join(" → "),
        "devices → phases → session → devices"
    );
    assert_eq!(
        named_after("use crate::{a, b::c};\nx::crate::d; crate::e::f", "crate::"),
        ["a", "b", "e"]
    );
}
