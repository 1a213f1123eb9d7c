//! A Fabrics queue over NVMe/RDMA (the NVMe over Fabrics RDMA transport binding): one RC
//! queue pair connected through the RDMA CM with the NVMe/RDMA private data (record format 0,
//! QID, host receive and send queue sizes, controller ID); command capsules as SENDs (the SQE,
//! plus in-capsule write data when the controller's IOCCSZ allows, on I/O queues only, as the
//! target has no in-capsule buffers on its admin queue); response capsules (the CQE) as
//! RECVs; data named by keyed SGL data blocks (type 4) pointing at memory registered with the
//! queue's protection domain, which the target RDMA-reads (writes) or -writes (reads).
//!
//! Memory is registered per I/O (every command's data, for the call's duration). A
//! registration cache per `Buffer` would need a deregistration hook the `DataPath` does not
//! have (a freed and remapped buffer must never be reachable through an old key); the cost is
//! measured in the VM test `remote_rdma_registration_cost` (see docs/remote.md).
//!
//! Every call ends with all its commands completed or with the queue pair disconnected (moved
//! to the error state) before the registrations are released, so the target can never reach
//! memory after the call returns; a connection is never reused after an error.

use super::transport::{result_of, set_psdt_sgl, Cmd, Data, Done, FabricsQueue};
use super::uri::RemoteSpec;
use super::verbs::{self, CmError, Endpoint, IbvSge, IbvWc, Mr, TargetAccess, CAPSULE, RESPONSE, WC_RECV, WC_SUCCESS};
use crate::error::{Error, Rejection, Result};
use std::net::ToSocketAddrs;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;
use ugds_uapi::rdma::{keyed_sgl, reject_reason, CmReject, CmRequest, RECFMT_1_0};
use ugds_uapi::tcp::SGL_INCAPSULE;
use ugds_uapi::{Cqe, Sqe};
use zerocopy::{FromBytes, IntoBytes};

/// A connected NVMe/RDMA queue.
#[derive(Debug)]
pub(crate) struct RdmaQueue {
    ep: Endpoint,
    /// `HOST:PORT`, for messages.
    target: String,
    qid: u16,
    /// Commands in flight at most, plus one (the SQ size).
    depth: usize,
    in_capsule: usize,
    /// The longest wait for any one completion.
    timeout: Duration,
    broken: bool,
}

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
        Ok(RdmaQueue { ep, target, qid, depth: usize::from(depth), in_capsule: 0, timeout, broken: false })
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

/// One command, ready to send: its SQE (CID and SGL filled in), its registration, and the
/// in-capsule gather element.
struct Prepared<'a> {
    sqe: Sqe,
    _mr: Option<Mr<'a>>,
    inline: Option<IbvSge>,
}

/// What [`drive`] needs of a connection: an [`Endpoint`], or a fake in the host tests.
pub(crate) trait Wire {
    /// Capsule slots (and response slots).
    fn slots(&self) -> usize;
    /// Posts the SQE in capsule slot `slot` as a signaled SEND (work request `wr_id`), with
    /// in-capsule data when given.
    fn send(&self, slot: usize, wr_id: u64, sqe: &[u8; CAPSULE], data: Option<IbvSge>) -> std::io::Result<()>;
    /// Posts a receive on response slot `slot`.
    fn post_recv(&self, slot: usize) -> std::io::Result<()>;
    /// The bytes received in response slot `slot`.
    fn response(&self, slot: usize) -> [u8; RESPONSE];
    /// Waits up to `timeout` for completions.
    fn wait(&self, out: &mut [IbvWc], timeout: Duration) -> std::io::Result<usize>;
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

/// Per-command progress.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    slot: Option<usize>,
    sent: bool,
    done: Option<Done>,
}

impl FabricsQueue for RdmaQueue {
    fn execute(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>> {
        if self.broken {
            return Err(self.transport_error(op, std::io::Error::from_raw_os_error(libc::ENOTCONN)));
        }
        if cmds.len() >= usize::from(u16::MAX) {
            return Err(Error::invalid("cmds", "too many commands for one call"));
        }
        let ep = &self.ep;
        let prepared = cmds
            .iter_mut()
            .enumerate()
            .map(|(i, c)| prepare(ep, &self.target, c, i, self.in_capsule))
            .collect::<Result<Vec<_>>>();
        let r = prepared.and_then(|p| {
            let wire: Vec<_> = p.iter().map(|c| (c.sqe, c.inline)).collect();
            let r = drive(ep, &wire, self.depth, self.timeout, &self.target, op);
            if r.is_err() {
                // Before the registrations go: the target must not reach them any more.
                ep.kill();
            }
            r
        });
        if r.is_err() {
            self.broken = true;
            self.ep.kill();
        }
        r
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

/// Registers command `i`'s data and fills in its CID and data pointer.
fn prepare<'a>(
    ep: &'a Endpoint,
    target: &str,
    c: &'a mut Cmd<'_>,
    i: usize,
    in_capsule: usize,
) -> Result<Prepared<'a>> {
    let mut sqe = c.sqe;
    // CAST: checked by the caller: fewer than 65535 commands.
    sqe.set_cid(i as u16);
    set_psdt_sgl(&mut sqe);
    let len = c.data.len();
    let Ok(len32) = u32::try_from(len) else {
        return Err(Error::invalid("data", "a command's data is over 4 GiB"));
    };
    let reg_error = |source| Error::RemoteTransport {
        target: target.to_string(),
        op: "registering memory with the RDMA device (ibv_reg_mr)".into(),
        source,
    };
    let write = matches!(c.data, Data::Out(_));
    let access = target_access(&c.data);
    let mr = match (&mut c.data, access) {
        (Data::None, _) | (_, None) => None,
        (Data::Out(b), _) => Some(ep.register(b).map_err(reg_error)?),
        (Data::In(b), _) => Some(ep.register_mut(b).map_err(reg_error)?),
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
    let mut inline = None;
    match &mr {
        None => {
            // A null keyed descriptor: length 0.
            let (a, b) = keyed_sgl(0, 0, 0).unwrap_or_default();
            sqe.set_prps(a, b);
        }
        Some(m) if write && len <= in_capsule => {
            // Data block, offset 0 of the capsule's data.
            sqe.set_prps(0, u64::from(len32) | u64::from(SGL_INCAPSULE) << 56);
            inline = Some(IbvSge { addr: m.addr, length: len32, lkey: m.lkey });
        }
        Some(m) => {
            let (a, b) = keyed_sgl(m.addr, len32, m.rkey)
                .ok_or_else(|| Error::invalid("data", "a command's data is over 16 MiB (a keyed SGL's limit)"))?;
            sqe.set_prps(a, b);
        }
    }
    Ok(Prepared { sqe, _mr: mr, inline })
}

/// Sends every command (up to `depth - 1` in flight, each capsule slot reused only after both
/// its SEND and its response completed) and collects the responses.
pub(super) fn drive<W: Wire>(
    ep: &W,
    cmds: &[(Sqe, Option<IbvSge>)],
    depth: usize,
    timeout: Duration,
    target: &str,
    op: &str,
) -> Result<Vec<Done>> {
    let err = |source| Error::RemoteTransport { target: target.to_string(), op: op.to_string(), source };
    let protocol = |reason| Error::RemoteProtocol { target: target.to_string(), reason };
    let n = cmds.len();
    let mut prog = vec![Progress::default(); n];
    let mut free: Vec<usize> = (0..ep.slots()).rev().collect();
    let (mut next, mut inflight, mut finished) = (0usize, 0usize, 0usize);
    let mut wcs = [IbvWc::default(); 16];
    while finished < n {
        while next < n && inflight < depth.saturating_sub(1).max(1) {
            let Some(slot) = free.pop() else { break };
            let (sqe, inline) = &cmds[next];
            let bytes: [u8; CAPSULE] = sqe.as_bytes().try_into().map_err(|_| protocol("SQE size".into()))?;
            ep.send(slot, next as u64, &bytes, *inline).map_err(err)?;
            prog[next].slot = Some(slot);
            next += 1;
            inflight += 1;
        }
        let got = ep.wait(&mut wcs, timeout).map_err(err)?;
        for wc in &wcs[..got] {
            if wc.status != WC_SUCCESS {
                return Err(err(std::io::Error::other(format!(
                    "work completion {} ({})",
                    verbs::wc_status(wc.status),
                    if wc.opcode & WC_RECV != 0 { "receive" } else { "send" }
                ))));
            }
            let i = if wc.opcode & WC_RECV != 0 {
                // CAST: receive work request IDs are slot numbers.
                let slot = wc.wr_id as usize;
                if slot >= ep.slots() {
                    return Err(protocol(format!("a receive completion for slot {slot}")));
                }
                if wc.byte_len as usize != verbs::RESPONSE {
                    return Err(protocol(format!("a response capsule of {} bytes (16 expected)", wc.byte_len)));
                }
                let cqe = Cqe::read_from_bytes(&ep.response(slot)[..]).map_err(|_| protocol("short CQE".into()))?;
                ep.post_recv(slot).map_err(err)?;
                let i = usize::from(cqe.cid());
                match prog.get(i) {
                    Some(p) if p.slot.is_some() && p.done.is_none() => {}
                    _ => return Err(protocol(format!("a response for command {i}, which is not in flight"))),
                }
                prog[i].done = Some(Done { status: cqe.status(), result: result_of(&cqe) });
                inflight -= 1;
                finished += 1;
                i
            } else {
                // CAST: send work request IDs are command indices.
                let i = wc.wr_id as usize;
                match prog.get(i) {
                    Some(p) if !p.sent && (p.slot.is_some() || p.done.is_some()) => {}
                    _ => return Err(protocol(format!("a send completion for command {i}, which is not in flight"))),
                }
                prog[i].sent = true;
                i
            };
            if prog[i].sent && prog[i].done.is_some() {
                if let Some(s) = prog[i].slot.take() {
                    free.push(s);
                }
            }
        }
    }
    // Every response is in; the last SENDs' completions may still be due (their capsule slots
    // must not be reused before): collect them.
    while prog.iter().any(|p| !p.sent) {
        let got = ep.wait(&mut wcs, timeout).map_err(err)?;
        for wc in &wcs[..got] {
            if wc.status != WC_SUCCESS || wc.opcode & WC_RECV != 0 {
                return Err(protocol(format!(
                    "after every response: a {} completion ({})",
                    if wc.opcode & WC_RECV != 0 { "receive" } else { "send" },
                    verbs::wc_status(wc.status)
                )));
            }
            // CAST: send work request IDs are command indices.
            match prog.get_mut(wc.wr_id as usize) {
                Some(p) if !p.sent => p.sent = true,
                _ => {
                    return Err(protocol(format!("a send completion for command {}, which is not in flight", wc.wr_id)))
                }
            }
        }
    }
    Ok(prog.iter().map(|p| p.done.unwrap_or(Done { status: ugds_uapi::Status::SUCCESS, result: 0 })).collect())
}

#[cfg(test)]
#[path = "rdma_drive_tests.rs"]
mod drive_tests;

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
