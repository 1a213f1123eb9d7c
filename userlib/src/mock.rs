//! An in-memory NVMe device model for host tests, fuzzing and the data-path cost benchmark:
//! the queues live in ordinary shared memory, and a device thread consumes submission entries
//! and posts completions at once (optionally preceded by hostile ones). Never a substitute for
//! the VM tests against QEMU's NVMe.

use crate::error::{Error, Result};
use crate::mmio::Mapping;
use crate::queue::QueuePair;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use ugds_uapi::ioctl::{CreateQpair, StatusPage};
use ugds_uapi::{Cqe, Status};

/// A completion the device posts before the honest one for the next command.
#[derive(Debug, Clone, Copy)]
pub struct HostileCqe {
    /// Command id to claim (may be unknown or a duplicate).
    pub cid: u16,
    /// SQ head to report (may be out of range).
    pub sq_head: u16,
    /// Raw 15-bit status field.
    pub status: u16,
}

/// How the device answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Completes every command successfully, at once.
    Honest,
    /// Posts these completions first, then behaves honestly.
    Hostile(Vec<HostileCqe>),
}

fn shared(len: usize) -> Result<(Mapping, Mapping)> {
    let name = c"ugds-mock";
    // SAFETY: a valid name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Control { op: "memfd_create", source: io::Error::last_os_error() });
    }
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on our fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::Control { op: "ftruncate", source: io::Error::last_os_error() });
    }
    Ok((Mapping::map(fd.as_raw_fd(), 0, len, true, "mock")?, Mapping::map(fd.as_raw_fd(), 0, len, true, "mock")?))
}

/// A queue pair wired to the in-memory device.
pub struct MockQueue {
    /// The queue pair under test.
    pub qp: QueuePair,
    /// The status page (epoch 1, not faulted).
    pub status: Mapping,
    stop: Arc<AtomicBool>,
    device: Option<JoinHandle<()>>,
    /// In stepped mode: the device, driven by [`MockQueue::step`] on the caller's thread.
    stepped: Option<DeviceSide>,
}

struct DeviceSide {
    sq: Mapping,
    cq: Mapping,
    doorbells: Arc<Mapping>,
    depth: u16,
    state: std::cell::Cell<(u16, u16, bool)>,
}

impl DeviceSide {
    fn post(&self, tail: &mut u16, phase: &mut bool, cqe: Cqe) {
        let d = cqe_dwords(&cqe, *phase);
        let off = *tail as usize * 16;
        self.cq.store32(off, d[0]);
        self.cq.store32(off + 4, d[1]);
        self.cq.store32(off + 8, d[2]);
        // The entry's body must be visible before its phase bit.
        fence(Ordering::Release);
        self.cq.store32(off + 12, d[3]);
        *tail += 1;
        if *tail == self.depth {
            *tail = 0;
            *phase = !*phase;
        }
    }

    /// Consumes every submitted entry and completes it successfully. Returns how many.
    fn step(&self) -> usize {
        let (mut sq_head, mut cq_tail, mut phase) = self.state.get();
        let tail = (self.doorbells.load32(0) as u16) % self.depth;
        fence(Ordering::Acquire);
        let mut n = 0;
        while sq_head != tail {
            let cid = (self.sq.load32(sq_head as usize * 64) >> 16) as u16;
            sq_head = (sq_head + 1) % self.depth;
            self.post(&mut cq_tail, &mut phase, Cqe::new(0, sq_head, 1, cid, Status::SUCCESS, true));
            n += 1;
        }
        self.state.set((sq_head, cq_tail, phase));
        n
    }

    fn run(self, stop: Arc<AtomicBool>, behaviour: Behaviour) {
        let (mut sq_head, mut cq_tail, mut phase) = (0u16, 0u16, true);
        let mut hostile = match behaviour {
            Behaviour::Honest => Vec::new(),
            Behaviour::Hostile(v) => v,
        };
        hostile.reverse();
        while !stop.load(Ordering::Relaxed) {
            let tail = (self.doorbells.load32(0) as u16) % self.depth;
            if tail == sq_head {
                std::hint::spin_loop();
                continue;
            }
            fence(Ordering::Acquire);
            while sq_head != tail {
                let cid = (self.sq.load32(sq_head as usize * 64) >> 16) as u16;
                sq_head = (sq_head + 1) % self.depth;
                if let Some(h) = hostile.pop() {
                    let cqe = Cqe::new(0, h.sq_head, 1, h.cid, Status::from_field(h.status & 0x7FFF), true);
                    self.post(&mut cq_tail, &mut phase, cqe);
                }
                self.post(&mut cq_tail, &mut phase, Cqe::new(0, sq_head, 1, cid, Status::SUCCESS, true));
            }
        }
    }
}

/// The CQE's four dwords with the phase bit set to `phase`.
fn cqe_dwords(c: &Cqe, phase: bool) -> [u32; 4] {
    let st = (c.status().to_field() << 1 | phase as u16) as u32;
    [c.dw0(), 0, c.sq_head() as u32 | (c.sq_id() as u32) << 16, c.cid() as u32 | st << 16]
}

impl MockQueue {
    /// A queue of `depth` entries answered by a device thread with `behaviour`.
    pub fn new(depth: u16, behaviour: Behaviour) -> Result<Self> {
        Self::build(depth, Some(behaviour))
    }

    /// A queue whose device runs only when [`MockQueue::step`] is called, on the caller's
    /// thread: deterministic, for instruction counting.
    pub fn stepped(depth: u16) -> Result<Self> {
        Self::build(depth, None)
    }

    /// Runs the device once: completes everything submitted so far. Returns how many.
    pub fn step(&self) -> usize {
        self.stepped.as_ref().map_or(0, |d| d.step())
    }

    fn build(depth: u16, behaviour: Option<Behaviour>) -> Result<Self> {
        let d = depth as usize;
        let (sq, dsq) = shared(d * 64)?;
        let (cq, dcq) = shared(d * 16)?;
        let (prp, _dprp) = shared(d * 4096)?;
        let (db, _) = shared(4096)?;
        let (status, _) = shared(4096)?;
        status.store32(std::mem::offset_of!(StatusPage, magic), ugds_uapi::ioctl::STATUS_MAGIC);
        status.store64(std::mem::offset_of!(StatusPage, epoch), 1);
        let doorbells = Arc::new(db);
        let args = CreateQpair {
            depth: depth as u32,
            qid: 1,
            prp_dma: 0x10_0000_0000,
            sq_doorbell: 0,
            cq_doorbell: 4,
            ..Default::default()
        };
        let qp = QueuePair::new(&args, sq, cq, prp, doorbells.clone(), 1, None);
        let stop = Arc::new(AtomicBool::new(false));
        let side = DeviceSide { sq: dsq, cq: dcq, doorbells, depth, state: std::cell::Cell::new((0, 0, true)) };
        match behaviour {
            Some(b) => {
                let s2 = stop.clone();
                let device = std::thread::spawn(move || side.run(s2, b));
                Ok(MockQueue { qp, status, stop, device: Some(device), stepped: None })
            }
            None => Ok(MockQueue { qp, status, stop, device: None, stepped: Some(side) }),
        }
    }
}

impl Drop for MockQueue {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.device.take() {
            let _ = d.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Command;
    use proptest::prelude::*;
    use std::time::Duration;
    use ugds_uapi::ioctl::Segment;

    const SEGS: [Segment; 1] = [Segment { dma_addr: 0x2000_0000, len: 1 << 20 }];

    fn read(off: u64, len: u64) -> Command<'static> {
        Command::Rw { write: false, slba: off / 4096, nlb: (len / 4096) as u32, segs: &SEGS, off, len }
    }

    #[test]
    fn honest_device_completes_bursts_and_wraps_the_rings() {
        let m = MockQueue::new(8, Behaviour::Honest).unwrap();
        // 200 bursts of up to 5 commands on an 8-entry queue wrap SQ and CQ many times.
        for i in 0..200u64 {
            let n = (i % 5 + 1) as usize;
            let cmds: Vec<_> = (0..n).map(|k| read(k as u64 * 8192, 8192 + 4096 * (k as u64 % 3))).collect();
            m.qp.execute(1, &cmds, &m.status, Duration::from_secs(5)).unwrap();
        }
    }

    #[test]
    fn unknown_cid_is_a_protocol_error_not_ub() {
        let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 7, sq_head: 1, status: 0 }])).unwrap();
        let e = m.qp.execute(1, &[read(0, 4096)], &m.status, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Error::DeviceProtocol(_)), "{e:?}");
        // The queue stays faulted until a reset.
        let e = m.qp.execute(1, &[read(0, 4096)], &m.status, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, Error::DeviceFaulted), "{e:?}");
    }

    #[test]
    fn duplicate_completion_is_a_protocol_error() {
        // cid 0 is what the first command gets; completing it twice must be caught.
        let m = MockQueue::new(8, Behaviour::Hostile(vec![HostileCqe { cid: 0, sq_head: 1, status: 0 }])).unwrap();
        let e = m.qp.execute(1, &[read(0, 4096)], &m.status, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Error::DeviceProtocol(_)), "{e:?}");
    }

    #[test]
    fn too_large_for_one_prp_list_is_rejected_before_submit() {
        let m = MockQueue::new(8, Behaviour::Hostile(vec![])).unwrap();
        m.qp.execute(1, &[read(0, 4096)], &m.status, Duration::from_secs(5)).unwrap();
        let e = m.qp.execute(1, &[read(0, 4096), read(0, 1 << 21)], &m.status, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "reg_offset", .. }), "{e:?}");
        // Nothing of the rejected burst was published: the queue keeps working.
        for _ in 0..20 {
            m.qp.execute(1, &[read(0, 4096), read(8192, 4096)], &m.status, Duration::from_secs(5)).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Any sequence of hostile completions yields an error or success, never a panic or a
        /// hang past the deadline.
        #[test]
        fn hostile_completions_never_panic(script in proptest::collection::vec((any::<u16>(), any::<u16>(), any::<u16>()), 0..6)) {
            let hostile = script.iter().map(|&(cid, sq_head, status)| HostileCqe { cid: cid % 16, sq_head: sq_head % 12, status }).collect();
            let m = MockQueue::new(8, Behaviour::Hostile(hostile)).unwrap();
            for _ in 0..4 {
                match m.qp.execute(1, &[read(0, 4096), read(4096, 8192)], &m.status, Duration::from_millis(200)) {
                    Ok(()) | Err(Error::DeviceProtocol(_)) | Err(Error::DeviceFaulted) | Err(Error::Nvme { .. }) | Err(Error::Timeout { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
        }
    }
}
