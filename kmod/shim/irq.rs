//! MSI-X vectors and interrupt handlers that signal an eventfd (shaped like upstream
//! `kernel::irq` plus an eventfd handle).

use super::pci::Device;
use crate::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

// From the target kernel's headers (bindgen), not copied values.
const PCI_IRQ_MSIX: u32 = bindings::PCI_IRQ_MSIX;
const IRQ_HANDLED: u32 = bindings::irqreturn_IRQ_HANDLED;

/// MSI-X vectors allocated for a device; freed on drop (every handler must be gone by then).
pub(crate) struct IrqVectors {
    dev: Device,
    count: u32,
}

impl IrqVectors {
    /// Allocates between 1 and `max` MSI-X vectors.
    pub(crate) fn alloc(dev: &Device, max: u32) -> Result<Self> {
        // SAFETY: the device is live and enabled.
        let n = unsafe { bindings::pci_alloc_irq_vectors(dev.as_raw(), 1, max, PCI_IRQ_MSIX) };
        if n < 0 {
            return Err(Error::from_errno(n));
        }
        Ok(IrqVectors { dev: dev.clone(), count: n as u32 })
    }

    /// Number of vectors.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The Linux IRQ of vector `nr`.
    pub(crate) fn irq(&self, nr: u32) -> Result<Irq> {
        if nr >= self.count {
            return Err(EINVAL);
        }
        // SAFETY: the device is live; `nr` is one of its vectors.
        let irq = unsafe { bindings::pci_irq_vector(self.dev.as_raw(), nr) };
        if irq < 0 {
            return Err(Error::from_errno(irq));
        }
        Ok(Irq(irq as u32))
    }
}

impl Drop for IrqVectors {
    fn drop(&mut self) {
        // SAFETY: allocated by us; all handlers were freed (each `EventfdIrq` is dropped before).
        unsafe { bindings::pci_free_irq_vectors(self.dev.as_raw()) };
    }
}

/// A Linux IRQ number that belongs to one of this driver's [`IrqVectors`] (only they make one),
/// so a handler is never requested on an arbitrary line.
#[derive(Clone, Copy)]
pub(crate) struct Irq(u32);

/// An interrupt handler that signals an eventfd; the handler is freed, then the eventfd
/// reference dropped, on drop.
///
/// # Invariants
///
/// `ctx` holds an eventfd reference and is the `dev_id` of a handler requested on `irq`.
pub(crate) struct EventfdIrq {
    irq: u32,
    ctx: NonNull<bindings::eventfd_ctx>,
}

// SAFETY: the handle is only used to free the handler and the reference, from any thread.
unsafe impl Send for EventfdIrq {}
// SAFETY: `&EventfdIrq` allows nothing.
unsafe impl Sync for EventfdIrq {}

unsafe extern "C" fn signal_eventfd(_irq: kernel::ffi::c_int, data: *mut kernel::ffi::c_void) -> bindings::irqreturn_t {
    // SAFETY: `data` is the eventfd context registered with this handler; it stays referenced
    // until free_irq (which waits for running handlers) has returned.
    unsafe { bindings::eventfd_signal_mask(data.cast(), 0) };
    IRQ_HANDLED as _
}

impl EventfdIrq {
    /// Takes a reference to the eventfd `fd` and signals it from interrupt `irq`.
    ///
    /// Errors: `EBADF` (not an open fd), `EINVAL` (not an eventfd), or request_irq's error.
    pub(crate) fn attach(irq: Irq, fd: i32, name: &'static CStr) -> Result<Self> {
        let irq = irq.0;
        // SAFETY: eventfd_ctx_fdget validates the fd and takes a reference.
        let ctx = unsafe { bindings::eventfd_ctx_fdget(fd) };
        let v = ctx as isize;
        if (-4095..0).contains(&v) {
            return Err(Error::from_errno(v as i32));
        }
        let ctx = NonNull::new(ctx).ok_or(EINVAL)?;
        // SAFETY: `ctx` stays referenced until after free_irq; the handler only signals it.
        let r = unsafe {
            bindings::request_threaded_irq(
                irq,
                Some(signal_eventfd),
                None,
                0,
                name.as_char_ptr().cast(),
                ctx.as_ptr().cast(),
            )
        };
        if r != 0 {
            // SAFETY: drop the reference taken above.
            unsafe { bindings::eventfd_ctx_put(ctx.as_ptr()) };
            return Err(Error::from_errno(r));
        }
        // INVARIANT: handler requested with `ctx` as dev_id.
        Ok(EventfdIrq { irq, ctx })
    }
}

impl Drop for EventfdIrq {
    fn drop(&mut self) {
        // SAFETY: by the invariant; free_irq waits for a running handler, after which nothing
        // uses `ctx`, whose reference is then dropped.
        unsafe {
            bindings::free_irq(self.irq, self.ctx.as_ptr().cast());
            bindings::eventfd_ctx_put(self.ctx.as_ptr());
        }
    }
}
