//! The stand-in GPU for peer-to-peer tests: an emulated device with a large memory BAR whose
//! contents the host can read (QEMU's `ivshmem-plain` over a shared memory-backend file), placed
//! behind one emulated PCIe switch together with the first NVMe controller, or on the root
//! complex. The guest's kernel decides from that topology whether the SSD may DMA into the BAR
//! (q35's host bridge is not on its peer-to-peer whitelist; a switch is).

use anyhow::Result;
use std::path::{Path, PathBuf};

/// Where the stand-in GPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// Behind one PCIe switch (`x3130-upstream` + two `xio3130-downstream` ports), the first
    /// NVMe controller under the other downstream port.
    Switch,
    /// Both on the root complex.
    Root,
}

impl Topology {
    /// Its name in variant listings.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Switch => "switch",
            Topology::Root => "root",
        }
    }
}

/// A peer-to-peer set-up: where the stand-in GPU sits and what CPU the guest sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2p {
    /// Where the stand-in GPU sits.
    pub topology: Topology,
    /// Model an AMD Zen CPU (QEMU's `EPYC`): Linux allows peer-to-peer through the host bridge
    /// of any Zen or newer CPU, while q35's host bridge is on no whitelist. Without it, traffic
    /// that must cross the host bridge (the root complex, or a switch whose ports redirect it
    /// with ACS) is refused.
    pub zen_cpu: bool,
    /// The guest IOMMU in passthrough (`iommu.passthrough=1`): kernel drivers' DMA is not
    /// translated (vfio-pci still gets a domain of its own). QEMU translates every DMA of a
    /// device behind its IOMMU, so bus addresses the kernel routes through a switch reach the
    /// BAR only this way.
    pub passthrough: bool,
}

impl P2p {
    /// Parses a variant listing's field: `switch` or `root`, then `+zen` and `+pt` in any
    /// order, or `-` for none.
    pub fn parse_listed(s: &str) -> Result<Option<P2p>> {
        if s.is_empty() || s == "-" {
            return Ok(None);
        }
        let mut parts = s.split('+');
        let topology = match parts.next() {
            Some("switch") => Topology::Switch,
            Some("root") => Topology::Root,
            other => anyhow::bail!("unknown peer-to-peer topology {other:?} (switch, root)"),
        };
        let mut p = P2p { topology, zen_cpu: false, passthrough: false };
        for flag in parts {
            match flag {
                "zen" => p.zen_cpu = true,
                "pt" => p.passthrough = true,
                other => anyhow::bail!("unknown peer-to-peer option {other:?} (zen, pt)"),
            }
        }
        Ok(Some(p))
    }

    /// The name the guest's tests read (`UGDS_P2P_TOPOLOGY`).
    pub fn name(self) -> String {
        format!(
            "{}{}{}",
            self.topology.name(),
            if self.zen_cpu { "+zen" } else { "" },
            if self.passthrough { "+pt" } else { "" }
        )
    }
}

/// Size of the stand-in GPU's memory BAR: room for a 64 MiB transfer at an odd offset.
pub const BAR_BYTES: u64 = 128 << 20;

/// The QEMU devices of a topology, and where the first NVMe controller goes.
pub struct Devices {
    /// Arguments to add before the NVMe controllers.
    pub args: Vec<String>,
    /// `bus=` of the first NVMe controllers (behind the switch, beside the stand-in GPU); the
    /// others, and all of them on the root complex, sit on the root complex.
    pub nvme_buses: Vec<&'static str>,
}

/// The devices for `topology`, with the BAR's backing file in `dir` (which the guest sees at the
/// same path, read-only).
pub fn devices(topology: Topology, dir: &Path) -> Devices {
    let mut args: Vec<String> = Vec::new();
    let mut dev = |s: String| args.extend(["-device".to_string(), s]);
    let (gpu_bus, nvme_buses) = match topology {
        Topology::Switch => {
            dev("pcie-root-port,id=p2p_rp,bus=pcie.0,chassis=10,slot=10".into());
            dev("x3130-upstream,id=p2p_up,bus=p2p_rp".into());
            // Port 2 holds the stand-in GPU; 1, 3 and 4 the first three controllers (the
            // benchmark's kernel baseline needs two more beside ugds's).
            for n in 1..=4 {
                dev(format!("xio3130-downstream,id=p2p_dn{n},bus=p2p_up,chassis={},slot={n}", 10 + n));
            }
            (",bus=p2p_dn2", vec!["p2p_dn1", "p2p_dn3", "p2p_dn4"])
        }
        Topology::Root => ("", Vec::new()),
    };
    dev(format!("ivshmem-plain,id=p2p_gpu,memdev=p2p_mem{gpu_bus}"));
    args.extend([
        "-object".to_string(),
        format!("memory-backend-file,id=p2p_mem,share=on,mem-path={},size={BAR_BYTES}", bar_file(dir).display()),
    ]);
    Devices { args, nvme_buses }
}

/// The BAR's backing file for a VM whose scratch folder is `dir`.
pub fn bar_file(dir: &Path) -> PathBuf {
    dir.join("p2p-bar.mem")
}

/// Environment for the guest's tests: the topology and the BAR's backing file.
pub fn guest_env(p2p: P2p, bar_file: &Path) -> Vec<(String, String)> {
    vec![
        ("UGDS_P2P_TOPOLOGY".into(), p2p.name()),
        ("UGDS_P2P_BAR_FILE".into(), bar_file.display().to_string()),
        ("UGDS_P2P_BAR_BYTES".into(), BAR_BYTES.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_holds_both_devices_and_the_root_neither() {
        let d = devices(Topology::Switch, Path::new("/tmp/x"));
        let all = d.args.join(" ");
        assert!(all.contains("ivshmem-plain,id=p2p_gpu,memdev=p2p_mem,bus=p2p_dn2"), "{all}");
        assert_eq!(d.nvme_buses, ["p2p_dn1", "p2p_dn3", "p2p_dn4"]);
        assert!(all.contains("mem-path=/tmp/x/p2p-bar.mem"), "{all}");
        let d = devices(Topology::Root, Path::new("/tmp/x"));
        assert!(!d.args.join(" ").contains("bus="), "{:?}", d.args);
        assert!(d.nvme_buses.is_empty());
        assert_eq!(P2p::parse_listed("-").unwrap(), None);
        let p = |topology, zen_cpu, passthrough| Some(P2p { topology, zen_cpu, passthrough });
        assert_eq!(P2p::parse_listed("root").unwrap(), p(Topology::Root, false, false));
        assert_eq!(P2p::parse_listed("switch+zen").unwrap(), p(Topology::Switch, true, false));
        assert_eq!(P2p::parse_listed("switch+pt+zen").unwrap(), p(Topology::Switch, true, true));
        assert_eq!(p(Topology::Switch, true, true).unwrap().name(), "switch+zen+pt");
        assert!(P2p::parse_listed("bridge").is_err());
        assert!(P2p::parse_listed("root+amd").is_err());
    }
}
