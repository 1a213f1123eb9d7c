//! Misc character devices (shaped like upstream `kernel::miscdevice`): registration, file
//! operations dispatched to a trait, and the VMA and file-mapping handles `mmap` needs.

use crate::bindings;
use crate::shim::pci;
use core::ptr::NonNull;
use kernel::prelude::*;

/// VMA flag bits (include/linux/mm.h).
const VM_WRITE: u64 = 0x2;
const VM_SHARED: u64 = 0x8;
const VM_MAYWRITE: u64 = 0x20;

/// The identity of an open file and its page-cache mapping (for revoking user mappings).
///
/// # Invariants
///
/// `mapping` is the file's `f_mapping`, valid while the file is open; users keep a
/// `FileHandle` only while the file is open (they drop it in `release`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileHandle {
    id: usize,
    mapping: *mut bindings::address_space,
}

// SAFETY: the handle is an identity plus a pointer used only with `unmap_mapping_range`, which
// may be called from any thread.
unsafe impl Send for FileHandle {}
// SAFETY: as above.
unsafe impl Sync for FileHandle {}

impl FileHandle {
    /// Removes every user mapping of `[offset, offset + len)` of this file (0 length: all), so
    /// the memory behind it can be freed.
    pub(crate) fn zap(&self, offset: u64, len: u64) {
        // SAFETY: by the invariant `mapping` is live; unmap_mapping_range may sleep, and callers
        // are in process context.
        unsafe { bindings::unmap_mapping_range(self.mapping, offset as _, len as _, 1) };
    }
}

/// A VMA being set up by `mmap`.
pub(crate) struct Vma {
    ptr: NonNull<bindings::vm_area_struct>,
}

impl Vma {
    fn raw(&self) -> *mut bindings::vm_area_struct {
        self.ptr.as_ptr()
    }

    fn flags(&self) -> u64 {
        // SAFETY: the VMA is live during mmap.
        unsafe { (*self.raw()).__bindgen_anon_2.__vm_flags as u64 }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the VMA is live during mmap.
        unsafe {
            let a = (*self.raw()).__bindgen_anon_1.__bindgen_anon_1;
            (a.vm_end - a.vm_start) as usize
        }
    }

    /// The file offset it maps, in bytes.
    pub(crate) fn offset(&self) -> u64 {
        // SAFETY: the VMA is live during mmap.
        (unsafe { (*self.raw()).vm_pgoff } as u64) << 12
    }

    /// True when the mapping is shared (MAP_SHARED); private mappings are refused.
    pub(crate) fn is_shared(&self) -> bool {
        self.flags() & VM_SHARED != 0
    }

    /// True when the mapping asks for write access.
    pub(crate) fn is_writable(&self) -> bool {
        self.flags() & VM_WRITE != 0
    }

    /// Forbids a later mprotect to writable.
    pub(crate) fn deny_write(&mut self) {
        // SAFETY: the VMA is not yet visible to others during mmap; plain flag update.
        unsafe { (*self.raw()).__bindgen_anon_2.__vm_flags &= !(VM_MAYWRITE as bindings::vm_flags_t) };
    }

    /// Maps `len` bytes of device memory at physical `phys` uncached (UC-).
    ///
    /// # Safety
    ///
    /// `[phys, phys + len)` must be MMIO the caller owns, and the caller must zap the mapping
    /// before giving that MMIO up.
    pub(crate) unsafe fn map_io_uncached(&mut self, phys: u64, len: usize) -> Result {
        // SAFETY: the VMA is live and not yet visible; adding the UC- cache bits to its
        // protection is what pgprot_noncached does on x86.
        unsafe {
            let uc = bindings::cachemode2protval(bindings::page_cache_mode__PAGE_CACHE_MODE_UC_MINUS);
            (*self.raw()).vm_page_prot.pgprot |= uc as bindings::pgprotval_t;
        }
        // vm_iomap_memory reads vm_pgoff as an offset into the range; ours encodes the region,
        // so present 0 for the call and restore it (the file offset is what zaps match).
        // SAFETY: the caller owns the MMIO range; vm_iomap_memory checks the VMA fits it.
        let ret = unsafe {
            let pgoff = (*self.raw()).vm_pgoff;
            (*self.raw()).vm_pgoff = 0;
            let r = bindings::vm_iomap_memory(self.raw(), phys as _, len as _);
            (*self.raw()).vm_pgoff = pgoff;
            r
        };
        kernel::error::to_result(ret)
    }

    /// Raw pointer, for the DMA shim.
    pub(crate) fn as_raw(&mut self) -> *mut bindings::vm_area_struct {
        self.raw()
    }
}

/// File operations of a misc device.
pub(crate) trait FileOps: Sized + 'static {
    /// Shared state of the device (given to `open`).
    type Device: Send + Sync;
    /// Per-open-file state.
    type File: Send + Sync;
    /// A file was opened.
    fn open(dev: &Self::Device, handle: FileHandle) -> Result<KBox<Self::File>>;
    /// The last reference to the file went away (no mapping of it remains).
    fn release(file: KBox<Self::File>, handle: FileHandle);
    /// An ioctl.
    fn ioctl(file: &Self::File, handle: FileHandle, cmd: u32, arg: usize) -> Result<isize>;
    /// An mmap.
    fn mmap(file: &Self::File, handle: FileHandle, vma: &mut Vma) -> Result;
}

/// The file operations of a `FileOps` type. It must be a `static`: `misc_open` installs it as
/// the file's `f_op`, which the VFS uses until the last reference to the file is gone, possibly
/// long after the device was unregistered; `owner` keeps the module loaded until then.
pub(crate) struct FopsTable(bindings::file_operations);

// SAFETY: the table is immutable after construction; the C side only reads it.
unsafe impl Sync for FopsTable {}

impl FopsTable {
    /// The table for `T`, owned by `owner` (this module's `__this_module`).
    pub(crate) const fn new<T: FileOps>(owner: *mut bindings::module) -> Self {
        // SAFETY: all-zero is a valid `file_operations` (null pointers, no callbacks).
        let zero: bindings::file_operations = unsafe { core::mem::zeroed() };
        FopsTable(bindings::file_operations {
            owner,
            open: Some(open_cb::<T>),
            release: Some(release_cb::<T>),
            unlocked_ioctl: Some(ioctl_cb::<T>),
            mmap: Some(mmap_cb::<T>),
            ..zero
        })
    }
}

#[repr(C)]
struct Slot<T: FileOps> {
    // First field: `misc_open` hands us a pointer to it, which is also a pointer to the slot.
    misc: bindings::miscdevice,
    name: [u8; 16],
    dev: T::Device,
}

/// A registered misc device `/dev/<name>`; deregistered on drop (after which no `open` runs).
///
/// # Invariants
///
/// `slot` came from `KBox::into_raw` and is registered with the misc core until `Drop`.
pub(crate) struct MiscRegistration<T: FileOps> {
    slot: NonNull<Slot<T>>,
}

// SAFETY: the misc core serialises (de)registration; the slot's device state is Send + Sync.
unsafe impl<T: FileOps> Send for MiscRegistration<T> {}
// SAFETY: `&MiscRegistration` only reads the device state, which is Sync.
unsafe impl<T: FileOps> Sync for MiscRegistration<T> {}

impl<T: FileOps> MiscRegistration<T> {
    /// Registers `/dev/<name>` (mode 0600) under `parent`.
    pub(crate) fn register(name: &str, parent: &pci::Device, dev: T::Device, fops: &'static FopsTable) -> Result<Self> {
        if name.len() >= 16 {
            return Err(EINVAL);
        }
        // SAFETY: the C structs are valid all-zero (null pointers, None callbacks).
        let misc = unsafe { core::mem::zeroed() };
        let slot = KBox::new(Slot::<T> { misc, name: [0; 16], dev }, GFP_KERNEL)?;
        let raw = KBox::into_raw(slot);
        // SAFETY: `raw` is a fresh exclusive allocation.
        let s = unsafe { &mut *raw };
        s.name[..name.len()].copy_from_slice(name.as_bytes());
        // MISC_DYNAMIC_MINOR
        s.misc.minor = 255;
        s.misc.name = s.name.as_ptr().cast();
        s.misc.fops = &fops.0;
        s.misc.parent = parent.as_device_ptr();
        s.misc.mode = 0o600;
        // SAFETY: `misc` is initialised and stays at this address until misc_deregister.
        let ret = unsafe { bindings::misc_register(&mut s.misc) };
        if let Err(e) = kernel::error::to_result(ret) {
            // SAFETY: registration failed; nothing refers to the slot.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(e);
        }
        // INVARIANT: registered, non-null.
        Ok(MiscRegistration { slot: NonNull::new(raw).ok_or(ENOMEM)? })
    }

    /// The device state.
    pub(crate) fn device(&self) -> &T::Device {
        // SAFETY: by the invariant the slot is live.
        unsafe { &(*self.slot.as_ptr()).dev }
    }
}

impl<T: FileOps> Drop for MiscRegistration<T> {
    fn drop(&mut self) {
        // SAFETY: registered by the invariant. misc_deregister waits out a running `open` (both
        // hold misc_mtx), so afterwards nothing uses the slot; open files keep their own state.
        unsafe {
            bindings::misc_deregister(&mut (*self.slot.as_ptr()).misc);
            drop(KBox::from_raw(self.slot.as_ptr()));
        }
    }
}

fn handle_of(file: *mut bindings::file) -> FileHandle {
    // SAFETY: the VFS passes a live file to every callback.
    let mapping = unsafe { (*file).f_mapping };
    FileHandle { id: file as usize, mapping }
}

unsafe extern "C" fn open_cb<T: FileOps>(_inode: *mut bindings::inode, file: *mut bindings::file) -> kernel::ffi::c_int {
    // SAFETY: misc_open set private_data to our `miscdevice`, the first field of a live `Slot`
    // (misc_open holds misc_mtx, so the slot cannot be deregistered meanwhile).
    let slot = unsafe { &*((*file).private_data as *const Slot<T>) };
    match T::open(&slot.dev, handle_of(file)) {
        Ok(state) => {
            // SAFETY: the file is live; private_data is ours from now on.
            unsafe { (*file).private_data = KBox::into_raw(state).cast() };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// `file` must be a file opened by `open_cb::<T>` that is still open.
unsafe fn state_of<'a, T: FileOps>(file: *mut bindings::file) -> &'a T::File {
    // SAFETY: open_cb stored a `KBox<T::File>` in private_data; it lives until release.
    unsafe { &*((*file).private_data as *const T::File) }
}

unsafe extern "C" fn release_cb<T: FileOps>(_inode: *mut bindings::inode, file: *mut bindings::file) -> kernel::ffi::c_int {
    // SAFETY: release runs once, after the last reference; the box came from open_cb.
    let state = unsafe { KBox::from_raw((*file).private_data as *mut T::File) };
    T::release(state, handle_of(file));
    0
}

unsafe extern "C" fn ioctl_cb<T: FileOps>(
    file: *mut bindings::file,
    cmd: kernel::ffi::c_uint,
    arg: kernel::ffi::c_ulong,
) -> kernel::ffi::c_long {
    // SAFETY: the VFS calls ioctl only on an open file.
    let state = unsafe { state_of::<T>(file) };
    match T::ioctl(state, handle_of(file), cmd, arg as usize) {
        Ok(v) => v as kernel::ffi::c_long,
        Err(e) => e.to_errno() as kernel::ffi::c_long,
    }
}

unsafe extern "C" fn mmap_cb<T: FileOps>(file: *mut bindings::file, vma: *mut bindings::vm_area_struct) -> kernel::ffi::c_int {
    // SAFETY: the VFS calls mmap only on an open file.
    let state = unsafe { state_of::<T>(file) };
    let Some(ptr) = NonNull::new(vma) else { return EINVAL.to_errno() };
    let mut vma = Vma { ptr };
    match T::mmap(state, handle_of(file), &mut vma) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}
