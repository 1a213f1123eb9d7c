#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! ugds: user-space GPU Direct Storage. The CPU builds NVMe commands in queues the kernel
//! module mapped into this process, and the SSD moves the data by DMA into registered host or
//! GPU (dma-buf) memory. No system call is made on the I/O path.
//!
//! ```no_run
//! let dev = ugds::Device::open("/dev/ugds_drv0")?;
//! let ns = dev.namespace(1)?;
//! let mut buf = dev.alloc(1 << 20)?;
//! ns.read(&mut buf, 0, 0, 1 << 20)?;
//! # Ok::<(), ugds::Error>(())
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod capi;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fallback;
pub mod gpu;
pub mod mmio;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod pattern;
pub mod prp;
pub mod queue;
pub mod storage;
pub mod storage_batch;
pub mod stream;
pub mod stream_io;
pub mod sys;
pub mod units;

pub use batch::{Batch, IoEvent, IoParams, IoStatus, Op};
pub use device::{Device, DeviceOptions, HostView, Namespace, Registration};
pub use error::{Error, Result};
pub use fallback::FileTarget;
pub use gpu::{Gpu, GpuMemory};
pub use storage::{Buffer, Path, PathCounts, Storage};
pub use storage_batch::{IoRequest, StorageBatch};
pub use stream::{CpuStream, Stream};
pub use stream_io::{AsyncArgs, AsyncOp, AsyncParams, StreamIo};
pub use ugds_uapi as uapi;
