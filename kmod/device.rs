//! A bound controller and everything it owns: the hardware (BAR, admin queue), the queue pairs
//! and registrations of every open file, and the status page. One mutex guards it all: this is
//! the control plane, where simplicity beats concurrency.
//!
//! Teardown order (docs/design.md, memory invariant 2): queue pairs are deleted through the admin
//! queue (or the controller is disabled and RDY=0 observed) before any memory the SSD could write
//! is unmapped, unpinned or freed.

use crate::admin::AdminQueue;
use crate::ctrl::{self, ADMIN_TIMEOUT_MS};
use crate::qpair::Qpair;
use crate::openers::OpenRecord;
use crate::registry::Registration;
use crate::shim::chrdev::FileHandle;
use crate::shim::dmabuf::Revoker;
use crate::shim::dma::{dma_write, CoherentAllocation};
use crate::shim::irq::IrqVectors;
use crate::shim::pci;
use crate::shadow::ShadowDoorbells;
use crate::table::Table;
use crate::uapi::ioctl::{ControllerState, DeviceInfo, StatusPage, ABI_VERSION, STATUS_MAGIC};
use crate::uapi::queue::{feature, Sqe};
use crate::uapi::regs::Cap;
use crate::Bar0;
use core::mem::ManuallyDrop;
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex};

/// The hardware of a bound controller. Dropping it disables the controller (waiting for
/// RDY=0) and only then frees the admin queue; then BAR0 is unmapped and the PCI device
/// disabled (field order).
pub(crate) struct Hw {
    /// BAR0.
    pub(crate) bar: Bar0,
    /// CAP (for the disable timeout).
    pub(crate) cap: Cap,
    /// The admin queue; freed by `Drop` only once the controller stopped.
    pub(crate) admin: ManuallyDrop<AdminQueue>,
    /// MSI-X vectors (vector N serves queue pair N; 0 is the admin queue's, unused: polled).
    pub(crate) irqs: Option<IrqVectors>,
    /// Shadow doorbells, where the controller takes them; freed by `Drop` only once the
    /// controller stopped (it reads one page and writes the other).
    pub(crate) shadow: ManuallyDrop<Option<ShadowDoorbells>>,
    /// Memory decoding and bus mastering; dropped last.
    pub(crate) enabled: pci::Enabled,
}

impl Drop for Hw {
    fn drop(&mut self) {
        if ctrl::disable(&self.bar, self.cap).is_ok() {
            // SAFETY: each dropped exactly once, here; the controller no longer uses them.
            unsafe {
                ManuallyDrop::drop(&mut self.admin);
                ManuallyDrop::drop(&mut self.shadow);
            }
        } else {
            pr_err!("controller did not stop: leaking its admin queue and shadow doorbell memory\n");
        }
    }
}

/// Mutable state of a controller.
pub(crate) struct Inner {
    /// `None` once the device was removed (unbind): every call then fails with ENODEV.
    pub(crate) hw: Option<Hw>,
    /// Set while the controller needs a reset (a command or admin command timed out).
    pub(crate) faulted: bool,
    /// Live queue pairs of every open file.
    pub(crate) qpairs: Table<Qpair>,
    /// Live registrations of every open file.
    pub(crate) regs: Table<Registration>,
    /// Open files (for revoking their mappings on unbind, and LIST_OPENERS).
    pub(crate) files: Table<OpenRecord>,
    /// An open file holds the controller exclusively (`O_EXCL`): no other open succeeds.
    pub(crate) exclusive: bool,
    /// Next registration generation (never 0).
    pub(crate) next_generation: u32,
    /// Bumped by every reset.
    pub(crate) epoch: u64,
    /// Resets since probe.
    pub(crate) resets: u64,
    /// Timeouts that forced a reset since probe (every call of `reset_locked` starts with one).
    pub(crate) timeouts: u64,
    /// dma-buf registrations their exporters revoked since probe (each reset the controller).
    pub(crate) revocations: u64,
}

/// The doorbell range user space may map (from BAR0 offset 0x1000).
#[derive(Clone, Copy)]
pub(crate) struct DoorbellWindow {
    /// Bytes: the doorbells of every queue the controller has, rounded up to a page.
    pub(crate) len: u64,
    /// The MSI-X table or PBA lies in those pages: no doorbell mapping is given out.
    pub(crate) blocked: bool,
}

/// A controller bound to ugds, shared by its device node and every open file.
#[pin_data]
pub(crate) struct Controller {
    /// The PCI device.
    pub(crate) pdev: pci::Device,
    /// What GET_INFO returns.
    pub(crate) info: DeviceInfo,
    /// CAP.
    pub(crate) cap: Cap,
    /// The doorbells user space may map.
    pub(crate) doorbells: DoorbellWindow,
    /// The read-only status page (epoch, faulted, counters).
    pub(crate) status: CoherentAllocation<StatusPage>,
    /// Everything that changes.
    #[pin]
    pub(crate) inner: Mutex<Inner>,
}

impl Controller {
    /// Builds the shared state around a brought-up controller.
    pub(crate) fn new(
        pdev: &pci::Device,
        info: DeviceInfo,
        cap: Cap,
        doorbells: DoorbellWindow,
        hw: Hw,
    ) -> Result<Arc<Self>> {
        let status = CoherentAllocation::alloc_coherent(pdev, 1)?;
        let inner = Inner {
            hw: Some(hw),
            faulted: false,
            qpairs: Table::new(),
            regs: Table::new(),
            files: Table::new(),
            exclusive: false,
            next_generation: 1,
            epoch: 1,
            resets: 0,
            timeouts: 0,
            revocations: 0,
        };
        let c = Arc::pin_init(
            pin_init!(Controller {
                pdev: pdev.clone(),
                info,
                cap,
                doorbells,
                status,
                inner <- kernel::new_mutex!(inner, "ugds::Controller::inner"),
            }),
            GFP_KERNEL,
        )?;
        c.publish(&c.inner.lock());
        Ok(c)
    }

    /// Writes the counters into the status page.
    pub(crate) fn publish(&self, inner: &Inner) {
        let pinned: u64 = inner.regs.iter().map(|r| r.npages() as u64).sum();
        let s = &self.status;
        // Field by field: user space may read the page at any time, and each aligned field is
        // then seen whole. Index 0 always exists, so none of these fails.
        let _ = dma_write!(s[0].magic = STATUS_MAGIC);
        let _ = dma_write!(s[0].abi_version = ABI_VERSION);
        let _ = dma_write!(s[0].pinned_pages = pinned);
        let _ = dma_write!(s[0].registrations = inner.regs.len() as u64);
        let _ = dma_write!(s[0].qpairs = inner.qpairs.len() as u64);
        let _ = dma_write!(s[0].resets = inner.resets);
        let _ = dma_write!(s[0].timeouts = inner.timeouts);
        // Before the state word: whoever sees the epoch a revocation's reset published also sees
        // the revocation counted.
        let _ = dma_write!(s[0].revocations = inner.revocations);
        // Epoch and fault flag in one aligned word, one store: a reader sees both as of one
        // publication (two fields could pair a new epoch with an old fault flag).
        let state = ControllerState::new(inner.epoch, inner.faulted || inner.hw.is_none());
        let _ = dma_write!(s[0].state = state.0);
    }

    /// Resets the controller: publishes the fault (and a new epoch) first, disables it and waits
    /// for RDY=0 (after which it does no DMA), zeroes every queue pair's SQ, CQ and PRP pool and
    /// leaves it un-armed, enables it again and re-negotiates queues; then publishes the next
    /// epoch. Queue pairs come back only when their owners re-arm them ([`Controller::rearm`]),
    /// under their own exclusion, so a tail computed before the reset (by a submitter that
    /// passed its epoch check just before it) hits a queue the controller does not have.
    ///
    /// If the controller never reports RDY=0 it stays faulted and the caller must keep all
    /// memory it could write.
    pub(crate) fn reset_locked(&self, inner: &mut Inner) -> Result {
        if inner.hw.is_none() {
            return Err(ENODEV);
        }
        inner.timeouts += 1;
        self.reset_counted(inner)
    }

    /// [`Controller::reset_locked`] once the cause was counted.
    fn reset_counted(&self, inner: &mut Inner) -> Result {
        inner.faulted = true;
        inner.epoch += 1;
        self.publish(inner);
        let Some(hw) = inner.hw.as_mut() else { return Err(ENODEV) };
        if let Err(e) = ctrl::disable(&hw.bar, self.cap) {
            pr_err!("{}: reset: controller did not stop (CSTS.RDY stayed 1): {:?}\n", self.pdev.name(), e);
            return Err(EIO);
        }
        for qp in inner.qpairs.iter_mut() {
            qp.armed = false;
            qp.clear_all()?;
        }
        ctrl::enable(&hw.bar, self.cap, &mut hw.admin)?;
        let mut sqe = Sqe::new(crate::uapi::queue::admin::SET_FEATURES, 0);
        sqe.set_cdw(10, feature::NUMBER_OF_QUEUES);
        let q = self.info.max_qpairs - 1;
        sqe.set_cdw(11, q | q << 16);
        hw.admin.submit(&hw.bar, sqe, ADMIN_TIMEOUT_MS)?;
        // User space skips doorbell writes the event indexes say are not needed: a controller
        // that no longer takes the pages would never see those queues move, so it stays faulted.
        if let Some(s) = hw.shadow.as_ref() {
            s.configure(&hw.bar, &mut hw.admin)?;
        }
        inner.faulted = false;
        inner.resets += 1;
        inner.epoch += 1;
        pr_info!("{}: controller reset, epoch {}\n", self.pdev.name(), inner.epoch);
        Ok(())
    }

    /// Creates queue pair `qp` on the controller and marks it armed; its memory must be zeroed
    /// (fresh, or cleared by the caller). When that fails in a way that leaves the controller
    /// possibly owning its memory, the controller is reset (or, failing that, disabled), and the
    /// caller learns whether the memory is now safe to free (`Err((e, safe))`).
    pub(crate) fn arm_locked(&self, inner: &mut Inner, qp: &mut Qpair) -> core::result::Result<(), (Error, bool)> {
        let Some(hw) = inner.hw.as_mut() else { return Err((ENODEV, true)) };
        if let Some(s) = hw.shadow.as_ref() {
            // Not created yet: nothing on the controller reads these entries.
            s.clear_queue(qp.qid).map_err(|e| (e, true))?;
        }
        match qp.create_on_device(&hw.bar, &mut hw.admin) {
            Ok(()) => {
                qp.armed = true;
                Ok(())
            }
            Err(f) if !f.controller_may_own => Err((f.err, true)),
            Err(f) => {
                pr_err!("{}: creating queue pair {} failed uncleanly: resetting the controller\n", self.pdev.name(), qp.qid);
                let safe = self.reset_locked(inner).is_ok()
                    || inner.hw.as_ref().is_some_and(|hw| ctrl::disable(&hw.bar, self.cap).is_ok());
                if !safe {
                    inner.faulted = true;
                }
                Err((f.err, safe))
            }
        }
    }

    /// Deletes the given queue pairs (already removed from `inner.qpairs`) on the device and
    /// returns whether it is now safe to free their memory. A failed delete resets the
    /// controller; if even that cannot confirm RDY=0, the memory must be leaked.
    pub(crate) fn stop_qpairs_locked(&self, inner: &mut Inner, doomed: &[Qpair]) -> bool {
        let mut need_reset = false;
        if let Some(hw) = inner.hw.as_mut() {
            for qp in doomed {
                if qp.delete_on_device(&hw.bar, &mut hw.admin).is_err() {
                    need_reset = true;
                    break;
                }
            }
        }
        if need_reset {
            return self.reset_locked(inner).is_ok()
                || inner.hw.as_ref().is_some_and(|hw| ctrl::disable(&hw.bar, self.cap).is_ok());
        }
        true
    }

    /// Releases everything an open file owns: its queue pairs first (deleted on the device),
    /// then its registrations.
    pub(crate) fn release_file(&self, handle: FileHandle, exclusive: bool) {
        let mut inner = self.inner.lock();
        if exclusive {
            inner.exclusive = false;
        }
        let (Ok(doomed), Ok(regs)) =
            (inner.qpairs.remove_all(|q| q.owner == handle), inner.regs.remove_all(|r| r.owner == handle))
        else {
            // Out of memory for the bookkeeping: the entries stay (and stay pinned) until unbind.
            pr_err!("{}: out of memory releasing a file; its resources are freed at unbind\n", self.pdev.name());
            return;
        };
        let safe = self.stop_qpairs_locked(&mut inner, &doomed);
        let regs = if safe {
            drop(doomed);
            Some(regs)
        } else {
            // The controller may still write this memory: leaking it is the only safe choice.
            pr_err!(
                "{}: controller wedged: keeping {} queue pair(s) and {} registration(s) pinned\n",
                self.pdev.name(),
                doomed.len(),
                regs.len()
            );
            core::mem::forget(doomed);
            core::mem::forget(regs);
            None
        };
        let _ = inner.files.remove_first(|f| f.handle == handle);
        self.publish(&inner);
        // Registrations go after the mutex: returning their memory charge takes the owner's
        // mmap_lock, which a page fault holds while it waits for this mutex.
        drop(inner);
        drop(regs);
    }

    /// Unbind: revoke every user mapping, stop the controller, free everything.
    pub(crate) fn shutdown(&self) {
        let mut inner = self.inner.lock();
        for f in inner.files.iter() {
            f.handle.zap(0, 0);
        }
        let stopped = match inner.hw.as_ref() {
            Some(hw) => ctrl::disable(&hw.bar, self.cap).is_ok(),
            None => true,
        };
        let qpairs = core::mem::replace(&mut inner.qpairs, Table::new());
        let regs = core::mem::replace(&mut inner.regs, Table::new());
        let hw = inner.hw.take();
        let regs = if stopped {
            drop(qpairs);
            drop(hw);
            Some(regs)
        } else {
            pr_err!("{}: controller did not stop on unbind: leaking its DMA memory\n", self.pdev.name());
            core::mem::forget(qpairs);
            core::mem::forget(regs);
            core::mem::forget(hw);
            None
        };
        self.publish(&inner);
        // After the mutex, as in `release_file`.
        drop(inner);
        drop(regs);
    }
}

impl Revoker for Controller {
    /// An exporter revoked a dma-buf registered here: any command of any opener may name it, so
    /// the controller is reset (after RDY=0 it does no DMA; every queue pair then waits for its
    /// owner's re-arm, and user space, seeing the epoch move with the revocation counted, checks
    /// its dma-buf registrations before it names one again). A controller that does not stop
    /// loses bus mastering: it can then reach no memory at all, and stays faulted.
    fn quiesce(&self) -> bool {
        let mut inner = self.inner.lock();
        if inner.hw.is_none() {
            // Unbound, and the registration still alive: the controller did not stop at unbind.
            return false;
        }
        inner.revocations += 1;
        let stopped = self.reset_counted(&mut inner).is_ok();
        if !stopped {
            pr_err!("{}: dma-buf revoked and the controller did not reset: bus mastering off\n", self.pdev.name());
            if let Some(hw) = inner.hw.as_ref() {
                hw.enabled.clear_master();
            }
            inner.faulted = true;
        }
        pr_info!("{}: a dma-buf registration was revoked by its exporter\n", self.pdev.name());
        self.publish(&inner);
        true
    }
}
