//! The C ABI's types, constants and error codes: uGDS's public header, name for name and value
//! for value (`include/ugds.h` is generated from this file and `c-abi/src/lib.rs`).
//!
//! Structures the caller fills in are read through `Raw*` mirrors whose enum and `bool` fields
//! are plain integers: a C caller may store any value there, and reading it as a Rust enum or
//! `bool` would be undefined behaviour. The header still shows uGDS's field types (the mirrors'
//! wrapper types are renamed to them by the header generator, `xtask/src/clib.rs`).
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

/// Library error codes start above this (`IS_UGDS_ERR`).
pub const UGDS_BASE_ERR: c_int = 5000;
/// `uGDSBufRegister` flag: the memory is dma-buf backed (GPU memory exported by its runtime).
pub const NVM_MAP_DMABUF: c_int = 0x1;
/// `uGDSBufRegister` flag: keep the dma-buf for RDMA registration (`uGDSRDMARegister`).
pub const NVM_MAP_RDMA: c_int = 0x2;
/// `uGDSBufRegister` flag: treat the memory as CUDA memory without probing.
pub const NVM_MAP_FORCE_CUDA: c_int = 0x4;
/// `uGDSBufRegister` flag: register through dma-buf (same bit as `NVM_MAP_DMABUF`).
pub const UGDS_REGISTER_DMABUF: c_int = NVM_MAP_DMABUF;
/// Most segments in one vectored call (`uGDSReadv`, `uGDSReadvAsync`).
pub const UGDS_IOV_MAX: c_uint = 1024;
/// Most segments in one vectored batch entry.
pub const UGDS_BATCH_IOV_MAX: c_uint = 128;

/// Status codes: 0, then uGDS's numbering from `UGDS_BASE_ERR`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum uGDSOpError {
    UGDS_SUCCESS = 0,
    UGDS_DRIVER_NOT_INITIALIZED = 5001,
    UGDS_DRIVER_INVALID_PROPS = 5002,
    UGDS_DRIVER_UNSUPPORTED_LIMIT = 5003,
    UGDS_DRIVER_VERSION_MISMATCH = 5004,
    UGDS_DRIVER_VERSION_READ_ERROR = 5005,
    UGDS_DRIVER_CLOSING = 5006,
    UGDS_PLATFORM_NOT_SUPPORTED = 5007,
    UGDS_IO_NOT_SUPPORTED = 5008,
    UGDS_DEVICE_NOT_SUPPORTED = 5009,
    UGDS_NVFS_DRIVER_ERROR = 5010,
    UGDS_CUDA_DRIVER_ERROR = 5011,
    UGDS_CUDA_POINTER_INVALID = 5012,
    UGDS_CUDA_MEMORY_TYPE_INVALID = 5013,
    UGDS_CUDA_POINTER_RANGE_ERROR = 5014,
    UGDS_CUDA_CONTEXT_MISMATCH = 5015,
    UGDS_INVALID_MAPPING_SIZE = 5016,
    UGDS_INVALID_MAPPING_RANGE = 5017,
    UGDS_INVALID_FILE_TYPE = 5018,
    UGDS_INVALID_FILE_OPEN_FLAG = 5019,
    UGDS_DIO_NOT_SET = 5020,
    UGDS_INVALID_VALUE = 5022,
    UGDS_MEMORY_ALREADY_REGISTERED = 5023,
    UGDS_MEMORY_NOT_REGISTERED = 5024,
    UGDS_PERMISSION_DENIED = 5025,
    UGDS_DRIVER_ALREADY_OPEN = 5026,
    UGDS_HANDLE_NOT_REGISTERED = 5027,
    UGDS_HANDLE_ALREADY_REGISTERED = 5028,
    UGDS_DEVICE_NOT_FOUND = 5029,
    UGDS_INTERNAL_ERROR = 5030,
    UGDS_GETNEWFD_FAILED = 5031,
    UGDS_NVFS_SETUP_ERROR = 5033,
    UGDS_IO_DISABLED = 5034,
    UGDS_GPU_MEMORY_PINNING_FAILED = 5036,
    UGDS_BATCH_CAPACITY_EXCEEDED = 5040,
    UGDS_RDMA_MR_STILL_ACTIVE = 5041,
    UGDS_BUSY = 5042,
    UGDS_OUT_OF_MEMORY = 5043,
}

/// A status: the library's code, and the GPU driver's code when that is the cause.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct uGDSError {
    /// The library's code.
    pub err: uGDSOpError,
    /// The GPU driver's code (`CUresult`), 0 when not applicable.
    pub cu_err: c_int,
}

/// uGDS's name for [`uGDSError`].
pub type uGDSError_t = uGDSError;

/// What a descriptor's handle is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum uGDSHandleType {
    UGDS_HANDLE_TYPE_OPAQUE_FD = 1,
    UGDS_HANDLE_TYPE_OPAQUE_WIN32 = 2,
    UGDS_HANDLE_TYPE_USERSPACE_FS = 3,
}

/// An `enum uGDSHandleType` field as the caller stored it (any int).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleTypeField(pub c_int);

/// The descriptor's handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub union uGDSDescrHandle {
    /// A file descriptor: a ugds node `/dev/ugds_drvN` (direct path), a regular file or a
    /// block device (fallback path).
    pub fd: c_int,
    /// Other handle kinds (not supported).
    pub handle: *mut c_void,
}

/// What `uGDSHandleRegister` registers.
///
/// cbindgen:field-names=[type, handle]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct uGDSDescr_t {
    /// Must be `UGDS_HANDLE_TYPE_OPAQUE_FD`.
    pub type_: HandleTypeField,
    /// The descriptor.
    pub handle: uGDSDescrHandle,
}

/// A registered file or device (a generation-checked table slot, not an address).
pub type uGDSHandle_t = *mut c_void;
/// A batch (a generation-checked table slot, not an address).
pub type uGDSBatchHandle_t = *mut c_void;

/// Which GPU runtime a buffer or stream belongs to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum uGDSBackend {
    UGDS_BACKEND_DEFAULT = 0,
    UGDS_BACKEND_CUDA = 1,
    UGDS_BACKEND_HIP = 2,
}

/// uGDS's name for [`uGDSBackend`].
pub type uGDSBackend_t = uGDSBackend;

/// A `uGDSBackend_t` argument or field as the caller passed it (any int).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendArg(pub c_int);

impl BackendArg {
    /// The backend, when the value names one.
    pub fn get(self) -> Option<uGDSBackend> {
        match self.0 {
            0 => Some(uGDSBackend::UGDS_BACKEND_DEFAULT),
            1 => Some(uGDSBackend::UGDS_BACKEND_CUDA),
            2 => Some(uGDSBackend::UGDS_BACKEND_HIP),
            _ => None,
        }
    }
}

/// A C `bool` field as the caller stored it (any byte).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoolField(pub u8);

/// Options of `uGDSBufRegisterEx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSBufConfig {
    /// The runtime (DEFAULT: detect from the pointer).
    pub backend: BackendArg,
    /// The buffer will be exported with `uGDSExportDmabuf` / `uGDSRDMARegister`.
    pub enable_export: BoolField,
}

/// uGDS's name for [`uGDSBufConfig`].
pub type uGDSBufConfig_t = uGDSBufConfig;

/// A dma-buf exported by `uGDSExportDmabuf`; the caller owns `fd` and closes it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSDmabufExport {
    /// The dma-buf.
    pub fd: c_int,
    /// Where the buffer starts in it.
    pub offset: u64,
    /// Its length.
    pub length: usize,
}

/// uGDS's name for [`uGDSDmabufExport`].
pub type uGDSDmabufExport_t = uGDSDmabufExport;

/// A memory region registered with an RDMA device by `uGDSRDMARegister`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSRDMARegion {
    /// The verbs memory region (`struct ibv_mr *`).
    pub mr: *mut c_void,
    /// Its I/O virtual address (the buffer's address).
    pub iova: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// The library's token for this registration (checked by `uGDSRDMAUnregister`).
    pub token: u64,
}

/// uGDS's name for [`uGDSRDMARegion`].
pub type uGDSRDMARegion_t = uGDSRDMARegion;

/// Direction of a batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum uGDSOpcode {
    UGDS_READ = 0,
    UGDS_WRITE = 1,
}

/// uGDS's name for [`uGDSOpcode`].
pub type uGDSOpcode_t = uGDSOpcode;

/// A `uGDSOpcode_t` field as the caller stored it (any int).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeField(pub c_int);

/// State of a batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum uGDSBatchStatus {
    UGDS_BATCH_WAITING = 0x01,
    UGDS_BATCH_PENDING = 0x02,
    UGDS_BATCH_INVALID = 0x04,
    UGDS_BATCH_COMPLETE = 0x10,
    UGDS_BATCH_TIMEOUT = 0x20,
    UGDS_BATCH_FAILED = 0x40,
}

/// uGDS's name for [`uGDSBatchStatus`].
pub type uGDSBatchStatus_t = uGDSBatchStatus;

/// One batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSIOParams {
    /// Base of a registered buffer.
    pub devPtr_base: *mut c_void,
    /// Offset in the file.
    pub file_offset: libc::off_t,
    /// Offset from `devPtr_base`.
    pub devPtr_offset: libc::off_t,
    /// Bytes.
    pub size: usize,
    /// Read or write.
    pub opcode: OpcodeField,
    /// Returned with the entry's event.
    pub cookie: *mut c_void,
}

/// uGDS's name for [`uGDSIOParams`].
pub type uGDSIOParams_t = uGDSIOParams;

/// A completion event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSIOEvents {
    /// The entry's cookie.
    pub cookie: *mut c_void,
    /// Its state.
    pub status: uGDSBatchStatus,
    /// Bytes transferred, or a negative errno.
    pub ret: libc::ssize_t,
}

/// uGDS's name for [`uGDSIOEvents`].
pub type uGDSIOEvents_t = uGDSIOEvents;

/// One segment of a vectored I/O: `size` bytes at `offset` in the registration whose base is
/// `base`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSIoSegment {
    /// A registered buffer's base (the exact pointer passed to `uGDSBufRegister`).
    pub base: *mut c_void,
    /// Offset in that registration.
    pub offset: libc::off_t,
    /// Bytes.
    pub size: usize,
}

/// uGDS's name for [`uGDSIoSegment`].
pub type uGDSIoSegment_t = uGDSIoSegment;

/// One vectored batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uGDSIOSegParams {
    /// The segments (copied at submit).
    pub segs: *const uGDSIoSegment,
    /// How many (at most `UGDS_BATCH_IOV_MAX`).
    pub nr_segs: c_uint,
    /// Where the first segment's data is in the file; the rest follow contiguously.
    pub file_offset: libc::off_t,
    /// Read or write.
    pub opcode: OpcodeField,
    /// Returned with the entry's event.
    pub cookie: *mut c_void,
}

/// uGDS's name for [`uGDSIOSegParams`].
pub type uGDSIOSegParams_t = uGDSIOSegParams;

/// The message for a code (a `uGDSOpError`, or a negative return value of read/write).
pub fn message(code: i64) -> &'static std::ffi::CStr {
    use uGDSOpError::*;
    // unsigned_abs: i64::MIN has no positive counterpart.
    let code = code.unsigned_abs() as i64;
    let table: &[(uGDSOpError, &std::ffi::CStr)] = &[
        (UGDS_SUCCESS, c"success"),
        (UGDS_DRIVER_NOT_INITIALIZED, c"driver not initialized"),
        (UGDS_DRIVER_INVALID_PROPS, c"invalid driver properties"),
        (UGDS_DRIVER_UNSUPPORTED_LIMIT, c"driver limit not supported"),
        (UGDS_DRIVER_VERSION_MISMATCH, c"kernel module and library ABI versions differ"),
        (UGDS_DRIVER_VERSION_READ_ERROR, c"cannot read the kernel module's version"),
        (UGDS_DRIVER_CLOSING, c"driver is closing"),
        (UGDS_PLATFORM_NOT_SUPPORTED, c"not supported on this platform"),
        (UGDS_IO_NOT_SUPPORTED, c"I/O not supported on this file"),
        (UGDS_DEVICE_NOT_SUPPORTED, c"device not supported"),
        (UGDS_NVFS_DRIVER_ERROR, c"kernel module error"),
        (UGDS_CUDA_DRIVER_ERROR, c"GPU driver error (see cu_err)"),
        (UGDS_CUDA_POINTER_INVALID, c"invalid GPU pointer"),
        (UGDS_CUDA_MEMORY_TYPE_INVALID, c"invalid GPU memory type"),
        (UGDS_CUDA_POINTER_RANGE_ERROR, c"GPU pointer range error"),
        (UGDS_CUDA_CONTEXT_MISMATCH, c"GPU context mismatch"),
        (UGDS_INVALID_MAPPING_SIZE, c"invalid mapping size"),
        (UGDS_INVALID_MAPPING_RANGE, c"invalid mapping range"),
        (UGDS_INVALID_FILE_TYPE, c"not a ugds node (/dev/ugds_drvN), regular file or block device"),
        (UGDS_INVALID_FILE_OPEN_FLAG, c"invalid file open flags"),
        (UGDS_DIO_NOT_SET, c"O_DIRECT not set"),
        (UGDS_INVALID_VALUE, c"invalid argument"),
        (UGDS_MEMORY_ALREADY_REGISTERED, c"memory already registered"),
        (UGDS_MEMORY_NOT_REGISTERED, c"memory not registered"),
        (UGDS_PERMISSION_DENIED, c"permission denied"),
        (UGDS_DRIVER_ALREADY_OPEN, c"driver already open"),
        (UGDS_HANDLE_NOT_REGISTERED, c"handle not registered"),
        (UGDS_HANDLE_ALREADY_REGISTERED, c"handle already registered"),
        (UGDS_DEVICE_NOT_FOUND, c"device not found"),
        (UGDS_INTERNAL_ERROR, c"internal error"),
        (UGDS_GETNEWFD_FAILED, c"cannot open a new file descriptor"),
        (UGDS_NVFS_SETUP_ERROR, c"kernel module setup error"),
        (UGDS_IO_DISABLED, c"I/O disabled"),
        (UGDS_GPU_MEMORY_PINNING_FAILED, c"GPU memory cannot be registered for DMA (dma-buf export failed)"),
        (UGDS_BATCH_CAPACITY_EXCEEDED, c"more entries than the batch's free capacity"),
        (UGDS_RDMA_MR_STILL_ACTIVE, c"an RDMA memory region still uses the buffer"),
        (UGDS_BUSY, c"I/O in flight"),
        (UGDS_OUT_OF_MEMORY, c"out of memory"),
    ];
    if let Some((_, m)) = table.iter().find(|(e, _)| *e as i64 == code) {
        return m;
    }
    // A negative errno from read/write.
    let errnos: &[(c_int, &std::ffi::CStr)] = &[
        (libc::EINVAL, c"invalid argument (size, offset or alignment)"),
        (libc::EIO, c"I/O error (the device failed the command)"),
        (libc::ETIMEDOUT, c"the command timed out (the controller was reset)"),
        (libc::EBUSY, c"busy"),
        (libc::EAGAIN, c"the controller was reset or is faulted: retry"),
        (libc::ENOMEM, c"out of memory"),
        (libc::EBADF, c"bad file descriptor"),
        (libc::ENOSPC, c"no space left"),
        (libc::EOPNOTSUPP, c"not supported here"),
        (libc::ENODEV, c"no such device"),
        (libc::EFAULT, c"bad address"),
        (
            libc::EBADFD,
            c"the handle or buffer was registered by the parent process before fork(); open the driver and register it again in this process",
        ),
    ];
    match errnos.iter().find(|(e, _)| *e as i64 == code) {
        Some((_, m)) => m,
        None if code < 4096 => c"operating-system error",
        None => c"unknown error code",
    }
}
