//! The little of Markdown the checks need: fenced code, inline code spans, paragraphs.

/// A piece of code the docs show: one line of a fenced block (a line ending in `\` joined with
/// the next, as a shell would), or one inline code span.
pub(crate) struct Code {
    /// The line it starts on, from 1.
    pub line: usize,
    /// Its text (a span's line breaks as spaces, a table's `\|` as `|`).
    pub text: String,
    /// From a fenced block (where `#` starts a shell comment) rather than a span.
    pub fenced: bool,
}

/// Whether a line opens or closes a fenced code block.
pub(crate) fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// Every piece of code of a page, in order.
pub(crate) fn code(text: &str) -> Vec<Code> {
    let mut out = Vec::new();
    let mut in_fence = false;
    // Lines outside fences, gathered per paragraph: a span may run over a line break.
    let mut para: Vec<(usize, &str)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if is_fence(line) {
            spans(&para, &mut out);
            para.clear();
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            let (start, mut acc) = pending.take().unwrap_or((n, String::new()));
            match line.strip_suffix('\\') {
                Some(head) => {
                    acc.push_str(head);
                    acc.push(' ');
                    pending = Some((start, acc));
                }
                None => {
                    acc.push_str(line);
                    out.push(Code { line: start, text: acc, fenced: true });
                }
            }
        } else if line.trim().is_empty() {
            spans(&para, &mut out);
            para.clear();
        } else {
            para.push((n, line));
        }
    }
    spans(&para, &mut out);
    if let Some((line, text)) = pending {
        out.push(Code { line, text, fenced: true });
    }
    out
}

/// The inline code spans of a paragraph: a run of N backticks up to the next run of exactly N.
fn spans(para: &[(usize, &str)], out: &mut Vec<Code>) {
    // Each character with its line number, the paragraph's line breaks as spaces.
    let mut chars: Vec<(usize, char)> = Vec::new();
    for (n, l) in para {
        chars.extend(l.chars().map(|c| (*n, c)));
        chars.push((*n, ' '));
    }
    let run_at = |i: usize| chars[i..].iter().take_while(|(_, c)| *c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1 != '`' {
            i += 1;
            continue;
        }
        let open = run_at(i);
        let body = i + open;
        let mut j = body;
        let mut close = None;
        while j < chars.len() {
            if chars[j].1 == '`' {
                let r = run_at(j);
                if r == open {
                    close = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                let text: String = chars[body..j].iter().map(|(_, c)| c).collect();
                out.push(Code { line: chars[i].0, text: text.trim().replace("\\|", "|"), fenced: false });
                i = j + open;
            }
            // An unmatched run is literal backticks.
            None => i = body,
        }
    }
}

/// A unit of prose for the figure check: a heading, a paragraph, a list item or a table row,
/// with the lines it covers.
pub(crate) struct Unit {
    /// Its first line, from 1.
    pub line: usize,
    /// Its text, lines joined with spaces.
    pub text: String,
    /// A table row.
    pub row: bool,
}

/// The units of a page outside fenced code, in order.
pub(crate) fn units(text: &str) -> Vec<Unit> {
    let mut out: Vec<Unit> = Vec::new();
    let mut in_fence = false;
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if is_fence(line) {
            in_fence = !in_fence;
            open = false;
            continue;
        }
        if in_fence || t.is_empty() {
            open = false;
            continue;
        }
        let row = t.starts_with('|');
        let starts_item = t.starts_with("- ") || t.starts_with("* ") || t.starts_with('#') || numbered(t);
        if row || starts_item || !open || out.last().is_some_and(|u| u.row) {
            out.push(Unit { line: i + 1, text: line.to_owned(), row });
        } else if let Some(u) = out.last_mut() {
            u.text.push(' ');
            u.text.push_str(t);
        }
        // A heading ends its unit at once; a table row is one line.
        open = !row && !t.starts_with('#');
    }
    out
}

/// `1. ` and the like: a numbered list item.
fn numbered(t: &str) -> bool {
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && t[digits..].starts_with(". ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_over_line_breaks_and_fences_with_continuations() {
        let text = "a `ugds\nbench --depth 8` b ``x ` y``\n\n```sh\ncargo xtask bench \\\n  --members 1\n# c\n```\n";
        let c = code(text);
        let got: Vec<(usize, &str, bool)> = c.iter().map(|c| (c.line, c.text.as_str(), c.fenced)).collect();
        assert_eq!(
            got,
            [
                (1, "ugds bench --depth 8", false),
                (2, "x ` y", false),
                (5, "cargo xtask bench    --members 1", true),
                (7, "# c", true)
            ]
        );
    }

    #[test]
    fn units_split_items_rows_and_paragraphs() {
        let text = "# H\npara one\ncontinues\n- item\n  more\n- item2\n\n| a |\n| b |\nafter\n";
        let u: Vec<(usize, bool)> = units(text).iter().map(|u| (u.line, u.row)).collect();
        assert_eq!(u, [(1, false), (2, false), (4, false), (6, false), (8, true), (9, true), (10, false)]);
        assert_eq!(units(text)[1].text, "para one continues");
    }
}
