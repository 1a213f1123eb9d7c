//! A Fabrics queue over NVMe/RDMA (the NVMe over Fabrics RDMA transport binding): one RC
//! queue pair connected through the RDMA CM with the NVMe/RDMA private data (record format 0,
//! QID, host receive and send queue sizes, controller ID); command capsules as SENDs (the SQE,
//! plus in-capsule write data when the controller's IOCCSZ allows, on I/O queues only, as the
//! target has no in-capsule buffers on its admin queue); response capsules (the CQE) as
//! RECVs; data named by keyed SGL data blocks (type 4) pointing at memory registered with the
//! queue's protection domain, which the target RDMA-reads (writes) or -writes (reads).
//!
//! A command of at most 16 KiB goes through its capsule slot's chunk of memory the queue
//! registered once (`rdma_bounce.rs`); a larger one's memory is registered per I/O (for the
//! call, or for a batch's command until it is over). A registration cache per `Buffer` would
//! need a deregistration hook the `DataPath` does not have (a freed and remapped buffer must
//! never be reachable through an old key); the cost is measured in the VM test
//! `remote_rdma_per_io_registration_cost_against_the_io` (see docs/remote.md).
//!
//! Every call ends with all its commands over (SEND and response completed, `rdma_slots.rs`)
//! or with the queue pair disconnected (moved to the error state) before the registrations are
//! released, so the target can never reach memory after the call returns; a connection is
//! never reused after an error. A batch's commands stay in flight across calls (`Pipelined`):
//! each holds its registration in its capsule slot until it is over, and only then is its
//! completion handed to the batch (whose event ends the memory's lease), or the queue pair is
//! disconnected first (`abandon`).

use super::rdma_bounce::{self, Bounce};
use super::rdma_slots::{drive, Slots, Wire};
use super::transport::{set_psdt_sgl, Cmd, Data, Done, FabricsQueue, Pipelined, RawData};
use super::uri::RemoteSpec;
use super::verbs::{CmError, Endpoint, IbvSge, IbvWc, Keys, Mr, TargetAccess, CAPSULE, RESPONSE};
use crate::error::{Error, Rejection, Result};
use std::net::ToSocketAddrs;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;
use ugds_uapi::rdma::{keyed_sgl, reject_reason, CmReject, CmRequest, RECFMT_1_0};
use ugds_uapi::tcp::SGL_INCAPSULE;
use ugds_uapi::Sqe;
use zerocopy::{FromBytes, IntoBytes};

/// A connected NVMe/RDMA queue.
#[derive(Debug)]
pub(crate) struct RdmaQueue {
    /// Commands in flight by capsule slot, some holding their data's registration: declared
    /// before the endpoint, so they are dropped before its protection domain goes.
    slots: Slots,
    /// A chunk per slot for small commands' data (`None` where it could not be registered:
    /// every command registers its own memory then); dropped before the endpoint too.
    bounce: Option<Bounce>,
    /// Where each slot's batch read through its chunk goes once its response came.
    landing: Vec<Option<Landing>>,
    ep: Endpoint,
    /// `HOST:PORT`, for messages.
    target: String,
    qid: u16,
    /// Whether the CQ is armed with no completion unhandled (a batch's wait may begin).
    armed: bool,
    in_capsule: usize,
    /// The longest wait for any one completion.
    timeout: Duration,
    broken: bool,
}

/// Where a batch's read through a chunk is copied to: the caller's memory.
#[derive(Debug, Clone, Copy)]
struct Landing {
    to: NonNull<u8>,
    len: usize,
}

// SAFETY: the landing pointers name memory of commands in flight, which the batch that started
// them keeps valid and unshared until their completion or `abandon`, on whichever thread it
// reaps; the endpoint and the chunks are Send themselves.
unsafe impl Send for RdmaQueue {}

/// The named error for a connection that could not be made.
fn cm_error(spec: &RemoteSpec, e: CmError) -> Error {
    let target = spec.address();
    match e {
        CmError::Missing(e) => e,
        CmError::Rejected { status, private } => {
            match CmReject::read_from_prefix(&private).ok().map(|(r, _)| r).filter(|r| r.recfmt() == RECFMT_1_0) {
                Some(r) if r.sts() != 0 => Error::RemoteRejected {
                    target,
                    subsysnqn: spec.subsysnqn.clone(),
                    reason: reject_reason(r.sts()),
                    status: Rejection::RdmaCm { sts: r.sts(), cm_status: status },
                },
                // The peer's CM said no by itself: nothing listens on that port (as a refused
                // TCP connect).
                _ => Error::RemoteUnreachable {
                    target,
                    source: std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("the RDMA CM connect request was rejected (CM reason {status}): nothing listens there"),
                    ),
                },
            }
        }
        CmError::Failed { step, why } => Error::RemoteUnreachable {
            target,
            source: std::io::Error::new(why.kind(), format!("RDMA CM {step}: {why}")),
        },
    }
}

impl RdmaQueue {
    /// Connects queue `qid` (`depth` entries) of `spec`'s target, joining controller
    /// `cntlid` (0xFFFF on the admin queue).
    pub(crate) fn connect(spec: &RemoteSpec, qid: u16, depth: u16, cntlid: u16) -> Result<RdmaQueue> {
        let target = spec.address();
        let unreachable = |source| Error::RemoteUnreachable { target: target.clone(), source };
        let addr = (spec.host.as_str(), spec.port)
            .to_socket_addrs()
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| unreachable(std::io::Error::new(std::io::ErrorKind::NotFound, "no address")))?;
        // hrqsize: our receive buffers (one per SQ entry); hsqsize: the SQ size, 0's based.
        let private = CmRequest::new(qid, depth, depth - 1, cntlid);
        let timeout = Duration::from_millis(spec.timeout_ms);
        let ep = Endpoint::connect(addr, private.as_bytes(), usize::from(depth), 2, timeout)
            .map_err(|e| cm_error(spec, e))?;
        let slots = Slots::new(ep.slots(), usize::from(depth));
        // SAFETY: the chunks are dropped before the endpoint (field order of RdmaQueue).
        let bounce = unsafe { Bounce::new(&ep, slots.capacity()) }
            .map_err(|e| log::info!("{target}: queue {qid} registers every command's memory: chunks refused ({e})"))
            .ok();
        let landing = vec![None; slots.capacity()];
        Ok(RdmaQueue { slots, bounce, landing, ep, target, qid, armed: false, in_capsule: 0, timeout, broken: false })
    }

    /// Mean nanoseconds of one registration and deregistration of `len` bytes of host memory
    /// for remote writes, over `rounds` (what per-I/O registration costs).
    pub(crate) fn registration_ns(&self, len: usize, rounds: u32) -> Result<f64> {
        let mut mem = vec![0u8; len];
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            let mr = self.ep.register_mut(&mut mem).map_err(|e| self.transport_error("ibv_reg_mr", e))?;
            drop(mr);
        }
        Ok(t.elapsed().as_nanos() as f64 / f64::from(rounds.max(1)))
    }

    fn transport_error(&self, op: &str, source: std::io::Error) -> Error {
        Error::RemoteTransport { target: self.target.clone(), op: op.to_string(), source }
    }
}

/// One command of a call, ready to send: its SQE (SGL filled in), its registration (kept for
/// the call), and the in-capsule gather element.
struct Prepared<'a> {
    sqe: Sqe,
    _mr: Option<Mr<'a>>,
    inline: Option<IbvSge>,
}

impl Wire for Endpoint {
    fn slots(&self) -> usize {
        Endpoint::slots(self)
    }
    fn send(&self, slot: usize, wr_id: u64, sqe: &[u8; CAPSULE], data: Option<IbvSge>) -> std::io::Result<()> {
        Endpoint::send(self, slot, wr_id, sqe, data)
    }
    fn post_recv(&self, slot: usize) -> std::io::Result<()> {
        Endpoint::post_recv(self, slot)
    }
    fn response(&self, slot: usize) -> [u8; RESPONSE] {
        Endpoint::response(self, slot)
    }
    fn wait(&self, out: &mut [IbvWc], timeout: Duration) -> std::io::Result<usize> {
        Endpoint::wait(self, out, timeout)
    }
}

impl FabricsQueue for RdmaQueue {
    fn execute(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>> {
        if self.broken {
            return Err(self.transport_error(op, std::io::Error::from_raw_os_error(libc::ENOTCONN)));
        }
        if self.slots.in_flight() > 0 {
            return Err(Error::invalid("queue", "a batch's commands are in flight on it"));
        }
        let ep = &self.ep;
        // Small commands go through their slots' chunks where every command starts at once.
        let chunks = self.bounce.as_ref().and_then(|_| self.slots.upcoming(cmds.len()));
        let bounce = self.bounce.as_ref();
        let chunk_of = |i: usize, c: &Cmd<'_>| {
            let small = matches!(c.data, Data::In(_) | Data::Out(_)) && rdma_bounce::takes(c.data.len());
            chunks.as_ref().and_then(|v| v.get(i).copied()).filter(|_| small)
        };
        let planned: Vec<Option<u16>> = cmds.iter().enumerate().map(|(i, c)| chunk_of(i, c)).collect();
        let prepared = cmds
            .iter_mut()
            .zip(&planned)
            .map(|(c, &chunk)| prepare(ep, bounce.zip(chunk), &self.target, c, self.in_capsule))
            .collect::<Result<Vec<_>>>();
        let r = prepared.and_then(|p| {
            let wire: Vec<_> = p.iter().map(|c| (c.sqe, c.inline)).collect();
            let r = drive(ep, &mut self.slots, &wire, self.timeout, &self.target, op);
            if r.is_err() {
                // Before the registrations go: the target must not reach them any more.
                ep.kill();
            }
            r
        });
        // The waits took the channel's events: a batch arms the CQ again before it waits.
        self.armed = false;
        let done = match r {
            Ok(d) => d,
            Err(e) => {
                self.abandon();
                return Err(e);
            }
        };
        // Reads through chunks: their data, once every response is in.
        for ((c, &(cid, d)), &chunk) in cmds.iter_mut().zip(&done).zip(&planned) {
            let (Some(chunk), Some(b), Data::In(to)) = (chunk, self.bounce.as_ref(), &mut c.data) else { continue };
            if chunk != cid {
                // `upcoming` and `drive` disagree: the data is not where the command said.
                self.abandon();
                return Err(Error::invalid("queue", "a command went out in another slot than its chunk's"));
            }
            if d.status.is_success() {
                // SAFETY: `to` is the command's own exclusive buffer, at most CHUNK bytes (see
                // `chunk_of`); its response came, so the target wrote the chunk before.
                unsafe { b.drain_to(chunk, NonNull::from(&mut **to).cast(), to.len()) };
            }
        }
        Ok(done.into_iter().map(|(_, d)| d).collect())
    }

    fn qid(&self) -> u16 {
        self.qid
    }

    fn is_broken(&self) -> bool {
        self.broken
    }

    fn set_in_capsule(&mut self, bytes: usize) {
        // The target has no in-capsule buffers on the admin queue.
        self.in_capsule = if self.qid == 0 { 0 } else { bytes };
    }

    fn probe_dmabuf(&self, fd: BorrowedFd<'_>, len: usize) -> std::io::Result<()> {
        // Both ways the memory's I/Os will register it.
        for access in [TargetAccess::Read, TargetAccess::Write] {
            drop(self.ep.register_dmabuf(fd.as_raw_fd(), 0, len, 0, access)?);
        }
        Ok(())
    }

    fn pipelined(&mut self) -> Option<&mut dyn Pipelined> {
        Some(self)
    }
}

/// A batch's commands: each registers its memory when it starts and keeps the registration
/// in its slot until its SEND and its response both completed. Waiting is the batch's (`ppoll`
/// on the completion channel, with the CQ armed whenever a wait could begin).
impl Pipelined for RdmaQueue {
    fn room(&self) -> usize {
        if self.broken {
            0
        } else {
            self.slots.room()
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.in_flight()
    }

    fn buffered(&self) -> bool {
        false
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.ep.ready_fd())
    }

    unsafe fn start(&mut self, sqe: Sqe, data: RawData, op: &str) -> Result<u16> {
        if self.broken {
            return Err(self.transport_error(op, std::io::Error::from_raw_os_error(libc::ENOTCONN)));
        }
        if self.slots.room() == 0 {
            return Err(Error::invalid("queue", "every slot is in flight"));
        }
        let (mem, write) = match data {
            RawData::None => (None, false),
            RawData::In { ptr, len } => (Some((ptr, len, TargetAccess::Write)), false),
            RawData::Out { ptr, len } => (Some((ptr, len, TargetAccess::Read)), true),
        };
        let len = mem.map_or(0, |(_, len, _)| len);
        // A small command goes through the chunk of the slot it is about to take.
        let chunk = self
            .slots
            .upcoming(1)
            .and_then(|v| v.first().copied())
            .filter(|_| rdma_bounce::takes(len))
            .and_then(|cid| Some((cid, self.bounce.as_ref()?.keys(cid)?)));
        let (mr, keys, landing) = match (mem, chunk) {
            (None, _) => (None, None, None),
            (Some((ptr, len, access)), Some((cid, keys))) => {
                if let (TargetAccess::Read, Some(b)) = (access, &self.bounce) {
                    // SAFETY: the caller keeps `ptr` valid for `len` bytes (at most CHUNK); the
                    // chunk's slot is free, so no command uses the chunk.
                    unsafe { b.fill(cid, ptr, len) };
                }
                let landing = (access == TargetAccess::Write).then_some((cid, Landing { to: ptr, len }));
                (None, Some(keys), landing)
            }
            (Some((ptr, len, access)), None) => {
                // SAFETY: the caller keeps the memory valid and unshared until this command's
                // response came out of `reap` or the queue was abandoned (which kills the queue
                // pair before the slots let the registration go); the slots, and with them the
                // registration, are dropped before the endpoint (`Drop` below, field order).
                let mr = unsafe { self.ep.register_raw(ptr, len, access) }
                    .map_err(|e| registration_error(&self.target, e))?;
                let keys = mr.keys();
                (Some(mr), Some(keys), None)
            }
        };
        let mut sqe = sqe;
        let inline = describe(&mut sqe, keys, len, write, self.in_capsule)?;
        let r = (|| {
            if !self.armed {
                self.ep.arm()?;
                self.armed = true;
            }
            self.slots.start(&self.ep, sqe, inline, mr)
        })();
        match r {
            Ok(cid) if chunk.is_none_or(|(c, _)| c == cid) => {
                if let Some((_, l)) = landing {
                    self.landing[usize::from(cid)] = Some(l);
                }
                Ok(cid)
            }
            Ok(_) => {
                // `upcoming` and `start` disagree: the data is not where the command said.
                self.abandon();
                Err(Error::invalid("queue", "a command went out in another slot than its chunk's"))
            }
            Err(e) => {
                self.abandon();
                Err(self.transport_error(op, e))
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<(u16, Done)>, op: &str) -> Result<()> {
        let from = out.len();
        let r = self.take_completions(out, op);
        // Reads through chunks: their data, before their slots (and chunks) can be taken again;
        // also when a later completion failed, as the batch reports these commands done.
        for &(cid, d) in &out[from..] {
            let Some(l) = self.landing.get_mut(usize::from(cid)).and_then(Option::take) else { continue };
            if let (true, Some(b)) = (d.status.is_success(), &self.bounce) {
                // SAFETY: `start`'s caller keeps `l.to` valid and unshared until this response
                // is reaped (now); its response came, so the target wrote the chunk before.
                unsafe { b.drain_to(cid, l.to, l.len) };
            }
        }
        if r.is_err() {
            self.abandon();
        }
        r
    }

    fn abandon(&mut self) {
        self.broken = true;
        // The queue pair first: after this the target reaches no registration through it.
        self.ep.kill();
        self.slots.clear();
        self.landing.fill(None);
    }
}

impl RdmaQueue {
    /// Handles every completion there is, and leaves the CQ armed with none unhandled, so the
    /// next one makes the completion channel readable.
    fn take_completions(&mut self, out: &mut Vec<(u16, Done)>, op: &str) -> Result<()> {
        let events = self.ep.take_events();
        self.armed = false;
        let before = out.len();
        self.drain(out, op)?;
        if events == 0 && out.len() == before {
            // Woken by neither: the connection's event channel (a disconnect), named at once
            // rather than at the batch's timeout.
            self.ep.check_connection().map_err(|e| self.transport_error(op, e))?;
        }
        self.ep.arm().map_err(|e| self.transport_error(op, e))?;
        self.armed = true;
        // What came between the last poll and the arming raised no event.
        self.drain(out, op)
    }

    fn drain(&mut self, out: &mut Vec<(u16, Done)>, op: &str) -> Result<()> {
        let mut wcs = [IbvWc::default(); 16];
        loop {
            let n = self.ep.poll(&mut wcs).map_err(|e| self.transport_error(op, e))?;
            if n == 0 {
                return Ok(());
            }
            self.slots.handle(&self.ep, &wcs[..n], out, &self.target, op)?;
        }
    }
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        // A batch abandons a queue before dropping it with commands in flight; if one did not,
        // the queue pair still goes first, before the slots' registrations.
        if self.slots.in_flight() > 0 {
            self.abandon();
        }
    }
}

/// What the target may do to a command's memory: read it for a write to the target, write it
/// for a read from the target; `None` without data.
fn target_access(data: &Data<'_>) -> Option<TargetAccess> {
    match data {
        Data::None => None,
        Data::Out(_) => Some(TargetAccess::Read),
        Data::In(_) => Some(TargetAccess::Write),
        Data::DmaBuf { write: true, .. } => Some(TargetAccess::Read),
        Data::DmaBuf { write: false, .. } => Some(TargetAccess::Write),
    }
}

fn registration_error(target: &str, source: std::io::Error) -> Error {
    Error::RemoteTransport {
        target: target.to_string(),
        op: "registering memory with the RDMA device (ibv_reg_mr)".into(),
        source,
    }
}

/// Describes a call's command's data in its SQE: through `chunk` of the bounce (a write's data
/// copied in now; a read's copied out by the caller once the response came), or registered for
/// the call.
fn prepare<'a>(
    ep: &'a Endpoint,
    chunk: Option<(&Bounce, u16)>,
    target: &str,
    c: &'a mut Cmd<'_>,
    in_capsule: usize,
) -> Result<Prepared<'a>> {
    let mut sqe = c.sqe;
    let len = c.data.len();
    let write = matches!(c.data, Data::Out(_));
    if let Some((b, i)) = chunk {
        if let Data::Out(from) = &c.data {
            // SAFETY: `from` is the command's buffer, borrowed for the call, at most CHUNK bytes
            // (the caller's check); the slot of chunk `i` is free, so no command uses it.
            unsafe { b.fill(i, NonNull::from(&**from).cast(), from.len()) };
        }
        let keys = b.keys(i).ok_or_else(|| Error::invalid("queue", "a chunk past the queue's"))?;
        let inline = describe(&mut sqe, Some(keys), len, write, in_capsule)?;
        return Ok(Prepared { sqe, _mr: None, inline });
    }
    let access = target_access(&c.data);
    let mr = match (&mut c.data, access) {
        (Data::None, _) | (_, None) => None,
        (Data::Out(b), _) => Some(ep.register(b).map_err(|e| registration_error(target, e))?),
        (Data::In(b), _) => Some(ep.register_mut(b).map_err(|e| registration_error(target, e))?),
        (Data::DmaBuf { fd, offset, len, .. }, Some(access)) => {
            Some(ep.register_dmabuf(fd.as_raw_fd(), *offset, *len, *offset, access).map_err(|source| {
                Error::RemoteTransport {
                    target: target.to_string(),
                    op: "registering GPU memory with the RDMA device (ibv_reg_dmabuf_mr)".into(),
                    source,
                }
            })?)
        }
    };
    let inline = describe(&mut sqe, mr.as_ref().map(Mr::keys), len, write, in_capsule)?;
    Ok(Prepared { sqe, _mr: mr, inline })
}

/// Describes `len` bytes of data registered at `keys` in `sqe` by one SGL descriptor: in the
/// capsule (a write of at most `in_capsule` bytes; returns the gather element that sends it),
/// a keyed data block the target reaches by RDMA, or a null descriptor without data.
fn describe(sqe: &mut Sqe, keys: Option<Keys>, len: usize, write: bool, in_capsule: usize) -> Result<Option<IbvSge>> {
    set_psdt_sgl(sqe);
    let Ok(len32) = u32::try_from(len) else {
        return Err(Error::invalid("data", "a command's data is over 4 GiB"));
    };
    match keys {
        None => {
            // A null keyed descriptor: length 0.
            let (a, b) = keyed_sgl(0, 0, 0).unwrap_or_default();
            sqe.set_prps(a, b);
            Ok(None)
        }
        Some(m) if write && len <= in_capsule => {
            // Data block, offset 0 of the capsule's data.
            sqe.set_prps(0, u64::from(len32) | u64::from(SGL_INCAPSULE) << 56);
            Ok(Some(IbvSge { addr: m.addr, length: len32, lkey: m.lkey }))
        }
        Some(m) => {
            let (a, b) = keyed_sgl(m.addr, len32, m.rkey)
                .ok_or_else(|| Error::invalid("data", "a command's data is over 16 MiB (a keyed SGL's limit)"))?;
            sqe.set_prps(a, b);
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::uri::Transport;
    use std::time::Instant;

    fn spec() -> RemoteSpec {
        let mut s = RemoteSpec::parse("nvmeof://rdma/10.0.0.2/nqn.2024-01.io.ugds:x?nsid=1").unwrap();
        s.transport = Transport::Rdma;
        s
    }

    #[test]
    fn each_commands_memory_is_registered_for_its_direction_only() {
        let fd = std::io::stdin();
        let fd = std::os::fd::AsFd::as_fd(&fd);
        let mut mem = [0u8; 8];
        assert_eq!(target_access(&Data::None), None);
        assert_eq!(target_access(&Data::Out(&[1, 2, 3])), Some(TargetAccess::Read));
        assert_eq!(target_access(&Data::In(&mut mem)), Some(TargetAccess::Write));
        let dmabuf = |write| Data::DmaBuf { fd, offset: 4096, len: 4096, write };
        assert_eq!(target_access(&dmabuf(true)), Some(TargetAccess::Read));
        assert_eq!(target_access(&dmabuf(false)), Some(TargetAccess::Write));
    }

    #[test]
    fn rejects_decode_by_name() {
        let rej = CmReject::new(ugds_uapi::rdma::reject::INVALID_HSQSIZE);
        let e = cm_error(&spec(), CmError::Rejected { status: 28, private: rej.as_bytes().to_vec() });
        assert!(
            matches!(&e, Error::RemoteRejected { status: Rejection::RdmaCm { sts: 4, cm_status: 28 }, reason, .. } if reason.contains("send queue size")),
            "{e}"
        );
        // A reject without NVMe/RDMA private data: nothing listens there.
        let e = cm_error(&spec(), CmError::Rejected { status: 8, private: Vec::new() });
        assert!(
            matches!(&e, Error::RemoteUnreachable { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e}"
        );
        let e = cm_error(
            &spec(),
            CmError::Failed { step: "address resolution", why: std::io::Error::from_raw_os_error(libc::ETIMEDOUT) },
        );
        assert!(matches!(&e, Error::RemoteUnreachable { .. }) && e.to_string().contains("address resolution"), "{e}");
    }

    #[test]
    fn an_unreachable_rdma_target_is_a_named_error_quickly() {
        // No RDMA device here (or none for that address): a named error, bounded in time.
        let mut s = spec();
        s.host = "192.0.2.1".into();
        s.timeout_ms = 1000;
        let t = Instant::now();
        match RdmaQueue::connect(&s, 0, 32, 0xFFFF) {
            Err(Error::RemoteUnreachable { .. } | Error::Unsupported { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
