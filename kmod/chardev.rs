//! `/dev/ugds_drvN`: open, release, the ioctls and mmap of the uapi ABI. Every argument is validated
//! before anything changes; each failure has its own documented errno (uapi `ioctl` docs).

use crate::device::Controller;
use crate::qpair::Qpair;
use crate::registry::{Backing, Registration};
use crate::shim::chrdev::{FileHandle, FileOps, FopsTable};
use crate::shim::dmabuf::DmabufMapping;
use crate::shim::irq::EventfdIrq;
use crate::shim::mm::Vma;
use crate::shim::pin::PinnedUserMemory;
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

/// Per-open-file state: just the controller; what the file owns lives in the controller's
/// tables, tagged with the file's handle.
pub(crate) struct OpenFile {
    ctrl: Arc<Controller>,
}

impl FileOps for Chardev {
    type Device = Arc<Controller>;
    type File = OpenFile;

    fn open(dev: &Arc<Controller>, handle: FileHandle) -> Result<KBox<OpenFile>> {
        let mut inner = dev.inner.lock();
        if inner.hw.is_none() {
            return Err(ENODEV);
        }
        inner.files.insert(handle)?;
        drop(inner);
        Ok(KBox::new(OpenFile { ctrl: dev.clone() }, GFP_KERNEL)?)
    }

    fn release(file: KBox<OpenFile>, handle: FileHandle) {
        file.ctrl.release_file(handle);
    }

    fn ioctl(file: &OpenFile, handle: FileHandle, cmd: u32, arg: usize) -> Result<isize> {
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
            IOCTL_REGISTER_HOST => {
                let mut a: RegisterHost = read_arg(arg)?;
                a.handle = register_host(c, handle, &a)?;
                if let Err(e) = write_arg(arg, &a) {
                    let _ = deregister(c, handle, a.handle.id, a.handle.generation);
                    return Err(e);
                }
                Ok(0)
            }
            IOCTL_REGISTER_DMABUF => {
                let mut a: RegisterDmabuf = read_arg(arg)?;
                a.handle = register_dmabuf(c, handle, &a)?;
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
            IOCTL_RESET => {
                let mut inner = c.inner.lock();
                let r = c.reset_locked(&mut inner);
                c.publish(&inner);
                r.map(|_| 0)
            }
            _ => Err(ENOTTY),
        }
    }

    fn mmap(file: &OpenFile, handle: FileHandle, vma: &mut Vma) -> Result {
        let c = &*file.ctrl;
        let (kind, qid) = parse_mmap_offset(vma.offset()).ok_or(EINVAL)?;
        if !vma.is_shared() {
            return Err(EINVAL);
        }
        let inner = c.inner.lock();
        let Some(hw) = inner.hw.as_ref() else { return Err(ENODEV) };
        match kind {
            MmapKind::Doorbells => {
                let avail = c.bar_len.saturating_sub(REG_DOORBELL_BASE as u64);
                if qid != 0 || vma.len() == 0 || vma.len() as u64 > avail {
                    return Err(EINVAL);
                }
                let len = vma.len();
                // SAFETY: shutdown zaps every file's mappings before it drops `hw` and so gives
                // BAR0 up.
                unsafe { hw.bar.mmap_uncached(vma, REG_DOORBELL_BASE, len) }
            }
            MmapKind::Status => {
                if qid != 0 {
                    return Err(EINVAL);
                }
                if vma.is_writable() {
                    return Err(EPERM);
                }
                vma.deny_write();
                // SAFETY: the status page lives as long as the controller, which outlives
                // every open file (each holds an Arc) and so every mapping.
                unsafe { c.status.mmap(vma) }
            }
            MmapKind::Sq | MmapKind::Cq | MmapKind::PrpPool => {
                let qp = inner.qpairs.iter().find(|q| q.qid == qid && q.owner == handle).ok_or(ENOENT)?;
                // SAFETY: delete_qpair, release and shutdown zap these mappings before the
                // memory is freed.
                unsafe { qp.mmap_region(kind, vma) }
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
    let hw = inner.hw.as_mut().ok_or(ENODEV)?;
    let qp = Qpair::alloc(&c.pdev, handle, qid, req.depth, flags)?;
    qp.create_on_device(&hw.bar, &mut hw.admin)?;
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

fn register_host(c: &Controller, handle: FileHandle, a: &RegisterHost) -> Result<RegistrationHandle> {
    let r = a.check(&limits(c)).map_err(arg_error)?;
    // Pin before taking the lock: pinning may fault pages in and take a while.
    let mem = PinnedUserMemory::pin(&c.pdev, r.addr, r.len)?;
    insert_registration(c, handle, Backing::Host(mem))
}

fn register_dmabuf(c: &Controller, handle: FileHandle, a: &RegisterDmabuf) -> Result<RegistrationHandle> {
    let r = a.check().map_err(arg_error)?;
    let m = DmabufMapping::import(&c.pdev, r.fd, r.offset, r.len)?;
    insert_registration(c, handle, Backing::Dmabuf(m))
}

fn insert_registration(c: &Controller, handle: FileHandle, backing: Backing) -> Result<RegistrationHandle> {
    let mut inner = c.inner.lock();
    if inner.hw.is_none() {
        return Err(ENODEV);
    }
    let id = (1..=u32::MAX)
        .find(|i| !inner.regs.iter().any(|r| r.owner == handle && r.id == *i))
        .ok_or(ENOSPC)?;
    let generation = inner.next_generation;
    inner.next_generation = inner.next_generation.checked_add(1).unwrap_or(1);
    let reg = Registration { owner: handle, id, generation, backing };
    let nsegs = reg.segments().len() as u32;
    inner.regs.insert(reg)?;
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
    let r = regs.iter().find(|r| r.owner == handle && r.id == id).ok_or(ENOENT)?;
    if r.generation != generation {
        return Err(crate::errno::estale());
    }
    Ok(r)
}

fn deregister(c: &Controller, handle: FileHandle, id: u32, generation: u32) -> Result {
    let mut inner = c.inner.lock();
    find_reg(&inner.regs, handle, id, generation)?;
    let r = inner.regs.remove_first(|r| r.owner == handle && r.id == id);
    c.publish(&inner);
    drop(inner);
    drop(r);
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
