//! Repository paths and link targets in the docs.

use crate::{Doc, Finding, Problem};
use std::collections::BTreeSet;
use std::path::Path;

/// Characters that end a path in prose and code alike.
const DELIMITERS: &[char] = &['`', '(', ')', '[', ']', '<', '>', '"', '\'', ',', ';', '|'];

/// Checks that every repository path the pages name exists: each word that begins with a
/// top-level folder of the repository (`docs/install.md`, `userlib/src/buffer.rs`, `kmod/`),
/// in prose and in code, relative to the root; each page named without a folder
/// (`SECURITY.md`), beside the page, at the root or in docs/; and each Markdown link target,
/// relative to its page. Words holding a wildcard or placeholder (`*`, `{`, `$`, `~`, `:`, `...`) are patterns,
/// not paths, and `target/` (build output) is not checked.
pub fn check_paths(root: &Path, docs: &[Doc]) -> Vec<Finding> {
    let top = top_level(root);
    let mut out = Vec::new();
    for doc in docs {
        for (i, line) in doc.text.lines().enumerate() {
            // A link's target is also a word of the line: name each missing path once.
            let mut named: Vec<String> = Vec::new();
            let mut missing = |path: &str| {
                if !named.iter().any(|n| n == path) {
                    named.push(path.to_owned());
                    out.push(Finding {
                        file: doc.path.clone(),
                        line: i + 1,
                        problem: Problem::MissingPath { path: path.to_owned() },
                    })
                }
            };
            for word in line.split(|c: char| c.is_whitespace() || DELIMITERS.contains(&c)) {
                if let Some(p) = repo_path(word, &top) {
                    if !root.join(p).exists() {
                        missing(p);
                    }
                } else if let Some(page) = page_name(word) {
                    let dir = doc.path.parent().unwrap_or(Path::new(""));
                    if ![root.join(dir), root.to_owned(), root.join("docs")].iter().any(|d| d.join(page).is_file()) {
                        missing(page);
                    }
                }
            }
            let dir = doc.path.parent().unwrap_or(Path::new(""));
            for target in link_targets(line) {
                if !root.join(dir).join(target).exists() {
                    missing(target);
                }
            }
        }
    }
    out
}

/// The repository's top-level entries, build output and git's folder aside.
fn top_level(root: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(root) else { return BTreeSet::new() };
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n != "target" && n != ".git").collect()
}

/// The word as a repository path, when it is one.
fn repo_path<'a>(word: &'a str, top: &BTreeSet<String>) -> Option<&'a str> {
    let w = word.trim_end_matches(['.', ':', '!', '?']);
    let w = w.split('#').next()?;
    let (first, _) = w.split_once('/')?;
    let pattern = w.contains(['*', '{', '}', '$', '~', ':', '=', '\\']) || w.contains("...");
    (!pattern && top.contains(first)).then_some(w)
}

/// A page named without a folder (`SECURITY.md`): it must be beside the page naming it, at the
/// root or in docs/.
fn page_name(word: &str) -> Option<&str> {
    let w = word.trim_end_matches(['.', ':', '!', '?']);
    let w = w.split('#').next()?;
    let stem = w.strip_suffix(".md")?;
    let plain = !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    plain.then_some(w)
}

/// The local targets of the line's Markdown links and images: `[text](target)`, without
/// `#anchor`; web links, mail and same-page anchors aside.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split('#').next().unwrap_or_default().trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target);
        }
        rest = &after[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_paths_and_links_are_named() {
        let root = std::env::temp_dir().join(format!("docs-check-paths-{}", std::process::id()));
        std::fs::create_dir_all(root.join("docs/bench")).unwrap();
        std::fs::write(root.join("docs/a.md"), "").unwrap();
        let text = "See docs/a.md, `docs/bench/` and [b](a.md#x), [web](https://x.y/docs/z).\n\
                    Stale: docs/gone.md and [c](c.md), NOTES.md but a.md; patterns: docs/run-{1,2}.txt docs/*.md, target/x.\n";
        let docs = [Doc::new("docs/page.md", text)];
        let got: Vec<String> = check_paths(&root, &docs).iter().map(|f| f.to_string()).collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            got,
            [
                "docs/page.md:2: no such file or folder in the repository: docs/gone.md",
                "docs/page.md:2: no such file or folder in the repository: c.md",
                "docs/page.md:2: no such file or folder in the repository: NOTES.md",
            ]
        );
    }
}
