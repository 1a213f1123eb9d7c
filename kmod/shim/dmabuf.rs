//! Importing a dma-buf for the controller (shaped after upstream's planned `kernel::dma_buf`):
//! dynamic attach with peer-to-peer allowed (GPU memory behind a BAR), pin, map; undone in
//! reverse order on drop.
//!
//! Device memory's exporters may revoke a mapping (vfio-pci when its device is reset or its
//! memory disabled; a GPU driver moving VRAM): they call the importer's invalidation callback
//! with the reservation lock held, and wait, in bounded time, for the importer to stop the
//! device and unmap. The callback asks the driver to stop the controller's DMA
//! ([`Revoker::quiesce`]), then unmaps right there; the registration stays, marked revoked,
//! until its owner deregisters it.

use super::dma::DMA_BIDIRECTIONAL;
use super::pci::Device;
use super::scatterlist::dma_segments;
use crate::bindings;
use crate::uapi::ioctl::Segment;
use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// dma-buf symbols live in the DMA_BUF namespace; the module must import it (modpost keeps this
/// entry because the module is composite, see Kbuild).
#[link_section = ".modinfo"]
#[used]
static IMPORT_NS_DMA_BUF: [u8; 18] = *b"import_ns=DMA_BUF\0";

fn err_ptr<T>(p: *mut T) -> Result<NonNull<T>> {
    let v = p as isize;
    if (-4095..0).contains(&v) {
        // CAST: an ERR_PTR value is a small negative errno.
        return Err(Error::from_errno(v as i32));
    }
    NonNull::new(p).ok_or(EINVAL)
}

/// What the importing driver does when an exporter revokes a mapping.
pub(crate) trait Revoker: Send + Sync {
    /// Makes sure the device no longer reads or writes any memory it was given before this call
    /// (and will not until user space has learnt of the revocation). Returns false when that
    /// cannot be confirmed: the mapping then stays until the registration is dropped.
    fn quiesce(&self) -> bool;
}

/// The importer's side of one attachment, found by the callback through `importer_priv`.
///
/// # Invariants
///
/// `sgt` is read and written only with the dma-buf's reservation lock held; it is null or the
/// live mapping of the attachment this hook belongs to.
struct Hook {
    revoked: AtomicBool,
    sgt: UnsafeCell<*mut bindings::sg_table>,
    dev: Device,
    revoker: Arc<dyn Revoker>,
}

// SAFETY: `sgt` is only touched under the reservation lock (invariant); the rest is `Sync`.
unsafe impl Sync for Hook {}
// SAFETY: as above; the pointer is owned data of the attachment.
unsafe impl Send for Hook {}

impl Hook {
    /// Unmaps the attachment if it is still mapped.
    ///
    /// # Safety
    ///
    /// The dma-buf's reservation lock is held, and `attach` is the attachment of this hook.
    unsafe fn unmap_locked(&self, attach: *mut bindings::dma_buf_attachment) {
        // SAFETY: the lock is held (contract), which guards `sgt` (invariant).
        let sgt = unsafe { &mut *self.sgt.get() };
        if sgt.is_null() {
            return;
        }
        // SAFETY: `*sgt` is the live mapping of `attach` (invariant); the lock is held.
        unsafe { bindings::dma_buf_unmap_attachment(attach, *sgt, DMA_BIDIRECTIONAL) };
        *sgt = core::ptr::null_mut();
        // Before the exporter may reuse the memory: no late DMA through a stale IOTLB entry.
        super::pin::flush_deferred_iotlb(&self.dev);
    }
}

/// The exporter's invalidation (`move_notify` up to 6.x, `invalidate_mappings` on 7.3): taken
/// as a permanent revocation, as pinned importers may.
unsafe extern "C" fn invalidate(attach: *mut bindings::dma_buf_attachment) {
    // SAFETY: the exporter passes our attachment, whose `importer_priv` is the hook `import`
    // allocated; it is freed only after `dma_buf_detach` returned, after which no callback runs.
    let hook = unsafe { &*((*attach).importer_priv as *const Hook) };
    // A second notification (vfio-pci also notifies when the memory comes back) finds it done.
    if hook.revoked.swap(true, Ordering::AcqRel) {
        return;
    }
    if !hook.revoker.quiesce() {
        pr_err!("dma-buf revoked but the controller could not be stopped: keeping its mapping\n");
        return;
    }
    // SAFETY: exporters invalidate with the reservation lock held; `attach` is the hook's.
    unsafe { hook.unmap_locked(attach) };
}

/// The importer description (the exporter keeps a pointer to it).
struct AttachOps(bindings::dma_buf_attach_ops);
// SAFETY: read-only after construction; the C side only reads it.
unsafe impl Sync for AttachOps {}

// The callback's field is `move_notify` up to 6.x and `invalidate_mappings` on 7.3.
#[cfg(ugds_linux_6_12)]
static ATTACH_OPS: AttachOps =
    AttachOps(bindings::dma_buf_attach_ops { allow_peer2peer: true, move_notify: Some(invalidate) });
#[cfg(not(ugds_linux_6_12))]
static ATTACH_OPS: AttachOps =
    AttachOps(bindings::dma_buf_attach_ops { allow_peer2peer: true, invalidate_mappings: Some(invalidate) });

/// A dma-buf attached, pinned and mapped for one device.
///
/// # Invariants
///
/// `buf` holds a reference from `dma_buf_get`; `attach` is a dynamic attachment of it for
/// the device, pinned when `pinned` says so, whose `importer_priv` is `hook`; its mapping is
/// `hook.sgt` until a revocation unmaps it; all undone exactly once in `Drop`.
pub(crate) struct DmabufMapping {
    buf: NonNull<bindings::dma_buf>,
    attach: NonNull<bindings::dma_buf_attachment>,
    /// `dma_buf_pin` succeeded (only the error path of `import` drops an unpinned one).
    pinned: bool,
    hook: KBox<Hook>,
    segments: KVVec<Segment>,
    len: u64,
}

// SAFETY: the pointers are used only in `Drop` (with ownership); `segments` is plain data.
unsafe impl Send for DmabufMapping {}
// SAFETY: `&self` only reads `segments` and an atomic.
unsafe impl Sync for DmabufMapping {}

struct ResvGuard(*mut bindings::dma_resv);

impl ResvGuard {
    /// # Safety
    ///
    /// `resv` must be the live reservation object of a dma-buf we hold a reference to.
    unsafe fn lock(resv: *mut bindings::dma_resv) -> Self {
        // SAFETY: per the contract; a NULL acquire context locks without deadlock avoidance,
        // which is fine for a single lock.
        unsafe { bindings::ww_mutex_lock(&mut (*resv).lock, core::ptr::null_mut()) };
        ResvGuard(resv)
    }
}

impl Drop for ResvGuard {
    fn drop(&mut self) {
        // SAFETY: locked in `lock`.
        unsafe { bindings::ww_mutex_unlock(&mut (*self.0).lock) };
    }
}

impl DmabufMapping {
    /// Imports `[offset, offset + len)` of the dma-buf behind `fd` for `dev`; a revocation by
    /// the exporter calls `revoker` before the mapping goes.
    ///
    /// Errors: `EBADF` (not an open fd), `EINVAL` (not a dma-buf, or the range exceeds it),
    /// `EXDEV` (the exporter's device memory is not reachable from `dev` peer-to-peer: it
    /// attached but refused to map), or what the exporter returns for attach/pin/map.
    pub(crate) fn import(dev: &Device, fd: i32, offset: u64, len: u64, revoker: Arc<dyn Revoker>) -> Result<Self> {
        let hook = KBox::new(
            Hook { revoked: AtomicBool::new(false), sgt: UnsafeCell::new(core::ptr::null_mut()), dev: dev.clone(), revoker },
            GFP_KERNEL,
        )?;
        // SAFETY: dma_buf_get validates the fd and takes a reference.
        let buf = err_ptr(unsafe { bindings::dma_buf_get(fd) })?;
        // SAFETY: we hold a reference to `buf`.
        let size = unsafe { (*buf.as_ptr()).size } as u64;
        if offset.checked_add(len).map_or(true, |e| e > size) {
            // SAFETY: drop the reference taken above.
            unsafe { bindings::dma_buf_put(buf.as_ptr()) };
            return Err(EINVAL);
        }
        let priv_ = &*hook as *const Hook as *mut core::ffi::c_void;
        // SAFETY: `buf` is referenced; the device is live; ATTACH_OPS is static; the hook
        // outlives the attachment (it is freed after the detach in `Drop`).
        let attach = match err_ptr(unsafe {
            bindings::dma_buf_dynamic_attach(buf.as_ptr(), dev.as_device_ptr(), &ATTACH_OPS.0, priv_)
        }) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: drop the reference taken above.
                unsafe { bindings::dma_buf_put(buf.as_ptr()) };
                return Err(e);
            }
        };
        // INVARIANT: referenced and attached, not yet pinned or mapped; from here `Drop` undoes
        // what was done.
        let mut me = DmabufMapping { buf, attach, pinned: false, hook, segments: KVVec::new(), len };
        // SAFETY: `buf` is referenced, so its reservation object is live. Declared after `me`,
        // so an early return unlocks before `me` drops (which locks again).
        let _g = unsafe { ResvGuard::lock((*buf.as_ptr()).resv) };
        // SAFETY: the attachment is ours and the reservation lock is held.
        let r = unsafe { bindings::dma_buf_pin(attach.as_ptr()) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        me.pinned = true;
        // SAFETY: pinned, lock held.
        let sgt = match err_ptr(unsafe { bindings::dma_buf_map_attachment(attach.as_ptr(), DMA_BIDIRECTIONAL) }) {
            Ok(s) => s,
            // The exporter accepted a peer-to-peer importer but cannot map its memory for this
            // device: the kernel's peer-to-peer rules refused the route.
            Err(e) if e == EINVAL => return Err(Error::from_errno(-crate::uapi::ioctl::errno::EXDEV)),
            Err(e) => return Err(e),
        };
        // SAFETY: the lock is held, which guards `sgt`.
        unsafe { *me.hook.sgt.get() = sgt.as_ptr() };
        // Collected under the lock: a revocation unmaps (and frees) the table under it.
        me.collect_segments(sgt, offset, len)?;
        drop(_g);
        Ok(me)
    }

    fn collect_segments(&mut self, sgt: NonNull<bindings::sg_table>, mut skip: u64, mut want: u64) -> Result {
        // SAFETY: `sgt` is the exporter's live mapping of our attachment, and the caller holds
        // the reservation lock, under which only a revocation could unmap it.
        for (addr, l) in unsafe { dma_segments(sgt.as_ref()) } {
            if want == 0 {
                break;
            }
            if skip >= l {
                skip -= l;
            } else {
                let n = (l - skip).min(want);
                self.segments.push(Segment { dma_addr: addr + skip, len: n }, GFP_KERNEL)?;
                want -= n;
                skip = 0;
            }
        }
        if want != 0 {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// The DMA segments of the imported range (stale once revoked).
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether the exporter revoked the mapping.
    pub(crate) fn revoked(&self) -> bool {
        self.hook.revoked.load(Ordering::Acquire)
    }

    /// Pages covered (for the counters).
    pub(crate) fn npages(&self) -> usize {
        (self.len / 4096) as usize
    }
}

impl Drop for DmabufMapping {
    /// The controller must no longer access this memory.
    fn drop(&mut self) {
        // SAFETY: by the invariant everything below was set up by `import`; undone once, in
        // reverse order, with the reservation lock held where the API requires it.
        unsafe {
            if self.pinned {
                let _g = ResvGuard::lock((*self.buf.as_ptr()).resv);
                self.hook.unmap_locked(self.attach.as_ptr());
                bindings::dma_buf_unpin(self.attach.as_ptr());
            }
            bindings::dma_buf_detach(self.buf.as_ptr(), self.attach.as_ptr());
            bindings::dma_buf_put(self.buf.as_ptr());
        }
        // The hook drops after this, once no callback can reach it.
    }
}
