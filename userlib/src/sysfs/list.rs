//! What `ugds list` shows of each NVMe controller: its driver, identity, namespaces, nodes and
//! the volumes it is a member of (md arrays from sysfs, ugds volume descriptors from
//! [`VOLUME_DIR`]).

use super::{attr, names_in, Host, Result};
use crate::volume::{VolumeSpec, DESCRIPTOR_SUFFIX};
use std::path::{Path, PathBuf};

/// Where `ugds list` looks for ugds volume descriptors (`NAME.ugds-volume`, one spec line each;
/// see [`VolumeSpec::read_descriptor`]).
pub const VOLUME_DIR: &str = "/etc/ugds/volumes";

/// One namespace of a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceEntry {
    /// Namespace id.
    pub id: u32,
    /// Size in bytes.
    pub size: u64,
    /// Logical block size in bytes.
    pub block_size: u64,
    /// Its block device (`/dev/nvme0n1`) while the kernel drives the controller.
    pub block_device: Option<String>,
}

/// An md array and its members' block devices (`/sys/class/block/mdN/slaves`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdArray {
    /// `md0`.
    pub name: String,
    /// `raid0`, ... (`md/level`), when readable.
    pub level: Option<String>,
    /// Member block devices (`nvme0n1`, `nvme1n1p2`).
    pub members: Vec<String>,
}

/// A ugds volume descriptor found in the volume directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    /// Its path.
    pub path: String,
    /// The spec it holds, or why it is not a descriptor.
    pub spec: std::result::Result<VolumeSpec, String>,
}

/// One NVMe controller as `ugds list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControllerEntry {
    /// PCI address.
    pub addr: String,
    /// The driver holding it (`nvme`, `ugds`, `vfio-pci`, ...); `None`: no driver.
    pub driver: Option<String>,
    /// `driver_override`, when set.
    pub driver_override: Option<String>,
    /// PCI vendor and device id (`1b36:0010`).
    pub pci_id: Option<String>,
    /// Model number, where readable (the nvme driver's sysfs, or the module's GET_INFO).
    pub model: Option<String>,
    /// Serial number, where readable.
    pub serial: Option<String>,
    /// Firmware revision, where readable.
    pub firmware: Option<String>,
    /// The nvme driver's controller devices (`nvme0`).
    pub nvme_devices: Vec<String>,
    /// ugds nodes (`/dev/ugds_drv0`).
    pub ugds_nodes: Vec<String>,
    /// Block devices: namespaces and partitions (`nvme0n1`, `nvme0n1p1`).
    pub block_devices: Vec<String>,
    /// Namespaces.
    pub namespaces: Vec<NamespaceEntry>,
    /// md arrays with a member on this controller.
    pub md_arrays: Vec<String>,
    /// ugds volume descriptors naming one of its nodes.
    pub volumes: Vec<String>,
    /// Its IOMMU group number, when it has one.
    pub iommu_group: Option<String>,
}

impl ControllerEntry {
    /// Fills identity and namespaces from what the module reported (GET_INFO of its node).
    pub fn fill_from_info(&mut self, info: &ugds_uapi::ioctl::DeviceInfo) {
        let ascii = crate::device::ascii;
        self.model = Some(ascii(&info.model));
        self.serial = Some(ascii(&info.serial));
        self.firmware = Some(ascii(&info.firmware));
        let n = (info.num_namespaces as usize).min(info.namespaces.len());
        self.namespaces = info.namespaces[..n]
            .iter()
            .map(|ns| {
                let block_size = 1u64 << ns.lba_shift.min(63);
                NamespaceEntry {
                    id: ns.nsid,
                    size: ns.size_lbas.saturating_mul(block_size),
                    block_size,
                    block_device: None,
                }
            })
            .collect();
    }
}

/// Every md array of the host (`/sys/class/block/md*` with a `slaves` directory).
pub fn md_arrays(host: &Host) -> Vec<MdArray> {
    let block = host.sys.join("class/block");
    names_in(&block)
        .into_iter()
        .filter(|n| block.join(n).join("slaves").is_dir())
        .map(|name| MdArray {
            level: attr(block.join(&name).join("md/level")),
            members: names_in(&block.join(&name).join("slaves")),
            name,
        })
        .collect()
}

impl Host {
    /// The ugds volume descriptors in the volume directory (none when it is missing).
    pub fn volume_files(&self) -> Vec<VolumeFile> {
        names_in(&self.volumes)
            .into_iter()
            .filter(|n| n.ends_with(DESCRIPTOR_SUFFIX))
            .map(|n| {
                let p = self.volumes.join(n);
                VolumeFile {
                    spec: VolumeSpec::read_descriptor(&p).map_err(|e| e.to_string()),
                    path: p.display().to_string(),
                }
            })
            .collect()
    }

    /// Namespaces of a controller the kernel nvme driver holds, from its block devices.
    fn kernel_namespaces(&self, blocks: &[String]) -> Vec<NamespaceEntry> {
        let block = self.sys.join("class/block");
        let mut v: Vec<NamespaceEntry> = blocks
            .iter()
            .filter_map(|b| {
                let d = block.join(b);
                let id = attr(d.join("nsid"))?.parse().ok()?;
                let sectors: u64 = attr(d.join("size"))?.parse().ok()?;
                let block_size = attr(d.join("queue/logical_block_size")).and_then(|s| s.parse().ok()).unwrap_or(512);
                Some(NamespaceEntry {
                    id,
                    size: sectors.saturating_mul(512),
                    block_size,
                    block_device: Some(self.dev.join(b).display().to_string()),
                })
            })
            .collect();
        v.sort_by_key(|n| n.id);
        v
    }

    /// Every NVMe controller (PCI class 0x010802), in PCI order, with what sysfs says of it.
    /// Model, serial, firmware and namespaces of a controller bound to ugds are not in sysfs:
    /// fill them with [`ControllerEntry::fill_from_info`] from its node.
    pub fn controllers(&self) -> Result<Vec<ControllerEntry>> {
        let mds = md_arrays(self);
        let volumes = self.volume_files();
        let mut out = Vec::new();
        for addr in self.nvme_controllers()? {
            let pci = self.pci_path(&addr);
            let nvme_devices = self.ctrl_devices(&addr);
            let ctrl_attr = |f: &str| nvme_devices.first().and_then(|c| attr(pci.join("nvme").join(c).join(f)));
            let hexid = |f: &str| attr(pci.join(f)).map(|s| s.trim_start_matches("0x").to_string());
            let block_devices = self.block_devices(&addr);
            let ugds_nodes: Vec<String> =
                self.ugds_nodes(&addr).iter().map(|n| self.dev.join(n).display().to_string()).collect();
            let md_arrays = mds
                .iter()
                .filter(|m| m.members.iter().any(|s| block_devices.contains(s)))
                .map(|m| m.name.clone())
                .collect();
            let volumes = volumes
                .iter()
                .filter(|v| {
                    v.spec.as_ref().is_ok_and(|s| s.members.iter().any(|m| names_node(m, &ugds_nodes, &self.dev)))
                })
                .map(|v| v.path.clone())
                .collect();
            out.push(ControllerEntry {
                driver: self.driver_of(&addr),
                driver_override: self.driver_override(&addr),
                pci_id: hexid("vendor").zip(hexid("device")).map(|(v, d)| format!("{v}:{d}")),
                model: ctrl_attr("model"),
                serial: ctrl_attr("serial"),
                firmware: ctrl_attr("firmware_rev"),
                namespaces: self.kernel_namespaces(&block_devices),
                iommu_group: super::basename_of_link(&pci.join("iommu_group")),
                nvme_devices,
                ugds_nodes,
                block_devices,
                md_arrays,
                volumes,
                addr,
            });
        }
        Ok(out)
    }
}

/// True when the volume member `m` (a node path or name) is one of `nodes` (paths under `dev`).
fn names_node(m: &str, nodes: &[String], dev: &Path) -> bool {
    let full = if m.starts_with('/') { PathBuf::from(m) } else { dev.join(m) };
    nodes.iter().any(|n| Path::new(n) == full)
}
