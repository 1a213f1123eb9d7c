//! A Fabrics queue over one NVMe/TCP connection: commands as capsules, several in flight, their
//! data in the capsule (writes up to the in-capsule size), in H2CData PDUs answering the
//! target's R2Ts, or back in C2HData PDUs; completions in response capsules, or implied by a
//! C2HData that carries the SUCCESS flag.
//!
//! Commands stay in flight across calls: each holds a slot, whose index is its command
//! identifier, naming where its data is until its completion is reaped. [`TcpQueue::start`]
//! sends one capsule and [`TcpQueue::reap`] handles what came back, so a batch keeps a queue's
//! depth in flight whatever its callers do; [`FabricsQueue::execute`] runs a list of commands
//! on the same two. Any error closes the connection for good, so no PDU that arrives later can
//! reach memory whose command was given up.

use super::tcp::{Conn, Pdu, DIRECT_READ, SHORT_HLEN};
use super::transport::{result_of, set_psdt_sgl, Cmd, Data, Done, FabricsQueue, Pipelined};
use crate::error::{Error, Result};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::time::Duration;
use ugds_uapi::tcp::{flags, pdu_type, CmdPdu, DataPdu, PduHeader, SGL_INCAPSULE, SGL_TRANSPORT};
use ugds_uapi::{Sqe, Status};
use zerocopy::IntoBytes;

/// Where a command's data is, for as long as it is in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawData {
    /// No data.
    None,
    /// Controller to host: `len` bytes at `ptr`.
    In { ptr: NonNull<u8>, len: usize },
    /// Host to controller: `len` bytes at `ptr`.
    Out { ptr: NonNull<u8>, len: usize },
}

impl RawData {
    /// Bytes moved.
    pub(crate) fn len(&self) -> usize {
        match *self {
            RawData::None => 0,
            RawData::In { len, .. } | RawData::Out { len, .. } => len,
        }
    }
}

/// A command in flight.
#[derive(Debug, Clone, Copy)]
struct Slot {
    data: RawData,
    /// Data bytes moved (C2H received, or H2C sent including in-capsule).
    moved: usize,
    live: bool,
}

const IDLE: Slot = Slot { data: RawData::None, moved: 0, live: false };

/// A connected queue.
#[derive(Debug)]
pub(crate) struct TcpQueue {
    conn: Conn,
    /// Queue ID (0: admin).
    qid: u16,
    /// Bytes of write data a capsule may carry.
    in_capsule: usize,
    /// One per command that may be in flight (the queue's entries less one, which stays
    /// empty as on a submission ring); a command's CID is its slot's index.
    slots: Vec<Slot>,
    /// Free slots.
    free: Vec<u16>,
}

// SAFETY: the only non-Send fields are the data pointers in `slots`, which name memory that
// `start`'s caller keeps valid and untouched for the command's whole flight, from whatever
// thread owns the queue; the queue reaches it only through `&mut self`.
unsafe impl Send for TcpQueue {}

impl FabricsQueue for TcpQueue {
    fn execute(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>> {
        if cmds.iter().any(|c| matches!(c.data, Data::DmaBuf { .. })) {
            return Err(Error::invalid("data", "a TCP queue cannot reach GPU memory"));
        }
        if self.in_flight() != 0 {
            return Err(Error::invalid("queue", "another caller's commands are in flight on it"));
        }
        let r = self.run_list(cmds, op);
        if r.is_err() && self.in_flight() != 0 {
            // Commands of this call still point into `cmds`, which the caller gets back.
            self.abandon();
        }
        r
    }

    fn qid(&self) -> u16 {
        self.qid
    }

    fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    fn set_in_capsule(&mut self, bytes: usize) {
        self.in_capsule = bytes;
    }

    fn pipelined(&mut self) -> Option<&mut dyn Pipelined> {
        Some(self)
    }
}

impl Pipelined for TcpQueue {
    fn room(&self) -> usize {
        self.free.len()
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn buffered(&self) -> bool {
        self.conn.buffered() != 0
    }

    fn poll_fd(&self) -> Option<RawFd> {
        self.conn.poll_fd()
    }

    unsafe fn start(&mut self, sqe: Sqe, data: RawData, op: &str) -> Result<u16> {
        let Some(&cid) = self.free.last() else {
            return Err(Error::invalid("queue", "every slot is in flight"));
        };
        let moved = match self.submit(sqe, data, cid, op) {
            Ok(m) => m,
            Err(e) => {
                if self.conn.is_broken() {
                    self.abandon();
                }
                return Err(e);
            }
        };
        self.free.pop();
        self.slots[usize::from(cid)] = Slot { data, moved, live: true };
        Ok(cid)
    }

    fn reap(&mut self, out: &mut Vec<(u16, Done)>, op: &str) -> Result<()> {
        loop {
            match self.step(op) {
                Ok(Some(d)) => out.push(d),
                Ok(None) => {}
                Err(e) => {
                    self.abandon();
                    return Err(e);
                }
            }
            if self.conn.buffered() == 0 || self.in_flight() == 0 {
                return Ok(());
            }
        }
    }

    fn hold_sends(&mut self, hold: bool) {
        self.conn.hold_sends(hold);
    }

    fn abandon(&mut self) {
        self.conn.fail();
        self.slots.fill(IDLE);
        // CAST: the slots number fewer than 65535 (see `over`).
        self.free = (0..self.slots.len() as u16).rev().collect();
    }
}

impl TcpQueue {
    /// Connects queue `qid` (`depth` entries) to `target` (`HOST:PORT`); the Connect data
    /// (1 KiB) goes in its capsule.
    pub(crate) fn connect(target: &str, qid: u16, depth: u16, timeout: Duration) -> Result<TcpQueue> {
        Ok(Self::over(Conn::connect(target, timeout)?, qid, depth))
    }

    /// Queue `qid` (`depth` entries) on an initialised connection, ready for its Fabrics
    /// Connect command.
    pub(crate) fn over(conn: Conn, qid: u16, depth: u16) -> TcpQueue {
        let in_capsule = std::mem::size_of::<ugds_uapi::tcp::ConnectData>();
        // One entry stays empty, as on a submission ring; a queue of one still runs one.
        let n = depth.saturating_sub(1).max(1);
        TcpQueue { conn, qid, in_capsule, slots: vec![IDLE; usize::from(n)], free: (0..n).rev().collect() }
    }

    /// Runs `cmds` to completion, keeping the queue full.
    fn run_list(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>> {
        let mut done: Vec<Option<Done>> = vec![None; cmds.len()];
        let mut index_of = vec![0usize; self.slots.len()];
        let (mut next, mut finished) = (0usize, 0usize);
        let mut reaped = Vec::new();
        while finished < cmds.len() {
            while next < cmds.len() && self.room() > 0 {
                let cmd = &mut cmds[next];
                let data = cmd.data.raw();
                // SAFETY: `data` points into `cmds`, borrowed for this call; the call returns
                // only when every command it started has completed, or (`execute`) after closing
                // the connection for good, so nothing reaches that memory after the return.
                let cid = unsafe { self.start(cmd.sqe, data, op)? };
                index_of[usize::from(cid)] = next;
                next += 1;
            }
            self.reap(&mut reaped, op)?;
            for (cid, d) in reaped.drain(..) {
                done[index_of[usize::from(cid)]] = Some(d);
                finished += 1;
            }
        }
        Ok(done.into_iter().map(|d| d.unwrap_or(Done { status: Status::SUCCESS, result: 0 })).collect())
    }

    /// Sends one command capsule as command `cid`; returns the data bytes it carried.
    fn submit(&mut self, mut sqe: Sqe, data: RawData, cid: u16, op: &str) -> Result<usize> {
        sqe.set_cid(cid);
        let len = data.len();
        let in_capsule = matches!(data, RawData::Out { .. }) && len <= self.in_capsule;
        // One SGL descriptor (of length 0 when there is no data) on every command.
        // CAST: a command's data is at most MDTS, far below 4 GiB (checked by the caller).
        let kind = if in_capsule { SGL_INCAPSULE } else { SGL_TRANSPORT };
        sqe.set_prps(0, len as u64 | u64::from(kind) << 56);
        set_psdt_sgl(&mut sqe);
        let hlen = std::mem::size_of::<CmdPdu>();
        let mut capsule = CmdPdu { hdr: PduHeader::default(), sqe };
        let (pdo, plen) = if in_capsule {
            let pdo = hlen.next_multiple_of(self.conn.data_align);
            (pdo, pdo + len)
        } else {
            (0, hlen)
        };
        let (Ok(pdo8), Ok(plen32)) = (u8::try_from(pdo), u32::try_from(plen)) else {
            return Err(Error::invalid("data", "capsule too large"));
        };
        // CAST: 72 fits a u8.
        capsule.hdr = PduHeader::new(pdu_type::CAPSULE_CMD, 0, hlen as u8, pdo8, plen32);
        const PAD: [u8; 128] = [0; 128];
        match (data, in_capsule) {
            (RawData::Out { ptr, len }, true) => {
                // SAFETY: `start`'s caller keeps `len` bytes at `ptr` valid and unwritten
                // while the command is in flight, which it is from here on.
                let d = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
                self.conn.send(&[capsule.as_bytes(), &PAD[..pdo - hlen], d], op)?;
                Ok(len)
            }
            _ => self.conn.send(&[capsule.as_bytes()], op).map(|()| 0),
        }
    }

    /// Handles one PDU; the command it completed, if any.
    fn step(&mut self, op: &str) -> Result<Option<(u16, Done)>> {
        if self.conn.buffered() == 0 {
            // The next read starts a PDU: when only large reads are in flight, it is one's
            // C2HData header, and its payload should not go through the receive buffer.
            self.conn.expect_large_payload(self.large_reads_only());
        }
        match self.conn.recv(op)? {
            Pdu::Resp(cqe) => {
                let cid = cqe.cid();
                let s = self.live(cid)?;
                let dlen = s.data.len();
                if cqe.status().is_success() && s.moved != dlen {
                    return Err(self
                        .conn
                        .protocol(format!("command {cid} completed with {} of its {dlen} bytes moved", s.moved)));
                }
                Ok(Some(self.complete(cid, Done { status: cqe.status(), result: result_of(&cqe) })))
            }
            Pdu::C2h(d) => {
                let cid = d.cccid();
                let s = self.live(cid)?;
                let (off, n) = (d.offset() as usize, d.length() as usize);
                let RawData::In { ptr, len } = s.data else {
                    return Err(self.conn.protocol(format!("C2HData for command {cid}, which reads nothing")));
                };
                if off != s.moved || off + n > len {
                    return Err(self.conn.protocol(format!(
                        "C2HData [{off}, +{n}) for command {cid}: expected offset {} of {len}",
                        s.moved
                    )));
                }
                // SAFETY: `[off, off + n)` lies in the command's `len` bytes at `ptr`, which
                // `start`'s caller keeps valid and otherwise untouched while it is in flight.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().add(off), n) };
                self.conn.read_data(dst, op)?;
                let moved = off + n;
                self.slots[usize::from(cid)].moved = moved;
                let last = d.header().flags() & flags::DATA_LAST != 0;
                if last && moved != len {
                    return Err(self.conn.protocol(format!("C2HData LAST for command {cid} before all its data")));
                }
                if d.header().flags() & flags::DATA_SUCCESS != 0 {
                    return Ok(Some(self.complete(cid, Done { status: Status::SUCCESS, result: 0 })));
                }
                Ok(None)
            }
            Pdu::R2t(r) => {
                let cid = r.cccid();
                let s = self.live(cid)?;
                let (off, n) = (r.offset() as usize, r.length() as usize);
                let RawData::Out { ptr, len } = s.data else {
                    return Err(self.conn.protocol(format!("R2T for command {cid}, which writes nothing")));
                };
                if n == 0 || off != s.moved || off + n > len {
                    return Err(self.conn.protocol(format!(
                        "R2T [{off}, +{n}) for command {cid}: expected offset {} of {len}",
                        s.moved
                    )));
                }
                // SAFETY: `[off, off + n)` lies in the command's data, valid and unwritten
                // while it is in flight (`start`'s contract).
                let src = unsafe { std::slice::from_raw_parts(ptr.as_ptr().add(off), n) };
                self.send_h2c(src, cid, r.ttag(), off, op)?;
                self.slots[usize::from(cid)].moved = off + n;
                Ok(None)
            }
        }
    }

    /// Whether every command in flight (at least one) is a read with at least
    /// [`DIRECT_READ`] bytes still to come.
    fn large_reads_only(&self) -> bool {
        self.in_flight() > 0
            && self.slots.iter().filter(|s| s.live).all(|s| match s.data {
                RawData::In { len, .. } => len - s.moved >= DIRECT_READ,
                _ => false,
            })
    }

    /// The in-flight command `cid`'s slot, or the protocol error.
    fn live(&mut self, cid: u16) -> Result<Slot> {
        match self.slots.get(usize::from(cid)) {
            Some(s) if s.live => Ok(*s),
            _ => Err(self.conn.protocol(format!("a PDU for command {cid}, which is not in flight"))),
        }
    }

    /// Frees command `cid`'s slot.
    fn complete(&mut self, cid: u16, d: Done) -> (u16, Done) {
        self.slots[usize::from(cid)] = IDLE;
        self.free.push(cid);
        (cid, d)
    }

    /// Answers an R2T: `data` (the solicited range, at `base` in the command's data) in
    /// H2CData PDUs of at most MAXH2CDATA bytes, the last flagged.
    fn send_h2c(&mut self, data: &[u8], cid: u16, ttag: u16, base: usize, op: &str) -> Result<()> {
        let hlen = usize::from(SHORT_HLEN);
        let pdo = hlen.next_multiple_of(self.conn.data_align);
        const PAD: [u8; 128] = [0; 128];
        let chunk = self.conn.max_h2c.max(1);
        let mut at = 0;
        while at < data.len() {
            let n = chunk.min(data.len() - at);
            let last = at + n == data.len();
            // CAST: PDO is below 128 + 24, lengths below MAXH2CDATA (a u32).
            let hdr = PduHeader::new(
                pdu_type::H2C_DATA,
                if last { flags::DATA_LAST } else { 0 },
                SHORT_HLEN,
                pdo as u8,
                (pdo + n) as u32,
            );
            let pdu = DataPdu::new(hdr, cid, ttag, (base + at) as u32, n as u32);
            // SAFETY: `data` is the command's, unwritten while it is in flight (`start`'s
            // contract), and the command completes only after the target received it.
            unsafe { self.conn.send_payload(&[pdu.as_bytes(), &PAD[..pdo - hlen]], &data[at..at + n], op)? };
            at += n;
        }
        Ok(())
    }
}
