//! The NVMe/TCP receive path against a hostile target: an I/O queue (`TcpQueue` on `Conn`)
//! runs reads, writes and flushes while the target's side of the stream is what the input
//! builds: an ICResp (well formed, with chosen fields, or raw bytes), then PDUs, each honest
//! relative to the commands (response capsules, C2HData at the next offset, R2Ts for the rest)
//! or with any field chosen, or raw bytes; then the connection ends.
//!
//! Checked: no panic; an error is `RemoteProtocol` or `RemoteTransport`, never anything else;
//! a run that succeeds reports every command, and a read that completed successfully holds
//! exactly the bytes the target sent for each of its offsets (every C2HData payload byte is
//! a function of the command and its declared offset, so a payload placed anywhere but where
//! it says would show).
//!
//! Uses only `ugds::test_utils::{tcp_exchange, HarnessData}` and the `ugds::uapi::tcp` PDUs.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ugds::test_utils::{tcp_exchange, HarnessData};
use ugds::uapi::tcp::{flags, pdu_type, DataPdu, IcPdu, PduHeader, RespPdu, TermPdu};
use ugds::uapi::Cqe;
use ugds::Error;
use zerocopy::IntoBytes;

/// The most payload one PDU of the input carries (a larger declared length is cut: the stream
/// then ends early, as a target that dies mid-PDU).
const MAX_PAYLOAD: usize = 64 << 10;

#[derive(Arbitrary, Debug)]
struct Input {
    ic: Ic,
    depth: u8,
    in_capsule: u16,
    cmds: Vec<CmdIn>,
    pdus: Vec<PduIn>,
}

#[derive(Arbitrary, Debug)]
enum Ic {
    /// A valid ICResp: CPDA `cpda % 32`, MAXH2CDATA `(maxh2c + 1) * 4096`.
    Good {
        cpda: u8,
        maxh2c: u8,
    },
    /// An ICResp with every field chosen.
    Fields {
        pdu_type: u8,
        hlen: u8,
        plen: u32,
        pfv: u16,
        align: u8,
        digest: u8,
        maxdata: u32,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum CmdIn {
    Read(u16),
    Write(u16),
    Flush,
}

/// An offset: the next one an honest target would use, one near it (overlaps and gaps), or
/// any.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Off {
    Next,
    Near(i16),
    Any(u32),
}

/// A length: from the offset to the end of the command's data, what an honest target has not
/// sent (or asked for) yet, part of the data, or any.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Len {
    Rest,
    Unmoved,
    Part(u16),
    Any(u32),
}

#[derive(Arbitrary, Debug)]
enum PduIn {
    /// A response capsule for command `cmd` (modulo), or for CID `cmd` as is when `raw_cid`;
    /// its status field `status`, or success.
    Resp {
        cmd: u16,
        raw_cid: bool,
        status: Option<u16>,
        result: u64,
    },
    /// C2HData for command `cmd`: LAST when it ends the data (or as `last` says), SUCCESS as
    /// `success` says, `pad` bytes between the header and the data.
    C2h {
        cmd: u16,
        off: Off,
        len: Len,
        last: Option<bool>,
        success: bool,
        pad: u8,
    },
    /// R2T for command `cmd`.
    R2t {
        cmd: u16,
        off: Off,
        len: Len,
        ttag: u16,
    },
    /// C2HTermReq with `extra` bytes of error data.
    Term {
        fes: u16,
        extra: u8,
    },
    /// A header with any fields, then `rest`.
    Header {
        pdu_type: u8,
        flags: u8,
        hlen: u8,
        pdo: u8,
        plen: u32,
        rest: Vec<u8>,
    },
    Raw(Vec<u8>),
}

/// The byte a target sends at `pos` of command `cid`'s data.
fn pattern(cid: u16, pos: usize) -> u8 {
    (cid as u8).wrapping_mul(31) ^ (pos as u8) ^ ((pos >> 8) as u8).wrapping_mul(7) ^ 0x5A
}

/// Command `i`'s data length.
fn len_of(c: CmdIn) -> usize {
    match c {
        CmdIn::Read(n) | CmdIn::Write(n) => 1 + usize::from(n) % (16 << 10),
        CmdIn::Flush => 0,
    }
}

/// What an honest target knows of each command.
#[derive(Clone, Copy, Default)]
struct Model {
    len: usize,
    /// C2H bytes sent, or H2C bytes asked for.
    moved: usize,
}

fn pick(m: &Model, off: Off, len: Len) -> (u32, u32) {
    let o = match off {
        // CAST: data lengths are below 16 KiB.
        Off::Next => m.moved as u32,
        Off::Near(d) => (m.moved as i64 + i64::from(d)).clamp(0, i64::from(u32::MAX)) as u32,
        Off::Any(o) => o,
    };
    let l = match len {
        Len::Rest => m.len.saturating_sub(o as usize) as u32,
        Len::Unmoved => m.len.saturating_sub(m.moved) as u32,
        Len::Part(p) => (u32::from(p) % (m.len.max(1) as u32)) + 1,
        Len::Any(l) => l,
    };
    (o, l)
}

fn serialize(input: &Input, cmds: &[CmdIn], in_capsule: usize) -> Vec<u8> {
    let mut out = Vec::new();
    match &input.ic {
        Ic::Good { cpda, maxh2c } => {
            out.extend_from_slice(
                IcPdu::new(pdu_type::IC_RESP, cpda % 32, 0, (u32::from(*maxh2c) + 1) * 4096).as_bytes(),
            );
        }
        Ic::Fields { pdu_type, hlen, plen, pfv, align, digest, maxdata } => {
            let mut b = IcPdu::new(*pdu_type, *align, *digest, *maxdata).as_bytes().to_vec();
            b[2] = *hlen;
            b[4..8].copy_from_slice(&plen.to_le_bytes());
            b[8..10].copy_from_slice(&pfv.to_le_bytes());
            out.extend_from_slice(&b);
        }
        Ic::Raw(b) => out.extend_from_slice(&b[..b.len().min(256)]),
    }
    let n = cmds.len().max(1);
    let mut model: Vec<Model> = cmds
        .iter()
        .map(|&c| {
            let len = len_of(c);
            // In-capsule writes have moved their data already.
            let moved = if matches!(c, CmdIn::Write(_)) && len <= in_capsule { len } else { 0 };
            Model { len, moved }
        })
        .collect();
    model.resize(n, Model::default());
    for p in input.pdus.iter().take(64) {
        match *p {
            PduIn::Resp { cmd, raw_cid, status, result } => {
                // CAST: fewer than 65536 commands.
                let cid = if raw_cid { cmd } else { cmd % n as u16 };
                let status = u32::from(status.unwrap_or(0));
                let cqe = Cqe::from_dwords([result as u32, (result >> 32) as u32, 0, u32::from(cid) | status << 16]);
                let r = RespPdu { hdr: PduHeader::new(pdu_type::CAPSULE_RESP, 0, 24, 0, 24), cqe };
                out.extend_from_slice(r.as_bytes());
            }
            PduIn::C2h { cmd, off, len, last, success, pad } => {
                let i = usize::from(cmd) % n;
                let m = &mut model[i];
                let (o, l) = pick(m, off, len);
                let ends = o as usize + l as usize >= m.len;
                let mut f = if last.unwrap_or(ends) { flags::DATA_LAST } else { 0 };
                if success {
                    f |= flags::DATA_SUCCESS;
                }
                let pdo = 24u8.saturating_add(pad % 64);
                let hdr = PduHeader::new(pdu_type::C2H_DATA, f, 24, pdo, u32::from(pdo).saturating_add(l));
                // CAST: as above.
                out.extend_from_slice(DataPdu::new(hdr, i as u16, 0, o, l).as_bytes());
                out.resize(out.len() + usize::from(pdo - 24), 0);
                let k = (l as usize).min(MAX_PAYLOAD);
                // CAST: as above.
                out.extend((0..k).map(|j| pattern(i as u16, o as usize + j)));
                m.moved = m.moved.max(o as usize + l as usize);
            }
            PduIn::R2t { cmd, off, len, ttag } => {
                let i = usize::from(cmd) % n;
                let m = &mut model[i];
                let (o, l) = pick(m, off, len);
                let hdr = PduHeader::new(pdu_type::R2T, 0, 24, 0, 24);
                // CAST: as above.
                out.extend_from_slice(DataPdu::new(hdr, i as u16, ttag, o, l).as_bytes());
                m.moved = m.moved.max(o as usize + l as usize);
            }
            PduIn::Term { fes, extra } => {
                let mut b = TermPdu::new(pdu_type::C2H_TERM_REQ, fes).as_bytes().to_vec();
                let plen = 24 + u32::from(extra);
                b[4..8].copy_from_slice(&plen.to_le_bytes());
                out.extend_from_slice(&b);
                out.resize(out.len() + usize::from(extra), 0xEE);
            }
            PduIn::Header { pdu_type, flags, hlen, pdo, plen, ref rest } => {
                out.extend_from_slice(PduHeader::new(pdu_type, flags, hlen, pdo, plen).as_bytes());
                out.extend_from_slice(&rest[..rest.len().min(256)]);
            }
            PduIn::Raw(ref b) => out.extend_from_slice(&b[..b.len().min(256)]),
        }
    }
    out
}

fuzz_target!(|input: Input| {
    let cmds: Vec<CmdIn> = input.cmds.iter().copied().take(8).collect();
    let depth = u16::from(input.depth % 16) + 1;
    let in_capsule = usize::from(input.in_capsule) % (20 << 10);
    let stream = serialize(&input, &cmds, in_capsule);
    let mut data: Vec<HarnessData> = cmds
        .iter()
        .enumerate()
        .map(|(i, &c)| match c {
            CmdIn::Read(_) => HarnessData::In(vec![0u8; len_of(c)]),
            // CAST: fewer than 9 commands.
            CmdIn::Write(_) => HarnessData::Out((0..len_of(c)).map(|j| pattern(i as u16 + 100, j)).collect()),
            CmdIn::Flush => HarnessData::None,
        })
        .collect();
    match tcp_exchange(stream, in_capsule, depth, &mut data) {
        Ok(done) => {
            assert_eq!(done.len(), cmds.len(), "a result per command");
            for (i, (d, (status, _))) in data.iter().zip(&done).enumerate() {
                if let HarnessData::In(buf) = d {
                    if status.is_success() {
                        // CAST: as above.
                        let bad = buf.iter().enumerate().find(|&(k, &b)| b != pattern(i as u16, k));
                        assert!(bad.is_none(), "read {i} completed with byte {bad:?} not what the target sent there");
                    }
                }
            }
        }
        Err(Error::RemoteProtocol { .. } | Error::RemoteTransport { .. }) => {}
        Err(e) => panic!("an error the receive path does not document: {e:?}"),
    }
});
