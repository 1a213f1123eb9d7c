//! `libugds.so`: uGDS's C API, function for function (uGDS's public header `include/ugds.h`,
//! the version with vectored I/O and RDMA). Each function checks what uGDS checks, in uGDS's
//! order, and calls the shared core in the `ugds` crate ([`Library`] with [`Face::Ugds`]). Our
//! extensions are named `ugdsx*`, so they can never collide with a uGDS function.
//!
//! A crate of its own, so that a Rust program using `ugds` links no C symbols and builds no
//! C library: this one builds `libugds_c.so` and `libugds_c.a`, which `cargo xtask install-lib`
//! installs as `libugds.so.0` (the SONAME this crate's build script gives it) and `libugds.a`.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::IntoRawFd;
use std::sync::LazyLock;
use ugds::capi::uGDSOpError::*;
use ugds::capi::*;
use ugds::capi::{stream_key as key, LateArgs, LateSegs};
use ugds::capi::{CResult, Fail};
use ugds::capi::{Entry, EventStatus};
use ugds::capi::{Face, Library};

/// The process's uGDS library state. Made on the first call, which also gives the library's
/// diagnostics a sink on stderr (a C program installs no `log` logger of its own).
static UGDS: LazyLock<Library> = LazyLock::new(|| {
    ugds::logging::log_to_stderr(log::LevelFilter::Warn);
    Library::new(Face::Ugds)
});

/// Success.
const OK: uGDSError = uGDSError { err: UGDS_SUCCESS, cu_err: 0 };

fn lib() -> &'static Library {
    &UGDS
}

fn status(r: CResult<()>) -> uGDSError_t {
    match r {
        Ok(()) => OK,
        Err(f) => f.status(),
    }
}

/// A status with no GPU driver code.
fn code(err: uGDSOpError) -> uGDSError_t {
    uGDSError { err, cu_err: 0 }
}

/// Opens the library. Idempotent: opening again succeeds (no reference count).
#[no_mangle]
pub extern "C" fn uGDSDriverOpen() -> uGDSError_t {
    status(lib().driver_open())
}

/// Closes the library: releases every buffer registration (refused with `UGDS_BUSY` while I/O
/// runs on one, `UGDS_RDMA_MR_STILL_ACTIVE` while RDMA regions use one). Handles stay
/// registered; streams are not touched. `UGDS_DRIVER_NOT_INITIALIZED` when not open.
#[no_mangle]
pub extern "C" fn uGDSDriverClose() -> uGDSError_t {
    status(lib().driver_close())
}

/// Registers a file descriptor: a ugds node `/dev/ugds_drvN` (direct path, namespace 1), a
/// regular file or a block device (fallback path, through a descriptor of the library's own
/// opened with O_DIRECT). The handle points at the registered descriptor (`*(int *)fh`).
///
/// # Safety
///
/// `fh` and `descr` must be NULL or valid pointers.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegister(fh: *mut uGDSHandle_t, descr: *mut uGDSDescr_t) -> uGDSError_t {
    if fh.is_null() || descr.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    // SAFETY: non-null; the type field is read as the int the caller stored.
    let (kind, fd) = unsafe { ((*descr).type_.0, (*descr).handle.fd) };
    if kind != uGDSHandleType::UGDS_HANDLE_TYPE_OPAQUE_FD as c_int {
        return code(UGDS_INVALID_FILE_TYPE);
    }
    match lib().handle_register(fd) {
        Ok(h) => {
            // SAFETY: checked non-null.
            unsafe { *fh = h as uGDSHandle_t };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Registers a target by name (our extension): a ugds node, a striped volume
/// `stripe:[CHUNK:]NODE,NODE,...`, a volume descriptor file `*.ugds-volume`, a regular file or
/// a block device, opened as the Rust `Storage::open` opens it. The handle's descriptor
/// (`*(int *)fh`) is -1.
/// `UGDS_INVALID_VALUE` for NULL pointers or a name that is not UTF-8; an unopenable target
/// gives the library's error (`ugdsxErrorString` names it).
///
/// # Safety
///
/// `fh` must be NULL or valid; `target` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ugdsxHandleRegisterTarget(fh: *mut uGDSHandle_t, target: *const c_char) -> uGDSError_t {
    if fh.is_null() || target.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let Ok(name) = unsafe { std::ffi::CStr::from_ptr(target) }.to_str() else {
        return code(UGDS_INVALID_VALUE);
    };
    match lib().handle_register_target(name) {
        Ok(h) => {
            // SAFETY: checked non-null.
            unsafe { *fh = h as uGDSHandle_t };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Registers a namespace of the kernel's NVMe over Fabrics initiator (`fd` open on
/// `/dev/nvmeXnY` of a tcp or rdma controller), as uGDS's NVMe-oF handles: I/O goes through
/// ugds's own user-space controller on the same subsystem, or, when it cannot connect, through
/// the kernel's block device. `UGDS_INVALID_FILE_TYPE` for a descriptor of anything else,
/// `UGDS_INVALID_VALUE` for NULL or a closed descriptor. `*(int *)fh` is `fd`.
///
/// # Safety
///
/// `fh` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegisterNvmeof(fh: *mut uGDSHandle_t, fd: c_int) -> uGDSError_t {
    // SAFETY: the caller's contract on `fh` is ours.
    unsafe { uGDSHandleRegisterNvmeofEx(fh, fd, 0) }
}

/// [`uGDSHandleRegisterNvmeof`] with uGDS's flags. Every flag value is accepted: its one flag,
/// `UGDS_NVMEOF_GPU_DIRECT`, asks for what ugds always does (its own initiator, with GPU memory
/// registered with the NIC where the transport and NIC allow, otherwise staged), so the flags
/// change nothing, and uGDS's value of that flag (not published in any header we could read)
/// does not matter.
///
/// # Safety
///
/// `fh` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegisterNvmeofEx(fh: *mut uGDSHandle_t, fd: c_int, flags: c_uint) -> uGDSError_t {
    let _ = flags;
    if fh.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    match lib().handle_register_nvmeof(fd) {
        Ok(h) => {
            // SAFETY: checked non-null.
            unsafe { *fh = h as uGDSHandle_t };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Deregisters a handle, waiting for its I/O. NULL and unknown handles are ignored.
#[no_mangle]
pub extern "C" fn uGDSHandleDeregister(fh: uGDSHandle_t) {
    let _ = lib().handle_deregister(fh as usize, -1);
}

/// Deregisters a handle: `timeout_sec` 0 checks once (`UGDS_BUSY` while I/O or a batch is
/// pending), -1 waits as long as it takes, n > 0 waits up to n seconds, below -1 tears down
/// without waiting (after a controller reset). NULL and unknown handles succeed.
#[no_mangle]
pub extern "C" fn uGDSHandleDeregisterEx(fh: uGDSHandle_t, timeout_sec: c_int) -> uGDSError_t {
    status(lib().handle_deregister(fh as usize, timeout_sec))
}

/// The capacity in bytes of the namespace or file behind a handle.
///
/// # Safety
///
/// `capacity_bytes` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSGetDeviceCapacity(fh: uGDSHandle_t, capacity_bytes: *mut u64) -> uGDSError_t {
    if fh.is_null() || capacity_bytes.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    let Some(h) = lib().handle(fh as usize) else { return code(UGDS_HANDLE_NOT_REGISTERED) };
    match h.storage.capacity() {
        Ok(0) => code(UGDS_INTERNAL_ERROR),
        Ok(n) => {
            // SAFETY: checked non-null.
            unsafe { *capacity_bytes = n };
            OK
        }
        Err(e) => Fail::Lib(e).status(),
    }
}

/// Registers memory: GPU memory (CUDA or HIP, detected from the pointer), or page-aligned host
/// memory (a ugds extension: uGDS registers GPU memory only). `flags`: `NVM_MAP_DMABUF` (HIP
/// memory, through its dma-buf; `UGDS_IO_NOT_SUPPORTED` where no HIP runtime loads),
/// `NVM_MAP_RDMA` (keep exportable), `NVM_MAP_FORCE_CUDA`.
///
/// # Safety
///
/// `[bufPtr_base, +length)` must stay allocated until `uGDSBufDeregister`.
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegister(bufPtr_base: *const c_void, length: usize, flags: c_int) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if flags & !(NVM_MAP_DMABUF | NVM_MAP_RDMA | NVM_MAP_FORCE_CUDA) != 0
        || flags & (NVM_MAP_DMABUF | NVM_MAP_FORCE_CUDA) == (NVM_MAP_DMABUF | NVM_MAP_FORCE_CUDA)
    {
        return code(UGDS_INVALID_VALUE);
    }
    if flags & NVM_MAP_DMABUF != 0 {
        // The HIP path: HIP memory, registered through its dma-buf where the storage takes one.
        if ugds::capi::hip().is_none() {
            return code(UGDS_IO_NOT_SUPPORTED);
        }
        // SAFETY: forwarded.
        return status(unsafe { register_on_hip(bufPtr_base as usize, length, flags & NVM_MAP_RDMA != 0) });
    }
    // SAFETY: forwarded.
    status(unsafe {
        register(bufPtr_base as usize, length, flags & NVM_MAP_FORCE_CUDA != 0, flags & NVM_MAP_RDMA != 0)
    })
}

/// Registers with the GPU runtime decided by the pointer (CUDA, then HIP), or CUDA's (forced).
unsafe fn register(base: usize, len: usize, force_cuda: bool, export: bool) -> CResult<()> {
    let _caller = ugds::gpu::cuda::CallerContext::keep();
    if base == 0 || len == 0 {
        return Err(Fail::Code(UGDS_INVALID_VALUE));
    }
    if force_cuda {
        // The context that owns the memory (any device), not the caller's.
        let Some(cuda) = ugds::gpu::cuda::gpu_of_pointer(base as u64).ok().flatten() else {
            return Err(Fail::Code(UGDS_CUDA_MEMORY_TYPE_INVALID));
        };
        // SAFETY: forwarded from the caller.
        return unsafe { register_on_gpu(base, len, cuda, export) };
    }
    let gpu = ugds::capi::gpu_of(base);
    // SAFETY: forwarded from the caller.
    unsafe { lib().buf_register(base, len, gpu, export) }
}

/// Registers memory that must be HIP device memory, on the device that holds it
/// (`UGDS_CUDA_MEMORY_TYPE_INVALID` when it is not HIP memory).
unsafe fn register_on_hip(base: usize, len: usize, export: bool) -> CResult<()> {
    if base == 0 || len == 0 {
        return Err(Fail::Code(UGDS_INVALID_VALUE));
    }
    let Some(gpu) = ugds::gpu::hip::gpu_of_pointer(base as u64).ok().flatten() else {
        return Err(Fail::Code(UGDS_CUDA_MEMORY_TYPE_INVALID));
    };
    // SAFETY: forwarded from the caller.
    unsafe { register_on_gpu(base, len, gpu, export) }
}

/// Registers memory that must be device memory of `gpu` (`UGDS_CUDA_MEMORY_TYPE_INVALID`, the
/// memory-type error, when it is not).
unsafe fn register_on_gpu(base: usize, len: usize, gpu: std::sync::Arc<ugds::gpu::Gpu>, export: bool) -> CResult<()> {
    if base == 0 || len == 0 {
        return Err(Fail::Code(UGDS_INVALID_VALUE));
    }
    if !gpu.runtime().is_device_memory(base as u64) {
        return Err(Fail::Code(UGDS_CUDA_MEMORY_TYPE_INVALID));
    }
    // SAFETY: forwarded from the caller.
    unsafe { lib().buf_register(base, len, Some(gpu), export) }
}

/// Registers the whole dma-buf `fd` that another driver exported (a device's memory BAR through
/// vfio-pci, an accelerator's memory), a ugds extension: the SSD reads and writes it
/// peer-to-peer and the CPU has no access. `*bufPtr_base` receives the address I/O calls name it
/// by (reserved, inaccessible address space of its size); `uGDSBufDeregister` releases it. The
/// descriptor is duplicated: the caller keeps and closes its own. `UGDS_GPU_MEMORY_PINNING_FAILED`
/// where the kernel allows no peer-to-peer DMA between an open controller and the exporter's
/// device, or a handle has no user-space queues (a file).
///
/// # Safety
///
/// `bufPtr_base` must be NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ugdsxBufRegisterDmabuf(fd: c_int, bufPtr_base: *mut *mut c_void) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if bufPtr_base.is_null() || fd < 0 {
        return code(UGDS_INVALID_VALUE);
    }
    // SAFETY: the caller lends an open descriptor for the call; it is duplicated before use.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mem = match ugds::gpu::dmabuf::memory(fd) {
        Ok(m) => m,
        Err(e) => return Fail::Lib(e).status(),
    };
    let (base, len) = (mem.device_ptr() as usize, mem.len());
    // SAFETY: `[base, +len)` stands for the dma-buf as long as its `Gpu` lives, which the
    // registration's entry holds.
    match unsafe { lib().buf_register(base, len, Some(mem.gpu().clone()), false) } {
        Ok(()) => {
            // SAFETY: checked non-null; valid per the contract.
            unsafe { *bufPtr_base = base as *mut c_void };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Registers memory with a backend choice and whether it will be exported (dma-buf, RDMA).
///
/// # Safety
///
/// As `uGDSBufRegister`; `config` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegisterEx(
    bufPtr_base: *const c_void,
    length: usize,
    config: *const uGDSBufConfig_t,
) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if bufPtr_base.is_null() || length == 0 || config.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    // SAFETY: non-null; fields read as the ints the caller stored.
    let (backend, export) = unsafe { ((*config).backend, (*config).enable_export.0 != 0) };
    match backend.get() {
        Some(uGDSBackend::UGDS_BACKEND_DEFAULT) if export => code(UGDS_INVALID_VALUE),
        Some(uGDSBackend::UGDS_BACKEND_DEFAULT) => {
            // SAFETY: forwarded.
            status(unsafe { register(bufPtr_base as usize, length, false, false) })
        }
        Some(uGDSBackend::UGDS_BACKEND_CUDA) => {
            if ugds::capi::cuda().is_none() {
                return code(UGDS_PLATFORM_NOT_SUPPORTED);
            }
            // SAFETY: forwarded.
            status(unsafe { register(bufPtr_base as usize, length, true, export) })
        }
        Some(uGDSBackend::UGDS_BACKEND_HIP) => {
            if ugds::capi::hip().is_none() {
                return code(UGDS_PLATFORM_NOT_SUPPORTED);
            }
            // SAFETY: forwarded.
            status(unsafe { register_on_hip(bufPtr_base as usize, length, export) })
        }
        None => code(UGDS_INVALID_VALUE),
    }
}

/// Deregisters memory: `UGDS_BUSY` while I/O on it runs, `UGDS_RDMA_MR_STILL_ACTIVE` while an
/// RDMA region uses it.
#[no_mangle]
pub extern "C" fn uGDSBufDeregister(bufPtr_base: *const c_void) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    status(lib().buf_deregister(bufPtr_base as usize))
}

/// Exports GPU memory registered for export as a dma-buf; the caller owns and closes `out->fd`.
/// `UGDS_IO_NOT_SUPPORTED` for memory registered without export (or host memory).
///
/// # Safety
///
/// `out` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSExportDmabuf(bufPtr_base: *const c_void, out: *mut uGDSDmabufExport_t) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if out.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    match lib().export_dmabuf(bufPtr_base as usize) {
        Ok((fd, offset, length)) => {
            // SAFETY: checked non-null.
            unsafe { *out = uGDSDmabufExport { fd: fd.into_raw_fd(), offset, length } };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Registers exportable GPU memory with an RDMA protection domain (`struct ibv_pd *`) through
/// its dma-buf; libibverbs is loaded at run time (`UGDS_IO_NOT_SUPPORTED` without it).
///
/// # Safety
///
/// `pd` must be NULL or a live protection domain; `region` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSRDMARegister(
    bufPtr_base: *const c_void,
    pd: *mut c_void,
    access_flags: c_int,
    region: *mut uGDSRDMARegion_t,
) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if region.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    // SAFETY: forwarded.
    match unsafe { lib().rdma_register(bufPtr_base as usize, pd, access_flags) } {
        Ok(r) => {
            // SAFETY: checked non-null.
            unsafe { *region = r };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Deregisters an RDMA region made by `uGDSRDMARegister` and clears `*region`.
///
/// # Safety
///
/// `region` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSRDMAUnregister(bufPtr_base: *const c_void, region: *mut uGDSRDMARegion_t) -> uGDSError_t {
    if !lib().is_open() {
        return code(UGDS_DRIVER_NOT_INITIALIZED);
    }
    if region.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null; the caller's region.
    status(lib().rdma_unregister(bufPtr_base as usize, unsafe { &mut *region }))
}

/// Reads `size` bytes at `file_offset` into memory at `bufPtr_base + bufPtr_offset`; returns
/// the bytes read or `-errno` (`-EINVAL` for bad arguments or alignment, `-EBADF` for an
/// unknown handle, `-EIO` for a device error). Unregistered memory is registered for the call.
///
/// # Safety
///
/// The memory range must be valid for writing.
#[no_mangle]
pub unsafe extern "C" fn uGDSRead(
    fh: uGDSHandle_t,
    bufPtr_base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    bufPtr_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    ret(unsafe { lib().rw(false, fh as usize, bufPtr_base as usize, size, file_offset, bufPtr_offset) })
}

/// Writes `size` bytes from memory at `bufPtr_base + bufPtr_offset` to `file_offset` (see
/// `uGDSRead`).
///
/// # Safety
///
/// The memory range must be valid for reading.
#[no_mangle]
pub unsafe extern "C" fn uGDSWrite(
    fh: uGDSHandle_t,
    bufPtr_base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    bufPtr_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    ret(unsafe { lib().rw(true, fh as usize, bufPtr_base as usize, size, file_offset, bufPtr_offset) })
}

fn ret(r: CResult<usize>) -> libc::ssize_t {
    match r {
        Ok(n) => n as libc::ssize_t,
        Err(f) => f.ret_for(Face::Ugds),
    }
}

/// Vectored read: `segs[i]` (a registered base, a page-aligned offset in it, a block-multiple
/// size) in order, contiguous in the file from `file_offset`. Bytes read or `-errno`.
///
/// # Safety
///
/// `segs` must point to `nr_segs` segments.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadv(
    fh: uGDSHandle_t,
    segs: *const uGDSIoSegment_t,
    nr_segs: c_uint,
    file_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    ret(unsafe { lib().rwv(false, fh as usize, segs, nr_segs, file_offset) })
}

/// Vectored write (see `uGDSReadv`).
///
/// # Safety
///
/// As `uGDSReadv`.
#[no_mangle]
pub unsafe extern "C" fn uGDSWritev(
    fh: uGDSHandle_t,
    segs: *const uGDSIoSegment_t,
    nr_segs: c_uint,
    file_offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: forwarded.
    ret(unsafe { lib().rwv(true, fh as usize, segs, nr_segs, file_offset) })
}

/// Sets up a batch of up to `nr` (at most 128) entries on one handle; its queue pair is made
/// here. The handle counts as busy until the batch is destroyed.
///
/// # Safety
///
/// `batch` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSetUp(batch: *mut uGDSBatchHandle_t, fh: uGDSHandle_t, nr: c_uint) -> uGDSError_t {
    if batch.is_null() || fh.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    match lib().batch_setup(fh as usize, nr) {
        Ok(b) => {
            // SAFETY: checked non-null.
            unsafe { *batch = b as uGDSBatchHandle_t };
            OK
        }
        Err(f) => f.status(),
    }
}

/// The batch's handle, for its entries.
fn batch_handle(batch: uGDSBatchHandle_t) -> Option<usize> {
    lib().batch_handle(batch as usize)
}

/// Submits `nr` entries (`flags` is ignored, as in uGDS). An entry with a bad value (NULL
/// memory, zero size, negative or unaligned offsets, unknown opcode) refuses the whole call
/// with `UGDS_INVALID_VALUE`; an entry on memory that is not registered fails alone (its event:
/// `UGDS_BATCH_FAILED`, -EINVAL). `UGDS_BATCH_CAPACITY_EXCEEDED` when the entries submitted
/// since the batch was last fully reaped would exceed its size.
///
/// # Safety
///
/// `iocb` must point to `nr` entries.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSubmit(
    batch: uGDSBatchHandle_t,
    nr: c_uint,
    iocb: *mut uGDSIOParams_t,
    flags: c_uint,
) -> uGDSError_t {
    let _ = flags;
    if batch.is_null() || iocb.is_null() || nr == 0 {
        return code(UGDS_INVALID_VALUE);
    }
    let Some(fh) = batch_handle(batch) else { return code(UGDS_INVALID_VALUE) };
    // SAFETY: the caller passes `nr` entries; fields are read as the ints they stored.
    let ps = unsafe { std::slice::from_raw_parts(iocb, nr as usize) };
    let mut entries = Vec::with_capacity(ps.len());
    for p in ps {
        let write = match p.opcode.0 {
            0 => false,
            1 => true,
            _ => return code(UGDS_INVALID_VALUE),
        };
        entries.push(Entry {
            fh,
            write,
            base: p.devPtr_base as usize,
            buf_offset: p.devPtr_offset,
            file_offset: p.file_offset,
            size: p.size,
            cookie: p.cookie,
        });
    }
    // SAFETY: forwarded.
    status(unsafe { lib().batch_submit(batch as usize, &entries) })
}

/// Submits vectored entries: each entry's segments become consecutive file ranges from its
/// `file_offset`; its event reports the entry as a whole.
///
/// # Safety
///
/// `iocb` must point to `nr` entries, each with `nr_segs` segments.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSubmitv(
    batch: uGDSBatchHandle_t,
    nr: c_uint,
    iocb: *mut uGDSIOSegParams_t,
    flags: c_uint,
) -> uGDSError_t {
    let _ = flags;
    if batch.is_null() || iocb.is_null() || nr == 0 {
        return code(UGDS_INVALID_VALUE);
    }
    let Some(fh) = batch_handle(batch) else { return code(UGDS_INVALID_VALUE) };
    // SAFETY: the caller passes `nr` entries.
    let ps = unsafe { std::slice::from_raw_parts(iocb, nr as usize) };
    for p in ps {
        if p.segs.is_null() || p.nr_segs == 0 || p.nr_segs > UGDS_BATCH_IOV_MAX || !(0..=1).contains(&p.opcode.0) {
            return code(UGDS_INVALID_VALUE);
        }
    }
    // SAFETY: forwarded.
    status(unsafe { lib().batch_submitv(batch as usize, fh, ps) })
}

/// Waits until `min_nr` entries have finished (or `timeout` passed: success with fewer; NULL
/// waits without limit) and returns up to `*nr` events (`*nr` = 0: up to the batch's size);
/// `*nr` is set to how many were returned. Each entry is reported once.
///
/// # Safety
///
/// `nr`, `events` (room for the events asked for) and `timeout` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOGetStatus(
    batch: uGDSBatchHandle_t,
    min_nr: c_uint,
    nr: *mut c_uint,
    events: *mut uGDSIOEvents_t,
    timeout: *mut libc::timespec,
) -> uGDSError_t {
    if batch.is_null() || nr.is_null() || events.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    // SAFETY: checked non-null.
    let max = unsafe { *nr } as usize;
    // SAFETY: NULL or the caller's timespec.
    let limit = unsafe { ugds::capi::timeout_of(timeout) };
    match lib().batch_status(batch as usize, min_nr as usize, max, limit) {
        Ok(evs) => {
            for (i, e) in evs.iter().enumerate() {
                let status = match e.status {
                    EventStatus::Complete => uGDSBatchStatus::UGDS_BATCH_COMPLETE,
                    EventStatus::Timeout => uGDSBatchStatus::UGDS_BATCH_TIMEOUT,
                    EventStatus::Invalid => uGDSBatchStatus::UGDS_BATCH_INVALID,
                    EventStatus::Failed | EventStatus::Canceled => uGDSBatchStatus::UGDS_BATCH_FAILED,
                };
                // SAFETY: `events` has room for the `max` (or batch-size) events asked for,
                // and `evs` holds no more than that.
                unsafe { *events.add(i) = uGDSIOEvents { cookie: e.cookie, status, ret: e.ret } };
            }
            // SAFETY: checked non-null.
            unsafe { *nr = evs.len() as c_uint };
            OK
        }
        Err(f) => f.status(),
    }
}

/// Destroys a batch after its entries finish. NULL and unknown batches are ignored.
#[no_mangle]
pub extern "C" fn uGDSBatchIODestroy(batch: uGDSBatchHandle_t) {
    lib().batch_destroy(batch as usize);
}

/// Queues a read in stream order: `*size_p`, `*file_offset_p` and `*bufPtr_offset_p` are read
/// when the stream reaches it; the bytes read (or `-errno`) are stored in `*bytes_read_p`
/// before later work on the stream runs. The memory must be registered.
///
/// # Safety
///
/// The pointers must stay valid until the stream has passed the operation.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadAsync(
    fh: uGDSHandle_t,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    bufPtr_offset_p: *mut libc::off_t,
    bytes_read_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    let args = LateArgs { size: size_p, file_offset: file_offset_p, buf_offset: bufPtr_offset_p, bytes: bytes_read_p };
    // SAFETY: forwarded.
    status(unsafe { lib().rw_async(false, fh as usize, bufPtr_base as usize, args, key(stream)) })
}

/// Queues a write in stream order (see `uGDSReadAsync`).
///
/// # Safety
///
/// As `uGDSReadAsync`.
#[no_mangle]
pub unsafe extern "C" fn uGDSWriteAsync(
    fh: uGDSHandle_t,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    bufPtr_offset_p: *mut libc::off_t,
    bytes_written_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    let args =
        LateArgs { size: size_p, file_offset: file_offset_p, buf_offset: bufPtr_offset_p, bytes: bytes_written_p };
    // SAFETY: forwarded.
    status(unsafe { lib().rw_async(true, fh as usize, bufPtr_base as usize, args, key(stream)) })
}

/// Queues a vectored read in stream order: the segment bases are checked now; their offsets
/// and sizes and `*file_offset_p` are read when the stream gets there. `*bytes_read_p` is 0
/// until then.
///
/// # Safety
///
/// `segs` (with `nr_segs` entries) and the words must stay valid until the stream has passed
/// the operation.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadvAsync(
    fh: uGDSHandle_t,
    segs: *mut uGDSIoSegment_t,
    nr_segs: c_uint,
    file_offset_p: *mut libc::off_t,
    bytes_read_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    let args = LateSegs { segs, nr: nr_segs, file_offset: file_offset_p, bytes: bytes_read_p };
    // SAFETY: forwarded.
    status(unsafe { lib().rwv_async(false, fh as usize, args, key(stream)) })
}

/// Queues a vectored write in stream order (see `uGDSReadvAsync`).
///
/// # Safety
///
/// As `uGDSReadvAsync`.
#[no_mangle]
pub unsafe extern "C" fn uGDSWritevAsync(
    fh: uGDSHandle_t,
    segs: *mut uGDSIoSegment_t,
    nr_segs: c_uint,
    file_offset_p: *mut libc::off_t,
    bytes_written_p: *mut libc::ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    let args = LateSegs { segs, nr: nr_segs, file_offset: file_offset_p, bytes: bytes_written_p };
    // SAFETY: forwarded.
    status(unsafe { lib().rwv_async(true, fh as usize, args, key(stream)) })
}

/// Registers a stream. As in uGDS's single-runtime builds, nothing needs registering: this
/// always succeeds (also for NULL, the default stream, and before `uGDSDriverOpen`). With the
/// driver open it sets up what the stream's first stream-ordered I/O would otherwise set up.
#[no_mangle]
pub extern "C" fn uGDSStreamRegister(stream: *mut c_void) -> uGDSError_t {
    lib().stream_prepare(key(stream));
    OK
}

/// Registers a stream with its runtime: succeeds for `UGDS_BACKEND_CUDA`, and for
/// `UGDS_BACKEND_HIP` where the HIP runtime (libamdhip64.so) loads; `UGDS_INVALID_VALUE` for any
/// other value, DEFAULT included. Stream-ordered I/O wraps a stream with the runtime of the
/// buffer it moves (CUDA for host memory where CUDA loads, else HIP).
#[no_mangle]
pub extern "C" fn uGDSStreamRegisterEx(stream: *mut c_void, backend: BackendArg) -> uGDSError_t {
    match backend.get() {
        Some(uGDSBackend::UGDS_BACKEND_CUDA) => {}
        Some(uGDSBackend::UGDS_BACKEND_HIP) if ugds::capi::hip().is_some() => {}
        _ => return code(UGDS_INVALID_VALUE),
    }
    lib().stream_prepare(key(stream));
    OK
}

/// Deregisters a stream: the library forgets it once its own queued I/O on it has run. The
/// stream itself is never synchronised or otherwise touched. Always succeeds.
#[no_mangle]
pub extern "C" fn uGDSStreamDeregister(stream: *mut c_void) -> uGDSError_t {
    lib().stream_forget(key(stream));
    OK
}

/// (ugds extension) The message for a status code, or for a negative return value of a read
/// or write. Static storage; never NULL.
#[no_mangle]
pub extern "C" fn ugdsxErrorString(code: i64) -> *const c_char {
    message(code).as_ptr()
}

/// (ugds extension) Creates a CPU stream: stream-ordered I/O without a GPU. Work queued with
/// `ugdsxCpuStreamLaunch` runs in order with the I/O.
///
/// # Safety
///
/// `stream` must be NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn ugdsxCpuStreamCreate(stream: *mut *mut c_void) -> uGDSError_t {
    if stream.is_null() {
        return code(UGDS_INVALID_VALUE);
    }
    match lib().cpu_stream_create() {
        Ok(s) => {
            // SAFETY: checked non-null.
            unsafe { *stream = s as *mut c_void };
            OK
        }
        Err(f) => f.status(),
    }
}

/// The function a CPU stream runs.
#[allow(non_camel_case_types)]
pub type ugdsxHostFn = Option<unsafe extern "C" fn(arg: *mut c_void)>;

struct SendPtr(*mut c_void);
// SAFETY: the caller hands `arg` to its own function, run on the stream's thread (the
// contract of `ugdsxCpuStreamLaunch`).
unsafe impl Send for SendPtr {}

/// (ugds extension) Queues `func(arg)` on a CPU stream.
///
/// # Safety
///
/// `func` must be safe to call with `arg` on another thread.
#[no_mangle]
pub unsafe extern "C" fn ugdsxCpuStreamLaunch(stream: *mut c_void, func: ugdsxHostFn, arg: *mut c_void) -> uGDSError_t {
    let (Ok(s), Some(f)) = (lib().cpu_stream(stream as usize), func) else { return code(UGDS_INVALID_VALUE) };
    let a = SendPtr(arg);
    status(
        s.launch(move || {
            let a = a;
            // SAFETY: the caller's contract.
            unsafe { f(a.0) }
        })
        .map_err(Fail::Lib),
    )
}

/// (ugds extension) Waits for everything queued on a CPU stream.
#[no_mangle]
pub extern "C" fn ugdsxCpuStreamSynchronize(stream: *mut c_void) -> uGDSError_t {
    match lib().cpu_stream(stream as usize) {
        Ok(s) => status(ugds::stream::Stream::synchronize(&*s).map_err(Fail::Lib)),
        Err(f) => f.status(),
    }
}

/// (ugds extension) Destroys a CPU stream after its queued work.
#[no_mangle]
pub extern "C" fn ugdsxCpuStreamDestroy(stream: *mut c_void) -> uGDSError_t {
    status(lib().cpu_stream_destroy(stream as usize))
}
