//! README.md and the pages under docs/ stay joined: every relative link names a file that
//! exists and, with `#anchor`, a heading of that file; every store has its page, and
//! README links to every page. Links to http(s) addresses are not fetched.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/**/*.md, as paths relative to the repository.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join("docs"), &mut found);
    let mut pages: Vec<PathBuf> = found.iter().map(|p| p.strip_prefix(root()).unwrap().to_path_buf()).collect();
    pages.sort();
    pages.insert(0, PathBuf::from("README.md"));
    pages
}

/// The text outside fenced code blocks, with inline code spans removed: a `[x](y)` or a
/// `#` there is code, not a link or a heading.
fn prose(markdown: &str) -> String {
    let mut kept = String::new();
    let mut fence: Option<&str> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        if fence.is_some() {
            kept.push('\n');
        }
    }
    // A code span opens with a run of backticks and closes at the next run of the same length.
    let chars: Vec<char> = kept.chars().collect();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let close = loop {
            if j >= chars.len() {
                break None;
            }
            if chars[j] == '`' {
                let m = run_at(j);
                if m == n {
                    break Some(j + m);
                }
                j += m;
            } else {
                j += 1;
            }
        };
        match close {
            Some(end) => {
                // Keep the line breaks, so that headings stay at the start of their lines.
                out.extend(chars[i..end].iter().filter(|&&c| c == '\n'));
                i = end;
            }
            None => {
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` removed
/// (backticks included), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings; a repeated heading gets `-1`, `-2`, … as on GitHub.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    let mut fence = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fence || !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *count == 0 { base.clone() } else { format!("{base}-{count}") });
        *count += 1;
    }
    anchors
}

/// The destinations of the page's `[text](destination)` links (and images).
fn links(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find([')', ' ', '\n']).unwrap_or(after.len());
        found.push(after[..end].to_string());
        rest = &after[end..];
    }
    found
}

/// `base` joined with `relative`, `..` and `.` resolved; None if it leaves the repository.
fn resolve(base: &Path, relative: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component> = base.components().collect();
    for part in Path::new(relative).components() {
        match part {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            Component::Normal(_) => parts.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.iter().collect())
}

/// Every broken link of the given pages, one line each.
fn broken_links(pages: &[PathBuf]) -> Vec<String> {
    let mut anchors_of: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut anchors_for = |page: &Path| -> BTreeSet<String> {
        anchors_of
            .entry(page.to_path_buf())
            .or_insert_with(|| anchors(&fs::read_to_string(root().join(page)).unwrap()))
            .clone()
    };
    let mut broken = Vec::new();
    for page in pages {
        let text = fs::read_to_string(root().join(page)).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue; // not fetched: the test needs no network
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                match resolve(page.parent().unwrap(), path) {
                    Some(target) => target,
                    None => {
                        broken.push(format!("{}: {link}: outside the repository", page.display()));
                        continue;
                    }
                }
            };
            if !root().join(&target).exists() {
                broken.push(format!("{}: {link}: no such file {}", page.display(), target.display()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if target.extension().is_none_or(|e| e != "md") || root().join(&target).is_dir() {
                broken.push(format!("{}: {link}: an anchor into a file that is not markdown", page.display()));
            } else if !anchors_for(&target).contains(anchor) {
                broken.push(format!("{}: {link}: no heading #{anchor} in {}", page.display(), target.display()));
            }
        }
    }
    broken
}

#[test]
fn every_link_resolves() {
    let pages = pages();
    assert!(pages.len() > 1, "no pages under docs/");
    let broken = broken_links(&pages);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The page of each store in the registry: `docs/stores/NAME.md`.
fn store_pages() -> Vec<(String, PathBuf)> {
    leaderrun::store::registry::STORES
        .iter()
        .map(|kind| (kind.name.to_string(), PathBuf::from(format!("docs/stores/{}.md", kind.name))))
        .collect()
}

#[test]
fn every_store_has_its_page() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let readme_links = links(&readme);
    let stores = store_pages();
    assert!(!stores.is_empty(), "no stores in the registry");
    for (name, page) in &stores {
        assert!(root().join(page).is_file(), "the {name} store has no page {}", page.display());
        assert!(
            readme_links.iter().any(|l| Path::new(l.split('#').next().unwrap()) == page),
            "README.md does not link to {}",
            page.display()
        );
    }
    for page in pages().iter().filter(|p| p.starts_with("docs/stores")) {
        assert!(stores.iter().any(|(_, p)| p == page), "{} is no store's page", page.display());
    }
}

#[test]
fn readme_links_every_page() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<PathBuf> =
        links(&readme).iter().filter_map(|l| resolve(Path::new(""), l.split('#').next().unwrap())).collect();
    for page in pages().iter().skip(1) {
        assert!(linked.contains(page), "README.md does not link to {}", page.display());
    }
}

#[test]
fn slugs_and_links_as_github_reads_them() {
    assert_eq!(slug("Semaphores: `--slots N`"), "semaphores---slots-n");
    assert_eq!(slug("The safety contract, in plain words"), "the-safety-contract-in-plain-words");
    assert_eq!(slug("Clusters: etcd, NATS, ZooKeeper"), "clusters-etcd-nats-zookeeper");
    assert_eq!(slug("`--lock-delay`"), "--lock-delay");
    assert_eq!(slug("PostgreSQL, 2026-11-24"), "postgresql-2026-11-24");
    let page = "# A\n\n## A\n\n```\n# not a heading [x](nowhere.md)\n```\n\nSee [b](b.md#a-1) and `[c](c.md)`.\n";
    assert_eq!(anchors(page), BTreeSet::from(["a".to_string(), "a-1".to_string()]));
    assert_eq!(links(page), vec!["b.md#a-1".to_string()]);
    assert_eq!(resolve(Path::new("docs/stores"), "../../README.md"), Some(PathBuf::from("README.md")));
    assert_eq!(resolve(Path::new("docs"), "../../x"), None);
}
