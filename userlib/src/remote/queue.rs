//! A Fabrics queue over one NVMe/TCP connection: commands as capsules, several in flight, their
//! data in the capsule (writes up to the in-capsule size), in H2CData PDUs answering the
//! target's R2Ts, or back in C2HData PDUs; completions in response capsules, or implied by a
//! C2HData that carries the SUCCESS flag.
//!
//! Command identifiers are indices into the call's command list: every call ends with all its
//! commands completed or with the connection closed, so no completion of one call can reach
//! another.

use super::tcp::{Conn, Pdu, SHORT_HLEN};
use super::transport::{result_of, set_psdt_sgl, Cmd, Data, Done, FabricsQueue};
use crate::error::{Error, Result};
use std::time::Duration;
use ugds_uapi::tcp::{flags, pdu_type, CmdPdu, DataPdu, PduHeader, SGL_INCAPSULE, SGL_TRANSPORT};
use ugds_uapi::Status;
use zerocopy::IntoBytes;

/// A connected queue.
#[derive(Debug)]
pub(crate) struct TcpQueue {
    conn: Conn,
    /// Queue ID (0: admin).
    qid: u16,
    /// Commands in flight at most.
    depth: usize,
    /// Bytes of write data a capsule may carry.
    in_capsule: usize,
}

/// Per-command progress.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    submitted: bool,
    /// Data bytes moved (C2H received, or H2C sent including in-capsule).
    moved: usize,
    done: Option<Done>,
}

impl FabricsQueue for TcpQueue {
    fn execute(&mut self, cmds: &mut [Cmd<'_>], op: &str) -> Result<Vec<Done>> {
        if cmds.iter().any(|c| matches!(c.data, Data::DmaBuf { .. })) {
            return Err(Error::invalid("data", "a TCP queue cannot reach GPU memory"));
        }
        if cmds.len() >= usize::from(u16::MAX) {
            return Err(Error::invalid("cmds", "too many commands for one call"));
        }
        let mut prog = vec![Progress::default(); cmds.len()];
        let (mut next, mut inflight, mut finished) = (0usize, 0usize, 0usize);
        while finished < cmds.len() {
            // One slot of the queue stays empty, as on a submission ring.
            while next < cmds.len() && inflight < self.depth.saturating_sub(1).max(1) {
                // CAST: checked above, fewer than 65535 commands.
                self.submit(&mut cmds[next], next as u16, &mut prog[next], op)?;
                next += 1;
                inflight += 1;
            }
            if self.step(cmds, &mut prog, op)? {
                inflight -= 1;
                finished += 1;
            }
        }
        Ok(prog.iter().map(|p| p.done.unwrap_or(Done { status: Status::SUCCESS, result: 0 })).collect())
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
        TcpQueue { conn, qid, depth: usize::from(depth), in_capsule }
    }

    /// Sends one command capsule.
    fn submit(&mut self, cmd: &mut Cmd<'_>, cid: u16, p: &mut Progress, op: &str) -> Result<()> {
        cmd.sqe.set_cid(cid);
        let len = cmd.data.len();
        let in_capsule = matches!(cmd.data, Data::Out(_)) && len <= self.in_capsule;
        // One SGL descriptor (of length 0 when there is no data) on every command.
        // CAST: a command's data is at most MDTS, far below 4 GiB (checked by the caller).
        let kind = if in_capsule { SGL_INCAPSULE } else { SGL_TRANSPORT };
        cmd.sqe.set_prps(0, len as u64 | u64::from(kind) << 56);
        set_psdt_sgl(&mut cmd.sqe);
        let hlen = std::mem::size_of::<CmdPdu>();
        let mut capsule = CmdPdu { hdr: PduHeader::default(), sqe: cmd.sqe };
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
        match (&cmd.data, in_capsule) {
            (Data::Out(d), true) => {
                self.conn.send(&[capsule.as_bytes(), &PAD[..pdo - hlen], d], op)?;
                p.moved = len;
            }
            _ => self.conn.send(&[capsule.as_bytes()], op)?,
        }
        p.submitted = true;
        Ok(())
    }

    /// Handles one PDU; true when it completed a command.
    fn step(&mut self, cmds: &mut [Cmd<'_>], prog: &mut [Progress], op: &str) -> Result<bool> {
        match self.conn.recv(op)? {
            Pdu::Resp(cqe) => {
                let i = self.live(prog, cqe.cid())?;
                let dlen = cmds[i].data.len();
                if cqe.status().is_success() && prog[i].moved != dlen {
                    return Err(self
                        .conn
                        .protocol(format!("command {i} completed with {} of its {dlen} bytes moved", prog[i].moved)));
                }
                prog[i].done = Some(Done { status: cqe.status(), result: result_of(&cqe) });
                Ok(true)
            }
            Pdu::C2h(d) => {
                let i = self.live(prog, d.cccid())?;
                let (off, n) = (d.offset() as usize, d.length() as usize);
                let Data::In(buf) = &mut cmds[i].data else {
                    return Err(self.conn.protocol(format!("C2HData for command {i}, which reads nothing")));
                };
                if off != prog[i].moved || off + n > buf.len() {
                    return Err(self.conn.protocol(format!(
                        "C2HData [{off}, +{n}) for command {i}: expected offset {} of {}",
                        prog[i].moved,
                        buf.len()
                    )));
                }
                self.conn.read_data(&mut buf[off..off + n], op)?;
                prog[i].moved += n;
                let last = d.header().flags() & flags::DATA_LAST != 0;
                if last && prog[i].moved != buf.len() {
                    return Err(self.conn.protocol(format!("C2HData LAST for command {i} before all its data")));
                }
                if d.header().flags() & flags::DATA_SUCCESS != 0 {
                    prog[i].done = Some(Done { status: Status::SUCCESS, result: 0 });
                    return Ok(true);
                }
                Ok(false)
            }
            Pdu::R2t(r) => {
                let i = self.live(prog, r.cccid())?;
                let (off, n) = (r.offset() as usize, r.length() as usize);
                let Data::Out(buf) = &cmds[i].data else {
                    return Err(self.conn.protocol(format!("R2T for command {i}, which writes nothing")));
                };
                if n == 0 || off != prog[i].moved || off + n > buf.len() {
                    return Err(self.conn.protocol(format!(
                        "R2T [{off}, +{n}) for command {i}: expected offset {} of {}",
                        prog[i].moved,
                        buf.len()
                    )));
                }
                let buf: &[u8] = buf;
                self.send_h2c(&buf[off..off + n], r.cccid(), r.ttag(), off, op)?;
                prog[i].moved += n;
                Ok(false)
            }
        }
    }

    /// The index of the in-flight command `cid`, or the protocol error.
    fn live(&mut self, prog: &[Progress], cid: u16) -> Result<usize> {
        let i = usize::from(cid);
        match prog.get(i) {
            Some(p) if p.submitted && p.done.is_none() => Ok(i),
            _ => Err(self.conn.protocol(format!("a PDU for command {cid}, which is not in flight"))),
        }
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
            self.conn.send(&[pdu.as_bytes(), &PAD[..pdo - hlen], &data[at..at + n]], op)?;
            at += n;
        }
        Ok(())
    }
}
