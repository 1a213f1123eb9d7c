//! The C ABI's types and error codes: uGDS's names with cuFile's layouts and numbering.

use std::ffi::{c_int, c_void};

/// Error codes: 0, then cuFile's numbering from 5000 with cuFile's names.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
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
    UGDS_BATCH_SUBMIT_FAILED = 5035,
    UGDS_GPU_MEMORY_PINNING_FAILED = 5036,
    UGDS_BATCH_FULL = 5037,
    UGDS_ASYNC_NOT_SUPPORTED = 5038,
    UGDS_BATCH_CAPACITY_EXCEEDED = 5040,
    UGDS_BUSY = 5042,
    UGDS_OUT_OF_MEMORY = 5043,
}

/// A status: the library code, and the GPU driver's code when that is the cause.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct uGDSError_t {
    /// The library's code.
    pub err: uGDSOpError,
    /// The GPU driver's code (CUresult), 0 when not applicable.
    pub cu_err: c_int,
}

impl uGDSError_t {
    pub(crate) const OK: uGDSError_t = uGDSError_t { err: uGDSOpError::UGDS_SUCCESS, cu_err: 0 };
    pub(crate) fn of(err: uGDSOpError) -> uGDSError_t {
        uGDSError_t { err, cu_err: 0 }
    }
}

/// What a descriptor's handle is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum uGDSHandleType {
    UGDS_HANDLE_TYPE_OPAQUE_FD = 1,
    UGDS_HANDLE_TYPE_OPAQUE_WIN32 = 2,
    UGDS_HANDLE_TYPE_USERSPACE_FS = 3,
}

/// The descriptor's handle.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub union uGDSDescrHandle {
    /// A file descriptor: `/dev/ugdsN` (direct path), a regular file or a block device
    /// (fallback path).
    pub fd: c_int,
    /// Other handle kinds (not supported).
    pub handle: *mut c_void,
}

/// What `uGDSHandleRegister` registers.
///
/// cbindgen:field-names=[type, handle]
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct uGDSDescr_t {
    /// Must be `UGDS_HANDLE_TYPE_OPAQUE_FD`.
    pub type_: uGDSHandleType,
    /// The descriptor.
    pub handle: uGDSDescrHandle,
}

/// A registered file or device.
#[allow(non_camel_case_types)]
pub type uGDSHandle_t = *mut c_void;
/// A batch.
#[allow(non_camel_case_types)]
pub type uGDSBatchHandle_t = *mut c_void;

/// Direction of a batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum uGDSOpcode_t {
    UGDS_READ = 0,
    UGDS_WRITE = 1,
}

/// One batch entry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types, non_snake_case)]
pub struct uGDSIOParams_t {
    /// Base of a registered buffer.
    pub devPtr_base: *mut c_void,
    /// Offset in the file.
    pub file_offset: libc::off_t,
    /// Offset from `devPtr_base`.
    pub devPtr_offset: libc::off_t,
    /// Bytes.
    pub size: usize,
    /// Read or write.
    pub opcode: uGDSOpcode_t,
    /// Returned with the event.
    pub cookie: *mut c_void,
}

/// State of a batch entry (cuFile's values).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum uGDSBatchStatus_t {
    UGDS_BATCH_WAITING = 0x01,
    UGDS_BATCH_PENDING = 0x02,
    UGDS_BATCH_INVALID = 0x04,
    UGDS_BATCH_CANCELED = 0x08,
    UGDS_BATCH_COMPLETE = 0x10,
    UGDS_BATCH_TIMEOUT = 0x20,
    UGDS_BATCH_FAILED = 0x40,
}

/// A completion event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct uGDSIOEvents_t {
    /// The entry's cookie.
    pub cookie: *mut c_void,
    /// Its state.
    pub status: uGDSBatchStatus_t,
    /// Bytes transferred, or a negative errno / library code.
    pub ret: libc::ssize_t,
}

/// Which GPU runtime a buffer belongs to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum uGDSBackend_t {
    UGDS_BACKEND_DEFAULT = 0,
    UGDS_BACKEND_CUDA = 1,
    UGDS_BACKEND_HIP = 2,
}

/// Options of `uGDSBufRegisterEx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct uGDSBufConfig_t {
    /// The runtime (DEFAULT: detect from the pointer).
    pub backend: uGDSBackend_t,
    /// The buffer will be exported with `uGDSExportDmabuf` (it must then be page aligned).
    pub enable_export: bool,
}

/// A dma-buf exported by `uGDSExportDmabuf`; the caller owns `fd`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct uGDSDmabufExport_t {
    /// The dma-buf.
    pub fd: c_int,
    /// Where the buffer starts in it.
    pub offset: u64,
    /// Its length.
    pub length: usize,
}

/// The message for a code (a `uGDSOpError`, or a negative return value of read/write).
pub fn message(code: i64) -> &'static std::ffi::CStr {
    use uGDSOpError::*;
    let code = code.abs();
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
        (UGDS_INVALID_FILE_TYPE, c"not a /dev/ugdsN node, regular file or block device"),
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
        (UGDS_BATCH_SUBMIT_FAILED, c"batch submit failed"),
        (UGDS_GPU_MEMORY_PINNING_FAILED, c"GPU memory cannot be registered for DMA (dma-buf export failed)"),
        (UGDS_BATCH_FULL, c"batch full"),
        (UGDS_ASYNC_NOT_SUPPORTED, c"async I/O not supported"),
        (UGDS_BATCH_CAPACITY_EXCEEDED, c"more entries than the batch's free capacity"),
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
    ];
    match errnos.iter().find(|(e, _)| *e as i64 == code) {
        Some((_, m)) => m,
        None if code < 4096 => c"operating-system error",
        None => c"unknown error code",
    }
}
