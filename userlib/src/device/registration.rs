//! `Registration`: memory the module pinned or attached for one controller's DMA.

use super::{revocation, Inner};
use crate::cmd::{DmaRange, Stride};
use crate::error::Result;
use crate::prp::{self, PAGE};
use crate::sys::req;
use std::sync::Arc;
use ugds_uapi::ioctl::*;

/// Memory the module pinned (host pages) or attached (dma-buf) for this controller's DMA: its
/// handle and DMA segments. Deregistered on drop. It owns no memory and counts nothing: the
/// [`crate::Buffer`] that holds it owns the memory and the lease that says whether the SSD may
/// be using it, and drops its registrations only when no lease is outstanding. A command that
/// may still run after its I/O gave up leaves an [`InFlight`] token behind, which keeps that
/// lease for good: so a registration is dropped only once nothing in flight names it.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) dev: Arc<Inner>,
    pub(super) handle: RegistrationHandle,
    pub(super) segments: SegmentTable,
    /// A dma-buf, which its exporter may revoke; `None`: pinned host pages, never revoked.
    pub(super) live: Option<revocation::Liveness>,
}

impl Registration {
    /// The controller epoch its segments may be named in: any (`None`, host pages), or the
    /// current one once it is known alive in it.
    #[inline]
    fn valid_epoch(&self) -> Result<Option<u64>> {
        self.live.as_ref().map(|l| l.epoch(&self.dev, self.handle)).transpose()
    }

    /// How many contiguous bus ranges the module found the memory in.
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Bytes `[off, off + len)` of the registration for one command: checked alive first where
    /// its exporter may revoke it, and then valid only in the controller epoch of that check.
    ///
    /// # Safety
    ///
    /// As [`DmaRange::new`], except that the registration's liveness is checked here.
    // Always inlined: out of line, returning the range (72 bytes) through a `Result` cost a
    // 4 KiB read 50 more instructions of the cost benchmark's 1273.
    #[inline(always)]
    pub(crate) unsafe fn range(&self, off: u64, len: u64) -> Result<DmaRange<'_>> {
        let (segs, off) = self.segments.from(off);
        // SAFETY: the caller's contract (the segments from the one holding `off` on are the
        // registration's, and `off` is relative to the first of them); a revocable registration
        // is named only in the epoch it was found alive in (a revocation resets the controller
        // first, moving the epoch on).
        let r = unsafe { DmaRange::new(segs, off, len) };
        self.alive(r)
    }

    /// `r`, valid only in the controller epoch this registration is found alive in (any
    /// epoch for host pages).
    #[inline(always)]
    fn alive<'a>(&self, r: DmaRange<'a>) -> Result<DmaRange<'a>> {
        Ok(match self.valid_epoch()? {
            None => r,
            Some(epoch) => r.only_in(epoch),
        })
    }

    /// `len` bytes gathered from pieces laid out as `stride` says, the first at `off`, for one
    /// command; checked alive as [`Registration::range`].
    ///
    /// # Safety
    ///
    /// As [`DmaRange::gather`], except that the registration's liveness is checked here.
    #[inline]
    pub(crate) unsafe fn gather(&self, off: u64, stride: Stride, len: u64) -> Result<DmaRange<'_>> {
        let (segs, off) = self.segments.from(off);
        // SAFETY: as in `range`, for every piece.
        let r = unsafe { DmaRange::gather(segs, off, stride, len) };
        self.alive(r)
    }

    /// Whether a command's data may jump from the byte before `end` to byte `start`: the first
    /// ends a page on the bus and the second starts one, as PRP list entries need.
    pub(crate) fn jumps_between_pages(&self, end: u64, start: u64) -> bool {
        let bus = |off: u64| {
            let (segs, rel) = self.segments.from(off);
            prp::locate(segs, rel, &mut (0, 0)).map(|(addr, _)| addr)
        };
        let ends = end.checked_sub(1).and_then(bus).is_some_and(|a| (a + 1).is_multiple_of(PAGE));
        ends && bus(start).is_some_and(|a| a.is_multiple_of(PAGE))
    }
}

/// A registration's DMA segments and the offset in the registration where each starts, so
/// that a command's range begins its walk at the segment holding its first byte (a binary
/// search) rather than at the first segment: 128 MiB of ordinary pages came back in 7012
/// segments, and walking them from the start for every command cost `ugds bench` (1 MiB reads
/// at QD 32) 4.7x the CPU per read of a 40-segment buffer.
#[derive(Debug, Default)]
pub(crate) struct SegmentTable {
    segments: Vec<Segment>,
    /// `starts[i]`: the sum of the lengths of the segments before segment `i`.
    starts: Vec<u64>,
}

impl SegmentTable {
    /// The table of `segments`, in registration order.
    pub(crate) fn new(segments: Vec<Segment>) -> Self {
        let starts = segments
            .iter()
            .scan(0u64, |end, s| {
                let start = *end;
                // Saturating: a sum past u64 names no byte a range can reach.
                *end = end.saturating_add(s.len);
                Some(start)
            })
            .collect();
        SegmentTable { segments, starts }
    }

    /// How many segments.
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }

    /// The segments from the one holding byte `off` of the registration on (the last one when
    /// `off` lies past them, so the range is refused when it is built), and `off` relative to
    /// the first of them.
    #[inline]
    fn from(&self, off: u64) -> (&[Segment], u64) {
        if self.segments.len() <= 1 {
            // One contiguous run (huge pages, most GPU memory): nothing to search.
            return (&self.segments, off);
        }
        let i = self.starts.partition_point(|&s| s <= off).saturating_sub(1);
        match self.starts.get(i) {
            Some(&start) => (&self.segments[i..], off - start),
            None => (&self.segments, off),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.dev.born.in_child() {
            // The parent's registration: deregistering it from here would unpin the parent's
            // memory under its commands (the module refuses a non-opener anyway).
            return;
        }
        let mut d = Deregister { id: self.handle.id, generation: self.handle.generation };
        // SAFETY: no command names the registration any more: its buffer drops it only with no
        // I/O lease outstanding, and a command that may still run keeps its lease for good (an
        // `InFlight` token) unless a reset confirmed the controller stopped.
        let _ = unsafe { self.dev.fd.ioctl_unchecked(req::Deregister, &mut d) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mock_device::mock_device;
    use crate::mock::MockConfig;
    use crate::prp::PAGE;
    use std::time::Duration;

    /// A fragmented buffer (thousands of one-page segments, as 128 MiB of ordinary pages came
    /// back in the VM): a command's range is walked from the segment holding its first byte,
    /// not from the registration's first segment.
    #[test]
    fn a_range_starts_at_the_segment_holding_its_offset() {
        let (dev, _mock) = mock_device(MockConfig::default(), Duration::from_secs(1)).unwrap();
        const N: u64 = 4096;
        // Scattered pages, and one longer run in the middle.
        let segments: Vec<Segment> = (0..N)
            .map(|i| Segment {
                dma_addr: 0x1000_0000 + ((i * 2477) % N) * 2 * PAGE,
                len: if i == 100 { 3 * PAGE } else { PAGE },
            })
            .collect();
        let start = |i: u64| if i <= 100 { i * PAGE } else { (i + 2) * PAGE };
        let reg = Registration {
            dev: dev.inner.clone(),
            handle: RegistrationHandle::default(),
            segments: SegmentTable::new(segments.clone()),
            live: None,
        };
        for (seg, within) in [(0, 0), (5, 8), (100, 2 * PAGE + 4), (101, 0), (N - 1, 512)] {
            let off = start(seg) + within;
            // SAFETY: no command is built from the range.
            let r = unsafe { reg.range(off, 512) }.unwrap();
            let (segs, rel) = r.parts();
            assert_eq!(segs.len() as u64, N - seg, "offset {off}: the walk starts at segment {seg}");
            assert_eq!((segs[0].dma_addr, rel), (segments[seg as usize].dma_addr, within), "offset {off}");
        }
        // Past the end: nothing to start at, and the builders refuse it.
        // SAFETY: as above.
        let r = unsafe { reg.range(start(N), 512) }.unwrap();
        assert_eq!(crate::prp::locate(r.parts().0, r.parts().1, &mut (0, 0)), None);
    }
}
