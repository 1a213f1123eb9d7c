//! The system-call layer (control plane only): ioctls on `/dev/ugds_drvN` and shared mappings.
//! All of the crate's `unsafe` FFI lives here and in [`crate::mmio`].

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Argument structs that the kernel reads and writes as raw bytes.
///
/// # Safety
///
/// Implementors are `#[repr(C)]` uapi structs without padding whose every bit pattern is valid.
pub unsafe trait IoctlArg {}

// SAFETY (all): uapi structs, layout pinned by the uapi crate's assertions, no padding, all
// bit patterns valid.
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::DeviceInfo {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::CreateQpair {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::DeleteQpair {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::RegisterHost {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::RegisterDmabuf {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::GetSegments {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::Deregister {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::SetEventfd {}
// SAFETY: a plain integer (for requests without argument).
unsafe impl IoctlArg for u64 {}

/// An open `/dev/ugds_drvN`.
#[derive(Debug)]
pub struct DeviceFd(OwnedFd);

impl DeviceFd {
    /// Opens the node read-write.
    pub fn open(path: &str) -> Result<Self> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| Error::Open { path: path.to_string(), source })?;
        Ok(DeviceFd(f.into()))
    }

    /// The raw fd.
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }

    /// Issues `req` with `arg`.
    ///
    /// # Safety
    ///
    /// `req` must be a request whose argument is a `T` (the kernel reads and writes as many
    /// bytes as the request says).
    pub(crate) unsafe fn ioctl<T: IoctlArg>(&self, op: &'static str, req: u32, arg: &mut T) -> Result<i32> {
        // SAFETY: `arg` is a live, exclusive `T`, the argument type of `req` (caller); the kernel
        // validates the content.
        let r = unsafe { libc::ioctl(self.raw(), req as _, arg as *mut T) };
        if r < 0 {
            return Err(Error::Control { op, source: io::Error::last_os_error() });
        }
        Ok(r)
    }

    /// Duplicates the fd (for a second independent open, use [`DeviceFd::open`]).
    pub fn try_clone(&self) -> Result<Self> {
        // SAFETY: dup of our own fd; the new fd is owned below.
        let fd = unsafe { libc::fcntl(self.raw(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Error::Control { op: "dup", source: io::Error::last_os_error() });
        }
        // SAFETY: a fresh fd.
        Ok(DeviceFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

/// An eventfd the module signals from a queue's MSI-X interrupt.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking eventfd.
    pub fn new() -> Result<Self> {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Control { op: "eventfd", source: io::Error::last_os_error() });
        }
        // SAFETY: a fresh fd.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The raw fd.
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }

    /// Sleeps until signalled or `timeout_ms` passed, then clears the counter.
    pub fn wait(&self, timeout_ms: i32) {
        let mut p = libc::pollfd { fd: self.raw(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; errors (EINTR) just end the wait early.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a u64 from a non-blocking eventfd (EAGAIN when empty).
        unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }
}
