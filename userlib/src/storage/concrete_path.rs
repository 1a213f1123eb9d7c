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

/// Evaluates `$body` with `$p` bound to the concrete path behind `$path` (a `&ConcretePath`),
/// typed as its own kind: the calls in `$body` are static and inline, where
/// [`ConcretePath::data_path`]'s are virtual. For the per-I/O path, whose checks and call
/// otherwise made five virtual calls and five matches per request.
macro_rules! with_path {
    ($path:expr, $p:ident => $body:expr) => {
        match $path {
            $crate::storage::concrete_path::ConcretePath::Direct($p) => $body,
            $crate::storage::concrete_path::ConcretePath::Volume($p) => $body,
            $crate::storage::concrete_path::ConcretePath::Remote($p) => $body,
            #[cfg(feature = "fallback")]
            $crate::storage::concrete_path::ConcretePath::File($p) => $body,
        }
    };
}
pub(crate) use with_path;

impl ConcretePath {
    /// The path as the one trait every kind implements.
    #[inline]
    pub(crate) fn data_path(&self) -> &dyn DataPath {
        with_path!(self, p => p)
    }
}
