//! Character devices of a device class (shaped like upstream `kernel::miscdevice`, with the
//! class and the device-number region that the misc core hides made explicit): a [`Class`]
//! (`/sys/class/<name>`, node mode set by its `devnode` callback), a [`Region`] of device numbers
//! registered together with it, one [`Registration`] per node (`cdev` + `struct device`, so
//! devtmpfs creates `/dev/<name>`), file operations dispatched to a trait, and the handle of an
//! open file's mapping (for revoking user mappings).
//!
//! Lifetimes follow the C pattern of `cdev_device_add`: the `cdev` and the `struct device` live
//! in one allocation whose release is the device's `release` callback, and the cdev's kobject
//! holds a reference on the device. An open file holds the cdev, so the allocation (and the
//! device state in it) outlives [`Registration`] until the last such file is closed.

use super::mm::{Fault, Vma};
use super::pci;
use crate::bindings;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// The identity of an open file and its page-cache mapping (for revoking user mappings).
///
/// The identity is a number drawn from a module-wide counter at open, never the `struct file`
/// address: an address can be reused by a later open while entries of the earlier file remain
/// (bookkeeping that failed to allocate stays until unbind), and two files must never match.
///
/// # Invariants
///
/// `mapping` is the file's `f_mapping`, valid while the file is open; users keep a
/// `FileHandle` only while the file is open (they drop it in `release`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileHandle {
    id: u64,
    mapping: *mut bindings::address_space,
}

/// The next open file's identity (0 is never used).
static NEXT_FILE_ID: AtomicU64 = AtomicU64::new(1);

// SAFETY: the handle is an identity plus a pointer used only with `unmap_mapping_range`, which
// may be called from any thread.
unsafe impl Send for FileHandle {}
// SAFETY: `&FileHandle` allows only `zap` (`unmap_mapping_range`, callable from any thread) and
// comparing identities.
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

/// File operations of a character device.
pub(crate) trait FileOps: Sized + 'static {
    /// Shared state of the device (given to `open`). It lives until the registration is dropped
    /// and every file opened through the node is closed: `open` may still run after the
    /// registration was dropped (a file reopened through `/proc/<pid>/fd/N`), so it must refuse
    /// a device that was shut down.
    type Device: Send + Sync;
    /// Per-open-file state.
    type File: Send + Sync;
    /// A file was opened; `exclusive` when it was opened with `O_EXCL`.
    fn open(dev: &Self::Device, handle: FileHandle, exclusive: bool) -> Result<KBox<Self::File>>;
    /// The last reference to the file went away (no mapping of it remains).
    fn release(file: KBox<Self::File>, handle: FileHandle);
    /// An ioctl.
    fn ioctl(file: &Self::File, handle: FileHandle, cmd: u32, arg: usize) -> Result<isize>;
    /// An mmap. Nothing may be mapped here: the implementation checks the request and calls
    /// [`Vma::fill_on_fault`]; pages are inserted by [`FileOps::fault`].
    fn mmap(file: &Self::File, handle: FileHandle, vma: &mut Vma) -> Result;
    /// A page fault in a VMA that `mmap` set up: insert its pages (under the lock that
    /// revocation takes) or fail, which the faulting process sees as `SIGBUS`.
    fn fault(file: &Self::File, handle: FileHandle, fault: &mut Fault) -> Result;
}

/// The VMA operations of a `FileOps` type (a `static`, for the same reason as [`FopsTable`]:
/// VMAs point at it until they are unmapped, and each holds the file, and so the module).
pub(crate) struct VmOpsTable(bindings::vm_operations_struct);

// SAFETY: immutable after construction; the C side only reads it.
unsafe impl Sync for VmOpsTable {}

impl VmOpsTable {
    /// The table for `T`: a `fault` handler only (no `open`/`close`: VMAs are `VM_DONTCOPY`
    /// and hold nothing but the file, which the VMA itself keeps open).
    pub(crate) const fn new<T: FileOps>() -> Self {
        // SAFETY: all-zero is a valid `vm_operations_struct` (no callbacks).
        let zero: bindings::vm_operations_struct = unsafe { core::mem::zeroed() };
        VmOpsTable(bindings::vm_operations_struct { fault: Some(fault_cb::<T>), ..zero })
    }

    /// The C table, for `mm.rs`.
    pub(super) fn as_raw(&'static self) -> *const bindings::vm_operations_struct {
        &self.0
    }
}

/// The file operations of a `FileOps` type. It must be a `static`: `chrdev_open` installs it as
/// the file's `f_op`, which the VFS uses until the last reference to the file is gone, possibly
/// long after the device was unregistered; `owner` keeps the module loaded until then.
pub(crate) struct FopsTable(bindings::file_operations);

// SAFETY: the table is immutable after construction; the C side only reads it.
unsafe impl Sync for FopsTable {}

impl FopsTable {
    /// The table for `T`, owned by `module` (this module's `THIS_MODULE`), which open files then
    /// keep loaded.
    pub(crate) const fn new<T: FileOps>(module: &'static ThisModule) -> Self {
        // SAFETY: all-zero is a valid `file_operations` (null pointers, no callbacks).
        let zero: bindings::file_operations = unsafe { core::mem::zeroed() };
        FopsTable(bindings::file_operations {
            owner: module.as_ptr().cast(),
            open: Some(open_cb::<T>),
            release: Some(release_cb::<T>),
            unlocked_ioctl: Some(ioctl_cb::<T>),
            mmap: Some(mmap_cb::<T>),
            ..zero
        })
    }
}

/// Bits of a `dev_t` that hold the minor number (include/linux/kdev_t.h).
const MINORBITS: u32 = 20;

/// A device class, `/sys/class/<name>`, whose nodes devtmpfs creates with mode `MODE` (the
/// class's `devnode` callback). It must be a `static`: the driver core points at it while it
/// is registered, and every device of the class points at it until its last reference is gone
/// (the module cannot be unloaded before then: open files hold it).
pub(crate) struct Class(bindings::class);

// SAFETY: immutable after construction; the driver core only reads it.
unsafe impl Sync for Class {}

impl Class {
    /// The class `name` (e.g. `ugds_drv`), its nodes created with mode `MODE` (e.g. 0o600).
    pub(crate) const fn new<const MODE: u16>(name: &'static CStr) -> Self {
        // SAFETY: all-zero is a valid `struct class` (null pointers, no callbacks).
        let zero: bindings::class = unsafe { core::mem::zeroed() };
        Class(bindings::class { name: cstr_ptr(name).cast(), devnode: Some(devnode_cb::<MODE>), ..zero })
    }
}

/// A C string's address in a constant (6.12's `kernel::str::CStr` has a `const` `as_char_ptr`;
/// later series use `core::ffi::CStr`, whose `as_ptr` is `const`).
const fn cstr_ptr(s: &'static CStr) -> *const u8 {
    #[cfg(ugds_linux_6_12)]
    let p = s.as_char_ptr();
    #[cfg(not(ugds_linux_6_12))]
    let p = s.as_ptr().cast::<u8>();
    p
}

/// The class's `devnode` callback: keeps the device's own name and sets the node's mode.
unsafe extern "C" fn devnode_cb<const MODE: u16>(
    _dev: *const bindings::device,
    mode: *mut bindings::umode_t,
) -> *mut kernel::ffi::c_char {
    if !mode.is_null() {
        // SAFETY: the driver core passes either null (when removing the node) or a valid
        // `umode_t` for us to fill (devtmpfs node creation, the DEVMODE uevent variable).
        unsafe { *mode = MODE };
    }
    // Null: the node is named after the device.
    core::ptr::null_mut()
}

/// A registered [`Class`] and `count` character device numbers (one dynamically allocated
/// major, minors `0..count`, listed under the class's name in /proc/devices). Both are
/// unregistered on drop, the numbers first. Shared (`Arc`) by every [`Registration`] made in it,
/// so it cannot go away before them.
///
/// # Invariants
///
/// `class` is registered and `[base, base + count)` allocated until `Drop`.
pub(crate) struct Region {
    class: &'static Class,
    base: bindings::dev_t,
    count: u32,
}

impl Region {
    /// Registers `class` and allocates `count` device numbers for it.
    pub(crate) fn register(class: &'static Class, count: u32) -> Result<Self> {
        // SAFETY: `class` is a static, initialised by `Class::new`; it stays registered until
        // this region's Drop (or the error path below).
        kernel::error::to_result(unsafe { bindings::class_register(&class.0) })?;
        let mut base: bindings::dev_t = 0;
        // SAFETY: `base` is a valid out pointer; the name is the class's static string, which
        // the chrdev core keeps pointing at until `unregister_chrdev_region`.
        let ret = unsafe { bindings::alloc_chrdev_region(&mut base, 0, count, class.0.name) };
        if let Err(e) = kernel::error::to_result(ret) {
            // SAFETY: registered just above; no device of the class exists yet.
            unsafe { bindings::class_unregister(&class.0) };
            return Err(e);
        }
        // INVARIANT: both registered.
        Ok(Region { class, base, count })
    }

    /// The major number.
    pub(crate) fn major(&self) -> u32 {
        self.base >> MINORBITS
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: by the invariant both are registered. Every `Registration` holds this region,
        // so none exists any more: no cdev maps a number of the region and no device of the
        // class is in sysfs (a device freed later, when a file that outlived its registration
        // closes, uses only its own `release`, not the class).
        unsafe {
            bindings::unregister_chrdev_region(self.base, self.count);
            bindings::class_unregister(&self.class.0);
        }
    }
}

/// What a registration allocates: the cdev, its `struct device` and the device state.
#[repr(C)]
struct Slot<T: FileOps> {
    // First field: `inode->i_cdev` points at it, which is also a pointer to the slot.
    cdev: bindings::cdev,
    dev: bindings::device,
    data: T::Device,
}

/// A character device `/dev/<name>` (number `minor` of a [`Region`], in its class, under a PCI
/// parent); removed on drop, after which its number no longer opens it.
///
/// # Invariants
///
/// `slot` points to a `Slot<T>` set up by `register` whose cdev and device are added until
/// `Drop`, and this object holds the device's initial reference, which keeps the slot alive.
pub(crate) struct Registration<T: FileOps> {
    slot: NonNull<Slot<T>>,
    _region: Arc<Region>,
}

// SAFETY: the driver core serialises adding and deleting devices; the slot's device state is
// Send + Sync, and the slot itself is freed by whichever reference goes last, on any thread.
unsafe impl<T: FileOps> Send for Registration<T> {}
// SAFETY: `&Registration` only reads the device state, which is Sync.
unsafe impl<T: FileOps> Sync for Registration<T> {}

impl<T: FileOps> Registration<T> {
    /// Creates `/dev/<name>` (number `minor` of `region`, mode from its class) under `parent`,
    /// serving `fops` with `data` as the device state.
    pub(crate) fn register(
        region: &Arc<Region>,
        minor: u32,
        name: &CStr,
        parent: &pci::Device,
        data: T::Device,
        fops: &'static FopsTable,
    ) -> Result<Self> {
        if minor >= region.count {
            return Err(EINVAL);
        }
        // SAFETY: `cdev` and `device` are C structs for which all-zero is the state their init
        // functions expect (null pointers, None callbacks).
        let (cdev, dev) = unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
        let raw = KBox::into_raw(KBox::new(Slot::<T> { cdev, dev, data }, GFP_KERNEL)?);
        // SAFETY: `raw` is a fresh, exclusive allocation. From `device_initialize` on, its
        // lifetime belongs to the device's reference count: the last `put_device` frees it
        // through `release_device::<T>`. The class is registered (the region's invariant), and
        // the fops table is static with this module as owner.
        unsafe {
            let d = &raw mut (*raw).dev;
            bindings::device_initialize(d);
            (*d).devt = region.base + minor;
            (*d).class = &region.class.0;
            (*d).parent = parent.as_device_ptr();
            (*d).release = Some(release_device::<T>);
            bindings::cdev_init(&raw mut (*raw).cdev, &fops.0);
            (*raw).cdev.owner = fops.0.owner;
        }
        // SAFETY: the device is initialised; "%s" takes the one NUL-terminated string passed.
        let named = unsafe { bindings::dev_set_name(&raw mut (*raw).dev, c"%s".as_ptr().cast(), name.as_char_ptr()) };
        let added = kernel::error::to_result(named).and_then(|()| {
            // SAFETY: cdev and device are initialised and stay at this address until freed by
            // `release_device`; `cdev_device_add` makes the cdev hold a device reference.
            kernel::error::to_result(unsafe { bindings::cdev_device_add(&raw mut (*raw).cdev, &raw mut (*raw).dev) })
        });
        if let Err(e) = added {
            // SAFETY: nothing is added (cdev_device_add undoes its own steps on failure), so our
            // initial reference is the last: dropping it frees the slot through release_device.
            unsafe { bindings::put_device(&raw mut (*raw).dev) };
            return Err(e);
        }
        // INVARIANT: added; we hold the initial reference.
        // SAFETY: `KBox::into_raw` never returns null.
        let slot = unsafe { NonNull::new_unchecked(raw) };
        Ok(Registration { slot, _region: region.clone() })
    }

    /// The device state.
    pub(crate) fn device(&self) -> &T::Device {
        // SAFETY: by the invariant the slot is live while we exist.
        unsafe { &(*self.slot.as_ptr()).data }
    }
}

impl<T: FileOps> Drop for Registration<T> {
    fn drop(&mut self) {
        let raw = self.slot.as_ptr();
        // SAFETY: by the invariant cdev and device are added and we hold the initial reference.
        // `cdev_device_del` removes the node, the sysfs entry and the number's mapping (no new
        // open reaches the cdev through its number); files already open keep the cdev, which
        // keeps the device and thus the slot alive; `put_device` drops our reference, freeing
        // the slot through `release_device` when it was the last.
        unsafe {
            bindings::cdev_device_del(&raw mut (*raw).cdev, &raw mut (*raw).dev);
            bindings::put_device(&raw mut (*raw).dev);
        }
    }
}

/// The `release` of a registration's device: frees its slot.
unsafe extern "C" fn release_device<T: FileOps>(dev: *mut bindings::device) {
    // SAFETY: only devices set up by `Registration::<T>::register` have this callback; each is
    // the `dev` field of a boxed `Slot<T>`. Its last reference is gone, and the cdev (which held
    // one until its own release) is no longer used, so nothing refers to the slot any more.
    unsafe {
        let slot = dev.byte_sub(core::mem::offset_of!(Slot<T>, dev)).cast::<Slot<T>>();
        drop(KBox::from_raw(slot));
    }
}

/// What `private_data` of an open file holds: its identity and the implementation's state.
struct Open<T: FileOps> {
    handle: FileHandle,
    file: KBox<T::File>,
}

/// `O_EXCL` (bindgen, from the target kernel's headers).
const O_EXCL: u32 = bindings::O_EXCL as u32;

/// The inode's `i_cdev` (an anonymous union's member: the union's bindgen name follows the
/// struct's layout, `__bindgen_anon_4` on 6.12 and `__bindgen_anon_5` on 7.3).
///
/// # Safety
///
/// `inode` points to a live character-device inode.
unsafe fn inode_cdev(inode: *mut bindings::inode) -> *mut bindings::cdev {
    #[cfg(ugds_linux_6_12)]
    // SAFETY: `inode` is live (contract).
    let c = unsafe { (*inode).__bindgen_anon_4.i_cdev };
    #[cfg(not(ugds_linux_6_12))]
    // SAFETY: as above.
    let c = unsafe { (*inode).__bindgen_anon_5.i_cdev };
    c
}

unsafe extern "C" fn open_cb<T: FileOps>(inode: *mut bindings::inode, file: *mut bindings::file) -> kernel::ffi::c_int {
    // SAFETY: `chrdev_open` set the inode's `i_cdev` to the cdev it found for the inode's number
    // and holds a reference on that cdev for this call (and the file's life). Only cdevs of
    // `Registration<T>` use these fops; each is the first field of a `Slot<T>`, which the cdev
    // keeps alive through its reference on the slot's device.
    let slot = unsafe { &*(inode_cdev(inode) as *const Slot<T>) };
    // SAFETY: the VFS passes a live file.
    let (mapping, flags) = unsafe { ((*file).f_mapping, (*file).f_flags) };
    let handle = FileHandle { id: NEXT_FILE_ID.fetch_add(1, Ordering::Relaxed), mapping };
    let opened = T::open(&slot.data, handle, flags & O_EXCL != 0)
        .and_then(|state| Ok(KBox::new(Open::<T> { handle, file: state }, GFP_KERNEL)?));
    match opened {
        Ok(open) => {
            // SAFETY: the file is live; private_data is ours from now on.
            unsafe { (*file).private_data = KBox::into_raw(open).cast() };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// `file` must be a file opened by `open_cb::<T>` that is still open.
unsafe fn state_of<'a, T: FileOps>(file: *mut bindings::file) -> &'a Open<T> {
    // SAFETY: open_cb stored a `KBox<Open<T>>` in private_data; it lives until release.
    unsafe { &*((*file).private_data as *const Open<T>) }
}

unsafe extern "C" fn release_cb<T: FileOps>(
    _inode: *mut bindings::inode,
    file: *mut bindings::file,
) -> kernel::ffi::c_int {
    // SAFETY: release runs once, after the last reference; the box came from open_cb.
    let open = unsafe { KBox::from_raw((*file).private_data as *mut Open<T>) };
    let Open { handle, file } = KBox::into_inner(open);
    T::release(file, handle);
    0
}

unsafe extern "C" fn ioctl_cb<T: FileOps>(
    file: *mut bindings::file,
    cmd: kernel::ffi::c_uint,
    arg: kernel::ffi::c_ulong,
) -> kernel::ffi::c_long {
    // SAFETY: the VFS calls ioctl only on an open file.
    let open = unsafe { state_of::<T>(file) };
    match T::ioctl(&open.file, open.handle, cmd, arg as usize) {
        Ok(v) => v as kernel::ffi::c_long,
        Err(e) => e.to_errno() as kernel::ffi::c_long,
    }
}

unsafe extern "C" fn mmap_cb<T: FileOps>(
    file: *mut bindings::file,
    vma: *mut bindings::vm_area_struct,
) -> kernel::ffi::c_int {
    // SAFETY: the VFS calls mmap only on an open file.
    let open = unsafe { state_of::<T>(file) };
    let Some(ptr) = NonNull::new(vma) else { return EINVAL.to_errno() };
    // SAFETY: `vma` is the VMA of this `mmap` call; the `Vma` is dropped before it returns.
    let mut vma = unsafe { Vma::from_raw(ptr) };
    match T::mmap(&open.file, open.handle, &mut vma) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

unsafe extern "C" fn fault_cb<T: FileOps>(vmf: *mut bindings::vm_fault) -> bindings::vm_fault_t {
    let Some(ptr) = NonNull::new(vmf) else { return Fault::SIGBUS };
    // SAFETY: the MM calls `fault` with a live `vm_fault` for a VMA of ours (only VMAs whose
    // `mmap` installed this table have it), under the mmap or VMA read lock, for this call.
    let mut fault = unsafe { Fault::from_raw(ptr) };
    // SAFETY: the VMA holds a reference on its file (`vm_file`), opened by `open_cb::<T>`
    // (only our `mmap` installs these operations), so it is open and its state is live.
    let open = unsafe { state_of::<T>(fault.file()) };
    match T::fault(&open.file, open.handle, &mut fault) {
        Ok(()) => Fault::NOPAGE,
        Err(e) if e == ENOMEM => Fault::OOM,
        Err(_) => Fault::SIGBUS,
    }
}
