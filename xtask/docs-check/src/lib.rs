#![deny(missing_docs)]
//! Keeps the docs true: the command lines, flags and repository paths that README.md and the
//! docs name, and the README's figures, are checked against the code and the recorded files;
//! and the docs carry no work-tracking labels (issue numbers, session words, branch names).
//!
//! The command trees come from clap itself (`clap::CommandFactory::command()` of the CLI and of
//! xtask), so a flag renamed in the code fails the check of every page that still names the
//! old one. Each face's crate runs the check for its own tree in its host tests; this crate's
//! own tests check the paths and the figures.

use std::fmt;
use std::path::{Path, PathBuf};

mod commands;
mod figures;
mod labels;
mod markdown;
mod paths;

pub use commands::check_commands;
pub use figures::check_figures;
pub use labels::{check_labels, load_for_labels};
pub use paths::check_paths;

/// One Markdown page of the docs.
#[derive(Debug, Clone)]
pub struct Doc {
    /// Its path relative to the repository root.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
}

impl Doc {
    /// A page from its path (relative to the root) and text; for tests of the checks.
    pub fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        Doc { path: path.into(), text: text.into() }
    }
}

/// What is wrong with one line of the docs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A command line names a subcommand the tool does not have.
    #[error("`{command}` has no subcommand `{name}`")]
    UnknownSubcommand {
        /// The command as far as it resolved (`ugds`, `cargo xtask`).
        command: String,
        /// The word that is no subcommand of it.
        name: String,
    },
    /// A command line names a flag its (sub)command does not have.
    #[error("`{command}` has no flag `{flag}`")]
    UnknownFlag {
        /// The (sub)command, as resolved (`ugds bench`).
        command: String,
        /// The flag as written (`--size`, `-n`).
        flag: String,
    },
    /// A repository path (or a link target) that does not exist.
    #[error("no such file or folder in the repository: {path}")]
    MissingPath {
        /// The path as written.
        path: String,
    },
    /// A README figure that none of the recorded files named beside it contains.
    #[error("figure {figure} appears in none of {files}")]
    FigureNotInFile {
        /// The figure as written (`2.57x`, `1.46–4.14x`).
        figure: String,
        /// The recorded files named beside it.
        files: String,
    },
    /// A work-tracking label (an issue number, a session word, a branch name): it means
    /// nothing to a reader, so the page says what the thing is instead.
    #[error("names {label}: say what it is instead (no issue numbers, session words or branch names)")]
    TrackingLabel {
        /// The label as written (`issue 17`, `#27`, `this session`, `branch fio`).
        label: String,
    },
    /// A README figure with no recorded file (`docs/bench/...`, `docs/gpu/...`) named beside
    /// it: in its table row or the paragraph before the table, its paragraph or its list item.
    #[error("figure {figure} names no recorded file (docs/bench/..., docs/gpu/...) beside it")]
    FigureWithoutFile {
        /// The figure as written.
        figure: String,
    },
}

/// A [`Problem`] at a line of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The page, relative to the repository root.
    pub file: PathBuf,
    /// The line, counted from 1.
    pub line: usize,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.problem)
    }
}

/// Why the docs could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A page or folder could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })
}

/// The repository root, from a crate's `CARGO_MANIFEST_DIR`: the nearest folder above it (or
/// it) that holds README.md and Cargo.lock.
pub fn repo_root(manifest_dir: &Path) -> Option<PathBuf> {
    manifest_dir
        .ancestors()
        .find(|d| d.join("README.md").is_file() && d.join("Cargo.lock").is_file())
        .map(Path::to_owned)
}

/// What the command test of a face's crate runs: the repository above `manifest_dir` (its
/// `CARGO_MANIFEST_DIR`), its pages, and [`check_commands`] of `tool` against `command`; the
/// findings as one report, one per line, empty when the docs are true.
pub fn command_report(manifest_dir: &Path, tool: &str, command: &clap::Command) -> Result<String, Error> {
    let root = repo_root(manifest_dir)
        .ok_or_else(|| Error::Read { path: manifest_dir.to_owned(), source: std::io::ErrorKind::NotFound.into() })?;
    Ok(report(&check_commands(&load(&root)?, tool, command)))
}

/// Findings as a report: each on a line of its own, after a line break.
pub fn report(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("\n  {f}")).collect()
}

/// The pages outside docs/ that the checks read, where they exist.
const ROOT_PAGES: [&str; 5] = ["README.md", "SECURITY.md", "CHANGELOG.md", "kmod/README.md", "python/README.md"];

/// The pages under the check: README.md and the other Markdown pages at the root, the crates'
/// READMEs, and docs/**/*.md except the recorded files (docs/bench and docs/gpu hold recorded
/// output; only their README.md, which describes it, is a page).
pub fn load(root: &Path) -> Result<Vec<Doc>, Error> {
    let mut rel: Vec<PathBuf> = Vec::new();
    for name in ROOT_PAGES {
        if root.join(name).is_file() {
            rel.push(name.into());
        }
    }
    rel.extend(docs_files(root, |p| p.extension().is_some_and(|x| x == "md") && !is_recorded(p))?);
    rel.into_iter().map(|p| Ok(Doc { text: read(&root.join(&p))?, path: p })).collect()
}

/// The files under docs/ (relative to the root) that `keep` takes, sorted.
fn docs_files(root: &Path, keep: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("docs")];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(root.join(&dir)).map_err(|source| Error::Read { path: root.join(&dir), source })?;
        for e in entries {
            let e = e.map_err(|source| Error::Read { path: root.join(&dir), source })?;
            let p = dir.join(e.file_name());
            if root.join(&p).is_dir() {
                stack.push(p);
            } else if keep(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether a path under docs/ is a recorded file (output of a run) rather than a page.
pub fn is_recorded(rel: &Path) -> bool {
    let in_records = rel.starts_with("docs/bench") || rel.starts_with("docs/gpu");
    in_records && rel.file_name().is_some_and(|n| n != "README.md")
}
