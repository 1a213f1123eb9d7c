//! Work-tracking labels in the docs: issue and pull-request numbers, words that only mean
//! something to whoever wrote the page at the time ("this session", "this round", "stop 3x") and
//! branch names. A reader has none of that context, so a page says what a thing is instead.

use crate::{read, Doc, Error, Finding, Problem};
use std::path::Path;

/// Phrases that name the writer's moment, not the thing (compared in lower case).
const MOMENT_PHRASES: &[&str] = &["this session", "this round"];

/// Checks every line of `docs` for work-tracking labels: `issue 17` and `issue #17` (a number
/// followed by a word is a count, as in "issue 32 commands"), `#27` (a number after `#`, not a
/// Markdown heading), `this session`, `this round`, `stop 3` or `stop 3x`, and branch names
/// (`branch 'fio'`, `` branch `x` ``, `refs/heads/...`, `origin/...`).
pub fn check_labels(docs: &[Doc]) -> Vec<Finding> {
    let mut out = Vec::new();
    for doc in docs {
        for (i, line) in doc.text.lines().enumerate() {
            for label in labels_in(line) {
                out.push(Finding { file: doc.path.clone(), line: i + 1, problem: Problem::TrackingLabel { label } });
            }
        }
    }
    out
}

/// The pages the label check reads: README.md and the other pages outside docs/ that [`load`]
/// reads, every Markdown page under docs/ (recorded ones included) and the header of every text
/// file under docs/ (its lines up to the first blank one: what a person wrote above a run's
/// output).
///
/// [`load`]: crate::load
pub fn load_for_labels(root: &Path) -> Result<Vec<Doc>, Error> {
    let mut docs = Vec::new();
    for name in crate::ROOT_PAGES {
        if root.join(name).is_file() {
            docs.push(Doc { text: read(&root.join(name))?, path: name.into() });
        }
    }
    let files = crate::docs_files(root, |p| p.extension().is_some_and(|x| x == "md" || x == "txt"))?;
    for p in files {
        let text = read(&root.join(&p))?;
        let text = if p.extension().is_some_and(|x| x == "txt") { header(&text).to_owned() } else { text };
        docs.push(Doc { path: p, text });
    }
    Ok(docs)
}

/// A text file's header: its lines up to the first blank one.
fn header(text: &str) -> &str {
    let mut end = 0;
    for line in text.split_inclusive('\n') {
        if line.trim().is_empty() {
            break;
        }
        end += line.len();
    }
    &text[..end]
}

/// The labels one line holds, as written.
fn labels_in(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let mut out = Vec::new();
    for p in MOMENT_PHRASES {
        for at in word_starts(&lower, p) {
            out.push(line[at..at + p.len()].to_owned());
        }
    }
    for word in ["issue", "issues", "stop"] {
        for at in word_starts(&lower, word) {
            if let Some(end) = numbered(&lower, at + word.len(), word != "stop") {
                out.push(line[at..end].to_owned());
            }
        }
    }
    let bytes = lower.as_bytes();
    for (at, _) in lower.match_indices('#') {
        let after_word = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || matches!(bytes[at - 1], b'&' | b'#'));
        let digits = digits_at(&lower, at + 1);
        // `issue #5` is named once, as a whole.
        let before = lower[..at].trim_end_matches(' ');
        let in_issue = before.ends_with("issue") || before.ends_with("issues");
        if !after_word && !in_issue && digits > 0 && !word_char_at(&lower, at + 1 + digits) {
            out.push(line[at..at + 1 + digits].to_owned());
        }
    }
    for at in word_starts(&lower, "branch") {
        let rest = &line[at + "branch".len()..];
        let name = rest.strip_prefix(' ').and_then(|r| {
            let q = r.chars().next().filter(|c| matches!(c, '\'' | '"' | '`'))?;
            let inner = &r[1..];
            inner.find(q).map(|e| &inner[..e]).filter(|n| !n.is_empty() && !n.contains(' '))
        });
        if let Some(n) = name {
            out.push(format!("branch {n}"));
        }
    }
    for prefix in ["refs/heads/", "origin/"] {
        for at in word_starts(&lower, prefix) {
            let end =
                lower[at..].find(|c: char| c.is_whitespace() || "`'\"),;".contains(c)).map_or(lower.len(), |e| at + e);
            // A sentence's full stop or colon is not part of the name.
            let name = line[at..end].trim_end_matches(['.', ':', '!', '?']);
            if name.len() > prefix.len() {
                out.push(name.to_owned());
            }
        }
    }
    out
}

/// Where `word` starts in `lower` with no letter, digit or `_` just before it (and, for a word
/// that ends in a letter, none just after it).
fn word_starts<'a>(lower: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    lower.match_indices(word).map(|(at, _)| at).filter(move |&at| {
        let before = at == 0 || !word_char_at(lower, at - 1);
        let after = !word.ends_with(|c: char| c.is_ascii_alphanumeric()) || !word_char_at(lower, at + word.len());
        before && after
    })
}

/// After a keyword ending at `from`: the end of ` 17`, ` #17` or (for `stop`) ` 3x`, if that
/// follows. With `count_sense`, a bare number followed by a word is a count ("issue 32
/// commands"), not a label.
fn numbered(lower: &str, from: usize, count_sense: bool) -> Option<usize> {
    let rest = &lower[from..];
    let spaces = rest.len() - rest.trim_start_matches(' ').len();
    if spaces == 0 {
        return None;
    }
    let mut at = from + spaces;
    let hash = lower[at..].starts_with('#');
    at += usize::from(hash);
    let n = digits_at(lower, at);
    if n == 0 {
        return None;
    }
    at += n;
    if !count_sense && lower[at..].starts_with('x') {
        at += 1;
    }
    if word_char_at(lower, at) {
        return None;
    }
    let counted = lower[at..].strip_prefix(' ').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()));
    (hash || !count_sense || !counted).then_some(at)
}

/// How many ASCII digits start at `at`.
fn digits_at(s: &str, at: usize) -> usize {
    s.get(at..).map_or(0, |r| r.bytes().take_while(u8::is_ascii_digit).count())
}

/// Whether the byte at `at` is a letter, digit or `_` (false past the end).
fn word_char_at(s: &str, at: usize) -> bool {
    s.as_bytes().get(at).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_kind_of_label_as_written() {
        let page = "# Title\n\
                    H200 run for Issue 17 (small I/O); see issue #5 and #27.\n\
                    Measured in this session, then This Round again, as stop 3x said.\n\
                    Merged from branch 'fio' (refs/heads/fio-engine), rebased on origin/main.\n";
        let found: Vec<(usize, String)> = check_labels(&[Doc::new("docs/page.md", page)])
            .into_iter()
            .map(|f| match f.problem {
                Problem::TrackingLabel { label } => (f.line, label),
                other => panic!("{other:?}"),
            })
            .collect();
        let want = [
            (2, "Issue 17"),
            (2, "issue #5"),
            (2, "#27"),
            (3, "this session"),
            (3, "This Round"),
            (3, "stop 3x"),
            (4, "branch fio"),
            (4, "refs/heads/fio-engine"),
            (4, "origin/main"),
        ];
        assert_eq!(found, want.map(|(l, s)| (l, s.to_owned())));
    }

    #[test]
    fn leaves_ordinary_prose_alone() {
        let page = "## 2. Setup\n\
                    ugds can issue 32 commands at once; the issues are listed below.\n\
                    A controller never stops; a session of RDMA CM; the round trip.\n\
                    `#define X 1`, `&#39;`, color #fff, a1#2, NVMe-oF branch API, the fio branch.\n\
                    Stop the queue before unbinding; a nonstop 3-way split.\n";
        assert_eq!(check_labels(&[Doc::new("docs/page.md", page)]), []);
    }

    #[test]
    fn a_text_file_header_ends_at_the_first_blank_line() {
        assert_eq!(header("# run for issue 17\n# second\n\noutput #3\n"), "# run for issue 17\n# second\n");
        assert_eq!(header("\nissue 17\n"), "");
        assert_eq!(header("only\n"), "only\n");
    }
}
