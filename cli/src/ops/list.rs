//! `ugds list`: every NVMe controller, like `nvme list`, whichever driver holds it.

use crate::Res;
use ugds::device::Control;
use ugds::sysfs::{ControllerEntry, Host};

/// Every controller, with identity and namespaces from the module for those bound to ugds
/// (and why not, when the node cannot be read).
fn gather() -> Res<Vec<(ControllerEntry, Option<String>)>> {
    let mut out = Vec::new();
    for mut c in Host::system().controllers()? {
        let mut note = None;
        if let Some(node) = c.ugds_nodes.first() {
            match Control::open(node) {
                Ok(ctl) => c.fill_from_info(ctl.info()),
                Err(e) => note = Some(e.to_string()),
            }
        }
        out.push((c, note));
    }
    Ok(out)
}

/// One controller as JSON.
pub(super) fn to_json(c: &ControllerEntry, note: Option<&str>) -> serde_json::Value {
    let ns: Vec<_> = c
        .namespaces
        .iter()
        .map(|n| serde_json::json!({"id": n.id, "size": n.size, "block_size": n.block_size, "block_device": n.block_device}))
        .collect();
    serde_json::json!({
        "pci": c.addr, "driver": c.driver.as_deref().unwrap_or("none"), "driver_override": c.driver_override,
        "pci_id": c.pci_id, "model": c.model, "serial": c.serial, "firmware": c.firmware,
        "nvme_devices": c.nvme_devices, "ugds_nodes": c.ugds_nodes, "block_devices": c.block_devices,
        "namespaces": ns, "md_arrays": c.md_arrays, "volumes": c.volumes, "iommu_group": c.iommu_group,
        "note": note,
    })
}

/// One controller as text lines.
pub(super) fn to_text(c: &ControllerEntry, note: Option<&str>) -> String {
    let dash = |s: &Option<String>| s.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into());
    let devs: Vec<String> =
        c.ugds_nodes.iter().cloned().chain(c.nvme_devices.iter().map(|d| format!("/dev/{d}"))).collect();
    let mut s = format!(
        "{}  {:<8}  {:<20}  {:<24}  {:<8}  {}\n",
        c.addr,
        c.driver.as_deref().unwrap_or("none"),
        dash(&c.serial),
        dash(&c.model),
        dash(&c.firmware),
        if devs.is_empty() { "-".into() } else { devs.join(",") }
    );
    for n in &c.namespaces {
        let dev = n.block_device.as_deref().map(|d| format!(" {d}")).unwrap_or_default();
        s.push_str(&format!("    namespace {}: {} bytes in {}-byte blocks{dev}\n", n.id, n.size, n.block_size));
    }
    for m in &c.md_arrays {
        s.push_str(&format!("    member of md array /dev/{m}\n"));
    }
    for v in &c.volumes {
        s.push_str(&format!("    member of ugds volume {v}\n"));
    }
    if let Some(n) = note {
        s.push_str(&format!("    node not readable: {n}\n"));
    }
    s
}

pub(super) fn run(json: bool) -> Res<()> {
    let all = gather()?;
    if json {
        let v: Vec<_> = all.iter().map(|(c, n)| to_json(c, n.as_deref())).collect();
        println!("{}", serde_json::json!({"controllers": v}));
        return Ok(());
    }
    if all.is_empty() {
        println!("no NVMe controllers");
        return Ok(());
    }
    println!("{:<12}  {:<8}  {:<20}  {:<24}  {:<8}  devices", "PCI", "driver", "serial", "model", "firmware");
    for (c, n) in &all {
        print!("{}", to_text(c, n.as_deref()));
    }
    Ok(())
}
