//! A small NVMe/TCP target for host tests: one subsystem with one namespace in memory, the PDU
//! sizes, alignments and the SUCCESS flag configurable, and garbage on demand (bytes sent in
//! place of a PDU, then silence or a close). Never a substitute for the VM tests against the
//! kernel's nvmet.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds_uapi::tcp::{fctype, flags, pdu_type, ConnectData, DataPdu, IcPdu, PduHeader, FABRICS_OPCODE};
use ugds_uapi::{Cqe, Sqe, Status, StatusType};
use zerocopy::{FromBytes, IntoBytes};

/// Garbage in place of one PDU.
#[derive(Debug, Clone)]
pub(crate) struct Garbage {
    /// Which connection (0: the first, the admin queue).
    pub(crate) conn: usize,
    /// PDUs sent properly on it first.
    pub(crate) after: usize,
    /// What is sent instead of the next one.
    pub(crate) bytes: Vec<u8>,
    /// Then keep the connection open and silent (else close it).
    pub(crate) hold: bool,
}

/// How the fake behaves.
#[derive(Debug, Clone)]
pub(crate) struct FakeConfig {
    pub(crate) nqn: String,
    pub(crate) block_size: usize,
    pub(crate) blocks: usize,
    /// In-capsule data bytes advertised (IOCCSZ * 16 - 64).
    pub(crate) in_capsule: usize,
    pub(crate) maxh2c: u32,
    /// The most one R2T asks for.
    pub(crate) r2t_max: usize,
    /// The most one C2HData carries.
    pub(crate) c2h_max: usize,
    /// Reads end with a SUCCESS-flagged C2HData instead of a response capsule.
    pub(crate) success_flag: bool,
    pub(crate) cpda: u8,
    /// MDTS as a power of two of 4 KiB (0: none).
    pub(crate) mdts: u8,
    pub(crate) garbage: Option<Garbage>,
    /// NSZE reported for namespace 1 in place of `blocks` (a hostile target's size; the disk
    /// stays `blocks` long).
    pub(crate) nsze: Option<u64>,
    /// On I/O queues, after their Connect: read this many command capsules before answering
    /// any (an initiator that keeps fewer in flight on one connection waits for ever).
    pub(crate) gather: usize,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            nqn: "nqn.2024-01.io.ugds:fake".into(),
            block_size: 512,
            blocks: 64 << 11,
            in_capsule: 8192,
            maxh2c: 1 << 20,
            r2t_max: 1 << 20,
            c2h_max: 1 << 20,
            success_flag: true,
            cpda: 0,
            mdts: 0,
            garbage: None,
            nsze: None,
            gather: 1,
        }
    }
}

/// A running fake target.
pub(crate) struct Fake {
    /// `127.0.0.1:PORT`.
    pub(crate) addr: String,
    /// The namespace's bytes.
    pub(crate) disk: Arc<Mutex<Vec<u8>>>,
    /// Every connection so far (for [`Fake::kill`]).
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// New connections are closed at once (a target gone for good).
    refusing: Arc<AtomicBool>,
}

impl Fake {
    /// Listens on a free port of 127.0.0.1; every connection is served by a thread.
    pub(crate) fn start(cfg: FakeConfig) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let disk = Arc::new(Mutex::new(vec![0u8; cfg.block_size * cfg.blocks]));
        let d = disk.clone();
        let count = Arc::new(AtomicUsize::new(0));
        let accepted = count.clone();
        let refusing = Arc::new(AtomicBool::new(false));
        let refuse = refusing.clone();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let all = conns.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                if refuse.load(Ordering::SeqCst) {
                    continue;
                }
                if let Ok(c) = s.try_clone() {
                    all.lock().unwrap().push(c);
                }
                let (cfg, d) = (cfg.clone(), d.clone());
                let idx = count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let c = Conn { s, cfg, disk: d, idx, sent: 0, io: false, pending: Default::default() };
                    if let Err(e) = c.serve() {
                        eprintln!("fake target: connection {idx}: {e}");
                    }
                });
            }
        });
        Fake { addr, disk, conns, accepted, refusing }
    }

    /// Connections accepted so far (the admin queue's included).
    pub(crate) fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes every new connection at once from now on (with [`Fake::kill`]: a target gone for
    /// good).
    pub(crate) fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
    }

    /// Closes every connection (a target restart that keeps its data); new ones are served.
    pub(crate) fn kill(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The URI of namespace `nsid` with a short timeout.
    pub(crate) fn uri(&self, nqn: &str, nsid: u32) -> String {
        format!("nvmeof://tcp/{}/{nqn}?nsid={nsid}&timeout_ms=300&hostnqn=nqn.2024-01.io.ugds:host", self.addr)
    }
}

struct Conn {
    s: TcpStream,
    cfg: FakeConfig,
    disk: Arc<Mutex<Vec<u8>>>,
    idx: usize,
    sent: usize,
    /// An I/O queue (its Connect named a QID above 0).
    io: bool,
    pending: std::collections::VecDeque<(Sqe, Vec<u8>)>,
}

type R<T> = std::io::Result<T>;

fn stop<T>(why: &str) -> R<T> {
    Err(std::io::Error::other(why.to_string()))
}

impl Conn {
    /// Sends one PDU, or the configured garbage in its place.
    fn pdu(&mut self, parts: &[&[u8]]) -> R<()> {
        if let Some(g) = self.cfg.garbage.clone().filter(|g| g.conn == self.idx && g.after == self.sent) {
            self.s.write_all(&g.bytes)?;
            if g.hold {
                // Silent until the initiator gives up and closes.
                let mut b = [0u8; 4096];
                while self.s.read(&mut b).map(|n| n > 0).unwrap_or(false) {}
            }
            return stop("garbage sent");
        }
        self.sent += 1;
        for p in parts {
            self.s.write_all(p)?;
        }
        Ok(())
    }

    fn resp(&mut self, cid: u16, status: Status, result: u64) -> R<()> {
        // CAST: the result's halves.
        let cqe = Cqe::from_dwords([
            result as u32,
            (result >> 32) as u32,
            0,
            u32::from(cid) | u32::from(status.to_field() << 1) << 16,
        ]);
        let hdr = PduHeader::new(pdu_type::CAPSULE_RESP, 0, 24, 0, 24);
        self.pdu(&[hdr.as_bytes(), cqe.as_bytes()])
    }

    /// Sends `data` in C2HData PDUs; the last one SUCCESS-flagged when so configured (then no
    /// response follows).
    fn c2h(&mut self, cid: u16, data: &[u8]) -> R<()> {
        let mut at = 0;
        while at < data.len() {
            let n = self.cfg.c2h_max.min(data.len() - at);
            let last = at + n == data.len();
            let mut f = if last { flags::DATA_LAST } else { 0 };
            if last && self.cfg.success_flag {
                f |= flags::DATA_SUCCESS;
            }
            let hdr = PduHeader::new(pdu_type::C2H_DATA, f, 24, 24, 24 + n as u32);
            let d = DataPdu::new(hdr, cid, 0, at as u32, n as u32);
            self.pdu(&[d.as_bytes(), &data[at..at + n]])?;
            at += n;
        }
        if self.cfg.success_flag {
            return Ok(());
        }
        self.resp(cid, Status::SUCCESS, 0)
    }

    /// Asks for `len` bytes of command `cid` by R2Ts and collects the H2CData.
    fn r2t(&mut self, cid: u16, len: usize) -> R<Vec<u8>> {
        let mut out = vec![0u8; len];
        let mut at = 0;
        while at < len {
            let n = self.cfg.r2t_max.min(len - at);
            let hdr = PduHeader::new(pdu_type::R2T, 0, 24, 0, 24);
            self.pdu(&[DataPdu::new(hdr, cid, 7, at as u32, n as u32).as_bytes()])?;
            let mut got = 0;
            while got < n {
                let mut h = [0u8; 24];
                self.s.read_exact(&mut h[..8])?;
                if h[0] == pdu_type::CAPSULE_CMD {
                    // A command pipelined behind this one: served after it.
                    let c = self.read_capsule(&h[..8])?;
                    self.pending.push_back(c);
                    continue;
                }
                self.s.read_exact(&mut h[8..])?;
                let d = DataPdu::read_from_bytes(&h[..]).map_err(|_| std::io::Error::other("hdr"))?;
                let hd = d.header();
                let align = (usize::from(self.cfg.cpda) + 1) * 4;
                if hd.pdu_type() != pdu_type::H2C_DATA
                    || d.cccid() != cid
                    || d.ttag() != 7
                    || d.offset() as usize != at + got
                    || d.length() as usize > self.cfg.maxh2c as usize
                    || usize::from(hd.pdo()) % align != 0
                {
                    return stop(&format!("bad H2CData {d:?} for cid {cid} at {at}+{got}"));
                }
                let mut pad = vec![0u8; usize::from(hd.pdo()) - 24];
                self.s.read_exact(&mut pad)?;
                let k = d.length() as usize;
                self.s.read_exact(&mut out[at + got..at + got + k])?;
                got += k;
                if (got == n) != (hd.flags() & flags::DATA_LAST != 0) {
                    return stop("LAST flag on the wrong H2CData");
                }
            }
            at += n;
        }
        Ok(out)
    }

    /// Reads the rest of a command capsule whose common header is `h`.
    fn read_capsule(&mut self, h: &[u8]) -> R<(Sqe, Vec<u8>)> {
        let hdr = PduHeader::read_from_bytes(h).map_err(|_| std::io::Error::other("hdr"))?;
        if hdr.pdu_type() != pdu_type::CAPSULE_CMD || hdr.hlen() != 72 {
            return stop("not a command");
        }
        let mut b = [0u8; 64];
        self.s.read_exact(&mut b)?;
        let sqe = Sqe::read_from_bytes(&b[..]).map_err(|_| std::io::Error::other("sqe"))?;
        let mut inline = Vec::new();
        if hdr.pdo() != 0 {
            let align = (usize::from(self.cfg.cpda) + 1) * 4;
            if usize::from(hdr.pdo()) % align != 0 {
                return stop("misaligned in-capsule data");
            }
            let mut pad = vec![0u8; usize::from(hdr.pdo()) - 72];
            self.s.read_exact(&mut pad)?;
            inline = vec![0u8; hdr.plen() as usize - usize::from(hdr.pdo())];
            self.s.read_exact(&mut inline)?;
        }
        Ok((sqe, inline))
    }

    fn serve(mut self) -> R<()> {
        let mut ic = [0u8; 128];
        self.s.read_exact(&mut ic)?;
        let resp = IcPdu::new(pdu_type::IC_RESP, self.cfg.cpda, 0, self.cfg.maxh2c);
        self.pdu(&[resp.as_bytes()])?;
        let mut cc = 0u32;
        loop {
            if self.io && self.pending.is_empty() {
                for _ in 0..self.cfg.gather {
                    let mut h = [0u8; 8];
                    self.s.read_exact(&mut h)?;
                    let c = self.read_capsule(&h)?;
                    self.pending.push_back(c);
                }
            }
            let (sqe, inline) = match self.pending.pop_front() {
                Some(c) => c,
                None => {
                    let mut h = [0u8; 8];
                    self.s.read_exact(&mut h)?;
                    self.read_capsule(&h)?
                }
            };
            let cid = sqe.cid();
            let ok = Status::SUCCESS;
            // As nvmet: every Fabrics command says PSDT 01b (SGLs), data or not.
            if sqe.psdt() != 1 {
                let mut st = Status::new(StatusType::Generic, 0x02);
                st.dnr = true;
                self.resp(cid, st, 0)?;
                continue;
            }
            match sqe.opcode() {
                FABRICS_OPCODE => match sqe.nsid() as u8 {
                    fctype::CONNECT => {
                        let d = ConnectData::read_from_bytes(&inline[..]).map_err(|_| std::io::Error::other("cd"))?;
                        let nqn = d.subsysnqn.split(|&b| b == 0).next().unwrap_or_default();
                        if nqn != self.cfg.nqn.as_bytes() {
                            let mut st = Status::new(StatusType::CommandSpecific, 0x82);
                            st.dnr = true;
                            self.resp(cid, st, 0)?;
                        } else {
                            self.io = sqe.cdw(10) >> 16 != 0;
                            self.resp(cid, ok, 1)?;
                        }
                    }
                    fctype::PROPERTY_GET => {
                        let v = match sqe.cdw(11) {
                            // CAP: MQES 127, TO 1 (500 ms), CSS NVM.
                            0x00 => 127 | 1 << 24 | 1 << 37,
                            0x1C => u64::from(cc & 1),
                            _ => 0,
                        };
                        self.resp(cid, ok, v)?;
                    }
                    fctype::PROPERTY_SET => {
                        if sqe.cdw(11) == 0x14 {
                            cc = sqe.cdw(12);
                        }
                        self.resp(cid, ok, 0)?;
                    }
                    _ => self.resp(cid, Status::new(StatusType::Generic, 1), 0)?,
                },
                0x06 => {
                    let mut id = vec![0u8; 4096];
                    if sqe.cdw(10) & 0xFF == 1 {
                        id[4..8].copy_from_slice(b"FAKE");
                        id[24..32].copy_from_slice(b"ugds-fk ");
                        id[77] = self.cfg.mdts;
                        id[516] = 1;
                        let ioccsz = ((self.cfg.in_capsule + 64) / 16) as u32;
                        id[1792..1796].copy_from_slice(&ioccsz.to_le_bytes());
                    } else if sqe.nsid() == 1 {
                        let nsze = self.cfg.nsze.unwrap_or(self.cfg.blocks as u64);
                        id[..8].copy_from_slice(&nsze.to_le_bytes());
                        id[8..16].copy_from_slice(&nsze.to_le_bytes());
                        id[130] = self.cfg.block_size.trailing_zeros() as u8;
                    }
                    self.c2h(cid, &id)?;
                }
                0x09 => self.resp(cid, ok, 0x0003_0003)?,
                0x18 | 0x00 => self.resp(cid, ok, 0)?,
                op @ (0x01 | 0x02) => {
                    let bs = self.cfg.block_size;
                    let (at, len) = (sqe.slba() as usize * bs, sqe.nlb() as usize * bs);
                    if at + len > self.cfg.blocks * bs {
                        self.resp(cid, Status::new(StatusType::Generic, 0x80), 0)?;
                        continue;
                    }
                    if op == 0x02 {
                        let data = self.disk.lock().unwrap()[at..at + len].to_vec();
                        self.c2h(cid, &data)?;
                    } else {
                        let data = if inline.is_empty() { self.r2t(cid, len)? } else { inline };
                        if data.len() != len {
                            return stop("in-capsule length differs from NLB");
                        }
                        self.disk.lock().unwrap()[at..at + len].copy_from_slice(&data);
                        self.resp(cid, ok, 0)?;
                    }
                }
                _ => self.resp(cid, Status::new(StatusType::Generic, 1), 0)?,
            }
        }
    }
}

/// A listener that accepts connections and never answers (a stalled target).
pub(crate) fn silent_target() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
            held.push(s);
        }
    });
    addr
}
