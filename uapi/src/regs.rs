//! NVMe controller registers (base spec 2.0, section 3.1): offsets and field accessors.
//!
//! Register values are plain host-order integers as read by a 32/64-bit MMIO access
//! (the bus is little-endian and MMIO accessors convert). Each type wraps the raw value
//! and decodes fields with shifts and masks; builders return new values.

/// Offset of CAP, Controller Capabilities (64-bit).
pub const REG_CAP: usize = 0x00;
/// Offset of VS, Version (32-bit).
pub const REG_VS: usize = 0x08;
/// Offset of INTMS, Interrupt Mask Set (32-bit).
pub const REG_INTMS: usize = 0x0C;
/// Offset of INTMC, Interrupt Mask Clear (32-bit).
pub const REG_INTMC: usize = 0x10;
/// Offset of CC, Controller Configuration (32-bit).
pub const REG_CC: usize = 0x14;
/// Offset of CSTS, Controller Status (32-bit).
pub const REG_CSTS: usize = 0x1C;
/// Offset of AQA, Admin Queue Attributes (32-bit).
pub const REG_AQA: usize = 0x24;
/// Offset of ASQ, Admin Submission Queue Base Address (64-bit).
pub const REG_ASQ: usize = 0x28;
/// Offset of ACQ, Admin Completion Queue Base Address (64-bit).
pub const REG_ACQ: usize = 0x30;
/// Offset of the first doorbell register (admin SQ 0 tail).
pub const REG_DOORBELL_BASE: usize = 0x1000;

const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

/// CAP: Controller Capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// MQES: maximum queue entries supported, zero-based (a value of 1 means 2 entries).
    pub const fn mqes(self) -> u16 {
        // CAST: a 16-bit field.
        bits64(self.0, 0, 16) as u16
    }
    /// Maximum queue depth in entries (MQES + 1).
    pub const fn max_queue_entries(self) -> u32 {
        self.mqes() as u32 + 1
    }
    /// CQR: contiguous queues required.
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    /// AMS: arbitration mechanisms supported (bit 0 weighted round robin, bit 1 vendor).
    pub const fn ams(self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }
    /// TO: worst-case time for CSTS.RDY to change after CC.EN changes, in 500 ms units.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// The ready timeout in milliseconds (TO × 500).
    pub const fn timeout_ms(self) -> u32 {
        self.to() as u32 * 500
    }
    /// DSTRD: doorbell stride; doorbells are `4 << DSTRD` bytes apart.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// NSSRS: NVM subsystem reset supported.
    pub const fn nssrs(self) -> bool {
        bits64(self.0, 36, 1) != 0
    }
    /// CSS: command sets supported (bit 0: NVM command set).
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    /// MPSMIN: minimum memory page size, as `12 + MPSMIN` bits.
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// MPSMAX: maximum memory page size, as `12 + MPSMAX` bits.
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
    /// Minimum memory page size in bytes.
    pub const fn min_page_size(self) -> u64 {
        1u64 << (12 + self.mpsmin() as u32)
    }
}

/// VS: Version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vs(pub u32);

impl Vs {
    /// Major version.
    pub const fn major(self) -> u16 {
        bits32(self.0, 16, 16) as u16
    }
    /// Minor version.
    pub const fn minor(self) -> u8 {
        bits32(self.0, 8, 8) as u8
    }
    /// Tertiary version.
    pub const fn tertiary(self) -> u8 {
        bits32(self.0, 0, 8) as u8
    }
}

/// CC: Controller Configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

/// CC.SHN values: shutdown notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Shutdown {
    /// No notification.
    None = 0,
    /// Normal shutdown.
    Normal = 1,
    /// Abrupt shutdown.
    Abrupt = 2,
}

impl Cc {
    /// EN: enable.
    pub const fn en(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    /// Returns CC with EN set to `on`.
    pub const fn with_en(self, on: bool) -> Self {
        Cc((self.0 & !1) | on as u32)
    }
    /// CSS: I/O command set selected (0 = NVM).
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// Returns CC with CSS set.
    pub const fn with_css(self, css: u8) -> Self {
        Cc((self.0 & !(0x7 << 4)) | ((css as u32 & 0x7) << 4))
    }
    /// MPS: memory page size, as `12 + MPS` bits.
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    /// Returns CC with MPS set.
    pub const fn with_mps(self, mps: u8) -> Self {
        Cc((self.0 & !(0xF << 7)) | ((mps as u32 & 0xF) << 7))
    }
    /// AMS: arbitration mechanism selected.
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    /// SHN: shutdown notification.
    pub const fn shn(self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }
    /// Returns CC with SHN set.
    pub const fn with_shn(self, shn: Shutdown) -> Self {
        Cc((self.0 & !(0x3 << 14)) | ((shn as u32) << 14))
    }
    /// IOSQES: I/O submission queue entry size, as a power of two.
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// Returns CC with IOSQES set.
    pub const fn with_iosqes(self, v: u8) -> Self {
        Cc((self.0 & !(0xF << 16)) | ((v as u32 & 0xF) << 16))
    }
    /// IOCQES: I/O completion queue entry size, as a power of two.
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }
    /// Returns CC with IOCQES set.
    pub const fn with_iocqes(self, v: u8) -> Self {
        Cc((self.0 & !(0xF << 20)) | ((v as u32 & 0xF) << 20))
    }
}

/// CSTS: Controller Status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// RDY: ready.
    pub const fn rdy(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    /// CFS: controller fatal status.
    pub const fn cfs(self) -> bool {
        bits32(self.0, 1, 1) != 0
    }
    /// SHST: shutdown status (0 normal operation, 1 in progress, 2 complete).
    pub const fn shst(self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }
    /// NSSRO: NVM subsystem reset occurred.
    pub const fn nssro(self) -> bool {
        bits32(self.0, 4, 1) != 0
    }
    /// PP: processing paused.
    pub const fn pp(self) -> bool {
        bits32(self.0, 5, 1) != 0
    }
    /// An all-ones read: the device is gone (surprise removal or a dead link).
    pub const fn is_gone(self) -> bool {
        self.0 == u32::MAX
    }
}

/// AQA: Admin Queue Attributes (zero-based queue sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// AQA for admin queues of `sq_entries` and `cq_entries` entries (1-based counts, 2..=4096).
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Self {
        Aqa(((cq_entries as u32 - 1) & 0xFFF) << 16 | ((sq_entries as u32 - 1) & 0xFFF))
    }
    /// ASQS: admin submission queue size, zero-based.
    pub const fn asqs(self) -> u16 {
        bits32(self.0, 0, 12) as u16
    }
    /// ACQS: admin completion queue size, zero-based.
    pub const fn acqs(self) -> u16 {
        bits32(self.0, 16, 12) as u16
    }
}

/// Byte distance between consecutive doorbells for a doorbell stride.
pub const fn doorbell_stride_bytes(dstrd: u8) -> usize {
    4usize << dstrd
}

/// BAR offset of submission queue `qid`'s tail doorbell.
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    REG_DOORBELL_BASE + (2 * qid as usize) * doorbell_stride_bytes(dstrd)
}

/// BAR offset of completion queue `qid`'s head doorbell.
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    REG_DOORBELL_BASE + (2 * qid as usize + 1) * doorbell_stride_bytes(dstrd)
}
