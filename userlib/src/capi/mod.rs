//! The C faces. `libugds.so` exports uGDS's C API ([`ugds_abi`], header `include/ugds.h`);
//! the cuFile drop-in (`cufile-shim/`) builds NVIDIA cuFile's API on the same core.
//!
//! The core ([`Library`]) holds one face's state: handles (each a never-reused record whose
//! first `int` is the registered descriptor, looked up in a table, so a stale or forged value
//! is an error, never a dereference), buffers registered on every handle at registration time,
//! batches and CPU streams in generation-checked tables, and the streams the face has queued
//! I/O on. Where the two APIs differ, [`Face`] decides; every core function returns a typed
//! [`Fail`] that each face maps to its codes.

mod batch;
mod fail;
mod handle;
mod io;
mod library;
mod options;
mod rdma;
mod slots;
mod stream;
pub mod types;
#[cfg(feature = "c-abi")]
pub mod ugds_abi;

pub use batch::{timeout_of, Entry, Event, EventStatus, MAX_BATCH};
pub use fail::{code_of, CResult, Fail};
pub use handle::Handle;
pub use library::{cuda, gpu_of, hip, Face, IoKind, IoObserver, Library};
pub use options::FaceOptions;
pub use stream::{key as stream_key, LateArgs};
pub use types::*;
