//! Methods measured in rounds that take turns, and how one compares with another: the median of
//! the per-round ratios with their range, and `noisy` where either method's own rounds disagree
//! by more than [`NOISY`] (the rule `cargo xtask bench` applies to its repeats). A ratio of two
//! medians would hide a round where the machine stalled one method only; ratios taken round by
//! round show it as a spread.

use serde_json::{json, Value};

/// How far apart (largest over smallest) one method's rounds may be before its comparisons are
/// called noisy.
pub(crate) const NOISY: f64 = 1.5;

/// The median (the mean of the middle two for an even count); 0 for none.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Whether a method's rounds disagree by more than [`NOISY`] (a round of nothing counts as
/// disagreeing).
fn spread_too_wide(v: &[f64]) -> bool {
    let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    !v.is_empty() && (lo <= 0.0 || hi / lo > NOISY)
}

/// One method against another over the same rounds (higher is better for both: GB/s, IOPS).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ratio {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub noisy: bool,
}

impl Ratio {
    /// `a` over `b`, round by round (`a[i]` and `b[i]` measured in round `i`). A round where
    /// `b` measured nothing has no ratio (and makes the comparison noisy); with no ratio at all
    /// every figure is 0.
    pub(crate) fn of(a: &[f64], b: &[f64]) -> Ratio {
        let n = a.len().min(b.len());
        let rs: Vec<f64> = (0..n).filter(|&i| b[i] > 0.0).map(|i| a[i] / b[i]).filter(|r| r.is_finite()).collect();
        let (min, max) =
            rs.iter().copied().reduce(f64::min).zip(rs.iter().copied().reduce(f64::max)).unwrap_or((0.0, 0.0));
        let noisy = rs.len() < n || spread_too_wide(&a[..n]) || spread_too_wide(&b[..n]);
        Ratio { median: median(&rs), min, max, noisy }
    }

    /// The table's cell: `1.23x (1.10–1.30)`, or `noisy (0.80–1.90)` where it is not a result.
    pub(crate) fn cell(&self) -> String {
        if self.noisy {
            format!("noisy ({:.2}–{:.2})", self.min, self.max)
        } else {
            format!("{:.2}x ({:.2}–{:.2})", self.median, self.min, self.max)
        }
    }

    /// The JSON form: `{"median", "range": [min, max], "noisy"}`.
    pub(crate) fn json(&self) -> Value {
        json!({ "median": self.median, "range": [self.min, self.max], "noisy": self.noisy })
    }
}

/// The order in which `n` methods run in round `round`: as listed in even rounds, reversed in
/// odd ones, so that no method always runs first (after another's writes or its cache) or last.
pub(crate) fn order(round: usize, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_is_the_median_of_the_rounds_ratios_with_their_range() {
        // Medians of each method would give 2.0 / 1.0; the rounds say 1.5x to 4x, median 2.
        let r = Ratio::of(&[2.0, 3.0, 2.0], &[1.0, 2.0, 0.5]);
        assert_eq!(r, Ratio { median: 2.0, min: 1.5, max: 4.0, noisy: true });
        let r = Ratio::of(&[2.0, 2.2, 2.1], &[1.0, 1.1, 1.0]);
        assert!((r.median - 2.0).abs() < 1e-9 && !r.noisy, "{r:?}");
        assert_eq!(r.cell(), "2.00x (2.00–2.10)");
        assert_eq!(r.json()["range"][1], 2.1);
        // An even count: the mean of the middle two.
        assert_eq!(Ratio::of(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4]).median, 2.5);
    }

    #[test]
    fn a_method_whose_rounds_disagree_makes_its_comparisons_noisy() {
        let steady = [1.0, 1.1, 1.2];
        assert!(!Ratio::of(&steady, &steady).noisy);
        // 1.6x apart in one method's rounds.
        let r = Ratio::of(&[1.0, 1.6, 1.2], &steady);
        assert!(r.noisy);
        assert!(r.cell().starts_with("noisy ("), "{}", r.cell());
        assert!(Ratio::of(&steady, &[1.0, 0.6, 1.0]).noisy);
        // A round that measured nothing is no result either, and no infinity reaches the JSON.
        let r = Ratio::of(&steady, &[1.0, 0.0, 1.0]);
        assert!(r.noisy && r.max.is_finite() && r.json()["range"][1].is_f64(), "{r:?}");
        let none = Ratio::of(&steady, &[0.0; 3]);
        assert_eq!((none.median, none.min, none.max, none.noisy), (0.0, 0.0, 0.0, true));
    }

    #[test]
    fn methods_take_turns_in_both_orders() {
        assert_eq!(order(0, 3), [0, 1, 2]);
        assert_eq!(order(1, 3), [2, 1, 0]);
        assert_eq!(order(2, 3), [0, 1, 2]);
    }
}
