//! The peer-to-peer side of `ugds doctor`: for each controller bound to ugds and each GPU
//! (PCI class 0x0300 or 0x0302) or device named in [`PEER_ENV`], the route the kernel would give
//! their DMA ([`crate::sysfs::Host::p2p_route`]). Informational: a refused route sends GPU I/O
//! to the fallback path, it does not stop the direct path for host memory.

use super::{finding, Finding, Verdict};
use crate::sysfs::{Host, P2pRoute};

/// The environment variable naming more peers, comma separated PCI addresses (the VM suite
/// names an emulated device there).
pub const PEER_ENV: &str = "UGDS_P2P_PEER";

/// The topic of these findings.
pub const TOPIC: &str = "p2p route";

/// A predicted route: the structured part of a [`TOPIC`] finding, for `ugds doctor --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pCheck {
    /// The controller bound to ugds (PCI address).
    pub controller: String,
    /// The peer: a GPU or a device with memory to DMA into (PCI address).
    pub peer: String,
    /// What the kernel would do.
    pub route: P2pRoute,
}

/// What to do about a route (empty when nothing).
fn fix_for(route: &P2pRoute) -> String {
    match route {
        P2pRoute::AcsRedirect { bridges, common, host } => {
            let why = if host.whitelisted {
                "for the direct route, which needs no IOMMU mapping"
            } else {
                "so the kernel allows it"
            };
            format!(
                "boot with pci=disable_acs_redir={} {why} (below {common}; ACS then no longer keeps those devices' \
                 requests apart)",
                bridges.join(";")
            )
        }
        P2pRoute::HostBridge { host } if !host.whitelisted => "put the SSD behind the same PCIe switch as the peer: \
                                                               until then the kernel refuses the attachment and GPU \
                                                               I/O takes the fallback path"
            .into(),
        P2pRoute::Unknown { .. } => "run ugds doctor as root (sysfs gives the full config space to root only)".into(),
        _ => String::new(),
    }
}

/// The peers: the GPUs of `host`, then the addresses in `named` (as [`PEER_ENV`] holds them),
/// each once.
fn peers(host: &Host, named: Option<&str>) -> Vec<String> {
    let mut v = host.display_functions();
    for p in named.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if !v.iter().any(|x| x == p) {
            v.push(p.to_string());
        }
    }
    v
}

/// One finding per controller bound to ugds and peer (the GPUs and the devices `named` lists,
/// comma separated); none without peers.
pub fn findings(host: &Host, named: Option<&str>) -> Vec<Finding> {
    let peers = peers(host, named);
    if peers.is_empty() {
        return Vec::new();
    }
    let bound: Vec<String> = host
        .nvme_controllers()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| host.driver_of(c).as_deref() == Some("ugds"))
        .collect();
    if bound.is_empty() {
        return vec![finding(
            TOPIC,
            Verdict::Info,
            format!("no controller is bound to ugds, so no peer-to-peer route to {} to predict", peers.join(", ")),
            "",
        )];
    }
    let mut out = Vec::new();
    for c in &bound {
        for p in peers.iter().filter(|p| *p != c) {
            match host.p2p_route(c, p) {
                Ok(route) => {
                    let detail = format!("SSD {c} and {p}: {route}");
                    let mut f = finding(TOPIC, Verdict::Info, detail, fix_for(&route));
                    f.p2p = Some(P2pCheck { controller: c.clone(), peer: p.clone(), route });
                    out.push(f);
                }
                Err(e) => out.push(finding(
                    TOPIC,
                    Verdict::Info,
                    format!("SSD {c} and {p}: {e}"),
                    format!("{PEER_ENV} takes PCI addresses from /sys/bus/pci/devices, comma separated"),
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::{config_space, Fake};
    use crate::sysfs::CLASS_NVME;

    /// A switch with a ugds controller and a GPU below it, an emulated peer on a root port,
    /// host bridge q35, an Intel CPU.
    fn tree() -> Fake {
        let f = Fake::new();
        let ep = config_space(0, None);
        f.pci_below(None, "0000:00:00.0", "0x060000", (0x8086, 0x29c0), &ep[..256]);
        for rp in ["0000:00:01.0", "0000:00:02.0"] {
            f.pci_below(None, rp, "0x060400", (0x1b36, 0x000c), &config_space(4, None));
        }
        f.pci_below(Some("0000:00:01.0"), "0000:01:00.0", "0x060400", (0x10b5, 1), &config_space(5, None));
        f.pci_below(Some("0000:01:00.0"), "0000:02:00.0", "0x060400", (0x10b5, 1), &config_space(6, None));
        f.pci_below(Some("0000:01:00.0"), "0000:02:01.0", "0x060400", (0x10b5, 1), &config_space(6, None));
        f.pci_below(Some("0000:02:00.0"), "0000:03:00.0", CLASS_NVME, (0x1b36, 0x0010), &ep);
        f.pci_below(Some("0000:02:01.0"), "0000:04:00.0", "0x030000", (0x1234, 0x1111), &ep);
        f.pci_below(Some("0000:00:02.0"), "0000:05:00.0", "0x00ff00", (0x1b36, 0x0005), &ep);
        f.cpu("GenuineIntel", 6);
        f
    }

    #[test]
    fn each_bound_controller_against_each_gpu_and_named_peer() {
        let f = tree();
        let h = f.host();
        // Nothing bound to ugds: one line saying so.
        let v = findings(&h, None);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("no controller is bound"), "{v:?}");
        f.bind_to("0000:03:00.0", "ugds");
        let v = findings(&h, Some(" 0000:05:00.0,0000:04:00.0,,0000:09:00.0"));
        let got: Vec<_> =
            v.iter().map(|x| x.p2p.as_ref().map(|c| (c.peer.as_str(), c.route.kind(), c.route.allowed()))).collect();
        assert_eq!(
            got,
            [Some(("0000:04:00.0", "switch", Some(true))), Some(("0000:05:00.0", "host_bridge", Some(false))), None]
        );
        assert!(v.iter().all(|x| x.topic == TOPIC && x.verdict == Verdict::Info), "{v:?}");
        assert!(v[1].fix.contains("same PCIe switch"), "{:?}", v[1]);
        assert!(v[2].detail.contains("no PCI device 0000:09:00.0") && !v[2].fix.is_empty(), "{:?}", v[2]);
        // ACS on the downstream port: the fix names the kernel parameter.
        f.config("0000:02:01.0", &config_space(6, Some(0x1d)));
        let v = findings(&h, None);
        assert_eq!(v.len(), 1);
        assert!(v[0].fix.contains("pci=disable_acs_redir=0000:02:01.0"), "{:?}", v[0]);
        assert!(v[0].detail.starts_with("SSD 0000:03:00.0 and 0000:04:00.0: ACS redirect"), "{:?}", v[0]);
    }
}
