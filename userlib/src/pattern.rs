//! The test pattern: a reproducible function of (seed, absolute byte offset), so any tool can
//! check data written by `ugds write --pattern SEED` without talking to ugds.
//!
//! The byte at absolute device offset `o` is byte `o % 8` (little-endian) of
//! `splitmix64(seed ^ (o / 8))`, where splitmix64 is
//! `z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//!  z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^ (z >> 31)` (wrapping arithmetic).

/// splitmix64's output function.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern's byte at absolute offset `o`.
#[inline]
fn byte_at(seed: u64, o: u64) -> u8 {
    splitmix64(seed ^ (o / 8)).to_le_bytes()[(o % 8) as usize]
}

/// Fills `buf` with the pattern for absolute offsets `[offset, offset + buf.len())`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    // Bytes up to the first 8-byte boundary, then whole words, then the tail.
    let total = buf.len();
    let head = ((8 - offset % 8) % 8).min(total as u64) as usize;
    let (h, rest) = buf.split_at_mut(head);
    for (i, b) in h.iter_mut().enumerate() {
        *b = byte_at(seed, offset + i as u64);
    }
    let base = offset + head as u64;
    let mut words = rest.chunks_exact_mut(8);
    for (i, w) in words.by_ref().enumerate() {
        w.copy_from_slice(&splitmix64(seed ^ (base / 8 + i as u64)).to_le_bytes());
    }
    let tail = words.into_remainder();
    let tail_off = offset + (total - tail.len()) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = byte_at(seed, tail_off + i as u64);
    }
}

/// The first absolute offset in `[offset, offset + buf.len())` whose byte differs from the
/// pattern, if any.
pub fn first_mismatch(seed: u64, offset: u64, buf: &[u8]) -> Option<u64> {
    let mut want = [0u8; 4096];
    for (ci, chunk) in buf.chunks(4096).enumerate() {
        let o = offset + (ci * 4096) as u64;
        fill(seed, o, &mut want[..chunk.len()]);
        if chunk != &want[..chunk.len()] {
            let i = chunk.iter().zip(want.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Some(o + i as u64);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_absolute_offset_only() {
        let mut a = vec![0u8; 100];
        fill(7, 1000, &mut a);
        let mut b = vec![0u8; 10];
        fill(7, 1050, &mut b);
        assert_eq!(&a[50..60], &b[..]);
        assert_eq!(first_mismatch(7, 1000, &a), None);
        a[33] ^= 1;
        assert_eq!(first_mismatch(7, 1000, &a), Some(1033));
        // Known value: seed 0, offset 0 is the low byte of splitmix64(0).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        // Word-wise filling equals the byte-wise definition for every alignment.
        for off in 0..16u64 {
            let mut v = vec![0u8; 37];
            fill(5, off, &mut v);
            for (i, b) in v.iter().enumerate() {
                assert_eq!(*b, byte_at(5, off + i as u64));
            }
        }
    }
}
