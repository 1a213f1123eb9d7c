//! The README's figures against the recorded files it names beside them.

use crate::markdown::units;
use crate::{read, Doc, Error, Finding, Problem};
use std::collections::HashMap;
use std::path::Path;

/// Checks every ratio in `readme` (`2.57x`, `1.46–4.14x`, `0.9×`) against the recorded files
/// named beside it: in its table row (or, for a row that names none, the paragraph just before
/// its table), or in its paragraph, list item or heading. Each number of the figure must
/// appear, as written, in one of those files; a figure with no recorded file beside it fails
/// too. Recorded files are the files under docs/bench and docs/gpu other than their READMEs and
/// plots.
pub fn check_figures(root: &Path, readme: &Doc) -> Result<Vec<Finding>, Error> {
    let mut files: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    // The recorded files of the paragraph a table follows.
    let mut caption: Vec<String> = Vec::new();
    let mut last_prose: Vec<String> = Vec::new();
    let mut in_table = false;
    for unit in units(&readme.text) {
        let named = recorded_files(root, &unit.text);
        if unit.row {
            if !in_table {
                caption = last_prose.clone();
                in_table = true;
            }
        } else {
            in_table = false;
            last_prose = named.clone();
        }
        let beside = if unit.row && named.is_empty() { &caption } else { &named };
        for fig in figures(&unit.text) {
            let problem = if beside.is_empty() {
                Some(Problem::FigureWithoutFile { figure: fig.text.clone() })
            } else {
                let mut found = true;
                for number in &fig.numbers {
                    let mut any = false;
                    for f in beside {
                        if !files.contains_key(f) {
                            files.insert(f.clone(), read(&root.join(f))?);
                        }
                        any |= contains_number(&files[f], number);
                    }
                    found &= any;
                }
                (!found).then(|| Problem::FigureNotInFile { figure: fig.text.clone(), files: beside.join(", ") })
            };
            if let Some(problem) = problem {
                out.push(Finding { file: readme.path.clone(), line: unit.line, problem });
            }
        }
    }
    Ok(out)
}

/// The recorded files a text names (existing files under docs/bench or docs/gpu, no plots).
fn recorded_files(root: &Path, text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .split(|c: char| c.is_whitespace() || "`()[],;|\"'".contains(c))
        .map(|w| w.trim_end_matches(['.', ':']))
        .filter(|w| w.starts_with("docs/bench/") || w.starts_with("docs/gpu/"))
        .filter(|w| !w.ends_with(".png") && crate::is_recorded(Path::new(w)) && root.join(w).is_file())
        .map(str::to_owned)
        .collect();
    out.dedup();
    out
}

/// A ratio as written, and its numbers (two for a range).
#[derive(Debug, PartialEq)]
struct Figure {
    text: String,
    numbers: Vec<String>,
}

/// The ratios of a text: a number (or a range of two, joined by `–` or `-`) followed at once
/// by `x` or `×` that no letter or digit follows (so `0x1F`, `x86` and `4 x 8` are not ratios).
fn figures(text: &str) -> Vec<Figure> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let number_at = |i: usize| -> usize {
        let mut j = i;
        while j < c.len() && c[j].is_ascii_digit() {
            j += 1;
        }
        if j > i && j + 1 < c.len() && c[j] == '.' && c[j + 1].is_ascii_digit() {
            j += 1;
            while j < c.len() && c[j].is_ascii_digit() {
                j += 1;
            }
        }
        j
    };
    while i < c.len() {
        let starts = c[i].is_ascii_digit() && (i == 0 || !(c[i - 1].is_alphanumeric() || "._".contains(c[i - 1])));
        if !starts {
            i += 1;
            continue;
        }
        let a_end = number_at(i);
        let mut numbers = vec![c[i..a_end].iter().collect::<String>()];
        let mut end = a_end;
        if a_end < c.len() && (c[a_end] == '–' || c[a_end] == '-') {
            let b_end = number_at(a_end + 1);
            if b_end > a_end + 1 {
                numbers.push(c[a_end + 1..b_end].iter().collect());
                end = b_end;
            }
        }
        let is_ratio =
            end < c.len() && (c[end] == 'x' || c[end] == '×') && c.get(end + 1).is_none_or(|n| !n.is_alphanumeric());
        if is_ratio {
            out.push(Figure { text: c[i..=end].iter().collect(), numbers });
            i = end + 1;
        } else {
            i = end.max(i + 1);
        }
    }
    out
}

/// Whether `text` holds `number` as a whole number (not as part of a longer one).
fn contains_number(text: &str, number: &str) -> bool {
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + number.len()..];
        let mut a = after.chars();
        let next = a.next();
        let decimal_follows = next == Some('.') && a.next().is_some_and(|d| d.is_ascii_digit());
        !before.is_some_and(|b| b.is_ascii_digit() || b == '.')
            && !next.is_some_and(|n| n.is_ascii_digit())
            && !decimal_follows
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_found_and_hex_or_products_are_not() {
        let f = figures("2.57x, 1.46–4.14x and 3× but not 0x1F, x86, 4 x 8, v2x2 or 1.5xl");
        let t: Vec<&str> = f.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(t, ["2.57x", "1.46–4.14x", "3×"]);
        assert_eq!(f[1].numbers, ["1.46", "4.14"]);
    }

    #[test]
    fn whole_numbers_only() {
        assert!(contains_number("| 2.57x |", "2.57"));
        assert!(!contains_number("12.57x", "2.57"));
        assert!(!contains_number("2.575", "2.57"));
        assert!(!contains_number("1.50", "1.5"));
        assert!(contains_number("ratio 1.5.", "1.5"));
    }

    #[test]
    fn a_figure_must_be_in_the_file_named_beside_it() {
        let root = std::env::temp_dir().join(format!("docs-check-figures-{}", std::process::id()));
        std::fs::create_dir_all(root.join("docs/bench")).unwrap();
        std::fs::write(root.join("docs/bench/r.md"), "| a | 2.57x |\n| b | 0.61x (0.25–0.90) |\n").unwrap();
        let readme = Doc::new(
            "README.md",
            "Recorded in `docs/bench/r.md`:\n\n| x | y |\n| --- | --- |\n| a | 2.57x |\n| b | 2.75x |\n\n\
             - reads 0.25–0.90x (docs/bench/r.md)\n- writes 1.9x, no file\n",
        );
        let got: Vec<String> = check_figures(&root, &readme).unwrap().iter().map(|f| f.to_string()).collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            got,
            [
                "README.md:6: figure 2.75x appears in none of docs/bench/r.md",
                "README.md:9: figure 1.9x names no recorded file (docs/bench/..., docs/gpu/...) beside it",
            ]
        );
    }
}
