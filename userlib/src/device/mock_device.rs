//! A [`Device`] over the in-memory device model (host tests, and the cost benchmark's
//! synchronous-read mode): its one queue pair is the mock's and its control-plane node is
//! `/dev/null`, so every ioctl fails: a controller reset cannot confirm that anything stopped,
//! and deregistering does nothing.

use super::*;
use crate::buffer::{Mem, Path};
use crate::data_path::Registered;
use crate::mem::HostMemory;
use crate::mock::{MockConfig, MockDevice, MockQueue};
use crate::{Buffer, Storage, StorageBatch};

/// A device over a mock made as `cfg` says, with per-command deadline `timeout`.
pub(crate) fn mock_device(cfg: MockConfig, timeout: Duration) -> Result<(Device, MockDevice)> {
    let (dev, qp, mock) = device_over(cfg, timeout, true, Vec::new())?;
    debug_assert!(qp.is_none());
    Ok((dev, mock))
}

/// A device over a mock made as `cfg` says whose one queue pair is handed back apart, for a
/// queue batch of the test's own ([`crate::queue_batch::QueueBatch::over`]): the device itself
/// has no synchronous queue pair, so nothing but that batch may do I/O on it.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) fn mock_batch_device(cfg: MockConfig, timeout: Duration) -> Result<(Device, QueuePair, MockDevice)> {
    let (dev, qp, mock) = device_over(cfg, timeout, false, Vec::new())?;
    let qp = qp.ok_or_else(|| Error::invalid("cfg", "the mock's queue pair was kept"))?;
    Ok((dev, qp, mock))
}

/// A device over a mock made as `cfg` says, with `n` per-thread queues, each over a mock of its
/// own made alike (returned in slot order). The mocks' status pages are apart: the device reads
/// the first one's, so a test resets every mock to reset "the controller". A read on a thread's
/// queue lands in its own mock's host memory, at the offset the buffer names.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) fn mock_device_with_thread_queues(
    cfg: MockConfig,
    n: usize,
    timeout: Duration,
) -> Result<(Device, MockDevice, Vec<MockDevice>)> {
    let mut thread = Vec::new();
    let mut mocks = Vec::new();
    for _ in 0..n {
        let (qp, _status, _doorbells, mock) = MockQueue::with(cfg.clone())?.into_parts();
        thread.push(qp);
        mocks.push(mock);
    }
    let (dev, _, mock) = device_over(cfg, timeout, true, thread)?;
    Ok((dev, mock, mocks))
}

/// A device over a new mock; its queue pair is the device's own when `keep`, else returned.
/// `thread` are its per-thread queues.
fn device_over(
    cfg: MockConfig,
    timeout: Duration,
    keep: bool,
    thread: Vec<QueuePair>,
) -> Result<(Device, Option<QueuePair>, MockDevice)> {
    let (block_size, blocks, depth) = (cfg.block_size, cfg.blocks, cfg.depth);
    let (qp, status, doorbells, mock) = MockQueue::with(cfg)?.into_parts();
    let (queues, spare) = if keep { (vec![qp], None) } else { (Vec::new(), Some(qp)) };
    let mut info = blank_info();
    info.abi_version = ABI_VERSION;
    info.max_qpairs = 1;
    info.max_queue_entries = depth;
    info.num_namespaces = 1;
    // CAST: a power of two below 2^13.
    let lba_shift = block_size.trailing_zeros() as u8;
    info.namespaces[0] = NamespaceInfo { nsid: 1, lba_shift, size_lbas: blocks, ..Default::default() };
    let inner = Inner {
        fd: Arc::new(DeviceFd::open("/dev/null", false)?),
        born: crate::fork::watch()?,
        info,
        status: std::mem::ManuallyDrop::new(status),
        doorbells: std::mem::ManuallyDrop::new(doorbells),
        queues: std::mem::ManuallyDrop::new(queues),
        threads: std::mem::ManuallyDrop::new(Arc::new(ThreadQueues::new(0, thread))),
        timeout,
        max_cmd_bytes: MAX_CMD_BYTES,
        dptr: DptrPolicy::PRP_ONLY,
        wait: super::WaitPolicy { mode: crate::Waiting::Poll, spin_max_bytes: u64::MAX },
    };
    Ok((Device { inner: Arc::new(inner) }, spare, mock))
}

/// A host buffer of `st` whose registration names all of the mock's host memory.
pub(crate) fn mock_buffer(st: &Storage, dev: &Device, mock: &MockDevice) -> Result<Buffer> {
    let reg = Registration {
        dev: dev.inner.clone(),
        handle: RegistrationHandle::default(),
        segments: SegmentTable::new(mock.segments().to_vec()),
        live: None,
    };
    let len = mock.host_len();
    let mem = HostMemory::new(len)?;
    let ptr = mem.as_ptr();
    let r = Registered { regs: vec![reg], staging: None, path: Path::DirectHost };
    Ok(st.buffer(Mem::Host { ptr, len, own: Some(mem) }, r))
}

/// A host buffer of `st` registered on every member of a volume over mocks (in member order):
/// each registration names all of its mock's host memory, so what member `m` reads lands in
/// mock `m`'s host memory at the buffer offset.
pub(crate) fn mock_volume_buffer(st: &Storage, members: &[(&Device, &MockDevice)]) -> Result<Buffer> {
    let regs: Vec<Registration> = members
        .iter()
        .map(|(dev, mock)| Registration {
            dev: dev.inner.clone(),
            handle: RegistrationHandle::default(),
            segments: SegmentTable::new(mock.segments().to_vec()),
            live: None,
        })
        .collect();
    let len = members.iter().map(|(_, m)| m.host_len()).min().unwrap_or(0);
    let mem = HostMemory::new(len)?;
    let ptr = mem.as_ptr();
    let r = Registered { regs, staging: None, path: Path::DirectHost };
    Ok(st.buffer(Mem::Host { ptr, len, own: Some(mem) }, r))
}

/// A [`Storage`] on a namespace of the in-memory device, with a buffer registered on it, whose
/// device runs on the caller's thread each time a wait of this thread polls and finds nothing:
/// a synchronous read then costs the same instructions every time (the cost benchmark counts
/// them). Namespace 1, the mock's geometry; one shared queue pair.
pub struct MockStorage {
    /// The storage (the direct path on the mock's namespace 1).
    pub storage: Arc<Storage>,
    /// A buffer registered on it, over all of the mock's host memory.
    pub buffer: Buffer,
    device: MockDevice,
    /// The other models it runs on, kept alive with it: the per-thread queues' (the ones
    /// stepped) and a volume's further members'.
    _kept: Vec<MockDevice>,
}

impl std::fmt::Debug for MockStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MockStorage({} bytes of host memory)", self.device.host_len())
    }
}

impl MockStorage {
    /// A stepped mock made as `cfg` says (its `stepped` is forced on), answering waits of the
    /// calling thread.
    pub fn stepped(cfg: MockConfig) -> Result<Self> {
        let (dev, device) = mock_device(MockConfig { stepped: true, ..cfg }, Duration::from_secs(5))?;
        let storage = Storage::direct(&dev, 1)?;
        let buffer = mock_buffer(&storage, &dev, &device)?;
        device.step_on_idle_polls();
        Ok(MockStorage { storage, buffer, device, _kept: Vec::new() })
    }

    /// [`MockStorage::stepped`] whose device has one per-thread queue (over a mock of its own,
    /// the one stepped): the calling thread's reads claim it, as a thread does where the
    /// controller has queues to spare. The shared queue's mock is never stepped.
    pub fn stepped_thread_queue(cfg: MockConfig) -> Result<Self> {
        let cfg = MockConfig { stepped: true, ..cfg };
        let (dev, device, thread) = mock_device_with_thread_queues(cfg, 1, Duration::from_secs(5))?;
        let storage = Storage::direct(&dev, 1)?;
        let buffer = mock_buffer(&storage, &dev, &device)?;
        thread.iter().for_each(MockDevice::step_on_idle_polls);
        Ok(MockStorage { storage, buffer, device, _kept: thread })
    }

    /// [`MockStorage::stepped_thread_queue`] through a striped volume of `members` members
    /// (128 KiB chunks), each over a model of its own, all stepped on the caller's idle polls: a
    /// request over chunks of several members takes the volume's lanes (one of a one-member
    /// volume is its member's request).
    pub fn stepped_thread_queue_volume(cfg: MockConfig, members: usize) -> Result<Self> {
        let cfg = MockConfig { stepped: true, ..cfg };
        let (mut paths, mut names, mut pairs, mut threads) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for m in 0..members {
            let (dev, device, thread) = mock_device_with_thread_queues(cfg.clone(), 1, Duration::from_secs(5))?;
            paths.push(crate::direct::DirectPath { ns: dev.namespace(1)?, dev: dev.clone() });
            names.push(format!("m{m}"));
            pairs.push((dev, device));
            threads.extend(thread);
        }
        let vol = crate::volume::VolumePath::over(paths, names, crate::volume::DEFAULT_CHUNK)?;
        let storage = Storage::over_volume(vol)?;
        let regs: Vec<(&Device, &MockDevice)> = pairs.iter().map(|(d, m)| (d, m)).collect();
        let buffer = mock_volume_buffer(&storage, &regs)?;
        crate::mock::stop_stepping_on_idle_polls();
        threads.iter().for_each(MockDevice::also_step_on_idle_polls);
        // `over` refused an empty volume: there is a first member.
        let mut members = pairs.into_iter().map(|(_, m)| m);
        let device = members.next().ok_or_else(|| crate::Error::invalid("members", "none"))?;
        threads.extend(members);
        Ok(MockStorage { storage, buffer, device, _kept: threads })
    }
}

/// A [`StorageBatch`] on the device model's queue pair, the model stepped on this thread each
/// time the batch's wait finds nothing (the cost benchmark's batch mode), with a buffer
/// registered over all of the model's host memory.
#[cfg(any(test, feature = "test-utils"))]
pub struct MockBatch {
    /// The batch (dropped first: it waits for what it has in flight).
    pub batch: StorageBatch,
    /// The buffer.
    pub buffer: Arc<Buffer>,
    device: MockDevice,
}

#[cfg(any(test, feature = "test-utils"))]
impl MockBatch {
    /// A batch of `capacity` entries over a stepped model made as `cfg` says (its `stepped` is
    /// forced on, and its depth is the batch's ring).
    pub fn stepped(cfg: MockConfig, capacity: usize) -> Result<Self> {
        Self::over_model(cfg, capacity, StorageBatch::over_queue)
    }

    /// [`MockBatch::stepped`] through a one-member striped volume's batch (128 KiB chunks) on
    /// the same kind of model: each entry becomes its pieces, then entries of the member's
    /// queue batch, so the difference from [`MockBatch::stepped`] is the volume layer's own cost.
    pub fn stepped_volume(cfg: MockConfig, capacity: usize) -> Result<Self> {
        let pieces = crate::volume_batch::member_depth(capacity, u32::MAX);
        Self::over_model(cfg, pieces, |storage, member| {
            let chunk = crate::volume::DEFAULT_CHUNK;
            let vol = crate::volume_batch::VolumeQueueBatch::over(vec![member], vec!["m0".into()], chunk, capacity);
            StorageBatch::over_volume(storage, vol, capacity)
        })
    }

    /// A stepped model whose queue pair holds `entries`, a queue batch on it, and the storage
    /// batch `make` builds over that.
    fn over_model(
        cfg: MockConfig,
        entries: usize,
        make: impl FnOnce(&Arc<Storage>, crate::queue_batch::QueueBatch) -> Result<StorageBatch>,
    ) -> Result<Self> {
        let depth = crate::queue_batch::ring_depth(entries, 4096)?;
        let cfg = MockConfig { stepped: true, depth, ..cfg };
        let (dev, qp, device) = mock_batch_device(cfg, Duration::from_secs(5))?;
        let storage = Storage::direct(&dev, 1)?;
        let buffer = Arc::new(mock_buffer(&storage, &dev, &device)?);
        let ns = dev.namespace(1)?;
        let batch = make(&storage, crate::queue_batch::QueueBatch::over(&dev, &ns, qp, entries, 0))?;
        device.step_on_idle_polls();
        Ok(MockBatch { batch, buffer, device })
    }

    /// From now on each step of the model posts at most `n` completions: commands finish a few
    /// at a time, as on a device with many in flight, rather than all at once.
    pub fn post_at_most(&self, n: usize) {
        self.device.post_at_most(n);
    }

    /// Sets or clears the status page's faulted flag (the queue's calls fail while it is set).
    pub fn set_faulted(&self, on: bool) {
        self.device.set_faulted(on);
    }

    /// Sets the status page's faulted flag from another thread once `after` passed.
    pub fn fault_after(&self, after: Duration) -> std::thread::JoinHandle<()> {
        self.device.fault_after(after)
    }

    /// Whether the model steps on this thread's idle polls (it does from the start): while it
    /// does not, what the batch submitted stays in flight.
    pub fn step_on_idle_polls(&self, on: bool) {
        if on {
            self.device.step_on_idle_polls();
        } else {
            crate::mock::stop_stepping_on_idle_polls();
        }
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl Drop for MockBatch {
    fn drop(&mut self) {
        // While the model still steps on this thread's idle polls: what is in flight completes.
        let _ = self.batch.cancel();
        crate::mock::stop_stepping_on_idle_polls();
    }
}

impl Drop for MockStorage {
    fn drop(&mut self) {
        crate::mock::stop_stepping_on_idle_polls();
    }
}
