//! The system-call layer (control plane only): typed ioctls on `/dev/ugds_drvN` and eventfds.
//! Its `unsafe` FFI, with [`crate::mmio`]'s and [`crate::mem`]'s, is all the crate's system-call
//! and mapping code.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Argument structs that the kernel reads and writes as raw bytes.
///
/// # Safety
///
/// Implementors are `#[repr(C)]` uapi structs without padding whose every bit pattern is valid
/// (or `()`, for requests without argument).
pub unsafe trait IoctlArg {}

// SAFETY (for each impl below): a uapi struct whose layout the uapi crate's assertions pin, with
// no padding and only integer fields, so every bit pattern is valid.
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
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::Reset {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::AdminCommand {}
// SAFETY: see above.
unsafe impl IoctlArg for ugds_uapi::ioctl::ListOpeners {}
// SAFETY: zero-sized: the kernel reads nothing through the pointer (the request's size is 0).
unsafe impl IoctlArg for () {}

/// An ioctl request of the module's ABI, tied to its argument type: `fd.ioctl(req, &mut arg)`
/// with a mismatched pair does not compile.
///
/// # Safety
///
/// The kernel must read and write at most `size_of::<Arg>()` bytes through the argument
/// pointer for request number `REQ`.
pub unsafe trait Request: Copy {
    /// The request number.
    const REQ: u32;
    /// Its name, for errors.
    const NAME: &'static str;
    /// Its argument.
    type Arg: IoctlArg;
}

/// A request that is memory-safe for every argument value: the kernel validates the contents,
/// and its effect reaches no memory of this process beyond the argument itself.
///
/// # Safety
///
/// Implement only for such requests. The others ([`req::GetSegments`], [`req::Deregister`])
/// carry a contract in their `# Safety` section and go through [`DeviceFd::ioctl_unchecked`].
pub unsafe trait SafeRequest: Request {}

/// The module's requests, one type each.
pub mod req {
    use super::{Request, SafeRequest};
    use ugds_uapi::ioctl as abi;

    macro_rules! request {
        ($(#[$doc:meta])* $name:ident, $req:expr, $arg:ty, $safe:ident) => {
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;
            // SAFETY: the uapi request number is built from `size_of` of this argument type
            // (uapi's `ioc`), and the module copies exactly that many bytes.
            unsafe impl Request for $name {
                const REQ: u32 = $req;
                const NAME: &'static str = stringify!($name);
                type Arg = $arg;
            }
            request!(@safe $name, $safe);
        };
        (@safe $name:ident, safe) => {
            // SAFETY: the module validates every field of the argument; the request touches no
            // memory of this process but the argument (see the request's doc).
            unsafe impl SafeRequest for $name {}
        };
        (@safe $name:ident, unsafe) => {};
    }

    request!(
        /// Fill a `DeviceInfo`.
        GetInfo, abi::IOCTL_GET_INFO, abi::DeviceInfo, safe
    );
    request!(
        /// Create an I/O queue pair (the module allocates and owns its memory).
        CreateQpair, abi::IOCTL_CREATE_QPAIR, abi::CreateQpair, safe
    );
    request!(
        /// Delete a queue pair: the controller completes or aborts its commands first, and the
        /// module revokes this process's mappings of it.
        DeleteQpair, abi::IOCTL_DELETE_QPAIR, abi::DeleteQpair, safe
    );
    request!(
        /// Pin and DMA-map host memory of this process. The device touches it only when a
        /// command names its segments, which takes an `unsafe` [`crate::cmd::DmaRange`].
        RegisterHost, abi::IOCTL_REGISTER_HOST, abi::RegisterHost, safe
    );
    request!(
        /// Attach and map a dma-buf (same rule as `RegisterHost` for commands).
        RegisterDmabuf, abi::IOCTL_REGISTER_DMABUF, abi::RegisterDmabuf, safe
    );
    request!(
        /// Copy a registration's segments to the argument's `segments` pointer.
        ///
        /// # Safety
        ///
        /// `segments` must point to `count` writable [`abi::Segment`]s that nothing else
        /// references during the call.
        GetSegments, abi::IOCTL_GET_SEGMENTS, abi::GetSegments, unsafe
    );
    request!(
        /// Unpin and unmap a registration.
        ///
        /// # Safety
        ///
        /// No command naming the registration may still run (none in flight, or the controller
        /// was reset after the last one): the device would write memory that is no longer ours.
        Deregister, abi::IOCTL_DEREGISTER, abi::Deregister, unsafe
    );
    request!(
        /// Attach an eventfd to a queue's MSI-X vector.
        SetEventfd, abi::IOCTL_SET_EVENTFD, abi::SetEventfd, safe
    );
    request!(
        /// Arm a queue's interrupt: one-shot from then on (it signals the eventfd once, then
        /// stays masked until the next arm).
        ArmIrq, abi::IOCTL_ARM_IRQ, abi::DeleteQpair, safe
    );
    request!(
        /// Reset the controller (disable, wait for CSTS.RDY=0, re-enable) unless a reset ended
        /// since the epoch passed; every queue pair is left deleted on the controller until its
        /// owner re-arms it.
        Reset, abi::IOCTL_RESET, abi::Reset, safe
    );
    request!(
        /// Re-create a queue pair on the controller after a reset, its rings zeroed.
        RearmQpair, abi::IOCTL_REARM_QPAIR, abi::DeleteQpair, safe
    );
    request!(
        /// Run one allowed admin command (Identify, Get Log Page, Get Features) on the module's
        /// admin queue; the module copies `data_len` bytes of its result to `data`.
        ///
        /// # Safety
        ///
        /// With a non-zero `data_len`, `data` must point to `data_len` writable bytes that
        /// nothing else references during the call.
        AdminCmd, abi::IOCTL_ADMIN_CMD, abi::AdminCommand, unsafe
    );
    request!(
        /// Copy the controller's open files (who opened each, what it owns) to `openers`.
        ///
        /// # Safety
        ///
        /// `openers` must point to `capacity` writable [`abi::Opener`]s that nothing else
        /// references during the call.
        ListOpeners, abi::IOCTL_LIST_OPENERS, abi::ListOpeners, unsafe
    );
}

/// An open `/dev/ugds_drvN`.
#[derive(Debug)]
pub struct DeviceFd(OwnedFd);

impl DeviceFd {
    /// Opens the node read-write, close-on-exec (a program it executes gets nothing of it);
    /// `exclusive`: with `O_EXCL`, so the module refuses every other opener while this one is
    /// open (`EBUSY`), and this open while others are.
    pub fn open(path: &str, exclusive: bool) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | if exclusive { libc::O_EXCL } else { 0 })
            .open(path)
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EBUSY) if exclusive => Error::DeviceBusy {
                    path: path.to_string(),
                    why: "other processes have it open, and an exclusive open needs it alone",
                },
                Some(libc::EBUSY) => {
                    Error::DeviceBusy { path: path.to_string(), why: "another process holds it exclusively" }
                }
                _ => Error::Open { path: path.to_string(), source },
            })?;
        Ok(DeviceFd(f.into()))
    }

    /// The raw fd.
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }

    /// Issues a request that is safe for any argument.
    pub(crate) fn ioctl<R: SafeRequest>(&self, _req: R, arg: &mut R::Arg) -> Result<i32> {
        // SAFETY: `arg` is a live, exclusive `R::Arg`, the argument type of `R::REQ` (`Request`'s
        // contract); the request has no other effect on our memory (`SafeRequest`'s).
        unsafe { self.raw_ioctl(R::NAME, R::REQ, arg) }
    }

    /// Issues a request whose safety depends on the argument's meaning.
    ///
    /// # Safety
    ///
    /// The contract in `R`'s `# Safety` section holds for `arg`.
    pub(crate) unsafe fn ioctl_unchecked<R: Request>(&self, _req: R, arg: &mut R::Arg) -> Result<i32> {
        // SAFETY: `arg` is `R`'s argument type (`Request`'s contract); the request's own contract
        // is the caller's.
        unsafe { self.raw_ioctl(R::NAME, R::REQ, arg) }
    }

    /// # Safety
    ///
    /// `req` must be a request whose argument is a `T`, and its effects must be sound.
    unsafe fn raw_ioctl<T: IoctlArg>(&self, op: &'static str, req: u32, arg: &mut T) -> Result<i32> {
        // SAFETY: `arg` is a live, exclusive `T`, the argument type of `req`, whose effects are
        // sound (caller); the kernel validates the content.
        let r = unsafe { libc::ioctl(self.raw(), req as _, arg as *mut T) };
        if r < 0 {
            return Err(Error::Control { op, source: io::Error::last_os_error() });
        }
        Ok(r)
    }
}

/// An eventfd the module signals from a queue's MSI-X interrupt.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

#[cfg(test)]
thread_local! {
    /// Eventfd signals made by this thread (tests count wake-ups with it).
    pub(crate) static SIGNALS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

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

    /// Signals it (wakes its sleepers), as the interrupt does.
    pub fn signal(&self) {
        #[cfg(test)]
        SIGNALS.with(|s| s.set(s.get() + 1));
        let v = 1u64;
        // SAFETY: writing 8 bytes from a u64 to an eventfd; a full counter (EAGAIN) is signalled
        // already.
        unsafe { libc::write(self.raw(), (&v as *const u64).cast(), 8) };
    }

    /// Sleeps until signalled or `timeout_ms` passed, then clears the counter (with a
    /// timeout of 0, only clears it: one system call, not two).
    pub fn wait(&self, timeout_ms: i32) {
        if timeout_ms != 0 {
            let mut p = libc::pollfd { fd: self.raw(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; errors (EINTR) just end the wait early.
            unsafe { libc::poll(&mut p, 1, timeout_ms) };
        }
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a u64 from a non-blocking eventfd (EAGAIN when empty).
        unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }
}
