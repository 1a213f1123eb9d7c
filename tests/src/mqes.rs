//! Queue depth follows CAP.MQES (issue 14): a controller that allows only 128 entries per queue
//! (MQES 127, as some cloud controllers report) opens with default options, refuses deeper
//! queue pairs by name, and moves data correctly through batches that fit one queue and through
//! batches that do not (those run on the storage's worker threads).
//!
//! Bookworm's QEMU 7.2 cannot set MQES; this variant runs on the QEMU 10 that `ci/setup.sh`
//! caches (`cargo xtask vm` picks it for controllers with `mqes=`).

use crate::kmod::bound_node;
use crate::raw::{errno_of, HostBuf, RawDev};
use crate::{direct_read, ensure_that, nvme_controllers, nvme_name, sh, xtask, Test};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;
use ugds::{pattern, Buffer, Device, DeviceOptions, Error, IoRequest, IoStatus, Op, Storage, StorageBatch};
use ugds_uapi::ioctl::errno;
use ugds_uapi::queue::nvm;

const V: &str = "small-mqes";

/// The variant's controller: MQES 127 (0's based), i.e. 128 entries per queue.
pub const NVME: &[&str] = &["size=64M,mqes=127"];

/// Entries per queue the controller allows (MQES + 1).
const ENTRIES: u32 = 128;

/// The small-MQES tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "mqes_127_reported_as_128_entries", variant: V, run: reported },
        Test { name: "mqes_default_open_works_depth_129_refused_128_works", variant: V, run: depth_limit },
        Test { name: "mqes_raw_qpair_129_refused_128_holds_127_commands", variant: V, run: raw_qpair },
        Test { name: "mqes_batches_of_64_native_and_200_pooled_kernel_reads_same", variant: V, run: batches },
    ]
}

fn unbind() -> Result<()> {
    let a = nvme_controllers()?[0].clone();
    let (ok, out) = xtask(&["unbind", &a])?;
    ensure_that!(ok, "unbind: {out}");
    Ok(())
}

/// The module (its probe log and GET_INFO), the library and the CLI all say 128 entries.
fn reported() -> Result<()> {
    let node = bound_node(0)?;
    let log = sh("dmesg")?;
    ensure_that!(log.contains(&format!("(MQES {ENTRIES},")), "the probe log does not say MQES {ENTRIES}");
    let dev = Device::open(&node)?;
    let got = dev.info().max_queue_entries;
    ensure_that!(got == ENTRIES, "max_queue_entries {got}, expected {ENTRIES}");
    drop(dev);
    let cli = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let info = sh(&format!("{cli} --json info {node}"))?;
    ensure_that!(info.contains(&format!("\"max_queue_entries\":{ENTRIES}")), "ugds info: {info}");
    unbind()
}

fn expect_depth_refused(r: ugds::Result<Device>) -> Result<()> {
    match r {
        Err(Error::InvalidArgument { arg: "depth", reason }) => {
            ensure_that!(reason.contains(&ENTRIES.to_string()), "the reason does not name the limit: {reason}");
            Ok(())
        }
        other => anyhow::bail!("depth {}: expected InvalidArgument(depth), got {:?}", ENTRIES + 1, other.map(|_| ())),
    }
}

/// Writes `len` bytes of `pattern(seed)` at `off` through `st` and reads them back.
fn round_trip(st: &Storage, seed: u64, off: u64, len: u64) -> Result<()> {
    let buf = st.alloc_host(len as usize)?;
    pattern::fill(seed, off, &mut buf.host_view()?);
    ensure_that!(st.write(&buf, 0, off, len)? == len, "short write");
    buf.host_view()?.fill(0);
    ensure_that!(st.read(&buf, 0, off, len)? == len, "short read");
    ensure_that!(pattern::first_mismatch(seed, off, &buf.host_view()?).is_none(), "data at {off} differs");
    Ok(())
}

/// Default options open (the default depth follows MQES); depth 129 is refused by name before
/// anything reaches the kernel; depth 128, the controller's maximum, works.
fn depth_limit() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node).context("Device::open with default options")?;
    round_trip(&*Storage::direct(&dev, 1)?, 1, 0, 1 << 20)?;
    drop(dev);
    let st = Storage::open(&node).context("Storage::open with default options")?;
    ensure_that!(st.is_direct(), "{node} did not take the direct path: {}", st.describe());
    round_trip(&st, 2, 1 << 20, 1 << 20)?;
    drop(st);
    let opts = |depth| DeviceOptions { depth, ..Default::default() };
    expect_depth_refused(Device::open_with(&node, opts(ENTRIES + 1)))?;
    let dev = Device::open_with(&node, opts(ENTRIES)).context("depth 128")?;
    round_trip(&*Storage::direct(&dev, 1)?, 3, 2 << 20, 1 << 20)?;
    drop(dev);
    unbind()
}

/// The module refuses a 129-entry queue pair (EINVAL); a 128-entry one is created on the
/// controller and holds 127 commands in flight (a full queue) that all complete.
fn raw_qpair() -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    ensure_that!(dev.info.max_queue_entries == ENTRIES, "GET_INFO max_queue_entries {}", dev.info.max_queue_entries);
    match dev.create_qpair(ENTRIES + 1) {
        Ok(q) => anyhow::bail!("a {}-entry queue pair was created (qid {})", ENTRIES + 1, q.qid),
        Err(e) => ensure_that!(errno_of(&e) == errno::EINVAL, "depth {}: {e}, expected EINVAL", ENTRIES + 1),
    }
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(ENTRIES)?;
    let n = ENTRIES as usize - 1;
    let mut buf = HostBuf::new(n * 4096)?;
    let data = crate::pattern(14, n * 4096);
    buf.bytes_mut().copy_from_slice(&data);
    let h = dev.register(buf.addr(), buf.bytes().len() as u64)?;
    let segs = dev.segments(h)?;
    for op in [nvm::WRITE, nvm::READ] {
        if op == nvm::READ {
            buf.bytes_mut().fill(0);
        }
        for i in 0..n as u64 {
            qp.push_rw(op, &ns, (i * 4096) >> ns.lba_shift, &segs, i * 4096, 4096)?;
        }
        // One doorbell for all 127: the queue is full.
        qp.ring();
        let cqes = qp.wait(n, Duration::from_secs(30))?;
        ensure_that!(cqes.len() == n, "{} of {n} completions", cqes.len());
        if let Some(c) = cqes.iter().find(|c| !c.status().is_success()) {
            anyhow::bail!("a command of the full queue failed: {}", c.status());
        }
    }
    ensure_that!(buf.bytes() == &data[..], "127 reads from a full queue returned different data");
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    drop((dev, buf));
    unbind()?;
    let addr = nvme_controllers()?[0].clone();
    let back = direct_read(&format!("/dev/{}n1", nvme_name(&addr)?), 0, data.len())?;
    ensure_that!(back == data, "the kernel nvme driver reads different data than the full queue wrote");
    Ok(())
}

/// Entry `i` of a batch: `len` bytes at buffer offset `i * len` and device offset `base + 2 * i *
/// len` (gaps between entries, so a misplaced write shows).
fn entries(op: Op, buf: &Arc<Buffer>, n: usize, len: u64, base: u64) -> Vec<IoRequest> {
    (0..n as u64)
        .map(|i| IoRequest {
            op,
            buf: buf.clone(),
            buf_offset: i * len,
            file_offset: base + 2 * i * len,
            len,
            cookie: i,
        })
        .collect()
}

/// Runs `reqs` through `b` (one submit) and checks every entry completed with all its bytes.
fn run_all(b: &mut StorageBatch, reqs: &[IoRequest]) -> Result<()> {
    b.submit(reqs)?;
    let mut seen = vec![false; reqs.len()];
    let mut got = 0;
    while got < reqs.len() {
        let ev = b.status(reqs.len() - got, Duration::from_secs(60))?;
        ensure_that!(!ev.is_empty(), "{got} of {} entries completed within 60 s", reqs.len());
        for e in ev {
            let r = reqs.get(e.cookie as usize).context("unknown cookie")?;
            ensure_that!(e.status == IoStatus::Complete && e.bytes == r.len, "entry {}: {e:?}", e.cookie);
            ensure_that!(!std::mem::replace(&mut seen[e.cookie as usize], true), "entry {} twice", e.cookie);
            got += 1;
        }
    }
    ensure_that!(b.in_flight() == 0, "{} entries still in flight", b.in_flight());
    Ok(())
}

/// Writes `n` pattern entries through a batch of `capacity`, reads them back through it, and
/// returns the (device offset, len) ranges written.
fn batch_round_trip(st: &Arc<Storage>, capacity: usize, native: bool, len: u64, base: u64) -> Result<Vec<(u64, u64)>> {
    let n = capacity;
    let mut b = StorageBatch::new(st, capacity)?;
    ensure_that!(b.is_native() == native, "a batch of {capacity}: is_native() {}, expected {native}", b.is_native());
    let src = Arc::new(st.alloc_host(n * len as usize)?);
    let writes = entries(Op::Write, &src, n, len, base);
    {
        let mut v = src.host_view()?;
        for r in &writes {
            let at = r.buf_offset as usize;
            pattern::fill(SEED, r.file_offset, &mut v[at..at + len as usize]);
        }
    }
    run_all(&mut b, &writes).with_context(|| format!("writes through a batch of {capacity}"))?;
    let dst = Arc::new(st.alloc_host(n * len as usize)?);
    let reads = entries(Op::Read, &dst, n, len, base);
    run_all(&mut b, &reads).with_context(|| format!("reads through a batch of {capacity}"))?;
    let v = dst.host_view()?;
    for r in &reads {
        let at = r.buf_offset as usize;
        if let Some(bad) = pattern::first_mismatch(SEED, r.file_offset, &v[at..at + len as usize]) {
            anyhow::bail!(
                "batch of {capacity}: entry {} (device offset {}) byte {bad} differs",
                r.cookie,
                r.file_offset
            );
        }
    }
    Ok(reads.iter().map(|r| (r.file_offset, r.len)).collect())
}

const SEED: u64 = 0x3E5;

/// A 64-entry batch fits a queue of its own (127 usable entries); a 200-entry batch cannot, so
/// it runs on the worker threads and must still complete every entry. Both read back what they
/// wrote, and so does the kernel nvme driver after unbinding.
fn batches() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let st = Storage::direct(&dev, 1)?;
    let mut ranges = batch_round_trip(&st, 64, true, 4096, 0)?;
    ranges.extend(batch_round_trip(&st, 200, false, 16384, 8 << 20)?);
    let c = st.path_counts();
    ensure_that!(c.direct_host == 2 * (64 + 200) && c.fallback == 0, "path counts: {c:?}");
    drop((st, dev));
    unbind()?;
    let blk = format!("/dev/{}n1", nvme_name(&nvme_controllers()?[0])?);
    for (off, len) in ranges {
        let got = direct_read(&blk, off, len as usize)?;
        if let Some(bad) = pattern::first_mismatch(SEED, off, &got) {
            anyhow::bail!("the kernel driver reads byte {bad} of {off}+{len} differently");
        }
    }
    Ok(())
}
