//! Who uses a controller, and handing it to ugds and back (`driver_override`): the refusals of
//! `ugds bind` and `cargo xtask bind` live here, once.

use super::{device_in, Host, Result, SysfsError, CLASS_NVME};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::{Duration, Instant};

/// A controller as a multi-controller bind sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// PCI address.
    pub addr: String,
    /// The driver bound now, if any.
    pub driver: Option<String>,
    /// Why it must not be taken ([`Host::users`]); empty when free or already ugds's.
    pub users: Vec<String>,
}

/// Controllers left with their driver because they are in use, each with the reasons.
pub type Refused = Vec<(String, Vec<String>)>;

/// What a multi-controller bind takes and what it leaves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    /// Controllers to bind, in order.
    pub take: Vec<String>,
    /// Controllers in use, with the reasons, left with their driver.
    pub refused: Refused,
}

/// Decides which controllers to take. A named list is all or nothing: one controller in use
/// refuses the whole list (nothing is bound), naming each one in use and why. `--all` takes the
/// free ones and names the others; it fails only when none is free.
pub fn select(cands: &[Candidate], all: bool) -> Result<Selection> {
    let mut s = Selection::default();
    for c in cands {
        if c.driver.as_deref() != Some("ugds") && !c.users.is_empty() {
            s.refused.push((c.addr.clone(), c.users.clone()));
        } else {
            s.take.push(c.addr.clone());
        }
    }
    if !all && !s.refused.is_empty() {
        return Err(SysfsError::InUse { refused: s.refused });
    }
    if s.take.is_empty() {
        if s.refused.is_empty() {
            return Err(SysfsError::NoControllers);
        }
        return Err(SysfsError::AllInUse { refused: s.refused });
    }
    Ok(s)
}

/// `ADDR: why; why` per refused controller, one per line.
pub fn describe_refused(refused: &[(String, Vec<String>)]) -> String {
    refused.iter().map(|(a, why)| format!("\n  {a}: {}", why.join("; "))).collect()
}

/// Fails, naming both, when two targets are the same controller.
fn check_distinct(targets: &[String], addrs: &[String]) -> Result<()> {
    for (i, a) in addrs.iter().enumerate() {
        if let Some(j) = addrs[..i].iter().position(|b| b == a) {
            return Err(SysfsError::SameController {
                first: targets[j].clone(),
                second: targets[i].clone(),
                addr: a.clone(),
            });
        }
    }
    Ok(())
}

/// The volume spec naming `nodes` in order with `chunk` bytes per chunk
/// (`stripe:128K:/dev/ugds_drv0,/dev/ugds_drv1`), checked by the library's own parser.
pub fn volume_spec(chunk: u64, nodes: &[String]) -> Result<String> {
    let spec = format!("stripe:{}:{}", crate::units::human(chunk), nodes.join(","));
    match crate::VolumeSpec::parse(&spec) {
        Ok(_) => Ok(spec),
        Err(source) => Err(SysfsError::Volume { spec, source }),
    }
}

/// The `mdadm --build` line that gives the same layout as [`volume_spec`] over the kernel's
/// block devices of the same controllers, in the same order.
pub fn md_build_line(chunk: u64, devs: &[String]) -> String {
    format!("mdadm --build /dev/md0 --level=0 --chunk={} --raid-devices={} {}", chunk >> 10, devs.len(), devs.join(" "))
}

/// A controller bound to ugds by [`Host::bind_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// PCI address.
    pub addr: String,
    /// Its ugds node (`/dev/ugds_drvN`).
    pub node: String,
}

/// A controller given back to the kernel by [`Host::unbind_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// PCI address.
    pub addr: String,
    /// The driver that has it now, if any.
    pub driver: Option<String>,
    /// Its first namespace's block device (`/dev/nvme0n1`), once the kernel drives it.
    pub disk: Option<String>,
}

fn wait_for(what: &'static str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            return Err(SysfsError::Timeout { what, after: timeout });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `(major, minor)` of mountinfo's third field.
fn mountinfo_dev(field: &str) -> Option<u64> {
    let (ma, mi) = field.split_once(':')?;
    Some(libc::makedev(ma.parse().ok()?, mi.parse().ok()?))
}

impl Host {
    /// Why the controller at `addr` must not be taken from its users; empty when it is free:
    /// a namespace or partition mounted (the root file system named as such), used as swap, held
    /// by another block device (md, device mapper), or a namespace, partition or the controller's
    /// character device open in a process other than this one.
    pub fn users(&self, addr: &str) -> Result<Vec<String>> {
        let mut why = Vec::new();
        let blocks = self.block_devices(addr);
        let named: Vec<(String, u64)> =
            blocks.iter().filter_map(|b| self.block_dev_number(b).map(|d| (b.clone(), d))).collect();
        let block_rdevs: BTreeSet<u64> = named.iter().map(|(_, d)| *d).collect();
        let mut rdevs = block_rdevs.clone();
        rdevs.extend(self.ctrl_devices(addr).iter().filter_map(|c| self.ctrl_dev_number(addr, c)));
        let name_of = |rdev: u64| named.iter().find(|(_, d)| *d == rdev).map(|(n, _)| n.clone()).unwrap_or_default();
        // Mounted (the root file system included).
        let mounts = fs::read_to_string(self.proc_.join("self/mountinfo")).unwrap_or_default();
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(majmin), Some(mnt)) = (f.get(2), f.get(4)) else { continue };
            let Some(rdev) = mountinfo_dev(majmin) else { continue };
            if block_rdevs.contains(&rdev) {
                let name = name_of(rdev);
                if *mnt == "/" {
                    why.push(format!("/dev/{name} holds the root file system"));
                } else {
                    why.push(format!("/dev/{name} is mounted on {mnt}"));
                }
            }
        }
        // Swap: by device number, or by name where the path is no device here.
        for line in fs::read_to_string(self.proc_.join("swaps")).unwrap_or_default().lines().skip(1) {
            let Some(dev) = line.split_whitespace().next() else { continue };
            let by_number = fs::metadata(dev)
                .ok()
                .filter(|m| m.file_type().is_block_device())
                .is_some_and(|m| block_rdevs.contains(&m.rdev()));
            let by_name = dev.strip_prefix("/dev/").is_some_and(|n| blocks.iter().any(|b| b == n));
            if by_number || by_name {
                why.push(format!("{dev} is used as swap"));
            }
        }
        // Holders (device mapper, md, ...).
        for b in &blocks {
            for h in super::names_in(&self.sys.join("class/block").join(b).join("holders")) {
                why.push(format!("/dev/{b} is held by {h}"));
            }
        }
        // Open by a process.
        let me = std::process::id().to_string();
        for pid in super::names_in(&self.proc_) {
            if !pid.bytes().all(|c| c.is_ascii_digit()) || pid == me {
                continue;
            }
            let pdir = self.proc_.join(&pid);
            for fd in super::names_in(&pdir.join("fd")) {
                let p = pdir.join("fd").join(&fd);
                if device_in(&p, &rdevs) {
                    let comm = super::attr(pdir.join("comm")).unwrap_or_default();
                    let target = fs::read_link(&p).map(|t| t.display().to_string()).unwrap_or_default();
                    why.push(format!("{target} is open by pid {pid} ({comm})"));
                }
            }
        }
        why.dedup();
        Ok(why)
    }

    /// Checks that `target` (resolved to `addr`) is an NVMe controller.
    fn check_nvme(&self, target: &str, addr: &str) -> Result<()> {
        let class = self.class_of(addr)?;
        if class != CLASS_NVME {
            return Err(SysfsError::NotNvme { target: target.into(), addr: addr.into(), class });
        }
        Ok(())
    }

    /// Binds the controller named by `target` to ugds, refusing (and changing nothing) when it is
    /// in use ([`Host::users`]). Returns its PCI address.
    pub fn bind(&self, target: &str) -> Result<String> {
        let addr = self.resolve(target)?;
        self.check_nvme(target, &addr)?;
        if !self.module_loaded() {
            return Err(SysfsError::ModuleNotLoaded);
        }
        let pci = self.pci_path(&addr);
        match self.driver_of(&addr).as_deref() {
            Some("ugds") => return Ok(addr),
            Some(_) => {
                let why = self.users(&addr)?;
                if !why.is_empty() {
                    return Err(SysfsError::InUse { refused: vec![(addr, why)] });
                }
                self.write_sysfs(&pci.join("driver/unbind"), &addr)?;
            }
            None => {}
        }
        self.write_sysfs(&pci.join("driver_override"), "ugds")?;
        if let Err(e) = self.write_sysfs(&self.ugds_driver_dir().join("bind"), &addr) {
            // Leave the device bindable by the kernel driver again.
            let _ = self.write_sysfs(&pci.join("driver_override"), "\n");
            let _ = self.write_sysfs(&self.sys.join("bus/pci/drivers_probe"), &addr);
            let source = match e {
                SysfsError::Write { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            };
            return Err(SysfsError::ProbeFailed { addr, source });
        }
        if self.driver_of(&addr).as_deref() != Some("ugds") {
            return Err(SysfsError::DidNotBind { addr });
        }
        Ok(addr)
    }

    /// Gives the controller back to the kernel nvme driver (if loaded) and waits for its
    /// namespaces. Returns its PCI address.
    pub fn unbind(&self, target: &str) -> Result<String> {
        let addr = self.resolve(target)?;
        self.check_nvme(target, &addr)?;
        let pci = self.pci_path(&addr);
        if self.driver_of(&addr).as_deref() == Some("ugds") {
            self.write_sysfs(&pci.join("driver/unbind"), &addr)?;
        }
        self.write_sysfs(&pci.join("driver_override"), "\n")?;
        self.write_sysfs(&self.sys.join("bus/pci/drivers_probe"), &addr)?;
        if self.sys.join("bus/pci/drivers/nvme").exists() {
            wait_for("the nvme driver to bind", Duration::from_secs(10), || {
                self.driver_of(&addr).as_deref() == Some("nvme")
            })?;
            wait_for("the namespaces to reappear", Duration::from_secs(10), || !self.block_devices(&addr).is_empty())?;
        }
        Ok(addr)
    }

    /// The controllers `targets` name (or, with `all`, every NVMe controller), resolved, checked
    /// to be NVMe controllers and distinct.
    fn targets_to_addrs(&self, targets: &[String], all: bool) -> Result<Vec<String>> {
        if all {
            return self.nvme_controllers();
        }
        let addrs: Vec<String> = targets.iter().map(|t| self.resolve(t)).collect::<Result<_>>()?;
        for (t, a) in targets.iter().zip(&addrs) {
            self.check_nvme(t, a)?;
        }
        check_distinct(targets, &addrs)?;
        Ok(addrs)
    }

    /// Binds several controllers to ugds (see [`select`] for what is refused). Returns the bound
    /// ones with their nodes, in order, and the refused ones. When one fails to bind, the ones
    /// this call bound are given back before the error returns.
    pub fn bind_many(&self, targets: &[String], all: bool) -> Result<(Vec<Bound>, Refused)> {
        let addrs = self.targets_to_addrs(targets, all)?;
        if !self.module_loaded() {
            return Err(SysfsError::ModuleNotLoaded);
        }
        let mut cands = Vec::with_capacity(addrs.len());
        for a in addrs {
            let driver = self.driver_of(&a);
            let users = if driver.as_deref() == Some("ugds") { Vec::new() } else { self.users(&a)? };
            cands.push(Candidate { addr: a, driver, users });
        }
        let sel = select(&cands, all)?;
        let mut done: Vec<Bound> = Vec::with_capacity(sel.take.len());
        let mut ours = Vec::new();
        for a in &sel.take {
            let was_ugds = self.driver_of(a).as_deref() == Some("ugds");
            let r = self.bind(a).and_then(|_| {
                let node = self.ugds_nodes(a).first().map(|n| self.dev.join(n));
                match node {
                    Some(n) if crate::device::is_ugds_node(&n) => Ok(n.display().to_string()),
                    _ => Err(SysfsError::NoNode { addr: a.clone() }),
                }
            });
            match r {
                Ok(node) => {
                    if !was_ugds {
                        ours.push(a.clone());
                    }
                    done.push(Bound { addr: a.clone(), node });
                }
                Err(e) => {
                    for o in &ours {
                        let _ = self.unbind(o);
                    }
                    return Err(SysfsError::BindMany { addr: a.clone(), source: Box::new(e) });
                }
            }
        }
        Ok((done, sel.refused))
    }

    /// Gives several controllers back to the kernel (or, with `all`, every one bound to ugds or
    /// set to bind to it), in order.
    pub fn unbind_many(&self, targets: &[String], all: bool) -> Result<Vec<Released>> {
        let addrs = if all {
            self.nvme_controllers()?
                .into_iter()
                .filter(|a| {
                    self.driver_of(a).as_deref() == Some("ugds") || self.driver_override(a).as_deref() == Some("ugds")
                })
                .collect()
        } else {
            self.targets_to_addrs(targets, false)?
        };
        if addrs.is_empty() {
            return Err(SysfsError::NoneBound);
        }
        let mut out = Vec::with_capacity(addrs.len());
        for a in addrs {
            self.unbind(&a)?;
            out.push(Released { driver: self.driver_of(&a), disk: self.first_namespace(&a), addr: a });
        }
        Ok(out)
    }
}
