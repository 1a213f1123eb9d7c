//! What a name given to ugds is: the one target resolver. Every face (the Rust [`Storage`]
//! constructors, the C and cuFile handle registration, the CLI, Python and the engine plugins)
//! asks it, so a name means the same thing, in the same order, whatever opened it.

use super::Storage;
use crate::device::{Device, DeviceOptions};
use crate::error::Result;
use crate::remote::RemoteSpec;
use crate::volume::VolumeSpec;
use std::sync::Arc;

/// What a target is, decided in this order: an NVMe over Fabrics URI (`nvmeof://`), a striped
/// volume spec (`stripe:`), a volume descriptor file (by its name: `*.ugds-volume`), a ugds node
/// (by its sysfs class), a namespace of the kernel's NVMe over Fabrics initiator (by sysfs), and
/// anything else a file or block device for the fallback path.
#[derive(Debug)]
pub(crate) enum Target {
    /// The remote path through our own initiator.
    Remote(RemoteSpec),
    /// The direct path on every member of a striped volume.
    Volume(VolumeSpec),
    /// The direct path on a controller bound to ugds.
    Node,
    /// A namespace of the kernel's NVMe/TCP or NVMe/RDMA initiator: our own controller on the
    /// same subsystem when sysfs says where it is (the error otherwise), else the kernel's
    /// block device.
    KernelFabrics(Result<RemoteSpec>),
    /// Anything else: a file or block device, or nothing (the fallback path says which).
    File,
}

impl Target {
    /// Resolves the target `name` (the name the caller gave), looking at the file through `at`:
    /// `name` itself, or `/proc/self/fd/N` when the caller gave a descriptor it opened (then the
    /// file read is the one the descriptor leads to). `nsid` is the namespace a volume's members
    /// use; a URI names its own.
    pub(crate) fn resolve(name: &str, at: &str, nsid: u32) -> Result<Target> {
        if name.starts_with(crate::remote::uri::SCHEME) {
            return Ok(Target::Remote(RemoteSpec::parse(name)?));
        }
        if name.starts_with("stripe:") {
            return Ok(Target::Volume(VolumeSpec { nsid, ..VolumeSpec::parse(name)? }));
        }
        if let Some(spec) = VolumeSpec::descriptor_target(name, at)? {
            return Ok(Target::Volume(VolumeSpec { nsid, ..spec }));
        }
        if crate::device::is_ugds_node(at) {
            return Ok(Target::Node);
        }
        if let Some(spec) = crate::remote::sysfs::kernel_fabrics_namespace(at) {
            return Ok(Target::KernelFabrics(spec));
        }
        Ok(Target::File)
    }

    /// Opens every kind but [`Target::File`] (`name` as resolved, namespace `nsid` of a node,
    /// `opts` for a node's or a volume's controllers); `None` for a file or block device, which
    /// each face opens its own way (by name, or through the caller's descriptor), and for a
    /// kernel fabrics namespace whose target we cannot reach ourselves (noted: the kernel's
    /// block device serves it then).
    pub(crate) fn open(self, name: &str, nsid: u32, opts: &DeviceOptions) -> Result<Option<Arc<Storage>>> {
        crate::fork::watch()?;
        match self {
            Target::Remote(spec) => Storage::remote(&spec).map(Some),
            Target::Volume(spec) => Storage::volume(&spec, opts).map(Some),
            Target::Node => Storage::direct(&Device::open_with(name, opts.clone())?, nsid).map(Some),
            Target::KernelFabrics(spec) => match spec.and_then(|s| Storage::remote(&s)) {
                Ok(st) => Ok(Some(st)),
                Err(e) => {
                    crate::data_path::note_fallback(
                        name,
                        "the kernel's NVMe over Fabrics block device",
                        &e.to_string(),
                    );
                    Ok(None)
                }
            },
            Target::File => Ok(None),
        }
    }

    /// The ugds nodes the target's direct path uses: a node itself, a volume's members; none
    /// for the other kinds.
    pub(crate) fn nodes(&self, name: &str) -> Vec<String> {
        match self {
            Target::Node => vec![name.to_string()],
            Target::Volume(spec) => spec.members.clone(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn kind(t: &Target) -> &'static str {
        match t {
            Target::Remote(_) => "remote",
            Target::Volume(_) => "volume",
            Target::Node => "node",
            Target::KernelFabrics(_) => "kernel fabrics",
            Target::File => "file",
        }
    }

    #[test]
    fn every_kind_of_name_resolves_by_one_rule() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("data.bin");
        std::fs::write(&plain, b"# ugds volume\nstripe:/dev/ugds_drv0,/dev/ugds_drv1\n").unwrap();
        let desc = dir.path().join("v.ugds-volume");
        std::fs::write(&desc, b"# ugds volume\nstripe:64K:/dev/ugds_drv0,/dev/ugds_drv1\n").unwrap();
        let (plain, desc) = (plain.to_str().unwrap(), desc.to_str().unwrap());
        let uri = "nvmeof://tcp/127.0.0.1:4420/nqn.2024-01.io.ugds:t?nsid=3";
        assert_eq!(kind(&Target::resolve(uri, uri, 1).unwrap()), "remote");
        let stripe = Target::resolve("stripe:/dev/ugds_drv0,/dev/ugds_drv1", "", 2).unwrap();
        assert!(matches!(&stripe, Target::Volume(s) if s.nsid == 2 && s.members.len() == 2), "{stripe:?}");
        assert_eq!(stripe.nodes(""), ["/dev/ugds_drv0", "/dev/ugds_drv1"]);
        // A descriptor by its name, read where `at` leads; a file of another name is a file,
        // whatever it holds.
        let v = Target::resolve(desc, desc, 1).unwrap();
        assert!(matches!(&v, Target::Volume(s) if s.chunk == 64 << 10), "{v:?}");
        assert_eq!(kind(&Target::resolve(plain, plain, 1).unwrap()), "file");
        let f = std::fs::File::open(desc).unwrap();
        let through_fd = Target::resolve(desc, &format!("/proc/self/fd/{}", f.as_raw_fd()), 1).unwrap();
        assert_eq!(kind(&through_fd), "volume");
        assert!(Target::resolve(desc, plain, 1).is_ok(), "the file `at` leads to is read, not the name");
        assert_eq!(kind(&Target::resolve("/nonexistent/x", "/nonexistent/x", 1).unwrap()), "file");
        assert!(Target::File.nodes("x").is_empty());
        // Malformed names of a kind are that kind's named errors, never a file.
        assert!(Target::resolve("nvmeof://tcp/", "nvmeof://tcp/", 1).is_err());
        assert!(Target::resolve("stripe:", "stripe:", 1).is_err());
    }
}
