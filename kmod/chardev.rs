//! `/dev/ugds_drvN`: open, release, the ioctls and mmap of the uapi ABI. Every argument is validated
//! before anything changes; each failure has its own documented errno (uapi `ioctl` docs).

use crate::admin::PassthruBuffer;
use crate::ctrl::{self, ADMIN_TIMEOUT_MS};
use crate::device::Controller;
use crate::openers::{list_openers, OpenRecord};
use crate::qpair::Qpair;
use crate::registry::{Backing, Registration};
use crate::shim::chrdev::{FileHandle, FileOps, FopsTable, VmOpsTable};
use crate::shim::dmabuf::DmabufMapping;
use crate::shim::irq::EventfdIrq;
use crate::shim::mm::{Fault, Vma};
use crate::shim::pin::PinnedUserMemory;
use crate::shim::task::{current_tgid, MmGrab};
use crate::shim::uaccess::{read_arg, write_arg, write_slice};
use crate::uapi::args::{ArgError, EventfdAction, Limits};
use crate::uapi::ioctl::*;
use crate::uapi::regs::{cq_head_doorbell, sq_tail_doorbell, REG_DOORBELL_BASE};
use kernel::prelude::*;
use kernel::sync::Arc;

/// End of the user address space on x86-64 (TASK_SIZE_MAX with 4-level paging).
const USER_END: u64 = 0x7FFF_FFFF_F000;

/// The limits the argument checks (uapi `args`) compare against.
fn limits(c: &Controller) -> Limits {
    Limits { max_queue_entries: c.info.max_queue_entries, user_end: USER_END }
}

/// A refused argument as the errno the ABI documents for it.
fn arg_error(e: ArgError) -> Error {
    Error::from_errno(-e.errno())
}

/// The file operations of `/dev/ugds_drvN`.
pub(crate) struct Chardev;

/// The (static, see `FopsTable`) table `chrdev_open` installs on every open file.
/// Its owner is this module, so open files keep the module loaded.
pub(crate) static FOPS: FopsTable = FopsTable::new::<Chardev>(&crate::THIS_MODULE);

/// The VMA operations of every mapping of `/dev/ugds_drvN` (pages are inserted at fault time).
static VMOPS: VmOpsTable = VmOpsTable::new::<Chardev>();

/// Per-open-file state: the controller and the process that opened the file; what the file
/// owns lives in the controller's tables, tagged with the file's handle.
pub(crate) struct OpenFile {
    ctrl: Arc<Controller>,
    /// The opener's address space: only that process may use the file (a child made by fork,
    /// or a process the fd was passed to, gets `EPERM`), since queue pairs, doorbells and
    /// registrations are the opener's.
    owner: MmGrab,
    /// Opened with `O_EXCL`.
    exclusive: bool,
}

impl FileOps for Chardev {
    type Device = Arc<Controller>;
    type File = OpenFile;

    fn open(dev: &Arc<Controller>, handle: FileHandle, exclusive: bool) -> Result<KBox<OpenFile>> {
        let owner = MmGrab::current().ok_or(EPERM)?;
        let file = KBox::new(OpenFile { ctrl: dev.clone(), owner, exclusive }, GFP_KERNEL)?;
        let mut inner = dev.inner.lock();
        if inner.hw.is_none() {
            return Err(ENODEV);
        }
        // One opener per controller for whoever asks for isolation (docs/design.md: openers share
        // one DMA trust domain).
        if inner.exclusive || (exclusive && inner.files.len() > 0) {
            return Err(EBUSY);
        }
        inner.files.insert(OpenRecord { handle, tgid: current_tgid(), exclusive })?;
        inner.exclusive = exclusive;
        Ok(file)
    }

    fn release(file: KBox<OpenFile>, handle: FileHandle) {
        file.ctrl.release_file(handle, file.exclusive);
    }

    fn ioctl(file: &OpenFile, handle: FileHandle, cmd: u32, arg: usize) -> Result<isize> {
        if !file.owner.is_current() {
            return Err(EPERM);
        }
        let c = &*file.ctrl;
        match cmd {
            IOCTL_GET_INFO => {
                write_arg(arg, &c.info)?;
                Ok(0)
            }
            IOCTL_CREATE_QPAIR => {
                let mut a: CreateQpair = read_arg(arg)?;
                create_qpair(c, handle, &mut a)?;
                if let Err(e) = write_arg(arg, &a) {
                    // The caller cannot learn the qid: undo.
                    let _ = delete_qpair(c, handle, a.qid);
                    return Err(e);
                }
                Ok(0)
            }
            IOCTL_DELETE_QPAIR => {
                let a: DeleteQpair = read_arg(arg)?;
                let qid = a.check().map_err(arg_error)?;
                delete_qpair(c, handle, qid).map(|_| 0)
            }
            IOCTL_REARM_QPAIR => {
                let a: DeleteQpair = read_arg(arg)?;
                let qid = a.check().map_err(arg_error)?;
                rearm_qpair(c, handle, qid).map(|_| 0)
            }
            IOCTL_REGISTER_HOST => {
                let mut a: RegisterHost = read_arg(arg)?;
                a.handle = register_host(c, &file.owner, handle, &a)?;
                if let Err(e) = write_arg(arg, &a) {
                    let _ = deregister(c, handle, a.handle.id, a.handle.generation);
                    return Err(e);
                }
                Ok(0)
            }
            IOCTL_REGISTER_DMABUF => {
                let mut a: RegisterDmabuf = read_arg(arg)?;
                a.handle = register_dmabuf(&file.ctrl, handle, &a)?;
                if let Err(e) = write_arg(arg, &a) {
                    let _ = deregister(c, handle, a.handle.id, a.handle.generation);
                    return Err(e);
                }
                Ok(0)
            }
            IOCTL_GET_SEGMENTS => {
                let a: GetSegments = read_arg(arg)?;
                get_segments(c, handle, &a)
            }
            IOCTL_DEREGISTER => {
                let a: Deregister = read_arg(arg)?;
                deregister(c, handle, a.id, a.generation).map(|_| 0)
            }
            IOCTL_SET_EVENTFD => {
                let a: SetEventfd = read_arg(arg)?;
                set_eventfd(c, handle, &a).map(|_| 0)
            }
            IOCTL_ARM_IRQ => {
                let a: DeleteQpair = read_arg(arg)?;
                let qid = a.check().map_err(arg_error)?;
                arm_irq(c, handle, qid).map(|_| 0)
            }
            IOCTL_ADMIN_CMD => {
                let mut a: AdminCommand = read_arg(arg)?;
                admin_cmd(c, &mut a)?;
                write_arg(arg, &a)?;
                Ok(0)
            }
            IOCTL_RESET => {
                let a: Reset = read_arg(arg)?;
                let mut inner = c.inner.lock();
                // Asked for on the strength of an epoch that a reset has ended since (another
                // opener's, or a revocation's, which the caller saw as a fault while it ran):
                // the controller already started over.
                if a.seen_epoch != 0 && a.seen_epoch != inner.epoch && !inner.faulted && inner.hw.is_some() {
                    return Ok(0);
                }
                let r = c.reset_locked(&mut inner);
                c.publish(&inner);
                r.map(|_| 0)
            }
            IOCTL_LIST_OPENERS => list_openers(c, arg),
            _ => Err(ENOTTY),
        }
    }

    fn mmap(file: &OpenFile, handle: FileHandle, vma: &mut Vma) -> Result {
        if !file.owner.is_current() {
            return Err(EPERM);
        }
        let c = &*file.ctrl;
        let base = vma.offset();
        let (kind, qid) = parse_mmap_offset(base).ok_or(EINVAL)?;
        if !vma.is_shared() || vma.len() == 0 {
            return Err(EINVAL);
        }
        let inner = c.inner.lock();
        if inner.hw.is_none() {
            return Err(ENODEV);
        }
        match kind {
            MmapKind::Doorbells => {
                if qid != 0 || vma.len() as u64 > c.doorbells.len {
                    return Err(EINVAL);
                }
                if c.doorbells.blocked {
                    return Err(EACCES);
                }
                vma.set_uncached();
            }
            MmapKind::Status => {
                if qid != 0 || vma.len() > c.status.size() {
                    return Err(EINVAL);
                }
                if vma.is_writable() {
                    return Err(EPERM);
                }
                vma.deny_write();
            }
            MmapKind::ShadowDoorbells | MmapKind::EventIndexes => {
                // Like the doorbell registers: every opener's queues share the page.
                let s = inner.hw.as_ref().and_then(|hw| hw.shadow.as_ref()).ok_or(ENODEV)?;
                if qid != 0 || vma.len() > s.size() {
                    return Err(EINVAL);
                }
                if c.doorbells.blocked {
                    return Err(EACCES);
                }
                if kind == MmapKind::EventIndexes {
                    // The controller's to write.
                    if vma.is_writable() {
                        return Err(EPERM);
                    }
                    vma.deny_write();
                }
            }
            MmapKind::Sq | MmapKind::Cq | MmapKind::PrpPool => {
                let qp = inner.qpairs.iter().find(|q| q.qid == qid && q.owner == handle).ok_or(ENOENT)?;
                if Some(vma.len()) != qp.region_size(kind) {
                    return Err(EINVAL);
                }
            }
        }
        // Nothing is mapped now: `fault` inserts the pages under the controller lock, which
        // queue deletion, reset and unbind hold while they revoke mappings.
        vma.fill_on_fault(&VMOPS, base);
        Ok(())
    }

    fn fault(file: &OpenFile, handle: FileHandle, fault: &mut Fault) -> Result {
        let c = &*file.ctrl;
        let base = fault.tag();
        let (kind, qid) = parse_mmap_offset(base).ok_or(EINVAL)?;
        let inner = c.inner.lock();
        // The byte offset into the region of a page at file offset `off` (never below `base`).
        let rel = |off: u64| off.checked_sub(base).ok_or(EINVAL);
        match kind {
            // The status page lives as long as the controller state, which every open file
            // (and so every VMA, through its file) keeps.
            MmapKind::Status => fault.fill(|off| c.status.pfn(rel(off)?)),
            MmapKind::Doorbells => {
                // Unbound: BAR0 may belong to another driver now.
                let hw = inner.hw.as_ref().ok_or(ENODEV)?;
                let len = c.doorbells.len;
                fault.fill(|off| {
                    let r = rel(off)?;
                    if r >= len {
                        return Err(EINVAL);
                    }
                    hw.bar.pfn(REG_DOORBELL_BASE as u64 + r)
                })
            }
            MmapKind::ShadowDoorbells | MmapKind::EventIndexes => {
                // Unbound: the pages went with the controller's hardware state.
                let s = inner.hw.as_ref().and_then(|hw| hw.shadow.as_ref()).ok_or(ENODEV)?;
                fault.fill(|off| s.pfn(kind, rel(off)?))
            }
            MmapKind::Sq | MmapKind::Cq | MmapKind::PrpPool => {
                // Deleted (or unbound): the memory is gone or going.
                let qp = inner.qpairs.iter().find(|q| q.qid == qid && q.owner == handle).ok_or(ENOENT)?;
                fault.fill(|off| qp.region_pfn(kind, rel(off)?))
            }
        }
    }
}

fn create_qpair(c: &Controller, handle: FileHandle, a: &mut CreateQpair) -> Result {
    let req = a.check(&limits(c)).map_err(arg_error)?;
    let flags = if req.irq { QPAIR_FLAG_IRQ } else { 0 };
    let mut inner = c.inner.lock();
    if inner.faulted {
        return Err(EIO);
    }
    let qid = (1..=c.info.max_qpairs as u16)
        .find(|q| !inner.qpairs.iter().any(|qp| qp.qid == *q))
        .ok_or(ENOSPC)?;
    let hw = inner.hw.as_mut().ok_or(ENODEV)?;
    if req.irq && qid as u32 >= hw.irqs.as_ref().map_or(0, |v| v.count()) {
        // No MSI-X vector left for this queue id.
        return Err(ENOSPC);
    }
    // The slot that will track the queue pair is allocated before the controller gets the
    // queue: once it is created there, its memory must not be freed untracked (an insert that
    // failed on allocation used to drop it while the controller still owned it).
    inner.qpairs.reserve_one()?;
    let mut qp = Qpair::alloc(&c.pdev, handle, qid, req.depth, flags)?;
    if let Err((e, safe)) = c.arm_locked(&mut inner, &mut qp) {
        if !safe {
            pr_err!("{}: controller wedged creating qid {}: its memory stays allocated\n", c.pdev.name(), qid);
            core::mem::forget(qp);
        }
        c.publish(&inner);
        return Err(e);
    }
    let dstrd = c.cap.dstrd();
    *a = CreateQpair {
        depth: req.depth,
        flags,
        qid: qid as u32,
        irq_vector: if req.irq { qid as u32 } else { 0 },
        sq_offset: mmap_offset(MmapKind::Sq, qid),
        sq_size: qp.sq.size() as u64,
        cq_offset: mmap_offset(MmapKind::Cq, qid),
        cq_size: qp.cq.size() as u64,
        prp_offset: mmap_offset(MmapKind::PrpPool, qid),
        prp_size: qp.prp.size() as u64,
        prp_dma: qp.prp.dma_handle(),
        sq_doorbell: (sq_tail_doorbell(qid, dstrd) - REG_DOORBELL_BASE) as u64,
        cq_doorbell: (cq_head_doorbell(qid, dstrd) - REG_DOORBELL_BASE) as u64,
    };
    // Cannot fail: a free slot was reserved above and the lock has been held since.
    inner.qpairs.insert(qp)?;
    c.publish(&inner);
    Ok(())
}

/// Re-creates the caller's queue pair `qid` on the controller after a reset (a no-op when it is
/// armed). The caller does this under its own exclusion over the queue, so no submitter of the
/// old epoch is left to write its tail.
fn rearm_qpair(c: &Controller, handle: FileHandle, qid: u32) -> Result {
    let mut inner = c.inner.lock();
    if inner.hw.is_none() {
        return Err(ENODEV);
    }
    if inner.faulted {
        return Err(EIO);
    }
    let slot = inner.qpairs.find_index(|q| q.qid as u32 == qid && q.owner == handle).ok_or(ENOENT)?;
    if inner.qpairs.get(slot).is_some_and(|q| q.armed) {
        return Ok(());
    }
    let mut qp = inner.qpairs.take(slot).ok_or(ENOENT)?;
    // Whatever its owner wrote since the reset goes: the re-created queue starts empty.
    let r = qp.clear_all().map_err(|e| (e, true)).and_then(|()| c.arm_locked(&mut inner, &mut qp));
    match r {
        Err((e, false)) => {
            pr_err!("{}: controller wedged re-arming qid {}: its memory stays allocated\n", c.pdev.name(), qid);
            qp.zap_user_mappings();
            core::mem::forget(qp);
            c.publish(&inner);
            Err(e)
        }
        r => {
            // Cannot fail: the slot was freed just above and the lock has been held since.
            inner.qpairs.insert(qp)?;
            c.publish(&inner);
            r.map_err(|(e, _)| e)
        }
    }
}

fn delete_qpair(c: &Controller, handle: FileHandle, qid: u32) -> Result {
    let mut inner = c.inner.lock();
    let qp = inner.qpairs.remove_first(|q| q.qid as u32 == qid && q.owner == handle).ok_or(ENOENT)?;
    qp.zap_user_mappings();
    let doomed = [qp];
    if c.stop_qpairs_locked(&mut inner, &doomed) {
        drop(doomed);
    } else {
        pr_err!("{}: controller wedged deleting qid {}: its memory stays allocated\n", c.pdev.name(), qid);
        core::mem::forget(doomed);
    }
    c.publish(&inner);
    Ok(())
}

fn register_host(c: &Controller, owner: &MmGrab, handle: FileHandle, a: &RegisterHost) -> Result<RegistrationHandle> {
    let r = a.check(&limits(c)).map_err(arg_error)?;
    // Charged to the opener first (as VFIO does), so a refused charge pins nothing.
    let charge = owner.charge_locked((r.len / 4096) as usize)?;
    // Pin before taking the lock: pinning may fault pages in and take a while.
    let mem = PinnedUserMemory::pin(&c.pdev, r.addr, r.len)?;
    insert_registration(c, handle, Backing::Host { mem, _charge: charge })
}

fn register_dmabuf(c: &Arc<Controller>, handle: FileHandle, a: &RegisterDmabuf) -> Result<RegistrationHandle> {
    let r = a.check().map_err(arg_error)?;
    // A revocation resets this controller (see `Controller::quiesce`).
    let m = DmabufMapping::import(&c.pdev, r.fd, r.offset, r.len, c.clone())?;
    insert_registration(c, handle, Backing::Dmabuf(m))
}

fn insert_registration(c: &Controller, handle: FileHandle, backing: Backing) -> Result<RegistrationHandle> {
    let mut inner = c.inner.lock();
    if inner.hw.is_none() {
        return Err(ENODEV);
    }
    // Reserved first, so the insert below cannot fail and drop the registration under the lock.
    inner.regs.reserve_one()?;
    let generation = inner.next_generation;
    inner.next_generation = inner.next_generation.checked_add(1).unwrap_or(1);
    let reg = Registration { owner: handle, generation, backing };
    let nsegs = reg.segments().len() as u32;
    // The id is the slot plus one (looked up in constant time).
    let slot = inner.regs.insert(reg)?;
    let Ok(id) = u32::try_from(slot + 1) else {
        let r = inner.regs.take(slot);
        drop(inner);
        drop(r);
        return Err(ENOSPC);
    };
    c.publish(&inner);
    Ok(RegistrationHandle { id, generation, nsegs, reserved: 0 })
}

fn get_segments(c: &Controller, handle: FileHandle, a: &GetSegments) -> Result<isize> {
    // Copy out of the lock first: copy_to_user may fault and take mmap_lock, which mmap holds
    // while it takes our lock (lockdep found this ordering under the debug kernel).
    let mut out = KVVec::new();
    {
        let inner = c.inner.lock();
        let r = find_reg(&inner.regs, handle, a.id, a.generation)?;
        let segs = r.segments();
        let w = a.check(segs.len()).map_err(arg_error)?;
        out.extend_from_slice(&segs[w.first..w.first + w.count], GFP_KERNEL)?;
    }
    write_slice(a.segments as usize, &out)?;
    Ok(out.len() as isize)
}

fn find_reg<'a>(
    regs: &'a crate::table::Table<Registration>,
    handle: FileHandle,
    id: u32,
    generation: u32,
) -> Result<&'a Registration> {
    let r = reg_slot(id)
        .and_then(|i| regs.get(i))
        .filter(|r| r.owner == handle)
        .ok_or(ENOENT)?;
    if r.generation != generation {
        return Err(crate::errno::estale());
    }
    if r.revoked() {
        return Err(crate::errno::ekeyrevoked());
    }
    Ok(r)
}

/// The table slot of registration `id` (ids are slot + 1; 0 is never an id).
fn reg_slot(id: u32) -> Option<usize> {
    (id as usize).checked_sub(1)
}

fn deregister(c: &Controller, handle: FileHandle, id: u32, generation: u32) -> Result {
    let mut inner = c.inner.lock();
    find_reg(&inner.regs, handle, id, generation)?;
    let r = reg_slot(id).and_then(|i| inner.regs.take(i));
    c.publish(&inner);
    drop(inner);
    drop(r);
    Ok(())
}

/// Runs one allowed admin command for the caller (`ADMIN_CMD`): checked (opcode first) before
/// anything else happens, built by the module, transferred into a [`PassthruBuffer`] of the
/// module's, serialised with the driver's own admin commands by the controller mutex, and the
/// data copied to the caller after the mutex is released (a copy to user space may fault and
/// take `mmap_lock`, which a page fault on our mappings holds while it takes the mutex).
fn admin_cmd(c: &Controller, a: &mut AdminCommand) -> Result {
    let req = a.check(&limits(c), c.info.mdts_bytes).map_err(arg_error)?;
    let buf = PassthruBuffer::new(&c.pdev, req.len)?;
    let (prp1, prp2) = buf.prps();
    let mut inner = c.inner.lock();
    if inner.faulted {
        return Err(EIO);
    }
    let hw = inner.hw.as_mut().ok_or(ENODEV)?;
    if hw.admin.is_broken() {
        return Err(EIO);
    }
    let cqe = match hw.admin.submit_raw(&hw.bar, req.sqe(prp1, prp2), ADMIN_TIMEOUT_MS) {
        Ok(cqe) => cqe,
        Err(e) => {
            // Timed out (or failed after the entry went into the SQ): the controller may still
            // run the command and write `buf`, which goes only once a reset (or a disable)
            // confirmed it stopped.
            pr_err!("{}: admin pass-through failed ({:?}): resetting the controller\n", c.pdev.name(), e);
            let safe = c.reset_locked(&mut inner).is_ok()
                || inner.hw.as_ref().is_some_and(|hw| ctrl::disable(&hw.bar, c.cap).is_ok());
            if !safe {
                inner.faulted = true;
                pr_err!("{}: controller wedged: the pass-through buffer stays allocated\n", c.pdev.name());
                core::mem::forget(buf);
            }
            c.publish(&inner);
            return Err(e);
        }
    };
    drop(inner);
    a.result = cqe.dw0();
    a.status = cqe.status().to_field() as u32;
    if a.status == 0 && req.len > 0 {
        let out = buf.copy_out()?;
        write_slice(req.data as usize, &out)?;
    }
    Ok(())
}

/// Arms the interrupt of queue `qid` (this file's, with an eventfd attached): `ENOENT` for no
/// such queue of this file's, `EINVAL` for one without an eventfd.
fn arm_irq(c: &Controller, handle: FileHandle, qid: u32) -> Result {
    let inner = c.inner.lock();
    let qp = inner.qpairs.iter().find(|q| q.qid as u32 == qid && q.owner == handle).ok_or(ENOENT)?;
    qp.irq.as_ref().ok_or(EINVAL)?.arm();
    Ok(())
}

fn set_eventfd(c: &Controller, handle: FileHandle, a: &SetEventfd) -> Result {
    let qid = a.qid;
    let mut inner = c.inner.lock();
    let inner = &mut *inner;
    let hw = inner.hw.as_ref().ok_or(ENODEV)?;
    let qp = inner.qpairs.iter_mut().find(|q| q.qid as u32 == qid && q.owner == handle).ok_or(ENOENT)?;
    if qp.flags & QPAIR_FLAG_IRQ == 0 {
        return Err(EINVAL);
    }
    let action = a.check().map_err(arg_error)?;
    // Free the old handler first: the vector is not shared.
    qp.irq = None;
    if let EventfdAction::Attach(fd) = action {
        let irq = hw.irqs.as_ref().ok_or(EINVAL)?.irq(qid)?;
        qp.irq = Some(EventfdIrq::attach(irq, fd, kernel::c_str!("ugds"))?);
    }
    Ok(())
}
