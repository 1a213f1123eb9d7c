//! Batches (cuFile's batch semantics): many I/Os submitted with one doorbell write on the
//! batch's own queue pair, completions collected later with per-I/O events.
//!
//! Rules: `submit` validates every entry first; an invalid entry becomes an `Invalid` event with
//! its error, and the valid ones run. Entries are at most one command each (`len` up to the
//! namespace's per-command limit). A batch's queue pair is its own, created at `Batch::new`, so
//! a burst never sits in front of the device's synchronous queues. Dropping a batch waits for its
//! commands (resetting the controller if they do not finish), so memory is never released while
//! the SSD may still write it.

use crate::cmd::{self, DmaRange};
use crate::device::{create_queue_pair, Device, Inner, Namespace, Registration};
use crate::error::{Error, Result};
use crate::queue::QueuePair;
use crate::storage::Buffer;
use crate::sys::req;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether this process has run [`Batch::warm_up`].
static WARM: AtomicBool = AtomicBool::new(false);
use ugds_uapi::ioctl::*;
use ugds_uapi::Status;

/// Direction of one batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SSD → memory.
    Read,
    /// Memory → SSD.
    Write,
}

/// One batch entry.
#[derive(Debug, Clone, Copy)]
pub struct IoParams<'a> {
    /// Read or write.
    pub op: Op,
    /// The namespace.
    pub ns: &'a Namespace,
    /// The memory.
    pub reg: &'a Registration,
    /// Offset in the registration.
    pub reg_offset: u64,
    /// Device byte offset.
    pub dev_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Returned with the event.
    pub cookie: u64,
}

/// State of an entry (cuFile's `CUfileStatus_t` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Submitted, not complete.
    Pending,
    /// Rejected at submit (see the event's error).
    Invalid,
    /// Done; `bytes` transferred.
    Complete,
    /// The device failed it (see the event's error).
    Failed,
    /// Its deadline passed (the controller was reset).
    Timeout,
    /// Cancelled (the batch was cancelled or dropped).
    Canceled,
}

/// A completion event.
#[derive(Debug)]
pub struct IoEvent {
    /// The entry's cookie.
    pub cookie: u64,
    /// Its state.
    pub status: IoStatus,
    /// Bytes transferred (0 unless complete).
    pub bytes: u64,
    /// Why it failed.
    pub error: Option<Error>,
}

/// The registration an entry names: borrowed (the Rust API), or shared with a [`Buffer`] (the
/// portable layer and the C ABI, whose entries outlive any borrow; the slot keeps both alive
/// until the command is over).
#[derive(Debug, Clone)]
enum RegRef<'a> {
    Borrowed(&'a Registration),
    Shared { reg: Arc<Registration>, _buf: Arc<Buffer> },
}

impl RegRef<'_> {
    fn get(&self) -> &Registration {
        match self {
            RegRef::Borrowed(r) => r,
            RegRef::Shared { reg, .. } => reg,
        }
    }
}

/// One entry, however its registration is held.
struct Entry<'a, 'n> {
    op: Op,
    ns: &'n Namespace,
    reg: RegRef<'a>,
    reg_offset: u64,
    dev_offset: u64,
    len: u64,
    cookie: u64,
}

/// An entry of [`Batch::submit_shared`]: (op, registration, its buffer, reg offset, device
/// offset, len, cookie).
pub(crate) type SharedEntry = (Op, Arc<Registration>, Arc<Buffer>, u64, u64, u64, u64);

#[derive(Debug)]
struct Slot<'a> {
    cookie: u64,
    len: u64,
    cid: u16,
    status: Option<Status>,
    reg: RegRef<'a>,
    device_writes: bool,
    reported: bool,
}

/// A reusable batch with its own queue pair.
#[derive(Debug)]
pub struct Batch<'a> {
    dev: Arc<Inner>,
    qp: QueuePair,
    capacity: usize,
    pending: Vec<Slot<'a>>,
    ready: Vec<IoEvent>,
    cids: Vec<u16>,
    done: Vec<Option<Status>>,
    timeout: Duration,
}

impl Slot<'_> {
    /// The entry's command is over (completed, or the controller was reset): uncount it.
    fn release(&self) {
        self.reg.get().sub_inflight(1);
        if self.device_writes {
            self.reg.get().end_device_writes(1);
        }
    }
}

impl<'a> Batch<'a> {
    /// Creates a batch of up to `capacity` entries in flight, with its own queue pair (all
    /// allocation happens here, so the first submit is as fast as later ones).
    pub fn new(dev: &Device, capacity: usize) -> Result<Self> {
        let inner = dev.inner.clone();
        let depth = (capacity + 1).max(2) as u32;
        if depth > inner.info.max_queue_entries {
            return Err(Error::invalid("capacity", format!("at most {}", inner.info.max_queue_entries - 1)));
        }
        let (epoch, _) = crate::queue::read_status(&inner.status);
        let qp = create_queue_pair(&inner.fd, depth, false, &inner.doorbells, epoch)?;
        let timeout = inner.timeout;
        let b = Batch {
            dev: inner,
            qp,
            capacity,
            pending: Vec::with_capacity(capacity),
            ready: Vec::with_capacity(capacity),
            cids: Vec::with_capacity(capacity),
            done: Vec::with_capacity(capacity),
            timeout,
        };
        if !WARM.load(Ordering::Acquire) {
            Self::warm_up(dev)?;
        }
        Ok(b)
    }

    /// Once per process, runs a small batch through a throwaway batch of its own: the batch
    /// code paths are then resident (under an emulator: translated), so the first real batch
    /// costs what later ones do instead of several times more.
    fn warm_up(dev: &Device) -> Result<()> {
        WARM.store(true, Ordering::Release);
        let Some(ns) = dev.namespaces().into_iter().next() else { return Ok(()) };
        let scratch = dev.alloc(8 * 4096)?;
        let bs = ns.block_size().min(4096);
        let mut w = Batch::new(dev, 8)?;
        let ios: Vec<IoParams<'_>> = (0..8)
            .map(|i| IoParams {
                op: Op::Read,
                ns: &ns,
                reg: &scratch,
                reg_offset: i * 4096,
                dev_offset: 0,
                len: bs,
                cookie: i,
            })
            .collect();
        w.submit(&ios)?;
        let mut got = 0;
        while got < ios.len() {
            got += w.status(ios.len() - got, w.timeout)?.len();
        }
        Ok(())
    }

    /// Entries in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.iter().filter(|s| s.status.is_none()).count()
    }

    /// Submits `ios` with one doorbell write (per namespace). Invalid entries become `Invalid`
    /// events; the rest run. Fails as a whole only when the batch has no room or the device
    /// refuses the submission.
    pub fn submit(&mut self, ios: &[IoParams<'a>]) -> Result<()> {
        let entries = ios
            .iter()
            .map(|io| Entry {
                op: io.op,
                ns: io.ns,
                reg: RegRef::Borrowed(io.reg),
                reg_offset: io.reg_offset,
                dev_offset: io.dev_offset,
                len: io.len,
                cookie: io.cookie,
            })
            .collect();
        self.submit_entries(entries)
    }

    /// [`Batch::submit`] for entries whose registrations are shared with buffers (the batch
    /// keeps them alive until their commands are over).
    pub(crate) fn submit_shared(&mut self, ns: &Namespace, ios: Vec<SharedEntry>) -> Result<()> {
        let entries = ios
            .into_iter()
            .map(|(op, reg, buf, reg_offset, dev_offset, len, cookie)| Entry {
                op,
                ns,
                reg: RegRef::Shared { reg, _buf: buf },
                reg_offset,
                dev_offset,
                len,
                cookie,
            })
            .collect();
        self.submit_entries(entries)
    }

    fn submit_entries(&mut self, ios: Vec<Entry<'a, '_>>) -> Result<()> {
        if self.in_flight() + ios.len() > self.capacity {
            return Err(Error::invalid("ios", format!("{} entries exceed the batch's free capacity", ios.len())));
        }
        let mut cmds = Vec::with_capacity(ios.len());
        let mut slots = Vec::with_capacity(ios.len());
        let mut nsid = None;
        for io in &ios {
            let reg = io.reg.get();
            let checked = io.ns.check_io(reg, io.reg_offset, io.dev_offset, io.len).and_then(|(slba, nlb)| {
                if nsid.is_some_and(|n| n != io.ns.id()) {
                    return Err(Error::invalid("ns", "one submit may name one namespace"));
                }
                if io.op == Op::Read {
                    reg.begin_device_writes(1)?;
                }
                Ok((slba, nlb))
            });
            match checked {
                Ok((slba, nlb)) => {
                    nsid = Some(io.ns.id());
                    reg.add_inflight(1);
                    // SAFETY: the slot keeps the registration alive (borrowed, or shared with its
                    // buffer) and counted in flight until the command is over (a reset confirms
                    // it for commands that never complete); a read holds the registration's
                    // device-write lease, so no CPU view exists meanwhile; `check_io` made
                    // `len` exactly `nlb` blocks.
                    let data = unsafe { DmaRange::new(reg.segments(), io.reg_offset, io.len) };
                    cmds.push(if io.op == Op::Write {
                        cmd::Write::new(slba, nlb, data).build()
                    } else {
                        cmd::Read::new(slba, nlb, data).build()
                    });
                    slots.push(Slot {
                        cookie: io.cookie,
                        len: io.len,
                        cid: 0,
                        status: None,
                        reg: io.reg.clone(),
                        device_writes: io.op == Op::Read,
                        reported: false,
                    });
                }
                Err(e) => {
                    self.ready.push(IoEvent { cookie: io.cookie, status: IoStatus::Invalid, bytes: 0, error: Some(e) })
                }
            }
        }
        let Some(nsid) = nsid else { return Ok(()) };
        let mut cids = vec![0u16; cmds.len()];
        if let Err(e) = self.qp.submit(nsid, &cmds, &self.dev.status, self.timeout, &mut cids) {
            slots.iter().for_each(Slot::release);
            return Err(e);
        }
        for (s, c) in slots.iter_mut().zip(cids) {
            s.cid = c;
        }
        self.pending.extend(slots);
        Ok(())
    }

    fn collect_once(&mut self) -> Result<()> {
        self.cids.clear();
        self.done.clear();
        for s in self.pending.iter().filter(|s| s.status.is_none()) {
            self.cids.push(s.cid);
            self.done.push(None);
        }
        if self.cids.is_empty() {
            return Ok(());
        }
        self.qp.collect(&self.cids, &self.dev.status, &mut self.done)?;
        let mut k = 0;
        for i in 0..self.pending.len() {
            if self.pending[i].status.is_none() {
                if let Some(st) = self.done[k] {
                    self.pending[i].status = Some(st);
                    self.pending[i].release();
                }
                k += 1;
            }
        }
        Ok(())
    }

    /// Waits until at least `min` events are available (or `timeout` passed) and returns all
    /// available events. A completed entry is reported once.
    pub fn status(&mut self, min: usize, timeout: Duration) -> Result<Vec<IoEvent>> {
        let start = Instant::now();
        loop {
            self.collect_once()?;
            let avail = self.ready.len() + self.pending.iter().filter(|s| s.status.is_some() && !s.reported).count();
            if avail >= min || self.pending.iter().all(|s| s.status.is_some()) || start.elapsed() > timeout {
                break;
            }
            self.qp.wait_a_little();
        }
        let mut out = std::mem::take(&mut self.ready);
        for s in self.pending.iter_mut().filter(|s| s.status.is_some() && !s.reported) {
            s.reported = true;
            let st = s.status.unwrap_or(Status::SUCCESS);
            out.push(if st.is_success() {
                IoEvent { cookie: s.cookie, status: IoStatus::Complete, bytes: s.len, error: None }
            } else {
                IoEvent {
                    cookie: s.cookie,
                    status: IoStatus::Failed,
                    bytes: 0,
                    error: Some(Error::Nvme { op: "batch I/O", slba: 0, status: st }),
                }
            });
        }
        self.pending.retain(|s| !s.reported);
        Ok(out)
    }

    /// Waits for every entry in flight (up to the deadline; then resets the controller, after
    /// which their memory is safe) and reports them as `Canceled` unless they completed.
    pub fn cancel(&mut self) -> Result<Vec<IoEvent>> {
        let start = Instant::now();
        while self.in_flight() > 0 && start.elapsed() < self.timeout {
            self.collect_once()?;
            self.qp.wait_a_little();
        }
        if self.in_flight() > 0 {
            self.dev.fd.ioctl(req::Reset, &mut ())?;
            self.qp.resync(&self.dev.status);
            for i in 0..self.pending.len() {
                if self.pending[i].status.is_none() {
                    self.pending[i].release();
                }
            }
        }
        let mut out = self.status(0, Duration::ZERO)?;
        for s in self.pending.drain(..) {
            out.push(IoEvent { cookie: s.cookie, status: IoStatus::Canceled, bytes: 0, error: None });
        }
        for e in &mut out {
            if e.status == IoStatus::Pending {
                e.status = IoStatus::Canceled;
            }
        }
        Ok(out)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            let _ = self.cancel();
        }
        // Nothing is in flight (or the controller was reset): give the queue pair back. The
        // module revokes our mappings of it; `qp` unmaps them after this.
        let mut d = DeleteQpair { qid: self.qp.qid() as u32, reserved: 0 };
        let _ = self.dev.fd.ioctl(req::DeleteQpair, &mut d);
    }
}
