//! The docs name only `ugds` subcommands and flags that exist: every `ugds ...` line in
//! README.md and docs/ is checked against this binary's clap tree.

use clap::CommandFactory;
use std::path::Path;

#[test]
fn docs_name_only_real_ugds_subcommands_and_flags() {
    let stale = ugds_docs_check::command_report(Path::new(env!("CARGO_MANIFEST_DIR")), "ugds", &crate::Cli::command());
    assert_eq!(stale.expect("the docs"), "", "stale `ugds` command lines in the docs");
}
