//! The repository's own docs: every path they name exists, every README figure is in the
//! recorded file named beside it, and no page or recorded file's header carries a work-tracking
//! label. (The command lines are checked by the CLI's and xtask's own
//! tests, which hold the command trees.)

use std::path::Path;
use ugds_docs_check::{check_figures, check_labels, check_paths, load, load_for_labels, repo_root, report, Doc};

fn docs() -> (std::path::PathBuf, Vec<Doc>) {
    let root = repo_root(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("the repository root");
    let docs = load(&root).expect("the docs");
    (root, docs)
}

#[test]
fn every_path_the_docs_name_exists() {
    let (root, docs) = docs();
    let findings = check_paths(&root, &docs);
    assert!(findings.is_empty(), "stale paths in the docs:{}", report(&findings));
}

#[test]
fn every_readme_figure_is_in_the_recorded_file_beside_it() {
    let (root, docs) = docs();
    let readme = docs.iter().find(|d| d.path == Path::new("README.md")).expect("README.md");
    let findings = check_figures(&root, readme).expect("the recorded files");
    assert!(findings.is_empty(), "README figures not backed by their recorded files:{}", report(&findings));
}

#[test]
fn no_page_names_an_issue_a_session_or_a_branch() {
    let root = repo_root(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("the repository root");
    let docs = load_for_labels(&root).expect("the docs");
    let findings = check_labels(&docs);
    assert!(findings.is_empty(), "work-tracking labels in the docs:{}", report(&findings));
}
