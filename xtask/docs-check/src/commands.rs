//! Command lines in the docs against a clap command tree.

use crate::markdown::code;
use crate::{Doc, Finding, Problem};

/// Words that may stand before the tool on a command line (`sudo ugds ...`, `nice cargo ...`).
const WRAPPERS: &[&str] = &["sudo", "exec", "time", "env", "nice"];

/// Checks every invocation of `tool` (`"ugds"`, `"cargo xtask"`) in the pages' code (fenced
/// lines and inline spans) against `command`, the tool's clap tree: each subcommand word must
/// be a subcommand, each `--flag` (and `-f`) a flag of the (sub)command it follows or a global
/// one. The tool counts only where a command starts (first word, after `|`, `;`, `&&`, `$(`,
/// environment assignments or `sudo`/`nice`), so `python -m ugds ...` and `import ugds` are
/// not its invocations. A word that is no plain lowercase name (`<verb>`, `TARGET`,
/// `id-ctrl/id-ns`) is a placeholder: the check of that line stops there.
pub fn check_commands(docs: &[Doc], tool: &str, command: &clap::Command) -> Vec<Finding> {
    let mut root = command.clone();
    // Materialises --help, --version and the propagation of global flags.
    root.build();
    let tool_words: Vec<&str> = tool.split_whitespace().collect();
    let mut out = Vec::new();
    for doc in docs {
        for c in code(&doc.text) {
            let text = if c.fenced { strip_comment(&c.text) } else { &c.text };
            for simple in simple_commands(text) {
                if let Some(rest) = after_tool(&simple, &tool_words) {
                    if let Some(problem) = walk(&root, tool, rest) {
                        out.push(Finding { file: doc.path.clone(), line: c.line, problem });
                    }
                }
            }
        }
    }
    out
}

/// A shell line up to its comment (`#` at the start or after white space).
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    let cut = (0..b.len()).find(|&i| b[i] == b'#' && (i == 0 || b[i - 1].is_ascii_whitespace()));
    &line[..cut.unwrap_or(b.len())]
}

/// The simple commands of a line, as word lists: split at `|`, `||`, `&&`, `;` and `$(`.
fn simple_commands(text: &str) -> Vec<Vec<&str>> {
    let mut out = vec![Vec::new()];
    for word in text.split_whitespace() {
        let mut w = word;
        if let Some(rest) = w.strip_prefix("$(") {
            out.push(Vec::new());
            w = rest;
        }
        let ends = w.ends_with(';');
        let w = w.trim_end_matches(';');
        if matches!(w, "|" | "||" | "&&") {
            out.push(Vec::new());
            continue;
        }
        if let Some(c) = out.last_mut().filter(|_| !w.is_empty()) {
            c.push(w);
        }
        if ends {
            out.push(Vec::new());
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// The words after the tool's own, when this simple command runs the tool.
fn after_tool<'a, 'b>(words: &'b [&'a str], tool: &[&str]) -> Option<&'b [&'a str]> {
    let mut i = 0;
    // Environment assignments (`RUST_LOG=debug ugds ...`) and wrappers (`nice -n 10`).
    while i < words.len() {
        let w = words[i].trim_start_matches('`');
        if WRAPPERS.contains(&w) {
            i += 1;
            if w == "nice" && words.get(i) == Some(&"-n") {
                i += 2;
            }
        } else if w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        }) {
            i += 1;
        } else {
            break;
        }
    }
    let rest = words.get(i..)?;
    let matches =
        rest.len() >= tool.len() && rest.iter().zip(tool).all(|(w, t)| w.trim_start_matches(['`', '(']) == *t);
    matches.then(|| &rest[tool.len()..])
}

/// A word stripped of the brackets and punctuation prose puts around it (`[--json]`, `--all,`).
fn bare(word: &str) -> &str {
    word.trim_start_matches(['[', '(', '{', '"', '\'', '`'])
        .trim_end_matches([']', ')', '}', ',', '.', ':', ';', '"', '\'', '`'])
        .trim_end_matches("...")
        .trim_end_matches(']')
}

/// A plain subcommand name.
fn is_word(w: &str) -> bool {
    let mut b = w.bytes();
    b.next().is_some_and(|c| c.is_ascii_lowercase())
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// Follows the words through the tree; the first problem, if any.
fn walk(root: &clap::Command, tool: &str, words: &[&str]) -> Option<Problem> {
    let mut stack: Vec<&clap::Command> = vec![root];
    let mut name = tool.to_owned();
    let mut positionals = 0usize;
    let mut i = 0;
    while i < words.len() {
        let w = bare(words[i]);
        i += 1;
        let cur = *stack.last()?;
        if w == "--" {
            // What follows belongs to another program (`cargo xtask vm -- CMD`).
            return None;
        }
        if let Some(long) = w.strip_prefix("--") {
            let long = long.split(['=', '[', '|']).next().unwrap_or_default();
            if !is_word(long) {
                continue;
            }
            match find_arg(&stack, |a| {
                a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
            }) {
                Some(arg) => i += usize::from(takes_value(arg) && !w.contains('=')),
                None => return Some(Problem::UnknownFlag { command: name, flag: format!("--{long}") }),
            }
        } else if let Some(short) = w.strip_prefix('-').filter(|s| s.len() == 1) {
            let Some(ch) = short.chars().next().filter(char::is_ascii_alphanumeric) else { continue };
            match find_arg(&stack, |a| a.get_short() == Some(ch)) {
                Some(arg) => i += usize::from(takes_value(arg)),
                None => return Some(Problem::UnknownFlag { command: name, flag: format!("-{ch}") }),
            }
        } else if cur.has_subcommands() && positionals == 0 {
            if !is_word(w) {
                return None;
            }
            match cur.find_subcommand(w) {
                Some(sub) => {
                    stack.push(sub);
                    name = format!("{name} {w}");
                }
                None => return Some(Problem::UnknownSubcommand { command: name, name: w.to_owned() }),
            }
        } else {
            positionals += 1;
        }
    }
    None
}

/// The argument the predicate picks: the current command's, or a global one of an ancestor.
fn find_arg<'a>(stack: &[&'a clap::Command], pick: impl Fn(&clap::Arg) -> bool) -> Option<&'a clap::Arg> {
    let (cur, ancestors) = stack.split_last()?;
    cur.get_arguments()
        .find(|a| pick(a))
        .or_else(|| ancestors.iter().rev().flat_map(|c| c.get_arguments()).find(|a| a.is_global_set() && pick(a)))
}

/// Whether the flag reads the next word as its value.
fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.takes_values())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn tool() -> Command {
        Command::new("ugds")
            .arg(Arg::new("json").long("json").global(true).action(ArgAction::SetTrue))
            .subcommand(
                Command::new("bench")
                    .arg(Arg::new("target"))
                    .arg(Arg::new("size").long("size"))
                    .arg(Arg::new("threads").long("threads").short('t')),
            )
            .subcommand(Command::new("info").arg(Arg::new("dev")))
    }

    fn check(text: &str) -> Vec<String> {
        check_commands(&[Doc::new("x.md", text)], "ugds", &tool()).iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn real_flags_and_subcommands_pass() {
        let text = "`ugds bench /dev/ugds_drv0 --size 4K -t 2 --json`, `sudo ugds info x`,\n\
                    `ugds <subcommand>`, `ugds id-ctrl/id-ns`, `python -m ugds doctor`, `import ugds`\n\n\
                    ```sh\nRUST_LOG=1 nice -n 10 ugds bench x \\\n  --size=4K   # --nothing\nls | ugds info y\n```\n";
        assert_eq!(check(text), Vec::<String>::new());
    }

    #[test]
    fn a_stale_flag_or_subcommand_fails_with_its_line() {
        let text = "intro\n\n`ugds bench x --seconds 3`\n\n```\necho; ugds infos x\n```\n`ugds bench [--depth N]`";
        assert_eq!(
            check(text),
            [
                "x.md:3: `ugds bench` has no flag `--seconds`",
                "x.md:6: `ugds` has no subcommand `infos`",
                "x.md:8: `ugds bench` has no flag `--depth`",
            ]
        );
    }

    #[test]
    fn a_multi_word_tool_and_the_double_dash() {
        let xtask = Command::new("cargo xtask").subcommand(
            Command::new("vm")
                .arg(Arg::new("iommu").long("iommu").action(ArgAction::SetTrue))
                .arg(Arg::new("cmd").last(true).num_args(1..)),
        );
        let docs = [Doc::new("y.md", "`cargo xtask vm --iommu -- ugds bench --bogus` and `cargo xtask vm --bind`")];
        let got: Vec<String> = check_commands(&docs, "cargo xtask", &xtask).iter().map(|f| f.to_string()).collect();
        assert_eq!(got, ["y.md:1: `cargo xtask vm` has no flag `--bind`"]);
    }
}
