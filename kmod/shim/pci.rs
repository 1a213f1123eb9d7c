//! PCI driver registration and device access (shaped like upstream `kernel::pci`).
//!
//! A [`Registration`] registers a [`Driver`] whose id table matches one PCI class with
//! `override_only` set: the PCI core then binds it only to devices whose `driver_override`
//! names it, never on its own. Enabling, bus mastering, BAR regions and mappings are RAII
//! guards that undo themselves in reverse order when dropped.

use super::io::IoMem;
use crate::bindings;
use core::marker::PhantomData;
use core::ptr::NonNull;
use kernel::error::to_result;
use kernel::prelude::*;

/// A PCI driver.
pub(crate) trait Driver {
    /// Per-device state, created by `probe`, dropped on remove (in field order).
    type Data: Send + Sync;
    /// Driver-wide state given to every `probe` (e.g. the character-device region its nodes
    /// are numbered in); the registration owns it and drops it after the last device is
    /// removed. (Upstream passes the matched id's info here; a module-wide object is what 6.12,
    /// without a global-lock helper, needs instead.)
    type Context: Send + Sync;
    /// Driver name (what `driver_override` must say).
    const NAME: &'static CStr;
    /// The 24-bit class code (class, subclass, prog-if) the id table names.
    const CLASS: u32;
    /// Called when the device is bound.
    fn probe(dev: &Device, ctx: &Self::Context) -> Result<KBox<Self::Data>>;
    /// Called when the device is unbound, before `data` is dropped.
    fn remove(dev: &Device, data: &Self::Data);
}

/// A counted reference to a `struct pci_dev`.
///
/// # Invariants
///
/// `ptr` points to a `pci_dev` on which this object holds a reference (`pci_dev_get`).
pub(crate) struct Device {
    ptr: NonNull<bindings::pci_dev>,
}

// SAFETY: a `pci_dev` reference may be used and dropped from any thread.
unsafe impl Send for Device {}
// SAFETY: the accessors only read immutable identification fields or call thread-safe C API.
unsafe impl Sync for Device {}

impl Device {
    /// Takes a new reference to `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must point to a live `pci_dev`.
    unsafe fn get(ptr: *mut bindings::pci_dev) -> Result<Self> {
        // SAFETY: the caller guarantees `ptr` is live; `pci_dev_get` takes a reference.
        let p = unsafe { bindings::pci_dev_get(ptr) };
        // INVARIANT: we now hold a reference on a non-null device.
        NonNull::new(p).map(|ptr| Device { ptr }).ok_or(ENODEV)
    }

    /// The raw `pci_dev`, for sibling shims only (it is live while `self` is).
    pub(super) fn as_raw(&self) -> *mut bindings::pci_dev {
        self.ptr.as_ptr()
    }

    /// The device's name, its PCI address (`dev_name`).
    pub(crate) fn name(&self) -> &CStr {
        // SAFETY: by the invariant the device is live; `dev_name` is its init name or kobject
        // name, a NUL-terminated string that lives as long as the device.
        unsafe {
            let d = &(*self.as_raw()).dev;
            let p = if d.init_name.is_null() { d.kobj.name } else { d.init_name };
            CStr::from_char_ptr(p.cast())
        }
    }

    /// The 24-bit class code.
    pub(crate) fn class(&self) -> u32 {
        // SAFETY: `class` is set at enumeration and never changes.
        unsafe { (*self.as_raw()).class }
    }

    /// Vendor and device IDs.
    pub(crate) fn ids(&self) -> (u16, u16) {
        // SAFETY: the IDs are set at enumeration and never change.
        unsafe { ((*self.as_raw()).vendor, (*self.as_raw()).device) }
    }

    /// Physical start and length of BAR `bar` (0 when absent).
    fn resource(&self, bar: usize) -> Result<(u64, u64)> {
        // SAFETY: resources are set at enumeration; the index is checked by `get`.
        let r = unsafe { (*self.as_raw()).resource.get(bar).ok_or(EINVAL)? };
        if r.end <= r.start {
            return Ok((r.start, 0));
        }
        Ok((r.start, r.end - r.start + 1))
    }

    /// Enables memory decoding; disabled again when the guard drops.
    pub(crate) fn enable_mem(&self) -> Result<Enabled> {
        // SAFETY: the device is live.
        to_result(unsafe { bindings::pci_enable_device_mem(self.as_raw()) })?;
        // SAFETY: the device is live.
        let dev = unsafe { Device::get(self.as_raw()) }?;
        Ok(Enabled { dev })
    }

    /// The embedded `struct device`, for sibling shims only (it is live while `self` is).
    pub(super) fn as_device_ptr(&self) -> *mut bindings::device {
        // SAFETY: the device is live; taking the address of its embedded `struct device`.
        unsafe { core::ptr::addr_of_mut!((*self.as_raw()).dev) }
    }

    /// Where the MSI-X table and the pending-bit array live, when the device has MSI-X: for
    /// each, (BAR index, byte offset, byte length), from the MSI-X capability in config space.
    pub(crate) fn msix_structures(&self) -> Result<Option<[(u32, u64, u64); 2]>> {
        // SAFETY: the device is live; a config-space walk without side effects.
        let cap = unsafe { bindings::pci_find_capability(self.as_raw(), bindings::PCI_CAP_ID_MSIX as _) };
        if cap == 0 {
            return Ok(None);
        }
        let cap = i32::from(cap);
        let mut flags: u16 = 0;
        let (mut table, mut pba): (u32, u32) = (0, 0);
        // SAFETY: the device is live; the out pointers are valid locals.
        let rets = unsafe {
            [
                bindings::pci_read_config_word(self.as_raw(), cap + bindings::PCI_MSIX_FLAGS as i32, &mut flags),
                bindings::pci_read_config_dword(self.as_raw(), cap + bindings::PCI_MSIX_TABLE as i32, &mut table),
                bindings::pci_read_config_dword(self.as_raw(), cap + bindings::PCI_MSIX_PBA as i32, &mut pba),
            ]
        };
        if rets.iter().any(|r| *r != 0) {
            return Err(EIO);
        }
        let entries = u64::from(flags & bindings::PCI_MSIX_FLAGS_QSIZE as u16) + 1;
        let bir = bindings::PCI_MSIX_TABLE_BIR;
        let off = bindings::PCI_MSIX_TABLE_OFFSET;
        Ok(Some([
            // 16 bytes per table entry; one pending bit per vector, in 64-bit words.
            (table & bir, u64::from(table & off), entries * 16),
            (pba & bir, u64::from(pba & off), entries.div_ceil(64) * 8),
        ]))
    }

    /// Sets the streaming and coherent DMA masks to `bits` bits.
    pub(crate) fn set_dma_mask(&self, bits: u32) -> Result {
        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        // SAFETY: the device is live.
        to_result(unsafe { bindings::dma_set_mask(self.as_device_ptr(), mask) })?;
        // SAFETY: the device is live.
        to_result(unsafe { bindings::dma_set_coherent_mask(self.as_device_ptr(), mask) })
    }

    /// Sets the driver data pointer.
    ///
    /// # Safety
    ///
    /// Only the driver bound to this device may call it, from probe.
    unsafe fn set_drvdata(&self, data: *mut core::ffi::c_void) {
        // SAFETY: the caller is the bound driver; `driver_data` is ours to set.
        unsafe { (*self.as_raw()).dev.driver_data = data.cast() };
    }

    /// Returns the driver data pointer.
    fn drvdata(&self) -> *mut core::ffi::c_void {
        // SAFETY: the device is live.
        unsafe { (*self.as_raw()).dev.driver_data.cast() }
    }
}

impl Clone for Device {
    fn clone(&self) -> Self {
        // SAFETY: by the invariant the device is live; `pci_dev_get` takes another reference.
        unsafe { bindings::pci_dev_get(self.as_raw()) };
        // INVARIANT: the new reference belongs to the clone.
        Device { ptr: self.ptr }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: by the invariant we hold a reference; dropped once here.
        unsafe { bindings::pci_dev_put(self.as_raw()) };
    }
}

/// An enabled device (memory decoding on). Dropping it clears bus mastering and disables it.
pub(crate) struct Enabled {
    dev: Device,
}

impl Enabled {
    /// Enables bus mastering (DMA by the device); cleared when `Enabled` drops.
    pub(crate) fn set_master(&self) {
        // SAFETY: the device is live and enabled.
        unsafe { bindings::pci_set_master(self.dev.as_raw()) };
    }

    /// Turns bus mastering off: the device can then issue no DMA at all.
    pub(crate) fn clear_master(&self) {
        // SAFETY: the device is live.
        unsafe { bindings::pci_clear_master(self.dev.as_raw()) };
    }

    /// Requests BAR `bar` for this driver and maps it uncached.
    pub(crate) fn map_bar<const SIZE: usize>(&self, bar: u32, name: &'static CStr) -> Result<Bar<SIZE>> {
        let (start, len) = self.dev.resource(bar as usize)?;
        if len < SIZE as u64 {
            return Err(ENODEV);
        }
        // SAFETY: the device is live; `name` is a static string.
        to_result(unsafe { bindings::pci_request_region(self.dev.as_raw(), bar as _, name.as_char_ptr().cast()) })?;
        // SAFETY: the device is live.
        let dev = unsafe { Device::get(self.dev.as_raw()) }?;
        let region = Region { dev, bar };
        // CAST: BAR0 of an NVMe controller is a few KiB to MiB; it fits usize.
        // SAFETY: the region `[start, start + len)` was just requested for this driver and is
        // released only after the mapping is dropped (field order of `Bar`).
        let io = unsafe { IoMem::map(start, len as usize) }?;
        Ok(Bar { io, phys: start, _region: region })
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        // SAFETY: the device is live and was enabled by us.
        unsafe {
            bindings::pci_clear_master(self.dev.as_raw());
            bindings::pci_disable_device(self.dev.as_raw());
        }
    }
}

struct Region {
    dev: Device,
    bar: u32,
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the region was requested by us and its mapping is already gone.
        unsafe { bindings::pci_release_region(self.dev.as_raw(), self.bar as _) };
    }
}

/// A requested and mapped BAR. Fields drop in order: unmap, then release the region.
pub(crate) struct Bar<const SIZE: usize> {
    io: IoMem<SIZE>,
    /// Physical address of the BAR (`io` maps all of it).
    phys: u64,
    _region: Region,
}

impl<const SIZE: usize> Bar<SIZE> {
    /// The page frame number of the page at byte `offset` of this BAR (for a user mapping
    /// filled at fault time); `EINVAL` past the BAR. The BAR stays ours while `self` lives:
    /// whoever maps the frame must revoke the mapping before dropping `self`.
    pub(crate) fn pfn(&self, offset: u64) -> Result<u64> {
        if offset >= self.io.len() as u64 {
            return Err(EINVAL);
        }
        Ok((self.phys + offset) >> kernel::page::PAGE_SHIFT)
    }
}

impl<const SIZE: usize> core::ops::Deref for Bar<SIZE> {
    type Target = IoMem<SIZE>;
    fn deref(&self) -> &IoMem<SIZE> {
        &self.io
    }
}

#[repr(C)]
struct RawDriver<T: Driver> {
    // First field: `probe_callback` finds the `RawDriver` from it.
    drv: bindings::pci_driver,
    ids: [bindings::pci_device_id; 2],
    ctx: T::Context,
}

/// A registered PCI driver; unregistered (removing every bound device) on drop.
///
/// # Invariants
///
/// `raw` came from `KBox::into_raw` and is registered with the PCI core until `Drop`.
pub(crate) struct Registration<T: Driver> {
    raw: NonNull<RawDriver<T>>,
    _t: PhantomData<T>,
}

// SAFETY: the PCI core synchronises driver (un)registration; we only touch `raw` in Drop.
unsafe impl<T: Driver> Send for Registration<T> {}
// SAFETY: `&Registration` gives no access to `raw`.
unsafe impl<T: Driver> Sync for Registration<T> {}

impl<T: Driver> Registration<T> {
    /// Registers the driver; `ctx` is handed to every probe.
    pub(crate) fn register(module: &'static ThisModule, ctx: T::Context) -> Result<Self> {
        // SAFETY: `pci_driver` and `pci_device_id` are C structs of integers, pointers and
        // optional function pointers, for which all-zeroes is a valid (empty) value.
        let (drv, ids) = unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
        let raw = KBox::into_raw(KBox::new(RawDriver::<T> { drv, ids, ctx }, GFP_KERNEL)?);
        // SAFETY: `raw` is a fresh, exclusively owned allocation.
        let r = unsafe { &mut *raw };
        // PCI_ANY_ID is `(~0)`: all ones.
        let any = u32::MAX;
        r.ids[0].vendor = any;
        r.ids[0].device = any;
        r.ids[0].subvendor = any;
        r.ids[0].subdevice = any;
        r.ids[0].class = T::CLASS;
        r.ids[0].class_mask = 0xFF_FFFF;
        // Bind only when driver_override names us.
        r.ids[0].override_only = 1;
        r.drv.name = T::NAME.as_char_ptr().cast();
        r.drv.id_table = r.ids.as_ptr();
        r.drv.probe = Some(probe_callback::<T>);
        r.drv.remove = Some(remove_callback::<T>);
        // SAFETY: `drv` is fully initialised and lives at a stable heap address until
        // `pci_unregister_driver` in Drop; `module` is this module's THIS_MODULE.
        let ret = unsafe {
            bindings::__pci_register_driver(&mut r.drv, module.as_ptr().cast(), T::NAME.as_char_ptr().cast())
        };
        if let Err(e) = to_result(ret) {
            // SAFETY: registration failed, so the core holds no pointer to `raw`.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(e);
        }
        // INVARIANT: registered; `raw` is non-null (it came from a box).
        Ok(Registration { raw: NonNull::new(raw).ok_or(ENOMEM)?, _t: PhantomData })
    }
}

impl<T: Driver> Drop for Registration<T> {
    fn drop(&mut self) {
        // SAFETY: by the invariant the driver is registered; unregistering removes every bound
        // device (running `remove`) before returning, after which nothing refers to `raw`.
        unsafe {
            bindings::pci_unregister_driver(&mut (*self.raw.as_ptr()).drv);
            drop(KBox::from_raw(self.raw.as_ptr()));
        }
    }
}

unsafe extern "C" fn probe_callback<T: Driver>(
    pdev: *mut bindings::pci_dev,
    _id: *const bindings::pci_device_id,
) -> kernel::ffi::c_int {
    // SAFETY: the PCI core passes a live device for the duration of probe.
    let dev = match unsafe { Device::get(pdev) } {
        Ok(d) => d,
        Err(e) => return e.to_errno(),
    };
    // SAFETY: the driver core set `dev.driver` to the `device_driver` embedded in the
    // `pci_driver` it matched, which is ours: the `drv` field (first, `repr(C)`) of a
    // `RawDriver<T>` that stays registered, and so alive, until probe and remove are done.
    let ctx = unsafe {
        let drv = (*pdev).dev.driver.byte_sub(core::mem::offset_of!(bindings::pci_driver, driver));
        &(*drv.cast::<RawDriver<T>>()).ctx
    };
    match T::probe(&dev, ctx) {
        Ok(data) => {
            // SAFETY: we are the driver being bound, in probe.
            unsafe { dev.set_drvdata(KBox::into_raw(data).cast()) };
            0
        }
        Err(e) => e.to_errno(),
    }
}

unsafe extern "C" fn remove_callback<T: Driver>(pdev: *mut bindings::pci_dev) {
    // SAFETY: the PCI core passes a live device for the duration of remove.
    let Ok(dev) = (unsafe { Device::get(pdev) }) else { return };
    let data = dev.drvdata().cast::<T::Data>();
    if data.is_null() {
        return;
    }
    // SAFETY: probe stored a `KBox<T::Data>` here, and remove runs once per successful probe.
    let data = unsafe { KBox::from_raw(data) };
    T::remove(&dev, &data);
    // SAFETY: we are the bound driver; clearing our pointer before freeing it.
    unsafe { dev.set_drvdata(core::ptr::null_mut()) };
    drop(data);
}
