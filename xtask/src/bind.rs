//! `cargo xtask bind` / `unbind`: hand an NVMe controller from the kernel nvme driver to ugds
//! and back, through sysfs (`driver_override`), refusing when the controller is in use.

use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PCI_DEVICES: &str = "/sys/bus/pci/devices";
const CLASS_NVME: &str = "0x010802";

fn is_pci_address(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

fn basename_of_link(p: &Path) -> Result<String> {
    let real = fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()))?;
    Ok(real.file_name().context("link has no file name")?.to_string_lossy().into_owned())
}

/// Resolves `/dev/nvmeX`, `/dev/nvmeXnY[pZ]`, `nvmeX`, a ugds node (`/dev/ugds_drvN`, `ugds_drvN`:
/// recognised by its sysfs class, see `ugds::device::is_ugds_node`) or a PCI address to the
/// controller's PCI address.
pub fn resolve(target: &str) -> Result<String> {
    if is_pci_address(target) {
        if !Path::new(PCI_DEVICES).join(target).exists() {
            bail!("no PCI device {target}");
        }
        return Ok(target.to_string());
    }
    let name = target.strip_prefix("/dev/").unwrap_or(target);
    let node = if target.starts_with('/') { PathBuf::from(target) } else { Path::new("/dev").join(target) };
    let link = if ugds::device::is_ugds_node(&node) {
        let rdev = fs::metadata(&node)?.rdev();
        PathBuf::from(format!("/sys/dev/char/{}:{}/device", libc::major(rdev), libc::minor(rdev)))
    } else if Path::new(&format!("/sys/class/nvme/{name}")).exists() {
        PathBuf::from(format!("/sys/class/nvme/{name}/device"))
    } else if Path::new(&format!("/sys/class/block/{name}")).exists() {
        // A namespace or partition: walk up to the controller's PCI device.
        let mut p = fs::canonicalize(format!("/sys/class/block/{name}"))?;
        loop {
            if let Some(n) = p.file_name().map(|n| n.to_string_lossy().into_owned()) {
                if is_pci_address(&n) {
                    return Ok(n);
                }
            }
            if !p.pop() {
                bail!("{target} is not on a PCI NVMe controller");
            }
        }
    } else {
        bail!("{target}: no such NVMe controller, namespace or ugds device");
    };
    let addr = basename_of_link(&link).with_context(|| format!("{target} has no PCI device"))?;
    if !is_pci_address(&addr) {
        bail!("{target} resolved to {addr}, not a PCI address");
    }
    Ok(addr)
}

fn pci_path(addr: &str) -> PathBuf {
    Path::new(PCI_DEVICES).join(addr)
}

/// The driver bound to a PCI device, if any.
pub fn driver_of(addr: &str) -> Option<String> {
    basename_of_link(&pci_path(addr).join("driver")).ok()
}

/// Block devices (namespaces and partitions) of the controller at `addr`.
fn block_devices(addr: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in fs::read_dir("/sys/class/block")? {
        let e = e?;
        let real = fs::canonicalize(e.path())?;
        if real.components().any(|c| c.as_os_str() == addr) {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Char devices of the controller (`/dev/nvmeX`).
fn ctrl_devices(addr: &str) -> Vec<String> {
    fs::read_dir(pci_path(addr).join("nvme"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn dev_number(name: &str) -> Option<u64> {
    fs::metadata(format!("/dev/{name}")).ok().map(|m| m.rdev())
}

/// Why the controller at `addr` must not be taken from its users; empty when it is free.
pub fn users(addr: &str) -> Result<Vec<String>> {
    let mut why = Vec::new();
    let blocks = block_devices(addr)?;
    let mut rdevs = BTreeSet::new();
    for b in blocks.iter().chain(ctrl_devices(addr).iter()) {
        if let Some(r) = dev_number(b) {
            rdevs.insert(r);
        }
    }
    let block_rdevs: BTreeSet<u64> = blocks.iter().filter_map(|b| dev_number(b)).collect();
    // Mounted (the root file system included).
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(majmin), Some(mnt)) = (f.get(2), f.get(4)) else {
            continue;
        };
        let Some((ma, mi)) = majmin.split_once(':') else {
            continue;
        };
        let (Ok(ma), Ok(mi)) = (ma.parse::<u64>(), mi.parse::<u64>()) else {
            continue;
        };
        let rdev = libc::makedev(ma as u32, mi as u32);
        if block_rdevs.contains(&rdev) {
            let name = blocks.iter().find(|b| dev_number(b) == Some(rdev)).cloned().unwrap_or_default();
            if *mnt == "/" {
                why.push(format!("/dev/{name} holds the root file system"));
            } else {
                why.push(format!("/dev/{name} is mounted on {mnt}"));
            }
        }
    }
    // Swap.
    for line in fs::read_to_string("/proc/swaps").unwrap_or_default().lines().skip(1) {
        if let Some(dev) = line.split_whitespace().next() {
            if let Ok(m) = fs::metadata(dev) {
                if m.file_type().is_block_device() && block_rdevs.contains(&m.rdev()) {
                    why.push(format!("{dev} is used as swap"));
                }
            }
        }
    }
    // Holders (device mapper, md, ...).
    for b in &blocks {
        if let Ok(d) = fs::read_dir(format!("/sys/class/block/{b}/holders")) {
            for h in d.filter_map(|e| e.ok()) {
                why.push(format!("/dev/{b} is held by {}", h.file_name().to_string_lossy()));
            }
        }
    }
    // Open by a process.
    let me = std::process::id().to_string();
    if let Ok(procs) = fs::read_dir("/proc") {
        for p in procs.filter_map(|e| e.ok()) {
            let pid = p.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|c| c.is_ascii_digit()) || pid == me {
                continue;
            }
            let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
                continue;
            };
            for fd in fds.filter_map(|e| e.ok()) {
                let Ok(m) = fs::metadata(fd.path()) else {
                    continue;
                };
                let ft = m.file_type();
                if (ft.is_block_device() || ft.is_char_device()) && rdevs.contains(&m.rdev()) {
                    let comm = fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                    let target = fs::read_link(fd.path()).map(|t| t.display().to_string()).unwrap_or_default();
                    why.push(format!("{target} is open by pid {pid} ({})", comm.trim()));
                }
            }
        }
    }
    why.dedup();
    Ok(why)
}

fn write_sysfs(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The ugds device nodes of a controller bound to ugds (`ugds_drvN`: its devices of the class
/// `ugds_drv`, which sysfs lists under the PCI device in a directory named after the class).
pub fn ugds_nodes(addr: &str) -> Vec<String> {
    fs::read_dir(pci_path(addr).join(ugds::device::NODE_CLASS))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Binds the controller named by `target` to ugds. Returns its PCI address.
pub fn bind(target: &str) -> Result<String> {
    let addr = resolve(target)?;
    let class = fs::read_to_string(pci_path(&addr).join("class"))?;
    if class.trim() != CLASS_NVME {
        bail!("{addr} is not an NVMe controller (class {})", class.trim());
    }
    if !Path::new("/sys/bus/pci/drivers/ugds").exists() {
        bail!("the ugds module is not loaded: run `cargo xtask install` first");
    }
    match driver_of(&addr).as_deref() {
        Some("ugds") => return Ok(addr),
        Some(_) => {
            let why = users(&addr)?;
            if !why.is_empty() {
                bail!("refusing to take {addr} from its users:\n  {}", why.join("\n  "));
            }
            write_sysfs(&pci_path(&addr).join("driver/unbind"), &addr)?;
        }
        None => {}
    }
    write_sysfs(&pci_path(&addr).join("driver_override"), "ugds")?;
    if let Err(e) = write_sysfs(Path::new("/sys/bus/pci/drivers/ugds/bind"), &addr) {
        // Leave the device bindable by the kernel driver again.
        let _ = write_sysfs(&pci_path(&addr).join("driver_override"), "\n");
        let _ = write_sysfs(Path::new("/sys/bus/pci/drivers_probe"), &addr);
        return Err(e.context(format!("ugds failed to probe {addr}; see the kernel log (dmesg)")));
    }
    if driver_of(&addr).as_deref() != Some("ugds") {
        bail!("{addr} did not bind to ugds; see the kernel log");
    }
    Ok(addr)
}

/// Gives the controller back to the kernel nvme driver (if loaded). Returns its PCI address.
pub fn unbind(target: &str) -> Result<String> {
    let addr = resolve(target)?;
    if driver_of(&addr).as_deref() == Some("ugds") {
        write_sysfs(&pci_path(&addr).join("driver/unbind"), &addr)?;
    }
    write_sysfs(&pci_path(&addr).join("driver_override"), "\n")?;
    write_sysfs(Path::new("/sys/bus/pci/drivers_probe"), &addr)?;
    if Path::new("/sys/bus/pci/drivers/nvme").exists() {
        wait_for("the nvme driver to bind", Duration::from_secs(10), || driver_of(&addr).as_deref() == Some("nvme"))?;
        wait_for("the namespaces to reappear", Duration::from_secs(10), || {
            block_devices(&addr).map(|b| !b.is_empty()).unwrap_or(false)
        })?;
    }
    Ok(addr)
}

/// Every NVMe-class PCI device (whatever drives it), in PCI order.
pub fn nvme_controllers() -> Result<Vec<String>> {
    let mut v: Vec<String> = fs::read_dir(PCI_DEVICES)?
        .filter_map(|e| e.ok())
        .filter(|e| fs::read_to_string(e.path().join("class")).map(|c| c.trim() == CLASS_NVME).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    Ok(v)
}

/// A controller as a multi-controller bind sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// PCI address.
    pub addr: String,
    /// The driver bound now, if any.
    pub driver: Option<String>,
    /// Why it must not be taken ([`users`]); empty when free or already ugds's.
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
        bail!("refusing to bind any of them: {}", describe_refused(&s.refused));
    }
    if s.take.is_empty() {
        if s.refused.is_empty() {
            bail!("no NVMe controllers found");
        }
        bail!("every NVMe controller is in use: {}", describe_refused(&s.refused));
    }
    Ok(s)
}

/// `ADDR: why; why` per refused controller, one per line.
pub fn describe_refused(refused: &[(String, Vec<String>)]) -> String {
    refused.iter().map(|(a, why)| format!("\n  {a}: {}", why.join("; "))).collect()
}

/// Fails, naming both, when two targets are the same controller.
pub fn check_distinct(targets: &[String], addrs: &[String]) -> Result<()> {
    for (i, a) in addrs.iter().enumerate() {
        if let Some(j) = addrs[..i].iter().position(|b| b == a) {
            bail!("{} and {} are the same controller ({a})", targets[j], targets[i]);
        }
    }
    Ok(())
}

/// The volume spec naming `nodes` in order with `chunk` bytes per chunk
/// (`stripe:128K:/dev/ugds_drv0,/dev/ugds_drv1`), checked by the library's own parser.
pub fn volume_spec(chunk: u64, nodes: &[String]) -> Result<String> {
    let s = format!("stripe:{}:{}", ugds::units::human(chunk), nodes.join(","));
    ugds::VolumeSpec::parse(&s).with_context(|| format!("{s} is not a volume"))?;
    Ok(s)
}

/// The `mdadm --build` line that gives the same layout as [`volume_spec`] over the kernel's
/// block devices of the same controllers, in the same order.
pub fn md_build_line(chunk: u64, devs: &[String]) -> String {
    format!("mdadm --build /dev/md0 --level=0 --chunk={} --raid-devices={} {}", chunk >> 10, devs.len(), devs.join(" "))
}

/// A controller bound to ugds by [`bind_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// PCI address.
    pub addr: String,
    /// Its ugds node (`/dev/ugds_drvN`).
    pub node: String,
}

/// The controllers `targets` name (or, with `all`, every NVMe controller), resolved, checked to
/// be NVMe controllers and distinct.
fn targets_to_addrs(targets: &[String], all: bool) -> Result<Vec<String>> {
    if all {
        return nvme_controllers();
    }
    let addrs: Vec<String> = targets.iter().map(|t| resolve(t)).collect::<Result<_>>()?;
    for (t, a) in targets.iter().zip(&addrs) {
        let class = fs::read_to_string(pci_path(a).join("class"))?;
        if class.trim() != CLASS_NVME {
            bail!("{t} ({a}) is not an NVMe controller (class {})", class.trim());
        }
    }
    check_distinct(targets, &addrs)?;
    Ok(addrs)
}

/// Binds several controllers to ugds (see [`select`] for what is refused). Returns the bound
/// ones with their nodes, in order, and the refused ones. When one fails to bind, the ones
/// this call bound are given back before the error returns.
pub fn bind_many(targets: &[String], all: bool) -> Result<(Vec<Bound>, Refused)> {
    if !Path::new("/sys/bus/pci/drivers/ugds").exists() {
        bail!("the ugds module is not loaded: run `cargo xtask install` first");
    }
    let addrs = targets_to_addrs(targets, all)?;
    let mut cands = Vec::with_capacity(addrs.len());
    for a in addrs {
        let driver = driver_of(&a);
        let users = if driver.as_deref() == Some("ugds") { Vec::new() } else { users(&a)? };
        cands.push(Candidate { addr: a, driver, users });
    }
    let sel = select(&cands, all)?;
    let mut done: Vec<Bound> = Vec::with_capacity(sel.take.len());
    let mut ours = Vec::new();
    for a in &sel.take {
        let was_ugds = driver_of(a).as_deref() == Some("ugds");
        let r = bind(a).and_then(|_| {
            let node = ugds_nodes(a).first().map(|n| format!("/dev/{n}"));
            match node {
                Some(n) if ugds::device::is_ugds_node(&n) => Ok(n),
                _ => bail!("{a} is bound to ugds but no /dev/ugds_drvN node appeared; see the kernel log"),
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
                    let _ = unbind(o);
                }
                return Err(e.context(format!("binding {a} (the controllers this call bound are given back)")));
            }
        }
    }
    Ok((done, sel.refused))
}

/// A controller given back to the kernel by [`unbind_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// PCI address.
    pub addr: String,
    /// The driver that has it now, if any.
    pub driver: Option<String>,
    /// Its first namespace's block device (`/dev/nvme0n1`), once the kernel drives it.
    pub disk: Option<String>,
}

/// The block device of namespace 1 of a controller the kernel drives.
pub fn first_namespace(addr: &str) -> Option<String> {
    let blocks = block_devices(addr).ok()?;
    blocks
        .iter()
        .find(|b| fs::read_to_string(format!("/sys/class/block/{b}/nsid")).is_ok_and(|n| n.trim() == "1"))
        .map(|b| format!("/dev/{b}"))
}

/// Gives several controllers back to the kernel (or, with `all`, every one bound to ugds or
/// set to bind to it), in order.
pub fn unbind_many(targets: &[String], all: bool) -> Result<Vec<Released>> {
    let addrs = if all {
        nvme_controllers()?
            .into_iter()
            .filter(|a| {
                driver_of(a).as_deref() == Some("ugds")
                    || fs::read_to_string(pci_path(a).join("driver_override")).is_ok_and(|o| o.trim() == "ugds")
            })
            .collect()
    } else {
        let addrs: Vec<String> = targets.iter().map(|t| resolve(t)).collect::<Result<_>>()?;
        check_distinct(targets, &addrs)?;
        addrs
    };
    if addrs.is_empty() {
        bail!("no controller is bound to ugds");
    }
    let mut out = Vec::with_capacity(addrs.len());
    for a in addrs {
        unbind(&a)?;
        out.push(Released { driver: driver_of(&a), disk: first_namespace(&a), addr: a });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(addr: &str, driver: Option<&str>, users: &[&str]) -> Candidate {
        Candidate {
            addr: addr.into(),
            driver: driver.map(Into::into),
            users: users.iter().map(|u| u.to_string()).collect(),
        }
    }

    #[test]
    fn a_named_list_is_all_or_nothing() {
        let c = [
            cand("0000:00:03.0", Some("nvme"), &[]),
            cand("0000:00:04.0", Some("nvme"), &["/dev/nvme1n1 is mounted on /mnt"]),
            cand("0000:00:05.0", Some("ugds"), &[]),
        ];
        let err = select(&c, false).unwrap_err().to_string();
        assert!(err.contains("0000:00:04.0: /dev/nvme1n1 is mounted on /mnt"), "{err}");
        assert!(!err.contains("0000:00:03.0"), "a free controller named as refused: {err}");
        let s = select(&[c[0].clone(), c[2].clone()], false).unwrap();
        assert_eq!(s.take, ["0000:00:03.0", "0000:00:05.0"]);
        assert!(s.refused.is_empty());
    }

    #[test]
    fn all_takes_the_free_ones_and_names_the_rest() {
        let c = [
            cand("0000:00:03.0", Some("nvme"), &["/dev/nvme0n1p1 holds the root file system"]),
            cand("0000:00:04.0", None, &[]),
            cand("0000:00:05.0", Some("nvme"), &[]),
        ];
        let s = select(&c, true).unwrap();
        assert_eq!(s.take, ["0000:00:04.0", "0000:00:05.0"]);
        assert_eq!(s.refused, [("0000:00:03.0".to_string(), vec!["/dev/nvme0n1p1 holds the root file system".into()])]);
        let err = select(&c[..1], true).unwrap_err().to_string();
        assert!(err.contains("every NVMe controller is in use") && err.contains("root file system"), "{err}");
        assert!(select(&[], true).unwrap_err().to_string().contains("no NVMe controllers"));
    }

    #[test]
    fn the_same_controller_twice_is_named() {
        let t: Vec<String> = ["/dev/nvme0", "/dev/nvme1", "/dev/nvme0n1"].map(Into::into).to_vec();
        let a: Vec<String> = ["0000:00:03.0", "0000:00:04.0", "0000:00:03.0"].map(Into::into).to_vec();
        let err = check_distinct(&t, &a).unwrap_err().to_string();
        assert_eq!(err, "/dev/nvme0 and /dev/nvme0n1 are the same controller (0000:00:03.0)");
        assert!(check_distinct(&t[..2], &a[..2]).is_ok());
    }

    #[test]
    fn volume_spec_and_md_line_name_the_members_in_order() {
        let nodes: Vec<String> = ["/dev/ugds_drv2", "/dev/ugds_drv0"].map(Into::into).to_vec();
        assert_eq!(volume_spec(128 << 10, &nodes).unwrap(), "stripe:128K:/dev/ugds_drv2,/dev/ugds_drv0");
        assert_eq!(volume_spec(1 << 20, &nodes[..1]).unwrap(), "stripe:1M:/dev/ugds_drv2");
        // The library's parser refuses what a volume cannot be.
        assert!(volume_spec(3000, &nodes).is_err());
        assert!(volume_spec(128 << 10, &[]).is_err());
        let devs: Vec<String> = ["/dev/nvme1n1", "/dev/nvme0n1"].map(Into::into).to_vec();
        assert_eq!(
            md_build_line(128 << 10, &devs),
            "mdadm --build /dev/md0 --level=0 --chunk=128 --raid-devices=2 /dev/nvme1n1 /dev/nvme0n1"
        );
    }
}
