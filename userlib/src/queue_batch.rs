//! A batch on a queue pair of its own (the direct path's native batch, under
//! [`crate::StorageBatch`]): many commands submitted with one doorbell write, completions
//! collected later as per-entry events ([`crate::batch`]'s types).
//!
//! Entries arrive checked by [`crate::Storage`] and each holds an I/O lease on its buffer until
//! its command is over, so the buffer's memory stays registered and out of the CPU's reach while
//! the SSD may use it. The queue pair is created at [`QueueBatch::new`], so a burst never sits
//! in front of the device's synchronous queues. Dropping a batch waits for its commands
//! (resetting the controller if they do not finish); when even the reset fails, their leases are
//! kept for good.

use crate::batch::{Entry, EventSink, IoEvent, IoStatus, Op};
use crate::buffer::{Buffer, Lease, Path};
use crate::cmd::{self, Command, Stride};
use crate::device::{create_queue_pair, delete_queue_pair, Device, Inner, Namespace};
use crate::error::{Error, Result};
use crate::inflight::{InFlight, Why};
use crate::queue::{Deadline, QueuePair, Waiter};
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;
use ugds_uapi::Status;

struct Slot {
    cookie: u64,
    len: u64,
    path: Path,
    write: bool,
    slba: u64,
    status: Option<Status>,
    /// Held until the command is over.
    lease: Option<Lease<Arc<Buffer>>>,
}

/// What a queue batch submits: an entry, and how its buffer pieces lie where its one command
/// gathers several (a striped volume member's chunks of one entry; `None`: one range).
pub(crate) trait Submitted {
    /// The entry and its pieces' layout.
    fn parts(self) -> (Entry, Option<Stride>);
}

impl Submitted for Entry {
    #[inline(always)]
    fn parts(self) -> (Entry, Option<Stride>) {
        (self, None)
    }
}

impl Submitted for (Entry, Option<Stride>) {
    #[inline(always)]
    fn parts(self) -> (Entry, Option<Stride>) {
        self
    }
}

/// The one command that carries `e` (its buffer pieces laid out as `stride` says) on `ns`, on
/// the registration of member `member`'s controller, with its first block; `None` when there is
/// none, the entry's `Invalid` event then pushed to `refused`.
#[inline(always)]
fn command_for<'e>(
    ns: &Namespace,
    e: &'e Entry,
    stride: Option<Stride>,
    member: usize,
    refused: &mut Vec<IoEvent>,
) -> Option<(Command<'e>, u64)> {
    match built(ns, e, stride, member) {
        Ok(c) => Some(c),
        Err(error) => {
            refused.push(IoEvent { cookie: e.cookie, status: IoStatus::Invalid, bytes: 0, error: Some(error) });
            None
        }
    }
}

/// [`command_for`]'s command, or why there is none.
#[inline(always)]
fn built<'e>(ns: &Namespace, e: &'e Entry, stride: Option<Stride>, member: usize) -> Result<(Command<'e>, u64)> {
    let (slba, nlb) = ns.one_command(e.dev_offset, e.len)?;
    let reg = e
        .lease
        .buffer()
        .registration_on(member)
        .ok_or_else(|| Error::invalid("buf", "not registered with the controller"))?;
    // SAFETY: the entry holds an I/O lease on the buffer that owns `reg`, which its slot keeps
    // until the command is over (for good when that cannot be confirmed), so the registration
    // stays and the CPU keeps out (of every piece of a gathered entry too: the lease is on the
    // whole buffer); `one_command` made `len` exactly `nlb` blocks. `range` and `gather` check
    // that the registration is alive.
    let data = unsafe {
        match stride {
            None => reg.range(e.buf_offset, e.len),
            Some(stride) => reg.gather(e.buf_offset, stride, e.len),
        }
    }?;
    let cmd = match e.op {
        Op::Write => cmd::Write::new(slba, nlb, data).build(),
        Op::Read => cmd::Read::new(slba, nlb, data).build(),
    };
    Ok((cmd, slba))
}

/// A submission's entries going into the batch's table by command id as each is pushed.
struct Placing<'a> {
    slots: &'a mut Vec<Option<Slot>>,
    /// The ids placed, in order.
    cids: &'a mut Vec<u16>,
    largest: &'a mut u64,
    in_flight: &'a mut usize,
}

impl Placing<'_> {
    /// Puts `e`, whose command (first block `slba`) went out as `cid`, into its slot.
    #[inline(always)]
    fn put(&mut self, e: Entry, cid: u16, slba: u64) {
        self.cids.push(cid);
        *self.largest = (*self.largest).max(e.len);
        *self.in_flight += 1;
        let write = e.op == Op::Write;
        let path = e.lease.buffer().path();
        let slot = Slot { cookie: e.cookie, len: e.len, path, write, slba, status: None, lease: Some(e.lease) };
        let i = usize::from(cid);
        if i >= self.slots.len() {
            // Ids come from a fixed stack below the ring's depth: this grows a few times.
            self.slots.resize_with(i + 1, || None);
        }
        if let Some(old) = self.slots[i].replace(slot) {
            // The queue hands out an id only once it is free, and this batch reports (and
            // forgets) an entry before its id can come back: not reached. Kept safe anyway: the
            // old entry's lease stays held for good (its `Drop`).
            log::error!("queue batch: command id {cid} handed out while entry {} holds it", old.cookie);
            *self.in_flight -= 1;
        }
    }

    /// Takes every entry placed back out (their commands were withdrawn, never published), and
    /// their leases with them.
    fn take_back(&mut self) {
        for &cid in self.cids.iter() {
            if let Some(mut s) = self.slots.get_mut(usize::from(cid)).and_then(Option::take) {
                s.lease = None;
                *self.in_flight -= 1;
            }
        }
        self.cids.clear();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A slot dropped with its lease still held names a command that was submitted and
        // never seen to finish (an error cut the batch short): the SSD may still use the
        // memory, so a token keeps the lease for good.
        if let Some(l) = self.lease.take() {
            InFlight::new(Why::Command).holding(l).keep();
        }
    }
}

/// A reusable batch with its own queue pair, on one namespace.
pub(crate) struct QueueBatch {
    dev: Arc<Inner>,
    ns: Namespace,
    /// Leaked in a child forked after the batch was made: its mappings are the parent's.
    qp: ManuallyDrop<QueuePair>,
    capacity: usize,
    /// Entries by command id: in flight, or completed and not reported yet. A reap finds its
    /// entries here by the ids it took off the CQ, so it costs what completed, not what is in
    /// flight (at QD 128, walks over every entry per reap took a third of `ugds bench`'s CPU).
    slots: Vec<Option<Slot>>,
    /// Command ids of completed entries not reported yet, in completion order.
    completed: Vec<u16>,
    /// Entries in flight.
    in_flight: usize,
    /// The largest entry submitted since nothing was in flight (whether a wait may spin).
    largest: u64,
    /// Reaps that found completions (a poll that found nothing must not reap).
    #[cfg(test)]
    reaps: usize,
    ready: Vec<IoEvent>,
    cids: Vec<u16>,
    timeout: Duration,
    /// Which of a buffer's registrations (one per volume member) this batch's controller uses.
    member: usize,
}

impl std::fmt::Debug for QueueBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueBatch(qid {}, {} in flight, {} completed)", self.qp.qid(), self.in_flight, self.completed.len())
    }
}

/// The most slots a batch's ring gets beyond its entries' own (`capacity + 1`).
const BATCH_RING: u32 = 256;

/// The ring of a batch of `capacity` entries on a controller taking `max_entries` slots: room
/// for four times its entries (at most [`BATCH_RING`] slots, or the entries and the slot a ring
/// keeps empty where that is more; never more than the controller takes). Consumed completion
/// slots go back to the controller a quarter of the ring at a time, and before a submission
/// that could leave it no room: on a ring of just `capacity + 1` slots that was before nearly
/// every submission (4K reads at QD 8 in the VM: 0.22 head doorbell writes per I/O, each one a
/// trip through the emulator's lock).
pub(crate) fn ring_depth(capacity: usize, max_entries: u32) -> Result<u32> {
    let least = u32::try_from(capacity).ok().and_then(|c| c.checked_add(1)).filter(|&d| d <= max_entries);
    let Some(least) = least else {
        return Err(Error::invalid("capacity", format!("at most {}", max_entries.saturating_sub(1))));
    };
    Ok(least.saturating_mul(4).min(BATCH_RING).max(least).min(max_entries).max(2))
}

impl QueueBatch {
    /// Creates a batch of up to `capacity` entries in flight on `ns`, with its own queue pair.
    pub(crate) fn new(dev: &Device, ns: &Namespace, capacity: usize) -> Result<Self> {
        Self::on_member(dev, ns, capacity, 0)
    }

    /// [`QueueBatch::new`] for member `member` of a volume: its commands name the buffers'
    /// registrations on that member's controller.
    pub(crate) fn on_member(dev: &Device, ns: &Namespace, capacity: usize, member: usize) -> Result<Self> {
        let inner = dev.inner.clone();
        inner.born.check("device")?;
        let depth = ring_depth(capacity, inner.info.max_queue_entries)?;
        let epoch = inner.status.state().epoch();
        let qp = create_queue_pair(&inner.fd, depth, inner.wait, &inner.doorbells, epoch, inner.dptr)?;
        Ok(Self::with_queue(inner, ns, qp, capacity, member))
    }

    /// A batch on a queue pair the test made (over the device model, which has no control plane
    /// to create one); `qp` must hold `capacity` commands.
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over(dev: &Device, ns: &Namespace, qp: QueuePair, capacity: usize, member: usize) -> Self {
        Self::with_queue(dev.inner.clone(), ns, qp, capacity, member)
    }

    fn with_queue(inner: Arc<Inner>, ns: &Namespace, qp: QueuePair, capacity: usize, member: usize) -> Self {
        let timeout = inner.timeout;
        QueueBatch {
            dev: inner,
            ns: ns.clone(),
            qp: ManuallyDrop::new(qp),
            capacity,
            slots: Vec::new(),
            completed: Vec::with_capacity(capacity),
            in_flight: 0,
            largest: 0,
            #[cfg(test)]
            reaps: 0,
            ready: Vec::with_capacity(capacity),
            cids: Vec::with_capacity(capacity),
            timeout,
            member,
        }
    }

    /// Entries it holds in flight at most.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The largest entry it runs (one command).
    pub(crate) fn max_command_bytes(&self) -> u64 {
        self.ns.max_command_bytes() & !(self.ns.block_size() - 1)
    }

    /// Its queue pair's waiting state (for a wait over several batches).
    pub(crate) fn wait_state(&self) -> &std::sync::Arc<crate::queue::QueueWait> {
        self.qp.wait_state()
    }

    /// Entries in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// How long a command may run before it counts as hung (the device's command timeout, as
    /// its synchronous requests wait).
    pub(crate) fn command_timeout(&self) -> Duration {
        self.timeout
    }

    /// Submits checked entries with one doorbell write, writing each command into the queue as
    /// it is built (no list of commands gathered first). An entry the queue cannot carry as one
    /// command, or whose registration was revoked since it was checked, becomes an `Invalid`
    /// event; the rest run. Fails as a whole, publishing nothing, only when the batch has no
    /// room or the device refuses the submission (a reset, no queue room in time).
    ///
    /// The room asked for is the iterator's upper bound (its length, for a list; the requests
    /// behind it, for entries made as they are taken, some of which may be refused on the way),
    /// so an iterator without one is refused.
    pub(crate) fn submit<I>(&mut self, entries: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: Submitted,
    {
        let entries = entries.into_iter();
        let Some(n) = entries.size_hint().1 else {
            return Err(Error::invalid("ios", "entries without a bound on their number"));
        };
        if self.in_flight + n > self.capacity {
            return Err(Error::invalid("ios", format!("{n} entries exceed the batch's free capacity")));
        }
        self.cids.clear();
        // Events of this call's invalid entries go back too when the call fails as a whole.
        let ready_before = self.ready.len();
        let failed = {
            let Self { dev, ns, qp, slots, in_flight, largest, ready, cids, timeout, member, .. } = self;
            let (nsid, status, member) = (ns.id(), &dev.status, *member);
            let mut placing = Placing { slots, cids, largest, in_flight };
            let mut entries = entries;
            let (mut sub, mut failed) = (None, None);
            // The first entry that makes a command opens the submission, with room for every
            // entry of the call (a few more than run when some are invalid; the ring has four
            // times the batch's entries).
            for e in entries.by_ref() {
                let (e, stride) = e.parts();
                let Some((cmd, slba)) = command_for(ns, &e, stride, member, ready) else { continue };
                let opened = qp.submission_owned(nsid, n, status, *timeout, &cmd).and_then(|mut s| {
                    let cid = s.push(&cmd)?;
                    Ok((s, cid))
                });
                match opened {
                    Ok((s, cid)) => {
                        placing.put(e, cid, slba);
                        sub = Some(s);
                    }
                    Err(error) => failed = Some(error),
                }
                break;
            }
            if let Some(s) = &mut sub {
                for e in entries {
                    let (e, stride) = e.parts();
                    let Some((cmd, slba)) = command_for(ns, &e, stride, member, ready) else { continue };
                    match s.push(&cmd) {
                        Ok(cid) => {
                            placing.put(e, cid, slba);
                            debug_assert!(placing.cids.len() <= n, "more entries than the iterator's bound");
                        }
                        Err(error) => {
                            failed = Some(error);
                            break;
                        }
                    }
                }
            }
            if failed.is_some() {
                // Nothing is published: the entries' ids go back, and their leases with them.
                if let Some(s) = sub.take() {
                    s.cancel();
                }
                placing.take_back();
            }
            // Otherwise dropping the submission rings the doorbell once for every entry.
            failed
        };
        match failed {
            None => Ok(()),
            Some(e) => {
                self.ready.truncate(ready_before);
                if let Error::EpochChanged { old, new } = e {
                    // The submission met a reset: the commands of earlier bursts were lost with
                    // it, and their ids are free for others now.
                    self.fail_in_flight(old, new);
                }
                Err(e)
            }
        }
    }

    /// Collects what completed (a poll that finds nothing costs one look at the CQ; one that
    /// finds completions visits just their entries).
    fn collect_once(&mut self) -> Result<()> {
        if self.in_flight == 0 {
            // Nothing to wait for: the device is not asked (its faults are for the next
            // submission to meet), and completed entries are reported as they are.
            return Ok(());
        }
        let (slots, completed) = (&mut self.slots, &mut self.completed);
        let mut found = 0;
        let reaped = self.qp.reap_owned(&self.dev.status, |cid, status| {
            if let Some(Some(s)) = slots.get_mut(usize::from(cid)) {
                if s.status.is_none() {
                    s.status = Some(status);
                    // The command is over: the device no longer uses the memory.
                    s.lease = None;
                    completed.push(cid);
                    found += 1;
                }
            }
        });
        self.in_flight -= found;
        #[cfg(test)]
        if !matches!(reaped, Ok(0)) {
            self.reaps += 1;
        }
        match reaped {
            Ok(_) => Ok(()),
            Err(e) => self.fail_on_reset(e),
        }
    }

    /// A reap or collect failed with `e`. When the controller was reset (`EpochChanged`), it
    /// stopped, and every command still in flight here was lost: fails them (their command ids
    /// will be reused) and releases their memory. Any other error is the caller's.
    fn fail_on_reset(&mut self, e: Error) -> Result<()> {
        let Error::EpochChanged { old, new } = e else { return Err(e) };
        self.fail_in_flight(old, new);
        Ok(())
    }

    /// Fails every entry in flight with the reset from epoch `old` to `new` (its command was
    /// lost) and releases its memory (the controller stopped).
    fn fail_in_flight(&mut self, old: u64, new: u64) {
        for mut s in self.slots.iter_mut().filter_map(|slot| slot.take_if(|s| s.status.is_none())) {
            s.lease = None;
            let error = Some(Error::EpochChanged { old, new });
            self.ready.push(IoEvent { cookie: s.cookie, status: IoStatus::Failed, bytes: 0, error });
        }
        self.in_flight = 0;
    }

    /// [`QueueBatch::status_into`] a new vector.
    pub(crate) fn status(&mut self, min: usize, timeout: Duration) -> Result<Vec<(IoEvent, Path)>> {
        let mut out = Vec::new();
        self.status_into(min, timeout, &mut out)?;
        Ok(out)
    }

    /// Waits until at least `min` events are available (or `timeout` passed) and appends all
    /// available events to `out`, each with the path its data took (a caller that keeps `out`
    /// allocates nothing here). A completed entry is reported once.
    pub(crate) fn status_into(&mut self, min: usize, timeout: Duration, out: &mut impl EventSink) -> Result<()> {
        let mut wait = Waiter::new(self.largest);
        // The deadline starts at the first clock read the wait asks for (a few thousand polls in,
        // or before its first sleep), so a wait that ends sooner reads no clock; a zero timeout
        // waits for nothing.
        let (mut deadline, mut check) = (Deadline::new(timeout), timeout.is_zero());
        loop {
            self.collect_once()?;
            if self.ready.len() + self.completed.len() >= min || self.in_flight == 0 {
                wait.done();
                break;
            }
            if check && deadline.passed() {
                break;
            }
            check = wait.pause(self.qp.wait_state());
        }
        // What it found goes out, then the CQ is looked at again, and again while each look
        // finds more: completions the controller posted while these were handed out (a device
        // posts a group of commands' completions one after another) come with this wait, and
        // the caller's next submission carries them too, one doorbell for the group instead of
        // one per part of it. Nothing is submitted meanwhile, so the looks end. A look is a
        // collect like any other: a reset it meets fails the entries in flight (their events
        // come with this wait), any other failure is this call's.
        while self.ready.len() + self.completed.len() > 0 {
            self.hand_out(out);
            if self.in_flight == 0 {
                break;
            }
            self.collect_once()?;
        }
        if self.in_flight == 0 {
            self.largest = 0;
        }
        Ok(())
    }

    /// Appends the events of the entries refused or completed since the last call to `out`.
    fn hand_out(&mut self, out: &mut impl EventSink) {
        // Drained only when there is something to drain (a drain costs a few dozen
        // instructions even when empty, and a wait at depth usually finds one entry).
        if !self.ready.is_empty() {
            for e in self.ready.drain(..) {
                out.put(e, Path::DirectHost);
            }
        }
        for &cid in &self.completed {
            let Some(s) = self.slots.get_mut(usize::from(cid)).and_then(Option::take) else { continue };
            let st = s.status.unwrap_or(Status::SUCCESS);
            let ev = if st.is_success() {
                IoEvent { cookie: s.cookie, status: IoStatus::Complete, bytes: s.len, error: None }
            } else {
                IoEvent {
                    cookie: s.cookie,
                    status: IoStatus::Failed,
                    bytes: 0,
                    error: Some(Error::Nvme { op: if s.write { "write" } else { "read" }, slba: s.slba, status: st }),
                }
            };
            out.put(ev, s.path);
        }
        self.completed.clear();
    }

    /// Waits for every entry in flight (up to the deadline; then resets the controller, after
    /// which their memory is safe) and reports them as `Canceled` unless they completed. When
    /// the reset fails, the entries' leases are kept for good (their memory stays pinned).
    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        let mut wait = Waiter::new(u64::MAX);
        let (mut deadline, mut check) = (Deadline::new(self.timeout), true);
        while self.in_flight() > 0 && !(check && deadline.passed()) {
            self.collect_once()?;
            check = wait.pause(self.qp.wait_state());
        }
        if self.in_flight() > 0 {
            let reset = self.dev.reset();
            for s in self.slots.iter_mut().flatten().filter(|s| s.status.is_none()) {
                match (&reset, s.lease.take()) {
                    // The controller stopped: the memory is safe again.
                    (Ok(_), l) => drop(l),
                    (Err(_), Some(l)) => InFlight::new(Why::Command).holding(l).keep(),
                    (Err(_), None) => {}
                }
            }
            reset?;
            self.qp.resync(&self.dev.status);
        }
        let mut out = self.status(0, Duration::ZERO)?;
        // What is left never completed.
        for s in self.slots.iter_mut().filter_map(Option::take) {
            out.push((IoEvent { cookie: s.cookie, status: IoStatus::Canceled, bytes: 0, error: None }, s.path));
        }
        self.in_flight = 0;
        for (e, _) in &mut out {
            if e.status == IoStatus::Pending {
                e.status = IoStatus::Canceled;
            }
        }
        Ok(out)
    }
}

impl Drop for QueueBatch {
    fn drop(&mut self) {
        if self.dev.born.in_child() {
            // The parent's queue pair: no cancel (its doorbells), no delete, no unmap here.
            return;
        }
        if self.in_flight() > 0 {
            let _ = self.cancel();
        }
        // Nothing is in flight (or the controller was reset): give the queue pair back. The
        // module revokes our mappings of it; `qp` unmaps them after this.
        delete_queue_pair(&self.dev.fd, self.qp.qid());
        // SAFETY: dropped once, here; `self` is going away.
        unsafe { ManuallyDrop::drop(&mut self.qp) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mock_device::{mock_batch_device, mock_buffer};
    use crate::mock::{stop_stepping_on_idle_polls, MockConfig, MockDevice};
    use crate::Storage;

    /// A batch of 32 entries on its own queue over the device model, which answers only when
    /// stepped; a buffer registered on it.
    fn batch() -> (QueueBatch, Arc<Buffer>, MockDevice, Device) {
        let cfg = MockConfig { depth: 33, stepped: true, ..MockConfig::default() };
        let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_secs(5)).expect("mock");
        let ns = dev.namespace(1).expect("namespace");
        let st = Storage::direct(&dev, 1).expect("storage");
        let buf = Arc::new(mock_buffer(&st, &dev, &mock).expect("buffer"));
        (QueueBatch::over(&dev, &ns, qp, 32, 0), buf, mock, dev)
    }

    /// 4 KiB reads, entry `i` at block `i` into page `i` of `buf`, its cookie `i`.
    fn reads(buf: &Arc<Buffer>, ids: std::ops::Range<u64>) -> Vec<Entry> {
        ids.map(|i| Entry {
            op: Op::Read,
            lease: Lease::new(buf.clone()).expect("lease"),
            buf_offset: i * 4096,
            dev_offset: i * 4096,
            len: 4096,
            cookie: i,
        })
        .collect()
    }

    #[test]
    fn a_batch_ring_has_room_for_four_times_its_entries_within_limits() {
        assert_eq!(ring_depth(8, 2048).unwrap(), 36);
        assert_eq!(ring_depth(1, 2048).unwrap(), 8);
        assert_eq!(ring_depth(0, 2048).unwrap(), 4);
        assert_eq!(ring_depth(100, 2048).unwrap(), 256, "capped");
        assert_eq!(ring_depth(300, 2048).unwrap(), 301, "never fewer than the entries' own");
        assert_eq!(ring_depth(64, 128).unwrap(), 128, "the controller's limit");
        assert_eq!(ring_depth(127, 128).unwrap(), 128);
        assert!(matches!(ring_depth(128, 128), Err(Error::InvalidArgument { .. })));
        assert!(matches!(ring_depth(usize::MAX, 2048), Err(Error::InvalidArgument { .. })));
    }

    /// A full batch of 8 reaping and resubmitting on the ring it gets does not write the CQ
    /// head doorbell every round: the first round's 8 consumed slots stay with the host (a
    /// quarter of its 36-slot ring is 9), and the device never finds its CQ full.
    #[test]
    fn a_full_batch_gives_completion_slots_back_a_quarter_ring_at_a_time() {
        let depth = ring_depth(8, 4096).expect("depth");
        let cfg = MockConfig { depth, stepped: true, ..MockConfig::default() };
        let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_secs(5)).expect("mock");
        let ns = dev.namespace(1).expect("namespace");
        let st = Storage::direct(&dev, 1).expect("storage");
        let buf = Arc::new(mock_buffer(&st, &dev, &mock).expect("buffer"));
        let mut b = QueueBatch::over(&dev, &ns, qp, 8, 0);
        let mut heads = Vec::new();
        for _ in 0..9 {
            b.submit(reads(&buf, 0..8)).expect("submit");
            assert_eq!(mock.step(), 8);
            assert_eq!(b.status(8, Duration::from_secs(5)).expect("status").len(), 8);
            heads.push(mock.doorbells().1);
        }
        assert_eq!(heads[0], 0, "8 slots consumed of a {depth}-slot ring: not yet given back");
        let writes = heads.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(writes <= 8, "the head doorbell moved at {writes} of 8 rounds: {heads:?}");
        assert_eq!(mock.stats().cq_full, 0);
    }

    /// A poll that finds nothing posted looks at the CQ only: with many entries in flight it
    /// walks none of them, and the entries still complete once the device answers.
    #[test]
    fn a_poll_that_finds_nothing_walks_no_entries() {
        let (mut b, buf, mock, _dev) = batch();
        b.submit(reads(&buf, 0..32)).expect("submit");
        // The device has not run: nothing to report, and nothing walked.
        for _ in 0..100 {
            assert!(b.status(0, Duration::ZERO).expect("status").is_empty());
        }
        assert_eq!((b.reaps, b.in_flight()), (0, 32));
        mock.step_on_idle_polls();
        let mut got = Vec::new();
        while got.len() < 32 {
            let ev = b.status(32 - got.len(), Duration::from_secs(5)).expect("status");
            assert!(!ev.is_empty(), "no completion within 5 s");
            got.extend(ev.into_iter().map(|(e, _)| (e.cookie, e.status)));
        }
        stop_stepping_on_idle_polls();
        got.sort_by_key(|g| g.0);
        assert_eq!(got, (0..32).map(|i| (i, IoStatus::Complete)).collect::<Vec<_>>());
        assert!(b.reaps >= 1 && b.in_flight() == 0, "reaps {}", b.reaps);
    }

    /// A wait that found completions looks at the CQ again once it handed them out, and again
    /// while each look finds more: what the device posted meanwhile comes with this wait. Here
    /// the device posts 2 completions each time it runs, and the sink runs it once per event it
    /// takes, as a device goes on posting a group while the host hands out its first part.
    #[test]
    fn a_wait_takes_the_completions_posted_while_it_hands_out_its_events() {
        struct Stepping<'a>(&'a MockDevice, Vec<u64>);
        impl EventSink for Stepping<'_> {
            fn put(&mut self, ev: IoEvent, _: Path) {
                self.1.push(ev.cookie);
                self.0.step();
            }
        }
        let (mut b, buf, mock, _dev) = batch();
        mock.post_at_most(2);
        b.submit(reads(&buf, 0..8)).expect("submit");
        mock.step();
        let mut out = Stepping(&mock, Vec::new());
        b.status_into(1, Duration::from_secs(5), &mut out).expect("status");
        out.1.sort_unstable();
        assert_eq!(out.1, (0..8).collect::<Vec<_>>(), "the events of one wait");
        assert_eq!(b.in_flight(), 0);
    }

    /// A reset that the wait's further look meets (a poll that finds nothing reads the epoch
    /// only now and then, so each number of idle polls before it is tried) fails the entries in
    /// flight, and their events come with this wait or the next: none is lost with the reset.
    #[test]
    fn a_reset_met_by_a_further_look_fails_the_entries_in_flight() {
        struct Resetting<'a>(&'a MockDevice, Vec<(u64, IoStatus)>);
        impl EventSink for Resetting<'_> {
            fn put(&mut self, ev: IoEvent, _: Path) {
                if self.1.is_empty() {
                    self.0.reset_controller();
                }
                self.1.push((ev.cookie, ev.status));
            }
        }
        for idle in 0..64 {
            let (mut b, buf, mock, _dev) = batch();
            mock.post_at_most(2);
            b.submit(reads(&buf, 0..8)).expect("submit");
            for _ in 0..idle {
                assert!(b.status(0, Duration::ZERO).expect("status").is_empty());
            }
            mock.step();
            let mut out = Resetting(&mock, Vec::new());
            b.status_into(1, Duration::from_secs(5), &mut out).expect("status");
            if b.in_flight() > 0 {
                b.status_into(8 - out.1.len(), Duration::from_millis(500), &mut out).expect("status");
            }
            out.1.sort_unstable_by_key(|e| e.0);
            let want: Vec<_> = (0..8).map(|i| (i, if i < 2 { IoStatus::Complete } else { IoStatus::Failed })).collect();
            assert_eq!(out.1, want, "after {idle} idle polls");
            assert_eq!(b.in_flight(), 0);
        }
    }

    /// A submission that meets a controller reset fails the entries of earlier bursts, whose
    /// commands were lost with it (their ids are free for other commands now), instead of
    /// leaving them to wait for completions that never come.
    /// A submit that fails as a whole (here at its second entry's push, across a reset)
    /// leaves nothing of itself behind: no command, no held lease, and no event for an entry of
    /// the call that was refused before the failure.
    #[test]
    fn a_failed_submission_leaves_no_event_of_its_own() {
        let (mut b, buf, mock, _dev) = batch();
        mock.reset_controller();
        let mut entries = reads(&buf, 0..2);
        // Longer than one command: refused as an Invalid event before the push that fails.
        entries[0].len = b.max_command_bytes() + 4096;
        let e = b.submit(entries).expect_err("a submission across a reset");
        assert!(matches!(e, Error::EpochChanged { .. }), "{e:?}");
        assert_eq!((b.in_flight(), buf.inflight()), (0, 0), "something of the call is held");
        let ev = b.status(0, Duration::ZERO).expect("status");
        assert!(ev.is_empty(), "events of a submit that failed: {ev:?}");
    }

    #[test]
    fn a_submission_that_meets_a_reset_fails_the_entries_in_flight() {
        let (mut b, buf, mock, _dev) = batch();
        b.submit(reads(&buf, 0..4)).expect("submit");
        mock.reset_controller();
        let e = b.submit(reads(&buf, 4..5)).expect_err("a submission across a reset");
        assert!(matches!(e, Error::EpochChanged { .. }), "{e:?}");
        assert_eq!(b.in_flight(), 0, "entries still wait for lost commands");
        let mut ev: Vec<_> =
            b.status(4, Duration::from_millis(100)).expect("status").into_iter().map(|(e, _)| e).collect();
        ev.sort_by_key(|e| e.cookie);
        assert_eq!(
            ev.iter().map(|e| (e.cookie, e.status)).collect::<Vec<_>>(),
            (0..4).map(|i| (i, IoStatus::Failed)).collect::<Vec<_>>()
        );
        assert!(ev.iter().all(|e| matches!(e.error, Some(Error::EpochChanged { .. }))), "{ev:?}");
    }
}
