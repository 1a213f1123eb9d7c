//! Boot-time binding from `/etc/ugds/bind.conf` (`ugds bind --config`, `ugds unbind --config`)
//! and group access to the nodes (`ugds access`, which the udev rule runs for every new node):
//! mode 0660 for the configured group, refused by name unless the IOMMU translates the
//! controller's DMA. Each prints text, or with `--json` one JSON object of the same content.

use super::config::{self, BindConf};
use crate::Res;
use serde::Serialize;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use ugds::device::Control;
use ugds::sysfs::{ControllerEntry, Host};

/// The mode of a node given to the configured group.
const GROUP_MODE: &str = "0660";
/// The mode the module creates nodes with (root only).
const ROOT_MODE: &str = "0600";

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

/// Who may open a node: the configured group (mode 0660), or root only when none is configured.
#[derive(Debug, Serialize)]
struct NodeAccess {
    node: String,
    /// The group the node was given to; `None` without a `group` line.
    group: Option<String>,
    mode: &'static str,
}

/// Gives `node` (of controller `addr`) to the configured group with mode 0660, or refuses.
fn give(host: &Host, conf: &BindConf, node: &str, addr: &str) -> Res<NodeAccess> {
    let Some(group) = &conf.group else {
        return Ok(NodeAccess { node: node.to_owned(), group: None, mode: ROOT_MODE });
    };
    host.check_group_access(node, addr)?;
    let etc = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let gid = config::group_id(group, &etc).ok_or_else(|| format!("no group {group} (in /etc/group)"))?;
    std::os::unix::fs::chown(node, None, Some(gid)).map_err(|e| format!("chown {node} to group {group}: {e}"))?;
    std::fs::set_permissions(node, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("chmod 0660 {node}: {e}"))?;
    Ok(NodeAccess { node: node.to_owned(), group: Some(group.clone()), mode: GROUP_MODE })
}

/// Prints `report` as one JSON object (`--json`) or as its text lines.
fn emit<T: Serialize + fmt::Display>(report: &T, json: bool) -> Res<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

/// A controller `ugds bind --config` bound.
#[derive(Debug, Serialize)]
struct Bound {
    pci: String,
    node: String,
    /// The group the node was given to: `None` without a `group` line, or when giving it
    /// failed (then `failed` says why).
    group: Option<String>,
    /// 0660 when given to the group.
    mode: Option<&'static str>,
}

/// A controller `ugds bind --config` could not bind, or whose node it could not give.
#[derive(Debug, Serialize)]
struct Failed {
    pci: String,
    why: String,
}

/// What `ugds bind --config` did.
#[derive(Debug, Serialize)]
struct BindReport {
    config: String,
    bound: Vec<Bound>,
    failed: Vec<Failed>,
}

impl fmt::Display for BindReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.bound {
            writeln!(f, "{}: bound to ugds: {}", b.pci, b.node)?;
            if let (Some(g), Some(m)) = (&b.group, b.mode) {
                writeln!(f, "{}: group {g}, mode {m}", b.node)?;
            }
        }
        Ok(())
    }
}

/// `ugds bind --config FILE`: binds each configured controller that is free (naming the others
/// and failing at the end), then gives the nodes to the configured group.
pub(super) fn bind_config(path: &Path, json: bool) -> Res<()> {
    let host = Host::system();
    let conf = config::load(path)?;
    let addrs = config::addresses(&conf, &known(&host)?)?;
    let mut r = BindReport { config: path.display().to_string(), bound: Vec::new(), failed: Vec::new() };
    for a in &addrs {
        let fail = |why: String| Failed { pci: a.clone(), why };
        match host.bind(a) {
            Ok(_) => match host.ugds_nodes(a).first() {
                Some(n) => {
                    let node = format!("/dev/{n}");
                    let (group, mode) = match give(&host, &conf, &node, a) {
                        Ok(NodeAccess { group: Some(g), mode, .. }) => (Some(g), Some(mode)),
                        Ok(NodeAccess { group: None, .. }) => (None, None),
                        Err(e) => {
                            r.failed.push(fail(e.to_string()));
                            (None, None)
                        }
                    };
                    r.bound.push(Bound { pci: a.clone(), node, group, mode });
                }
                None => r.failed.push(fail("bound, but no ugds node appeared; see the kernel log".into())),
            },
            Err(e) => r.failed.push(fail(e.to_string())),
        }
    }
    emit(&r, json)?;
    if !r.failed.is_empty() {
        let lines: Vec<String> = r.failed.iter().map(|f| format!("{}: {}", f.pci, f.why)).collect();
        return Err(format!("{}:\n  {}", path.display(), lines.join("\n  ")).into());
    }
    Ok(())
}

/// A controller `ugds unbind --config` gave back.
#[derive(Debug, Serialize)]
struct Released {
    pci: String,
    /// The driver that took it; `None` when none did.
    driver: Option<String>,
}

/// What `ugds unbind --config` did.
#[derive(Debug, Serialize)]
struct UnbindReport {
    config: String,
    released: Vec<Released>,
}

impl fmt::Display for UnbindReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.released {
            writeln!(f, "{}: given back to {}", r.pci, r.driver.as_deref().unwrap_or("no driver"))?;
        }
        Ok(())
    }
}

/// `ugds unbind --config FILE`: gives the configured controllers back to the kernel.
pub(super) fn unbind_config(path: &Path, json: bool) -> Res<()> {
    let host = Host::system();
    let conf = config::load(path)?;
    let addrs = config::addresses(&conf, &known(&host)?)?;
    let released = host.unbind_many(&addrs, false)?.into_iter().map(|r| Released { pci: r.addr, driver: r.driver });
    emit(&UnbindReport { config: path.display().to_string(), released: released.collect() }, json)
}

/// What `ugds access` did.
#[derive(Debug, Serialize)]
struct AccessReport {
    config: String,
    nodes: Vec<NodeAccess>,
}

impl fmt::Display for AccessReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.nodes {
            match &n.group {
                Some(g) => writeln!(f, "{}: group {g}, mode {}", n.node, n.mode)?,
                None => writeln!(f, "{}: no group configured in {}: root only (mode {})", n.node, self.config, n.mode)?,
            }
        }
        Ok(())
    }
}

/// `ugds access [NODE...]`: applies the configuration's group to the nodes (every ugds node when
/// none is named); nothing to do without a `group` line.
pub(super) fn access(nodes: &[String], path: &Path, json: bool) -> Res<()> {
    let host = Host::system();
    let conf = if path.exists() { config::load(path)? } else { BindConf::default() };
    let nodes: Vec<String> = if nodes.is_empty() {
        host.controllers()?.into_iter().flat_map(|c| c.ugds_nodes).collect()
    } else {
        nodes.to_vec()
    };
    let mut r = AccessReport { config: path.display().to_string(), nodes: Vec::new() };
    for n in &nodes {
        match host.resolve(n).map_err(Into::into).and_then(|addr| give(&host, &conf, n, &addr)) {
            Ok(a) => r.nodes.push(a),
            Err(e) => {
                // The nodes given before the refusal are reported, then the refusal.
                emit(&r, json)?;
                return Err(e);
            }
        }
    }
    emit(&r, json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn given(node: &str) -> NodeAccess {
        NodeAccess { node: node.into(), group: Some("ugds".into()), mode: GROUP_MODE }
    }

    #[test]
    fn access_json_holds_what_the_text_says() {
        let r = AccessReport {
            config: "/etc/ugds/bind.conf".into(),
            nodes: vec![
                given("/dev/ugds_drv0"),
                NodeAccess { node: "/dev/ugds_drv1".into(), group: None, mode: ROOT_MODE },
            ],
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"config": "/etc/ugds/bind.conf", "nodes": [
                {"node": "/dev/ugds_drv0", "group": "ugds", "mode": "0660"},
                {"node": "/dev/ugds_drv1", "group": null, "mode": "0600"}]})
        );
        assert_eq!(
            r.to_string(),
            "/dev/ugds_drv0: group ugds, mode 0660\n\
             /dev/ugds_drv1: no group configured in /etc/ugds/bind.conf: root only (mode 0600)\n"
        );
    }

    #[test]
    fn bind_config_json_names_bound_given_and_failed() {
        let r = BindReport {
            config: "b.conf".into(),
            bound: vec![
                Bound {
                    pci: "0000:03:00.0".into(),
                    node: "/dev/ugds_drv0".into(),
                    group: Some("ugds".into()),
                    mode: Some("0660"),
                },
                Bound { pci: "0000:04:00.0".into(), node: "/dev/ugds_drv1".into(), group: None, mode: None },
            ],
            failed: vec![Failed { pci: "0000:05:00.0".into(), why: "is open by pid 7 (fio)".into() }],
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"config": "b.conf",
                "bound": [
                    {"pci": "0000:03:00.0", "node": "/dev/ugds_drv0", "group": "ugds", "mode": "0660"},
                    {"pci": "0000:04:00.0", "node": "/dev/ugds_drv1", "group": null, "mode": null}],
                "failed": [{"pci": "0000:05:00.0", "why": "is open by pid 7 (fio)"}]})
        );
        assert_eq!(
            r.to_string(),
            "0000:03:00.0: bound to ugds: /dev/ugds_drv0\n/dev/ugds_drv0: group ugds, mode 0660\n\
             0000:04:00.0: bound to ugds: /dev/ugds_drv1\n"
        );
    }

    #[test]
    fn unbind_config_json_names_each_driver() {
        let r = UnbindReport {
            config: "b.conf".into(),
            released: vec![
                Released { pci: "0000:03:00.0".into(), driver: Some("nvme".into()) },
                Released { pci: "0000:04:00.0".into(), driver: None },
            ],
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"config": "b.conf", "released": [
                {"pci": "0000:03:00.0", "driver": "nvme"}, {"pci": "0000:04:00.0", "driver": null}]})
        );
        assert_eq!(r.to_string(), "0000:03:00.0: given back to nvme\n0000:04:00.0: given back to no driver\n");
    }
}
