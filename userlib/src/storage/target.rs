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

/// What kind of target a name is, as the one resolver decides (the order is [`Storage::open`]'s:
/// a URI, a `stripe:` spec, a `*.ugds-volume` descriptor, a ugds node, a kernel fabrics namespace,
/// else a file or block device). For a face that treats one kind its own way (the CLI's `info`
/// prints a ugds node's controller) without a second rule for what a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetKind {
    /// An NVMe over Fabrics URI (`nvmeof://`): the remote path.
    Remote,
    /// A striped volume (`stripe:` spec or descriptor file): the direct path on every member.
    Volume,
    /// A ugds node (`/dev/ugds_drvN`): the direct path.
    Node,
    /// A namespace of the kernel's NVMe/TCP or NVMe/RDMA initiator: the remote path where we can
    /// reach its target, else the kernel's block device.
    KernelFabrics,
    /// Anything else: a file or block device (the fallback path), or nothing.
    File,
}

impl TargetKind {
    /// The kind of `name`, resolved as [`Storage::open`] resolves it (a volume descriptor is
    /// read; nothing is opened). A malformed URI or volume spec is that kind's named error; a
    /// name that is not UTF-8 is [`crate::Error::InvalidArgument`].
    pub fn of(name: impl AsRef<std::path::Path>) -> Result<TargetKind> {
        let name = crate::error::utf8_path(name.as_ref())?;
        Target::resolve(name, name, 1).map(|t| t.kind())
    }
}

impl Target {
    /// Its kind, without what it carries.
    pub(crate) fn kind(&self) -> TargetKind {
        match self {
            Target::Remote(_) => TargetKind::Remote,
            Target::Volume(_) => TargetKind::Volume,
            Target::Node => TargetKind::Node,
            Target::KernelFabrics(_) => TargetKind::KernelFabrics,
            Target::File => TargetKind::File,
        }
    }

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

    #[test]
    fn every_kind_of_name_resolves_by_one_rule() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("data.bin");
        std::fs::write(&plain, b"# ugds volume\nstripe:/dev/ugds_drv0,/dev/ugds_drv1\n").unwrap();
        let desc = dir.path().join("v.ugds-volume");
        std::fs::write(&desc, b"# ugds volume\nstripe:64K:/dev/ugds_drv0,/dev/ugds_drv1\n").unwrap();
        let (plain, desc) = (plain.to_str().unwrap(), desc.to_str().unwrap());
        let uri = "nvmeof://tcp/127.0.0.1:4420/nqn.2024-01.io.ugds:t?nsid=3";
        assert_eq!(Target::resolve(uri, uri, 1).unwrap().kind(), TargetKind::Remote);
        let stripe = Target::resolve("stripe:/dev/ugds_drv0,/dev/ugds_drv1", "", 2).unwrap();
        assert!(matches!(&stripe, Target::Volume(s) if s.nsid == 2 && s.members.len() == 2), "{stripe:?}");
        assert_eq!(stripe.nodes(""), ["/dev/ugds_drv0", "/dev/ugds_drv1"]);
        // A descriptor by its name, read where `at` leads; a file of another name is a file,
        // whatever it holds.
        let v = Target::resolve(desc, desc, 1).unwrap();
        assert!(matches!(&v, Target::Volume(s) if s.chunk == 64 << 10), "{v:?}");
        assert_eq!(Target::resolve(plain, plain, 1).unwrap().kind(), TargetKind::File);
        let f = std::fs::File::open(desc).unwrap();
        let through_fd = Target::resolve(desc, &format!("/proc/self/fd/{}", f.as_raw_fd()), 1).unwrap();
        assert_eq!(through_fd.kind(), TargetKind::Volume);
        assert!(Target::resolve(desc, plain, 1).is_ok(), "the file `at` leads to is read, not the name");
        assert_eq!(Target::resolve("/nonexistent/x", "/nonexistent/x", 1).unwrap().kind(), TargetKind::File);
        assert!(Target::File.nodes("x").is_empty());
        // Malformed names of a kind are that kind's named errors, never a file.
        assert!(Target::resolve("nvmeof://tcp/", "nvmeof://tcp/", 1).is_err());
        assert!(Target::resolve("stripe:", "stripe:", 1).is_err());
        // The public face of the same rule.
        assert_eq!(TargetKind::of(desc).unwrap(), TargetKind::Volume);
        assert_eq!(TargetKind::of(plain).unwrap(), TargetKind::File);
        assert!(TargetKind::of("stripe:").is_err());
    }
}
