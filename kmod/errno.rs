//! Errors the kernel crate of 6.12 has no constant for, built from the uapi errno table.

use crate::uapi::ioctl::errno;
use kernel::error::Error;

/// ETIMEDOUT: a command or the controller did not respond in time.
pub(crate) fn etimedout() -> Error {
    Error::from_errno(-errno::ETIMEDOUT)
}

/// ESTALE: the registration id exists with another generation.
pub(crate) fn estale() -> Error {
    Error::from_errno(-errno::ESTALE)
}

/// EKEYREVOKED: the dma-buf's exporter revoked the registration.
pub(crate) fn ekeyrevoked() -> Error {
    Error::from_errno(-errno::EKEYREVOKED)
}
