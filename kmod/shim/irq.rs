//! MSI-X vectors and interrupt handlers that signal an eventfd (shaped like upstream
//! `kernel::irq` plus an eventfd handle).

use super::pci::Device;
use crate::bindings;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, Ordering};
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

/// What an [`EventfdIrq`]'s handler reads: the eventfd it signals, its IRQ, and whether it
/// masks itself after firing.
struct Shared {
    ctx: NonNull<bindings::eventfd_ctx>,
    irq: u32,
    /// [`ALWAYS`] until the first [`EventfdIrq::arm`]; then [`ARMED`], [`FIRING`] (the handler
    /// is masking the vector) or [`MASKED`].
    state: AtomicU8,
}

/// Every interrupt signals the eventfd (the state before the first arm).
const ALWAYS: u8 = 0;
/// The next interrupt masks the vector, then signals the eventfd.
const ARMED: u8 = 1;
/// The handler is between taking the armed state and masking the vector.
const FIRING: u8 = 2;
/// Masked (`disable_irq_nosync` once) until the next arm unmasks it (`enable_irq` once).
const MASKED: u8 = 3;

/// An interrupt handler that signals an eventfd; the handler is freed, then the eventfd
/// reference dropped, on drop.
///
/// Once armed ([`EventfdIrq::arm`]) it is one-shot: on the next interrupt it masks the vector
/// and signals, until armed again, so a queue whose waiters spin takes no interrupts and only a
/// waiter about to sleep pays for one. A completion that comes while masked is latched by the
/// interrupt core and delivered at the arm. Every mask is matched by exactly one unmask: only
/// the handler masks (from [`ARMED`], through [`FIRING`]), only an arm unmasks (from
/// [`MASKED`], which the handler stores after masking), so `enable_irq` never finds the
/// vector enabled. Freeing a masked handler is balanced too: the last `free_irq` shuts the
/// vector down, which resets its disable depth.
///
/// # Invariants
///
/// `shared` is a live allocation of ours whose `ctx` holds an eventfd reference, and is the
/// `dev_id` of a handler requested on `shared.irq`; it is freed only after `free_irq`.
pub(crate) struct EventfdIrq {
    shared: NonNull<Shared>,
}

// SAFETY: the handle frees the handler and its data, and arms it (atomics and the IRQ core's
// own locking), from any thread.
unsafe impl Send for EventfdIrq {}
// SAFETY: `arm` is safe from several threads at once (see its state machine).
unsafe impl Sync for EventfdIrq {}

unsafe extern "C" fn signal_eventfd(_irq: kernel::ffi::c_int, data: *mut kernel::ffi::c_void) -> bindings::irqreturn_t {
    // SAFETY: `data` is the `Shared` registered with this handler; it lives until free_irq
    // (which waits for running handlers) has returned.
    let s = unsafe { &*data.cast::<Shared>() };
    // Masked before the signal: a waiter that sees the signal and arms again at once finds
    // the vector masked and unmasks it. Signalled first, its arm could find the handler still
    // armed and return, and the mask that followed swallowed the next interrupt.
    if s.state.compare_exchange(ARMED, FIRING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        // SAFETY: our own IRQ, from its handler (the non-waiting variant is for exactly that).
        unsafe { bindings::disable_irq_nosync(s.irq) };
        s.state.store(MASKED, Ordering::Release);
    }
    // SAFETY: the eventfd stays referenced for as long as `s` lives.
    unsafe { bindings::eventfd_signal_mask(s.ctx.as_ptr(), 0) };
    IRQ_HANDLED as _
}

impl EventfdIrq {
    /// Takes a reference to the eventfd `fd` and signals it from interrupt `irq`.
    ///
    /// Errors: `EBADF` (not an open fd), `EINVAL` (not an eventfd), `ENOMEM`, or request_irq's
    /// error.
    pub(crate) fn attach(irq: Irq, fd: i32, name: &'static CStr) -> Result<Self> {
        let irq = irq.0;
        // SAFETY: eventfd_ctx_fdget validates the fd and takes a reference.
        let ctx = unsafe { bindings::eventfd_ctx_fdget(fd) };
        let v = ctx as isize;
        if (-4095..0).contains(&v) {
            return Err(Error::from_errno(v as i32));
        }
        let ctx = NonNull::new(ctx).ok_or(EINVAL)?;
        let shared = match KBox::new(Shared { ctx, irq, state: AtomicU8::new(ALWAYS) }, GFP_KERNEL) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: drop the reference taken above.
                unsafe { bindings::eventfd_ctx_put(ctx.as_ptr()) };
                return Err(e.into());
            }
        };
        let shared = NonNull::new(KBox::into_raw(shared)).ok_or(ENOMEM)?;
        // SAFETY: `shared` stays allocated, and its eventfd referenced, until after free_irq;
        // the handler only signals it and masks its own IRQ.
        let r = unsafe {
            bindings::request_threaded_irq(
                irq,
                Some(signal_eventfd),
                None,
                0,
                name.as_char_ptr().cast(),
                shared.as_ptr().cast(),
            )
        };
        if r != 0 {
            // SAFETY: no handler has it; take the allocation back and drop the reference.
            unsafe {
                let s = KBox::from_raw(shared.as_ptr());
                bindings::eventfd_ctx_put(s.ctx.as_ptr());
            }
            return Err(Error::from_errno(r));
        }
        // INVARIANT: handler requested with `shared` as dev_id.
        Ok(EventfdIrq { shared })
    }

    /// Arms the handler: the next interrupt (or one that came while it was masked) signals the
    /// eventfd, then masks the vector again.
    pub(crate) fn arm(&self) {
        // SAFETY: by the invariant, `shared` lives as long as `self`.
        let s = unsafe { self.shared.as_ref() };
        loop {
            match s.state.load(Ordering::Acquire) {
                ALWAYS => {
                    if s.state.compare_exchange(ALWAYS, ARMED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        return;
                    }
                }
                MASKED => {
                    if s.state.compare_exchange(MASKED, ARMED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        // SAFETY: the handler masked it once (MASKED is stored after its
                        // disable_irq_nosync) and only this arm, which took MASKED, unmasks.
                        unsafe { bindings::enable_irq(s.irq) };
                        return;
                    }
                }
                ARMED => return,
                // The handler is masking the vector on another CPU: a few instructions.
                _ => core::hint::spin_loop(),
            }
        }
    }
}

impl Drop for EventfdIrq {
    fn drop(&mut self) {
        // SAFETY: by the invariant; free_irq waits for a running handler, after which nothing
        // uses `shared`, which is then freed with its eventfd reference.
        unsafe {
            let irq = self.shared.as_ref().irq;
            bindings::free_irq(irq, self.shared.as_ptr().cast());
            let s = KBox::from_raw(self.shared.as_ptr());
            bindings::eventfd_ctx_put(s.ctx.as_ptr());
        }
    }
}
