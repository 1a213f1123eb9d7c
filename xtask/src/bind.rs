//! `cargo xtask bind` / `unbind`: hand an NVMe controller from the kernel nvme driver to ugds
//! and back. The logic and its refusals are the library's (`ugds::sysfs`, shared with the
//! installed `ugds bind`/`unbind`); these are its callers on this machine's sysfs.

use anyhow::Result;
use ugds::sysfs::Host;
pub use ugds::sysfs::{describe_refused, md_build_line, volume_spec, Bound, Refused, Released};

/// Resolves a node, namespace, controller device or PCI address to the controller's PCI address.
pub fn resolve(target: &str) -> Result<String> {
    Ok(Host::system().resolve(target)?)
}

/// The ugds nodes (`ugds_drvN`) of a controller bound to ugds.
pub fn ugds_nodes(addr: &str) -> Vec<String> {
    Host::system().ugds_nodes(addr)
}

/// Binds one controller to ugds (refused when in use). Returns its PCI address.
pub fn bind(target: &str) -> Result<String> {
    Ok(Host::system().bind(target)?)
}

/// Gives one controller back to the kernel nvme driver. Returns its PCI address.
pub fn unbind(target: &str) -> Result<String> {
    Ok(Host::system().unbind(target)?)
}

/// Every NVMe-class PCI device, in PCI order.
pub fn nvme_controllers() -> Result<Vec<String>> {
    Ok(Host::system().nvme_controllers()?)
}

/// The block device of namespace 1 of a controller the kernel drives.
pub fn first_namespace(addr: &str) -> Option<String> {
    Host::system().first_namespace(addr)
}

/// Binds several controllers (all or nothing for a named list; `all`: the free ones).
pub fn bind_many(targets: &[String], all: bool) -> Result<(Vec<Bound>, Refused)> {
    Ok(Host::system().bind_many(targets, all)?)
}

/// Gives several controllers back to the kernel (`all`: every one bound to ugds).
pub fn unbind_many(targets: &[String], all: bool) -> Result<Vec<Released>> {
    Ok(Host::system().unbind_many(targets, all)?)
}
