//! No function of the workspace is longer than [`MOST_LINES`] lines unless
//! [`ALLOWED`] names it with the reason. A long function is usually several
//! steps that have names of their own (issue 50 split about twenty); this
//! test keeps new ones from growing unseen. It reads every .rs file under
//! each `crates/*/src` and `crates/*/tests` with `module_cycles`' lexer
//! (comments and strings are no code), and counts a function from its `fn`
//! line to its closing brace. Test functions (`#[test]`, `#[tokio::test]`)
//! are left out: each is one scenario against a real peer, read top to
//! bottom, whose steps are already the shared helpers in `common`.

use super::module_cycles::{files_of, lex_at, workspace_crates, Tok};

const MOST_LINES: usize = 100;

/// A function allowed past [`MOST_LINES`]: its file (`crate/src/…`), its
/// name, and why it is better whole.
struct Allowed {
    file: &'static str,
    function: &'static str,
    why: &'static str,
}

/// An allowance that matches no long function fails the test too (the
/// function was split or renamed: take it out).
const ALLOWED: &[Allowed] = &[
    Allowed {
        file: "cli/tests/integration/socket_fuzz.rs",
        function: "iscsi_session",
        why: "one fuzzed iSCSI session as a script: login, then each phase's PDUs mutated in turn; its steps \
              share the session's state (sequence numbers, the mutation counts) in order",
    },
    Allowed {
        file: "cli/tests/integration/socket_fuzz.rs",
        function: "nvme_session",
        why: "one fuzzed NVMe/TCP session as a script, as iscsi_session",
    },
    Allowed {
        file: "cli/tests/integration/socket_fuzz.rs",
        function: "run",
        why: "the fuzz run's one scenario: serve started, fuzzing threads and a clean session beside them, \
              the ending checked",
    },
    Allowed {
        file: "cli/tests/integration/common/ceph.rs",
        function: "start",
        why: "a Ceph cluster's bring-up in the order Ceph needs it (monitor, manager, OSD with its uuid, pool), \
              each step waiting on the last",
    },
];

/// A function's length: from its `fn` line to its closing brace's, both
/// counted. `None` for a declaration without a body.
fn body_lines(src: &str, toks: &[(usize, Tok)], fn_at: usize, line_of: &impl Fn(usize) -> usize) -> Option<usize> {
    // The body's `{` is the first outside the parameters' parentheses and
    // any brackets (`[u8; 4]` holds a `;`).
    let mut nesting = 0i32;
    let mut j = fn_at + 2;
    loop {
        let (at, t) = toks.get(j)?;
        match t {
            Tok::Open if nesting == 0 => break,
            Tok::Semi if nesting == 0 => return None,
            Tok::Other => match src.as_bytes()[*at] {
                b'(' | b'[' => nesting += 1,
                b')' | b']' => nesting -= 1,
                _ => {}
            },
            _ => {}
        }
        j += 1;
    }
    let mut depth = 0;
    for (at, t) in &toks[j..] {
        match t {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    return Some(line_of(*at) - line_of(toks[fn_at].0) + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the attributes on the lines above line `line` (0-based) make
/// the function a test.
fn is_test(lines: &[&str], line: usize) -> bool {
    lines[..line]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .any(|l| l == "#[test]" || l.starts_with("#[tokio::test"))
}

/// Every function past `most` lines: (file as `crate/dir/…`, line, name, lines).
fn long_functions(most: usize) -> Vec<(String, usize, String, usize)> {
    let mut out = vec![];
    for krate in workspace_crates() {
        let base = krate.parent().unwrap();
        for dir in [krate.join("src"), krate.join("tests")].into_iter().filter(|d| d.is_dir()) {
            for f in files_of(&dir) {
                let src = std::fs::read_to_string(&f.path).unwrap();
                let newlines: Vec<usize> = src.match_indices('\n').map(|(i, _)| i).collect();
                let line_of = |at: usize| newlines.partition_point(|&n| n < at);
                let lines: Vec<&str> = src.lines().collect();
                let toks = lex_at(&src);
                for (k, w) in toks.windows(2).enumerate() {
                    let (Tok::Ident(kw), Tok::Ident(name)) = (&w[0].1, &w[1].1) else { continue };
                    if kw != "fn" || is_test(&lines, line_of(w[0].0)) {
                        continue;
                    }
                    if let Some(n) = body_lines(&src, &toks, k, &line_of).filter(|&n| n > most) {
                        let file = f.path.strip_prefix(base).unwrap().display().to_string();
                        out.push((file, line_of(w[0].0) + 1, name.clone(), n));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_function_is_longer_than_100_lines_unless_allowed() {
    let long = long_functions(MOST_LINES);
    let allowed = |file: &str, name: &str| ALLOWED.iter().any(|a| a.file == file && a.function == name);
    let mut problems: Vec<String> = long
        .iter()
        .filter(|(file, _, name, _)| !allowed(file, name))
        .map(|(file, line, name, n)| format!("{file}:{line}: fn {name} is {n} lines (at most {MOST_LINES}): split it where the pieces have names of their own, or allow it in fn_length.rs with the reason"))
        .collect();
    for a in ALLOWED {
        assert!(!a.why.is_empty());
        if !long.iter().any(|(file, _, name, _)| file == a.file && name == a.function) {
            problems.push(format!("fn_length.rs allows {} in {}, which is no longer past {MOST_LINES} lines: take the allowance out", a.function, a.file));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The counting itself, on a known text: a function's lines from `fn` to
/// its brace, a `;` inside brackets no end, a test and a declaration left out.
#[test]
fn lengths_are_counted_from_fn_to_its_brace() {
    let src = "fn a(x: [u8; 4]) -> u8 {\n    // }\n    let s = \"}\";\n    x[0]\n}\n#[test]\nfn t() {\n}\ntrait T { fn d(&self); }\n";
    let toks = lex_at(src);
    let newlines: Vec<usize> = src.match_indices('\n').map(|(i, _)| i).collect();
    let line_of = |at: usize| newlines.partition_point(|&n| n < at);
    let fns: Vec<usize> = toks.iter().enumerate().filter(|(_, (_, t))| *t == Tok::Ident("fn".into())).map(|(i, _)| i).collect();
    let lines: Vec<&str> = src.lines().collect();
    assert_eq!(body_lines(src, &toks, fns[0], &line_of), Some(5));
    assert!(is_test(&lines, line_of(toks[fns[1]].0)));
    assert_eq!(body_lines(src, &toks, fns[2], &line_of), None);
}
