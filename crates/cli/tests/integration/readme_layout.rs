//! The README's crate table ("Layout") is the architecture contract: each
//! crate's "may import" column must be exactly the blockwire crates its
//! manifest depends on, and every crate must have a row. A manifest that
//! gains an import without the table saying so fails here.

use std::collections::BTreeSet;
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().parent().unwrap()
}

/// The blockwire crates (`bw-NAME`, named by NAME) in a manifest's `[dependencies]`.
fn manifest_imports(manifest: &str) -> BTreeSet<String> {
    let table: toml::Table = manifest.parse().expect("Cargo.toml parses");
    let deps = table.get("dependencies").and_then(|d| d.as_table());
    deps.into_iter()
        .flat_map(|d| d.keys())
        .filter_map(|k| k.strip_prefix("bw-").map(str::to_string))
        .collect()
}

/// The README's rows: crate directory name -> the crates it may import.
fn readme_rows(readme: &str) -> Vec<(String, String)> {
    readme
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix("`crates/")?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(3)?.to_string()))
        })
        .collect()
}

fn parse_imports(cell: &str) -> BTreeSet<String> {
    // "a, b (runs `blockwire`)" or "–" for none.
    let without_notes = cell.split('(').next().unwrap_or("");
    without_notes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "–")
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_layout_table_matches_every_manifest() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let rows = readme_rows(&readme);
    let mut problems = Vec::new();
    let mut crates = BTreeSet::new();
    for e in std::fs::read_dir(repo().join("crates")).unwrap().flatten() {
        let manifest = e.path().join("Cargo.toml");
        if manifest.exists() {
            crates.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    for name in &crates {
        let Some((_, cell)) = rows.iter().find(|(n, _)| n == name) else {
            problems.push(format!("crates/{name} has no row in the README's Layout table"));
            continue;
        };
        if cell == "all of the above" {
            continue;
        }
        let manifest = std::fs::read_to_string(repo().join("crates").join(name).join("Cargo.toml")).unwrap();
        let (said, has) = (parse_imports(cell), manifest_imports(&manifest));
        if said != has {
            problems.push(format!("crates/{name}: README says it may import {said:?}, its manifest imports {has:?}"));
        }
    }
    for (name, _) in &rows {
        if !crates.contains(name) {
            problems.push(format!("README row crates/{name} names no crate"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The project runs on a clone of itself alone: no tracked file (code,
/// script, Makefile, user doc) runs a tool from the workplace's `../shared`
/// (the kernel VM harness is `tests/kernel-vm/vm`). Dated notes under
/// docs/notes/ are history and may name what was used then; this file names
/// the path only to look for it.
#[test]
fn nothing_runs_tools_from_outside_the_repository() {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let needle = concat!("shared/", "tools");
    let offenders: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|f| !f.is_empty() && !f.starts_with("docs/notes/"))
        .filter(|f| {
            std::fs::read(repo().join(f))
                .map(|b| String::from_utf8_lossy(&b).contains(needle))
                .unwrap_or(false)
        })
        .map(str::to_string)
        .collect();
    assert!(offenders.is_empty(), "these files use ../{needle}, which a clone does not have: {offenders:?}");
}
