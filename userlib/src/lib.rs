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
pub(crate) mod cmd;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fallback;
pub mod gpu;
pub(crate) mod mem;
pub(crate) mod mmio;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod pattern;
pub(crate) mod prp;
pub(crate) mod queue;
pub(crate) mod ring;
pub mod storage;
pub mod storage_batch;
pub mod stream;
pub mod stream_io;
pub(crate) mod sys;
pub mod units;

/// The queue engine's pieces for the fuzz targets and the data-path cost benchmark (feature
/// `test-utils`; not a stable API). The engine modules are crate-private: this is their only
/// way out, together with [`mock`].
#[cfg(feature = "test-utils")]
#[doc(hidden)]
pub mod test_utils {
    pub use crate::cmd::{
        Command, DatasetManagement, DmaRange, DsmRange, Flush, Read, Transfer, Write, WriteZeroes, DSM_MAX_RANGES,
    };
    pub use crate::mem::{QueueMemory, TestMemory};
    pub use crate::mmio::StatusView;
    pub use crate::mock::{Behaviour, Fault, HostileCqe, MockConfig, MockQueue, MockStats};
    pub use crate::queue::{Completion, Completions, QueuePair, Submission, MAX_BURST};
    pub use crate::ring::cq::Cq;
    pub use crate::ring::sq::{Sq, SqSlot};
}

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
