//! [`Fail`]: why a C-face call failed, before each face turns it into its own codes.

use super::types::uGDSError;
use super::types::uGDSOpError::{self, *};
use super::Face;
use crate::error::Error;
use std::ffi::c_int;

/// Why a call failed, before a face turns it into its codes.
#[derive(Debug)]
pub enum Fail {
    /// A library status code.
    Code(uGDSOpError),
    /// An errno (read/write return it negated).
    Errno(c_int),
    /// An error of the layer below, mapped by [`Fail::code`] / [`Fail::errno`].
    Lib(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Lib(e)
    }
}

impl From<Error> for crate::inflight::Failed<Fail> {
    fn from(e: Error) -> Self {
        Fail::Lib(e).into()
    }
}

impl Fail {
    /// As a status code.
    pub fn code(&self) -> uGDSOpError {
        match self {
            Fail::Code(c) => *c,
            Fail::Errno(e) if *e == libc::ENOMEM => UGDS_OUT_OF_MEMORY,
            Fail::Errno(e) if *e == libc::EBUSY => UGDS_BUSY,
            Fail::Errno(_) => UGDS_INVALID_VALUE,
            Fail::Lib(e) => code_of(e),
        }
    }

    /// As a status.
    pub fn status(&self) -> uGDSError {
        uGDSError { err: self.code(), cu_err: 0 }
    }

    /// As a read/write result for `face`: uGDS reports errnos only (a library condition becomes
    /// the errno it stands for); cuFile also `-code`.
    pub fn ret_for(&self, face: Face) -> libc::ssize_t {
        if face == Face::CuFile {
            return self.ret();
        }
        let errno = match self {
            Fail::Errno(e) => *e,
            Fail::Lib(e) => -e.errno(),
            Fail::Code(UGDS_MEMORY_NOT_REGISTERED | UGDS_INVALID_VALUE) => libc::EINVAL,
            Fail::Code(UGDS_BUSY) => libc::EBUSY,
            // A read through a write-only descriptor (or the reverse), as read(2) says it.
            Fail::Code(UGDS_INVALID_FILE_OPEN_FLAG) => libc::EBADF,
            Fail::Code(UGDS_OUT_OF_MEMORY) => libc::ENOMEM,
            Fail::Code(_) => libc::EIO,
        };
        -(errno.max(1) as libc::ssize_t)
    }

    /// As a read/write return value: `-errno`, or `-code` for library codes.
    pub fn ret(&self) -> libc::ssize_t {
        match self {
            Fail::Code(c) => -(*c as libc::ssize_t),
            Fail::Errno(e) => -(*e as libc::ssize_t),
            Fail::Lib(e) => e.errno() as libc::ssize_t,
        }
    }
}

/// The status code for an error of the layer below.
pub fn code_of(e: &Error) -> uGDSOpError {
    match e {
        Error::InvalidArgument { .. } => UGDS_INVALID_VALUE,
        Error::RegistrationBusy { .. } => UGDS_BUSY,
        Error::Open { .. } | Error::NoNamespace(_) => UGDS_DEVICE_NOT_FOUND,
        Error::AbiMismatch { .. } => UGDS_DRIVER_VERSION_MISMATCH,
        Error::Gpu { .. } => UGDS_CUDA_DRIVER_ERROR,
        Error::Unsupported { .. } => UGDS_IO_NOT_SUPPORTED,
        Error::Control { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => UGDS_OUT_OF_MEMORY,
        Error::Control { .. } => UGDS_NVFS_DRIVER_ERROR,
        // The library holds nothing of this process's for the object: a child of fork() opens
        // the driver, its handles and its buffers again (uGDS and cuFile name it so).
        Error::ForkedChild { .. } => UGDS_DRIVER_NOT_INITIALIZED,
        _ => UGDS_INTERNAL_ERROR,
    }
}

/// Result of the core functions.
pub type CResult<T> = Result<T, Fail>;
