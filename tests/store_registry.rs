//! The store registry is the one place that names every store, and no store depends on it:
//! adding a store touches its own folder, the registry's list, its Cargo feature and its test
//! server. This test reads the source tree and holds those lines.
//!
//! What counts as naming a store: a path through its module (`postgres::`, `sqlite::KIND`) or
//! its Cargo feature (`feature = "postgres"`), in code, not comments. `src/store/mod.rs`'s
//! `mod NAME;` lines (and the `#[cfg]` over each) are the compiler's module tree, not a list
//! the code reads, and are left out; so is a store's own folder naming itself.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use leaderrun::store::registry::{EVERY_STORE, STORES};

const REGISTRY: &str = "src/store/registry.rs";

/// The most stores any file other than the registry may name: a file shared by two stores
/// (the Google API client of Cloud Storage and Datastore, the release feed of PostgreSQL
/// and Redis) names both.
const MOST_OUTSIDE_THE_REGISTRY: usize = 2;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each file under `src/`, relative to the root, with its code: comments and the module tree's
/// `mod` lines left out.
fn sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect();
            let code: Vec<&str> = lines
                .iter()
                .enumerate()
                .filter(|(i, line)| !in_module_tree(line, lines.get(i + 1)))
                .map(|(_, line)| *line)
                .collect();
            (path.strip_prefix(root()).unwrap().display().to_string(), code.join("\n"))
        })
        .collect()
}

/// A `mod` line, or the `#[cfg(...)]` over one.
fn in_module_tree(line: &str, next: Option<&&str>) -> bool {
    is_mod_line(line) || (line.trim().starts_with("#[cfg(") && next.is_some_and(|next| is_mod_line(next)))
}

fn is_mod_line(line: &str) -> bool {
    let line = line.trim();
    let line = line.strip_prefix("pub ").unwrap_or(line);
    line.strip_prefix("mod ").is_some_and(|rest| rest.ends_with(';'))
}

/// The stores a piece of code names, by path or by feature.
fn named_in(code: &str) -> BTreeSet<&'static str> {
    EVERY_STORE
        .iter()
        .copied()
        .filter(|name| {
            code.contains(&format!("feature = \"{name}\""))
                || code.match_indices(&format!("{name}::")).any(|(at, _)| {
                    // A path segment: not the tail of a longer name (`my_sqlite::`).
                    !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                })
        })
        .collect()
}

/// The store whose folder (or file) `path` is in, if any.
fn own_store(path: &str) -> Option<&'static str> {
    let rest = path.strip_prefix("src/store/")?;
    let first = rest.split('/').next()?.trim_end_matches(".rs");
    EVERY_STORE.iter().copied().find(|name| *name == first)
}

#[test]
fn the_registry_lists_every_store_of_this_build() {
    assert_eq!(STORES.len(), EVERY_STORE.len(), "a default build has every store");
    let (_, registry) = sources().into_iter().find(|(path, _)| path == REGISTRY).expect("the registry");
    let named = named_in(&registry);
    for name in EVERY_STORE {
        assert!(named.contains(name), "{REGISTRY} does not name {name}");
    }
}

#[test]
fn only_the_registry_names_the_stores() {
    let mut too_many = Vec::new();
    for (path, code) in sources() {
        if path == REGISTRY {
            continue;
        }
        let mut named = named_in(&code);
        if let Some(own) = own_store(&path) {
            named.remove(own);
        }
        if named.len() > MOST_OUTSIDE_THE_REGISTRY - usize::from(own_store(&path).is_some()) {
            too_many.push(format!("{path} names {named:?}"));
        }
    }
    assert!(too_many.is_empty(), "only {REGISTRY} may name the stores:\n{}", too_many.join("\n"));
}

#[test]
fn no_store_imports_the_registry() {
    let importers: Vec<String> = sources()
        .into_iter()
        .filter(|(path, _)| path.starts_with("src/store/") && path != REGISTRY)
        .filter(|(_, code)| code.contains("registry"))
        .map(|(path, _)| path)
        .collect();
    assert!(importers.is_empty(), "stores must not depend on the registry: {importers:?}");
}
