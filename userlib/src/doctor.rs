//! `ugds doctor`: what decides, on this machine, which path I/O takes — each finding with a
//! plain verdict and the fix. Reads /proc and /sys only (and asks the GPU driver, if present;
//! [`p2p::PEER_ENV`] names more peer-to-peer peers).

#[cfg(feature = "cuda")]
use crate::gpu::cuda::{self, Cuda};
#[cfg(feature = "cuda")]
use crate::gpu::Runtime;
use std::path::Path;

pub mod kernel;
pub mod p2p;

/// How a finding bears on the direct path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Fine for the direct path.
    Ok,
    /// Works, with a caveat.
    Warn,
    /// Rules the direct (or peer-to-peer) path out; the fallback path will be used.
    No,
    /// Information only.
    Info,
}

/// One finding.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What was checked.
    pub topic: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when nothing).
    pub fix: String,
    /// The predicted peer-to-peer route of a [`p2p::TOPIC`] finding (`None` for the others).
    pub p2p: Option<p2p::P2pCheck>,
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn finding(topic: &'static str, verdict: Verdict, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { topic, verdict, detail: detail.into(), fix: fix.into(), p2p: None }
}

/// A PCI function from /sys/bus/pci/devices.
#[derive(Debug, Clone)]
struct PciFn {
    addr: String,
    class: u32,
    vendor: u16,
    driver: Option<String>,
}

fn pci_functions() -> Vec<PciFn> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/sys/bus/pci/devices") else { return v };
    for e in rd.flatten() {
        let p = e.path();
        let hex = |f: &str| read(p.join(f)).and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        let driver = std::fs::read_link(p.join("driver"))
            .ok()
            .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
        v.push(PciFn {
            addr: e.file_name().to_string_lossy().into_owned(),
            class: hex("class").unwrap_or(0),
            vendor: hex("vendor").unwrap_or(0) as u16,
            driver,
        });
    }
    v.sort_by(|a, b| a.addr.cmp(&b.addr));
    v
}

/// BAR sizes of a function, from its `resource` file.
fn bar_sizes(addr: &str) -> Vec<u64> {
    let Some(s) = read(format!("/sys/bus/pci/devices/{addr}/resource")) else { return Vec::new() };
    s.lines()
        .take(6)
        .map(|l| {
            let f: Vec<u64> =
                l.split_whitespace().filter_map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok()).collect();
            if f.len() >= 2 && f[1] > f[0] {
                f[1] - f[0] + 1
            } else {
                0
            }
        })
        .collect()
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n => format!("{} KiB", n >> 10),
    }
}

/// Runs every check.
pub fn diagnose() -> Vec<Finding> {
    let mut out = Vec::new();
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    out.push(finding("kernel", Verdict::Info, format!("Linux {release}"), ""));

    // /proc/config.gz would need a decompressor; the symbol table is a good enough witness.
    let config = read(format!("/boot/config-{release}"));
    let rust_syms = read("/proc/kallsyms").map(|s| s.contains("rust_begin_unwind") || s.contains("rust_helper_"));
    match (config.as_ref().map(|c| c.contains("CONFIG_RUST=y")), rust_syms) {
        (Some(true), _) | (_, Some(true)) => {
            out.push(finding("CONFIG_RUST", Verdict::Ok, "the kernel has Rust support", ""))
        }
        (Some(false), _) => out.push(finding(
            "CONFIG_RUST",
            Verdict::No,
            "the kernel was built without Rust support: ugds.ko cannot load",
            "use a kernel with CONFIG_RUST=y (6.12+), e.g. the test kernel `cargo xtask kernel` builds",
        )),
        _ => out.push(finding(
            "CONFIG_RUST",
            Verdict::Warn,
            "cannot tell (no /boot/config, /proc/kallsyms hidden)",
            "check the kernel config for CONFIG_RUST=y",
        )),
    }

    let modules_disabled = read("/proc/sys/kernel/modules_disabled").as_deref() == Some("1");
    let loaded = Path::new("/sys/module/ugds").exists();
    out.push(match (loaded, modules_disabled) {
        (true, _) => finding("module", Verdict::Ok, "ugds.ko is loaded", ""),
        (false, true) => finding(
            "module",
            Verdict::No,
            "ugds.ko is not loaded and this kernel refuses to load modules (modules_disabled=1)",
            "no direct path on this machine; the fallback path (io_uring) serves files and block devices",
        ),
        (false, false) => finding(
            "module",
            Verdict::No,
            "ugds.ko is not loaded",
            "modprobe ugds (installed by cargo xtask install), then ugds bind <pci-address>",
        ),
    });
    out.extend(kernel::findings(Path::new("/")));

    let pci = pci_functions();
    let nvme: Vec<&PciFn> = pci.iter().filter(|f| f.class >> 8 == 0x0108).collect();
    let bound: Vec<&&PciFn> = nvme.iter().filter(|f| f.driver.as_deref() == Some("ugds")).collect();
    if nvme.is_empty() {
        out.push(finding(
            "NVMe",
            Verdict::No,
            "no NVMe controller on this machine",
            "the fallback path serves files on whatever storage there is",
        ));
    } else {
        let list: Vec<String> = nvme
            .iter()
            .map(|f| format!("{} ({})", f.addr, f.driver.clone().unwrap_or_else(|| "no driver".into())))
            .collect();
        let v = if bound.is_empty() { Verdict::Warn } else { Verdict::Ok };
        let fix = if bound.is_empty() { "bind a dedicated SSD: ugds bind <pci-address>" } else { "" };
        let mut nodes: Vec<String> = std::fs::read_dir(format!("/sys/class/{}", crate::device::NODE_CLASS))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| format!("/dev/{}", e.file_name().to_string_lossy())).collect())
            .unwrap_or_default();
        nodes.sort();
        let nodes = if nodes.is_empty() { String::new() } else { format!(" ({})", nodes.join(" ")) };
        out.push(finding(
            "NVMe",
            v,
            format!("{} controller(s): {}; {} bound to ugds{nodes}", nvme.len(), list.join(", "), bound.len()),
            fix,
        ));
    }

    let groups = std::fs::read_dir("/sys/kernel/iommu_groups").map(|d| d.count()).unwrap_or(0);
    let cmdline = read("/proc/cmdline").unwrap_or_default();
    let passthrough = cmdline.split_whitespace().any(|w| w == "iommu=pt" || w == "iommu.passthrough=1");
    out.push(match (groups, passthrough) {
        (0, _) => finding(
            "IOMMU",
            Verdict::Warn,
            "no IOMMU in use: the SSD can DMA anywhere; /dev/ugds_drvN is root-only for that reason",
            "enable the IOMMU (intel_iommu=on / amd_iommu=on) to confine the SSD's DMA",
        ),
        (_, true) => finding(
            "IOMMU",
            Verdict::Ok,
            format!("{groups} IOMMU groups, passthrough mode (fast, unconfined for identity-mapped devices)"),
            "",
        ),
        (_, false) => finding(
            "IOMMU",
            Verdict::Ok,
            format!("{groups} IOMMU groups, translated DMA: the SSD reaches only registered memory"),
            "peer-to-peer through the IOMMU needs ACS/ATS support on the path; if P2P reads return zeroes, try iommu=pt",
        ),
    });

    let gpus: Vec<&PciFn> =
        pci.iter().filter(|f| f.class >> 16 == 0x03 && (f.vendor == 0x10de || f.vendor == 0x1002)).collect();
    if gpus.is_empty() {
        out.push(finding(
            "GPU",
            Verdict::Info,
            "no NVIDIA or AMD GPU on the PCI bus",
            "host memory takes the direct path; no GPU memory to register",
        ));
    }
    for g in &gpus {
        let bars = bar_sizes(&g.addr);
        let largest = bars.iter().copied().max().unwrap_or(0);
        let v = if largest >= 1 << 33 { Verdict::Ok } else { Verdict::Warn };
        let fix = if v == Verdict::Ok {
            ""
        } else {
            "enable Resizable BAR / Above 4G decoding in the firmware so all GPU memory is reachable by peers"
        };
        out.push(finding(
            "GPU BARs",
            v,
            format!(
                "{} ({}): BARs {}",
                g.addr,
                g.driver.clone().unwrap_or_else(|| "no driver".into()),
                bars.iter().filter(|&&b| b > 0).map(|&b| human(b)).collect::<Vec<_>>().join(", ")
            ),
            fix,
        ));
        let topo = crate::placement::Topology::default();
        for n in &nvme {
            if let Ok(p) = topo.placement(&g.addr, &n.addr) {
                out.push(placement_finding(&p));
            }
        }
    }

    out.extend(p2p::findings(&crate::sysfs::Host::system(), std::env::var(p2p::PEER_ENV).ok().as_deref()));

    if let Some(v) = read("/proc/driver/nvidia/version") {
        let first = v.lines().next().unwrap_or("").to_string();
        if v.contains("Open Kernel Module") {
            out.push(finding("NVIDIA driver", Verdict::Ok, format!("open kernel modules: {first}"), ""));
        } else {
            out.push(finding(
                "NVIDIA driver",
                Verdict::No,
                format!("proprietary kernel module: {first}"),
                "install the open kernel modules (nvidia-open): only they export GPU memory as dma-buf",
            ));
        }
    } else if !gpus.is_empty() {
        out.push(finding(
            "NVIDIA driver",
            Verdict::Warn,
            "/proc/driver/nvidia/version is not readable (containers hide it)",
            "",
        ));
    }
    #[cfg(not(feature = "cuda"))]
    out.push(finding("CUDA", Verdict::Info, "this build of ugds has no CUDA backend (feature `cuda`)", ""));
    #[cfg(feature = "cuda")]
    if cuda::driver_present() {
        match Cuda::new(0) {
            Ok(c) => {
                let ver = Cuda::driver_version().unwrap_or(0);
                let name = c.device_name();
                let bus = c.pci_bus_id().unwrap_or_default();
                match c.dmabuf_support() {
                    Ok(()) => out.push(finding(
                        "CUDA dma-buf",
                        Verdict::Ok,
                        format!(
                            "{name} ({bus}), driver API {}.{}: dma-buf export supported",
                            ver / 1000,
                            ver % 1000 / 10
                        ),
                        "",
                    )),
                    Err(why) => out.push(finding(
                        "CUDA dma-buf",
                        Verdict::No,
                        format!("{name} ({bus}): {why}"),
                        "use the open kernel modules; until then GPU memory takes the fallback path",
                    )),
                }
            }
            Err(e) => {
                out.push(finding("CUDA", Verdict::No, format!("the driver library loads but: {e}"), "check nvidia-smi"))
            }
        }
    } else {
        out.push(finding("CUDA", Verdict::Info, "libcuda.so is not installed", ""));
    }
    out
}

/// A GPU-SSD pair's placement as a finding.
fn placement_finding(p: &crate::placement::Placement) -> Finding {
    use crate::placement::Proximity;
    let numa = |n: Option<u32>| n.map_or("?".to_string(), |n| n.to_string());
    let detail = format!(
        "GPU {} (NUMA {}) and SSD {} (NUMA {}): {}",
        p.gpu,
        numa(p.gpu_numa),
        p.ssd,
        numa(p.ssd_numa),
        p.proximity.describe()
    );
    let (verdict, fix) = match p.proximity {
        Proximity::SameSwitch => (Verdict::Ok, ""),
        Proximity::SameRootComplex | Proximity::SameNumaNode => {
            (Verdict::Warn, "a slot behind the same PCIe switch as the GPU gives the best peer-to-peer bandwidth")
        }
        Proximity::CrossSocket => (
            Verdict::Warn,
            "use SSDs on the GPU's NUMA node for its volumes (peer-to-peer across sockets is slow or refused)",
        ),
    };
    finding("placement", verdict, detail, fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_negative_finding_says_what_to_do() {
        let f = diagnose();
        assert!(f.iter().any(|x| x.topic == "kernel"));
        assert!(f.iter().any(|x| x.topic == "module"));
        for x in &f {
            if x.verdict == Verdict::No {
                assert!(!x.fix.is_empty(), "{x:?}");
            }
        }
    }
}
