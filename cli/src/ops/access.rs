//! Boot-time binding from `/etc/ugds/bind.conf` (`ugds bind --config`, `ugds unbind --config`)
//! and group access to the nodes (`ugds access`, which the udev rule runs for every new node):
//! mode 0660 for the configured group, refused by name unless the IOMMU translates the
//! controller's DMA.

use super::config::{self, BindConf};
use crate::Res;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use ugds::device::Control;
use ugds::sysfs::{ControllerEntry, Host};

/// Every controller, serials of ugds-bound ones read from their nodes.
fn known(host: &Host) -> Res<Vec<ControllerEntry>> {
    let mut v = host.controllers()?;
    for c in &mut v {
        if let Some(ctl) = c.ugds_nodes.first().and_then(|n| Control::open(n).ok()) {
            c.fill_from_info(ctl.info());
        }
    }
    Ok(v)
}

/// Gives `node` (of controller `addr`) to the configured group with mode 0660, or refuses.
fn give(host: &Host, conf: &BindConf, node: &str, addr: &str) -> Res<Option<String>> {
    let Some(group) = &conf.group else { return Ok(None) };
    host.check_group_access(node, addr)?;
    let etc = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let gid = config::group_id(group, &etc).ok_or_else(|| format!("no group {group} (in /etc/group)"))?;
    std::os::unix::fs::chown(node, None, Some(gid)).map_err(|e| format!("chown {node} to group {group}: {e}"))?;
    std::fs::set_permissions(node, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("chmod 0660 {node}: {e}"))?;
    Ok(Some(format!("{node}: group {group}, mode 0660")))
}

/// `ugds bind --config FILE`: binds each configured controller that is free (naming the others
/// and failing at the end), then gives the nodes to the configured group.
pub(super) fn bind_config(path: &Path) -> Res<()> {
    let host = Host::system();
    let conf = config::load(path)?;
    let addrs = config::addresses(&conf, &known(&host)?)?;
    let mut failed = Vec::new();
    for a in &addrs {
        match host.bind(a) {
            Ok(_) => match host.ugds_nodes(a).first() {
                Some(n) => {
                    let node = format!("/dev/{n}");
                    println!("{a}: bound to ugds: {node}");
                    match give(&host, &conf, &node, a) {
                        Ok(Some(line)) => println!("{line}"),
                        Ok(None) => {}
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                None => failed.push(format!("{a}: bound, but no ugds node appeared; see the kernel log")),
            },
            Err(e) => failed.push(format!("{a}: {e}")),
        }
    }
    if !failed.is_empty() {
        return Err(format!("{}:\n  {}", path.display(), failed.join("\n  ")).into());
    }
    Ok(())
}

/// `ugds unbind --config FILE`: gives the configured controllers back to the kernel.
pub(super) fn unbind_config(path: &Path) -> Res<()> {
    let host = Host::system();
    let conf = config::load(path)?;
    let addrs = config::addresses(&conf, &known(&host)?)?;
    for r in host.unbind_many(&addrs, false)? {
        println!("{}: given back to {}", r.addr, r.driver.as_deref().unwrap_or("no driver"));
    }
    Ok(())
}

/// `ugds access [NODE...]`: applies the configuration's group to the nodes (every ugds node when
/// none is named); nothing to do without a `group` line.
pub(super) fn access(nodes: &[String], path: &Path) -> Res<()> {
    let host = Host::system();
    let conf = if path.exists() { config::load(path)? } else { BindConf::default() };
    let nodes: Vec<String> = if nodes.is_empty() {
        host.controllers()?.into_iter().flat_map(|c| c.ugds_nodes).collect()
    } else {
        nodes.to_vec()
    };
    for n in &nodes {
        let addr = host.resolve(n)?;
        match give(&host, &conf, n, &addr)? {
            Some(line) => println!("{line}"),
            None => println!("{n}: no group configured in {}: root only (mode 0600)", path.display()),
        }
    }
    Ok(())
}
