//! The peer-to-peer route prediction against fake PCI trees: each route the kernel's
//! `calc_map_type_and_dist` can take, with ACS and the host bridge list.

use super::fake::{config_space, Fake};
use super::p2p::{find_ext_cap, ACS_CR, ACS_EC, ACS_RR, EXT_CAP_ACS};
use super::*;

/// QEMU's q35 host bridge (Intel 82G33 MCH), which is on no P2PDMA list.
const Q35: (u16, u16) = (0x8086, 0x29c0);
/// Intel Skylake-E, listed for any pair.
const SKYLAKE: (u16, u16) = (0x8086, 0x2020);
/// Intel Xeon E5, listed only for devices under the same host bridge.
const XEON_E5: (u16, u16) = (0x8086, 0x3c00);

const USP: &str = "0000:01:00.0";
const DSP0: &str = "0000:02:00.0";
const DSP1: &str = "0000:02:01.0";
const RP_SWITCH: &str = "0000:00:01.0";
/// NVMe behind the switch's first downstream port.
const NVME: &str = "0000:03:00.0";
/// GPU behind its second downstream port.
const GPU: &str = "0000:04:00.0";
/// NVMe on a root port of its own.
const NVME_RP: &str = "0000:05:00.0";
/// A device with a memory BAR on another root port.
const PEER_RP: &str = "0000:06:00.0";
/// NVMe under the second host bridge.
const NVME_FAR: &str = "0000:41:00.0";

/// ACS control bits Linux enables on a downstream port with an IOMMU (`pci_std_enable_acs`):
/// SV, RR, CR, UF.
const ACS_LINUX: u16 = 1 | ACS_RR | ACS_CR | (1 << 4);

/// Host bridge `ids` on `pci0000:00` with a PCIe switch (upstream port, two downstream ports:
/// NVMe under one, GPU under the other) on a root port; an NVMe and a peer on two more root
/// ports; a second host bridge (same IDs) with an NVMe on `pci0000:40`; an Intel CPU. No ACS
/// anywhere.
fn tree(ids: (u16, u16)) -> Fake {
    let f = Fake::new();
    let ep = config_space(0, None);
    f.pci_below(None, "0000:00:00.0", "0x060000", ids, &config_space(0, None)[..256]);
    for rp in [RP_SWITCH, "0000:00:02.0", "0000:00:03.0"] {
        f.pci_below(None, rp, "0x060400", (0x1b36, 0x000c), &config_space(4, None));
    }
    f.pci_below(Some(RP_SWITCH), USP, "0x060400", (0x10b5, 0x8796), &config_space(5, None));
    f.pci_below(Some(USP), DSP0, "0x060400", (0x10b5, 0x8796), &config_space(6, None));
    f.pci_below(Some(USP), DSP1, "0x060400", (0x10b5, 0x8796), &config_space(6, None));
    f.pci_below(Some(DSP0), NVME, CLASS_NVME, (0x1b36, 0x0010), &ep);
    f.pci_below(Some(DSP1), GPU, "0x030200", (0x10de, 0x2335), &ep);
    f.pci_below(Some("0000:00:02.0"), NVME_RP, CLASS_NVME, (0x1b36, 0x0010), &ep);
    f.pci_below(Some("0000:00:03.0"), PEER_RP, "0x050000", (0x1b36, 0x0011), &ep);
    f.pci_below(None, "0000:40:00.0", "0x060000", ids, &config_space(0, None)[..256]);
    f.pci_below(None, "0000:40:01.0", "0x060400", (0x1b36, 0x000c), &config_space(4, None));
    f.pci_below(Some("0000:40:01.0"), NVME_FAR, CLASS_NVME, (0x1b36, 0x0010), &ep);
    f.cpu("GenuineIntel", 6);
    f
}

fn route(f: &Fake, a: &str, b: &str) -> P2pRoute {
    let r = f.host().p2p_route(a, b).unwrap();
    assert_eq!(f.host().p2p_route(b, a).unwrap().allowed(), r.allowed(), "the order changed the answer");
    r
}

#[test]
fn devices_below_one_switch_go_direct() {
    let f = tree(Q35);
    let r = route(&f, NVME, GPU);
    assert_eq!(r, P2pRoute::Switch { bridge: USP.into() });
    assert_eq!(r.allowed(), Some(true));
    assert!(r.to_string().contains("direct below 0000:01:00.0"), "{r}");
    // ACS bits that do not redirect peer-to-peer requests leave it direct.
    f.config(DSP0, &config_space(6, Some(1 | (1 << 1) | (1 << 4) | (1 << 6))));
    assert_eq!(route(&f, NVME, GPU), P2pRoute::Switch { bridge: USP.into() });
    // ACS redirect on the root port above the switch is off the path between the two.
    f.config(RP_SWITCH, &config_space(4, Some(ACS_LINUX)));
    assert_eq!(route(&f, NVME, GPU), P2pRoute::Switch { bridge: USP.into() });
}

/// Fails if ACS were ignored: the switch would be called direct, and the kernel refuses it.
#[test]
fn acs_redirect_on_a_downstream_port_sends_it_to_the_host_bridge() {
    let f = tree(Q35);
    f.config(DSP0, &config_space(6, Some(ACS_LINUX)));
    let r = route(&f, NVME, GPU);
    let P2pRoute::AcsRedirect { bridges, common, host } = &r else { panic!("{r:?}") };
    assert_eq!((bridges.as_slice(), common.as_str()), ([DSP0.to_string()].as_slice(), USP));
    assert!(!host.whitelisted);
    assert_eq!(host.host_bridges[0].listing, Listing::NotListed);
    assert_eq!(r.allowed(), Some(false), "q35 is on no list: the kernel refuses");
    assert!(r.to_string().contains("ACS redirect on 0000:02:00.0") && r.to_string().contains("refused"), "{r}");
    // Completion redirect or egress control alone redirect too, as does ACS on the common port
    // or on an endpoint, all listed in the kernel's order (first device upward, then second).
    for bit in [ACS_CR, ACS_EC] {
        f.config(DSP0, &config_space(6, Some(bit)));
        assert!(matches!(route(&f, NVME, GPU), P2pRoute::AcsRedirect { .. }), "{bit:#x}");
    }
    f.config(USP, &config_space(5, Some(ACS_RR)));
    f.config(GPU, &config_space(0, Some(ACS_RR)));
    let Ok(P2pRoute::AcsRedirect { bridges, .. }) = f.host().p2p_route(NVME, GPU) else { panic!() };
    assert_eq!(bridges, [DSP0, USP, GPU]);
    // On a listed host bridge the redirected traffic is allowed.
    let f = tree(SKYLAKE);
    f.config(DSP1, &config_space(6, Some(ACS_LINUX)));
    let r = route(&f, NVME, GPU);
    assert!(matches!(&r, P2pRoute::AcsRedirect { bridges, .. } if bridges == &[DSP1]), "{r:?}");
    assert_eq!(r.allowed(), Some(true));
}

#[test]
fn devices_on_different_root_ports_need_a_listed_host_bridge_or_an_amd_zen() {
    let f = tree(Q35);
    let r = route(&f, NVME_RP, PEER_RP);
    let P2pRoute::HostBridge { host } = &r else { panic!("{r:?}") };
    assert_eq!(host.host_bridges.len(), 1);
    assert_eq!(host.host_bridges[0].device.as_deref(), Some("0000:00:00.0"));
    assert_eq!(host.host_bridges[0].ids, Q35);
    assert_eq!(r.allowed(), Some(false));
    assert!(r.to_string().contains("8086:29c0) is not on the kernel's P2PDMA host bridge list"), "{r}");
    // ACS on the root ports does not matter without a common bridge.
    f.config("0000:00:02.0", &config_space(4, Some(ACS_LINUX)));
    assert!(matches!(route(&f, NVME_RP, PEER_RP), P2pRoute::HostBridge { .. }));
    // A device behind the switch and one on another root port: also through the host bridge.
    assert!(matches!(route(&f, NVME, PEER_RP), P2pRoute::HostBridge { .. }));
    // An AMD Zen CPU allows any host bridge; an older AMD does not.
    f.cpu("AuthenticAMD", 0x19);
    let r = route(&f, NVME_RP, PEER_RP);
    let P2pRoute::HostBridge { host } = &r else { panic!("{r:?}") };
    assert_eq!((host.whitelisted, host.amd_zen_family), (true, Some(0x19)));
    assert!(r.to_string().contains("AMD Zen"), "{r}");
    f.cpu("AuthenticAMD", 0x15);
    assert_eq!(route(&f, NVME_RP, PEER_RP).allowed(), Some(false));
    // A listed host bridge allows it.
    assert_eq!(route(&tree(SKYLAKE), NVME_RP, PEER_RP).allowed(), Some(true));
}

#[test]
fn some_listed_host_bridges_hold_only_under_one_host_bridge() {
    let f = tree(XEON_E5);
    assert_eq!(route(&f, NVME_RP, PEER_RP).allowed(), Some(true));
    let r = route(&f, NVME_FAR, GPU);
    let P2pRoute::HostBridge { host } = &r else { panic!("{r:?}") };
    assert_eq!(host.host_bridges.len(), 2);
    assert!(host.host_bridges.iter().all(|h| h.listing == Listing::SameHostBridgeOnly), "{host:?}");
    assert_eq!(r.allowed(), Some(false));
    // Two different host bridges both listed for any pair: allowed.
    assert_eq!(route(&tree(SKYLAKE), NVME_FAR, GPU).allowed(), Some(true));
}

#[test]
fn a_root_bus_without_00_0_is_looked_up_by_its_first_root_port() {
    let f = tree(Q35);
    f.pci_below(None, "0000:80:02.0", "0x060400", SKYLAKE, &config_space(4, None));
    f.pci_below(None, "0000:80:03.0", "0x060400", Q35, &config_space(4, None));
    f.pci_below(Some("0000:80:02.0"), "0000:81:00.0", CLASS_NVME, (0x1b36, 0x0010), &config_space(0, None));
    f.pci_below(Some("0000:80:03.0"), "0000:82:00.0", "0x030000", (0x1234, 0x1111), &config_space(0, None));
    let r = route(&f, "0000:81:00.0", "0000:82:00.0");
    let P2pRoute::HostBridge { host } = &r else { panic!("{r:?}") };
    assert_eq!(host.host_bridges[0].device.as_deref(), Some("0000:80:02.0"));
    assert_eq!(r.allowed(), Some(true));
    // The first device is no root port (a PCI bridge): nothing to look up, refused.
    f.config("0000:80:02.0", &config_space(7, None));
    let r = route(&f, "0000:81:00.0", "0000:82:00.0");
    let P2pRoute::HostBridge { host } = &r else { panic!("{r:?}") };
    assert_eq!((host.host_bridges[0].listing, r.allowed()), (Listing::NoDevice, Some(false)));
    // Unreadable (not root): unknown, not a guess.
    f.config("0000:80:02.0", &config_space(4, None)[..64]);
    let r = route(&f, "0000:81:00.0", "0000:82:00.0");
    assert!(matches!(&r, P2pRoute::Unknown { why } if why.contains("only 64 bytes")), "{r:?}");
    assert_eq!(r.allowed(), None);
}

#[test]
fn unreadable_acs_is_unknown_unless_another_port_redirects() {
    let f = tree(Q35);
    // What a user other than root reads: the first 64 bytes.
    f.config(DSP0, &config_space(6, Some(ACS_LINUX))[..64]);
    let r = route(&f, NVME, GPU);
    let P2pRoute::Unknown { why } = &r else { panic!("{r:?}") };
    assert!(why.contains("only 64 bytes of 0000:02:00.0's config space"), "{why}");
    assert!(r.to_string().starts_with("unknown: "), "{r}");
    f.config(DSP1, &config_space(6, Some(ACS_RR)));
    assert!(matches!(route(&f, NVME, GPU), P2pRoute::AcsRedirect { ref bridges, .. } if bridges == &[DSP1]));
    // A device without extended config space (256 bytes as root) has no ACS.
    f.config(DSP0, &config_space(6, None)[..256]);
    f.config(DSP1, &config_space(6, None)[..256]);
    assert_eq!(route(&f, NVME, GPU), P2pRoute::Switch { bridge: USP.into() });
    // No cpuinfo: the host bridge rule cannot be applied.
    std::fs::remove_file(f.root().join("proc/cpuinfo")).unwrap();
    assert!(matches!(route(&f, NVME_RP, PEER_RP), P2pRoute::Unknown { ref why } if why.contains("cpuinfo")));
}

#[test]
fn same_device_functions_and_missing_devices() {
    let f = tree(Q35);
    // One device with itself turns around in itself (distance 0); one above the other too.
    assert_eq!(route(&f, NVME, NVME), P2pRoute::Switch { bridge: NVME.into() });
    assert_eq!(route(&f, DSP0, NVME), P2pRoute::Switch { bridge: DSP0.into() });
    // Two devices on the root bus share no upstream bridge.
    assert!(matches!(route(&f, "0000:00:02.0", "0000:00:03.0"), P2pRoute::HostBridge { .. }));
    let err = f.host().p2p_route(NVME, "0000:09:00.0").unwrap_err();
    assert!(matches!(err, SysfsError::NoPciDevice { ref addr } if addr == "0000:09:00.0"), "{err}");
    assert_eq!(f.host().display_functions(), [GPU]);
}

#[test]
fn the_extended_capability_walk_is_bounded() {
    let mut c = config_space(6, Some(ACS_RR));
    assert_eq!(find_ext_cap(&c, EXT_CAP_ACS), Some(0x148));
    assert_eq!(find_ext_cap(&c, 0x0002), None);
    // A capability pointing at itself ends after the kernel's bound, not never.
    c[0x100..0x104].copy_from_slice(&(1u32 | (0x100 << 20)).to_le_bytes());
    assert_eq!(find_ext_cap(&c, EXT_CAP_ACS), None);
    assert_eq!(find_ext_cap(&c[..256], EXT_CAP_ACS), None);
}
