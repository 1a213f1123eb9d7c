//! The 64-byte submission queue entry and the 16-byte completion queue entry
//! (base spec 2.0, sections 4.2 and 4.6), with opcodes.
//!
//! Fields are stored little-endian, as the device reads them; accessors convert.

use super::status::Status;

/// Admin command opcodes used by ugds.
pub mod admin {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Doorbell Buffer Config (shadow doorbells, NVMe 1.3).
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7C;
}

/// NVM command set opcodes used by ugds.
pub mod nvm {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management (deallocate = trim).
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace data structure for the NSID.
    pub const NAMESPACE: u32 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u32 = 0x01;
    /// Active namespace ID list.
    pub const ACTIVE_NSID_LIST: u32 = 0x02;
}

/// Feature identifiers.
pub mod feature {
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u32 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u32 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u32 = 0x08;
}

/// A submission queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Sqe {
    cdw0: u32,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    mptr: u64,
    prp1: u64,
    prp2: u64,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
}

const _: () = assert!(core::mem::size_of::<Sqe>() == 64);
const _: () = assert!(core::mem::offset_of!(Sqe, nsid) == 4);
const _: () = assert!(core::mem::offset_of!(Sqe, mptr) == 16);
const _: () = assert!(core::mem::offset_of!(Sqe, prp1) == 24);
const _: () = assert!(core::mem::offset_of!(Sqe, prp2) == 32);
const _: () = assert!(core::mem::offset_of!(Sqe, cdw10) == 40);
const _: () = assert!(core::mem::offset_of!(Sqe, cdw15) == 60);

impl Sqe {
    /// A zeroed entry with the opcode and command identifier set.
    pub const fn new(opcode: u8, cid: u16) -> Self {
        Sqe {
            cdw0: ((cid as u32) << 16 | opcode as u32).to_le(),
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }
    /// The entry as the 16 little-endian dwords the device reads (for volatile copies into a queue).
    pub const fn to_dwords(&self) -> [u32; 16] {
        [
            self.cdw0,
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.mptr as u32,
            (self.mptr >> 32) as u32,
            self.prp1 as u32,
            (self.prp1 >> 32) as u32,
            self.prp2 as u32,
            (self.prp2 >> 32) as u32,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
        ]
    }
    /// Opcode (CDW0 bits 7:0).
    pub const fn opcode(&self) -> u8 {
        // CAST: the low byte is the opcode.
        u32::from_le(self.cdw0) as u8
    }
    /// Command identifier (CDW0 bits 31:16).
    pub const fn cid(&self) -> u16 {
        (u32::from_le(self.cdw0) >> 16) as u16
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        let v = u32::from_le(self.cdw0) & 0xFFFF;
        self.cdw0 = (v | (cid as u32) << 16).to_le();
    }
    /// PSDT (CDW0 bits 15:14): 0 = PRPs.
    pub const fn psdt(&self) -> u8 {
        ((u32::from_le(self.cdw0) >> 14) & 0x3) as u8
    }
    /// Namespace identifier.
    pub const fn nsid(&self) -> u32 {
        u32::from_le(self.nsid)
    }
    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: u32) {
        self.nsid = nsid.to_le();
    }
    /// PRP entry 1.
    pub const fn prp1(&self) -> u64 {
        u64::from_le(self.prp1)
    }
    /// PRP entry 2.
    pub const fn prp2(&self) -> u64 {
        u64::from_le(self.prp2)
    }
    /// Sets both PRP entries.
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.prp1 = prp1.to_le();
        self.prp2 = prp2.to_le();
    }
    /// Command dword `n` (10..=15).
    pub const fn cdw(&self, n: usize) -> u32 {
        u32::from_le(match n {
            10 => self.cdw10,
            11 => self.cdw11,
            12 => self.cdw12,
            13 => self.cdw13,
            14 => self.cdw14,
            15 => self.cdw15,
            _ => 0,
        })
    }
    /// Sets command dword `n` (10..=15); other indices are ignored.
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        let v = v.to_le();
        match n {
            10 => self.cdw10 = v,
            11 => self.cdw11 = v,
            12 => self.cdw12 = v,
            13 => self.cdw13 = v,
            14 => self.cdw14 = v,
            15 => self.cdw15 = v,
            _ => {}
        }
    }
    /// Starting LBA of an NVM read/write/write-zeroes (CDW10/11).
    pub const fn slba(&self) -> u64 {
        (self.cdw(11) as u64) << 32 | self.cdw(10) as u64
    }
    /// Sets the starting LBA (CDW10/11).
    pub fn set_slba(&mut self, slba: u64) {
        // CAST: split into the low and high dwords.
        self.set_cdw(10, slba as u32);
        self.set_cdw(11, (slba >> 32) as u32);
    }
    /// Number of logical blocks of an NVM read/write, 1-based (CDW12 bits 15:0 + 1).
    pub const fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xFFFF) + 1
    }
    /// Sets the number of logical blocks (1..=65536), keeping CDW12's upper flags.
    pub fn set_nlb(&mut self, blocks: u32) {
        let flags = self.cdw(12) & 0xFFFF_0000;
        self.set_cdw(12, flags | (blocks.wrapping_sub(1) & 0xFFFF));
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Cqe {
    dw0: u32,
    dw1: u32,
    sq_head: u16,
    sq_id: u16,
    cid: u16,
    status: u16,
}

const _: () = assert!(core::mem::size_of::<Cqe>() == 16);
const _: () = assert!(core::mem::offset_of!(Cqe, sq_head) == 8);
const _: () = assert!(core::mem::offset_of!(Cqe, sq_id) == 10);
const _: () = assert!(core::mem::offset_of!(Cqe, cid) == 12);
const _: () = assert!(core::mem::offset_of!(Cqe, status) == 14);

impl Cqe {
    /// Builds an entry (as a device would; used by device models in tests).
    pub const fn new(dw0: u32, sq_head: u16, sq_id: u16, cid: u16, status: Status, phase: bool) -> Self {
        Cqe {
            dw0: dw0.to_le(),
            dw1: 0,
            sq_head: sq_head.to_le(),
            sq_id: sq_id.to_le(),
            cid: cid.to_le(),
            status: (status.to_field() << 1 | phase as u16).to_le(),
        }
    }
    /// An entry from the four dwords read out of a completion queue slot.
    pub const fn from_dwords(d: [u32; 4]) -> Self {
        Cqe {
            dw0: d[0],
            dw1: d[1],
            // CAST: the low and high halves of DW2 and DW3.
            sq_head: d[2] as u16,
            sq_id: (d[2] >> 16) as u16,
            cid: d[3] as u16,
            status: (d[3] >> 16) as u16,
        }
    }
    /// DW0: command-specific result.
    pub const fn dw0(&self) -> u32 {
        u32::from_le(self.dw0)
    }
    /// SQ head pointer at the time of completion.
    pub const fn sq_head(&self) -> u16 {
        u16::from_le(self.sq_head)
    }
    /// SQ identifier.
    pub const fn sq_id(&self) -> u16 {
        u16::from_le(self.sq_id)
    }
    /// Command identifier.
    pub const fn cid(&self) -> u16 {
        u16::from_le(self.cid)
    }
    /// Phase tag.
    pub const fn phase(&self) -> bool {
        u16::from_le(self.status) & 1 != 0
    }
    /// The status field (bits 15:1 of DW3's upper half), decoded.
    pub const fn status(&self) -> Status {
        Status::from_field(u16::from_le(self.status) >> 1)
    }
}
