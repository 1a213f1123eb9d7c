//! Repeated, interleaved measurements. Each point of a grid is measured several times per
//! engine, the engines alternating (kernel, ugds, ugds, kernel, kernel, ugds), so that a
//! transient of the machine (the host's writeback, another process) lands on both sides rather
//! than on a stretch of one engine's points. A point then reports each engine's medians and the
//! median of the per-repeat ratios with their range; a point where an engine's repeats disagree
//! by more than [`NOISY`] is marked noisy and is not a result.

use serde_json::{json, Value};

/// An engine's repeats at a point disagree when the largest IOPS is more than this many times
/// the smallest.
pub const NOISY: f64 = 1.5;

/// The fields besides `iops` a point's medians are taken of (those the point has): latencies,
/// SPDK's own throughput and average, min and max latency, and the I/Os per round of a batch
/// or of SPDK's poller.
const LATENCIES: &[&str] =
    &["p50_us", "p99_us", "lat_p50_us", "lat_p99_us", "mib_s", "avg_us", "min_us", "max_us", "ios_per_round"];

/// The median (the mean of the middle two for an even count); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn num(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

/// One point per engine and position on the grid (`keys`, with `engine`) from the repeats'
/// points, in first-seen order: the first repeat's fields, `iops` and the latencies replaced by
/// their medians (SPDK's MiB/s and average, min and max latency too), plus `iops_repeats` (in the order measured) and `iops_spread` (largest over
/// smallest).
pub fn merge(points: &[Value], keys: &[&str]) -> Vec<Value> {
    let same = |a: &Value, b: &Value| a["engine"] == b["engine"] && keys.iter().all(|k| a[*k] == b[*k]);
    let mut groups: Vec<Vec<&Value>> = Vec::new();
    for p in points {
        match groups.iter_mut().find(|g| same(g[0], p)) {
            Some(g) => g.push(p),
            None => groups.push(vec![p]),
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let mut m = g[0].clone();
            let iops: Vec<f64> = g.iter().map(|p| num(p, "iops").unwrap_or(0.0)).collect();
            m["iops"] = json!(median(&iops));
            for k in LATENCIES {
                let v: Vec<f64> = g.iter().filter_map(|p| num(p, k)).collect();
                if !v.is_empty() {
                    m[*k] = json!(median(&v));
                }
            }
            let lo = iops.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = iops.iter().copied().fold(0.0, f64::max);
            // All zero: they agree; a zero among non-zero ones: as far apart as can be said.
            let spread = if lo > 0.0 {
                hi / lo
            } else if hi > 0.0 {
                1e9
            } else {
                1.0
            };
            m["iops_spread"] = json!(spread);
            m["iops_repeats"] = json!(iops);
            if let Some(o) = m.as_object_mut() {
                o.remove("repeat");
            }
            m
        })
        .collect()
}

/// `u` against `k` (both merged points): the median and range of the per-repeat IOPS ratios
/// (repeat i of one over repeat i of the other: measured next to each other), and whether either
/// side was noisy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// Median of the per-repeat ratios.
    pub median: f64,
    /// Smallest per-repeat ratio.
    pub min: f64,
    /// Largest per-repeat ratio.
    pub max: f64,
    /// An engine's repeats disagreed by more than [`NOISY`].
    pub noisy: bool,
}

fn repeats(v: &Value) -> Vec<f64> {
    v["iops_repeats"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
}

/// The ratio of `u` over `k`; points without repeats count as one repeat each.
pub fn ratio(u: &Value, k: &Value) -> Ratio {
    let (mut ur, mut kr) = (repeats(u), repeats(k));
    if ur.is_empty() {
        ur.push(num(u, "iops").unwrap_or(0.0));
    }
    if kr.is_empty() {
        kr.push(num(k, "iops").unwrap_or(0.0));
    }
    let n = ur.len().min(kr.len());
    let rs: Vec<f64> = (0..n).map(|i| ur[i] / kr[i].max(1.0)).collect();
    of_ratios(&rs, noisy(u, k))
}

/// Whether either of two merged points was noisy (its repeats' IOPS more than [`NOISY`] apart).
pub fn noisy(u: &Value, k: &Value) -> bool {
    let spread = |v: &Value| num(v, "iops_spread").unwrap_or(1.0);
    spread(u) > NOISY || spread(k) > NOISY
}

/// The median and range of per-repeat ratios `rs`, `noisy` as given.
pub fn of_ratios(rs: &[f64], noisy: bool) -> Ratio {
    Ratio {
        median: median(rs),
        min: rs.iter().copied().fold(f64::INFINITY, f64::min),
        max: rs.iter().copied().fold(0.0, f64::max),
        noisy,
    }
}

/// Adds `iops_ratio` (the median), `iops_ratio_range` and `noisy` to `u`.
pub fn annotate(u: &mut Value, r: Ratio) {
    u["iops_ratio"] = json!(r.median);
    u["iops_ratio_range"] = json!([r.min, r.max]);
    u["noisy"] = json!(r.noisy);
}

/// A ratio cell: `1.23x (1.10–1.40)` over several repeats, `1.23x` over one, `noisy (…)` when
/// the repeats disagree.
pub fn cell(r: Ratio) -> String {
    let range = if r.max > r.min { format!(" ({:.2}–{:.2})", r.min, r.max) } else { String::new() };
    if r.noisy {
        format!("noisy{range}")
    } else {
        format!("{:.2}x{range}", r.median)
    }
}

/// The geometric mean of the ratios that are results (not noisy), and how many were noisy.
pub fn summary(rs: &[Ratio]) -> (Option<f64>, usize) {
    let good: Vec<f64> = rs.iter().filter(|r| !r.noisy && r.median > 0.0).map(|r| r.median.ln()).collect();
    let noisy = rs.iter().filter(|r| r.noisy).count();
    let g = (!good.is_empty()).then(|| (good.iter().sum::<f64>() / good.len() as f64).exp());
    (g, noisy)
}

/// The order of a point's measurements: `repeats` rounds of both sides, each round starting on
/// the side the previous one ended on (`start` for the first), so a side's turn needs one
/// switch (a rebind of the controller) per round. `true` is the second side.
pub fn order(repeats: usize, start: bool) -> Vec<(usize, bool)> {
    snake(repeats, 2, usize::from(start)).into_iter().map(|(r, s)| (r, s == 1)).collect()
}

/// The order of a point's measurements over `sides` sides in a line, where a switch costs one
/// step between neighbours (the ugds driver, the kernel's nvme driver, uio_pci_generic for
/// SPDK): `repeats` rounds, each visiting every side once, end to end, each round going back
/// the way the previous one came, so a round starts on the side the last one ended on. The
/// first round starts at the end nearer `start` (the side the controller is with), the first
/// end on a tie. Returns (repeat, side) pairs.
pub fn snake(repeats: usize, sides: usize, start: usize) -> Vec<(usize, usize)> {
    let last = sides.saturating_sub(1);
    let at = start.min(last);
    let mut forward = at <= last - at;
    let mut out = Vec::with_capacity(repeats * sides);
    for r in 0..repeats {
        if forward {
            out.extend((0..sides).map(|s| (r, s)));
        } else {
            out.extend((0..sides).rev().map(|s| (r, s)));
        }
        forward = !forward;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(engine: &str, repeat: usize, iops: f64, p50: f64) -> Value {
        json!({"engine": engine, "rw": "randread", "size": "4K", "depth": 1, "repeat": repeat, "iops": iops, "p50_us": p50})
    }

    #[test]
    fn medians_of_odd_even_and_empty_sets() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    /// Repeats merge into one point per engine with medians, the repeats in measured order and
    /// their spread; points elsewhere on the grid stay apart.
    #[test]
    fn repeats_merge_per_engine_and_position() {
        let mut pts = vec![p("kernel", 0, 100.0, 10.0), p("ugds", 0, 300.0, 5.0), p("ugds", 1, 200.0, 7.0)];
        pts.push(p("kernel", 1, 120.0, 12.0));
        pts.push(p("kernel", 2, 110.0, 30.0));
        pts.push(p("ugds", 2, 250.0, 6.0));
        let mut other = p("kernel", 0, 5.0, 1.0);
        other["depth"] = json!(8);
        pts.push(other);
        let m = merge(&pts, &["rw", "size", "depth"]);
        assert_eq!(m.len(), 3);
        let k = &m[0];
        assert_eq!(
            (k["engine"].as_str(), k["iops"].as_f64(), k["p50_us"].as_f64()),
            (Some("kernel"), Some(110.0), Some(12.0))
        );
        assert_eq!(k["iops_repeats"], json!([100.0, 120.0, 110.0]));
        assert!((k["iops_spread"].as_f64().unwrap() - 1.2).abs() < 1e-9);
        assert!(k.get("repeat").is_none());
        assert_eq!(m[1]["iops"], json!(250.0));
        assert_eq!(m[2]["iops_repeats"], json!([5.0]));
        // Ratios pair repeat i with repeat i: 3.0, 1.667, 2.273.
        let r = ratio(&m[1], &m[0]);
        assert!((r.median - 250.0 / 110.0).abs() < 1e-9 && (r.min - 200.0 / 120.0).abs() < 1e-9 && r.max == 3.0);
        assert!(!r.noisy);
        assert_eq!(cell(r), "2.27x (1.67–3.00)");
    }

    /// A side whose repeats disagree by more than NOISY makes the point noisy: it is reported as
    /// such and left out of the summary.
    #[test]
    fn disagreeing_repeats_are_noisy_not_results() {
        let k = merge(&[p("kernel", 0, 100.0, 1.0), p("kernel", 1, 100.0, 1.0)], &["rw"]);
        let u = merge(&[p("ugds", 0, 100.0, 1.0), p("ugds", 1, 160.0, 1.0)], &["rw"]);
        let r = ratio(&u[0], &k[0]);
        assert!(r.noisy);
        assert!(cell(r).starts_with("noisy"), "{}", cell(r));
        let quiet = Ratio { median: 2.0, min: 2.0, max: 2.0, noisy: false };
        let (g, n) = summary(&[r, quiet, Ratio { median: 0.5, ..quiet }]);
        assert_eq!(n, 1);
        assert!((g.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(summary(&[r]), (None, 1));
    }

    /// Each round starts where the last ended: one switch per round, both sides in every round.
    #[test]
    fn rounds_alternate_with_one_switch_each() {
        assert_eq!(order(3, false), vec![(0, false), (0, true), (1, true), (1, false), (2, false), (2, true)]);
        let o = order(2, true);
        assert_eq!(o, vec![(0, true), (0, false), (1, false), (1, true)]);
        let switches = o.windows(2).filter(|w| w[0].1 != w[1].1).count();
        assert_eq!(switches, 2);
    }

    /// Three sides in a line (ugds, kernel, SPDK): every round measures each once, rounds go
    /// back and forth, so consecutive measurements are never more than one switch apart; from
    /// the middle (the kernel's driver, where a controller starts) the first end is nearer.
    #[test]
    fn three_sides_snake_with_single_steps() {
        let o = snake(3, 3, 1);
        assert_eq!(o, vec![(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]);
        assert!(o.windows(2).all(|w| w[0].1.abs_diff(w[1].1) <= 1));
        for r in 0..3 {
            let mut sides: Vec<usize> = o.iter().filter(|(rr, _)| *rr == r).map(|(_, s)| *s).collect();
            sides.sort();
            assert_eq!(sides, [0, 1, 2]);
        }
        // Ending on SPDK's side (2), the next point starts there.
        assert_eq!(snake(2, 3, 2), vec![(0, 2), (0, 1), (0, 0), (1, 0), (1, 1), (1, 2)]);
        assert_eq!(snake(1, 3, 0)[0], (0, 0));
        assert_eq!(snake(2, 1, 0), vec![(0, 0), (1, 0)]);
    }
}
