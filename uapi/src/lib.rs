#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! NVMe wire layouts and the ugds ioctl ABI, shared by the kernel module and user space.
//!
//! This crate is `#![no_std]` and uses no external crate in its own code: the kernel module
//! compiles the same module files (`kmod/uapi.rs` includes them by path), where no crates.io
//! crate exists. Layout checks are plain `const` assertions, valid in both places; the
//! `zerocopy` derives exist only with the `zerocopy` feature (on by default, user side only).
//! Modules refer to each other through `super::`, which resolves the same in both builds.
#![no_std]
#![deny(missing_docs)]

pub mod args;
pub mod identify;
pub mod ioctl;
pub mod log;
pub mod queue;
pub mod rdma;
pub mod regs;
pub mod status;
pub mod tcp;

pub use queue::{Cqe, Sqe};
pub use status::{Status, StatusType};
