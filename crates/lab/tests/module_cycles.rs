//! No import cycles among the modules of the lab crates (crates/lab,
//! crates/lab-report, crates/lab-results): a module that imports another,
//! directly or through others, must not be imported back by it. Cargo
//! forbids such cycles between crates; inside a crate nothing does, and
//! the lab grew a 17-file circle (cleanup named ssh hosts and runner
//! scripts, so everything reached everything). This test reads every .rs
//! file under their src/, as `readme_layout` reads the manifests, builds
//! the graph of file modules from the paths the code names (`use`
//! trees and paths written inline: `crate::…`, `super::…`, `self::…` and a
//! child module's name), and fails naming each cycle.
//!
//! The crate root (lib.rs) counts like any module: its entry point and
//! re-exports may import the modules it declares, and modules may use
//! items the root holds, but not a module the root imports (directly or
//! through others).
//!
//! A `mod` declaration is not an import: it places the file in the tree
//! (which is how the paths are resolved), and a child naming its parent
//! (`use super::Protocol`) is the usual direction. The parent naming the
//! child back (a dispatch over its children's items) is a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The lab crates: every `crates/lab*` with a src/.
fn lab_crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(crates_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("lab"))
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    v.sort();
    v
}

/// A token of Rust source, as far as paths need: identifiers and the
/// punctuation of paths and `use` trees. Comments, strings and chars are
/// dropped, so a path in a doc comment or a message is no import.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

fn lex(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    let ident_char = |c: u8| c == b'_' || c.is_ascii_alphanumeric();
    while i < b.len() {
        let c = b[i];
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && {
            let mut j = i + 1;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            b.get(j) == Some(&b'"')
        } {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push(Tok::Other);
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Other);
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                // A lifetime, or a multi-byte char: skip the quote only.
                let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch_len) == Some(&b'\'') {
                    i += 2 + ch_len;
                } else {
                    i += 1;
                    while i < b.len() && ident_char(b[i]) {
                        i += 1;
                    }
                }
            }
            out.push(Tok::Other);
        } else if ident_char(c) {
            let s = i;
            while i < b.len() && ident_char(b[i]) {
                i += 1;
            }
            let word = &src[s..i];
            // `r#ident` is the identifier.
            out.push(if c.is_ascii_digit() { Tok::Other } else { Tok::Ident(word.to_string()) });
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"::") {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(match c {
                b'{' => Tok::Open,
                b'}' => Tok::Close,
                b',' => Tok::Comma,
                b';' => Tok::Semi,
                b'*' => Tok::Star,
                _ => Tok::Other,
            });
            i += if c.is_ascii() { 1 } else { src[i..].chars().next().unwrap().len_utf8() };
        }
    }
    out
}

/// One file of a crate: its module path (`[]` for the crate root).
struct File {
    path: PathBuf,
    module: Vec<String>,
}

fn files_of(src: &Path) -> Vec<File> {
    let mut out = vec![];
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut module: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                if matches!(module.last().map(String::as_str), Some("lib" | "main" | "mod")) {
                    module.pop();
                }
                out.push(File { path: p, module });
            }
        }
    }
    out.sort_by(|a, b| a.module.cmp(&b.module));
    out
}

/// Expand a `use` tree starting at `toks[i]` (after `use`) into its paths;
/// returns the index after the tree.
fn use_tree(toks: &[Tok], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                // `as NAME` renames the last segment, not a path.
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    i += 2;
                }
            }
            Some(Tok::PathSep) => i += 1,
            Some(Tok::Star) => i += 1,
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, path.clone(), out),
                    }
                }
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// The module paths a file names, each resolved against the module the
/// path is written in (an inline `mod tests { use super::*; }` names its
/// own file).
fn named_paths(toks: &[Tok], file_module: &[String], children: &BTreeMap<Vec<String>, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut resolved = vec![];
    // The inline modules we are in, with the brace depth each opened at.
    let mut inline: Vec<(String, usize)> = vec![];
    let mut depth = 0usize;
    let mut i = 0;
    let current = |inline: &[(String, usize)]| -> Vec<String> {
        file_module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect()
    };
    let resolve = |here: &[String], path: &[String]| -> Option<Vec<String>> {
        let mut base: Vec<String> = here.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) if children.get(here).is_some_and(|c| c.contains(first)) => {}
            _ => return None,
        }
        Some(base.into_iter().chain(rest.iter().cloned()).collect())
    };
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) = (toks.get(i + 1), toks.get(i + 2)) {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(k) if k == "use" => {
                let mut paths = vec![];
                let next = use_tree(toks, i + 1, vec![], &mut paths);
                let here = current(&inline);
                resolved.extend(paths.iter().filter_map(|p| resolve(&here, p)));
                i = next.max(i + 1);
                continue;
            }
            Tok::Ident(first) if i == 0 || toks[i - 1] != Tok::PathSep => {
                if toks.get(i + 1) == Some(&Tok::PathSep) {
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::PathSep) {
                        match toks.get(j + 1) {
                            Some(Tok::Ident(s)) => path.push(s.clone()),
                            _ => break,
                        }
                        j += 2;
                    }
                    if let Some(p) = resolve(&current(&inline), &path) {
                        resolved.push(p);
                    }
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    resolved
}

/// The import graph of one crate's file modules: file -> files it names.
fn crate_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = files_of(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for m in &modules {
        if let Some((last, parent)) = m.split_last() {
            children.entry(parent.to_vec()).or_default().insert(last.clone());
        }
    }
    let name = |f: &File| f.path.strip_prefix(crates_dir()).unwrap_or(&f.path).to_string_lossy().into_owned();
    let mut graph = BTreeMap::new();
    for f in &files {
        let src = std::fs::read_to_string(&f.path).unwrap();
        let toks = lex(&src);
        // Inline modules add children the paths may start with.
        let mut children = children.clone();
        for w in toks.windows(3) {
            if let [Tok::Ident(m), Tok::Ident(n), Tok::Open] = w {
                if m == "mod" {
                    children.entry(f.module.clone()).or_default().insert(n.clone());
                }
            }
        }
        let mut edges = BTreeSet::new();
        for p in named_paths(&toks, &f.module, &children) {
            // The file that holds the item: the longest file-module prefix.
            let owner = (0..=p.len()).rev().map(|n| &p[..n]).find(|m| modules.contains(*m));
            if let Some(owner) = owner {
                if owner != f.module.as_slice() {
                    let target = files.iter().find(|g| g.module == owner).unwrap();
                    edges.insert(name(target));
                }
            }
        }
        graph.insert(name(f), edges);
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let l = t.low[w.as_str()].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w.as_str()) {
                let l = t.index[w.as_str()].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = vec![];
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T { g: graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], on: BTreeSet::new(), out: vec![] };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// One concrete circle through `scc`'s first file, for the message.
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>, scc: &[String]) -> Vec<String> {
    let start = &scc[0];
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.as_str()]);
    while let Some(v) = queue.pop_front() {
        for w in &graph[v] {
            if !scc.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![start.clone()];
                let mut at = v;
                while at != start {
                    path.push(at.to_string());
                    at = prev[at];
                }
                path[1..].reverse();
                path.push(start.clone());
                return path;
            }
            if !prev.contains_key(w.as_str()) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a strongly connected component has a circle through each member")
}

fn problems() -> Vec<String> {
    let mut problems = vec![];
    for krate in lab_crates() {
        let graph = crate_graph(&krate.join("src"));
        for scc in cycles(&graph) {
            let circle = a_circle(&graph, &scc);
            let edges: Vec<String> = scc
                .iter()
                .map(|f| {
                    let to: Vec<&str> = graph[f].iter().filter(|t| scc.contains(t)).map(String::as_str).collect();
                    format!("    {f} -> {}", to.join(", "))
                })
                .collect();
            problems.push(format!(
                "import cycle of {} files, e.g. {}\n  its imports inside the cycle:\n{}",
                scc.len(),
                circle.join(" -> "),
                edges.join("\n")
            ));
        }
    }
    problems
}

#[test]
fn no_module_of_the_lab_crates_imports_one_that_imports_it_back() {
    let problems = problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The reader finds what it must: a made-up crate with a cycle through a
/// `use` group, an inline `crate::` path and a parent naming its child.
#[test]
fn the_reader_sees_use_trees_inline_paths_and_children() {
    let dir = std::env::temp_dir().join(format!("bw-lab-module-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("p")).unwrap();
    let write = |f: &str, s: &str| std::fs::write(src.join(f), s).unwrap();
    write("lib.rs", "pub mod a; pub mod b; pub mod p;\n");
    write("a.rs", "use crate::{x, b::{B as Bee}};\n// crate::p::Q is in a comment\nfn f() -> &'static str { \"crate::p\" }\n");
    write("b.rs", "pub struct B; fn g() { let _ = crate::p::Q; }\n#[cfg(test)] mod tests { use super::*; }\n");
    write("p/mod.rs", "pub mod q; pub struct Q; fn h() { q::go() }\n");
    write("p/q.rs", "use super::Q; pub fn go() { crate::a::f(); }\n");
    let graph = crate_graph(&src);
    let edges = |f: &str| -> Vec<String> {
        let key = graph.keys().find(|k| k.ends_with(f)).unwrap();
        graph[key].iter().map(|t| t.rsplit("/src/").next().unwrap().to_string()).collect()
    };
    assert_eq!(edges("/a.rs"), vec!["b.rs", "lib.rs"]);
    assert_eq!(edges("/b.rs"), vec!["p/mod.rs"]);
    assert_eq!(edges("/p/mod.rs"), vec!["p/q.rs"]);
    assert_eq!(edges("/p/q.rs"), vec!["a.rs", "p/mod.rs"]);
    assert_eq!(cycles(&graph).len(), 1);
    assert_eq!(cycles(&graph)[0].len(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}
