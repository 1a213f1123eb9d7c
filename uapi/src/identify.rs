//! Identify Controller and Identify Namespace data (base spec 2.0, section 5.17.2; NVM command
//! set spec 1.0, section 4.1.5): the fields ugds uses, at the spec's offsets, the rest reserved.

/// Identify Controller data structure (CNS 01h), 4096 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct IdentifyController {
    /// PCI vendor ID.
    pub vid: u16,
    /// PCI subsystem vendor ID.
    pub ssvid: u16,
    /// Serial number (ASCII, space padded).
    pub sn: [u8; 20],
    /// Model number (ASCII, space padded).
    pub mn: [u8; 40],
    /// Firmware revision (ASCII, space padded).
    pub fr: [u8; 8],
    /// Recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI identifier.
    pub ieee: [u8; 3],
    /// Controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size, as a power of two in units of CAP.MPSMIN (0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version.
    pub ver: u32,
    /// RTD3 Resume Latency, microseconds.
    pub rtd3r: u32,
    /// RTD3 Entry Latency, microseconds.
    pub rtd3e: u32,
    /// Optional Asynchronous Events Supported.
    pub oaes: u32,
    /// Controller Attributes.
    pub ctratt: u32,
    rsvd100: [u8; 156],
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (zero-based).
    pub acl: u8,
    /// Asynchronous Event Request Limit (zero-based).
    pub aerl: u8,
    /// Firmware Updates: bits 3:1 the number of firmware slots.
    pub frmw: u8,
    /// Log Page Attributes.
    pub lpa: u8,
    /// Error Log Page Entries (zero-based).
    pub elpe: u8,
    /// Number of Power States Support (zero-based).
    pub npss: u8,
    /// Admin Vendor Specific Command Configuration.
    pub avscc: u8,
    /// Autonomous Power State Transition Attributes.
    pub apsta: u8,
    /// Warning Composite Temperature Threshold, kelvins.
    pub wctemp: u16,
    /// Critical Composite Temperature Threshold, kelvins.
    pub cctemp: u16,
    rsvd270: [u8; 10],
    /// Total NVM Capacity in bytes (128-bit little endian; 0 when not reported).
    pub tnvmcap: [u8; 16],
    /// Unallocated NVM Capacity in bytes (128-bit little endian).
    pub unvmcap: [u8; 16],
    rsvd312: [u8; 200],
    /// Submission queue entry size (bits 3:0 required, 7:4 maximum; powers of two).
    pub sqes: u8,
    /// Completion queue entry size.
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (the largest valid NSID).
    pub nn: u32,
    /// Optional NVM command support (bit 2 DSM, bit 3 write zeroes).
    pub oncs: u16,
    /// Fused operation support.
    pub fuses: u16,
    /// Format NVM attributes.
    pub fna: u8,
    /// Volatile write cache (bit 0 present).
    pub vwc: u8,
    /// Atomic write unit normal.
    pub awun: u16,
    /// Atomic write unit power fail.
    pub awupf: u16,
    rsvd530: [u8; 6],
    /// SGL support.
    pub sgls: u32,
    rsvd540: [u8; 228],
    /// NVM Subsystem NVMe Qualified Name (UTF-8, NUL padded).
    pub subnqn: [u8; 256],
    rsvd1024: [u8; 3072],
}

const _: () = assert!(core::mem::size_of::<IdentifyController>() == 4096);
const _: () = assert!(core::mem::offset_of!(IdentifyController, sn) == 4);
const _: () = assert!(core::mem::offset_of!(IdentifyController, mn) == 24);
const _: () = assert!(core::mem::offset_of!(IdentifyController, fr) == 64);
const _: () = assert!(core::mem::offset_of!(IdentifyController, mdts) == 77);
const _: () = assert!(core::mem::offset_of!(IdentifyController, ver) == 80);
const _: () = assert!(core::mem::offset_of!(IdentifyController, rtd3r) == 84);
const _: () = assert!(core::mem::offset_of!(IdentifyController, ctratt) == 96);
const _: () = assert!(core::mem::offset_of!(IdentifyController, oacs) == 256);
const _: () = assert!(core::mem::offset_of!(IdentifyController, elpe) == 262);
const _: () = assert!(core::mem::offset_of!(IdentifyController, wctemp) == 266);
const _: () = assert!(core::mem::offset_of!(IdentifyController, cctemp) == 268);
const _: () = assert!(core::mem::offset_of!(IdentifyController, tnvmcap) == 280);
const _: () = assert!(core::mem::offset_of!(IdentifyController, unvmcap) == 296);
const _: () = assert!(core::mem::offset_of!(IdentifyController, subnqn) == 768);
const _: () = assert!(core::mem::offset_of!(IdentifyController, sqes) == 512);
const _: () = assert!(core::mem::offset_of!(IdentifyController, cqes) == 513);
const _: () = assert!(core::mem::offset_of!(IdentifyController, nn) == 516);
const _: () = assert!(core::mem::offset_of!(IdentifyController, oncs) == 520);
const _: () = assert!(core::mem::offset_of!(IdentifyController, vwc) == 525);
const _: () = assert!(core::mem::offset_of!(IdentifyController, sgls) == 536);

/// ONCS bit: Dataset Management supported.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit: Write Zeroes supported.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

impl IdentifyController {
    /// MDTS in bytes for a controller whose minimum page size is `min_page`; `None` = unlimited.
    pub const fn mdts_bytes(&self, min_page: u64) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            Some(min_page << self.mdts)
        }
    }
    /// Volatile write cache present.
    pub const fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
    /// Required (minimum) SQ entry size as a power of two.
    pub const fn sqes_min(&self) -> u8 {
        self.sqes & 0xF
    }
    /// Required (minimum) CQ entry size as a power of two.
    pub const fn cqes_min(&self) -> u8 {
        self.cqes & 0xF
    }
}

/// One LBA format descriptor (LBAF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct LbaFormat(pub u32);

impl LbaFormat {
    /// Metadata bytes per LBA.
    pub const fn ms(self) -> u16 {
        // CAST: the low 16 bits.
        u32::from_le(self.0) as u16
    }
    /// LBA data size as a power of two (9 = 512 bytes, 12 = 4096).
    pub const fn lbads(self) -> u8 {
        (u32::from_le(self.0) >> 16) as u8
    }
    /// Relative performance (0 best).
    pub const fn rp(self) -> u8 {
        ((u32::from_le(self.0) >> 24) & 3) as u8
    }
}

/// Identify Namespace data structure (CNS 00h), 4096 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity in logical blocks.
    pub ncap: u64,
    /// Namespace utilisation in logical blocks.
    pub nuse: u64,
    /// Namespace features.
    pub nsfeat: u8,
    /// Number of LBA formats, zero-based.
    pub nlbaf: u8,
    /// Formatted LBA size: bits 3:0 the format index's low bits, bits 6:5 its high bits.
    pub flbas: u8,
    /// Metadata capabilities.
    pub mc: u8,
    /// End-to-end data protection capabilities.
    pub dpc: u8,
    /// End-to-end data protection type settings: bits 2:0 the protection information type in
    /// use (0: none).
    pub dps: u8,
    rsvd30: [u8; 98],
    /// LBA format descriptors.
    pub lbaf: [LbaFormat; 64],
    rsvd384: [u8; 3712],
}

const _: () = assert!(core::mem::size_of::<IdentifyNamespace>() == 4096);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, ncap) == 8);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, nlbaf) == 25);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, flbas) == 26);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, dps) == 29);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, lbaf) == 128);

impl IdentifyNamespace {
    /// Index of the LBA format in use.
    pub const fn format_index(&self) -> usize {
        (self.flbas & 0xF) as usize | (((self.flbas >> 5) & 0x3) as usize) << 4
    }
    /// The LBA format in use.
    pub const fn format(&self) -> LbaFormat {
        self.lbaf[self.format_index()]
    }
    /// Logical block size as a power of two.
    pub const fn lba_shift(&self) -> u8 {
        self.format().lbads()
    }
    /// Namespace size in logical blocks.
    pub const fn size_lbas(&self) -> u64 {
        u64::from_le(self.nsze)
    }
    /// Namespace capacity in logical blocks.
    pub const fn capacity_lbas(&self) -> u64 {
        u64::from_le(self.ncap)
    }
}
