//! What the Fabrics controller (`fabrics.rs`) needs of a transport: a connected queue that
//! runs a list of commands with their data ([`FabricsQueue`]), and [`open`], which makes one
//! for queue ID `qid` over TCP (`queue.rs` on `tcp.rs`) or RDMA (`rdma.rs` on `verbs.rs`).
//! Connect, Property Get/Set, Identify, Keep Alive, the queue pool and reconnect live once,
//! in `fabrics.rs` and `mod.rs`, above this seam.

pub(crate) use super::queue::RawData;
use super::uri::{RemoteSpec, Transport};
use crate::error::Result;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use ugds_uapi::{Cqe, Sqe, Status};
use zerocopy::IntoBytes;

/// A command's data.
#[derive(Debug)]
pub(crate) enum Data<'a> {
    /// None.
    None,
    /// Controller to host.
    In(&'a mut [u8]),
    /// Host to controller.
    Out(&'a [u8]),
    /// GPU memory: `len` bytes at `offset` of a dma-buf (RDMA only, where the NIC accepts the
    /// dma-buf), either way (the opcode says which).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    DmaBuf {
        /// The dma-buf.
        fd: BorrowedFd<'a>,
        /// Byte offset in it.
        offset: u64,
        /// Bytes.
        len: usize,
        /// The data goes to the controller (a write); else it comes from it.
        write: bool,
    },
}

impl Data<'_> {
    /// Where the data is, for a queue that keeps the command in flight ([`Pipelined::start`]);
    /// GPU memory has no host address ([`RawData::None`]: the caller refuses it first).
    pub(crate) fn raw(&mut self) -> RawData {
        match self {
            Data::In(b) => RawData::In { ptr: NonNull::from(&mut **b).cast(), len: b.len() },
            Data::Out(b) => RawData::Out { ptr: NonNull::from(&**b).cast(), len: b.len() },
            Data::None | Data::DmaBuf { .. } => RawData::None,
        }
    }

    /// Bytes moved.
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::None => 0,
            Data::In(b) => b.len(),
            Data::Out(b) => b.len(),
            Data::DmaBuf { len, .. } => *len,
        }
    }
}

/// One command and its data.
#[derive(Debug)]
pub(crate) struct Cmd<'a> {
    /// The command (the transport fills in its CID and data pointer).
    pub(crate) sqe: Sqe,
    /// Its data.
    pub(crate) data: Data<'a>,
}

/// What came back for one command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    /// The completion's status.
    pub(crate) status: Status,
    /// Dwords 0 and 1 of the completion (Property Get returns 64 bits there).
    pub(crate) result: u64,
}

/// Dwords 0 and 1 of a completion.
pub(crate) fn result_of(cqe: &Cqe) -> u64 {
    let b = cqe.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Marks an SQE's data as described by SGLs: PSDT 01b (bits 15:14 of dword 0). Fabrics
/// commands always carry one SGL descriptor (a null one when there is no data), or the target
/// refuses them.
pub(crate) fn set_psdt_sgl(sqe: &mut Sqe) {
    let b = sqe.as_mut_bytes();
    b[1] = (b[1] & 0x3F) | (ugds_uapi::tcp::PSDT_SGL >> 8) as u8;
}

/// A connected queue of one transport.
pub(crate) trait FabricsQueue: Send + std::fmt::Debug {
    /// Runs `cmds`, keeping up to the queue's depth in flight; returns each one's completion, in
    /// order. An error means the connection is closed and every command of the call failed.
    fn execute(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>>;
    /// Queue ID (0: admin).
    fn qid(&self) -> u16;
    /// True once an error closed the connection for good.
    fn is_broken(&self) -> bool;
    /// Bytes of write data a command capsule may carry from now on (0: none; a transport may
    /// allow less, e.g. none on an admin queue).
    fn set_in_capsule(&mut self, bytes: usize);
    /// Checks whether `len` bytes of dma-buf `fd` can be registered with this queue's NIC for
    /// remote access (GPU memory straight to the wire); `Err` says why not.
    fn probe_dmabuf(&self, _fd: BorrowedFd<'_>, _len: usize) -> std::io::Result<()> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "a TCP socket cannot reach GPU memory"))
    }
    /// The queue as one whose commands stay in flight across calls (a batch's), if it is one.
    fn pipelined(&mut self) -> Option<&mut dyn Pipelined> {
        None
    }
}

/// A queue whose commands stay in flight across calls: a batch starts each entry's commands
/// as it is submitted and reaps completions as they come, whoever else waits.
pub(crate) trait Pipelined {
    /// Commands that can start now.
    fn room(&self) -> usize;
    /// Commands in flight.
    fn in_flight(&self) -> usize;
    /// Whether received bytes wait to be handled (then [`Pipelined::reap`] needs no wait).
    fn buffered(&self) -> bool;
    /// The descriptor to wait on for what comes back; `None`: always ready.
    fn poll_fd(&self) -> Option<RawFd>;
    /// Sends `sqe` with `data`; returns its command identifier. An error from the connection
    /// closes it for good (every command in flight is then lost); one about the command
    /// (no room, a capsule too large) leaves the queue as it was.
    ///
    /// # Safety
    /// `data`'s memory stays valid, and nothing else writes it (nor, for a read, reads it),
    /// until this command's completion came out of [`Pipelined::reap`] or the queue was
    /// abandoned, broken or dropped.
    unsafe fn start(&mut self, sqe: Sqe, data: RawData, op: &str) -> Result<u16>;
    /// Handles what came back, called once [`Pipelined::poll_fd`] is readable (or always, where
    /// it is `None` or [`Pipelined::buffered`]): TCP waits (bounded by the connection's timeout)
    /// for one PDU, then handles every one already received; RDMA never waits. Appends each
    /// completed command's identifier and result to `out`. An error closes the connection for
    /// good.
    fn reap(&mut self, out: &mut Vec<(u16, Done)>, op: &str) -> Result<()>;
    /// Closes the connection for good and forgets every command in flight: no byte of theirs
    /// is moved after this returns.
    fn abandon(&mut self);
    /// While `hold` is true, holds the queue's sends back so that commands started together
    /// go out together (on TCP, in as few segments as they fill); false sends what was held.
    /// Where each command is a message of its own (RDMA), nothing to do.
    fn hold_sends(&mut self, _hold: bool) {}
}

/// Connects queue `qid` of `spec`'s target (`depth` entries; `cntlid` the controller an I/O
/// queue joins, 0xFFFF on the admin queue), ready for its Fabrics Connect command: for that,
/// TCP carries the Connect data in the capsule, RDMA by a keyed SGL.
pub(crate) fn open(spec: &RemoteSpec, qid: u16, depth: u16, cntlid: u16) -> Result<Box<dyn FabricsQueue>> {
    let timeout = std::time::Duration::from_millis(spec.timeout_ms);
    match spec.transport {
        Transport::Tcp => Ok(Box::new(super::queue::TcpQueue::connect(&spec.address(), qid, depth, timeout)?)),
        Transport::Rdma => open_rdma(spec, qid, depth, cntlid),
    }
}

#[cfg(feature = "rdma")]
fn open_rdma(spec: &RemoteSpec, qid: u16, depth: u16, cntlid: u16) -> Result<Box<dyn FabricsQueue>> {
    Ok(Box::new(super::rdma::RdmaQueue::connect(spec, qid, depth, cntlid)?))
}

#[cfg(not(feature = "rdma"))]
fn open_rdma(_spec: &RemoteSpec, _qid: u16, _depth: u16, _cntlid: u16) -> Result<Box<dyn FabricsQueue>> {
    Err(crate::error::Error::Unsupported {
        what: "NVMe over RDMA",
        why: "this build of ugds has no RDMA transport".into(),
        fix: "build the ugds crate with its `rdma` feature (on by default)",
    })
}
