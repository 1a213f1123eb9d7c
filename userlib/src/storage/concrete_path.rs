//! The data path a [`super::Storage`] holds, by its concrete kind: the one place that names the
//! implementations of [`DataPath`], so the trait's file names none of them. Layers that need a
//! kind's own API (a batch's queue pair on a namespace or on each volume member, a ring on a
//! file, an owned queue pair) match on the kind; everything the kinds share goes through
//! [`ConcretePath::data_path`].

use crate::data_path::DataPath;
use crate::direct::DirectPath;
#[cfg(feature = "fallback")]
use crate::fallback::FileTarget;
use crate::remote::RemotePath;
use crate::volume::VolumePath;

/// The concrete data path behind a storage.
#[derive(Debug)]
pub(crate) enum ConcretePath {
    /// A namespace of a controller bound to ugds.
    Direct(DirectPath),
    /// A striped volume over namespaces of controllers bound to ugds.
    Volume(VolumePath),
    /// A namespace of an NVMe over Fabrics target, through our own initiator.
    Remote(RemotePath),
    /// A file or block device owned by the kernel (the fallback path).
    #[cfg(feature = "fallback")]
    File(FileTarget),
}

impl ConcretePath {
    /// The path as the one trait every kind implements.
    #[inline]
    pub(crate) fn data_path(&self) -> &dyn DataPath {
        match self {
            ConcretePath::Direct(p) => p,
            ConcretePath::Volume(p) => p,
            ConcretePath::Remote(p) => p,
            #[cfg(feature = "fallback")]
            ConcretePath::File(p) => p,
        }
    }
}
