//! Importing a dma-buf for the controller (shaped after upstream's planned `kernel::dma_buf`):
//! dynamic attach with peer-to-peer allowed (GPU memory behind a BAR), pin, map. Undone in
//! reverse order on drop.

use super::dma::DMA_BIDIRECTIONAL;
use super::pci::Device;
use super::scatterlist::dma_segments;
use crate::bindings;
use crate::uapi::ioctl::Segment;
use core::ptr::NonNull;
use kernel::prelude::*;

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

unsafe extern "C" fn move_notify(_attach: *mut bindings::dma_buf_attachment) {
    // Our attachments are pinned, so the exporter may not move them; nothing to do.
}

/// The importer description (the exporter keeps a pointer to it).
struct AttachOps(bindings::dma_buf_attach_ops);
// SAFETY: read-only after construction; the C side only reads it.
unsafe impl Sync for AttachOps {}

// The callback's field is `move_notify` up to 6.x and `invalidate_mappings` on 7.3.
#[cfg(ugds_linux_6_12)]
static ATTACH_OPS: AttachOps =
    AttachOps(bindings::dma_buf_attach_ops { allow_peer2peer: true, move_notify: Some(move_notify) });
#[cfg(not(ugds_linux_6_12))]
static ATTACH_OPS: AttachOps =
    AttachOps(bindings::dma_buf_attach_ops { allow_peer2peer: true, invalidate_mappings: Some(move_notify) });

/// A dma-buf attached, pinned and mapped for one device.
///
/// # Invariants
///
/// `buf` holds a reference from `dma_buf_get`; `attach` is a dynamic attachment of it for
/// the device, pinned, with `sgt` its mapping; all undone exactly once in `Drop`.
pub(crate) struct DmabufMapping {
    /// The importing device (for the IOTLB flush at unmap).
    dev: Device,
    buf: NonNull<bindings::dma_buf>,
    attach: NonNull<bindings::dma_buf_attachment>,
    sgt: NonNull<bindings::sg_table>,
    segments: KVVec<Segment>,
    len: u64,
}

// SAFETY: the pointers are used only in `Drop` (with ownership); `segments` is plain data.
unsafe impl Send for DmabufMapping {}
// SAFETY: `&self` only reads `segments`.
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
    /// Imports `[offset, offset + len)` of the dma-buf behind `fd` for `dev`.
    ///
    /// Errors: `EBADF` (not an open fd), `EINVAL` (not a dma-buf, or the range exceeds it), or
    /// what the exporter returns for attach/pin/map.
    pub(crate) fn import(dev: &Device, fd: i32, offset: u64, len: u64) -> Result<Self> {
        // SAFETY: dma_buf_get validates the fd and takes a reference.
        let buf = err_ptr(unsafe { bindings::dma_buf_get(fd) })?;
        // SAFETY: we hold a reference to `buf`.
        let size = unsafe { (*buf.as_ptr()).size } as u64;
        if offset.checked_add(len).map_or(true, |e| e > size) {
            // SAFETY: drop the reference taken above.
            unsafe { bindings::dma_buf_put(buf.as_ptr()) };
            return Err(EINVAL);
        }
        // SAFETY: `buf` is referenced; the device is live; ATTACH_OPS is static.
        let attach = match err_ptr(unsafe {
            bindings::dma_buf_dynamic_attach(buf.as_ptr(), dev.as_device_ptr(), &ATTACH_OPS.0, core::ptr::null_mut())
        }) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: drop the reference taken above.
                unsafe { bindings::dma_buf_put(buf.as_ptr()) };
                return Err(e);
            }
        };
        let mapped = {
            // SAFETY: `buf` is referenced, so its reservation object is live.
            let _g = unsafe { ResvGuard::lock((*buf.as_ptr()).resv) };
            // SAFETY: the attachment is ours and the reservation lock is held.
            let r = unsafe { bindings::dma_buf_pin(attach.as_ptr()) };
            if r != 0 {
                Err(Error::from_errno(r))
            } else {
                // SAFETY: pinned, lock held.
                match err_ptr(unsafe { bindings::dma_buf_map_attachment(attach.as_ptr(), DMA_BIDIRECTIONAL) }) {
                    Ok(s) => Ok(s),
                    Err(e) => {
                        // SAFETY: undo the pin, lock still held.
                        unsafe { bindings::dma_buf_unpin(attach.as_ptr()) };
                        Err(e)
                    }
                }
            }
        };
        let sgt = match mapped {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: undo attach and reference, in reverse order.
                unsafe {
                    bindings::dma_buf_detach(buf.as_ptr(), attach.as_ptr());
                    bindings::dma_buf_put(buf.as_ptr());
                }
                return Err(e);
            }
        };
        // INVARIANT: referenced, attached, pinned, mapped; `Drop` undoes it from here.
        let mut me = DmabufMapping { dev: dev.clone(), buf, attach, sgt, segments: KVVec::new(), len };
        me.collect_segments(offset, len)?;
        Ok(me)
    }

    fn collect_segments(&mut self, mut skip: u64, mut want: u64) -> Result {
        // SAFETY: `sgt` points to the exporter's live mapping of our attachment, which stays
        // mapped for as long as `self` lives (invariant).
        for (addr, l) in unsafe { dma_segments(self.sgt.as_ref()) } {
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

    /// The DMA segments of the imported range.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
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
            {
                let _g = ResvGuard::lock((*self.buf.as_ptr()).resv);
                bindings::dma_buf_unmap_attachment(self.attach.as_ptr(), self.sgt.as_ptr(), DMA_BIDIRECTIONAL);
            }
            // Before the exporter may move or free the memory: no late DMA through a stale
            // IOTLB entry.
            super::pin::flush_deferred_iotlb(&self.dev);
            {
                let _g = ResvGuard::lock((*self.buf.as_ptr()).resv);
                bindings::dma_buf_unpin(self.attach.as_ptr());
            }
            bindings::dma_buf_detach(self.buf.as_ptr(), self.attach.as_ptr());
            bindings::dma_buf_put(self.buf.as_ptr());
        }
    }
}
