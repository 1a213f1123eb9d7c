//! ugds: takes over an NVMe controller (bound through `driver_override` only) and, in later
//! stages, hands its I/O queue pairs and registered memory to user space.
//!
//! This stage: a PCI driver for the NVMe class that, on probe, enables the device, enables bus
//! mastering, sets a 64-bit DMA mask, maps BAR0 and logs the controller's CAP and VS.

use kernel::c_str;
use kernel::prelude::*;

mod bindings;
mod shim;
mod uapi;

use shim::pci;
use uapi::regs::{Cap, Vs, REG_CAP, REG_VS};

module! {
    type: UgdsModule,
    name: "ugds",
    author: "ugds developers",
    description: "User-space GPU Direct Storage: NVMe queues for user space",
    license: "GPL",
}

/// PCI class code of an NVM Express controller (mass storage, NVM, NVMe).
const CLASS_NVME: u32 = 0x01_0802;

/// BAR0 must hold at least the registers and the admin queue's doorbells.
const BAR0_MIN: usize = 0x1008;

/// One bound controller. Fields drop in declaration order: unmap BAR0, then disable.
struct Controller {
    bar: pci::Bar<BAR0_MIN>,
    _enabled: pci::Enabled,
}

struct NvmeDriver;

impl pci::Driver for NvmeDriver {
    type Data = Controller;
    const NAME: &'static CStr = c_str!("ugds");
    const CLASS: u32 = CLASS_NVME;

    fn probe(dev: &pci::Device) -> Result<KBox<Controller>> {
        let name = dev.name();
        if dev.class() != CLASS_NVME {
            pr_err!("{}: class {:#08x} is not an NVMe controller\n", name, dev.class());
            return Err(ENODEV);
        }
        let enabled = dev.enable_mem().inspect_err(|e| {
            pr_err!("{}: probe step 'enable device' failed: {:?}\n", name, e)
        })?;
        enabled.set_master();
        dev.set_dma_mask(64)
            .inspect_err(|e| pr_err!("{}: probe step '64-bit DMA mask' failed: {:?}\n", name, e))?;
        let bar = enabled
            .map_bar::<BAR0_MIN>(0, c_str!("ugds"))
            .inspect_err(|e| pr_err!("{}: probe step 'map BAR0' failed: {:?}\n", name, e))?;
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
        Ok(KBox::new(Controller { bar, _enabled: enabled }, GFP_KERNEL)?)
    }

    fn remove(dev: &pci::Device, data: &Controller) {
        pr_info!("{}: released (BAR0 {} bytes)\n", dev.name(), data.bar.len());
    }
}

struct UgdsModule {
    _driver: pci::Registration<NvmeDriver>,
}

impl kernel::Module for UgdsModule {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let driver = pci::Registration::register(module)?;
        pr_info!("loaded (uapi ABI {})\n", uapi::ioctl::ABI_VERSION);
        Ok(UgdsModule { _driver: driver })
    }
}

impl Drop for UgdsModule {
    fn drop(&mut self) {
        pr_info!("unloading\n");
    }
}
