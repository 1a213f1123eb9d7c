//! Byte sizes as people write them: `4096`, `64K`, `16M`, `1G` (binary multiples), used by the
//! CLI and the tools.

/// Parses a size with an optional K/M/G suffix (powers of 1024).
pub fn parse(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|e| format!("bad size {s:?}: {e}"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

/// The shortest exact form: 4096 → "4K", 1 MiB → "1M", 1000 → "1000".
pub fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_errors() {
        for n in [1u64, 512, 4096, 65536, 3 << 20, 1 << 30, 1000] {
            assert_eq!(parse(&human(n)).unwrap(), n);
        }
        assert_eq!(parse(" 16m ").unwrap(), 16 << 20);
        assert!(parse("x").is_err());
        assert!(parse("99999999999999G").unwrap_err().contains("overflows"));
    }
}
