//! NVMe queue rings as plain data: the submission side ([`sq::Sq`]) and the completion side
//! ([`cq::Cq`]) keep their indices and phase; the memory they index is passed in through
//! [`crate::mem::QueueMemory`], so the ring logic runs, and is tested, on ordinary memory too.
//!
//! Indices are slot numbers in `0..depth`, advanced with an explicit wrap, not free-running
//! `Wrapping<u16>` counters as in virtio: an NVMe queue may have any depth from 2 to 65536, and
//! a free-running 16-bit counter maps onto slots only when the depth divides 65536.

pub mod cq;
pub mod sq;

/// Most entries an NVMe queue may have (CAP.MQES is 16 bits, zero-based).
pub const MAX_DEPTH: u32 = 65536;

/// The next slot after `i` in a ring of `depth` slots (`i < depth <= MAX_DEPTH`).
#[inline]
pub(crate) fn next(i: u16, depth: u32) -> u16 {
    let n = i as u32 + 1;
    // CAST: n < depth <= 65536 in the else branch, so it fits u16.
    if n == depth {
        0
    } else {
        n as u16
    }
}
