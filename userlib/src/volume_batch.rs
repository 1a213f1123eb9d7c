//! A striped volume's queue batch: one queue batch per member (each a queue pair of its own,
//! one doorbell per member per submit). Every entry, whatever its size, is split as md RAID0
//! lays it out (at chunk boundaries, and a chunk's piece further at the member's largest
//! command), one command per piece, on the members that hold them; its event comes when its
//! last piece completes: its bytes, or the first failed piece's error naming the member and the
//! offset on it.
//!
//! Room: an entry counts once against the batch's capacity, however many pieces it has. Each
//! member's queue pair holds [`member_depth`] pieces; pieces beyond that wait on their member,
//! in submission order, and go out as that member's pieces complete (at every `submit`,
//! `status` and `cancel`). Pieces on a queue complete or time out without any other piece's
//! help, so a waiting piece always gets its turn: no entry can wait for room that only its own
//! waiting pieces would free.

use crate::batch::{Entry, EventSink, IoEvent, IoStatus};
use crate::buffer::{Lease, Path};
use crate::cmd::Stride;
use crate::error::{Error, Result};
use crate::queue::{Deadline, Waiter};
use crate::queue_batch::QueueBatch;
use crate::volume::{pieces, VolumePath};
use std::collections::VecDeque;
use std::time::Duration;

/// The fewest pieces a member's queue pair holds: a 1 MiB entry at the default 128 KiB chunk is
/// 8 pieces, all on one member of a one-member volume, and a batch of one such entry should
/// keep them all in flight, as md does.
const MIN_MEMBER_DEPTH: usize = 32;

/// Pieces each member's queue pair holds for a batch of `capacity` entries on a controller that
/// grants queues of `max_entries`: two per entry (an entry of at most a chunk is at most two
/// pieces, both on the one member of a one-member volume, so such entries never wait), at
/// least [`MIN_MEMBER_DEPTH`], at most what the controller grants (one entry stays empty).
pub(crate) fn member_depth(capacity: usize, max_entries: u32) -> usize {
    let most = (max_entries as usize).saturating_sub(1).max(1);
    capacity.saturating_mul(2).max(MIN_MEMBER_DEPTH).min(most)
}

/// A node's "chunk": no request reaches its end, so only the largest command splits one.
const NODE_CHUNK: u64 = 1 << 62;

/// A piece's cookie in its member's batch: its entry's slot in the low bits, its index among
/// the entry's pieces above them.
const SLOT_BITS: u32 = 32;

/// A slot for an entry whose pieces are in flight or waiting (`remaining > 0`), or a free one
/// (its piece list kept for the next entry).
struct Pending {
    cookie: u64,
    len: u64,
    path: Path,
    /// (member, offset on it) of each piece, by piece index.
    pieces: Vec<(usize, u64)>,
    remaining: usize,
    failure: Option<(IoStatus, Error)>,
}

/// Where one member of a volume batch stands (see [`VolumeQueueBatch::member_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemberProgress {
    /// Its pieces on its queue whose commands have not come back.
    pub(crate) in_flight: usize,
    /// Its pieces whose commands came back so far (wrapping).
    pub(crate) done: u64,
}

/// One member: its queue batch, and its pieces that wait for room there.
struct Member {
    batch: QueueBatch,
    /// Pieces its queue pair holds at once.
    depth: usize,
    /// Its largest command in bytes (whole blocks).
    max_piece: u64,
    /// Pieces submitted to its batch whose events have not come back: kept here, because the
    /// batch would count them by a walk over its slots at every poll.
    running: usize,
    /// Its pieces whose commands came back so far (wrapping).
    done: u64,
    /// With how each one's buffer pieces lie (`None`: one range).
    waiting: VecDeque<(Entry, Option<Stride>)>,
}

/// One command's share of an entry: its member, where on the member, where its first byte lies
/// in the entry, its bytes, and how its pieces lie in the buffer.
#[derive(Debug, Clone, Copy)]
struct MemberPiece {
    member: usize,
    dev_offset: u64,
    request_offset: u64,
    len: u64,
    /// `first == len`: one range of the buffer.
    stride: Stride,
    /// The entry offset just past its last byte, and the bytes of its last piece.
    end: u64,
    last: u64,
}

impl MemberPiece {
    fn new(member: usize, dev_offset: u64, request_offset: u64, len: u64) -> Self {
        let stride = Stride::one(len);
        MemberPiece { member, dev_offset, request_offset, len, stride, end: request_offset + len, last: len }
    }

    /// How its buffer pieces lie, when there are several.
    fn gathered(&self) -> Option<Stride> {
        (self.stride.first < self.len).then_some(self.stride)
    }

    /// Takes up to `avail` bytes at member offset `off`, entry offset `req`, when they continue
    /// it on the member, it has room below `step`, and in the buffer they come right after it
    /// (one range) or where its stride puts its next piece (a jump between bus pages, which
    /// `jumps(from, to)` checks); returns the bytes taken (0: none).
    fn take(&mut self, off: u64, req: u64, avail: u64, step: u64, jumps: impl Fn(u64, u64) -> bool) -> u64 {
        if self.dev_offset + self.len != off || self.len >= step {
            return 0;
        }
        let room = step - self.len;
        let take = if self.stride.first == self.len && req == self.end {
            // One range so far, and this continues it in the buffer: it grows.
            let take = room.min(avail);
            self.stride.first += take;
            take
        } else if req > self.end {
            self.stride.take_next(self.last, req - self.end, avail, room, || jumps(self.end, req))
        } else {
            0
        };
        if take == 0 {
            return 0;
        }
        self.len += take;
        (self.end, self.last) = (req + take, take);
        take
    }
}

/// Queue batches on every member of a volume.
pub(crate) struct VolumeQueueBatch {
    members: Vec<Member>,
    /// The members' names (empty for a node's batch: errors then name no member).
    names: Vec<String>,
    chunk: u64,
    capacity: usize,
    /// Entries in flight by slot (a piece's cookie names its slot), free slots among them; a
    /// slot is reused once its entry's last piece came back, so there are at most `capacity`.
    slots: Vec<Pending>,
    free: Vec<u32>,
    /// The largest entry submitted since nothing was in flight (whether a wait may spin).
    largest: u64,
    ready: Vec<(IoEvent, Path)>,
    /// A member batch's events as they come back (kept: a poll allocates nothing).
    piece_events: Vec<(IoEvent, Path)>,
    /// Kept between calls, so that a submit allocates only its entries' piece lists: the
    /// members a submit touched, an entry's pieces and their leases, and the cookies of the
    /// pieces a member's submit carries.
    touched: Vec<bool>,
    ps: Vec<MemberPiece>,
    leases: Vec<Lease<std::sync::Arc<crate::buffer::Buffer>>>,
    cookies: Vec<u64>,
}

impl Pending {
    fn free() -> Self {
        Pending { cookie: 0, len: 0, path: Path::DirectHost, pieces: Vec::new(), remaining: 0, failure: None }
    }
}

impl std::fmt::Debug for VolumeQueueBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting: usize = self.members.iter().map(|m| m.waiting.len()).sum();
        write!(
            f,
            "VolumeQueueBatch({} members, {} pending, {waiting} pieces waiting)",
            self.members.len(),
            self.in_flight()
        )
    }
}

impl VolumeQueueBatch {
    /// Queue batches for `capacity` entries on every member; `None` when a member's controller
    /// does not grant a queue pair.
    pub(crate) fn new(vol: &VolumePath, capacity: usize) -> Option<Self> {
        let mut members = Vec::with_capacity(vol.members().len());
        for (i, m) in vol.members().iter().enumerate() {
            let depth = member_depth(capacity, m.dev.info().max_queue_entries);
            members.push(QueueBatch::on_member(&m.dev, &m.ns, depth, i).ok()?);
        }
        Some(Self::from_members(members, vol.names().to_vec(), vol.chunk(), capacity))
    }

    /// A node's entries larger than its largest command, split into commands on `batch` (a
    /// queue pair of their own, [`member_depth`] pieces deep): a one-member volume with no chunk
    /// boundary, whose pieces' errors are reported as they are (no member to name).
    pub(crate) fn for_node(batch: QueueBatch, capacity: usize) -> Self {
        Self::from_members(vec![batch], Vec::new(), NODE_CHUNK, capacity)
    }

    /// A batch over member batches the test made (in member order, named `names`).
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn over(members: Vec<QueueBatch>, names: Vec<String>, chunk: u64, capacity: usize) -> Self {
        Self::from_members(members, names, chunk, capacity)
    }

    fn from_members(batches: Vec<QueueBatch>, names: Vec<String>, chunk: u64, capacity: usize) -> Self {
        let members = batches
            .into_iter()
            .map(|batch| {
                let (depth, max_piece) = (batch.capacity(), batch.max_command_bytes());
                Member { batch, depth, max_piece, running: 0, done: 0, waiting: VecDeque::new() }
            })
            .collect();
        VolumeQueueBatch {
            members,
            names,
            chunk,
            capacity,
            slots: Vec::new(),
            free: Vec::new(),
            largest: 0,
            ready: Vec::new(),
            piece_events: Vec::new(),
            touched: Vec::new(),
            ps: Vec::new(),
            leases: Vec::new(),
            cookies: Vec::new(),
        }
    }

    /// Entries in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// How long a piece may run before it counts as hung: the longest of the members' command
    /// timeouts.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.members.iter().map(|m| m.batch.command_timeout()).max().unwrap_or_default()
    }

    /// Each member's progress, in member order: what moves while an entry of many pieces has no
    /// event yet.
    pub(crate) fn member_progress(&self) -> impl Iterator<Item = MemberProgress> + '_ {
        self.members.iter().map(|m| MemberProgress { in_flight: m.running, done: m.done })
    }

    /// Submits checked entries of any size: their pieces go to the members' queues, one
    /// doorbell per member touched, or wait there for room.
    pub(crate) fn submit<I>(&mut self, entries: I) -> Result<()>
    where
        I: IntoIterator<Item = Entry>,
        I::IntoIter: ExactSizeIterator,
    {
        let entries = entries.into_iter();
        if self.in_flight() + entries.len() > self.capacity {
            return Err(Error::invalid("ios", format!("{} entries exceed the batch's free capacity", entries.len())));
        }
        if self.capacity >> SLOT_BITS != 0 {
            return Err(Error::invalid(
                "capacity",
                format!("{} entries exceed what a volume batch holds", self.capacity),
            ));
        }
        let n = self.members.len();
        self.touched.clear();
        self.touched.resize(n, false);
        let (mut ps, mut leases) = (std::mem::take(&mut self.ps), std::mem::take(&mut self.leases));
        for e in entries {
            ps.clear();
            let buf = e.lease.buffer();
            for p in pieces(n, self.chunk, e.dev_offset, e.len) {
                // A chunk's piece larger than the member's largest command becomes several;
                // pieces that continue each other on the member become one, up to that size:
                // those of a one-member volume, next to each other in the buffer, and a member's
                // chunks of a striped volume, at a fixed distance in the buffer (one command
                // where there were one per chunk).
                let step = self.members[p.member].max_piece.max(1);
                let mut at = 0;
                while at < p.len {
                    let (off, req) = (p.member_offset + at, p.request_offset + at);
                    let open = ps.iter_mut().rev().find(|l| l.member == p.member);
                    let jumps = |from: u64, to: u64| {
                        let reg = buf.registration_on(p.member);
                        reg.is_some_and(|r| r.jumps_between_pages(e.buf_offset + from, e.buf_offset + to))
                    };
                    let took = open.map_or(0, |l| l.take(off, req, p.len - at, step, jumps));
                    if took > 0 {
                        at += took;
                        continue;
                    }
                    let len = step.min(p.len - at);
                    ps.push(MemberPiece::new(p.member, off, req, len));
                    at += len;
                }
            }
            // Every piece holds its own lease; all are taken before any piece is queued. The one
            // piece of an entry inside one chunk takes the entry's.
            let path = e.lease.buffer().path();
            leases.clear();
            let refused = if ps.len() >> (64 - SLOT_BITS) != 0 {
                Some(Error::invalid("len", format!("{} pieces exceed what a volume entry may have", ps.len())))
            } else if ps.len() == 1 {
                leases.push(e.lease);
                None
            } else {
                ps.iter().find_map(|_| match Lease::new(e.lease.holder().clone()) {
                    Ok(l) => {
                        leases.push(l);
                        None
                    }
                    Err(err) => Some(err),
                })
            };
            match refused {
                None => {}
                Some(err) => {
                    leases.clear();
                    self.ready.push((
                        IoEvent { cookie: e.cookie, status: IoStatus::Failed, bytes: 0, error: Some(err) },
                        path,
                    ));
                    continue;
                }
            };
            let slot = match self.free.pop() {
                Some(slot) => slot,
                None => {
                    // CAST: at most `capacity` slots (checked above), below 2^32.
                    self.slots.push(Pending::free());
                    (self.slots.len() - 1) as u32
                }
            };
            let first = u64::from(slot);
            for (k, (p, lease)) in ps.iter().zip(leases.drain(..)).enumerate() {
                self.touched[p.member] = true;
                let piece = Entry {
                    op: e.op,
                    lease,
                    buf_offset: e.buf_offset + p.request_offset,
                    dev_offset: p.dev_offset,
                    len: p.len,
                    cookie: first | (k as u64) << SLOT_BITS,
                };
                self.members[p.member].waiting.push_back((piece, p.gathered()));
            }
            self.largest = self.largest.max(e.len);
            let p = &mut self.slots[slot as usize];
            (p.cookie, p.len, p.path, p.remaining) = (e.cookie, e.len, path, ps.len());
            p.pieces.clear();
            p.pieces.extend(ps.iter().map(|l| (l.member, l.dev_offset)));
        }
        (self.ps, self.leases) = (ps, leases);
        for m in 0..n {
            if self.touched[m] {
                self.start_waiting(m);
            }
        }
        Ok(())
    }

    /// Submits as many of member `m`'s waiting pieces as its queue has room for (one doorbell).
    fn start_waiting(&mut self, m: usize) {
        let Self { members, cookies, .. } = self;
        let member = &mut members[m];
        if member.waiting.is_empty() {
            return;
        }
        let room = member.depth.saturating_sub(member.running).min(member.waiting.len());
        if room == 0 {
            return;
        }
        cookies.clear();
        cookies.extend(member.waiting.iter().take(room).map(|(e, _)| e.cookie));
        match member.batch.submit(member.waiting.drain(..room)) {
            // Refused ones among them come back as events too.
            Ok(()) => member.running += room,
            Err(err) => {
                // Nothing of these was submitted (their leases went back): those pieces failed.
                let why = err.to_string();
                let evs = cookies
                    .iter()
                    .map(|&c| {
                        let e = Error::invalid("batch", format!("submitting to the member failed: {why}"));
                        (IoEvent { cookie: c, status: IoStatus::Failed, bytes: 0, error: Some(e) }, Path::DirectHost)
                    })
                    .collect::<Vec<_>>();
                self.absorb(m, evs);
            }
        }
    }

    /// Takes the events member `m`'s batch returned (of pieces it ran).
    fn finished(&mut self, m: usize, events: impl ExactSizeIterator<Item = (IoEvent, Path)>) {
        let member = &mut self.members[m];
        member.running = member.running.saturating_sub(events.len());
        member.done = member.done.wrapping_add(events.len() as u64);
        self.absorb(m, events);
    }

    /// Takes member `m`'s piece events; entries whose last piece arrived become ready.
    fn absorb(&mut self, m: usize, events: impl IntoIterator<Item = (IoEvent, Path)>) {
        for (ev, _) in events {
            // CAST: the low and the high bits of a cookie this batch made.
            let (slot, k) = (ev.cookie as u32, (ev.cookie >> SLOT_BITS) as usize);
            let Some(p) = self.slots.get_mut(slot as usize).filter(|p| p.remaining > 0) else { continue };
            let Some(&(member, offset)) = p.pieces.get(k) else { continue };
            p.remaining = p.remaining.saturating_sub(1);
            if ev.status != IoStatus::Complete && p.failure.is_none() {
                debug_assert_eq!(member, m);
                let source = ev.error.unwrap_or_else(|| Error::invalid("batch", format!("{:?}", ev.status)));
                let err = match self.names.get(member) {
                    Some(name) => Error::Member { member: name.clone(), offset, source: Box::new(source) },
                    // A node's batch: the error is the node's own.
                    None => source,
                };
                p.failure = Some((ev.status, err));
            }
            if p.remaining == 0 {
                let ev = match p.failure.take() {
                    None => IoEvent { cookie: p.cookie, status: IoStatus::Complete, bytes: p.len, error: None },
                    Some((status, e)) => IoEvent { cookie: p.cookie, status, bytes: 0, error: Some(e) },
                };
                self.ready.push((ev, p.path));
                self.free.push(slot);
            }
        }
    }

    /// Waits until at least `min` entries finished (or `timeout` passed, or none runs) and
    /// appends every finished entry's event to `out` with the path its data took. Waiting
    /// pieces go out as room frees up.
    pub(crate) fn status_into(&mut self, min: usize, timeout: Duration, out: &mut impl EventSink) -> Result<()> {
        let mut wait = Waiter::new(self.largest);
        // The deadline starts at the first clock read the wait asks for (a few thousand polls in,
        // or before its first sleep), so a wait that ends sooner reads no clock; a zero timeout
        // looks once.
        let (mut deadline, mut check) = (Deadline::new(timeout), timeout.is_zero());
        // Whether a member's own wait ran, and whether one ended with nothing (its time was up).
        let (mut handed, mut expired) = (false, false);
        // Which members run changes only when pieces come back or go out, below.
        let mut sole = self.sole_runner();
        loop {
            match sole {
                // One member runs (a one-member volume, or entries on one member): its queue
                // batch's own wait polls for its next piece, or takes what already came, with
                // no round of this loop per poll. This wait's deadline starts after the first
                // such wait (which reads the clock only once it waited a while).
                Some(m) if self.ready.len() < min => {
                    if handed {
                        deadline.start();
                    }
                    handed = true;
                    let mut evs = std::mem::take(&mut self.piece_events);
                    let got = self.members[m].batch.status_into(1, deadline.left(), &mut evs);
                    expired = evs.is_empty();
                    self.finished(m, evs.drain(..));
                    self.piece_events = evs;
                    got?;
                }
                _ => {
                    for m in 0..self.members.len() {
                        if self.members[m].running > 0 {
                            let mut evs = std::mem::take(&mut self.piece_events);
                            let got = self.members[m].batch.status_into(0, Duration::ZERO, &mut evs);
                            self.finished(m, evs.drain(..));
                            self.piece_events = evs;
                            got?;
                        }
                    }
                }
            }
            // Also with nothing running: a refused submission leaves the rest waiting.
            for m in 0..self.members.len() {
                self.start_waiting(m);
            }
            let done = self.ready.len() >= min || self.in_flight() == 0;
            if done || expired || (check && deadline.passed()) {
                wait.done();
                if self.in_flight() == 0 {
                    self.largest = 0;
                }
                out.put_all(&mut self.ready);
                return Ok(());
            }
            sole = self.sole_runner();
            if sole.is_some() {
                continue;
            }
            // Waits as a queue's own waits do (spinning while it pays, then asleep on an
            // interrupt), on the member with the most pieces in flight: a volume kept busy
            // completes on every member, and a spinning thread on a core the device's own work
            // needs slows everything down.
            match self.members.iter().filter(|m| m.running > 0).max_by_key(|m| m.running) {
                Some(m) => check = wait.pause(m.batch.wait_state()),
                None => {
                    std::hint::spin_loop();
                    // Nothing runs to pause on: the deadline is what ends this wait.
                    check = true;
                }
            }
        }
    }

    /// The one member with pieces in flight, if exactly one has any.
    fn sole_runner(&self) -> Option<usize> {
        let mut running = self.members.iter().enumerate().filter(|(_, m)| m.running > 0);
        match (running.next(), running.next()) {
            (Some((m, _)), None) => Some(m),
            _ => None,
        }
    }

    /// Cancels the pieces still waiting (never submitted: their memory is free at once), then
    /// waits for every piece in flight (each member's batch resets its controller past its
    /// deadline, or keeps the leases for good) and returns every entry's event.
    pub(crate) fn cancel(&mut self) -> Result<Vec<(IoEvent, Path)>> {
        for m in 0..self.members.len() {
            let evs = self.members[m]
                .waiting
                .drain(..)
                .map(|(e, _)| {
                    (IoEvent { cookie: e.cookie, status: IoStatus::Canceled, bytes: 0, error: None }, Path::DirectHost)
                })
                .collect::<Vec<_>>();
            self.absorb(m, evs);
        }
        let mut first_err = None;
        for m in 0..self.members.len() {
            match self.members[m].batch.cancel() {
                Ok(evs) => self.finished(m, evs.into_iter()),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.ready)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Op;
    use crate::buffer::Buffer;
    use crate::device::mock_device::{mock_batch_device, mock_volume_buffer};
    use crate::device::Device;
    use crate::mock::{Behaviour, Fault, MockConfig, MockDevice};
    use crate::Storage;
    use std::sync::Arc;
    use std::time::Instant;

    /// Bytes of every member (and of each mock's host memory).
    const MEMBER: u64 = 4 << 20;

    /// A volume over mocks, with its queue batch and a buffer registered on every member.
    struct Vol {
        batch: VolumeQueueBatch,
        chunk: u64,
        mocks: Vec<MockDevice>,
        _devs: Vec<Device>,
        buf: Arc<Buffer>,
    }

    /// Member `m`'s byte at `at`, as the mocks start.
    fn byte(m: usize, at: u64) -> u8 {
        (at / 4096 * 31 + at % 251 + m as u64 * 97) as u8
    }

    /// `n` members of `MEMBER` bytes striped in `chunk`s; the batch holds `capacity` entries,
    /// each member's queue `depth` pieces; member `m` answers as `scripts[m]` says (else
    /// honestly).
    fn volume(n: usize, chunk: u64, capacity: usize, depth: usize, scripts: Vec<Vec<Fault>>) -> Vol {
        let (mut members, mut mocks, mut devs) = (Vec::new(), Vec::new(), Vec::new());
        for m in 0..n {
            let behaviour = scripts.get(m).cloned().map_or(Behaviour::Honest, Behaviour::Script);
            let cfg = MockConfig {
                depth: depth as u32 + 1,
                blocks: MEMBER / 4096,
                segment_bytes: MEMBER,
                behaviour,
                ..MockConfig::default()
            };
            let (dev, qp, mock) = mock_batch_device(cfg, Duration::from_secs(5)).unwrap();
            mock.set_backing(0, &(0..MEMBER).map(|at| byte(m, at)).collect::<Vec<u8>>());
            let ns = dev.namespace(1).unwrap();
            members.push(QueueBatch::over(&dev, &ns, qp, depth, m));
            mocks.push(mock);
            devs.push(dev);
        }
        let st = Storage::direct(&devs[0], 1).unwrap();
        let pairs: Vec<(&Device, &MockDevice)> = devs.iter().zip(&mocks).collect();
        let buf = Arc::new(mock_volume_buffer(&st, &pairs).unwrap());
        let names = (0..n).map(|m| format!("m{m}")).collect();
        Vol { batch: VolumeQueueBatch::over(members, names, chunk, capacity), chunk, mocks, _devs: devs, buf }
    }

    impl Vol {
        fn entry(&self, op: Op, buf_offset: u64, dev_offset: u64, len: u64, cookie: u64) -> Entry {
            Entry { op, lease: Lease::new(self.buf.clone()).unwrap(), buf_offset, dev_offset, len, cookie }
        }

        /// Submits `entries` and collects one event per entry (or what came within 20 s).
        fn run(&mut self, entries: Vec<Entry>) -> Vec<IoEvent> {
            let n = entries.len();
            self.batch.submit(entries).unwrap();
            let (mut out, start) = (Vec::new(), Instant::now());
            while out.len() < n && start.elapsed() < Duration::from_secs(20) {
                let mut got = Vec::new();
                self.batch.status_into(n - out.len(), Duration::from_secs(1), &mut got).unwrap();
                out.extend(got.into_iter().map(|(e, _)| e));
            }
            out
        }
    }

    /// Entries of one piece each, kept going round by round: neither a submit nor a wait
    /// allocates (an entry's slot and piece list, the lease, piece and cookie lists and the
    /// members' submissions reuse what the batch keeps).
    #[test]
    fn a_round_of_one_piece_entries_allocates_nothing() {
        use crate::alloc_count::allocations_in;
        let mut v = volume(2, 64 << 10, 8, 16, Vec::new());
        let entries = |v: &Vol, round: u64| -> Vec<Entry> {
            (0..8u64).map(|k| v.entry(Op::Read, k * 4096, ((round * 8 + k) % 64) * (32 << 10), 4096, k)).collect()
        };
        for r in 0..20 {
            let es = entries(&v, r);
            assert_eq!(v.run(es).len(), 8);
        }
        let (mut allocations, mut done) = (0, 0);
        for r in 0..200 {
            let es = entries(&v, r);
            let (got, n) = allocations_in(|| {
                v.batch.submit(es).unwrap();
                let mut out = Vec::with_capacity(8);
                let mut got = 0;
                while got < 8 {
                    v.batch.status_into(8 - got, Duration::from_secs(5), &mut out).unwrap();
                    got = out.len();
                }
                got
            });
            // The vector of events made inside the count.
            allocations += n - 1;
            done += got;
        }
        assert_eq!(done, 1600);
        assert_eq!(allocations, 0, "allocations for 1600 one-piece entries");
    }

    /// Entries of many chunks, more pieces than a member's queue holds, become per-member
    /// pieces that wait for room: every entry completes once, and each piece's bytes land in
    /// the buffer from the member and offset md RAID0 puts them at (on one member: pieces that
    /// continue each other, merged into commands of up to 1 MiB).
    #[test]
    fn entries_larger_than_a_chunk_run_as_pieces_on_the_members_queues() {
        for n in [2, 1, 3] {
            large_entries_on(n);
        }
    }

    fn large_entries_on(n: usize) {
        let chunk = 16 << 10;
        let mut v = volume(n, chunk, 4, 4, Vec::new());
        let want = [(0, 4096, 256 << 10), (1 << 20, 5 * chunk - 4096, 3 * chunk + 8192), (2 << 20, 7 * chunk, 4096)];
        let entries = want.iter().enumerate().map(|(i, &(b, d, l))| v.entry(Op::Read, b, d, l, i as u64)).collect();
        let ev = v.run(entries);
        let mut seen = [0; 3];
        for e in &ev {
            let (_, _, len) = want[e.cookie as usize];
            assert_eq!((e.status, e.bytes), (IoStatus::Complete, len), "{e:?}");
            seen[e.cookie as usize] += 1;
        }
        assert_eq!(seen, [1, 1, 1], "{ev:?}");
        assert_eq!(v.batch.in_flight(), 0);
        for &(b, d, l) in &want {
            for p in pieces(n, v.chunk, d, l) {
                let got = v.mocks[p.member].host_read((b + p.request_offset) as usize, p.len as usize);
                let exp: Vec<u8> = (p.member_offset..p.member_offset + p.len).map(|at| byte(p.member, at)).collect();
                assert!(
                    got == exp,
                    "{n} members, entry at {d}: member {}'s piece at {} differs",
                    p.member,
                    p.member_offset
                );
            }
        }
    }

    /// An entry over many chunks of 2 members: each member's chunks, at a fixed distance in the
    /// buffer, go out as one command while they fit one (also from inside a chunk), where the
    /// buffer jumps between pages; elsewhere one command per chunk. The bytes land where md
    /// RAID0 puts them either way.
    #[test]
    fn a_members_chunks_of_an_entry_go_out_as_one_command() {
        let chunk = 128 << 10;
        for (buf_at, per_member) in [(0u64, [2u64, 2]), (512, [9, 8])] {
            let mut v = volume(2, chunk, 4, 8, Vec::new());
            let want = [(buf_at, 0u64, 1u64 << 20), (buf_at + (1 << 20), chunk - 4096, 1 << 20)];
            let entries = want.iter().enumerate().map(|(i, &(b, d, l))| v.entry(Op::Read, b, d, l, i as u64)).collect();
            let ev = v.run(entries);
            assert_eq!(ev.len(), 2);
            assert!(ev.iter().all(|e| (e.status, e.bytes) == (IoStatus::Complete, 1 << 20)), "{ev:?}");
            let reads: Vec<u64> = v.mocks.iter().map(|m| m.stats().reads).collect();
            assert_eq!(reads, per_member, "buffer at {buf_at}");
            for &(b, d, l) in &want {
                for p in pieces(2, chunk, d, l) {
                    let got = v.mocks[p.member].host_read((b + p.request_offset) as usize, p.len as usize);
                    let exp: Vec<u8> =
                        (p.member_offset..p.member_offset + p.len).map(|at| byte(p.member, at)).collect();
                    assert!(got == exp, "buffer at {buf_at}, entry at {d}: member {}'s piece differs", p.member);
                }
            }
        }
    }

    /// Writes of several chunks with a chunk larger than one command (2 MiB against the
    /// model's 1 MiB): each chunk's piece becomes commands of at most 1 MiB, and the members
    /// hold the buffer's bytes where md RAID0 puts them.
    #[test]
    fn large_writes_land_on_every_member_in_commands_of_at_most_the_limit() {
        let chunk = 2 << 20;
        let mut v = volume(2, chunk, 2, 2, Vec::new());
        let (b, d, l) = (4096u64, (1 << 20) + 8192, 3 << 20);
        let data = |at: u64| (at * 7 / 4096 + 13) as u8;
        for p in pieces(2, chunk, d, l) {
            let bytes: Vec<u8> = (0..p.len).map(|i| data(d + p.request_offset + i)).collect();
            v.mocks[p.member].host_write((b + p.request_offset) as usize, &bytes);
        }
        let entry = v.entry(Op::Write, b, d, l, 7);
        let ev = v.run(vec![entry]);
        assert!(
            matches!(ev.as_slice(), [IoEvent { cookie: 7, status: IoStatus::Complete, bytes, .. }] if *bytes == l),
            "{ev:?}"
        );
        for p in pieces(2, chunk, d, l) {
            let got = v.mocks[p.member].backing(p.member_offset / 4096, p.len / 4096);
            let exp: Vec<u8> = (0..p.len).map(|i| data(d + p.request_offset + i)).collect();
            assert!(got == exp, "member {} at {} differs", p.member, p.member_offset);
        }
    }

    /// A failed piece of a multi-chunk entry fails the entry once, naming the member and the
    /// offset where the failed command starts on it, once all of the entry's pieces are over; the
    /// batch goes on. With the buffer inside a page every chunk is a command of its own; on page
    /// boundaries a member's chunks of the entry are one command.
    #[test]
    fn a_failed_piece_of_a_large_entry_names_its_member_and_offset() {
        let chunk = 16 << 10;
        // Member 1's second command (chunk 3 of the volume, at chunk 1 of member 1), or its
        // first (chunks 1, 3 and 5 gathered, at 0), fails.
        let second = vec![Fault::None, Fault::Status(0x281)];
        for (buf_offset, script, failed_at, reads) in
            [(512, second, chunk, [3, 3]), (0, vec![Fault::Status(0x281)], 0, [1, 1])]
        {
            let mut v = volume(2, chunk, 2, 2, vec![Vec::new(), script]);
            let ev = v.run(vec![v.entry(Op::Read, buf_offset, 0, 6 * chunk, 1)]);
            match ev.as_slice() {
                [IoEvent {
                    cookie: 1,
                    status: IoStatus::Failed,
                    error: Some(Error::Member { member, offset, source }),
                    ..
                }] => {
                    assert_eq!((member.as_str(), *offset), ("m1", failed_at));
                    assert!(matches!(**source, Error::Nvme { .. }), "{source:?}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(v.mocks.iter().map(|m| m.stats().reads).collect::<Vec<_>>(), reads, "buffer at {buf_offset}");
            assert_eq!(v.batch.in_flight(), 0);
            let ev = v.run(vec![v.entry(Op::Read, buf_offset, 0, 6 * chunk, 2)]);
            assert!(matches!(ev.as_slice(), [IoEvent { cookie: 2, status: IoStatus::Complete, .. }]), "{ev:?}");
        }
    }

    /// A wait for more entries than come back ends at its timeout with those that came: on one
    /// member (whose queue batch's own wait polls for it) and on two (polled in turn).
    #[test]
    fn a_wait_for_entries_that_never_come_ends_at_its_timeout() {
        let chunk = 64 << 10;
        for n in [1, 2] {
            // Member 0's first command never completes; entry 0 is that command.
            let mut v = volume(n, chunk, 2, 4, vec![vec![Fault::Never]]);
            let second = if n == 1 { 4096 } else { chunk };
            v.batch.submit(vec![v.entry(Op::Read, 0, 0, 4096, 0), v.entry(Op::Read, 8192, second, 4096, 1)]).unwrap();
            let start = Instant::now();
            let mut got = Vec::new();
            v.batch.status_into(2, Duration::from_millis(200), &mut got).unwrap();
            let took = start.elapsed();
            assert!(matches!(got.as_slice(), [(IoEvent { cookie: 1, status: IoStatus::Complete, .. }, _)]), "{got:?}");
            assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(2), "{n} members: {took:?}");
            assert_eq!(v.batch.in_flight(), 1);
        }
    }

    /// Cancelling while pieces wait: those never start (their leases go back at once), the
    /// ones in flight finish, and the entry is reported once, canceled, with nothing of the
    /// buffer left leased.
    #[test]
    fn cancel_drops_waiting_pieces_and_reports_the_entry_once() {
        let chunk = 16 << 10;
        let mut v = volume(2, chunk, 1, 2, Vec::new());
        // Inside a page: a command per chunk, 8 per member (see the test above).
        let entry = v.entry(Op::Read, 512, 0, 16 * chunk, 3);
        v.batch.submit(vec![entry]).unwrap();
        let ev = v.batch.cancel().unwrap();
        assert!(matches!(ev.as_slice(), [(IoEvent { cookie: 3, status: IoStatus::Canceled, .. }, _)]), "{ev:?}");
        assert_eq!((v.batch.in_flight(), v.buf.inflight()), (0, 0));
    }

    /// A member that refuses submissions (its controller marked faulted) fails every piece of
    /// the entry there, also those that waited for room, and the entry's event names it; the
    /// other member's pieces run.
    #[test]
    fn a_member_refusing_submissions_fails_the_entry_with_its_waiting_pieces() {
        let chunk = 16 << 10;
        let mut v = volume(2, chunk, 1, 2, Vec::new());
        v.mocks[1].set_faulted(true);
        // Inside a page: a command per chunk, 8 per member, more than its queue holds.
        let entry = v.entry(Op::Read, 512, 0, 16 * chunk, 4);
        let ev = v.run(vec![entry]);
        match ev.as_slice() {
            [IoEvent { cookie: 4, status: IoStatus::Failed, error: Some(Error::Member { member, .. }), .. }] => {
                assert_eq!(member, "m1")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((v.batch.in_flight(), v.buf.inflight()), (0, 0));
    }
}
