//! `cargo xtask bench --baseline-cli PATH`: another build's `ugds` CLI runs `ugds bench` in the
//! same turns as ours (engine [`BASELINE`]), the two taking turns at going first, so that two
//! builds of the library are compared within one boot: the emulated device's figures move
//! between boots by more than most changes are worth.

use super::{f, repeats, summary_of, BASELINE, UGDS};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The baseline CLI `given`, as the absolute path the guest runs it by (the host's file system
/// is the guest's, read-only, at the same paths), checked to be an executable file.
pub(super) fn checked(given: &Path) -> Result<PathBuf> {
    let path = std::fs::canonicalize(given).with_context(|| format!("--baseline-cli {}", given.display()))?;
    let meta = std::fs::metadata(&path).with_context(|| format!("--baseline-cli {}", given.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        bail!("--baseline-cli {}: not an executable file", given.display());
    }
    Ok(path)
}

/// Our `ugds bench` against the baseline's at one point: ratios of ours over the baseline's,
/// each the median of the per-repeat ratios (the two measurements of a repeat paired).
#[derive(Debug, Clone, Copy)]
pub(super) struct Versus {
    /// Our merged point's index.
    ours: usize,
    /// The baseline's merged point's index.
    theirs: usize,
    /// IOPS, ours over the baseline's: above 1 is more for this build.
    iops: repeats::Ratio,
    /// p50 latency, ours over the baseline's: below 1 is lower for this build; `None` where
    /// no repeat has both.
    p50: Option<repeats::Ratio>,
}

/// Every point where both `ugds bench`s ran, from the merged `points` and the raw
/// measurements they came from (`raw`, each with its `repeat`), in the points' order; a
/// point is where `keys` are equal (backend, rw, size and depth; `members` too for volumes).
pub(super) fn compare(raw: &[Value], points: &[Value], keys: &[&str]) -> Vec<Versus> {
    let mut out = Vec::new();
    for (ours, u) in points.iter().enumerate().filter(|(_, p)| p["engine"] == UGDS) {
        let at = |engine: &'static str| {
            raw.iter().filter(move |p| p["engine"] == engine && keys.iter().all(|k| p[*k] == u[*k]))
        };
        let Some(theirs) = points.iter().position(|b| b["engine"] == BASELINE && keys.iter().all(|k| b[*k] == u[*k]))
        else {
            continue;
        };
        let (mut iops, mut p50) = (Vec::new(), Vec::new());
        for o in at(UGDS) {
            let Some(b) = at(BASELINE).find(|b| b["repeat"] == o["repeat"]) else { continue };
            iops.push(f(o, "iops") / f(b, "iops").max(1.0));
            if f(o, "p50_us") > 0.0 && f(b, "p50_us") > 0.0 {
                p50.push(f(o, "p50_us") / f(b, "p50_us"));
            }
        }
        if iops.is_empty() {
            continue;
        }
        let noisy = repeats::noisy(u, &points[theirs]);
        let p50 = (!p50.is_empty()).then(|| repeats::of_ratios(&p50, noisy));
        out.push(Versus { ours, theirs, iops: repeats::of_ratios(&iops, noisy), p50 });
    }
    out
}

/// Adds to each of our points compared `baseline_iops_ratio` (ours over the baseline's, the
/// median), `baseline_iops_ratio_range`, `baseline_noisy`, and `baseline_p50_ratio` with its
/// range where there is one.
pub(super) fn annotate(points: &mut [Value], versus: &[Versus]) {
    for v in versus {
        let u = &mut points[v.ours];
        u["baseline_iops_ratio"] = json!(v.iops.median);
        u["baseline_iops_ratio_range"] = json!([v.iops.min, v.iops.max]);
        u["baseline_noisy"] = json!(v.iops.noisy);
        if let Some(r) = v.p50 {
            u["baseline_p50_ratio"] = json!(r.median);
            u["baseline_p50_ratio_range"] = json!([r.min, r.max]);
        }
    }
}

/// The markdown of the comparison: a row per point, then per controller the geometric means.
/// A volume's points (with `members`) get a members column.
pub(super) fn table(points: &[Value], versus: &[Versus], cli: &Path) -> String {
    let members = versus.iter().any(|v| points[v.ours].get("members").is_some());
    let (head, rule) = if members { ("members | ", "---: | ") } else { ("", "") };
    let mut s = format!(
        "\n### ugds/baseline: this build's `ugds bench` against {}'s\n\nIn the same turns on the same controller, the two going first by turns (this build in even repeats, the baseline in odd ones); a ratio is the median of the ratios of the two measurements of each repeat, with their range in brackets. ugds/baseline IOPS above 1 is more IOPS for this build; ugds/baseline p50 is this build's p50 latency over the baseline's: below 1 is lower latency for this build.\n\n| controller | {head}rw | size | QD/batch | ugds IOPS | baseline IOPS | ugds/baseline IOPS | ugds p50 us | baseline p50 us | ugds/baseline p50 |\n| --- | {rule}--- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        cli.display()
    );
    for v in versus {
        let (u, b) = (&points[v.ours], &points[v.theirs]);
        let n = if members { format!("{} | ", u["members"]) } else { String::new() };
        let _ = writeln!(
            s,
            "| {} | {n}{} | {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.1} | {} |",
            u["backend"].as_str().unwrap_or(""),
            u["rw"].as_str().unwrap_or(""),
            u["size"].as_str().unwrap_or(""),
            u["depth"],
            f(u, "iops"),
            f(b, "iops"),
            repeats::cell(v.iops),
            f(u, "p50_us"),
            f(b, "p50_us"),
            v.p50.map_or_else(|| "–".into(), repeats::cell),
        );
    }
    s.push('\n');
    for backend in ["file", "null"] {
        let here: Vec<&Versus> = versus.iter().filter(|v| points[v.ours]["backend"] == backend).collect();
        let iops: Vec<repeats::Ratio> = here.iter().map(|v| v.iops).collect();
        let p50: Vec<repeats::Ratio> = here.iter().filter_map(|v| v.p50).collect();
        for l in [
            summary_of(&format!("{backend}: ugds/baseline IOPS"), &iops),
            summary_of(&format!("{backend}: ugds/baseline p50"), &p50),
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(s, "- {l}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{add_ratios, repeats, KEYS};

    /// A measurement of `engine` at `depth` in `repeat`.
    fn m(engine: &str, depth: usize, repeat: usize, iops: f64, p50: f64) -> Value {
        json!({"engine": engine, "backend": "null", "rw": "randread", "size": "4K", "depth": depth,
               "repeat": repeat, "iops": iops, "p50_us": p50, "p99_us": 2.0 * p50})
    }

    /// Three repeats at QD 1 and 8, the machine's speed moving from repeat to repeat (as between
    /// boots) while ours stays 1.25x the baseline's at QD 1 with 0.8x its latency.
    fn measurements() -> Vec<Value> {
        let mut out = Vec::new();
        for (repeat, scale) in [(0, 1.0), (1, 1.3), (2, 0.9)] {
            out.push(m("kernel", 1, repeat, 5000.0 * scale, 100.0));
            // The baseline goes first in odd repeats: the order of the lines does not matter.
            let ours = m(UGDS, 1, repeat, 10000.0 * scale, 40.0);
            let theirs = m(BASELINE, 1, repeat, 8000.0 * scale, 50.0);
            if repeat % 2 == 0 {
                out.extend([ours, theirs]);
            } else {
                out.extend([theirs, ours]);
            }
            // QD 8: 1.0x, 1.1x, 1.2x (median 1.1x); latency 2.0x, 1.0x, 1.5x.
            out.push(m(UGDS, 8, repeat, 20000.0 * (1.0 + repeat as f64 / 10.0), 60.0));
            out.push(m(BASELINE, 8, repeat, 20000.0, [30.0, 60.0, 40.0][repeat]));
        }
        out
    }

    /// Ratios are ours over the baseline's, paired by repeat, medians with their range, and a
    /// geometric mean per controller; the baseline's points leave the kernel's table as it was.
    #[test]
    fn the_baseline_table_has_ours_over_the_baseline() {
        let raw = measurements();
        let mut points = repeats::merge(&raw, KEYS);
        add_ratios(&mut points);
        let versus = compare(&raw, &points, KEYS);
        assert_eq!(versus.len(), 2);
        annotate(&mut points, &versus);
        let t = table(&points, &versus, Path::new("/base/ugds"));
        let row = |qd: &str| {
            let l = t.lines().find(|l| l.starts_with(&format!("| null | randread | 4K | {qd} |"))).expect("row");
            l.split('|').map(str::trim).map(String::from).collect::<Vec<_>>()
        };
        let qd1 = row("1");
        // | controller | rw | size | QD | ugds IOPS | baseline IOPS | ugds/baseline IOPS | ugds p50 | baseline p50 | p50 |
        assert_eq!(&qd1[5..11], &["10000", "8000", "1.25x", "40.0", "50.0", "0.80x"], "{t}");
        let qd8 = row("8");
        assert_eq!(&qd8[7..8], &["1.10x (1.00–1.20)"], "{t}");
        assert_eq!(&qd8[10..11], &["1.50x (1.00–2.00)"], "{t}");
        assert!(t.contains("against /base/ugds's"), "{t}");
        // sqrt(1.25 * 1.1) and sqrt(0.8 * 1.5).
        assert!(
            t.contains("- null: ugds/baseline IOPS: geometric mean 1.17x over 2 points (1.10x to 1.25x), 0 noisy"),
            "{t}"
        );
        assert!(
            t.contains("- null: ugds/baseline p50: geometric mean 1.10x over 2 points (0.80x to 1.50x), 0 noisy"),
            "{t}"
        );
        assert!(!t.contains("file:"), "{t}");
        // The JSON: on our points, and the baseline's against the kernel like ours.
        let get =
            |engine: &str, depth: usize| points.iter().find(|p| p["engine"] == engine && p["depth"] == depth).unwrap();
        assert_eq!(get(UGDS, 1)["baseline_iops_ratio"], json!(1.25));
        assert_eq!(get(UGDS, 8)["baseline_p50_ratio_range"], json!([1.0, 2.0]));
        assert_eq!(get(BASELINE, 1)["iops_ratio"], json!(1.6));
        assert_eq!(get(UGDS, 1)["iops_ratio"], json!(2.0));
        assert!(get(BASELINE, 1).get("baseline_iops_ratio").is_none());
    }

    /// The path must name an executable file; the error says which flag and path.
    #[test]
    fn the_baseline_cli_is_checked() {
        let err = |p: &str| format!("{:#}", checked(Path::new(p)).unwrap_err());
        assert!(
            err("/nonexistent/ugds").starts_with("--baseline-cli /nonexistent/ugds: "),
            "{}",
            err("/nonexistent/ugds")
        );
        assert!(err("/").contains("not an executable file"));
        assert_eq!(checked(Path::new("/bin/sh")).unwrap(), std::fs::canonicalize("/bin/sh").unwrap());
    }
}
