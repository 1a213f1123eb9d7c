//! ugds: takes over an NVMe controller (bound through `driver_override` only) and hands its I/O
//! queue pairs and registered memory to user space through `/dev/ugds_drvN` (character devices
//! of the sysfs class `ugds_drv`, as uGDS names them, so its tools and LMCache's uGDS backend
//! accept them).
//!
//! Layout: `shim/` is the thin safe layer over the module-local bindings; `ctrl` brings the
//! controller up and down, `admin` is the in-kernel admin queue, `qpair` the user queue pairs,
//! `registry` the registrations, `device` the shared per-controller state and its teardown
//! order, `chardev` the ioctl/mmap ABI from `uapi`.

use core::sync::atomic::{AtomicU64, Ordering};
use kernel::c_str;
use kernel::prelude::*;
use kernel::str::CString;

mod admin;
mod bindings;
mod chardev;
mod ctrl;
mod device;
mod errno;
mod openers;
mod qpair;
mod registry;
mod shadow;
mod shim;
mod table;
mod uapi;

use device::{Controller, Hw};
use kernel::sync::Arc;
use shim::chrdev;
use shim::pci;
use uapi::ioctl::DEVICE_SHADOW_DOORBELLS;
use uapi::regs::{Cap, Vs, REG_CAP, REG_DOORBELL_BASE, REG_VS};

// `module!`'s keys differ by series: `author` on 6.12, `authors` later.
#[cfg(ugds_linux_6_12)]
module! {
    type: UgdsModule,
    name: "ugds",
    author: "ugds developers",
    description: "User-space GPU Direct Storage: NVMe queues for user space",
    license: "GPL",
}
#[cfg(not(ugds_linux_6_12))]
module! {
    type: UgdsModule,
    name: "ugds",
    authors: ["ugds developers"],
    description: "User-space GPU Direct Storage: NVMe queues for user space",
    license: "GPL",
}
/// This module, as 6.12's `module!` names it (later series make it an associated constant).
#[cfg(not(ugds_linux_6_12))]
static THIS_MODULE: kernel::ThisModule = <UgdsModule as kernel::ModuleMetadata>::THIS_MODULE;

/// The kernel configuration this module was built against (Kbuild's `UGDS_KCONFIG`), as a
/// `.modinfo` entry that `ugds-kmod check` compares with the running kernel's.
const KCONFIG_ENTRY: &str = concat!("ugds_kconfig=", env!("UGDS_KCONFIG"), "\0");
#[link_section = ".modinfo"]
#[used]
static KCONFIG: [u8; KCONFIG_ENTRY.len()] = modinfo_entry(KCONFIG_ENTRY);

/// The bytes of a `.modinfo` entry (`key=value\0`).
const fn modinfo_entry<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let b = s.as_bytes();
    let mut i = 0;
    while i < N {
        out[i] = b[i];
        i += 1;
    }
    out
}

/// PCI class code of an NVM Express controller (mass storage, NVM, NVMe).
const CLASS_NVME: u32 = 0x01_0802;

/// BAR0 must hold at least the registers and the admin queue's doorbells.
const BAR0_MIN: usize = 0x1008;

/// The controller's mapped BAR0.
pub(crate) type Bar0 = pci::Bar<BAR0_MIN>;

/// The device class of the nodes: `/sys/class/ugds_drv`, nodes `/dev/ugds_drvN`, mode 0600
/// (without an IOMMU, whoever opens a node can make the SSD write anywhere).
static UGDS_DRV: chrdev::Class = chrdev::Class::new::<0o600>(c_str!("ugds_drv"));

/// How many controllers can be bound at once (minor numbers of the region, bits of INSTANCES).
const MAX_INSTANCES: u32 = 64;
static_assert!(MAX_INSTANCES <= u64::BITS);

/// Instance numbers in use (bit N: /dev/ugds_drvN, minor N).
static INSTANCES: AtomicU64 = AtomicU64::new(0);

fn alloc_instance() -> Result<u32> {
    loop {
        let cur = INSTANCES.load(Ordering::Relaxed);
        let free = (!cur).trailing_zeros();
        if free >= MAX_INSTANCES {
            return Err(ENOSPC);
        }
        if INSTANCES.compare_exchange(cur, cur | 1 << free, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Ok(free);
        }
    }
}

fn free_instance(n: u32) {
    INSTANCES.fetch_and(!(1u64 << n), Ordering::AcqRel);
}

/// An instance number in use; freed on drop.
struct Instance(u32);

impl Drop for Instance {
    fn drop(&mut self) {
        free_instance(self.0);
    }
}

/// One bound controller. Fields drop in order: the node goes first (no new opens; it held a
/// reference to the controller state), then its instance number becomes free for reuse.
struct Bound {
    node: chrdev::Registration<chardev::Chardev>,
    _instance: Instance,
}

struct NvmeDriver;

/// The doorbells user space may map: exactly those of the queues the controller has (admin
/// included, which share the first page), rounded up to a page; refused (`blocked`) when the
/// MSI-X table or pending-bit array lies in those pages, since a process writing there could
/// retarget or fake interrupts.
fn doorbell_window(dev: &pci::Device, bar: &Bar0, cap: Cap, max_qpairs: u32) -> Result<device::DoorbellWindow> {
    let stride = 4u64 << cap.dstrd();
    let bytes = (u64::from(max_qpairs) + 1) * 2 * stride;
    let len = bytes.next_multiple_of(kernel::page::PAGE_SIZE as u64);
    let start = REG_DOORBELL_BASE as u64;
    if start + len > bar.len() as u64 {
        pr_err!("{}: BAR0 of {} bytes ends inside the doorbells of {} queue pairs\n", dev.name(), bar.len(), max_qpairs);
        return Err(ENODEV);
    }
    let mut blocked = false;
    if let Some(structures) = dev.msix_structures()? {
        for (what, (bir, off, size)) in ["MSI-X table", "MSI-X PBA"].iter().zip(structures) {
            if bir == 0 && off < start + len && start < off + size {
                pr_warn!(
                    "{}: the {} ({:#x}..{:#x} of BAR0) shares the doorbell pages: user queues are refused (EACCES)\n",
                    dev.name(),
                    what,
                    off,
                    off + size
                );
                blocked = true;
            }
        }
    }
    Ok(device::DoorbellWindow { len, blocked })
}

/// Stops the controller after a failed probe step before its admin queue memory is freed; if
/// it does not stop, that memory stays allocated. Returns the step's error.
fn stop_after_failed_probe(name: &CStr, bar: &Bar0, cap: Cap, adminq: admin::AdminQueue, e: Error) -> Error {
    if ctrl::disable(bar, cap).is_err() {
        pr_err!("{}: controller did not stop after a failed probe: leaking its admin queue\n", name);
        core::mem::forget(adminq);
    }
    e
}

/// Shadow doorbells for a controller that advertises them (`info.flags`), given to it: `None`
/// where it does not, where the pages cannot cover its queues, or where it refuses them (an
/// error status: it then uses the registers alone). An admin command that never completes is
/// an error: the probe fails.
fn shadow_doorbells(
    dev: &pci::Device,
    bar: &Bar0,
    cap: Cap,
    adminq: &mut admin::AdminQueue,
    info: &uapi::ioctl::DeviceInfo,
) -> Result<Option<shadow::ShadowDoorbells>> {
    if info.flags & DEVICE_SHADOW_DOORBELLS == 0 {
        return Ok(None);
    }
    let name = dev.name();
    let Some(s) = shadow::ShadowDoorbells::alloc(dev, info.max_qpairs + 1, 4 << cap.dstrd())? else {
        pr_info!("{}: shadow doorbells do not fit one page at this stride: registers only\n", name);
        return Ok(None);
    };
    match s.configure(bar, adminq) {
        Ok(()) => {
            pr_info!("{}: shadow doorbells on\n", name);
            Ok(Some(s))
        }
        Err(e) if adminq.is_broken() => {
            // The controller may have taken the pages: they go only once it stopped.
            if ctrl::disable(bar, cap).is_err() {
                pr_err!("{}: controller did not stop: leaking its shadow doorbell pages\n", name);
                core::mem::forget(s);
            }
            Err(e)
        }
        Err(e) => {
            pr_warn!("{}: Doorbell Buffer Config failed ({:?}): registers only\n", name, e);
            Ok(None)
        }
    }
}

fn step<T>(name: &CStr, what: &str, r: Result<T>) -> Result<T> {
    r.inspect_err(|e| pr_err!("{}: probe step '{}' failed: {:?}\n", name, what, e))
}

impl pci::Driver for NvmeDriver {
    type Data = Bound;
    type Context = Arc<chrdev::Region>;
    const NAME: &'static CStr = c_str!("ugds");
    const CLASS: u32 = CLASS_NVME;

    fn probe(dev: &pci::Device, region: &Arc<chrdev::Region>) -> Result<KBox<Bound>> {
        let name = dev.name();
        if dev.class() != CLASS_NVME {
            pr_err!("{}: class {:#08x} is not an NVMe controller\n", name, dev.class());
            return Err(ENODEV);
        }
        let enabled = step(name, "enable device", dev.enable_mem())?;
        enabled.set_master();
        step(name, "64-bit DMA mask", dev.set_dma_mask(64))?;
        let bar = step(name, "map BAR0", enabled.map_bar::<BAR0_MIN>(0, c_str!("ugds")))?;
        let cap = Cap(bar.read64::<REG_CAP>());
        let vs = Vs(bar.read32::<REG_VS>());
        let (vid, did) = dev.ids();
        pr_info!(
            "{}: NVMe {:04x}:{:04x} CAP {:#018x} (MQES {}, DSTRD {}, TO {} ms, MPSMIN {}) VS {}.{}.{}, BAR0 {} bytes\n",
            name,
            vid,
            did,
            cap.0,
            cap.max_queue_entries(),
            cap.dstrd(),
            cap.timeout_ms(),
            cap.min_page_size(),
            vs.major(),
            vs.minor(),
            vs.tertiary(),
            bar.len()
        );
        if cap.mpsmin() != 0 || cap.css() & 1 == 0 {
            pr_err!("{}: needs 4 KiB pages and the NVM command set\n", name);
            return Err(ENODEV);
        }
        let mut adminq = step(name, "allocate admin queue", admin::AdminQueue::new(dev, cap.dstrd()))?;
        step(name, "disable controller", ctrl::disable(&bar, cap))?;
        let brought_up = ctrl::enable(&bar, cap, &mut adminq)
            .inspect_err(|e| pr_err!("{}: probe step 'enable controller' failed: {:?}\n", name, e))
            .and_then(|_| step(name, "identify", ctrl::identify_all(&bar, cap, &mut adminq)));
        let mut info = match brought_up {
            Ok(i) => i,
            Err(e) => return Err(stop_after_failed_probe(name, &bar, cap, adminq, e)),
        };
        info.vs = vs.0;
        // One MSI-X vector per I/O queue pair plus the admin queue's; without MSI-X, queues
        // are polled only (QPAIR_FLAG_IRQ then fails with ENOSPC).
        let irqs = match shim::irq::IrqVectors::alloc(dev, info.max_qpairs + 1) {
            Ok(v) => Some(v),
            Err(e) => {
                pr_warn!("{}: no MSI-X vectors ({:?}): interrupt mode unavailable\n", name, e);
                None
            }
        };
        info.irq_vectors = irqs.as_ref().map_or(0, |v| v.count().saturating_sub(1));
        let instance = match alloc_instance() {
            Ok(i) => Instance(i),
            Err(e) => {
                let _ = ctrl::disable(&bar, cap);
                return Err(e);
            }
        };
        info.instance = instance.0;
        let node_name = match CString::try_from_fmt(format_args!("ugds_drv{}", instance.0)) {
            Ok(n) => n,
            Err(e) => {
                let _ = ctrl::disable(&bar, cap);
                return Err(e);
            }
        };
        let doorbells = match doorbell_window(dev, &bar, cap, info.max_qpairs) {
            Ok(w) => w,
            Err(e) => {
                let _ = ctrl::disable(&bar, cap);
                return Err(e);
            }
        };
        let shadow = match shadow_doorbells(dev, &bar, cap, &mut adminq, &info) {
            Ok(s) => s,
            Err(e) => return Err(stop_after_failed_probe(name, &bar, cap, adminq, e)),
        };
        if shadow.is_none() {
            info.flags &= !DEVICE_SHADOW_DOORBELLS;
        }
        let shadow = core::mem::ManuallyDrop::new(shadow);
        let hw = Hw { bar, cap, admin: core::mem::ManuallyDrop::new(adminq), irqs, shadow, enabled };
        // On failure `hw` was dropped by the constructor, which stopped the controller.
        let controller = Controller::new(dev, info, cap, doorbells, hw)?;
        let fops = &chardev::FOPS;
        let node = match chrdev::Registration::register(region, instance.0, &node_name, dev, controller.clone(), fops) {
            Ok(n) => n,
            Err(e) => {
                pr_err!("{}: probe step 'register /dev/{}' failed: {:?}\n", name, &*node_name, e);
                controller.shutdown();
                return Err(e);
            }
        };
        pr_info!(
            "{}: /dev/{} ({}:{}): {} (fw {}, serial {}), MDTS {} bytes, {} I/O queue pairs of up to {} entries\n",
            name,
            &*node_name,
            region.major(),
            instance.0,
            ctrl::ascii(&info.model),
            ctrl::ascii(&info.firmware),
            ctrl::ascii(&info.serial),
            info.mdts_bytes,
            info.max_qpairs,
            info.max_queue_entries
        );
        for ns in &info.namespaces[..info.num_namespaces as usize] {
            pr_info!(
                "{}: namespace {}: {} blocks of {} bytes ({} MiB), {} bytes of metadata, PI type {}\n",
                name,
                ns.nsid,
                ns.size_lbas,
                1u32 << ns.lba_shift,
                (ns.size_lbas << ns.lba_shift) >> 20,
                ns.metadata_bytes,
                ns.pi_type
            );
        }
        Ok(KBox::new(Bound { node, _instance: instance }, GFP_KERNEL)?)
    }

    fn remove(dev: &pci::Device, data: &Bound) {
        data.node.device().shutdown();
        pr_info!("{}: released\n", dev.name());
    }
}

/// The module. Unloading drops the driver (removing every bound controller and its node), then
/// the last reference to the node region: its device numbers and the class go last.
struct UgdsModule {
    _driver: pci::Registration<NvmeDriver>,
}

impl kernel::Module for UgdsModule {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let region = Arc::new(chrdev::Region::register(&UGDS_DRV, MAX_INSTANCES)?, GFP_KERNEL)?;
        let driver = pci::Registration::register(module, region)?;
        pr_info!("loaded (uapi ABI {})\n", uapi::ioctl::ABI_VERSION);
        Ok(UgdsModule { _driver: driver })
    }
}

impl Drop for UgdsModule {
    fn drop(&mut self) {
        pr_info!("unloading\n");
    }
}
