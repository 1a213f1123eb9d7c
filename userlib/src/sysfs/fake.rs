//! A fake sysfs/procfs tree for the tests: directories, attributes and the symlinks the kernel
//! makes, nothing more.

use super::Host;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

pub(super) struct Fake {
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
    pub(super) fn new() -> Fake {
        let f = Fake { dir: tempfile::tempdir().unwrap() };
        fs::create_dir_all(f.root().join("proc/self")).unwrap();
        write(&f.root().join("proc/self/mountinfo"), "");
        fs::create_dir_all(f.root().join("sys/class/block")).unwrap();
        f
    }

    pub(super) fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub(super) fn host(&self) -> Host {
        Host::at(self.root())
    }

    fn sys(&self) -> PathBuf {
        self.root().join("sys")
    }

    pub(super) fn pci_dir(&self, addr: &str) -> PathBuf {
        self.sys().join("devices/pci0000:00").join(addr)
    }

    /// A driver directory (`bind`, `unbind`), i.e. a loaded driver.
    pub(super) fn driver(&self, name: &str) {
        let d = self.sys().join("bus/pci/drivers").join(name);
        write(&d.join("bind"), "");
        write(&d.join("unbind"), "");
    }

    /// A PCI function of `class` held by `driver`.
    pub(super) fn pci(&self, addr: &str, class: &str, driver: Option<&str>) {
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

    /// The nvme driver's controller device `ctrl` of `addr`.
    pub(super) fn nvme_ctrl(&self, addr: &str, ctrl: &str, serial: &str, dev: &str) {
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
    pub(super) fn namespace(&self, addr: &str, ctrl: &str, nsid: u32, bytes: u64, lbs: u64) {
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

    /// A mount of device `dev` (`MAJ:MIN`) on `on`.
    pub(super) fn mount(&self, dev: &str, on: &str) {
        let p = self.root().join("proc/self/mountinfo");
        let mut s = fs::read_to_string(&p).unwrap();
        s.push_str(&format!("30 1 {dev} / {on} rw,relatime shared:1 - ext4 /dev/x rw\n"));
        fs::write(p, s).unwrap();
    }

    /// An md array `md` over the block devices `members` (slaves and holders, as md makes them).
    pub(super) fn md(&self, md: &str, members: &[&str]) {
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
    pub(super) fn ugds_node(&self, addr: &str, node: &str) {
        let d = self.pci_dir(addr).join(crate::device::NODE_CLASS).join(node);
        write(&d.join("dev"), "240:0\n");
        link(&self.pci_dir(addr), &d.join("device"));
        link(&d, &self.sys().join("class").join(crate::device::NODE_CLASS).join(node));
    }

    /// A volume descriptor `name` holding `spec` (mode 0600, as the reader wants).
    pub(super) fn volume(&self, name: &str, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = self.root().join("etc/ugds/volumes").join(name);
        write(&p, text);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// What `driver_override` of `addr` holds now.
    pub(super) fn override_of(&self, addr: &str) -> String {
        fs::read_to_string(self.pci_dir(addr).join("driver_override")).unwrap()
    }

    /// Puts `addr` in IOMMU group `group` whose domain type is `domain`.
    pub(super) fn iommu_group(&self, addr: &str, group: &str, domain: &str) {
        let g = self.sys().join("kernel/iommu_groups").join(group);
        write(&g.join("type"), &format!("{domain}\n"));
        link(&g, &self.pci_dir(addr).join("iommu_group"));
    }
}
