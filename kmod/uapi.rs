//! The shared `ugds-uapi` sources, compiled into the module unchanged (no external crates exist
//! here; the zerocopy derives sit behind a cargo feature that is off in this build).
#![allow(dead_code, unreachable_pub)]

#[path = "../uapi/src/args.rs"]
pub(crate) mod args;
#[path = "../uapi/src/identify.rs"]
pub(crate) mod identify;
#[path = "../uapi/src/ioctl.rs"]
pub(crate) mod ioctl;
#[path = "../uapi/src/queue.rs"]
pub(crate) mod queue;
#[path = "../uapi/src/regs.rs"]
pub(crate) mod regs;
#[path = "../uapi/src/status.rs"]
pub(crate) mod status;

use crate::shim::Plain;
use identify::{IdentifyController, IdentifyNamespace, LbaFormat};
use ioctl::{
    AdminCommand, CreateQpair, DeleteQpair, Deregister, DeviceInfo, GetSegments, ListOpeners, Opener, RegisterDmabuf,
    RegisterHost, Reset, Segment, SetEventfd, StatusPage,
};
use queue::{Cqe, Sqe};

/// Marks spec and ABI layouts as [`Plain`]: copied from and to user space (ioctl arguments) or
/// living in DMA memory (queue entries, Identify data, the status page).
macro_rules! plain {
    ($($t:ty),* $(,)?) => {
        // SAFETY: `#[repr(C)]` structs of integers, integer arrays and such structs, whose sizes
        // and offsets the uapi const assertions pin down, with explicit reserved or padding
        // fields (so no implicit padding); any bits are a valid value.
        $(unsafe impl Plain for $t {})*
    };
}

plain!(
    AdminCommand,
    DeviceInfo,
    CreateQpair,
    DeleteQpair,
    RegisterHost,
    RegisterDmabuf,
    GetSegments,
    Deregister,
    Segment,
    SetEventfd,
    Reset,
    ListOpeners,
    Opener,
    StatusPage,
    Sqe,
    Cqe,
    IdentifyController,
    IdentifyNamespace,
    LbaFormat,
);
