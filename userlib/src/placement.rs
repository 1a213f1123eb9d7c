//! Placement: where each SSD sits relative to each GPU in the PCIe tree and across NUMA nodes,
//! read from sysfs. Peer-to-peer DMA between devices behind one PCIe switch stays below the
//! CPU; through a root complex it costs the CPU's root ports; across sockets it crosses the
//! inter-socket link (UPI / Infinity Fabric), which is slow or refused for P2P on many
//! platforms. A volume meant for one GPU should have every member on that GPU's side.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// PCI class of an NVMe controller.
const CLASS_NVME: u32 = 0x010802;
/// PCI base classes of GPUs (display controllers) and 3D/processing accelerators.
const CLASS_DISPLAY: u32 = 0x03;
const CLASS_PROCESSING_ACCEL: u32 = 0x12;

/// How close an SSD is to a GPU, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proximity {
    /// Behind the same PCIe switch: peer-to-peer stays below the CPU.
    SameSwitch,
    /// Under the same host bridge (root complex), different root ports: P2P goes through the
    /// CPU's root complex.
    SameRootComplex,
    /// Different host bridges on the same NUMA node (or NUMA unknown).
    SameNumaNode,
    /// Different NUMA nodes: P2P crosses the inter-socket link.
    CrossSocket,
}

impl Proximity {
    /// A short phrase for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Proximity::SameSwitch => "behind the same PCIe switch",
            Proximity::SameRootComplex => "under the same root complex (through the CPU's root ports)",
            Proximity::SameNumaNode => "on the same NUMA node, under different host bridges",
            Proximity::CrossSocket => "on another NUMA node (peer-to-peer crosses the inter-socket link)",
        }
    }
}

/// One GPU-SSD pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The GPU's PCI address.
    pub gpu: String,
    /// The SSD controller's PCI address.
    pub ssd: String,
    /// How close they are.
    pub proximity: Proximity,
    /// The GPU's NUMA node (None where the platform reports none).
    pub gpu_numa: Option<u32>,
    /// The SSD's NUMA node.
    pub ssd_numa: Option<u32>,
}

impl Placement {
    /// A warning when the pair should not serve each other's peer-to-peer I/O.
    pub fn warning(&self) -> Option<String> {
        (self.proximity == Proximity::CrossSocket).then(|| {
            format!(
                "SSD {} is on NUMA node {} and GPU {} on node {}: peer-to-peer between them crosses the \
                 inter-socket link; use an SSD on the GPU's node",
                self.ssd,
                self.ssd_numa.map_or("?".into(), |n| n.to_string()),
                self.gpu,
                self.gpu_numa.map_or("?".into(), |n| n.to_string())
            )
        })
    }
}

/// The PCI tree as sysfs shows it (the real root, or a copy for tests).
#[derive(Debug, Clone)]
pub struct Topology {
    sys: PathBuf,
}

impl Default for Topology {
    fn default() -> Self {
        Topology { sys: PathBuf::from("/sys") }
    }
}

impl Topology {
    /// The topology under another sysfs root (tests).
    pub fn at(sys: impl Into<PathBuf>) -> Topology {
        Topology { sys: sys.into() }
    }

    fn devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }

    fn class(&self, addr: &str) -> Option<u32> {
        let s = std::fs::read_to_string(self.devices().join(addr).join("class")).ok()?;
        u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
    }

    fn functions_of(&self, want: impl Fn(u32) -> bool) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.devices()) else { return Vec::new() };
        let mut v: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|a| self.class(a).is_some_and(&want))
            .collect();
        v.sort();
        v
    }

    /// PCI addresses of the GPUs (display controllers and processing accelerators).
    pub fn gpus(&self) -> Vec<String> {
        self.functions_of(|c| matches!(c >> 16, CLASS_DISPLAY | CLASS_PROCESSING_ACCEL))
    }

    /// PCI addresses of the NVMe controllers.
    pub fn ssds(&self) -> Vec<String> {
        self.functions_of(|c| c == CLASS_NVME)
    }

    /// The NUMA node of a function (sysfs says -1 when the platform does not tell).
    fn numa(&self, addr: &str) -> Option<u32> {
        std::fs::read_to_string(self.devices().join(addr).join("numa_node")).ok()?.trim().parse().ok()
    }

    /// The chain of PCI names from the host bridge down to the function.
    fn chain(&self, addr: &str) -> Result<Vec<String>> {
        let p = std::fs::canonicalize(self.devices().join(addr))
            .map_err(|e| Error::Open { path: self.devices().join(addr).display().to_string(), source: e })?;
        Ok(p.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .skip_while(|c| !c.starts_with("pci"))
            .collect())
    }

    /// Where `ssd` sits relative to `gpu` (both PCI addresses).
    pub fn placement(&self, gpu: &str, ssd: &str) -> Result<Placement> {
        let (a, b) = (self.chain(gpu)?, self.chain(ssd)?);
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let (gpu_numa, ssd_numa) = (self.numa(gpu), self.numa(ssd));
        // chain[0] is the host bridge (pciDDDD:BB), chain[1] the root port, then switch ports.
        let proximity = match common {
            0 if gpu_numa.is_some() && ssd_numa.is_some() && gpu_numa != ssd_numa => Proximity::CrossSocket,
            0 => Proximity::SameNumaNode,
            1 => Proximity::SameRootComplex,
            _ => Proximity::SameSwitch,
        };
        Ok(Placement { gpu: gpu.to_string(), ssd: ssd.to_string(), proximity, gpu_numa, ssd_numa })
    }

    /// Every GPU against every NVMe controller, each GPU's SSDs nearest first.
    pub fn all(&self) -> Vec<Placement> {
        let ssds = self.ssds();
        let mut v = Vec::new();
        for g in self.gpus() {
            let mut row: Vec<Placement> = ssds.iter().filter_map(|s| self.placement(&g, s).ok()).collect();
            row.sort_by_key(|p| p.proximity);
            v.extend(row);
        }
        v
    }

    /// The PCI address of the controller behind a ugds node (through its character device).
    pub fn pci_of_node(&self, node: &str) -> Result<String> {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(node).map_err(|e| Error::Open { path: node.to_string(), source: e })?.rdev();
        let link = self.sys.join(format!("dev/char/{}:{}/device", libc::major(rdev), libc::minor(rdev)));
        let real =
            std::fs::canonicalize(&link).map_err(|e| Error::Open { path: link.display().to_string(), source: e })?;
        real.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::invalid("node", format!("{node} has no PCI device")))
    }

    /// The SSD controllers `ssds` (PCI addresses) against `gpu`, nearest first; SSDs equally
    /// near keep their order (a volume's member order).
    pub fn nearest_pci(&self, gpu: &str, ssds: &[String]) -> Result<Vec<Placement>> {
        let mut v = ssds.iter().map(|s| self.placement(gpu, s)).collect::<Result<Vec<_>>>()?;
        v.sort_by_key(|p| p.proximity);
        Ok(v)
    }

    /// The ugds nodes `nodes` (a volume's members, or [`Topology::bound_nodes`]) against `gpu`,
    /// nearest first, each with its placement.
    pub fn nearest(&self, gpu: &str, nodes: &[String]) -> Result<Vec<(String, Placement)>> {
        let mut v = nodes
            .iter()
            .map(|n| Ok((n.clone(), self.placement(gpu, &self.pci_of_node(n)?)?)))
            .collect::<Result<Vec<_>>>()?;
        v.sort_by_key(|(_, p)| p.proximity);
        Ok(v)
    }

    /// The controllers bound to ugds here, as their nodes (`/dev/<name>` for each entry of the
    /// sysfs class `ugds_drv`), in name order.
    pub fn bound_nodes(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.sys.join("class/ugds_drv")) else { return Vec::new() };
        let mut v: Vec<String> = rd.flatten().map(|e| format!("/dev/{}", e.file_name().to_string_lossy())).collect();
        v.sort();
        v
    }

    /// The ugds nodes a target names: a ugds node itself; a striped volume's members (its spec
    /// `stripe:[CHUNK:]NODE,...`, or a descriptor file `NAME.ugds-volume`); with no target,
    /// every controller bound to ugds here ([`Topology::bound_nodes`]).
    pub fn target_nodes(&self, target: Option<&str>) -> Result<Vec<String>> {
        let Some(t) = target else { return Ok(self.bound_nodes()) };
        match crate::storage::Target::resolve(t, t, 1)?.nodes(t) {
            // Not a node or volume: the spec's parser says what is wrong with it.
            nodes if nodes.is_empty() => Ok(crate::VolumeSpec::parse(t)?.members),
            nodes => Ok(nodes),
        }
    }

    /// The placement of each member (ugds nodes) of a volume meant to serve `gpu`.
    pub fn for_volume(&self, gpu: &str, members: &[String]) -> Result<Vec<Placement>> {
        members.iter().map(|m| self.placement(gpu, &self.pci_of_node(m)?)).collect()
    }
}

/// The PCI address of the calling thread's GPU: the device of its current CUDA context (what
/// `cudaSetDevice` made current on this thread), device 0 when it has none.
pub fn thread_gpu() -> Result<String> {
    #[cfg(feature = "cuda")]
    return crate::gpu::cuda::current_runtime()?.0.pci_bus_id();
    #[cfg(not(feature = "cuda"))]
    Err(Error::Unsupported {
        what: "the calling thread's GPU",
        why: "this build of ugds has no CUDA backend".into(),
        fix: "build the ugds crate with its `cuda` feature (on by default), or name the GPU",
    })
}

/// The PCI address of CUDA device `ordinal` (CUDA's numbering, as `cudaSetDevice` and
/// PyTorch's `cuda:N` take it, which need not be PCI order).
pub fn cuda_gpu(ordinal: i32) -> Result<String> {
    #[cfg(feature = "cuda")]
    return crate::gpu::cuda::device_runtime(ordinal)?.0.pci_bus_id();
    #[cfg(not(feature = "cuda"))]
    Err(Error::Unsupported {
        what: "CUDA devices",
        why: format!("this build of ugds has no CUDA backend (asked for device {ordinal})"),
        fix: "build the ugds crate with its `cuda` feature (on by default), or name the GPU by PCI address",
    })
}

/// Resolves a GPU named by PCI address or by index into [`Topology::gpus`].
pub fn resolve_gpu(topo: &Topology, name: &str) -> Result<String> {
    let gpus = topo.gpus();
    if let Ok(i) = name.parse::<usize>() {
        return gpus.get(i).cloned().ok_or_else(|| {
            Error::invalid("gpu", format!("GPU index {i}, but this machine has {} GPU(s) on PCI", gpus.len()))
        });
    }
    if Path::new(&topo.devices()).join(name).exists() {
        return Ok(name.to_string());
    }
    Err(Error::invalid("gpu", format!("{name} is neither a GPU index nor a PCI address on this machine")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs: two sockets; socket 0 has a switch with a GPU and an SSD below it and an
    /// SSD on another root port; socket 1 has an SSD.
    fn fake_sys() -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("ugds-topo-{}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&root);
        let fns: &[(&str, &str, &str, i32)] = &[
            ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0x030200", "gpu", 0),
            ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", "0x010802", "near", 0),
            ("pci0000:00/0000:00:02.0/0000:05:00.0", "0x010802", "root", 0),
            ("pci0000:40/0000:40:01.0/0000:41:00.0", "0x010802", "far", 1),
        ];
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        for (path, class, _, numa) in fns {
            let dir = root.join("devices").join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
            let addr = path.rsplit('/').next().unwrap();
            symlink(&dir, root.join("bus/pci/devices").join(addr)).unwrap();
        }
        root
    }

    #[test]
    fn proximity_from_the_pci_tree_and_numa() {
        let root = fake_sys();
        let t = Topology::at(&root);
        assert_eq!(t.gpus(), vec!["0000:03:00.0"]);
        assert_eq!(t.ssds(), vec!["0000:04:00.0", "0000:05:00.0", "0000:41:00.0"]);
        let p = |s| t.placement("0000:03:00.0", s).unwrap();
        assert_eq!(p("0000:04:00.0").proximity, Proximity::SameSwitch);
        assert_eq!(p("0000:05:00.0").proximity, Proximity::SameRootComplex);
        let far = p("0000:41:00.0");
        assert_eq!((far.proximity, far.gpu_numa, far.ssd_numa), (Proximity::CrossSocket, Some(0), Some(1)));
        assert!(far.warning().unwrap().contains("inter-socket"));
        assert!(p("0000:04:00.0").warning().is_none());
        // Nearest first.
        let all: Vec<_> = t.all().into_iter().map(|p| p.proximity).collect();
        assert_eq!(all, vec![Proximity::SameSwitch, Proximity::SameRootComplex, Proximity::CrossSocket]);
        // Unknown NUMA (-1) on one side: not called cross-socket.
        std::fs::write(root.join("bus/pci/devices/0000:41:00.0/numa_node"), "-1\n").unwrap();
        assert_eq!(p("0000:41:00.0").proximity, Proximity::SameNumaNode);
        assert_eq!(resolve_gpu(&t, "0").unwrap(), "0000:03:00.0");
        assert!(matches!(resolve_gpu(&t, "3"), Err(Error::InvalidArgument { arg: "gpu", .. })));
        assert!(matches!(resolve_gpu(&t, "0000:99:00.0"), Err(Error::InvalidArgument { arg: "gpu", .. })));
        assert!(matches!(t.placement("0000:03:00.0", "0000:99:00.0"), Err(Error::Open { .. })));
        // Nearest first, whatever order the members come in; ties keep the given order.
        let order = |v: &[&str]| -> Vec<String> {
            let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            t.nearest_pci("0000:03:00.0", &v).unwrap().into_iter().map(|p| p.ssd).collect()
        };
        assert_eq!(
            order(&["0000:41:00.0", "0000:05:00.0", "0000:04:00.0"]),
            ["0000:04:00.0", "0000:05:00.0", "0000:41:00.0"]
        );
        assert_eq!(order(&["0000:05:00.0", "0000:04:00.0"]), ["0000:04:00.0", "0000:05:00.0"]);
        std::fs::create_dir_all(root.join("class/ugds_drv/ugds_drv1")).unwrap();
        std::fs::create_dir_all(root.join("class/ugds_drv/ugds_drv0")).unwrap();
        assert_eq!(t.bound_nodes(), ["/dev/ugds_drv0", "/dev/ugds_drv1"]);
        assert_eq!(t.target_nodes(None).unwrap(), ["/dev/ugds_drv0", "/dev/ugds_drv1"]);
        // A volume's members, nearest first: /dev/null (1:3) and /dev/zero (1:5) stand in for
        // nodes, their sysfs links naming the far and the near SSD.
        for (dev, ssd) in [("1:3", "0000:41:00.0"), ("1:5", "0000:04:00.0")] {
            std::fs::create_dir_all(root.join("dev/char").join(dev)).unwrap();
            symlink(root.join("bus/pci/devices").join(ssd), root.join("dev/char").join(dev).join("device")).unwrap();
        }
        let nodes = t.target_nodes(Some("stripe:/dev/null,/dev/zero")).unwrap();
        assert_eq!(nodes, ["/dev/null", "/dev/zero"]);
        let near: Vec<_> = t.nearest("0000:03:00.0", &nodes).unwrap().into_iter().map(|(n, p)| (n, p.ssd)).collect();
        assert_eq!(
            near,
            [("/dev/zero".to_string(), "0000:04:00.0".to_string()), ("/dev/null".into(), "0000:41:00.0".into())]
        );
        assert!(matches!(t.target_nodes(Some("/nonexistent")), Err(Error::InvalidArgument { arg: "volume", .. })));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
