//! The stand-in GPU's side of the peer-to-peer tests: the emulated device with a memory BAR
//! (`cargo xtask vm --p2p`, QEMU's ivshmem-plain) bound to vfio-pci, its BAR exported as a
//! dma-buf through VFIO (Linux 7.3's `VFIO_DEVICE_FEATURE_DMA_BUF`), as a GPU driver exports its
//! memory, and mapped for the CPU to check what the SSD wrote.
//!
//! Debian's kernel has no VFIO no-IOMMU mode: vfio-pci needs the guest IOMMU.

use crate::raw::{ioctl_raw, Mapping};
use crate::{ensure_that, sh};
use anyhow::{Context, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// ivshmem's PCI ids (Red Hat, inter-VM shared memory).
const IVSHMEM: (&str, &str) = ("0x1af4", "0x1110");
/// The BAR that holds ivshmem-plain's shared memory.
pub const MEMORY_BAR: u32 = 2;

// VFIO's ioctls are _IO(';', 100 + n): no size in the number.
const fn vfio_io(n: u32) -> u32 {
    ((b';' as u32) << 8) | (100 + n)
}
const VFIO_SET_IOMMU: u32 = vfio_io(2);
const VFIO_GROUP_GET_STATUS: u32 = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: u32 = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: u32 = vfio_io(6);
const VFIO_DEVICE_GET_REGION_INFO: u32 = vfio_io(8);
const VFIO_DEVICE_RESET: u32 = vfio_io(11);
const VFIO_DEVICE_FEATURE: u32 = vfio_io(17);
const VFIO_TYPE1V2_IOMMU: u64 = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_DEVICE_FEATURE_GET: u32 = 1 << 16;
const VFIO_DEVICE_FEATURE_DMA_BUF: u32 = 11;

/// `struct vfio_region_info`.
#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}
/// vfio-pci's region of the config space.
const VFIO_PCI_CONFIG_REGION: u32 = 7;
/// The command register's memory-decoding bit.
const PCI_COMMAND_MEMORY: u16 = 1 << 1;

/// The stand-in GPU's PCI address, if the VM has one.
pub fn find_device() -> Result<Option<String>> {
    for e in std::fs::read_dir("/sys/bus/pci/devices")? {
        let e = e?;
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        if read("vendor").trim() == IVSHMEM.0 && read("device").trim() == IVSHMEM.1 {
            return Ok(Some(e.file_name().to_string_lossy().into_owned()));
        }
    }
    Ok(None)
}

/// The device bound to vfio-pci and opened through its IOMMU group, as a user-space driver (or a
/// GPU stack) holds it.
pub struct Bar {
    /// Its PCI address.
    pub addr: String,
    /// The BAR's size in bytes.
    pub size: u64,
    /// Where the BAR's region starts in the device fd (for mmap).
    region_offset: u64,
    device: OwnedFd,
    _group: OwnedFd,
    _container: OwnedFd,
}

fn open(path: &str) -> Result<OwnedFd> {
    let c = CString::new(path)?;
    // SAFETY: a valid path; the fd is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    ensure_that!(fd >= 0, "opening {path}: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An ioctl whose argument is a plain integer (not a pointer).
fn ioctl_value(fd: i32, req: u32, v: u64) -> std::io::Result<i32> {
    // SAFETY: these requests take their argument by value.
    let r = unsafe { libc::ioctl(fd, req as _, v) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Bar {
    /// Binds the stand-in GPU to vfio-pci (loading it) and opens it.
    pub fn open() -> Result<Bar> {
        let addr = find_device()?.context("this VM has no stand-in GPU (cargo xtask vm --p2p)")?;
        crate::remote::insmod("drivers/vfio/pci/vfio-pci.ko", "vfio_pci")?;
        crate::remote::insmod("drivers/vfio/vfio_iommu_type1.ko", "vfio_iommu_type1")?;
        let dev = format!("/sys/bus/pci/devices/{addr}");
        let driver = std::fs::read_link(format!("{dev}/driver")).ok();
        if driver.as_ref().and_then(|d| d.file_name()).is_none_or(|n| n != "vfio-pci") {
            std::fs::write(format!("{dev}/driver_override"), "vfio-pci")?;
            if driver.is_some() {
                std::fs::write(format!("{dev}/driver/unbind"), &addr)?;
            }
            std::fs::write("/sys/bus/pci/drivers_probe", &addr).context("binding to vfio-pci")?;
        }
        let group = std::fs::read_link(format!("{dev}/iommu_group"))
            .context("no IOMMU group: vfio-pci needs the guest IOMMU (Debian's kernel has no no-IOMMU mode)")?;
        let group = group.file_name().context("group link")?.to_string_lossy().into_owned();
        let gpath = format!("/dev/vfio/{group}");
        let t = Instant::now();
        while !Path::new(&gpath).exists() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let container = open("/dev/vfio/vfio")?;
        let gfd = open(&gpath)?;
        #[repr(C)]
        struct GroupStatus {
            argsz: u32,
            flags: u32,
        }
        let mut st = GroupStatus { argsz: 8, flags: 0 };
        ioctl_raw(gfd.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut st).context("VFIO_GROUP_GET_STATUS")?;
        let members = sh(&format!("ls /sys/kernel/iommu_groups/{group}/devices"))?;
        ensure_that!(
            st.flags & VFIO_GROUP_FLAGS_VIABLE != 0,
            "IOMMU group {group} is not viable (every device in it must be bound to vfio-pci): {}",
            members.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let mut cfd = container.as_raw_fd();
        ioctl_raw(gfd.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &mut cfd).context("VFIO_GROUP_SET_CONTAINER")?;
        ioctl_value(container.as_raw_fd(), VFIO_SET_IOMMU, VFIO_TYPE1V2_IOMMU).context("VFIO_SET_IOMMU (type1v2)")?;
        let name = CString::new(addr.clone())?;
        // SAFETY: the request takes a NUL-terminated device name; the fd is owned below.
        let d = unsafe { libc::ioctl(gfd.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD as _, name.as_ptr()) };
        ensure_that!(d >= 0, "VFIO_GROUP_GET_DEVICE_FD {addr}: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd we own.
        let device = unsafe { OwnedFd::from_raw_fd(d) };
        let mut bar = Bar { addr, size: 0, region_offset: 0, device, _group: gfd, _container: container };
        (bar.size, bar.region_offset) = bar.region(MEMORY_BAR)?;
        Ok(bar)
    }

    /// Exports `[offset, +len)` of the memory BAR as a dma-buf.
    pub fn export(&self, offset: u64, len: u64) -> std::io::Result<OwnedFd> {
        #[repr(C)]
        struct Req {
            argsz: u32,
            flags: u32,
            region_index: u32,
            open_flags: u32,
            dmabuf_flags: u32,
            nr_ranges: u32,
            offset: u64,
            length: u64,
        }
        let mut r = Req {
            argsz: core::mem::size_of::<Req>() as u32,
            flags: VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_BUF,
            region_index: MEMORY_BAR,
            open_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
            dmabuf_flags: 0,
            nr_ranges: 1,
            offset,
            length: len,
        };
        let fd = ioctl_raw(self.device.as_raw_fd(), VFIO_DEVICE_FEATURE, &mut r)?;
        // SAFETY: the feature returned a new dma-buf fd we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Maps the memory BAR for the CPU (through vfio's region mmap).
    pub fn map(&self) -> Result<Mapping> {
        // CAST: the BAR is 128 MiB.
        Mapping::new(
            self.device.as_raw_fd(),
            self.region_offset,
            self.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
        )
        .context("mmap of the memory BAR")
    }

    /// Resets the device (`VFIO_DEVICE_RESET`): vfio revokes every dma-buf of it first.
    pub fn reset(&self) -> std::io::Result<()> {
        ioctl_value(self.device.as_raw_fd(), VFIO_DEVICE_RESET, 0).map(drop)
    }

    /// Makes vfio revoke the device's dma-bufs, as its owner would: a reset where the device
    /// has a reset method (behind the switch: a secondary bus reset), else memory decoding
    /// turned off and on again through the config space (a device on the root complex has no
    /// reset here). Returns how.
    pub fn revoke(&self) -> Result<&'static str> {
        match self.reset() {
            Ok(()) => return Ok("VFIO_DEVICE_RESET"),
            Err(e) if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOTTY) => {
                return Err(e).context("VFIO_DEVICE_RESET")
            }
            Err(_) => {}
        }
        let cfg = self.region(VFIO_PCI_CONFIG_REGION)?.1 + 4;
        let mut cmd = [0u8; 2];
        // SAFETY: reading 2 bytes into our buffer from the device fd.
        let n = unsafe { libc::pread(self.device.as_raw_fd(), cmd.as_mut_ptr().cast(), 2, cfg as i64) };
        ensure_that!(n == 2, "reading the command register: {}", std::io::Error::last_os_error());
        let on = u16::from_le_bytes(cmd);
        for v in [on & !PCI_COMMAND_MEMORY, on | PCI_COMMAND_MEMORY] {
            // SAFETY: writing 2 bytes from our buffer to the device fd.
            let n = unsafe { libc::pwrite(self.device.as_raw_fd(), v.to_le_bytes().as_ptr().cast(), 2, cfg as i64) };
            ensure_that!(n == 2, "writing the command register: {}", std::io::Error::last_os_error());
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok("memory decoding off and on (config space)")
    }

    /// (size, offset in the device fd) of region `index`.
    fn region(&self, index: u32) -> Result<(u64, u64)> {
        let mut ri = RegionInfo { argsz: 32, index, ..Default::default() };
        ioctl_raw(self.device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut ri)
            .context("VFIO_DEVICE_GET_REGION_INFO")?;
        Ok((ri.size, ri.offset))
    }
}

/// Reads `[offset, +len)` of the BAR's host backing file (what the VM's host sees), dropping the
/// guest's cached copy of the 9p file first.
pub fn read_backing_file(offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let path = std::env::var("UGDS_P2P_BAR_FILE").context("UGDS_P2P_BAR_FILE is not set")?;
    std::fs::write("/proc/sys/vm/drop_caches", "3")?;
    let mut f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    f.seek(SeekFrom::Start(offset))?;
    let mut v = vec![0u8; len];
    f.read_exact(&mut v)?;
    Ok(v)
}
