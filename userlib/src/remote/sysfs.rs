//! A kernel NVMe over Fabrics namespace (`/dev/nvmeXnY` whose controller's transport is tcp or
//! rdma) as a target of our own: its address, service id, subsystem NQN, host NQN and host ID from sysfs, so
//! that our controller joins the same subsystem as the same host (the kernel's stays
//! connected: both are hosts of the subsystem).

use super::uri::{parse_uuid, RemoteSpec, Transport, DEFAULT_TIMEOUT_MS};
use crate::error::{Error, Result};
use std::path::Path;

/// The target behind block device `dev`, when it is a namespace of a kernel NVMe/TCP or
/// NVMe/RDMA controller; `None` for anything else.
pub(crate) fn kernel_fabrics_namespace(dev: &str) -> Option<Result<RemoteSpec>> {
    let real = std::fs::canonicalize(dev).ok()?;
    let name = real.file_name()?.to_str()?;
    if !name.starts_with("nvme") {
        return None;
    }
    spec_from_sysfs(Path::new("/sys/class/block"), name)
}

/// Whether block device `dev` is a namespace of a kernel NVMe over Fabrics controller (any
/// fabric transport: tcp, rdma, fc, loop), whether or not we can reach its target ourselves.
#[cfg(feature = "fallback")]
pub(crate) fn is_kernel_fabrics_namespace(dev: &str) -> bool {
    let Some(real) = std::fs::canonicalize(dev).ok() else { return false };
    let Some(name) = real.file_name().and_then(|n| n.to_str()) else { return false };
    fabrics_transport(Path::new("/sys/class/block"), name).is_some()
}

/// The sysfs folder of the controller behind block device `name`: its `device`, or, for the
/// head node of a multipath subsystem (CONFIG_NVME_MULTIPATH, as Debian builds it: `device` is
/// then the subsystem, without `transport`), the `device` of its first path in `multipath/`.
fn controller_dir(sys: &Path, name: &str) -> Option<std::path::PathBuf> {
    let ns = sys.join(name);
    let direct = ns.join("device");
    if direct.join("transport").exists() {
        return Some(direct);
    }
    let mut paths: Vec<_> =
        std::fs::read_dir(ns.join("multipath")).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    paths.into_iter().map(|p| p.join("device")).find(|c| c.join("transport").exists())
}

/// The transport of block device `name`'s NVMe controller when it is a fabric (not PCIe).
#[cfg(any(feature = "fallback", test))]
fn fabrics_transport(sys: &Path, name: &str) -> Option<String> {
    if !name.starts_with("nvme") {
        return None;
    }
    let t = std::fs::read_to_string(controller_dir(sys, name)?.join("transport")).ok()?;
    let t = t.trim();
    (!t.is_empty() && t != "pcie").then(|| t.to_string())
}

/// Reads `sys/NAME/nsid` and the attributes of the controller behind it ([`controller_dir`]).
fn spec_from_sysfs(sys: &Path, name: &str) -> Option<Result<RemoteSpec>> {
    let ns = sys.join(name);
    let ctrl = controller_dir(sys, name)?;
    let read = |p: &Path| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    let transport = Transport::from_name(&read(&ctrl.join("transport")).ok()?)?;
    let bad = |what: &str, v: &str| Error::DeviceProtocol(format!("{name}: the kernel's {what} {v:?} makes no sense"));
    let spec = (|| -> Result<RemoteSpec> {
        let io = |e| Error::Io { op: format!("reading the sysfs attributes of {name}"), source: e };
        let nsid_s = read(&ns.join("nsid")).map_err(io)?;
        let nsid = nsid_s.parse().map_err(|_| bad("nsid", &nsid_s))?;
        let address = read(&ctrl.join("address")).map_err(io)?;
        let field = |k: &str| address.split(',').find_map(|kv| kv.trim().strip_prefix(k)).map(str::to_string);
        let host = field("traddr=").ok_or_else(|| bad("address", &address))?;
        let port_s = field("trsvcid=").unwrap_or_else(|| super::uri::DEFAULT_PORT.to_string());
        let port = port_s.parse().map_err(|_| bad("trsvcid", &port_s))?;
        let subsysnqn = read(&ctrl.join("subsysnqn")).map_err(io)?;
        let hostnqn = read(&ctrl.join("hostnqn")).ok().filter(|s| !s.is_empty());
        let hostid = read(&ctrl.join("hostid")).ok().and_then(|s| parse_uuid(&s));
        Ok(RemoteSpec { transport, host, port, subsysnqn, nsid, hostnqn, hostid, timeout_ms: DEFAULT_TIMEOUT_MS })
    })();
    Some(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs(transport: &str, address: &str) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "ugds-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let ctrl = root.join("nvme3n2/device");
        std::fs::create_dir_all(&ctrl).unwrap();
        std::fs::write(root.join("nvme3n2/nsid"), "2\n").unwrap();
        for (f, v) in [
            ("transport", transport),
            ("address", address),
            ("subsysnqn", "nqn.2024-01.io.ugds:remote"),
            ("hostnqn", "nqn.2014-08.org.nvmexpress:uuid:abc"),
            ("hostid", "01234567-89ab-cdef-0123-456789abcdef"),
        ] {
            std::fs::write(ctrl.join(f), format!("{v}\n")).unwrap();
        }
        root
    }

    #[test]
    fn reads_a_kernel_tcp_namespace() {
        let root = fake_sysfs("tcp", "traddr=10.1.2.3,trsvcid=4421,src_addr=10.1.2.4");
        let s = spec_from_sysfs(&root, "nvme3n2").unwrap().unwrap();
        assert_eq!((s.host.as_str(), s.port, s.nsid), ("10.1.2.3", 4421, 2));
        assert_eq!(s.subsysnqn, "nqn.2024-01.io.ugds:remote");
        assert_eq!(s.host_nqn(), "nqn.2014-08.org.nvmexpress:uuid:abc");
        assert_eq!(s.hostid.unwrap()[0], 0x01);
        let _ = std::fs::remove_dir_all(root);
    }

    /// With CONFIG_NVME_MULTIPATH (Debian's kernels) `/dev/nvmeXnY` is the subsystem's head
    /// node: its `device` is the subsystem (no `transport`), and the controller is behind the
    /// path devices listed in `multipath/`.
    #[test]
    fn reads_a_multipath_head_namespace() {
        let root = fake_sysfs("tcp", "traddr=10.1.2.3,trsvcid=4421");
        let head = root.join("nvme3n2");
        // Move the controller behind a path node, as the kernel lays it out.
        let path = root.join("nvme3c3n2");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::rename(head.join("device"), path.join("device")).unwrap();
        std::fs::create_dir_all(head.join("device")).unwrap(); // the subsystem: no transport
        std::fs::create_dir_all(head.join("multipath")).unwrap();
        std::os::unix::fs::symlink(&path, head.join("multipath/nvme3c3n2")).unwrap();
        assert_eq!(fabrics_transport(&root, "nvme3n2").as_deref(), Some("tcp"));
        let s = spec_from_sysfs(&root, "nvme3n2").unwrap().unwrap();
        assert_eq!((s.host.as_str(), s.port, s.nsid), ("10.1.2.3", 4421, 2));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn other_transports_and_bad_addresses() {
        let root = fake_sysfs("pcie", "0000:00:04.0");
        assert!(spec_from_sysfs(&root, "nvme3n2").is_none());
        assert_eq!(fabrics_transport(&root, "nvme3n2"), None);
        let _ = std::fs::remove_dir_all(root);
        let root = fake_sysfs("rdma", "traddr=10.0.0.2,trsvcid=4420");
        assert_eq!(fabrics_transport(&root, "nvme3n2").as_deref(), Some("rdma"));
        assert_eq!(fabrics_transport(&root, "sda"), None);
        let _ = std::fs::remove_dir_all(root);
        let root = fake_sysfs("tcp", "trsvcid=4420");
        assert!(matches!(spec_from_sysfs(&root, "nvme3n2"), Some(Err(Error::DeviceProtocol(_)))));
        let _ = std::fs::remove_dir_all(root);
        assert!(kernel_fabrics_namespace("/nonexistent/nvme9n1").is_none());
        let root = fake_sysfs("rdma", "traddr=10.9.0.1,trsvcid=4420");
        let s = spec_from_sysfs(&root, "nvme3n2").unwrap().unwrap();
        assert_eq!((s.transport, s.host.as_str(), s.port), (Transport::Rdma, "10.9.0.1", 4420));
        let _ = std::fs::remove_dir_all(root);
    }
}
