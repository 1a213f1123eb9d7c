//! NVMe/TCP transport PDUs (NVMe/TCP transport specification 1.0, section 3.6) and the
//! Fabrics command layouts carried in their capsules (base spec 2.0, section 6).
//!
//! Every PDU starts with the 8-byte common header; `hlen` says how long the PDU-specific header
//! is, `pdo` where the data starts (0: none), `plen` the whole PDU's length (header, digests,
//! data). Fields are stored little-endian; accessors convert.

use super::queue::{Cqe, Sqe};

/// PDU types.
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response.
    pub const IC_RESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command capsule.
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response capsule.
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer.
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGST: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGST: u8 = 1 << 1;
    /// The last data PDU of a transfer.
    pub const DATA_LAST: u8 = 1 << 2;
    /// C2HData only (with `DATA_LAST`): the command succeeded and no response capsule follows.
    pub const DATA_SUCCESS: u8 = 1 << 3;
}

/// Fatal error status of a terminate request.
pub mod fes {
    /// Invalid PDU header field.
    pub const INVALID_HEADER: u16 = 0x01;
    /// PDU sequence error.
    pub const SEQUENCE: u16 = 0x02;
    /// Header digest error.
    pub const HEADER_DIGEST: u16 = 0x03;
    /// Data transfer out of range.
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    /// Data transfer limit exceeded (R2T limit).
    pub const DATA_LIMIT: u16 = 0x05;
    /// Unsupported parameter.
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// The common header of every PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct PduHeader {
    pdu_type: u8,
    flags: u8,
    hlen: u8,
    pdo: u8,
    plen: u32,
}

const _: () = assert!(core::mem::size_of::<PduHeader>() == 8);
const _: () = assert!(core::mem::offset_of!(PduHeader, hlen) == 2);
const _: () = assert!(core::mem::offset_of!(PduHeader, pdo) == 3);
const _: () = assert!(core::mem::offset_of!(PduHeader, plen) == 4);

impl PduHeader {
    /// A header of type `pdu_type`.
    pub const fn new(pdu_type: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> Self {
        PduHeader { pdu_type, flags, hlen, pdo, plen: plen.to_le() }
    }
    /// PDU type.
    pub const fn pdu_type(&self) -> u8 {
        self.pdu_type
    }
    /// Flags.
    pub const fn flags(&self) -> u8 {
        self.flags
    }
    /// Header length (the common header included).
    pub const fn hlen(&self) -> u8 {
        self.hlen
    }
    /// PDU data offset (0: no data).
    pub const fn pdo(&self) -> u8 {
        self.pdo
    }
    /// PDU length.
    pub const fn plen(&self) -> u32 {
        u32::from_le(self.plen)
    }
}

/// Initialize Connection Request / Response (128 bytes). In the request `align` is HPDA (the
/// host's data alignment) and `maxdata` MAXR2T (0's based); in the response `align` is CPDA
/// and `maxdata` MAXH2CDATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct IcPdu {
    hdr: PduHeader,
    pfv: u16,
    align: u8,
    digest: u8,
    maxdata: u32,
    rsvd: [u8; 112],
}

const _: () = assert!(core::mem::size_of::<IcPdu>() == 128);
const _: () = assert!(core::mem::offset_of!(IcPdu, pfv) == 8);
const _: () = assert!(core::mem::offset_of!(IcPdu, align) == 10);
const _: () = assert!(core::mem::offset_of!(IcPdu, digest) == 11);
const _: () = assert!(core::mem::offset_of!(IcPdu, maxdata) == 12);

/// ICReq/ICResp length (header and PDU).
pub const IC_LEN: u8 = 128;

impl IcPdu {
    /// An ICReq or ICResp (`pdu_type`), protocol version 1.0.
    pub const fn new(pdu_type: u8, align: u8, digest: u8, maxdata: u32) -> Self {
        IcPdu {
            hdr: PduHeader::new(pdu_type, 0, IC_LEN, 0, IC_LEN as u32),
            pfv: 0,
            align,
            digest,
            maxdata: maxdata.to_le(),
            rsvd: [0; 112],
        }
    }
    /// The common header.
    pub const fn header(&self) -> PduHeader {
        self.hdr
    }
    /// PDU format version (0: 1.0).
    pub const fn pfv(&self) -> u16 {
        u16::from_le(self.pfv)
    }
    /// HPDA (request) or CPDA (response): data alignment as `(n + 1) * 4` bytes.
    pub const fn align(&self) -> u8 {
        self.align
    }
    /// Digests: bit 0 header, bit 1 data.
    pub const fn digest(&self) -> u8 {
        self.digest
    }
    /// MAXR2T (request) or MAXH2CDATA (response).
    pub const fn maxdata(&self) -> u32 {
        u32::from_le(self.maxdata)
    }
}

/// H2C or C2H Terminate Connection Request header (24 bytes; error data may follow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct TermPdu {
    hdr: PduHeader,
    fes: u16,
    fei: [u8; 4],
    rsvd: [u8; 10],
}

const _: () = assert!(core::mem::size_of::<TermPdu>() == 24);
const _: () = assert!(core::mem::offset_of!(TermPdu, fes) == 8);
const _: () = assert!(core::mem::offset_of!(TermPdu, fei) == 10);

impl TermPdu {
    /// A terminate request of `pdu_type` with fatal error status `fes`, no error data.
    pub const fn new(pdu_type: u8, fes: u16) -> Self {
        TermPdu { hdr: PduHeader::new(pdu_type, 0, 24, 0, 24), fes: fes.to_le(), fei: [0; 4], rsvd: [0; 10] }
    }
    /// Fatal error status.
    pub const fn fes(&self) -> u16 {
        u16::from_le(self.fes)
    }
    /// Fatal error information (the offending field's offset, for header errors).
    pub const fn fei(&self) -> u32 {
        u32::from_le_bytes(self.fei)
    }
}

/// Command capsule header: the common header and the 64-byte command (72 bytes); in-capsule
/// data follows at `pdo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct CmdPdu {
    /// The common header.
    pub hdr: PduHeader,
    /// The command.
    pub sqe: Sqe,
}

const _: () = assert!(core::mem::size_of::<CmdPdu>() == 72);
const _: () = assert!(core::mem::offset_of!(CmdPdu, sqe) == 8);

/// Response capsule: the common header and the 16-byte completion (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct RespPdu {
    /// The common header.
    pub hdr: PduHeader,
    /// The completion.
    pub cqe: Cqe,
}

const _: () = assert!(core::mem::size_of::<RespPdu>() == 24);
const _: () = assert!(core::mem::offset_of!(RespPdu, cqe) == 8);

/// H2CData, C2HData and R2T header (24 bytes): which command (`cccid`), the transfer tag of
/// the R2T being answered (`ttag`, H2C and R2T), and the range within the command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct DataPdu {
    hdr: PduHeader,
    cccid: u16,
    ttag: u16,
    offset: u32,
    length: u32,
    rsvd: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<DataPdu>() == 24);
const _: () = assert!(core::mem::offset_of!(DataPdu, cccid) == 8);
const _: () = assert!(core::mem::offset_of!(DataPdu, ttag) == 10);
const _: () = assert!(core::mem::offset_of!(DataPdu, offset) == 12);
const _: () = assert!(core::mem::offset_of!(DataPdu, length) == 16);

impl DataPdu {
    /// A data PDU or R2T with header `hdr`.
    pub const fn new(hdr: PduHeader, cccid: u16, ttag: u16, offset: u32, length: u32) -> Self {
        DataPdu {
            hdr,
            cccid: cccid.to_le(),
            ttag: ttag.to_le(),
            offset: offset.to_le(),
            length: length.to_le(),
            rsvd: [0; 4],
        }
    }
    /// The common header.
    pub const fn header(&self) -> PduHeader {
        self.hdr
    }
    /// Command capsule CID.
    pub const fn cccid(&self) -> u16 {
        u16::from_le(self.cccid)
    }
    /// Transfer tag.
    pub const fn ttag(&self) -> u16 {
        u16::from_le(self.ttag)
    }
    /// Offset within the command's data (DATAO / R2TO).
    pub const fn offset(&self) -> u32 {
        u32::from_le(self.offset)
    }
    /// Length (DATAL / R2TL).
    pub const fn length(&self) -> u32 {
        u32::from_le(self.length)
    }
}

/// Fabrics command opcode (byte 0 of the command; the type is in byte 4).
pub const FABRICS_OPCODE: u8 = 0x7F;

/// Fabrics command types (FCTYPE).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
}

/// Connect command attribute: disable SQ flow control (no SQ head in completions).
pub const CONNECT_DISABLE_SQFLOW: u8 = 1 << 2;

/// Connect command specific status codes (SCT 1).
pub mod connect_status {
    /// Incompatible format.
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    /// Controller busy.
    pub const CONTROLLER_BUSY: u8 = 0x81;
    /// Invalid parameters (the subsystem NQN, controller ID, queue size, ...).
    pub const INVALID_PARAMETERS: u8 = 0x82;
    /// Restart discovery.
    pub const RESTART_DISCOVERY: u8 = 0x83;
    /// Invalid host (the host NQN is not allowed).
    pub const INVALID_HOST: u8 = 0x84;
}

/// NQN field length in the Connect data.
pub const NQN_FIELD_LEN: usize = 256;

/// Connect command data (1024 bytes, sent in the capsule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct ConnectData {
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    cntlid: u16,
    rsvd18: [u8; 238],
    /// Subsystem NQN, NUL-terminated.
    pub subsysnqn: [u8; NQN_FIELD_LEN],
    /// Host NQN, NUL-terminated.
    pub hostnqn: [u8; NQN_FIELD_LEN],
    rsvd768: [u8; 256],
}

const _: () = assert!(core::mem::size_of::<ConnectData>() == 1024);
const _: () = assert!(core::mem::offset_of!(ConnectData, cntlid) == 16);
const _: () = assert!(core::mem::offset_of!(ConnectData, subsysnqn) == 256);
const _: () = assert!(core::mem::offset_of!(ConnectData, hostnqn) == 512);

impl ConnectData {
    /// Connect data for controller `cntlid` (0xFFFF: a new dynamic controller, on the admin
    /// queue). NQNs longer than 255 bytes are cut (the caller checks).
    pub fn new(hostid: [u8; 16], cntlid: u16, subsysnqn: &[u8], hostnqn: &[u8]) -> Self {
        let mut d = ConnectData {
            hostid,
            cntlid: cntlid.to_le(),
            rsvd18: [0; 238],
            subsysnqn: [0; NQN_FIELD_LEN],
            hostnqn: [0; NQN_FIELD_LEN],
            rsvd768: [0; 256],
        };
        let n = subsysnqn.len().min(NQN_FIELD_LEN - 1);
        d.subsysnqn[..n].copy_from_slice(&subsysnqn[..n]);
        let n = hostnqn.len().min(NQN_FIELD_LEN - 1);
        d.hostnqn[..n].copy_from_slice(&hostnqn[..n]);
        d
    }
    /// Controller ID.
    pub const fn cntlid(&self) -> u16 {
        u16::from_le(self.cntlid)
    }
}

/// SGL descriptor type byte: data block, offset address (data in the capsule).
pub const SGL_INCAPSULE: u8 = 0x01;
/// SGL descriptor type byte: transport data block, transport-specific format A (data moves in
/// H2CData/C2HData PDUs).
pub const SGL_TRANSPORT: u8 = 0x5A;
/// Command dword 0 PSDT bits (15:14): SGLs for data, metadata as a contiguous buffer.
pub const PSDT_SGL: u32 = 1 << 14;
