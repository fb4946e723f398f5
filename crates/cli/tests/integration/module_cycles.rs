//! No import cycles among the modules of any crate of the workspace: a
//! module that imports another, directly or through others, must not be
//! imported back by it. Cargo forbids such cycles between crates; inside a
//! crate nothing does, and they grew (the lab's 17-file circle: cleanup
//! named ssh hosts and runner scripts, so everything reached everything;
//! serve's control plane and front-ends; NVMe's command table and the
//! handlers it names). This test reads every .rs file under each
//! `crates/*/src`, as `readme_layout` reads the manifests, builds the graph
//! of file modules from the paths the code names (`use` trees and paths
//! written inline: `crate::…`, `super::…`, `self::…` and a child module's
//! name), and fails naming each cycle, unless [`ALLOWED`] names it with
//! the reason it is inherent.
//!
//! An edge goes to the file that defines what a path names: a path through
//! a re-export (`pub use frame::Mac;` in lib.rs, named as `crate::Mac`)
//! leads on to the file the item comes from (frame.rs), since that is what
//! the code depends on. A re-export is no edge of the file that holds it
//! unless that file's own code names the item too: a crate root that
//! re-exports its modules' items and defines items they use is a facade,
//! not a cycle; one whose own code calls into a module that uses its
//! items is.
//!
//! A `mod` declaration is not an import: it places the file in the tree
//! (which is how the paths are resolved), and a child naming its parent
//! (`use super::Protocol`) is the usual direction. The parent naming the
//! child back (a dispatch over its children's items) is a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A cycle allowed because it is inherent: its files (as the failure
/// names them, `crate/src/…`), exactly, and why.
struct Allowed {
    files: &'static [&'static str],
    why: &'static str,
}

/// The cycles allowed. A cycle that grows or shrinks is no longer the one
/// allowed, and an allowance that matches no cycle fails the test too.
// None today: the last one (serve's control plane with its data path) went
// with the control split into bw-control (issue 50).
const ALLOWED: &[Allowed] = &[];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every crate of the workspace: each `crates/*` with a src/.
pub fn workspace_crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(crates_dir()).unwrap().flatten().map(|e| e.path()).filter(|p| p.join("src").is_dir()).collect();
    v.sort();
    v
}

/// A token of Rust source, as far as paths need: identifiers and the
/// punctuation of paths and `use` trees. Comments, strings and chars are
/// dropped, so a path in a doc comment or a message is no import.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Dot,
    Other,
}

fn lex(src: &str) -> Vec<Tok> {
    lex_at(src).into_iter().map(|(_, t)| t).collect()
}

fn ident_char(c: u8) -> bool {
    c == b'_' || c.is_ascii_alphanumeric()
}

/// The end of the (nested) block comment starting at `i`.
fn block_comment_end(b: &[u8], mut i: usize) -> usize {
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
    i
}

/// The end of a raw string (`r"…"`, `r#"…"#`) starting at `i`, if one does.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    if b[i] != b'r' {
        return None;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let hashes = j - i - 1;
    j += 1;
    let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
    while j < b.len() && !b[j..].starts_with(&close) {
        j += 1;
    }
    Some(j + close.len())
}

/// The end of a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
/// starting at `i`.
fn char_or_lifetime_end(src: &str, mut i: usize) -> usize {
    let b = src.as_bytes();
    if b.get(i + 1) == Some(&b'\\') {
        i += 2;
        while i < b.len() && b[i] != b'\'' {
            i += 1;
        }
        return i + 1;
    }
    if b.get(i + 2) == Some(&b'\'') {
        return i + 3;
    }
    // A lifetime, or a multi-byte char: skip the quote only.
    let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
    if b.get(i + 1 + ch_len) == Some(&b'\'') {
        return i + 2 + ch_len;
    }
    i += 1;
    while i < b.len() && ident_char(b[i]) {
        i += 1;
    }
    i
}

/// The tokens of `src`, each with the byte offset it starts at (for
/// `fn_length`, which counts lines).
pub fn lex_at(src: &str) -> Vec<(usize, Tok)> {
    let b = src.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let (c, start) = (b[i], i);
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = block_comment_end(b, i);
        } else if let Some(end) = raw_string_end(b, i) {
            i = end;
            out.push((start, Tok::Other));
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push((start, Tok::Other));
        } else if c == b'\'' {
            i = char_or_lifetime_end(src, i);
            out.push((start, Tok::Other));
        } else if ident_char(c) {
            while i < b.len() && ident_char(b[i]) {
                i += 1;
            }
            // `r#ident` is the identifier.
            out.push((start, if c.is_ascii_digit() { Tok::Other } else { Tok::Ident(src[start..i].to_string()) }));
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"::") {
            out.push((start, Tok::PathSep));
            i += 2;
        } else {
            out.push((
                start,
                match c {
                    b'{' => Tok::Open,
                    b'}' => Tok::Close,
                    b',' => Tok::Comma,
                    b';' => Tok::Semi,
                    b'*' => Tok::Star,
                    b'.' => Tok::Dot,
                    _ => Tok::Other,
                },
            ));
            i += if c.is_ascii() { 1 } else { src[i..].chars().next().unwrap().len_utf8() };
        }
    }
    out
}

/// One file of a crate: its module path (`[]` for the crate root).
pub struct File {
    pub path: PathBuf,
    module: Vec<String>,
}

pub fn files_of(src: &Path) -> Vec<File> {
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

/// One path of a `use` tree: the path, and the name it brings into scope
/// (its last segment or its `as` rename; `None` for a glob).
struct UsePath {
    path: Vec<String>,
    name: Option<String>,
}

/// Expand a `use` tree starting at `toks[i]` (after `use`) into its paths;
/// returns the index after the tree.
fn use_tree(toks: &[Tok], mut i: usize, prefix: Vec<String>, out: &mut Vec<UsePath>) -> usize {
    let mut path = prefix;
    let mut name = None;
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                name = Some(s.clone());
                i += 1;
                // `as NAME` renames the last segment: not a path.
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(alias)) = toks.get(i + 1) {
                        name = Some(alias.clone());
                    }
                    i += 2;
                }
            }
            Some(Tok::PathSep) => i += 1,
            Some(Tok::Star) => {
                name = None;
                i += 1;
            }
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
                // `self` in a group names the module the group is in.
                if path.last().is_some_and(|s| s == "self") && path.len() > 1 {
                    path.pop();
                    name = path.last().cloned();
                }
                out.push(UsePath { path, name });
                return i;
            }
        }
    }
}

/// A path a file names, resolved to a module path of the crate; `reexport`
/// is the name a `pub use` (of any visibility wider than the module's)
/// makes it known by, from the file that holds it.
struct Named {
    path: Vec<String>,
    reexport: Option<String>,
    /// Named in a `use` (private or public): a path others may reach
    /// through the file that holds it.
    imported_as: Option<String>,
}

/// The module paths a file names, each resolved against the module the
/// path is written in (an inline `mod tests { use super::*; }` names its
/// own file).
fn named_paths(toks: &[Tok], file_module: &[String], children: &BTreeMap<Vec<String>, BTreeSet<String>>) -> Vec<Named> {
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
                // `pub use` or `pub(crate) use` (`pub`, `(`, `crate`, `)`).
                let public = |j: usize| i >= j && toks[i - j] == Tok::Ident("pub".into());
                let reexport = public(1) || (public(4) && toks[i - 1] == Tok::Other);
                let mut paths = vec![];
                let next = use_tree(toks, i + 1, vec![], &mut paths);
                let here = current(&inline);
                // (A `use` in an inline module is that module's: not the
                // file's to re-export.)
                let at_file_level = inline.is_empty();
                for u in paths {
                    if let Some(path) = resolve(&here, &u.path) {
                        let imported_as = u.name.filter(|_| at_file_level);
                        resolved.push(Named { path, reexport: imported_as.clone().filter(|_| reexport), imported_as });
                    }
                }
                i = next.max(i + 1);
                continue;
            }
            Tok::Ident(first) if (i == 0 || toks[i - 1] != Tok::PathSep) && toks.get(i + 1) == Some(&Tok::PathSep) => {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::PathSep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(s)) => path.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                if let Some(path) = resolve(&current(&inline), &path) {
                    resolved.push(Named { path, reexport: None, imported_as: None });
                }
                i = j;
                continue;
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
    // Every file's tokens and named paths first: a path may lead through
    // another file's `use`.
    let mut read = vec![];
    // (file module, name it imports) -> the path it stands for.
    let mut imports: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
    for f in &files {
        let toks = lex(&std::fs::read_to_string(&f.path).unwrap());
        // Inline modules add children the paths may start with.
        let mut children = children.clone();
        for w in toks.windows(3) {
            if let [Tok::Ident(m), Tok::Ident(n), Tok::Open] = w {
                if m == "mod" {
                    children.entry(f.module.clone()).or_default().insert(n.clone());
                }
            }
        }
        let named = named_paths(&toks, &f.module, &children);
        for n in &named {
            if let Some(as_name) = &n.imported_as {
                imports.insert((f.module.clone(), as_name.clone()), n.path.clone());
            }
        }
        read.push((toks, named));
    }
    let owner = |p: &[String]| (0..=p.len()).rev().map(|n| p[..n].to_vec()).find(|m| modules.contains(m));
    // The file that defines what `p` names: the longest file-module
    // prefix, followed through the `use` items of the files on the way.
    let defined_in = |p: &[String]| -> Option<Vec<String>> {
        let mut p = p.to_vec();
        let mut seen = BTreeSet::new();
        loop {
            let m = owner(&p)?;
            let Some(item) = p.get(m.len()) else { return Some(m) };
            match imports.get(&(m.clone(), item.clone())) {
                Some(to) if seen.insert(p.clone()) => p = to.iter().chain(&p[m.len() + 1..]).cloned().collect(),
                _ => return Some(m),
            }
        }
    };
    let mut graph = BTreeMap::new();
    for (f, (toks, named)) in files.iter().zip(&read) {
        let code = names_in_code(toks);
        let mut edges = BTreeSet::new();
        for n in named {
            // A re-export is the file's own import only where its code
            // names the item besides.
            if n.reexport.as_ref().is_some_and(|r| !code.contains(r)) {
                continue;
            }
            if let Some(m) = defined_in(&n.path) {
                if m != f.module {
                    let target = files.iter().find(|g| g.module == m).unwrap();
                    edges.insert(name(target));
                }
            }
        }
        graph.insert(name(f), edges);
    }
    graph
}

/// The names a file's code uses outside its `use` items and `mod`
/// declarations: identifiers that start a path (not a method or field
/// after `.`, a segment after `::`, or the name of a `fn` it defines).
fn names_in_code(toks: &[Tok]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(k) if k == "use" => {
                while i < toks.len() && toks[i] != Tok::Semi {
                    i += 1;
                }
            }
            Tok::Ident(k) if k == "mod" || k == "fn" => i += 1,
            Tok::Ident(name) if i == 0 || !matches!(toks[i - 1], Tok::Dot | Tok::PathSep) => {
                names.insert(name.clone());
            }
            _ => {}
        }
        i += 1;
    }
    names
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

/// Each cycle of every crate not in [`ALLOWED`], and each allowance that
/// matches no cycle.
fn problems() -> Vec<String> {
    let mut problems = vec![];
    let mut allowed_seen = BTreeSet::new();
    for krate in workspace_crates() {
        let graph = crate_graph(&krate.join("src"));
        for scc in cycles(&graph) {
            if let Some(a) = ALLOWED.iter().position(|a| a.files.iter().copied().eq(scc.iter().map(String::as_str))) {
                allowed_seen.insert(a);
                continue;
            }
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
    for (i, a) in ALLOWED.iter().enumerate().filter(|(i, _)| !allowed_seen.contains(i)) {
        problems.push(format!("allowed cycle {i} ({}) is no cycle now: change or remove its allowance\n    {}", a.why, a.files.join(", ")));
    }
    problems
}

#[test]
fn no_module_of_any_crate_imports_one_that_imports_it_back() {
    let problems = problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The allowances are sorted as the failure lists a cycle's files (so one
/// can be copied from it), and say why.
#[test]
fn allowed_cycles_are_named_with_their_reason() {
    for a in ALLOWED {
        assert!(a.files.windows(2).all(|w| w[0] < w[1]), "allowed cycle's files not sorted: {:?}", a.files);
        assert!(a.files.len() > 1 && !a.why.trim().is_empty(), "allowed cycle without files or reason: {:?}", a.files);
    }
}

/// The reader finds what it must: a made-up crate with a cycle through a
/// `use` group, an inline `crate::` path and a parent naming its child;
/// re-exports lead on to the file they come from.
#[test]
fn the_reader_sees_use_trees_inline_paths_children_and_reexports() {
    let dir = std::env::temp_dir().join(format!("bw-module-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("p")).unwrap();
    let write = |f: &str, s: &str| std::fs::write(src.join(f), s).unwrap();
    // lib.rs's code calls a method that has a re-export's name: not the
    // re-exported function.
    write("lib.rs", "pub mod a; pub mod b; pub mod p; pub mod r; pub mod s;\npub use r::{R, Arr as Rr, r_fn};\npub use s::S;\npub struct X;\npub fn mk() -> S { S.r_fn(); S }\n");
    write("a.rs", "use crate::{x, b::{B as Bee}};\n// crate::p::Q is in a comment\nfn f() -> &'static str { \"crate::p\" }\n");
    write("b.rs", "pub struct B; fn g() { let _ = (crate::p::Q, crate::R, crate::Rr); }\n#[cfg(test)] mod tests { use super::*; }\n");
    write("p/mod.rs", "pub mod q; pub struct Q; fn h() { q::go() }\n");
    write("p/q.rs", "use super::Q; pub fn go() { crate::a::f(); }\n");
    // A facade's re-exports, one renamed: b.rs's edge goes to r.rs, and
    // r.rs naming the root's own X is no cycle.
    write("r.rs", "pub struct R; pub struct Arr; pub fn r_fn() {}\nfn u() -> crate::X { crate::X }\n");
    // The root's code names S: a re-export it also uses is its import.
    write("s.rs", "pub struct S;\nimpl S { pub fn r_fn(&self) {} }\nfn v() { let _ = crate::X; }\n");
    let graph = crate_graph(&src);
    let edges = |f: &str| -> Vec<String> {
        let key = graph.keys().find(|k| k.ends_with(f)).unwrap();
        graph[key].iter().map(|t| t.rsplit("/src/").next().unwrap().to_string()).collect()
    };
    assert_eq!(edges("/a.rs"), vec!["b.rs", "lib.rs"]);
    assert_eq!(edges("/b.rs"), vec!["p/mod.rs", "r.rs"]);
    assert_eq!(edges("/p/mod.rs"), vec!["p/q.rs"]);
    assert_eq!(edges("/p/q.rs"), vec!["a.rs", "p/mod.rs"]);
    assert_eq!(edges("/lib.rs"), vec!["s.rs"]);
    assert_eq!(edges("/r.rs"), vec!["lib.rs"]);
    assert_eq!(edges("/s.rs"), vec!["lib.rs"]);
    let mut found = cycles(&graph);
    found.sort_by_key(|c| c.len());
    let found: Vec<Vec<&str>> = found.iter().map(|c| c.iter().map(|f| f.rsplit("/src/").next().unwrap()).collect()).collect();
    assert_eq!(found, vec![vec!["lib.rs", "s.rs"], vec!["a.rs", "b.rs", "p/mod.rs", "p/q.rs"]]);
    std::fs::remove_dir_all(&dir).unwrap();
}
