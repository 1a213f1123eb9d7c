//! The C faces' core. `libugds.so` (the `ugds-c` crate, `c-abi/`) exports uGDS's C API over
//! it (header `include/ugds.h`); the cuFile drop-in (`cufile-shim/`) builds NVIDIA cuFile's API
//! on the same core. Neither face's symbols are in this crate: a Rust program links none.
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

pub use batch::{timeout_of, Entry, Event, EventStatus, MAX_BATCH};
pub use fail::{code_of, CResult, Fail};
pub use handle::Handle;
pub use library::{cuda, gpu_of, hip, Face, IoKind, IoObserver, Library};
pub use options::FaceOptions;
pub use stream::{key as stream_key, LateArgs, LateSegs};
pub use types::*;
