//! `ugds bind` / `ugds unbind`: the library's `Host::bind_many` / `unbind_many` on this machine.

use crate::Res;
use ugds::sysfs::{describe_refused, md_build_line, volume_spec, Host};

fn need_targets(targets: &[String], all: bool) -> Res<()> {
    if targets.is_empty() && !all {
        return Err("name the controllers (PCI address, /dev/nvmeX, /dev/ugds_drvN) or give --all".into());
    }
    Ok(())
}

pub(super) fn bind(targets: &[String], all: bool, chunk: u64, json: bool) -> Res<()> {
    need_targets(targets, all)?;
    let (bound, refused) = Host::system().bind_many(targets, all)?;
    let nodes: Vec<String> = bound.iter().map(|b| b.node.clone()).collect();
    let volume = if all || targets.len() > 1 { Some(volume_spec(chunk, &nodes)?) } else { None };
    if json {
        let b: Vec<_> = bound.iter().map(|b| serde_json::json!({"pci": b.addr, "node": b.node})).collect();
        let r: Vec<_> = refused.iter().map(|(a, why)| serde_json::json!({"pci": a, "why": why})).collect();
        println!("{}", serde_json::json!({"bound": b, "refused": r, "volume": volume}));
        return Ok(());
    }
    for b in &bound {
        println!("{}: bound to ugds: {}", b.addr, b.node);
    }
    if !refused.is_empty() {
        println!("left with their driver (in use):{}", describe_refused(&refused));
    }
    if let Some(v) = volume {
        println!("volume: {v}");
    }
    Ok(())
}

pub(super) fn unbind(targets: &[String], all: bool, chunk: u64, json: bool) -> Res<()> {
    need_targets(targets, all)?;
    let released = Host::system().unbind_many(targets, all)?;
    let disks: Vec<String> = released.iter().filter_map(|r| r.disk.clone()).collect();
    let md = ((all || targets.len() > 1) && disks.len() == released.len()).then(|| md_build_line(chunk, &disks));
    if json {
        let r: Vec<_> =
            released.iter().map(|r| serde_json::json!({"pci": r.addr, "driver": r.driver, "disk": r.disk})).collect();
        println!("{}", serde_json::json!({"released": r, "md": md}));
        return Ok(());
    }
    for r in &released {
        let disk = r.disk.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
        println!("{}: given back to {}{disk}", r.addr, r.driver.as_deref().unwrap_or("no driver"));
    }
    if let Some(m) = md {
        println!("md RAID0 with the same layout: {m}");
    }
    Ok(())
}
