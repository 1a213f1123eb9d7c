//! dma-buf export of registered GPU memory, and RDMA memory regions over it (`uGDSExportDmabuf`,
//! `uGDSRDMARegister`, `uGDSRDMAUnregister`). libibverbs is loaded at run time, so the library
//! has no link-time dependency on rdma-core; without it (or without an RDMA device, which the
//! caller's protection domain implies) registration fails with `IO_NOT_SUPPORTED`.

use super::library::{Library, Memory};
use super::types::uGDSOpError::*;
use super::types::uGDSRDMARegion;
use super::{CResult, Fail};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

/// One live memory region.
#[derive(Debug)]
pub(crate) struct RdmaRecord {
    /// The registration the region maps (its count of regions keeps it registered).
    entry: std::sync::Arc<super::library::BufEntry>,
    base: usize,
    mr: usize,
    token: u64,
    /// The dma-buf the region maps (kept open while the region lives).
    _fd: OwnedFd,
}

/// The RDMA regions of a library.
#[derive(Debug, Default)]
pub(crate) struct RdmaRecords(Mutex<Vec<RdmaRecord>>);

/// The start of `struct ibv_mr` (rdma-core's verbs.h; its layout is part of the verbs ABI).
#[repr(C)]
struct IbvMr {
    context: *mut c_void,
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr;
type DeregMr = unsafe extern "C" fn(*mut IbvMr) -> c_int;

/// The two verbs we call, from libibverbs loaded at first use.
struct Verbs {
    reg_dmabuf_mr: RegDmabufMr,
    dereg_mr: DeregMr,
}

fn verbs() -> Option<&'static Verbs> {
    static V: OnceLock<Option<Verbs>> = OnceLock::new();
    V.get_or_init(|| {
        // Kept loaded for good (the function pointers are used for the process's life).
        let lib = crate::dl::Library::open("libibverbs.so.1").ok()?;
        // SAFETY: these symbols have these C signatures in every libibverbs.so.1 that exports
        // them (rdma-core's verbs ABI); the library is never closed.
        unsafe {
            Some(Verbs { reg_dmabuf_mr: lib.function(c"ibv_reg_dmabuf_mr")?, dereg_mr: lib.function(c"ibv_dereg_mr")? })
        }
    })
    .as_ref()
}

impl Library {
    /// `uGDSExportDmabuf`: a new dma-buf descriptor for registered GPU memory that was
    /// registered for export; (fd, offset, length).
    pub fn export_dmabuf(&self, base: usize) -> CResult<(OwnedFd, u64, usize)> {
        if !self.is_open() {
            return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
        }
        let e = self.buffer(base).ok_or(Fail::Code(UGDS_MEMORY_NOT_REGISTERED))?;
        match &e.mem {
            Memory::Gpu(m) if e.export => {
                let fd = m.export_dmabuf().map_err(|_| Fail::Code(UGDS_IO_NOT_SUPPORTED))?;
                Ok((fd, 0, e.len))
            }
            _ => Err(Fail::Code(UGDS_IO_NOT_SUPPORTED)),
        }
    }

    /// `uGDSRDMARegister`: registers the buffer's dma-buf with the protection domain `pd`.
    ///
    /// # Safety
    ///
    /// `pd` must be a live `struct ibv_pd *`.
    pub unsafe fn rdma_register(&self, base: usize, pd: *mut c_void, access: c_int) -> CResult<uGDSRDMARegion> {
        if !self.is_open() {
            return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
        }
        if base == 0 || pd.is_null() {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let e = self.buffer(base).ok_or(Fail::Code(UGDS_MEMORY_NOT_REGISTERED))?;
        // Counted before anything else (uGDS's PENDING record): deregistration is refused from
        // here on, so the region can never outlive the registration it maps.
        e.rdma.fetch_add(1, Ordering::AcqRel);
        // SAFETY: forwarded.
        match unsafe { self.rdma_register_counted(&e, pd, access) } {
            Ok(r) => Ok(r),
            Err(f) => {
                e.rdma.fetch_sub(1, Ordering::AcqRel);
                Err(f)
            }
        }
    }

    /// The rest of [`Library::rdma_register`], with the region counted on `e`.
    unsafe fn rdma_register_counted(
        &self,
        e: &std::sync::Arc<super::library::BufEntry>,
        pd: *mut c_void,
        access: c_int,
    ) -> CResult<uGDSRDMARegion> {
        let base = e.base;
        let (fd, offset, len) = self.export_dmabuf(base)?;
        let v = verbs().ok_or(Fail::Code(UGDS_IO_NOT_SUPPORTED))?;
        // SAFETY: `pd` is live (caller), `fd` a dma-buf of `len` bytes at `offset`; the region
        // maps it at iova = the buffer's address, as uGDS does.
        let mr = unsafe { (v.reg_dmabuf_mr)(pd, offset, len, base as u64, fd.as_raw_fd(), access) };
        if mr.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(Fail::Code(if errno == libc::EOPNOTSUPP {
                UGDS_IO_NOT_SUPPORTED
            } else {
                UGDS_INTERNAL_ERROR
            }));
        }
        // SAFETY: a region the verbs library just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let token = self.rdma_tokens.fetch_add(1, Ordering::AcqRel);
        self.rdma.0.lock().unwrap_or_else(|e| e.into_inner()).push(RdmaRecord {
            entry: e.clone(),
            base,
            mr: mr as usize,
            token,
            _fd: fd,
        });
        Ok(uGDSRDMARegion { mr: mr as *mut c_void, iova: base as u64, lkey, rkey, token })
    }

    /// `uGDSRDMAUnregister`: deregisters the region and clears `region`.
    pub fn rdma_unregister(&self, base: usize, region: &mut uGDSRDMARegion) -> CResult<()> {
        if !self.is_open() {
            return Err(Fail::Code(UGDS_DRIVER_NOT_INITIALIZED));
        }
        if base == 0 || region.mr.is_null() {
            return Err(Fail::Code(UGDS_INVALID_VALUE));
        }
        let mut recs = self.rdma.0.lock().unwrap_or_else(|e| e.into_inner());
        if !recs.iter().any(|r| r.base == base) {
            return Err(Fail::Code(UGDS_MEMORY_NOT_REGISTERED));
        }
        let i = recs
            .iter()
            .position(|r| r.base == base && r.mr == region.mr as usize && r.token == region.token)
            .ok_or(Fail::Code(UGDS_HANDLE_NOT_REGISTERED))?;
        let v = verbs().ok_or(Fail::Code(UGDS_INTERNAL_ERROR))?;
        // SAFETY: a region this library registered and has not deregistered (it is recorded).
        if unsafe { (v.dereg_mr)(recs[i].mr as *mut IbvMr) } != 0 {
            return Err(Fail::Code(UGDS_INTERNAL_ERROR));
        }
        let rec = recs.remove(i);
        rec.entry.rdma.fetch_sub(1, Ordering::AcqRel);
        *region = uGDSRDMARegion { mr: std::ptr::null_mut(), iova: 0, lkey: 0, rkey: 0, token: 0 };
        Ok(())
    }
}
