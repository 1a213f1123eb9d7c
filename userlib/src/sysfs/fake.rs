//! A fake sysfs/procfs tree for the tests: directories, attributes and the symlinks the kernel
//! makes, nothing more.

use super::Host;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

pub(crate) struct Fake {
    dir: tempfile::TempDir,
}

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

fn link(target: &Path, at: &Path) {
    fs::create_dir_all(at.parent().unwrap()).unwrap();
    symlink(target, at).unwrap();
}

impl Fake {
    pub(crate) fn new() -> Fake {
        let f = Fake { dir: tempfile::tempdir().unwrap() };
        fs::create_dir_all(f.root().join("proc/self")).unwrap();
        write(&f.root().join("proc/self/mountinfo"), "");
        fs::create_dir_all(f.root().join("sys/class/block")).unwrap();
        f
    }

    pub(crate) fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub(crate) fn host(&self) -> Host {
        Host::at(self.root())
    }

    fn sys(&self) -> PathBuf {
        self.root().join("sys")
    }

    /// The sysfs directory of `addr`: where its `bus/pci/devices` link points (below its
    /// bridges), else directly on root bus `pci0000:00`.
    pub(crate) fn pci_dir(&self, addr: &str) -> PathBuf {
        fs::canonicalize(self.sys().join("bus/pci/devices").join(addr))
            .unwrap_or_else(|_| self.sys().join("devices/pci0000:00").join(addr))
    }

    /// A driver directory (`bind`, `unbind`), i.e. a loaded driver.
    pub(crate) fn driver(&self, name: &str) {
        let d = self.sys().join("bus/pci/drivers").join(name);
        write(&d.join("bind"), "");
        write(&d.join("unbind"), "");
    }

    /// A PCI function of `class` held by `driver`.
    pub(crate) fn pci(&self, addr: &str, class: &str, driver: Option<&str>) {
        let d = self.pci_dir(addr);
        write(&d.join("class"), &format!("{class}\n"));
        write(&d.join("vendor"), "0x1b36\n");
        write(&d.join("device"), "0x0010\n");
        write(&d.join("driver_override"), "(null)\n");
        link(&d, &self.sys().join("bus/pci/devices").join(addr));
        if let Some(drv) = driver {
            self.driver(drv);
            link(&self.sys().join("bus/pci/drivers").join(drv), &d.join("driver"));
        }
    }

    /// A PCI function `addr` of `class` with IDs `vendor`:`device` below the bridge `parent`
    /// (a device made before), or with `None` on the root bus its address names
    /// (`pciDDDD:BB`), with the config space `config` (see [`config_space`]).
    pub(crate) fn pci_below(&self, parent: Option<&str>, addr: &str, class: &str, ids: (u16, u16), config: &[u8]) {
        let d = match parent {
            Some(p) => self.pci_dir(p).join(addr),
            None => self.sys().join("devices").join(format!("pci{}", &addr[..7])).join(addr),
        };
        write(&d.join("class"), &format!("{class}\n"));
        write(&d.join("vendor"), &format!("{:#06x}\n", ids.0));
        write(&d.join("device"), &format!("{:#06x}\n", ids.1));
        write(&d.join("driver_override"), "(null)\n");
        fs::write(d.join("config"), config).unwrap();
        link(&d, &self.sys().join("bus/pci/devices").join(addr));
    }

    /// Replaces the config space of `addr`.
    pub(crate) fn config(&self, addr: &str, config: &[u8]) {
        fs::write(self.pci_dir(addr).join("config"), config).unwrap();
    }

    /// Binds `addr` to `drv`.
    pub(crate) fn bind_to(&self, addr: &str, drv: &str) {
        self.driver(drv);
        link(&self.sys().join("bus/pci/drivers").join(drv), &self.pci_dir(addr).join("driver"));
    }

    /// `/proc/cpuinfo` of two CPUs from `vendor` (`GenuineIntel`, `AuthenticAMD`) of x86
    /// family `family`.
    pub(crate) fn cpu(&self, vendor: &str, family: u32) {
        let one = |n: u32| format!("processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 1\n");
        write(&self.root().join("proc/cpuinfo"), &format!("{}\n{}\n", one(0), one(1)));
    }

    /// The nvme driver's controller device `ctrl` of `addr`.
    pub(crate) fn nvme_ctrl(&self, addr: &str, ctrl: &str, serial: &str, dev: &str) {
        let d = self.pci_dir(addr).join("nvme").join(ctrl);
        write(&d.join("model"), "QEMU NVMe Ctrl                          \n");
        write(&d.join("serial"), &format!("{serial}\n"));
        write(&d.join("firmware_rev"), "9.1.0   \n");
        write(&d.join("dev"), &format!("{dev}\n"));
        link(&self.pci_dir(addr), &d.join("device"));
        link(&d, &self.sys().join("class/nvme").join(ctrl));
    }

    /// Namespace `nsid` of `ctrl` (`nvmeC`) on `addr`: block device `nvmeCnN`, device number
    /// `259:(16 C + N - 1)`.
    pub(crate) fn namespace(&self, addr: &str, ctrl: &str, nsid: u32, bytes: u64, lbs: u64) {
        let blk = format!("{ctrl}n{nsid}");
        let c: u32 = ctrl.trim_start_matches("nvme").parse().unwrap();
        let d = self.pci_dir(addr).join("nvme").join(ctrl).join(&blk);
        write(&d.join("nsid"), &format!("{nsid}\n"));
        write(&d.join("size"), &format!("{}\n", bytes / 512));
        write(&d.join("queue/logical_block_size"), &format!("{lbs}\n"));
        write(&d.join("dev"), &format!("259:{}\n", 16 * c + nsid - 1));
        fs::create_dir_all(d.join("holders")).unwrap();
        link(&d, &self.sys().join("class/block").join(blk));
    }

    /// Namespace `nsid` of subsystem `subsys` as a kernel with CONFIG_NVME_MULTIPATH shows it:
    /// the head disk `head` (device number `dev`) under the subsystem, and one hidden path
    /// disk `nvmeScCnH` per controller `(addr, ctrl)` of `paths`, listed in the head's
    /// `multipath/`.
    pub(crate) fn multipath_namespace(&self, subsys: &str, head: &str, nsid: u32, dev: &str, paths: &[(&str, &str)]) {
        let h = self.sys().join("devices/virtual/nvme-subsystem").join(subsys).join(head);
        write(&h.join("nsid"), &format!("{nsid}\n"));
        write(&h.join("size"), "131072\n");
        write(&h.join("queue/logical_block_size"), "512\n");
        write(&h.join("dev"), &format!("{dev}\n"));
        write(&h.join("hidden"), "0\n");
        fs::create_dir_all(h.join("holders")).unwrap();
        link(&h, &self.sys().join("class/block").join(head));
        for (addr, ctrl) in paths {
            let c: u32 = ctrl.trim_start_matches("nvme").parse().unwrap();
            // The kernel names a path after the head: nvme<subsystem>c<controller>n<head>.
            let (subsys_part, head_part) = head.rsplit_once('n').unwrap();
            let name = format!("{subsys_part}c{c}n{head_part}");
            let d = self.pci_dir(addr).join("nvme").join(ctrl).join(&name);
            write(&d.join("nsid"), &format!("{nsid}\n"));
            write(&d.join("size"), "131072\n");
            write(&d.join("hidden"), "1\n");
            link(&d, &self.sys().join("class/block").join(&name));
            link(&d, &h.join("multipath").join(&name));
        }
    }

    /// Partition `part` (device number `dev`) of block device `disk`, inside its folder.
    pub(crate) fn partition(&self, disk: &str, part: &str, dev: &str) {
        let d = fs::canonicalize(self.sys().join("class/block").join(disk)).unwrap().join(part);
        write(&d.join("dev"), &format!("{dev}\n"));
        write(&d.join("partition"), "1\n");
        fs::create_dir_all(d.join("holders")).unwrap();
        link(&d, &self.sys().join("class/block").join(part));
    }

    /// A mount of device `dev` (`MAJ:MIN`) on `on`.
    pub(crate) fn mount(&self, dev: &str, on: &str) {
        let p = self.root().join("proc/self/mountinfo");
        let mut s = fs::read_to_string(&p).unwrap();
        s.push_str(&format!("30 1 {dev} / {on} rw,relatime shared:1 - ext4 /dev/x rw\n"));
        fs::write(p, s).unwrap();
    }

    /// An md array `md` over the block devices `members` (slaves and holders, as md makes them).
    pub(crate) fn md(&self, md: &str, members: &[&str]) {
        let d = self.sys().join("devices/virtual/block").join(md);
        write(&d.join("md/level"), "raid0\n");
        write(&d.join("dev"), "9:0\n");
        link(&d, &self.sys().join("class/block").join(md));
        for m in members {
            let member = fs::canonicalize(self.sys().join("class/block").join(m)).unwrap();
            link(&member, &d.join("slaves").join(m));
            link(&d, &member.join("holders").join(md));
        }
    }

    /// A ugds node `node` of `addr` (class directory and the class's device link).
    pub(crate) fn ugds_node(&self, addr: &str, node: &str) {
        let d = self.pci_dir(addr).join(crate::device::NODE_CLASS).join(node);
        write(&d.join("dev"), "240:0\n");
        link(&self.pci_dir(addr), &d.join("device"));
        link(&d, &self.sys().join("class").join(crate::device::NODE_CLASS).join(node));
    }

    /// A volume descriptor `name` holding `spec` (mode 0600, as the reader wants).
    pub(crate) fn volume(&self, name: &str, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = self.root().join("etc/ugds/volumes").join(name);
        write(&p, text);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// What `driver_override` of `addr` holds now.
    pub(crate) fn override_of(&self, addr: &str) -> String {
        fs::read_to_string(self.pci_dir(addr).join("driver_override")).unwrap()
    }

    /// Puts `addr` in IOMMU group `group` whose domain type is `domain`.
    pub(crate) fn iommu_group(&self, addr: &str, group: &str, domain: &str) {
        let g = self.sys().join("kernel/iommu_groups").join(group);
        write(&g.join("type"), &format!("{domain}\n"));
        link(&g, &self.pci_dir(addr).join("iommu_group"));
    }
}

/// A 4096-byte config space (what root reads from sysfs) with a PCI Express capability of port
/// type `pcie_type` (0 endpoint, 4 root port, 5 switch upstream port, 6 switch downstream
/// port) at 0x40 and, with `acs` set, an ACS extended capability at 0x148 (after an AER one at
/// 0x100, so the walk follows a next pointer) whose control register holds `acs`.
pub(crate) fn config_space(pcie_type: u8, acs: Option<u16>) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    c[0x06] = 1 << 4; // status: capability list
    c[0x34] = 0x40;
    c[0x40] = super::p2p::CAP_PCIE;
    c[0x42] = (pcie_type << 4) | 2; // capability version 2
    let ext = |c: &mut Vec<u8>, at: usize, id: u16, next: u32| {
        let h = u32::from(id) | (1 << 16) | (next << 20);
        c[at..at + 4].copy_from_slice(&h.to_le_bytes());
    };
    // AER (ID 1) first; it points to ACS or ends the list.
    ext(&mut c, 0x100, 0x0001, if acs.is_some() { 0x148 } else { 0 });
    if let Some(ctrl) = acs {
        ext(&mut c, 0x148, super::p2p::EXT_CAP_ACS, 0);
        // Capability register: every ACS feature (SV TB RR CR UF EC DT) implemented.
        c[0x14c..0x14e].copy_from_slice(&0x007fu16.to_le_bytes());
        let at = 0x148 + super::p2p::ACS_CTRL;
        c[at..at + 2].copy_from_slice(&ctrl.to_le_bytes());
    }
    c
}
