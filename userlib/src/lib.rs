#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! ugds: user-space GPU Direct Storage. The CPU builds NVMe commands in queues the kernel
//! module mapped into this process, and the SSD moves the data by DMA into registered host or
//! GPU (dma-buf) memory. No system call is made on the I/O path.
//!
//! One stack: a [`Storage`] (a ugds node: the direct path; a file or block device: the fallback
//! path) and [`Buffer`]s registered for it; sync I/O, [`StorageBatch`] and stream-ordered
//! [`StreamIo`] over them; the C, cuFile and Python faces over those.
//!
//! ```no_run
//! let st = ugds::Storage::open("/dev/ugds_drv0")?;
//! let buf = st.alloc_host(1 << 20)?;
//! st.read(&buf, 0, 0, 1 << 20)?;
//! assert_eq!(buf.host_view()?.len(), 1 << 20);
//! # Ok::<(), ugds::Error>(())
//! ```
#![deny(missing_docs)]

#[cfg(test)]
mod alloc_count;
pub mod batch;
pub mod buffer;
// Public only for the C faces (`c-abi/`, `cufile-shim/`) and their tests: their shared core,
// not a Rust API (Rust code uses `Storage`, `Buffer` and the batches).
#[cfg(feature = "fallback")]
#[doc(hidden)]
pub mod capi;
pub(crate) mod cmd;
pub(crate) mod data_path;
pub mod device;
mod direct;
pub(crate) mod dl;
pub mod doctor;
pub mod engine;
pub mod error;
#[cfg(feature = "fallback")]
pub mod fallback;
#[cfg(feature = "fallback")]
mod fallback_batch;
pub(crate) mod fork;
pub mod gpu;
pub mod health;
mod inflight;
pub mod logging;
pub(crate) mod mem;
pub(crate) mod mmio;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod pattern;
pub mod placement;
pub(crate) mod prp;
pub(crate) mod queue;
mod queue_batch;
pub mod remote;
pub(crate) mod ring;
pub(crate) mod sgl;
mod staging_pipeline;
pub mod storage;
pub mod storage_batch;
mod stream_dispatch;
pub mod stream_io;
// Only the fallback path's GPU reads leave their copies running.
#[cfg_attr(not(feature = "fallback"), allow(dead_code))]
mod stream_tail;
pub(crate) mod sys;
pub mod sysfs;
pub mod units;
pub mod volume;
mod volume_batch;

/// The queue engine's pieces for the fuzz targets and the data-path cost benchmark (feature
/// `test-utils`; not a stable API). The engine modules are crate-private: this is their only
/// way out, together with [`mock`].
#[cfg(feature = "test-utils")]
#[doc(hidden)]
pub mod test_utils {
    pub use crate::cmd::{
        Command, DatasetManagement, DmaRange, DsmRange, Flush, Read, Transfer, Write, WriteZeroes, DSM_MAX_RANGES,
    };
    pub use crate::device::mock_device::{MockBatch, MockStorage};
    pub use crate::mem::{smaps_kb, QueueMemory, TestMemory};
    pub use crate::mmio::StatusView;
    pub use crate::mock::{Behaviour, Fault, HostileCqe, MockConfig, MockQueue, MockStats};
    pub use crate::queue::{Completion, Completions, QueuePair, Submission, Ticket, MAX_BURST};
    #[cfg(feature = "rdma")]
    pub use crate::remote::harness::{rdma_drive, RdmaEvent};
    pub use crate::remote::harness::{tcp_exchange, HarnessData, HarnessDone};
    pub use crate::ring::cq::Cq;
    pub use crate::ring::sq::{Sq, SqSlot};
}

pub use batch::{IoEvent, IoStatus, Op};
pub use buffer::{Buffer, HostView, Path};
pub use device::{DataPointers, Device, DeviceOptions, Namespace};
pub use error::{Error, Rejection, Result};
#[cfg(feature = "fallback")]
pub use fallback::FileTarget;
/// The stream abstraction ([`gpu::stream`], beside the runtimes that implement it), kept at
/// `ugds::stream` too for code that names it there.
pub use gpu::stream;
pub use gpu::stream::{CpuStream, Stream};
pub use gpu::{Gpu, GpuMemory};
pub use inflight::kept as in_flight_kept;
pub use mem::HostMemory;
pub use queue::Waiting;
pub use storage::{OwnedQueue, PathCounts, Storage};
pub use storage_batch::{IoRequest, StorageBatch};
pub use stream_io::{AsyncArgs, AsyncOp, AsyncParams, StreamIo};
pub use ugds_uapi as uapi;
pub use volume::VolumeSpec;
