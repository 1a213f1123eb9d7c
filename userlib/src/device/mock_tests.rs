//! The direct path over the in-memory device model: a [`Device`] whose queue pair is the mock's
//! and whose control-plane node is `/dev/null`, so every ioctl fails: a controller reset cannot
//! confirm that anything stopped, and deregistering does nothing.

use super::*;
use crate::buffer::{Mem, Path};
use crate::data_path::Registered;
use crate::mem::HostMemory;
use crate::mock::{Behaviour, Fault, MockConfig, MockDevice, MockQueue};
use crate::{Buffer, Storage};

/// A device over a mock made as `cfg` says, with per-command deadline `timeout`.
fn mock_device(cfg: MockConfig, timeout: Duration) -> (Device, MockDevice) {
    let (block_size, blocks, depth) = (cfg.block_size, cfg.blocks, cfg.depth);
    let (qp, status, doorbells, mock) = MockQueue::with(cfg).unwrap().into_parts();
    let mut info = blank_info();
    info.abi_version = ABI_VERSION;
    info.max_qpairs = 1;
    info.max_queue_entries = depth;
    info.num_namespaces = 1;
    // CAST: a power of two below 2^13.
    let lba_shift = block_size.trailing_zeros() as u8;
    info.namespaces[0] = NamespaceInfo { nsid: 1, lba_shift, size_lbas: blocks, ..Default::default() };
    let inner = Inner {
        fd: Arc::new(DeviceFd::open("/dev/null", false).unwrap()),
        born: crate::fork::watch().unwrap(),
        info,
        status: std::mem::ManuallyDrop::new(status),
        doorbells: std::mem::ManuallyDrop::new(doorbells),
        queues: std::mem::ManuallyDrop::new(vec![qp]),
        timeout,
        max_cmd_bytes: MAX_CMD_BYTES,
        dptr: DptrPolicy::PRP_ONLY,
        wait: super::WaitPolicy { mode: crate::Waiting::Poll, spin_max_bytes: u64::MAX },
    };
    (Device { inner: Arc::new(inner) }, mock)
}

/// A host buffer of `st` whose registration names all of the mock's host memory.
fn mock_buffer(st: &Storage, dev: &Device, mock: &MockDevice) -> Buffer {
    let reg = Registration {
        dev: dev.inner.clone(),
        handle: RegistrationHandle::default(),
        segments: mock.segments().to_vec(),
        live: None,
    };
    let len = mock.host_len();
    let mem = HostMemory::new(len).unwrap();
    let ptr = mem.as_ptr();
    let r = Registered { regs: vec![reg], staging: None, path: Path::DirectHost };
    st.buffer(Mem::Host { ptr, len, own: Some(mem) }, r)
}

/// A read that times out, with a reset that cannot confirm the controller stopped, leaves its
/// memory in flight: the buffer's lease is kept, deregistration is refused by name, and dropping
/// the buffer keeps its registration (the module's pin, here the device reference it holds)
/// instead of releasing it. A read that completes releases both as usual.
#[test]
fn a_stranded_command_keeps_its_registration() {
    let cfg = MockConfig { behaviour: Behaviour::Script(vec![Fault::Never]), ..MockConfig::default() };
    let (dev, mock) = mock_device(cfg, Duration::from_millis(50));
    let st = Storage::direct(&dev, 1).unwrap();
    let refs = Arc::strong_count(&dev.inner);
    let buf = mock_buffer(&st, &dev, &mock);
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "the registration holds the device");
    let e = st.read(&buf, 0, 0, 4096).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(buf.inflight(), 1, "the stranded read's lease is kept");
    let (buf, e) = *buf.deregister().unwrap_err();
    assert!(matches!(e, Error::RegistrationBusy { inflight: 1, .. }), "{e:?}");
    drop(buf);
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "the registration was released");
    let ok = mock_buffer(&st, &dev, &mock);
    assert_eq!(st.read(&ok, 0, 8192, 4096).unwrap(), 4096);
    assert_eq!(ok.inflight(), 0);
    drop(ok);
    assert_eq!(Arc::strong_count(&dev.inner), refs + 1, "only the stranded registration is kept");
}
