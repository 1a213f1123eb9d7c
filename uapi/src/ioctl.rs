//! The ioctl and mmap ABI between `ugds.ko` and user space (`/dev/ugds_drvN`, class `ugds_drv`).
//!
//! Every argument struct is `#[repr(C)]` with explicit padding and 8-byte alignment, the same on
//! both sides. [`ABI_VERSION`] changes whenever any of it does; the library compares it with
//! [`DeviceInfo::abi_version`] at open and refuses a mismatch. The rules each argument struct
//! must pass are pure functions in [`super::args`].
//!
//! # Errors (negative errno from `ioctl`, as documented per request)
//! | errno | meaning |
//! | --- | --- |
//! | `ENOTTY` | unknown request number |
//! | `EINVAL` | a field is out of range: zero or too large a length or depth, an unaligned address, reserved bits set |
//! | `EOVERFLOW` | `addr + len` or `offset + len` wraps |
//! | `EFAULT` | a user pointer (argument struct, buffer to register, segment array) is not mapped |
//! | `ENOENT` | no such queue pair or registration for this open file |
//! | `ESTALE` | the registration id exists but its generation differs (stale reference) |
//! | `EBUSY` | the object is in use (queue pair with an eventfd being torn down, a reset in progress) |
//! | `EBADF` | the fd is not open, or is not a dma-buf / eventfd as required |
//! | `ENOSPC` | no free queue id or registration slot |
//! | `EIO` | the controller failed the admin command or is faulted |
//! | `ENODEV` | the controller was unbound while this file was open |
//! | `EPERM` | the file was opened by another process (inherited across `fork`, or passed over a socket): open the node again in this process |
//! | `EBUSY` | (open) the node is held exclusively (`O_EXCL`) by another opener, or an exclusive open finds other openers |
//! | `EACCES` | (doorbell mmap) the controller keeps its MSI-X table or PBA in the doorbell pages, which user space must never write |
//! | `ENOMEM` | (registration) pinning would exceed `RLIMIT_MEMLOCK` (without `CAP_IPC_LOCK`) |
//! | `EXDEV` | (dma-buf registration) the kernel allows no peer-to-peer DMA between the controller and the device whose memory the dma-buf holds (the PCIe topology, ACS redirection or an untrusted host bridge): nothing was registered |
//! | `EKEYREVOKED` | (`GET_SEGMENTS`) the dma-buf's exporter revoked it (a device reset, its memory moved or disabled): the controller was reset before the mapping went, so no command reached it afterwards; deregister it |
//! | `EACCES` | (`ADMIN_CMD`) the opcode is not one of [`ADMIN_ALLOWED`]: nothing reached the controller |
//! | `EIO` | (`ADMIN_CMD`) the controller is faulted or its admin queue broken (a reset is needed); a command the controller completed with an error status is not an errno but [`AdminCommand::status`] |
//!
//! # Lifetimes
//! Every mapping is `VM_DONTCOPY` (a child made by `fork` inherits none) and is filled at fault
//! time under the lock that revocation takes: once a queue pair is deleted, the controller reset
//! or unbound, a mapping of what went away faults with `SIGBUS` instead of reaching freed memory.
//! A reset leaves every queue pair deleted on the controller, its memory zeroed, until its owner
//! re-creates it with `REARM_QPAIR`: a doorbell written with a tail computed before the reset
//! names a queue the controller does not have.

/// Version of this ABI.
pub const ABI_VERSION: u32 = 8;

/// The ioctl type byte of ugds requests.
pub const IOCTL_TYPE: u8 = 0xD7;

/// Linux errno values used by the module (they are ABI: the same on every Linux architecture ugds targets).
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such entry.
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Bad file descriptor.
    pub const EBADF: i32 = 9;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Busy.
    pub const EBUSY: i32 = 16;
    /// Permission denied.
    pub const EACCES: i32 = 13;
    /// Cross-device link: peer-to-peer DMA between the two devices is not possible.
    pub const EXDEV: i32 = 18;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Not a typewriter: unknown ioctl.
    pub const ENOTTY: i32 = 25;
    /// No space left.
    pub const ENOSPC: i32 = 28;
    /// Value too large.
    pub const EOVERFLOW: i32 = 75;
    /// Stale handle.
    pub const ESTALE: i32 = 116;
    /// Timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Key has been revoked: the dma-buf's exporter revoked the memory.
    pub const EKEYREVOKED: i32 = 128;
}

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Encodes an ioctl request number as the kernel's `_IOC` does.
pub const fn ioc(dir: u32, nr: u8, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    // CAST: checked above to fit 14 bits.
    (dir << IOC_DIRSHIFT)
        | ((IOCTL_TYPE as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// Most namespaces reported by [`DeviceInfo`].
pub const MAX_NAMESPACES: usize = 16;

/// One namespace in [`DeviceInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct NamespaceInfo {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Logical block size as a power of two.
    pub lba_shift: u8,
    /// Protection information type in use (0: none; Identify Namespace DPS bits 2:0).
    pub pi_type: u8,
    /// Metadata bytes per logical block (0: none).
    pub metadata_bytes: u16,
    /// Size in logical blocks.
    pub size_lbas: u64,
}

/// `GET_INFO` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct DeviceInfo {
    /// [`ABI_VERSION`] of the module.
    pub abi_version: u32,
    /// N of `/dev/ugds_drvN` (also its minor number).
    pub instance: u32,
    /// Serial number (ASCII, space padded).
    pub serial: [u8; 20],
    /// Model number (ASCII, space padded).
    pub model: [u8; 40],
    /// Firmware revision (ASCII, space padded).
    pub firmware: [u8; 8],
    /// PCI vendor ID.
    pub vid: u16,
    /// PCI subsystem vendor ID.
    pub ssvid: u16,
    /// CAP register.
    pub cap: u64,
    /// VS register.
    pub vs: u32,
    /// Maximum data transfer size in bytes (0 = unlimited).
    pub mdts_bytes: u32,
    /// Doorbell stride in bytes.
    pub doorbell_stride: u32,
    /// I/O queue pairs granted by the controller.
    pub max_qpairs: u32,
    /// Most entries in one queue (CAP.MQES + 1).
    pub max_queue_entries: u32,
    /// MSI-X vectors available for I/O queues.
    pub irq_vectors: u32,
    /// Entries used in `namespaces`.
    pub num_namespaces: u32,
    /// Volatile write cache present (1) or not (0).
    pub vwc: u32,
    /// Identify Controller ONCS.
    pub oncs: u32,
    /// Controller memory page size in bytes (CC.MPS).
    pub page_size: u32,
    /// Active namespaces.
    pub namespaces: [NamespaceInfo; MAX_NAMESPACES],
    /// Identify Controller SGLS (bits 1:0: SGLs for NVM I/O commands: 00b none, 01b supported,
    /// 10b supported with dword alignment and granularity); ABI 3.
    pub sgls: u32,
    /// [`DEVICE_SHADOW_DOORBELLS`] and future flags; ABI 8.
    pub flags: u32,
}

/// [`DeviceInfo::flags`]: the controller takes shadow doorbells (Doorbell Buffer Config): a
/// queue's tail and head are written to [`MmapKind::ShadowDoorbells`] and the doorbell register
/// only when [`MmapKind::EventIndexes`] says the controller waits for it.
pub const DEVICE_SHADOW_DOORBELLS: u32 = 1;

const _: () = assert!(core::mem::size_of::<DeviceInfo>() == 392);
const _: () = assert!(core::mem::offset_of!(DeviceInfo, sgls) == 384);
const _: () = assert!(core::mem::offset_of!(DeviceInfo, cap) == 80);
const _: () = assert!(core::mem::offset_of!(DeviceInfo, namespaces) == 128);

/// `CREATE_QPAIR` flag: interrupts enabled for the CQ (an eventfd may be attached).
pub const QPAIR_FLAG_IRQ: u32 = 1 << 0;

/// `CREATE_QPAIR` argument: `depth` and `flags` in, the rest out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct CreateQpair {
    /// In: entries per queue (2..=CAP.MQES+1).
    pub depth: u32,
    /// In: `QPAIR_FLAG_*`.
    pub flags: u32,
    /// Out: queue id (SQ and CQ share it).
    pub qid: u32,
    /// Out: MSI-X vector of the CQ (valid with `QPAIR_FLAG_IRQ`).
    pub irq_vector: u32,
    /// Out: mmap offset of the SQ.
    pub sq_offset: u64,
    /// Out: mmap length of the SQ.
    pub sq_size: u64,
    /// Out: mmap offset of the CQ.
    pub cq_offset: u64,
    /// Out: mmap length of the CQ.
    pub cq_size: u64,
    /// Out: mmap offset of the PRP-list pool (one 4 KiB page per SQ slot).
    pub prp_offset: u64,
    /// Out: mmap length of the PRP-list pool.
    pub prp_size: u64,
    /// Out: DMA address of the pool's first page; page `i` is at `prp_dma + i * 4096`.
    pub prp_dma: u64,
    /// Out: offset of the SQ tail doorbell inside the doorbell mapping.
    pub sq_doorbell: u64,
    /// Out: offset of the CQ head doorbell inside the doorbell mapping.
    pub cq_doorbell: u64,
}

const _: () = assert!(core::mem::size_of::<CreateQpair>() == 88);

/// `DELETE_QPAIR` and `REARM_QPAIR` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct DeleteQpair {
    /// Queue id from `CREATE_QPAIR`.
    pub qid: u32,
    /// Must be zero.
    pub reserved: u32,
}

/// `RESET` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Reset {
    /// The epoch the caller saw when it decided the controller needs a reset (0: reset in any
    /// case). When the controller has moved on from it and is not faulted, a reset (another
    /// opener's, or an exporter's revocation) ended since: nothing is done.
    pub seen_epoch: u64,
}

/// What a registration call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct RegistrationHandle {
    /// Registration id (per open file).
    pub id: u32,
    /// Generation: bumped every time the id is reused.
    pub generation: u32,
    /// Number of DMA segments.
    pub nsegs: u32,
    /// Must be zero.
    pub reserved: u32,
}

/// `REGISTER_HOST` argument: pin `[addr, addr + len)` and DMA-map it for the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct RegisterHost {
    /// In: page-aligned user address.
    pub addr: u64,
    /// In: length, a multiple of 4096, non-zero, at most
    /// [`MAX_HOST_REGISTRATION`](super::args::MAX_HOST_REGISTRATION).
    pub len: u64,
    /// Out: the registration.
    pub handle: RegistrationHandle,
}

/// `REGISTER_DMABUF` argument: attach a dma-buf (peer-to-peer allowed), map `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct RegisterDmabuf {
    /// In: dma-buf file descriptor.
    pub fd: i32,
    /// Must be zero.
    pub reserved: u32,
    /// In: page-aligned offset inside the buffer.
    pub offset: u64,
    /// In: length, a multiple of 4096, non-zero.
    pub len: u64,
    /// Out: the registration.
    pub handle: RegistrationHandle,
}

/// One DMA segment of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Segment {
    /// Bus address the controller uses.
    pub dma_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `GET_SEGMENTS` argument: copy segments `[first, first + count)` to `segments`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct GetSegments {
    /// Registration id.
    pub id: u32,
    /// Registration generation.
    pub generation: u32,
    /// First segment to copy.
    pub first: u32,
    /// Number of segments to copy (the array's capacity).
    pub count: u32,
    /// User pointer to `count` [`Segment`]s.
    pub segments: u64,
}

/// `DEREGISTER` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Deregister {
    /// Registration id.
    pub id: u32,
    /// Registration generation.
    pub generation: u32,
}

/// `SET_EVENTFD` argument: the queue's MSI-X vector signals `fd`; `-1` detaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct SetEventfd {
    /// Queue id.
    pub qid: u32,
    /// eventfd, or -1.
    pub fd: i32,
}

/// The read-only status page (mmap at [`MMAP_STATUS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct StatusPage {
    /// [`STATUS_MAGIC`].
    pub magic: u32,
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// The controller's epoch and fault flag in one word ([`ControllerState`]), so one load
    /// sees both as the module last published them: a failed reset can never look like a clean
    /// epoch change.
    pub state: u64,
    /// Pages pinned for registrations, all files together.
    pub pinned_pages: u64,
    /// Live registrations.
    pub registrations: u64,
    /// Live I/O queue pairs.
    pub qpairs: u64,
    /// Controller resets since probe.
    pub resets: u64,
    /// Timeouts since probe: resets begun, whether they completed or not. Each follows a
    /// command that timed out or failed uncleanly: an I/O command of user space (the library
    /// asks for `IOCTL_RESET` then, and only then; a reset asked for by hand counts too) or an
    /// admin command of the module (creating or deleting a queue pair); ABI 5.
    pub timeouts: u64,
    /// dma-buf registrations their exporters revoked since probe (each reset the controller
    /// first, so the epoch moved on with it; published before the epoch): a registration
    /// validated before a change may be revoked; ABI 6.
    pub revocations: u64,
}

const _: () = assert!(core::mem::size_of::<StatusPage>() == 64);
const _: () = assert!(core::mem::offset_of!(StatusPage, state) == 8);

/// [`StatusPage::state`]: bit 0 is set while the controller is faulted (a reset is needed or in
/// progress), bits 63:1 hold the epoch, bumped by every reset (a change means outstanding commands
/// were lost and the queue pairs must be re-armed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ControllerState(pub u64);

impl ControllerState {
    /// The word for `epoch` (below 2^63) and `faulted`.
    pub const fn new(epoch: u64, faulted: bool) -> Self {
        ControllerState(epoch << 1 | faulted as u64)
    }

    /// The epoch.
    pub const fn epoch(self) -> u64 {
        self.0 >> 1
    }

    /// True while the controller is faulted.
    pub const fn faulted(self) -> bool {
        self.0 & 1 != 0
    }
}

/// Value of [`StatusPage::magic`].
pub const STATUS_MAGIC: u32 = 0x5567_6473; // "sdgU"

/// Request: fill a [`DeviceInfo`].
pub const IOCTL_GET_INFO: u32 = ioc(IOC_READ, 0x00, core::mem::size_of::<DeviceInfo>());
/// Request: create a queue pair ([`CreateQpair`]).
pub const IOCTL_CREATE_QPAIR: u32 = ioc(IOC_READ | IOC_WRITE, 0x01, core::mem::size_of::<CreateQpair>());
/// Request: delete a queue pair ([`DeleteQpair`]).
pub const IOCTL_DELETE_QPAIR: u32 = ioc(IOC_WRITE, 0x02, core::mem::size_of::<DeleteQpair>());
/// Request: register host memory ([`RegisterHost`]).
pub const IOCTL_REGISTER_HOST: u32 = ioc(IOC_READ | IOC_WRITE, 0x03, core::mem::size_of::<RegisterHost>());
/// Request: register a dma-buf ([`RegisterDmabuf`]).
pub const IOCTL_REGISTER_DMABUF: u32 = ioc(IOC_READ | IOC_WRITE, 0x04, core::mem::size_of::<RegisterDmabuf>());
/// Request: copy a registration's segments out ([`GetSegments`]).
pub const IOCTL_GET_SEGMENTS: u32 = ioc(IOC_WRITE, 0x05, core::mem::size_of::<GetSegments>());
/// Request: deregister ([`Deregister`]).
pub const IOCTL_DEREGISTER: u32 = ioc(IOC_WRITE, 0x06, core::mem::size_of::<Deregister>());
/// Request: attach or detach a queue's eventfd ([`SetEventfd`]).
pub const IOCTL_SET_EVENTFD: u32 = ioc(IOC_WRITE, 0x07, core::mem::size_of::<SetEventfd>());
/// Request: reset the controller ([`Reset`]: unless one ended since the epoch the caller saw).
/// Afterwards every queue pair is deleted on the controller (its memory zeroed) until its owner
/// re-arms it.
pub const IOCTL_RESET: u32 = ioc(IOC_WRITE, 0x08, core::mem::size_of::<Reset>());
/// Request: re-create a queue pair on the controller after a reset ([`DeleteQpair`] names it),
/// its rings zeroed and empty; a no-op for a queue pair that is live. `EIO` while the controller
/// is faulted.
pub const IOCTL_REARM_QPAIR: u32 = ioc(IOC_WRITE, 0x09, core::mem::size_of::<DeleteQpair>());

/// Request: arm a queue's interrupt ([`DeleteQpair`] names the queue, which must have an
/// eventfd attached, else `EINVAL`): from the first arm on the interrupt is one-shot, signalling
/// the eventfd once, then masked until the next arm (a completion while masked is delivered at
/// the arm). A waiter arms it before it sleeps, so completions reaped by polling raise no
/// interrupt. Before the first arm every interrupt signals. ABI 7.
pub const IOCTL_ARM_IRQ: u32 = ioc(IOC_WRITE, 0x0C, core::mem::size_of::<DeleteQpair>());

/// Request: run one admin command on the module's admin queue ([`AdminCommand`]): only the
/// opcodes of [`ADMIN_ALLOWED`] (Identify, Get Log Page, Get Features), every other one `EACCES`
/// before anything reaches the controller. The module builds the command itself from the
/// allowed fields, transfers into memory of its own and copies `data_len` bytes to `data`
/// (the rules: [`super::args`], `AdminCommand::check`). ABI 5.
pub const IOCTL_ADMIN_CMD: u32 = ioc(IOC_READ | IOC_WRITE, 0x0B, core::mem::size_of::<AdminCommand>());

/// The admin opcodes `ADMIN_CMD` runs, with their names: the ones that only read the
/// controller's state. Everything else (Format NVM, Sanitize, Set Features, Firmware Commit,
/// Namespace Management, queue creation and deletion, vendor commands, ...) changes it.
pub const ADMIN_ALLOWED: [(u8, &str); 3] = [(0x02, "Get Log Page"), (0x06, "Identify"), (0x0A, "Get Features")];

/// The name of an admin opcode `ADMIN_CMD` allows, `None` for every other one.
pub const fn admin_allowed(opcode: u8) -> Option<&'static str> {
    match opcode {
        0x02 => Some(ADMIN_ALLOWED[0].1),
        0x06 => Some(ADMIN_ALLOWED[1].1),
        0x0A => Some(ADMIN_ALLOWED[2].1),
        _ => None,
    }
}

/// Most bytes one `ADMIN_CMD` transfers (also bounded by the controller's MDTS): 64 KiB, the
/// Error Information log of 1024 entries or sixteen Identify pages.
pub const MAX_ADMIN_DATA: u32 = 64 << 10;

/// `ADMIN_CMD` argument: the fields of one admin command that the module copies into the
/// command it builds, the user buffer the data goes to, and the completion's result.
///
/// There is no field for data pointers, a metadata pointer, fused operation or PSDT: the module
/// sets those itself (PRPs to its own memory, nothing else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct AdminCommand {
    /// In: the opcode, one of [`ADMIN_ALLOWED`].
    pub opcode: u8,
    /// Must be zero.
    pub flags: u8,
    /// Must be zero.
    pub reserved0: u16,
    /// In: namespace id.
    pub nsid: u32,
    /// In: command dwords 10 to 15 (Get Log Page: the module sets NUMDL/NUMDU from `data_len`
    /// and RAE).
    pub cdw: [u32; 6],
    /// In: bytes to transfer to `data` (Identify: 4096; Get Log Page: 4..=the bound, a multiple
    /// of 4; Get Features: 0..=4096, a multiple of 4).
    pub data_len: u32,
    /// Must be zero.
    pub reserved1: u32,
    /// In: user address of `data_len` writable bytes (ignored when `data_len` is 0).
    pub data: u64,
    /// Out: completion dword 0 (Get Features: the feature's value).
    pub result: u32,
    /// Out: the completion's status field (DW3 bits 31:17: SC, SCT, CRD, More, DNR); 0 is
    /// success. With a non-zero status nothing is copied to `data`.
    pub status: u32,
}

const _: () = assert!(core::mem::size_of::<AdminCommand>() == 56);
const _: () = assert!(core::mem::offset_of!(AdminCommand, nsid) == 4);
const _: () = assert!(core::mem::offset_of!(AdminCommand, cdw) == 8);
const _: () = assert!(core::mem::offset_of!(AdminCommand, data_len) == 32);
const _: () = assert!(core::mem::offset_of!(AdminCommand, data) == 40);
const _: () = assert!(core::mem::offset_of!(AdminCommand, result) == 48);
const _: () = assert!(core::mem::offset_of!(AdminCommand, status) == 52);

/// One open file of a controller, as [`IOCTL_LIST_OPENERS`] reports it (ABI 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct Opener {
    /// The id (thread group id) of the process that opened the file, read at open, as seen from
    /// that process's own pid namespace (once it has exited, the number may be another's).
    pub tgid: u32,
    /// [`OPENER_EXCLUSIVE`] when opened with `O_EXCL`.
    pub flags: u32,
    /// Live I/O queue pairs this file created.
    pub qpairs: u32,
    /// Live registrations this file made.
    pub registrations: u32,
    /// Bytes of host memory this file pinned (its host registrations).
    pub pinned_bytes: u64,
    /// Bytes of dma-buf memory (GPU memory, udmabuf, dma-heap) this file mapped for the controller.
    pub dmabuf_bytes: u64,
}

const _: () = assert!(core::mem::size_of::<Opener>() == 32);
const _: () = assert!(core::mem::offset_of!(Opener, pinned_bytes) == 16);

/// [`Opener::flags`]: the file holds the controller exclusively.
pub const OPENER_EXCLUSIVE: u32 = 1 << 0;

/// `LIST_OPENERS` argument: copy up to `capacity` [`Opener`]s to `openers`; `count` comes back
/// as the number of open files (which may exceed `capacity`: call again with more room). The
/// ioctl returns how many it copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct ListOpeners {
    /// In: room in `openers`, at most [`MAX_OPENERS`].
    pub capacity: u32,
    /// Out: open files of the controller (the caller's own included).
    pub count: u32,
    /// In: user pointer to `capacity` [`Opener`]s (may be 0 when `capacity` is 0).
    pub openers: u64,
}

const _: () = assert!(core::mem::size_of::<ListOpeners>() == 16);

/// Most openers one `LIST_OPENERS` call copies.
pub const MAX_OPENERS: u32 = 4096;

/// Request: list the controller's open files with what each owns ([`ListOpeners`]); any opener
/// of the node may ask (ABI 5).
pub const IOCTL_LIST_OPENERS: u32 = ioc(IOC_READ | IOC_WRITE, 0x0A, core::mem::size_of::<ListOpeners>());

/// mmap region kinds, encoded in the offset by [`mmap_offset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MmapKind {
    /// The doorbell page(s), uncached, read-write.
    Doorbells = 1,
    /// The status page, read-only.
    Status = 2,
    /// A queue pair's SQ.
    Sq = 3,
    /// A queue pair's CQ.
    Cq = 4,
    /// A queue pair's PRP-list pool.
    PrpPool = 5,
    /// The shadow doorbell page (one page, the doorbells' layout from offset 0), read-write;
    /// only where [`DEVICE_SHADOW_DOORBELLS`] is set.
    ShadowDoorbells = 6,
    /// The event index page the controller writes (same layout), read-only; only where
    /// [`DEVICE_SHADOW_DOORBELLS`] is set.
    EventIndexes = 7,
}

impl MmapKind {
    /// Decodes a kind byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(MmapKind::Doorbells),
            2 => Some(MmapKind::Status),
            3 => Some(MmapKind::Sq),
            4 => Some(MmapKind::Cq),
            5 => Some(MmapKind::PrpPool),
            6 => Some(MmapKind::ShadowDoorbells),
            7 => Some(MmapKind::EventIndexes),
            _ => None,
        }
    }
}

/// The mmap offset of a region: kind in bits 47:40, queue id in bits 39:24 (page aligned).
pub const fn mmap_offset(kind: MmapKind, qid: u16) -> u64 {
    (kind as u64) << 40 | (qid as u64) << 24
}

/// Splits an mmap offset into kind and queue id; `None` when the offset is not one of ours.
pub const fn parse_mmap_offset(off: u64) -> Option<(MmapKind, u16)> {
    if off & ((1 << 24) - 1) != 0 || off >> 48 != 0 {
        return None;
    }
    match MmapKind::from_u8((off >> 40) as u8) {
        // CAST: 16-bit field.
        Some(k) => Some((k, (off >> 24) as u16)),
        None => None,
    }
}

/// The mmap offset of the doorbells.
pub const MMAP_DOORBELLS: u64 = mmap_offset(MmapKind::Doorbells, 0);
/// The mmap offset of the status page.
pub const MMAP_STATUS: u64 = mmap_offset(MmapKind::Status, 0);
/// The mmap offset of the shadow doorbell page.
pub const MMAP_SHADOW_DOORBELLS: u64 = mmap_offset(MmapKind::ShadowDoorbells, 0);
/// The mmap offset of the event index page.
pub const MMAP_EVENT_INDEXES: u64 = mmap_offset(MmapKind::EventIndexes, 0);
