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
