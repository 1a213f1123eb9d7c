//! The queue pair engine: commands built in place in SQ slots, PRPs in the per-command list page,
//! one tail doorbell write per burst, completions reaped by phase bit and matched by command id.
//!
//! Locking: one mutex per queue pair, held only to write entries or reap completions, never
//! while waiting; whoever polls reaps every completion of the queue and records it for its
//! owner. The hot path allocates nothing and makes no system call (an uncontended mutex is an
//! atomic compare-and-swap; the clock is read through the vDSO).

use crate::error::{Error, Result};
use crate::mmio::Mapping;
use crate::prp::{self, PrpError, LIST_ENTRIES, PAGE};
use crate::sys::EventFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use ugds_uapi::ioctl::{CreateQpair, Segment, StatusPage};
use ugds_uapi::queue::nvm;
use ugds_uapi::{Cqe, Sqe, Status};

/// Most commands one call keeps in flight at once (larger requests go in rounds).
pub const MAX_BURST: usize = 64;

/// One NVMe I/O command to build.
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    /// Read (`write: false`) or write `nlb` blocks at `slba` from/to `[off, off + len)` of a
    /// registration with segments `segs`.
    Rw {
        /// Write instead of read.
        write: bool,
        /// Starting LBA.
        slba: u64,
        /// Blocks (1..=65536).
        nlb: u32,
        /// The registration's segments.
        segs: &'a [Segment],
        /// Offset in the registration.
        off: u64,
        /// Bytes.
        len: u64,
    },
    /// Flush the volatile write cache.
    Flush,
    /// Write zeroes to `nlb` blocks at `slba`.
    WriteZeroes {
        /// Starting LBA.
        slba: u64,
        /// Blocks (1..=65536).
        nlb: u32,
    },
    /// Deallocate (trim) `nlb` blocks at `slba` (Dataset Management, one range).
    Deallocate {
        /// Starting LBA.
        slba: u64,
        /// Blocks.
        nlb: u32,
    },
}

impl Command<'_> {
    fn name(&self) -> &'static str {
        match self {
            Command::Rw { write: true, .. } => "write",
            Command::Rw { write: false, .. } => "read",
            Command::Flush => "flush",
            Command::WriteZeroes { .. } => "write zeroes",
            Command::Deallocate { .. } => "deallocate",
        }
    }
    fn slba(&self) -> u64 {
        match *self {
            Command::Rw { slba, .. } | Command::WriteZeroes { slba, .. } | Command::Deallocate { slba, .. } => slba,
            Command::Flush => 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Done {
    /// The CQE's raw 15-bit status field (decoded only when it is an error).
    raw: u16,
}

impl Done {
    #[inline]
    fn status(self) -> Status {
        Status::from_field(self.raw)
    }
}

/// Ring state; plain data, guarded by the queue pair's mutex.
#[derive(Debug)]
struct Ring {
    sq_tail: u16,
    /// The SQ head as last reported by a completion.
    sq_head: u16,
    cq_head: u16,
    phase: bool,
    /// Free command ids (a stack).
    free: Vec<u16>,
    /// Per command id: in flight?
    busy: Vec<bool>,
    /// Per command id: its completion, once reaped.
    done: Vec<Option<Done>>,
    /// The controller epoch these rings belong to.
    epoch: u64,
    /// A protocol violation was seen: the queue is unusable until the controller is reset.
    broken: bool,
}

/// An I/O queue pair mapped into this process.
#[derive(Debug)]
pub struct QueuePair {
    qid: u16,
    depth: u16,
    sq: Mapping,
    cq: Mapping,
    prp: Mapping,
    prp_bus: u64,
    doorbells: Arc<Mapping>,
    sq_db: usize,
    cq_db: usize,
    ring: Mutex<Ring>,
    /// Interrupt mode: the eventfd the queue's MSI-X vector signals; waiters poll once, then
    /// sleep on it.
    irq: Option<EventFd>,
}

/// Reads the status page's epoch and faulted flag.
pub fn read_status(status: &Mapping) -> (u64, bool) {
    let epoch = status.load64(std::mem::offset_of!(StatusPage, epoch));
    let faulted = status.load32(std::mem::offset_of!(StatusPage, faulted)) != 0;
    (epoch, faulted)
}

impl QueuePair {
    /// Wraps a queue pair created by `CREATE_QPAIR` whose regions are mapped.
    pub fn new(
        args: &CreateQpair,
        sq: Mapping,
        cq: Mapping,
        prp: Mapping,
        doorbells: Arc<Mapping>,
        epoch: u64,
        irq: Option<EventFd>,
    ) -> Self {
        let depth = args.depth as u16;
        QueuePair {
            qid: args.qid as u16,
            depth,
            sq,
            cq,
            prp,
            prp_bus: args.prp_dma,
            doorbells,
            sq_db: args.sq_doorbell as usize,
            cq_db: args.cq_doorbell as usize,
            ring: Mutex::new(Ring {
                sq_tail: 0,
                sq_head: 0,
                cq_head: 0,
                phase: true,
                free: (0..depth).rev().collect(),
                busy: vec![false; depth as usize],
                done: vec![None; depth as usize],
                epoch,
                broken: false,
            }),
            irq,
        }
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding the lock cannot leave the rings half-written in a way that
        // matters more than the panic itself; keep going with the state as is.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Free SQ slots (one is always kept empty to tell full from empty).
    fn sq_space(&self, r: &Ring) -> u16 {
        let used = (r.sq_tail + self.depth - r.sq_head) % self.depth;
        self.depth - 1 - used
    }

    /// Reaps every posted completion; returns how many. Checks each for protocol violations.
    fn reap(&self, r: &mut Ring) -> Result<usize> {
        let mut n = 0;
        loop {
            let off = r.cq_head as usize * 16;
            let dw3 = self.cq.load32(off + 12);
            if ((dw3 >> 16) & 1 != 0) != r.phase {
                break;
            }
            // Read the rest of the entry only after its phase bit.
            fence(Ordering::Acquire);
            let cqe = Cqe::from_dwords([self.cq.load32(off), self.cq.load32(off + 4), self.cq.load32(off + 8), dw3]);
            let cid = cqe.cid() as usize;
            if cid >= self.depth as usize || !r.busy[cid] || r.done[cid].is_some() {
                r.broken = true;
                return Err(Error::DeviceProtocol(format!(
                    "queue {}: completion for command id {cid} that is not in flight",
                    self.qid
                )));
            }
            if cqe.sq_head() >= self.depth {
                r.broken = true;
                return Err(Error::DeviceProtocol(format!(
                    "queue {}: SQ head {} out of range",
                    self.qid,
                    cqe.sq_head()
                )));
            }
            r.done[cid] = Some(Done { raw: (dw3 >> 17) as u16 });
            r.sq_head = cqe.sq_head();
            r.cq_head += 1;
            if r.cq_head == self.depth {
                r.cq_head = 0;
                r.phase = !r.phase;
            }
            n += 1;
        }
        if n > 0 {
            self.doorbells.store32(self.cq_db, r.cq_head as u32);
        }
        Ok(n)
    }

    fn build(&self, cmd: &Command<'_>, nsid: u32, cid: u16) -> std::result::Result<Sqe, PrpError> {
        let list_off = cid as usize * PAGE as usize;
        let list_bus = self.prp_bus + list_off as u64;
        let mut s;
        match *cmd {
            Command::Rw { write, slba, nlb, segs, off, len } => {
                s = Sqe::new(if write { nvm::WRITE } else { nvm::READ }, cid);
                // An out-of-range request fails in `locate` (the range is checked by the
                // caller against the registration's length).
                let prp = &self.prp;
                let p =
                    prp::build_with(segs, off, len, list_bus, LIST_ENTRIES, |i, a| prp.store64(list_off + i * 8, a))?;
                s.set_prps(p.prp1, p.prp2);
                s.set_slba(slba);
                s.set_nlb(nlb);
            }
            Command::Flush => s = Sqe::new(nvm::FLUSH, cid),
            Command::WriteZeroes { slba, nlb } => {
                s = Sqe::new(nvm::WRITE_ZEROES, cid);
                s.set_slba(slba);
                s.set_nlb(nlb);
            }
            Command::Deallocate { slba, nlb } => {
                s = Sqe::new(nvm::DATASET_MANAGEMENT, cid);
                // One range descriptor (context attributes, length, starting LBA) in the
                // command's own list page.
                self.prp.store32(list_off, 0);
                self.prp.store32(list_off + 4, nlb);
                self.prp.store64(list_off + 8, slba);
                s.set_prps(list_bus, 0);
                // NR = 0 (one range), AD (deallocate) in CDW11.
                s.set_cdw(10, 0);
                s.set_cdw(11, 1 << 2);
            }
        }
        s.set_nsid(nsid);
        Ok(s)
    }

    /// After this process reset the controller itself: adopt the new epoch silently (the
    /// module re-created the queue empty; our timed-out commands are gone).
    pub fn resync(&self, status: &Mapping) {
        let mut r = self.lock();
        let _ = self.check_epoch(&mut r, status);
    }

    fn check_epoch(&self, r: &mut Ring, status: &Mapping) -> Result<()> {
        let (epoch, faulted) = read_status(status);
        if faulted {
            return Err(Error::DeviceFaulted);
        }
        if epoch != r.epoch {
            // The controller re-created this queue empty: start over from a clean ring.
            let old = r.epoch;
            r.sq_tail = 0;
            r.sq_head = 0;
            r.cq_head = 0;
            r.phase = true;
            r.free = (0..self.depth).rev().collect();
            r.busy.iter_mut().for_each(|b| *b = false);
            r.done.iter_mut().for_each(|d| *d = None);
            r.epoch = epoch;
            r.broken = false;
            return Err(Error::EpochChanged { old, new: epoch });
        }
        if r.broken {
            return Err(Error::DeviceFaulted);
        }
        Ok(())
    }

    /// Queue depth in entries.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Writes `cmds` into free slots (waiting for space up to `timeout`) and rings the doorbell
    /// once; their command ids go to `cids[..cmds.len()]`. Nothing is published on error.
    pub fn submit(
        &self,
        nsid: u32,
        cmds: &[Command<'_>],
        status: &Mapping,
        timeout: Duration,
        cids: &mut [u16],
    ) -> Result<()> {
        let n = cmds.len();
        if n == 0 {
            return Ok(());
        }
        if n >= self.depth as usize || cids.len() < n {
            return Err(Error::invalid("cmds", format!("{n} commands do not fit a {}-entry queue", self.depth)));
        }
        // Read the clock only if we have to wait for room.
        let mut start: Option<Instant> = None;
        {
            let mut r = self.lock();
            self.check_epoch(&mut r, status)?;
            let mut spins = 0u32;
            while (self.sq_space(&r) as usize) < n || r.free.len() < n {
                self.reap(&mut r)?;
                if (self.sq_space(&r) as usize) >= n && r.free.len() >= n {
                    break;
                }
                drop(r);
                std::hint::spin_loop();
                spins += 1;
                let since = *start.get_or_insert_with(Instant::now);
                if spins.is_multiple_of(4096) && since.elapsed() > timeout {
                    return Err(Error::Timeout {
                        op: cmds[0].name(),
                        slba: cmds[0].slba(),
                        timeout_ms: timeout.as_millis() as u64,
                    });
                }
                r = self.lock();
                self.check_epoch(&mut r, status)?;
            }
            for (i, cmd) in cmds.iter().enumerate() {
                let cid = r.free.pop().ok_or_else(|| Error::DeviceProtocol("no free command id".into()))?;
                let sqe = match self.build(cmd, nsid, cid) {
                    Ok(s) => s,
                    Err(e) => {
                        // Nothing of this call was published yet: give the ids back.
                        r.free.push(cid);
                        for c in &cids[..i] {
                            r.busy[*c as usize] = false;
                            r.free.push(*c);
                        }
                        let tail_back = (r.sq_tail + self.depth - i as u16) % self.depth;
                        r.sq_tail = tail_back;
                        return Err(Error::invalid(
                            "reg_offset",
                            format!("cannot describe the buffer with PRPs: {e:?}"),
                        ));
                    }
                };
                cids[i] = cid;
                r.busy[cid as usize] = true;
                self.sq.store_dwords(r.sq_tail as usize * 64, &sqe.to_dwords());
                r.sq_tail = (r.sq_tail + 1) % self.depth;
            }
            // The entries (and PRP lists) must be visible before the device sees the tail.
            fence(Ordering::SeqCst);
            self.doorbells.store32(self.sq_db, r.sq_tail as u32);
        }
        Ok(())
    }

    /// Reaps the queue and collects the completions of `cids` that arrived: for each `i` with
    /// `out[i]` still `None` whose command completed, stores its status in `out[i]` and frees its
    /// id. Returns how many were collected by this call.
    pub fn collect(&self, cids: &[u16], status: &Mapping, out: &mut [Option<Status>]) -> Result<usize> {
        let mut r = self.lock();
        self.check_epoch(&mut r, status)?;
        self.reap(&mut r)?;
        let mut n = 0;
        for (c, o) in cids.iter().zip(out.iter_mut()) {
            if o.is_none() {
                if let Some(d) = r.done[*c as usize].take() {
                    *o = Some(d.status());
                    r.busy[*c as usize] = false;
                    r.free.push(*c);
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Sleeps on the interrupt (interrupt mode) or spins once (polling).
    pub fn wait_a_little(&self) {
        match &self.irq {
            Some(ev) => ev.wait(10),
            None => std::hint::spin_loop(),
        }
    }

    /// Submits `cmds` (at most [`MAX_BURST`]) with one doorbell write and waits for all of them.
    /// Returns the first failure (all commands have completed or been abandoned by then).
    pub fn execute(&self, nsid: u32, cmds: &[Command<'_>], status: &Mapping, timeout: Duration) -> Result<()> {
        debug_assert!(cmds.len() <= MAX_BURST);
        let n = cmds.len();
        let mut cids = [0u16; MAX_BURST];
        let start = Instant::now();
        self.submit(nsid, cmds, status, timeout, &mut cids)?;
        // Phase 2: collect until all of ours completed.
        let mut out = [None; MAX_BURST];
        let mut got = 0;
        let mut spins = 0u32;
        loop {
            got += self.collect(&cids[..n], status, &mut out[..n])?;
            if got == n {
                for (i, st) in out[..n].iter().enumerate() {
                    if let Some(st) = st.filter(|s| !s.is_success()) {
                        return Err(Error::Nvme { op: cmds[i].name(), slba: cmds[i].slba(), status: st });
                    }
                }
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            self.wait_a_little();
            // Interrupt mode slept above; polling reads the clock only now and then.
            if (self.irq.is_some() || spins.is_multiple_of(4096)) && start.elapsed() > timeout {
                // The uncollected commands stay marked busy: their ids and PRP pages are not
                // reused, and the registration keeps counting them. A controller reset clears them.
                return Err(Error::Timeout {
                    op: cmds[0].name(),
                    slba: cmds[0].slba(),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
        }
    }
}
