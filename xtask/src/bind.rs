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
