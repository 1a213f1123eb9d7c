//! Whether the kernel will let two PCI devices DMA to each other (an NVMe controller into a
//! GPU's or another device's BAR), predicted from sysfs the way Linux's `drivers/pci/p2pdma.c`
//! decides it (`calc_map_type_and_dist`, which `pci_p2pdma_map_type` and
//! `pci_p2pdma_distance` call; the dma-buf exporters of device memory refuse the attachment
//! when it says "not supported"):
//!
//! 1. Walk up from both devices to their lowest common upstream bridge. The walk starts at the
//!    devices themselves and goes through `pci_upstream_bridge`, which stops at the root bus:
//!    two devices on the root bus, or under different root ports, have none.
//! 2. With one, and no device on the path (the devices, the bridges between them and the common
//!    one) having ACS P2P Request Redirect, Completion Redirect or Egress Control enabled, the
//!    traffic turns around in that bridge: bus addresses, no IOMMU ([`P2pRoute::Switch`]).
//! 3. Otherwise it goes up through the host bridge ([`P2pRoute::HostBridge`], or
//!    [`P2pRoute::AcsRedirect`] when ACS sent it there). The kernel allows that when CPU 0 is an
//!    AMD Zen or later (x86 family 0x17 and up) or the host bridge is on its list (the function
//!    at devfn 00.0 of the root bus, or the root bus's first device when that is a root port,
//!    by vendor and device; some entries hold only for devices under one host bridge), and
//!    refuses it otherwise.
//!
//! ACS control sits in the extended config space, which sysfs gives to root only (others read
//! 64 bytes): without it the answer is [`P2pRoute::Unknown`], never a guess. The kernel caches
//! its answer per device pair at the first mapping, so ACS changed later (setpci) is seen here
//! but not by the kernel until the provider's P2P state is set up again.

use super::{attr, Host, Result, SysfsError};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The ACS extended capability's ID.
pub(super) const EXT_CAP_ACS: u16 = 0x000d;
/// The ACS control register's offset in the capability.
pub(super) const ACS_CTRL: usize = 6;
/// ACS P2P Request Redirect.
pub(super) const ACS_RR: u16 = 1 << 2;
/// ACS P2P Completion Redirect.
pub(super) const ACS_CR: u16 = 1 << 3;
/// ACS P2P Egress Control.
pub(super) const ACS_EC: u16 = 1 << 5;
/// The PCI Express capability's ID (standard capability list).
pub(super) const CAP_PCIE: u8 = 0x10;
/// The PCIe device/port type of a root port (PCI Express capabilities register, bits 7:4).
pub(super) const PCIE_ROOT_PORT: u8 = 0x4;

/// Size of the conventional config space; the extended capabilities start there.
const CFG_SPACE: usize = 256;

/// The kernel's P2PDMA host bridge list (`pci_p2pdma_whitelist` in Linux 7.3): vendor,
/// device (`None`: any device of the vendor) and whether the entry holds only for two devices
/// under the same host bridge.
const HOST_BRIDGE_LIST: &[(u16, Option<u16>, bool)] = &[
    // Intel Xeon E5/Core i7.
    (0x8086, Some(0x3c00), true),
    (0x8086, Some(0x3c01), true),
    // Intel Xeon E7 v3/Xeon E5 v3/Core i7.
    (0x8086, Some(0x2f00), true),
    (0x8086, Some(0x2f01), true),
    // Intel Skylake-E.
    (0x8086, Some(0x2030), false),
    (0x8086, Some(0x2031), false),
    (0x8086, Some(0x2032), false),
    (0x8086, Some(0x2033), false),
    (0x8086, Some(0x2020), false),
    (0x8086, Some(0x09a2), false),
    // Intel DSA/IAA (Sapphire Rapids, Granite Rapids-D, Diamond Rapids) and QAT.
    (0x8086, Some(0x0b25), false),
    (0x8086, Some(0x0cfe), false),
    (0x8086, Some(0x11fb), false),
    (0x8086, Some(0x1212), false),
    (0x8086, Some(0x1216), false),
    (0x8086, Some(0x4940), false),
    (0x8086, Some(0x4942), false),
    (0x8086, Some(0x4944), false),
    (0x8086, Some(0x4946), false),
    (0x8086, Some(0x4948), false),
    // Google SoCs.
    (0x1ae0, None, false),
    // NVIDIA CPUs.
    (0x10de, Some(0x2f95), false),
    (0x10de, Some(0x2f96), false),
    (0x10de, Some(0x2f97), false),
    (0x10de, Some(0x2f98), false),
];

/// How the kernel would route peer-to-peer DMA between two PCI devices ([`Host::p2p_route`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum P2pRoute {
    /// Direct: the traffic turns around in `bridge`, the devices' lowest common upstream
    /// device (a switch's upstream port, or a root port both sit below, or one of the devices
    /// when it is above the other), with no ACS redirect on the path. The kernel maps bus
    /// addresses (`PCI_P2PDMA_MAP_BUS_ADDR`); no IOMMU is involved.
    Switch {
        /// The common upstream device's PCI address.
        bridge: String,
    },
    /// Up through the host bridge: the devices share no upstream bridge.
    HostBridge {
        /// What the kernel decides there.
        host: HostBridgePath,
    },
    /// Through the host bridge although the devices share an upstream bridge: ACS on the path
    /// redirects their requests upstream.
    AcsRedirect {
        /// The devices on the path with ACS P2P redirect or egress control on, in the kernel's
        /// order (first device upward, then second device upward); booting with
        /// `pci=disable_acs_redir=` and this list joined by `;` turns that off.
        bridges: Vec<String>,
        /// The common upstream device the traffic would otherwise turn around in.
        common: String,
        /// What the kernel decides at the host bridge.
        host: HostBridgePath,
    },
    /// sysfs does not tell (most often: the extended config space is root's).
    Unknown {
        /// Why, and what would tell.
        why: String,
    },
}

/// Traffic through the host bridge, and whether the kernel allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBridgePath {
    /// True when the kernel allows P2P through the host bridge (`PCI_P2PDMA_MAP_THRU_HOST_BRIDGE`,
    /// mapped through the IOMMU where there is one); false when it refuses
    /// (`PCI_P2PDMA_MAP_NOT_SUPPORTED`).
    pub whitelisted: bool,
    /// CPU 0's x86 family when it is an AMD Zen or later, which the kernel allows whatever the
    /// host bridge (`cpu_supports_p2pdma`); the host bridges are then not consulted.
    pub amd_zen_family: Option<u32>,
    /// The host bridges consulted: one when both devices are under the same one, else the
    /// first device's and the second's. Empty when the CPU decided.
    pub host_bridges: Vec<HostBridge>,
}

/// One host bridge as the kernel's list sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBridge {
    /// The root bus (`pci0000:00`).
    pub root_bus: String,
    /// The function the kernel looks up (`0000:00:00.0`): devfn 00.0 of the root bus, or its
    /// first device when that is a root port. `None` when there is neither, which the kernel
    /// treats as not listed.
    pub device: Option<String>,
    /// Its vendor and device IDs (zero without a device).
    pub ids: (u16, u16),
    /// What the list says.
    pub listing: Listing,
}

/// What the kernel's host bridge list says about one host bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Listing {
    /// Listed.
    Listed,
    /// Listed only for two devices under this same host bridge, and they are not.
    SameHostBridgeOnly,
    /// Not listed.
    NotListed,
    /// No function to look up.
    NoDevice,
}

impl P2pRoute {
    /// Whether the kernel allows the route: `None` when it is unknown.
    pub fn allowed(&self) -> Option<bool> {
        match self {
            P2pRoute::Switch { .. } => Some(true),
            P2pRoute::HostBridge { host } | P2pRoute::AcsRedirect { host, .. } => Some(host.whitelisted),
            P2pRoute::Unknown { .. } => None,
        }
    }

    /// A short name of the route: `switch`, `host_bridge`, `acs_redirect` or `unknown`.
    pub fn kind(&self) -> &'static str {
        match self {
            P2pRoute::Switch { .. } => "switch",
            P2pRoute::HostBridge { .. } => "host_bridge",
            P2pRoute::AcsRedirect { .. } => "acs_redirect",
            P2pRoute::Unknown { .. } => "unknown",
        }
    }
}

impl fmt::Display for P2pRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            P2pRoute::Switch { bridge } => write!(
                f,
                "allowed, direct below {bridge} (no ACS redirect on the path): bus addresses, no IOMMU involved"
            ),
            P2pRoute::HostBridge { host } => write!(f, "no common upstream bridge, so through the host bridge: {host}"),
            P2pRoute::AcsRedirect { bridges, common, host } => {
                write!(f, "ACS redirect on {} sends it from {common} up to the host bridge: {host}", bridges.join(", "))
            }
            P2pRoute::Unknown { why } => write!(f, "unknown: {why}"),
        }
    }
}

impl fmt::Display for HostBridgePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.whitelisted { "allowed" } else { "refused" };
        if let Some(family) = self.amd_zen_family {
            return write!(f, "{verdict}, the CPU is an AMD Zen or later (family {family:#x})");
        }
        let each: Vec<String> = self.host_bridges.iter().map(ToString::to_string).collect();
        write!(f, "{verdict}, {}", each.join("; "))?;
        if !self.whitelisted {
            write!(f, ", and the CPU is not an AMD Zen or later")?;
        }
        Ok(())
    }
}

impl fmt::Display for HostBridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(dev) = &self.device else {
            return write!(f, "{} has no function 00.0 or root port to look up", self.root_bus);
        };
        let (v, d) = self.ids;
        let says = match self.listing {
            Listing::Listed => "is on the kernel's P2PDMA host bridge list",
            Listing::SameHostBridgeOnly => "is on the kernel's list only for devices under one host bridge",
            Listing::NotListed | Listing::NoDevice => "is not on the kernel's P2PDMA host bridge list",
        };
        write!(f, "host bridge {dev} ({v:04x}:{d:04x}) {says}")
    }
}

/// One device of a PCI path: its address and sysfs directory.
#[derive(Debug, Clone)]
struct Node {
    addr: String,
    dir: PathBuf,
}

/// Where a device sits: its root bus and the devices from the root bus down to it.
#[derive(Debug, Clone)]
struct Chain {
    root_bus: String,
    root_dir: PathBuf,
    nodes: Vec<Node>,
}

/// What a device's config space says about ACS redirect.
enum Acs {
    /// No ACS capability, or none of the redirect/egress bits on.
    Off,
    /// Redirect or egress control on.
    Redirects,
    /// Not readable.
    Unreadable(String),
}

/// `(domain, bus, device, function)` of `dddd:bb:dd.f` (a VMD domain may have five digits).
fn parse_pci_address(s: &str) -> Option<(u32, u8, u8, u8)> {
    let (dom, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    if dom.len() < 4 || bus.len() != 2 || dev.len() != 2 || func.len() != 1 {
        return None;
    }
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    let (dev, func) = (hex(dev)?, hex(func)?);
    if dev > 0x1f || func > 7 {
        return None;
    }
    // CAST: bus is two hex digits, dev and func were range-checked above.
    Some((hex(dom)?, hex(bus)? as u8, dev as u8, func as u8))
}

/// True for a root bus's directory name (`pci0000:00`).
fn is_root_bus_name(s: &str) -> bool {
    s.strip_prefix("pci").and_then(|r| r.split_once(':')).is_some_and(|(d, b)| {
        d.len() >= 4
            && b.len() == 2
            && d.bytes().all(|c| c.is_ascii_hexdigit())
            && b.bytes().all(|c| c.is_ascii_hexdigit())
    })
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes([*b.get(at)?, *b.get(at + 1)?, *b.get(at + 2)?, *b.get(at + 3)?]))
}

/// The offset of extended capability `id`, walked as `pci_find_ext_capability` does: from
/// 0x100, stopping at a zero header, a next pointer below 0x100 or after as many steps as fit.
pub(super) fn find_ext_cap(cfg: &[u8], id: u16) -> Option<usize> {
    if cfg.len() <= CFG_SPACE {
        return None;
    }
    let mut pos = CFG_SPACE;
    let mut header = le32(cfg, pos)?;
    if header == 0 {
        return None;
    }
    // The kernel's bound: the fewest bytes a capability takes (8) into the extended space.
    for _ in 0..(cfg.len() - CFG_SPACE) / 8 {
        // CAST: the ID is the header's low 16 bits.
        if (header & 0xffff) as u16 == id {
            return Some(pos);
        }
        // CAST: the next pointer is 12 bits.
        pos = ((header >> 20) & 0xffc) as usize;
        if pos < CFG_SPACE {
            return None;
        }
        header = le32(cfg, pos)?;
    }
    None
}

/// The offset of standard capability `id` (the list from 0x34), as `pci_find_capability` does.
pub(super) fn find_cap(cfg: &[u8], id: u8) -> Option<usize> {
    // Status bit 4: the device has a capability list.
    if le16(cfg, 0x06)? & (1 << 4) == 0 {
        return None;
    }
    let mut pos = usize::from(*cfg.get(0x34)? & 0xfc);
    // 48 is the most capabilities the 192 bytes after the header can hold, as the kernel bounds it.
    for _ in 0..48 {
        if pos < 0x40 {
            return None;
        }
        if *cfg.get(pos)? == id {
            return Some(pos);
        }
        pos = usize::from(*cfg.get(pos + 1)? & 0xfc);
    }
    None
}

impl Host {
    /// The VGA (PCI class 0x0300) and 3D (0x0302) display controllers, GPUs most often, in PCI
    /// order: the peers `ugds doctor` predicts routes to.
    pub fn display_functions(&self) -> Vec<String> {
        super::names_in(&self.pci_devices())
            .into_iter()
            .filter(|a| {
                attr(self.pci_path(a).join("class"))
                    .and_then(|c| u32::from_str_radix(c.trim_start_matches("0x"), 16).ok())
                    .is_some_and(|c| matches!(c >> 8, 0x0300 | 0x0302))
            })
            .collect()
    }

    /// How the kernel would route peer-to-peer DMA between the PCI devices `a` and `b`
    /// (`0000:01:00.0`; the order does not change the answer): [`P2pRoute`]. An error only when
    /// one of them is no PCI device; what sysfs cannot tell is [`P2pRoute::Unknown`].
    pub fn p2p_route(&self, a: &str, b: &str) -> Result<P2pRoute> {
        for addr in [a, b] {
            if !self.pci_path(addr).exists() {
                return Err(SysfsError::NoPciDevice { addr: addr.into() });
            }
        }
        let (ca, cb) = match (self.pci_chain(a), self.pci_chain(b)) {
            (Ok(ca), Ok(cb)) => (ca, cb),
            (Err(why), _) | (_, Err(why)) => return Ok(P2pRoute::Unknown { why }),
        };
        // The lowest common upstream device: the last one both chains start with, under one
        // root bus. The root bus itself is not a device: sharing only it is sharing none.
        let shared = if ca.root_dir == cb.root_dir {
            ca.nodes.iter().zip(&cb.nodes).take_while(|(x, y)| x.addr == y.addr).count()
        } else {
            0
        };
        if shared == 0 {
            return Ok(match self.through_host_bridge(&ca, &cb) {
                Ok(host) => P2pRoute::HostBridge { host },
                Err(why) => P2pRoute::Unknown { why },
            });
        }
        let common = ca.nodes[shared - 1].addr.clone();
        // The kernel checks a's path up to and including the common device, and b's up to it
        // (the common device once): every device the traffic would pass, both ends included.
        let path = ca.nodes[shared - 1..].iter().rev().chain(cb.nodes[shared..].iter().rev());
        let mut redirect = Vec::new();
        let mut unreadable = Vec::new();
        for n in path {
            match acs_of(n) {
                Acs::Off => {}
                Acs::Redirects => redirect.push(n.addr.clone()),
                Acs::Unreadable(why) => unreadable.push(why),
            }
        }
        if !redirect.is_empty() {
            // One redirecting device settles it, whatever the unreadable ones say.
            return Ok(match self.through_host_bridge(&ca, &cb) {
                Ok(host) => P2pRoute::AcsRedirect { bridges: redirect, common, host },
                Err(why) => P2pRoute::Unknown {
                    why: format!("ACS redirect on {} sends it to the host bridge, but {why}", redirect.join(", ")),
                },
            });
        }
        if !unreadable.is_empty() {
            return Ok(P2pRoute::Unknown {
                why: format!(
                    "{a} and {b} share the upstream bridge {common}, but whether ACS redirects between them is not \
                     readable: {}",
                    unreadable.join("; ")
                ),
            });
        }
        Ok(P2pRoute::Switch { bridge: common })
    }

    /// The root bus and the devices from it down to `addr`, from the resolved sysfs path
    /// (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`). The innermost root bus counts: a
    /// VMD domain's bus lies inside the device that makes it.
    fn pci_chain(&self, addr: &str) -> std::result::Result<Chain, String> {
        let link = self.pci_path(addr);
        let real = fs::canonicalize(&link).map_err(|e| format!("resolving {}: {e}", link.display()))?;
        let comps: Vec<String> = real.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let i = comps
            .iter()
            .rposition(|c| is_root_bus_name(c))
            .ok_or_else(|| format!("{} lies under no PCI root bus", real.display()))?;
        let mut dir: PathBuf = comps[..=i].iter().collect();
        let root_dir = dir.clone();
        let mut nodes = Vec::new();
        for c in &comps[i + 1..] {
            dir.push(c);
            if parse_pci_address(c).is_none() {
                return Err(format!("{} has {c} on its PCI path, which is no PCI device", real.display()));
            }
            nodes.push(Node { addr: c.clone(), dir: dir.clone() });
        }
        if nodes.is_empty() {
            return Err(format!("{} is a root bus, not a PCI device", real.display()));
        }
        Ok(Chain { root_bus: comps[i].clone(), root_dir, nodes })
    }

    /// What the kernel decides for traffic between the devices of `a` and `b` through the host
    /// bridge (`cpu_supports_p2pdma`, then `host_bridge_whitelist`); `Err` says why it is not
    /// known.
    fn through_host_bridge(&self, a: &Chain, b: &Chain) -> std::result::Result<HostBridgePath, String> {
        if let Some(family) = self.amd_zen_family()? {
            return Ok(HostBridgePath { whitelisted: true, amd_zen_family: Some(family), host_bridges: Vec::new() });
        }
        if a.root_dir == b.root_dir {
            let hb = self.host_bridge(a, true)?;
            let whitelisted = hb.listing == Listing::Listed;
            return Ok(HostBridgePath { whitelisted, amd_zen_family: None, host_bridges: vec![hb] });
        }
        let (ha, hb) = (self.host_bridge(a, false)?, self.host_bridge(b, false)?);
        let whitelisted = ha.listing == Listing::Listed && hb.listing == Listing::Listed;
        Ok(HostBridgePath { whitelisted, amd_zen_family: None, host_bridges: vec![ha, hb] })
    }

    /// CPU 0's x86 family when it is an AMD of family 0x17 (Zen) or later; `None` for any other
    /// CPU (the kernel's rule exists on x86 only, and other architectures' cpuinfo names no
    /// AuthenticAMD vendor).
    fn amd_zen_family(&self) -> std::result::Result<Option<u32>, String> {
        let p = self.proc_.join("cpuinfo");
        let text = fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
        // The first processor's block is CPU 0's (cpu_data(0)).
        let first = text.split("\n\n").next().unwrap_or("");
        let field = |key: &str| {
            first.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        if field("vendor_id").as_deref() != Some("AuthenticAMD") {
            return Ok(None);
        }
        Ok(field("cpu family").and_then(|f| f.parse::<u32>().ok()).filter(|&f| f >= 0x17))
    }

    /// The host bridge of `chain` as the kernel's list sees it (`pci_host_bridge_dev`, then
    /// `__host_bridge_whitelist`); `same` when both devices are under it.
    fn host_bridge(&self, chain: &Chain, same: bool) -> std::result::Result<HostBridge, String> {
        let root_bus = chain.root_bus.clone();
        let none = |listing| HostBridge { root_bus: root_bus.clone(), device: None, ids: (0, 0), listing };
        // The kernel takes the root bus's first device (lowest devfn: the scan's order).
        let first = super::names_in(&chain.root_dir)
            .into_iter()
            .filter_map(|n| parse_pci_address(&n).map(|(_, _, d, f)| ((d, f), n)))
            .min_by_key(|(devfn, _)| *devfn);
        let Some(((dev, func), name)) = first else { return Ok(none(Listing::NoDevice)) };
        let dir = chain.root_dir.join(&name);
        if (dev, func) != (0, 0) {
            let cfg = read_config(&dir, &name)?;
            if cfg.len() < CFG_SPACE {
                return Err(format!(
                    "whether {name}, the first device on {root_bus}, is a root port is in its config space, of which \
                     only {} bytes are readable (sysfs gives all of it to root only)",
                    cfg.len()
                ));
            }
            let is_root_port = find_cap(&cfg, CAP_PCIE)
                .and_then(|at| le16(&cfg, at + 2))
                .is_some_and(|flags| (flags >> 4) & 0xf == u16::from(PCIE_ROOT_PORT));
            if !is_root_port {
                return Ok(none(Listing::NoDevice));
            }
        }
        let id = |f: &str| {
            attr(dir.join(f))
                .and_then(|s| u16::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                .ok_or_else(|| format!("reading {}/{f}", dir.display()))
        };
        let ids = (id("vendor")?, id("device")?);
        let listing = HOST_BRIDGE_LIST.iter().find(|(v, d, _)| *v == ids.0 && d.is_none_or(|d| d == ids.1)).map_or(
            Listing::NotListed,
            |(_, _, only_same)| {
                if *only_same && !same {
                    Listing::SameHostBridgeOnly
                } else {
                    Listing::Listed
                }
            },
        );
        Ok(HostBridge { root_bus, device: Some(name), ids, listing })
    }
}

/// A device's config space as sysfs gives it (all of it to root, 64 bytes to others).
fn read_config(dir: &Path, addr: &str) -> std::result::Result<Vec<u8>, String> {
    fs::read(dir.join("config")).map_err(|e| format!("reading {addr}'s config space: {e}"))
}

/// Whether `n` has ACS P2P Request Redirect, Completion Redirect or Egress Control on
/// (`pci_bridge_has_acs_redir`).
fn acs_of(n: &Node) -> Acs {
    let cfg = match read_config(&n.dir, &n.addr) {
        Ok(c) => c,
        Err(why) => return Acs::Unreadable(why),
    };
    // Less than the conventional space is an unprivileged read; exactly that much is a device
    // without extended space, where the kernel finds no ACS capability either.
    if cfg.len() < CFG_SPACE {
        return Acs::Unreadable(format!(
            "only {} bytes of {}'s config space are readable (its ACS control is in the extended space, which sysfs \
             gives to root only)",
            cfg.len(),
            n.addr
        ));
    }
    match find_ext_cap(&cfg, EXT_CAP_ACS).and_then(|at| le16(&cfg, at + ACS_CTRL)) {
        Some(ctrl) if ctrl & (ACS_RR | ACS_CR | ACS_EC) != 0 => Acs::Redirects,
        _ => Acs::Off,
    }
}
