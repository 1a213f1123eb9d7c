//! The docs name only `cargo xtask` verbs and flags that exist: every `cargo xtask ...` line in
//! README.md and docs/ is checked against xtask's clap tree.

use clap::CommandFactory;
use std::path::Path;

#[test]
fn docs_name_only_real_xtask_verbs_and_flags() {
    let stale =
        ugds_docs_check::command_report(Path::new(env!("CARGO_MANIFEST_DIR")), "cargo xtask", &crate::Cli::command());
    assert_eq!(stale.expect("the docs"), "", "stale `cargo xtask` command lines in the docs");
}
