//! The ioctl argument rules, as pure functions: what `ugds.ko` accepts in each argument struct
//! before it touches any state, and the checked values it then relies on.
//!
//! The module calls these (kmod `chardev`); they are host-tested (`uapi/tests/args.rs`) and
//! fuzzed from raw bytes (`fuzz/fuzz_targets/ioctl.rs`). Each rule's errno is the one the
//! [`super::ioctl`] docs give; the order of the checks is part of the ABI (a struct with several
//! faults gets the errno of the first rule it breaks, in the order written here).
//!
//! What needs the module's state (a queue id or registration that must exist, a user page that
//! must be mapped, a file descriptor that must be a dma-buf or an eventfd) is checked by the
//! module afterwards, not here.

use super::ioctl::{
    admin_allowed, errno, AdminCommand, CreateQpair, DeleteQpair, GetSegments, ListOpeners, RegisterDmabuf,
    RegisterHost, SetEventfd, MAX_ADMIN_DATA, MAX_OPENERS, QPAIR_FLAG_IRQ,
};
use super::queue::{admin, Sqe};

/// The page size of every registration: addresses, offsets and lengths are multiples of it.
pub const REG_PAGE: u64 = 4096;

/// Largest host registration (`REGISTER_HOST`): 16 GiB.
pub const MAX_HOST_REGISTRATION: u64 = 16 << 30;

/// Why an argument struct is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgError {
    /// A field is out of range or reserved bits are set (`EINVAL`); names the field.
    Invalid(&'static str),
    /// `addr + len` or `offset + len` wraps (`EOVERFLOW`).
    Overflow,
    /// The range reaches past the user address space (`EFAULT`).
    Fault,
    /// A file descriptor field is negative where it may not be (`EBADF`).
    BadFd,
    /// An admin opcode `ADMIN_CMD` does not run (`EACCES`).
    Refused(u8),
}

impl ArgError {
    /// The (positive) errno the module returns for this refusal.
    pub const fn errno(self) -> i32 {
        match self {
            ArgError::Invalid(_) => errno::EINVAL,
            ArgError::Overflow => errno::EOVERFLOW,
            ArgError::Fault => errno::EFAULT,
            ArgError::BadFd => errno::EBADF,
            ArgError::Refused(_) => errno::EACCES,
        }
    }
}

/// What the checks compare against: the controller's and the kernel's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most entries in one queue (`DeviceInfo::max_queue_entries`, CAP.MQES + 1, at most 65536).
    pub max_queue_entries: u32,
    /// First address past the user address space (x86-64 with 4-level paging: `0x7FFF_FFFF_F000`).
    pub user_end: u64,
}

/// A `CREATE_QPAIR` request that passed [`CreateQpair::check`].
///
/// # Invariants
///
/// `2 <= depth <= limits.max_queue_entries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpairRequest {
    /// Entries per queue.
    pub depth: u32,
    /// Interrupts enabled for the CQ ([`QPAIR_FLAG_IRQ`]).
    pub irq: bool,
}

impl CreateQpair {
    /// The input fields' rules: no flag but [`QPAIR_FLAG_IRQ`] (`EINVAL`), then
    /// `2 <= depth <= max_queue_entries` (`EINVAL`). The output fields are ignored.
    pub const fn check(&self, limits: &Limits) -> Result<QpairRequest, ArgError> {
        if self.flags & !QPAIR_FLAG_IRQ != 0 {
            return Err(ArgError::Invalid("flags"));
        }
        if self.depth < 2 || self.depth > limits.max_queue_entries {
            return Err(ArgError::Invalid("depth"));
        }
        // INVARIANT: both bounds checked just above.
        Ok(QpairRequest { depth: self.depth, irq: self.flags & QPAIR_FLAG_IRQ != 0 })
    }
}

impl DeleteQpair {
    /// `reserved` must be zero (`EINVAL`). Returns the queue id to look up.
    pub const fn check(&self) -> Result<u32, ArgError> {
        if self.reserved != 0 {
            return Err(ArgError::Invalid("reserved"));
        }
        Ok(self.qid)
    }
}

/// A user address range that passed [`RegisterHost::check`].
///
/// # Invariants
///
/// `addr` and `len` are multiples of [`REG_PAGE`], `0 < len <= MAX_HOST_REGISTRATION`, and
/// `end == addr + len <= limits.user_end` without wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// `addr + len`.
    pub end: u64,
}

impl HostRange {
    /// Number of pages (at most `MAX_HOST_REGISTRATION / REG_PAGE`, so it fits a `u32`).
    pub const fn pages(&self) -> u64 {
        self.len / REG_PAGE
    }
}

impl RegisterHost {
    /// `len` non-zero, a multiple of [`REG_PAGE`], at most [`MAX_HOST_REGISTRATION`], and `addr`
    /// page-aligned (`EINVAL`); `addr + len` must not wrap (`EOVERFLOW`) nor pass
    /// `limits.user_end` (`EFAULT`). The output `handle` is ignored.
    pub const fn check(&self, limits: &Limits) -> Result<HostRange, ArgError> {
        if self.len == 0 || self.len % REG_PAGE != 0 || self.len > MAX_HOST_REGISTRATION {
            return Err(ArgError::Invalid("len"));
        }
        if self.addr % REG_PAGE != 0 {
            return Err(ArgError::Invalid("addr"));
        }
        let Some(end) = self.addr.checked_add(self.len) else { return Err(ArgError::Overflow) };
        if end > limits.user_end {
            return Err(ArgError::Fault);
        }
        // INVARIANT: every bound checked just above.
        Ok(HostRange { addr: self.addr, len: self.len, end })
    }
}

/// A dma-buf range that passed [`RegisterDmabuf::check`].
///
/// # Invariants
///
/// `fd >= 0`; `offset` and `len` are multiples of [`REG_PAGE`], `len > 0`, and
/// `offset + len` does not wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmabufRange {
    /// The dma-buf's file descriptor.
    pub fd: i32,
    /// Where the range starts in the buffer.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RegisterDmabuf {
    /// `reserved` zero, `len` non-zero and a multiple of [`REG_PAGE`], `offset` page-aligned
    /// (`EINVAL`); `offset + len` must not wrap (`EOVERFLOW`); `fd` non-negative (`EBADF`). That
    /// the range fits the buffer is checked when it is attached. The output `handle` is ignored.
    pub const fn check(&self) -> Result<DmabufRange, ArgError> {
        if self.reserved != 0 {
            return Err(ArgError::Invalid("reserved"));
        }
        if self.len == 0 || self.len % REG_PAGE != 0 {
            return Err(ArgError::Invalid("len"));
        }
        if self.offset % REG_PAGE != 0 {
            return Err(ArgError::Invalid("offset"));
        }
        if self.offset.checked_add(self.len).is_none() {
            return Err(ArgError::Overflow);
        }
        if self.fd < 0 {
            return Err(ArgError::BadFd);
        }
        // INVARIANT: every bound checked just above.
        Ok(DmabufRange { fd: self.fd, offset: self.offset, len: self.len })
    }
}

/// The segments a `GET_SEGMENTS` call copies: `[first, first + count)` of the registration's.
///
/// # Invariants
///
/// `first + count <= nsegs` of the registration it was checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWindow {
    /// First segment.
    pub first: usize,
    /// How many.
    pub count: usize,
}

impl GetSegments {
    /// Against a registration of `nsegs` segments (found by id and generation first): `first`
    /// at most `nsegs` (`EINVAL`; equal to it copies nothing); the window is clipped to the
    /// registration. Whether `segments` is writable is the copy's business (`EFAULT`).
    pub const fn check(&self, nsegs: usize) -> Result<SegmentWindow, ArgError> {
        // CAST: u32 to usize widens on every target the module builds for.
        let first = self.first as usize;
        if first > nsegs {
            return Err(ArgError::Invalid("first"));
        }
        let left = nsegs - first;
        // CAST: as above.
        let count = if (self.count as usize) < left { self.count as usize } else { left };
        // INVARIANT: count <= nsegs - first.
        Ok(SegmentWindow { first, count })
    }
}

/// What a `SET_EVENTFD` call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventfdAction {
    /// Detach the queue's eventfd (`fd == -1`).
    Detach,
    /// Attach this descriptor (non-negative).
    Attach(i32),
}

impl SetEventfd {
    /// `fd` is -1 (detach) or a descriptor (`EBADF` below -1). Checked by the module after the
    /// queue pair was found and its interrupts enabled (their errnos come first).
    pub const fn check(&self) -> Result<EventfdAction, ArgError> {
        match self.fd {
            -1 => Ok(EventfdAction::Detach),
            fd if fd >= 0 => Ok(EventfdAction::Attach(fd)),
            _ => Err(ArgError::BadFd),
        }
    }
}

/// An `ADMIN_CMD` request that passed [`AdminCommand::check`].
///
/// # Invariants
///
/// `opcode` is one of [`super::ioctl::ADMIN_ALLOWED`]; `len <= MAX_ADMIN_DATA`, a multiple of
/// 4, and the transfer the controller derives from the command built by [`AdminRequest::sqe`]
/// is exactly `len` bytes for Identify (4096) and Get Log Page (its NUMD is set from `len`);
/// `data + len <= limits.user_end` without wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminRequest {
    /// The opcode.
    pub opcode: u8,
    /// Namespace id.
    pub nsid: u32,
    /// Command dwords 10 to 15 as the command carries them.
    pub cdw: [u32; 6],
    /// Bytes copied to the caller.
    pub len: u32,
    /// The caller's buffer.
    pub data: u64,
}

/// Identify data structures are one 4 KiB page (base spec 2.0, 5.17).
pub const IDENTIFY_BYTES: u32 = 4096;

/// Get Log Page CDW10 bit 15: Retain Asynchronous Event.
pub const LOG_PAGE_RAE: u32 = 1 << 15;

/// The largest transfer of one `ADMIN_CMD` on a controller whose MDTS is `mdts_bytes`
/// (`DeviceInfo::mdts_bytes`, 0 = no limit).
pub const fn admin_data_bound(mdts_bytes: u32) -> u32 {
    if mdts_bytes != 0 && mdts_bytes < MAX_ADMIN_DATA {
        mdts_bytes
    } else {
        MAX_ADMIN_DATA
    }
}

impl AdminCommand {
    /// The opcode must be allowed ([`super::ioctl::admin_allowed`]; `EACCES`, checked first, so
    /// a refused command names its opcode whatever else it carries); `flags`, `reserved0` and
    /// `reserved1` zero (`EINVAL`); `data_len` a multiple of 4 and, by opcode, Identify exactly
    /// [`IDENTIFY_BYTES`], Get Log Page `4..=admin_data_bound(mdts_bytes)`, Get Features
    /// `0..=4096` (`EINVAL`); with `data_len > 0`, `data + data_len` must not wrap
    /// (`EOVERFLOW`) nor pass `limits.user_end` (`EFAULT`). Get Log Page gets NUMDL/NUMDU from
    /// `data_len` and RAE set (reading a log through ugds never clears an asynchronous event).
    /// The output fields are ignored.
    pub const fn check(&self, limits: &Limits, mdts_bytes: u32) -> Result<AdminRequest, ArgError> {
        if admin_allowed(self.opcode).is_none() {
            return Err(ArgError::Refused(self.opcode));
        }
        if self.flags != 0 {
            return Err(ArgError::Invalid("flags"));
        }
        if self.reserved0 != 0 || self.reserved1 != 0 {
            return Err(ArgError::Invalid("reserved"));
        }
        let len = self.data_len;
        let ok = len & 3 == 0
            && match self.opcode {
                admin::IDENTIFY => len == IDENTIFY_BYTES,
                admin::GET_LOG_PAGE => len >= 4 && len <= admin_data_bound(mdts_bytes),
                _ => len <= 4096,
            };
        if !ok {
            return Err(ArgError::Invalid("data_len"));
        }
        if len > 0 {
            let Some(end) = self.data.checked_add(len as u64) else { return Err(ArgError::Overflow) };
            if end > limits.user_end {
                return Err(ArgError::Fault);
            }
        }
        let mut cdw = self.cdw;
        if self.opcode == admin::GET_LOG_PAGE {
            // NUMD is zero-based, in dwords: NUMDL in CDW10 bits 31:16, NUMDU in CDW11 bits 15:0.
            let numd = len / 4 - 1;
            cdw[0] = (cdw[0] & 0x7FFF) | LOG_PAGE_RAE | (numd & 0xFFFF) << 16;
            cdw[1] = (cdw[1] & 0xFFFF_0000) | numd >> 16;
        }
        // INVARIANT: opcode and length checked above; NUMD derived from `len`.
        Ok(AdminRequest { opcode: self.opcode, nsid: self.nsid, cdw, len, data: self.data })
    }
}

impl AdminRequest {
    /// The command: the opcode, NSID and CDW10..15 of the request, the data pointers given (the
    /// module's own memory), everything else zero (no fused operation, PRPs, no metadata
    /// pointer). The command id is the admin queue's business.
    pub fn sqe(&self, prp1: u64, prp2: u64) -> Sqe {
        let mut s = Sqe::new(self.opcode, 0);
        s.set_nsid(self.nsid);
        s.set_prps(prp1, prp2);
        for (i, v) in self.cdw.iter().enumerate() {
            s.set_cdw(10 + i, *v);
        }
        s
    }
}

/// Bytes of one page of an `ADMIN_CMD` transfer buffer (CC.MPS = 0: 4 KiB controller pages).
pub const ADMIN_PAGE: usize = 4096;

/// Entries of a PRP list page.
pub const PRP_ENTRIES: usize = ADMIN_PAGE / 8;

/// Data pages of the module's buffer for an `ADMIN_CMD` of `len` bytes: at least one. The
/// buffer has one more page, the guard page, right after them (page index `admin_data_pages`).
pub const fn admin_data_pages(len: u32) -> usize {
    // CAST: u32 to usize widens on every target the module builds for.
    let p = (len as usize).div_ceil(ADMIN_PAGE);
    if p == 0 {
        1
    } else {
        p
    }
}

/// Where page `k` of a transfer of exactly `len` bytes lands in the module's buffer, PRP1 naming
/// page 0 and PRP2 the guard page (always): page 0 first; for a transfer of two pages the
/// controller takes PRP2 for the second data page, so the guard page; for a longer one it
/// follows PRP2 as a list, whose entry `k - 1` names data page `k`.
pub const fn admin_page_of(len: u32, k: usize) -> usize {
    let pages = admin_data_pages(len);
    if k == 0 {
        0
    } else if pages <= 2 {
        pages
    } else {
        k
    }
}

/// The page entry `i` of the guard page's PRP list names: the data pages 1, 2, ..., `pages - 1`,
/// 0, 1, ... in turn, and for the last entry (the one a controller follows to the next list
/// page) the guard page itself. PRP1 names page 0 and PRP2 the guard page, so whatever transfer
/// length a controller derives from the command (more than the buffer holds, for a feature
/// whose data it sizes itself), every address it reaches lies in the buffer: a page it takes
/// for data is one of the buffer's, a list it follows is the guard page.
pub const fn admin_guard_entry(pages: usize, i: usize) -> usize {
    if i == PRP_ENTRIES - 1 {
        pages
    } else {
        (1 + i) % pages
    }
}

impl ListOpeners {
    /// `capacity` at most [`MAX_OPENERS`] (`EINVAL`), returned as the number of entries the
    /// caller has room for. Whether `openers` is writable is the copy's business (`EFAULT`).
    pub const fn check(&self) -> Result<usize, ArgError> {
        if self.capacity > MAX_OPENERS {
            return Err(ArgError::Invalid("capacity"));
        }
        // CAST: u32 to usize widens on every target the module builds for.
        Ok(self.capacity as usize)
    }
}
