//! Typed errors. Each names what was wrong and why; NVMe failures carry the decoded status.

use ugds_uapi::Status;

/// Everything that can go wrong in ugds.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening the device node failed.
    #[error("opening {path}: {source}")]
    Open {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The node is held exclusively by another opener, or an exclusive open found others.
    #[error("{path} is busy: {why}")]
    DeviceBusy {
        /// The path.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// A path given where a ugds node was expected is something else.
    #[error("{path} is {what}, not a ugds node (a character device of the class ugds_drv): {fix}")]
    NotUgdsNode {
        /// The path.
        path: String,
        /// What it is.
        what: String,
        /// What to do.
        fix: &'static str,
    },
    /// The kernel module speaks another ABI version.
    #[error("kernel module ABI {kernel} does not match the library's {library}: load the matching ugds.ko")]
    AbiMismatch {
        /// The module's version.
        kernel: u32,
        /// Ours.
        library: u32,
    },
    /// A control call to the module failed.
    #[error("{op} failed: {source}")]
    Control {
        /// The operation (`CREATE_QPAIR`, `REGISTER_HOST`, ...).
        op: &'static str,
        /// The errno.
        source: std::io::Error,
    },
    /// An argument was invalid; nothing was submitted.
    #[error("invalid argument `{arg}`: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// No such namespace.
    #[error("namespace {0} does not exist on this controller")]
    NoNamespace(u32),
    /// The controller completed a command with an error status.
    #[error("NVMe {op} at LBA {slba} failed: {status}")]
    Nvme {
        /// The command ("read", "write", ...).
        op: &'static str,
        /// Its starting LBA.
        slba: u64,
        /// The decoded status.
        status: Status,
    },
    /// A command did not complete in time.
    #[error("NVMe {op} at LBA {slba} did not complete within {timeout_ms} ms")]
    Timeout {
        /// The command.
        op: &'static str,
        /// Its starting LBA.
        slba: u64,
        /// The deadline.
        timeout_ms: u64,
    },
    /// The module refused an admin command: only Identify (0x06), Get Log Page (0x02) and Get
    /// Features (0x0A) pass (docs/health.md says why); nothing reached the controller.
    #[error(
        "admin opcode {opcode:#04x} is refused: ugds passes only Identify, Get Log Page and Get Features \
         (the others could change the controller, its data or its settings)"
    )]
    AdminOpcodeRefused {
        /// The opcode.
        opcode: u8,
    },
    /// The controller completed an admin command with an error status.
    #[error("admin command {opcode:#04x} failed: {status}")]
    AdminFailed {
        /// The opcode.
        opcode: u8,
        /// The decoded status.
        status: Status,
    },
    /// The controller is faulted (a reset is needed or in progress).
    #[error("the controller is faulted; it must be reset before further I/O")]
    DeviceFaulted,
    /// The controller was reset since this queue last saw it: in-flight commands were lost.
    #[error("the controller was reset (epoch {old} -> {new}); commands in flight were lost, retry")]
    EpochChanged {
        /// The epoch this queue knew.
        old: u64,
        /// The current epoch.
        new: u64,
    },
    /// The kernel allows no peer-to-peer DMA between the controller and the device whose memory
    /// a dma-buf holds (PCIe topology, ACS redirection, a host bridge it does not trust): nothing
    /// was registered.
    #[error(
        "the kernel allows no peer-to-peer DMA between this controller and the dma-buf's device \
         (topology, ACS or host bridge; `ugds doctor` shows the route): nothing was registered"
    )]
    PeerToPeerRefused,
    /// The dma-buf's exporter revoked the memory (its device was reset, or the memory moved or
    /// was disabled): the controller was reset first, so no command reached it afterwards.
    #[error(
        "the dma-buf's exporter revoked this memory (its device was reset or the memory went away); deregister it"
    )]
    Revoked,
    /// The registration still has commands in flight.
    #[error("registration {id} has {inflight} command(s) in flight")]
    RegistrationBusy {
        /// Registration id.
        id: u32,
        /// Commands in flight.
        inflight: u32,
    },
    /// The device returned something impossible (unknown or duplicate command id, ...).
    #[error("device protocol violation: {0}")]
    DeviceProtocol(String),
    /// A GPU runtime call failed.
    #[error("{op} failed: {reason}")]
    Gpu {
        /// The runtime call.
        op: &'static str,
        /// The runtime's error name.
        reason: String,
    },
    /// This machine cannot do what was asked; `fix` says what would make it possible.
    #[error("{what} is not possible here: {why}; {fix}")]
    Unsupported {
        /// What was attempted.
        what: &'static str,
        /// Why it cannot work.
        why: String,
        /// What to do about it.
        fix: &'static str,
    },
    /// A member of a striped volume failed; `source` says how.
    #[error("volume member {member} at byte {offset}: {source}")]
    Member {
        /// The member's node.
        member: String,
        /// The byte offset on the member.
        offset: u64,
        /// What went wrong there.
        source: Box<Error>,
    },
    /// An NVMe over Fabrics target could not be reached: the connection was refused, the
    /// address is unreachable (no route, no RDMA device for it), or nothing answered within the
    /// connect timeout.
    #[error("NVMe over Fabrics target {target} is unreachable: {source}")]
    RemoteUnreachable {
        /// `HOST:PORT`.
        target: String,
        /// Why.
        source: std::io::Error,
    },
    /// The target refused the connection: the Fabrics Connect failed (no such subsystem, this
    /// host is not allowed) or, on RDMA, the RDMA CM connect request was rejected.
    #[error("NVMe over Fabrics target {target} refused the connection to {subsysnqn}: {reason} ({status})")]
    RemoteRejected {
        /// `HOST:PORT`.
        target: String,
        /// The subsystem asked for.
        subsysnqn: String,
        /// What the status means.
        reason: &'static str,
        /// The status that said no.
        status: Rejection,
    },
    /// The target broke the transport's protocol (NVMe/TCP: an unknown PDU type, a bad length,
    /// data outside a command's range, a termination request; NVMe/RDMA: a response for a
    /// command not in flight, a short response); the connection was closed and the commands on
    /// it failed.
    #[error("NVMe over Fabrics target {target} broke the protocol: {reason}")]
    RemoteProtocol {
        /// `HOST:PORT`.
        target: String,
        /// What was wrong.
        reason: String,
    },
    /// The connection to the target broke or stalled past the timeout; the commands on it
    /// failed (none is retried behind the caller's back).
    #[error("NVMe over Fabrics connection to {target} failed during {op}: {source}")]
    RemoteTransport {
        /// `HOST:PORT`.
        target: String,
        /// What was under way.
        op: String,
        /// Why.
        source: std::io::Error,
    },
    /// The object was made by the parent process before `fork()`: its queues, doorbells, rings,
    /// connections and registrations belong to the parent, and nothing was touched. Open the
    /// device (or file, volume, target) again in the child and register memory there.
    #[error("this {object} was created by the parent process before fork(); open the device again in the child")]
    ForkedChild {
        /// What was used (`storage`, `buffer`, `device`, `batch`, `stream`, ...).
        object: &'static str,
    },
    /// A system call of the fallback path failed.
    #[error("{op}: {source}")]
    Io {
        /// The operation and its target.
        op: String,
        /// The errno.
        source: std::io::Error,
    },
}

/// Why a target refused a connection ([`Error::RemoteRejected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The Fabrics Connect command's completion status.
    Connect(Status),
    /// The NVMe/RDMA status in an RDMA CM reject's private data (`sts`: invalid queue ID, host
    /// queue sizes, no resources, ...), with the CM's own reject reason.
    RdmaCm {
        /// The NVMe/RDMA reject status.
        sts: u16,
        /// The RDMA CM event's status (the CM reject reason).
        cm_status: i32,
    },
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Connect(s) => write!(f, "{s}"),
            Rejection::RdmaCm { sts, cm_status } => {
                write!(f, "RDMA CM reject, NVMe/RDMA status {sts:#x}, CM reason {cm_status}")
            }
        }
    }
}

/// `path` as text: the library names its targets in errors, notes and sysfs lookups as
/// strings, so a path that is not UTF-8 is refused by name (nothing is opened).
pub(crate) fn utf8_path(path: &std::path::Path) -> Result<&str> {
    path.to_str().ok_or_else(|| Error::invalid("path", format!("{} is not valid UTF-8", path.display())))
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(arg: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { arg, reason: reason.into() }
    }

    /// The error itself, without the volume member that reported it ([`Error::Member`]).
    pub fn root(&self) -> &Error {
        match self {
            Error::Member { source, .. } => source.root(),
            e => e,
        }
    }

    /// The negative errno that stands for this error in result slots and the C ABI.
    pub fn errno(&self) -> i32 {
        let e = match self {
            Error::Open { source, .. } | Error::Control { source, .. } | Error::Io { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            Error::AbiMismatch { .. } => libc::EPROTO,
            Error::DeviceBusy { .. } => libc::EBUSY,
            Error::InvalidArgument { .. } => libc::EINVAL,
            Error::NoNamespace(_) | Error::NotUgdsNode { .. } => libc::ENODEV,
            Error::Nvme { .. } | Error::DeviceProtocol(_) | Error::Gpu { .. } => libc::EIO,
            Error::AdminOpcodeRefused { .. } => libc::EACCES,
            Error::AdminFailed { .. } => libc::EIO,
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::DeviceFaulted | Error::EpochChanged { .. } => libc::EAGAIN,
            Error::RegistrationBusy { .. } => libc::EBUSY,
            Error::PeerToPeerRefused => libc::EXDEV,
            Error::Revoked => libc::EKEYREVOKED,
            Error::Unsupported { .. } => libc::EOPNOTSUPP,
            Error::Member { source, .. } => return source.errno(),
            Error::RemoteUnreachable { source, .. } => {
                source.raw_os_error().unwrap_or(if source.kind() == std::io::ErrorKind::TimedOut {
                    libc::ETIMEDOUT
                } else {
                    libc::EHOSTUNREACH
                })
            }
            Error::RemoteTransport { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::RemoteRejected { .. } => libc::ECONNREFUSED,
            Error::RemoteProtocol { .. } => libc::EPROTO,
            // "File descriptor in bad state": the handle is the parent's.
            Error::ForkedChild { .. } => libc::EBADFD,
        };
        -e
    }

    /// The [`std::io::ErrorKind`] this error is an instance of: the system's own for a failed
    /// system call or connection, else the kind whose meaning it shares (a busy registration
    /// is `ResourceBusy`, a reset that lost commands `Interrupted`: retry).
    pub fn kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            Error::Open { source, .. }
            | Error::Control { source, .. }
            | Error::Io { source, .. }
            | Error::RemoteUnreachable { source, .. }
            | Error::RemoteTransport { source, .. } => source.kind(),
            Error::Member { source, .. } => source.kind(),
            Error::InvalidArgument { .. } | Error::NotUgdsNode { .. } => K::InvalidInput,
            Error::NoNamespace(_) => K::NotFound,
            Error::DeviceBusy { .. } | Error::RegistrationBusy { .. } => K::ResourceBusy,
            Error::AdminOpcodeRefused { .. } => K::PermissionDenied,
            Error::Timeout { .. } => K::TimedOut,
            Error::EpochChanged { .. } => K::Interrupted,
            Error::Unsupported { .. } | Error::PeerToPeerRefused => K::Unsupported,
            Error::Revoked => K::NotConnected,
            Error::RemoteRejected { .. } => K::ConnectionRefused,
            Error::RemoteProtocol { .. } | Error::DeviceProtocol(_) => K::InvalidData,
            Error::AbiMismatch { .. }
            | Error::Nvme { .. }
            | Error::AdminFailed { .. }
            | Error::DeviceFaulted
            | Error::Gpu { .. }
            | Error::ForkedChild { .. } => K::Other,
        }
    }
}

/// An [`Error`] as an I/O error of kind [`Error::kind`], for code that speaks `std::io`: the
/// ugds error is its inner error (`get_ref`, `into_inner`, `downcast`), so its message and its
/// source chain stay as they were.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(e.kind(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind as K;

    #[test]
    fn an_error_becomes_an_io_error_of_its_kind_and_keeps_itself() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let open = Error::Open { path: "/dev/ugds_drv0".into(), source: refused };
        let io: std::io::Error = open.into();
        assert_eq!(io.kind(), K::ConnectionRefused);
        let os = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
        assert_eq!(io.to_string(), format!("opening /dev/ugds_drv0: {os}"));
        let inner = io.get_ref().and_then(|e| e.downcast_ref::<Error>()).expect("the ugds error inside");
        assert!(matches!(inner, Error::Open { .. }));
        // The chain goes on below it: the system's error is the source.
        let src = std::error::Error::source(inner).expect("a source");
        assert_eq!(src.to_string(), os);

        let kind = |e: Error| std::io::Error::from(e).kind();
        assert_eq!(kind(Error::invalid("len", "zero")), K::InvalidInput);
        assert_eq!(kind(Error::NoNamespace(3)), K::NotFound);
        assert_eq!(kind(Error::RegistrationBusy { id: 1, inflight: 2 }), K::ResourceBusy);
        assert_eq!(kind(Error::Timeout { op: "read", slba: 0, timeout_ms: 1 }), K::TimedOut);
        assert_eq!(kind(Error::EpochChanged { old: 1, new: 2 }), K::Interrupted);
        assert_eq!(kind(Error::DeviceFaulted), K::Other);
        let member =
            Error::Member { member: "/dev/ugds_drv1".into(), offset: 0, source: Box::new(Error::NoNamespace(1)) };
        assert_eq!(kind(member), K::NotFound);
    }
}
