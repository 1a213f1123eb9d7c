//! What a face's configuration sets in the core: cuFile's parameters and `cufile.json` become
//! a [`FaceOptions`] that the drop-in hands to [`Library::set_options`]; uGDS keeps the
//! defaults. Handles read them when they are registered, batches when they are set up, and
//! synchronous I/O at each call.

use super::library::Library;
use crate::device::DeviceOptions;

/// The core's settings for one face.
#[derive(Debug, Clone)]
pub struct FaceOptions {
    /// How a handle opens a ugds node or a volume's members: entries per queue, per-command
    /// deadline, polling or interrupts.
    pub device: DeviceOptions,
    /// Whether a file or block device may be registered (it takes the fallback path: cuFile's
    /// compatibility mode). When false its registration is `UGDS_IO_NOT_SUPPORTED`.
    pub fallback: bool,
    /// The largest piece one synchronous read or write is issued in: a larger one runs as
    /// several pieces, one after the other (cuFile's `max_direct_io_size_kb`).
    pub max_io_bytes: usize,
    /// The most entries one batch may be set up for.
    pub max_batch: usize,
}

impl Default for FaceOptions {
    fn default() -> Self {
        FaceOptions {
            device: DeviceOptions::default(),
            fallback: true,
            max_io_bytes: usize::MAX,
            max_batch: super::batch::MAX_BATCH,
        }
    }
}

impl Library {
    /// Sets the options the handles, batches and I/O made from now on use (handles registered
    /// earlier keep their queues; the I/O size limit applies at once).
    pub fn set_options(&self, o: FaceOptions) {
        self.max_io_bytes.store(o.max_io_bytes.max(1), std::sync::atomic::Ordering::Relaxed);
        *self.options.write().unwrap_or_else(|e| e.into_inner()) = o;
    }

    /// The current options.
    pub fn options(&self) -> FaceOptions {
        self.options.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
