//! The host's NVMe controllers as sysfs, procfs and `/dev` show them: which driver holds each one,
//! who uses it ([`Host::users`]), handing it to ugds and back through `driver_override`
//! ([`Host::bind`], [`Host::unbind`], [`Host::bind_many`], [`Host::unbind_many`]), what
//! `ugds list` prints ([`Host::controllers`]) and whether the kernel will allow peer-to-peer DMA
//! between a controller and another PCI device ([`Host::p2p_route`]).
//!
//! Every path goes through a [`Host`], whose roots are `/sys`, `/dev` and `/proc` on a real
//! machine ([`Host::system`]) and a directory tree in tests ([`Host::at`]), so the refusals can
//! be checked against a fake sysfs. Nothing here opens a ugds node: what only the module knows
//! (model, serial and namespaces of a controller bound to ugds) comes from
//! [`crate::device::Control`].

mod access;
mod bind;
mod list;
mod p2p;

pub use access::Iommu;
pub use bind::{describe_refused, md_build_line, select, volume_spec, Bound, Candidate, Refused, Released, Selection};
pub use list::{md_arrays, ControllerEntry, MdArray, NamespaceEntry, VolumeFile, VOLUME_DIR};
pub use p2p::{HostBridge, HostBridgePath, Listing, P2pRoute};

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The PCI class of an NVMe controller (mass storage, non-volatile memory, NVM Express).
pub const CLASS_NVME: &str = "0x010802";

/// What went wrong finding, binding or unbinding a controller. Each variant names the target
/// and, where there is one, what to do; a refusal changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysfsError {
    /// The target names no controller, namespace or ugds node.
    #[error("{target}: no such NVMe controller, namespace or ugds device")]
    NoSuchTarget {
        /// The target as given.
        target: String,
    },
    /// A PCI address with no device behind it.
    #[error("no PCI device {addr}")]
    NoPciDevice {
        /// The address.
        addr: String,
    },
    /// The target exists but is not on a PCI device.
    #[error("{target} is not on a PCI NVMe controller")]
    NotOnPci {
        /// The target as given.
        target: String,
    },
    /// A namespace several controllers reach (a multipath head over two ports): which
    /// controller it names is ambiguous.
    #[error("{target} is a namespace shared by the controllers {}: name one of them (a PCI address or /dev/nvmeX)", .controllers.join(", "))]
    SharedNamespace {
        /// The target as given.
        target: String,
        /// The controllers behind it, in PCI order.
        controllers: Vec<String>,
    },
    /// The PCI device is not an NVMe controller.
    #[error("{target} ({addr}) is not an NVMe controller (class {class})")]
    NotNvme {
        /// The target as given.
        target: String,
        /// Its PCI address.
        addr: String,
        /// Its PCI class.
        class: String,
    },
    /// The ugds driver is not registered.
    #[error("the ugds module is not loaded: load it with `modprobe ugds` (installed by `cargo xtask install`)")]
    ModuleNotLoaded,
    /// One controller of a list is in use: nothing was bound.
    #[error("refusing to bind any of them: {}", describe_refused(.refused))]
    InUse {
        /// Each controller in use and why.
        refused: Refused,
    },
    /// Every controller (`--all`) is in use.
    #[error("every NVMe controller is in use: {}", describe_refused(.refused))]
    AllInUse {
        /// Each controller and why.
        refused: Refused,
    },
    /// Two targets name one controller.
    #[error("{first} and {second} are the same controller ({addr})")]
    SameController {
        /// The first target.
        first: String,
        /// The second target.
        second: String,
        /// The controller.
        addr: String,
    },
    /// No NVMe controller at all.
    #[error("no NVMe controllers found")]
    NoControllers,
    /// `unbind --all` found none bound to ugds.
    #[error("no controller is bound to ugds")]
    NoneBound,
    /// Reading sysfs or procfs failed.
    #[error("reading {path}: {source}")]
    Read {
        /// What was read.
        path: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Writing a sysfs attribute failed.
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        /// The attribute.
        path: String,
        /// What was written.
        value: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The ugds driver refused to probe the controller (it was given back to the kernel).
    #[error("ugds failed to probe {addr}; see the kernel log (dmesg): {source}")]
    ProbeFailed {
        /// The controller.
        addr: String,
        /// What the bind write said.
        source: std::io::Error,
    },
    /// The bind write succeeded but another driver holds the device.
    #[error("{addr} did not bind to ugds; see the kernel log")]
    DidNotBind {
        /// The controller.
        addr: String,
    },
    /// Bound, but no `/dev/ugds_drvN` node appeared.
    #[error("{addr} is bound to ugds but no /dev/ugds_drvN node appeared; see the kernel log")]
    NoNode {
        /// The controller.
        addr: String,
    },
    /// Waiting for the kernel (the nvme driver to bind, namespaces to appear) took too long.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// One controller of a multi-controller bind failed; the ones bound before it were given back.
    #[error("binding {addr} (the controllers this call bound are given back): {source}")]
    BindMany {
        /// The controller that failed.
        addr: String,
        /// Why.
        source: Box<SysfsError>,
    },
    /// Group access to a node was asked for, but the controller's DMA is not translated by an
    /// IOMMU: any member of the group could point the SSD's DMA at any physical memory.
    #[error(
        "refusing group access to {node} ({addr}): {found}; without a translating IOMMU any opener can make \
         the SSD read or write any physical memory, so the node stays root's (mode 0600). Boot with the IOMMU \
         on and translating (intel_iommu=on or amd_iommu=on, without iommu=pt), or leave out `group`"
    )]
    GroupAccessWithoutIommu {
        /// The node.
        node: String,
        /// Its controller.
        addr: String,
        /// What the IOMMU state is.
        found: String,
    },
    /// The nodes do not make a volume.
    #[error("{spec} is not a volume: {source}")]
    Volume {
        /// The spec built.
        spec: String,
        /// The library's parser's refusal.
        source: crate::Error,
    },
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, SysfsError>;

/// Where sysfs, `/dev` and procfs are: the machine's own ([`Host::system`]) or a test tree
/// ([`Host::at`]).
#[derive(Debug, Clone)]
pub struct Host {
    sys: PathBuf,
    dev: PathBuf,
    proc_: PathBuf,
    volumes: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host::system()
    }
}

/// True for `dddd:bb:dd.f`.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// The last component of what `p` resolves to.
fn basename_of_link(p: &Path) -> Option<String> {
    let real = fs::canonicalize(p).ok()?;
    Some(real.file_name()?.to_string_lossy().into_owned())
}

/// The last component of `p` that is a PCI address: the device nearest to `p` on its bus path
/// (a controller behind a bridge, not the bridge).
fn innermost_pci_address(p: &Path) -> Option<String> {
    p.components().rev().map(|c| c.as_os_str().to_string_lossy()).find(|c| is_pci_address(c)).map(|c| c.into_owned())
}

/// The entries of a directory by name (none when it is missing), sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// A sysfs attribute, trimmed.
fn attr(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// `MAJ:MIN` as a device number.
fn parse_dev(s: &str) -> Option<u64> {
    let (ma, mi) = s.trim().split_once(':')?;
    Some(libc::makedev(ma.parse().ok()?, mi.parse().ok()?))
}

impl Host {
    /// The running machine: `/sys`, `/dev`, `/proc`, volume descriptors in [`VOLUME_DIR`].
    pub fn system() -> Host {
        Host { sys: "/sys".into(), dev: "/dev".into(), proc_: "/proc".into(), volumes: VOLUME_DIR.into() }
    }

    /// A tree rooted at `root` (`root/sys`, `root/dev`, `root/proc`, `root/etc/ugds/volumes`).
    pub fn at(root: impl AsRef<Path>) -> Host {
        let r = root.as_ref();
        Host {
            sys: r.join("sys"),
            dev: r.join("dev"),
            proc_: r.join("proc"),
            volumes: r.join(VOLUME_DIR.trim_start_matches('/')),
        }
    }

    /// The same host with volume descriptors looked up in `dir`.
    pub fn with_volume_dir(mut self, dir: impl Into<PathBuf>) -> Host {
        self.volumes = dir.into();
        self
    }

    fn pci_devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }

    fn pci_path(&self, addr: &str) -> PathBuf {
        self.pci_devices().join(addr)
    }

    fn ugds_driver_dir(&self) -> PathBuf {
        self.sys.join("bus/pci/drivers/ugds")
    }

    /// True when the ugds PCI driver is registered (the module is loaded).
    pub fn module_loaded(&self) -> bool {
        self.ugds_driver_dir().exists()
    }

    /// The PCI class of `addr` (`0x010802`).
    fn class_of(&self, addr: &str) -> Result<String> {
        let p = self.pci_path(addr).join("class");
        fs::read_to_string(&p)
            .map(|c| c.trim().to_string())
            .map_err(|source| SysfsError::Read { path: p.display().to_string(), source })
    }

    /// The driver bound to a PCI device, if any.
    pub fn driver_of(&self, addr: &str) -> Option<String> {
        basename_of_link(&self.pci_path(addr).join("driver"))
    }

    /// What `driver_override` of `addr` says (`None` when unset).
    pub fn driver_override(&self, addr: &str) -> Option<String> {
        attr(self.pci_path(addr).join("driver_override")).filter(|o| !o.is_empty() && o != "(null)")
    }

    /// Resolves `/dev/nvmeX`, `/dev/nvmeXnY[pZ]`, `nvmeX`, a ugds node (`/dev/ugds_drvN`,
    /// `ugds_drvN`: recognised by its sysfs class, see [`crate::device::is_ugds_node`]) or a PCI
    /// address to the controller's PCI address.
    pub fn resolve(&self, target: &str) -> Result<String> {
        if is_pci_address(target) {
            if !self.pci_path(target).exists() {
                return Err(SysfsError::NoPciDevice { addr: target.into() });
            }
            return Ok(target.to_string());
        }
        let name = target.strip_prefix("/dev/").unwrap_or(target);
        let node = if target.starts_with('/') { PathBuf::from(target) } else { self.dev.join(target) };
        let class_dir = self.sys.join("class").join(crate::device::NODE_CLASS).join(name);
        let link = if crate::device::is_ugds_node(&node) {
            let rdev = fs::metadata(&node).map_err(|source| SysfsError::Read { path: target.into(), source })?.rdev();
            self.sys.join(format!("dev/char/{}:{}/device", libc::major(rdev), libc::minor(rdev)))
        } else if !name.contains('/') && class_dir.exists() {
            class_dir.join("device")
        } else if !name.contains('/') && self.sys.join("class/nvme").join(name).exists() {
            self.sys.join("class/nvme").join(name).join("device")
        } else if !name.contains('/') && self.sys.join("class/block").join(name).exists() {
            let mut ctrls = self.block_controllers(name);
            return match ctrls.len() {
                0 => Err(SysfsError::NotOnPci { target: target.into() }),
                1 => Ok(ctrls.remove(0)),
                _ => Err(SysfsError::SharedNamespace { target: target.into(), controllers: ctrls }),
            };
        } else {
            return Err(SysfsError::NoSuchTarget { target: target.into() });
        };
        match basename_of_link(&link) {
            Some(addr) if is_pci_address(&addr) => Ok(addr),
            _ => Err(SysfsError::NotOnPci { target: target.into() }),
        }
    }

    /// Every NVMe-class PCI device (whatever drives it), in PCI order.
    pub fn nvme_controllers(&self) -> Result<Vec<String>> {
        let dir = self.pci_devices();
        let rd = fs::read_dir(&dir).map_err(|source| SysfsError::Read { path: dir.display().to_string(), source })?;
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| attr(e.path().join("class")).is_some_and(|c| c == CLASS_NVME))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    }

    /// Block devices (namespaces and partitions) of the controller at `addr`: those under its
    /// PCI device and the multipath heads (with their partitions) one of whose paths it is;
    /// not the hidden path disks, which have no device node.
    pub fn block_devices(&self, addr: &str) -> Vec<String> {
        let class = self.sys.join("class/block");
        let mut out: Vec<String> = names_in(&class)
            .into_iter()
            .filter(|b| attr(class.join(b).join("hidden")).is_none_or(|h| h != "1"))
            .filter(|b| self.block_controllers(b).iter().any(|a| a == addr))
            .collect();
        out.sort();
        out
    }

    /// The controllers (PCI addresses, sorted) behind block device `name`: the one its sysfs
    /// folder lies under or, for a multipath head (CONFIG_NVME_MULTIPATH: the disk lives under
    /// its subsystem, and its `multipath/` links one path disk per controller) or a partition of
    /// one, those of its paths.
    fn block_controllers(&self, name: &str) -> Vec<String> {
        let Ok(real) = fs::canonicalize(self.sys.join("class/block").join(name)) else { return Vec::new() };
        if let Some(addr) = innermost_pci_address(&real) {
            return vec![addr];
        }
        // The walk stays inside sysfs, compared as resolved paths.
        let sys = fs::canonicalize(&self.sys).unwrap_or_else(|_| self.sys.clone());
        let mut dir = real.as_path();
        loop {
            let paths = dir.join("multipath");
            if paths.is_dir() {
                let mut v: Vec<String> = names_in(&paths)
                    .iter()
                    .filter_map(|p| fs::canonicalize(paths.join(p)).ok())
                    .filter_map(|p| innermost_pci_address(&p))
                    .collect();
                v.sort();
                v.dedup();
                return v;
            }
            match dir.parent() {
                Some(up) if up.starts_with(&sys) && up != sys => dir = up,
                _ => return Vec::new(),
            }
        }
    }

    /// The kernel nvme driver's controller devices of `addr` (`nvmeX`).
    pub fn ctrl_devices(&self, addr: &str) -> Vec<String> {
        names_in(&self.pci_path(addr).join("nvme"))
    }

    /// The ugds device nodes of a controller bound to ugds (`ugds_drvN`: its devices of the class
    /// `ugds_drv`, which sysfs lists under the PCI device in a directory named after the class).
    pub fn ugds_nodes(&self, addr: &str) -> Vec<String> {
        names_in(&self.pci_path(addr).join(crate::device::NODE_CLASS))
    }

    /// The device number of a block device (`/sys/class/block/NAME/dev`).
    fn block_dev_number(&self, name: &str) -> Option<u64> {
        attr(self.sys.join("class/block").join(name).join("dev")).and_then(|d| parse_dev(&d))
    }

    /// The device number of a controller's character device (`nvmeX`).
    fn ctrl_dev_number(&self, addr: &str, name: &str) -> Option<u64> {
        attr(self.pci_path(addr).join("nvme").join(name).join("dev")).and_then(|d| parse_dev(&d))
    }

    /// The block device of namespace 1 of a controller the kernel drives (`/dev/nvme0n1`).
    pub fn first_namespace(&self, addr: &str) -> Option<String> {
        self.block_devices(addr)
            .into_iter()
            .find(|b| attr(self.sys.join("class/block").join(b).join("nsid")).is_some_and(|n| n == "1"))
            .map(|b| self.dev.join(b).display().to_string())
    }

    fn write_sysfs(&self, path: &Path, value: &str) -> Result<()> {
        fs::write(path, value).map_err(|source| SysfsError::Write {
            path: path.display().to_string(),
            value: value.into(),
            source,
        })
    }
}

/// True when `p` (followed) is a block or character device with number `rdev` in `set`.
fn device_in(p: &Path, set: &std::collections::BTreeSet<u64>) -> bool {
    fs::metadata(p).is_ok_and(|m| {
        let ft = m.file_type();
        (ft.is_block_device() || ft.is_char_device()) && set.contains(&m.rdev())
    })
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod p2p_tests;
#[cfg(test)]
mod tests;
