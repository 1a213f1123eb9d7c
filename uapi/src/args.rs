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
    errno, CreateQpair, DeleteQpair, GetSegments, ListOpeners, RegisterDmabuf, RegisterHost, SetEventfd, MAX_OPENERS,
    QPAIR_FLAG_IRQ,
};

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
}

impl ArgError {
    /// The (positive) errno the module returns for this refusal.
    pub const fn errno(self) -> i32 {
        match self {
            ArgError::Invalid(_) => errno::EINVAL,
            ArgError::Overflow => errno::EOVERFLOW,
            ArgError::Fault => errno::EFAULT,
            ArgError::BadFd => errno::EBADF,
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
        if self.len == 0 || !self.len.is_multiple_of(REG_PAGE) || self.len > MAX_HOST_REGISTRATION {
            return Err(ArgError::Invalid("len"));
        }
        if !self.addr.is_multiple_of(REG_PAGE) {
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
        if self.len == 0 || !self.len.is_multiple_of(REG_PAGE) {
            return Err(ArgError::Invalid("len"));
        }
        if !self.offset.is_multiple_of(REG_PAGE) {
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
