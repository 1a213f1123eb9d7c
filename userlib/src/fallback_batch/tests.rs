//! The ring batch's own rules: nothing goes to the worker threads, and memory the kernel or a
//! copy may still use stays leased for good when the ring or a copy queue is given up.

use super::*;
use crate::fallback::tests::TempFile;
use crate::gpu::{cpu::Faulty, Gpu};
use crate::storage_batch::{IoRequest, StorageBatch};

fn reads(buf: &Arc<crate::Buffer>, n: u64, len: u64) -> Vec<IoRequest> {
    (0..n)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: i * len,
            file_offset: i * len,
            len,
            cookie: i,
        })
        .collect()
}

fn wait_all(b: &mut StorageBatch, n: usize) -> Vec<IoEvent> {
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(b.status(n - out.len(), Duration::from_secs(20)).unwrap());
    }
    out
}

/// A batch on a file queues no job on the storage's worker threads (host and GPU memory); an
/// entry the ring does not take does, so the count could tell.
#[test]
fn ring_batches_queue_nothing_on_the_worker_threads() {
    let f = TempFile::new("workers", 16 << 20);
    let st = f.storage();
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host(64 * 8192).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(8 << 20).unwrap()), false).unwrap());
    let mut b = StorageBatch::new(&st, 128).unwrap();
    let mut reqs = reads(&host, 64, 8192);
    reqs.extend(reads(&gbuf, 64, 8192).into_iter().map(|r| IoRequest { cookie: r.cookie + 64, ..r }));
    for _ in 0..3 {
        b.submit(&reqs).unwrap();
        assert!(wait_all(&mut b, 128).iter().all(|e| e.status == IoStatus::Complete));
    }
    let engine = st.engine().unwrap();
    assert_eq!(engine.spawned(), 0, "no entry ran on a worker thread");
    let big = IoRequest { op: Op::Read, buf: gbuf.clone(), buf_offset: 0, file_offset: 0, len: 4 << 20, cookie: 0 };
    b.submit(&[big]).unwrap();
    assert_eq!(wait_all(&mut b, 1)[0].status, IoStatus::Complete);
    assert_eq!(engine.spawned(), 1, "GPU entries past a staging chunk take the worker threads");
}

/// When the ring is given up with requests in it, those entries fail and keep their leases for
/// good (the kernel may still write the memory); the batch carries on with a new ring.
#[test]
fn an_abandoned_ring_keeps_its_entries_memory_leased_for_good() {
    let f = TempFile::new("abandon", 16 << 20);
    let st = f.storage();
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host(8 << 20).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(1 << 20).unwrap()), false).unwrap());
    let mut b = RingBatch::new(&st, 8).unwrap();
    let entry = |buf: &Arc<crate::Buffer>, len: u64, cookie: u64| Entry {
        op: Op::Read,
        lease: crate::buffer::Lease::new(buf.clone()).unwrap(),
        buf_offset: 0,
        dev_offset: 0,
        len,
        cookie,
    };
    assert!(b.takes(&gbuf, 0, 4096));
    b.submit(vec![entry(&host, 4 << 20, 0), entry(&gbuf, 4096, 1)]).unwrap();
    // Nothing was reaped, so every piece still counts as in the ring.
    assert!(b.in_ring > 0);
    b.abandon(std::io::Error::from_raw_os_error(libc::EFAULT));
    assert!(b.ring.is_none());
    let mut evs = Vec::new();
    b.status_into(2, Duration::ZERO, &mut evs).unwrap();
    assert_eq!(evs.len(), 2);
    assert!(evs
        .iter()
        .all(|(e, _)| e.status == IoStatus::Failed && e.error.as_ref().is_some_and(|e| e.errno() == -libc::EFAULT)));
    assert_eq!((host.inflight(), gbuf.inflight()), (1, 1), "the leases are kept for good");
    assert!(b.stage.as_ref().is_some_and(|s| s.keeps_its_chunks()), "the slot's chunk is never reused");
    // A new ring for the next entries.
    let other = Arc::new(st.alloc_host(1 << 20).unwrap());
    b.submit(vec![entry(&other, 1 << 20, 2)]).unwrap();
    evs.clear();
    b.status_into(1, Duration::from_secs(20), &mut evs).unwrap();
    assert_eq!((evs[0].0.status, evs[0].0.bytes), (IoStatus::Complete, 1 << 20));
    assert_eq!(other.inflight(), 0);
}

/// A copy queue that cannot say its copies are done fails its entries, which keep their leases
/// for good; host entries of the same batch are not affected.
#[test]
fn a_failed_copy_queue_keeps_its_entries_memory_leased_for_good() {
    let f = TempFile::new("copyfail", 4 << 20);
    let st = f.storage();
    let gpu = Gpu::with_runtime(Arc::new(Faulty::new(true, false)));
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(1 << 20).unwrap()), false).unwrap());
    let host = Arc::new(st.alloc_host(1 << 20).unwrap());
    let mut b = StorageBatch::new(&st, 8).unwrap();
    let mut reqs = reads(&gbuf, 4, 8192);
    reqs.extend(reads(&host, 4, 8192).into_iter().map(|r| IoRequest { cookie: r.cookie + 4, ..r }));
    b.submit(&reqs).unwrap();
    let evs = wait_all(&mut b, 8);
    for e in &evs {
        let want = if e.cookie < 4 { IoStatus::Failed } else { IoStatus::Complete };
        assert_eq!(e.status, want, "{e:?}");
    }
    assert_eq!(gbuf.inflight(), 4, "GPU entries whose copies may still run stay leased");
    assert_eq!(host.inflight(), 0);
    assert_eq!(b.ring_entries(), 8);
}

/// Stream-ordered groups on a file are one worker job each, whatever their size (the ring puts
/// the group's operations in flight); an operation the ring does not take gets a job of its
/// own and still finishes before the stream moves on.
#[test]
fn stream_groups_on_a_file_run_on_the_dispatcher() {
    use crate::stream_io::{AsyncArgs, AsyncOp, StreamIo};
    let f = TempFile::new("stream", 16 << 20);
    let st = f.storage();
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host(16 * 8192).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(8 << 20).unwrap()), false).unwrap());
    let sio = StreamIo::new(crate::CpuStream::new().unwrap()).unwrap();
    let mut all = Vec::new();
    for g in 0..10u64 {
        let ops: Vec<AsyncOp> = (0..16u64)
            .map(|i| {
                let buf = if i % 2 == 0 { host.clone() } else { gbuf.clone() };
                let args = AsyncArgs::new(8192, (g * 16 + i) as i64 * 8192, i as i64 * 8192);
                AsyncOp { op: Op::Read, buf, args }
            })
            .collect();
        sio.submit(&st, &ops).unwrap();
        all.extend(ops);
        if g == 9 {
            sio.synchronize().unwrap();
        }
    }
    let engine = st.engine().unwrap();
    assert_eq!(engine.spawned(), 0, "each group ran on the stream's dispatcher, no worker job");
    assert!(all.iter().all(|o| o.args.result() == 8192));
    let mut out = vec![0u8; 8192];
    for (k, o) in all.iter().enumerate().skip(9 * 16) {
        o.buf.copy_out((k % 16) * 8192, &mut out).unwrap();
        assert_eq!(crate::pattern::first_mismatch(1, k as u64 * 8192, &out), None, "op {k}");
    }
    // A GPU operation larger than a staging chunk, with a small one.
    let big = AsyncOp { op: Op::Read, buf: gbuf.clone(), args: AsyncArgs::new(4 << 20, 0, 0) };
    let small = AsyncOp { op: Op::Read, buf: host.clone(), args: AsyncArgs::new(4096, 8192, 0) };
    sio.submit(&st, &[big.clone(), small.clone()]).unwrap();
    sio.synchronize().unwrap();
    assert_eq!((big.args.result(), small.args.result()), (4 << 20, 4096));
    assert_eq!(engine.spawned(), 1, "a worker for the large operation only");
    assert_eq!(st.path_counts().fallback, 162);
}

/// GPU entries that get no staging memory fail at once, alone, and give their place in the
/// batch back.
#[test]
fn entries_without_staging_memory_fail_and_free_their_place() {
    let f = TempFile::new("nopinned", 4 << 20);
    let st = f.storage();
    let gpu = Gpu::with_runtime(Arc::new(Faulty::new(true, true)));
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(1 << 20).unwrap()), false).unwrap());
    let host = Arc::new(st.alloc_host(1 << 20).unwrap());
    let mut b = StorageBatch::new(&st, 4).unwrap();
    for _ in 0..3 {
        let mut reqs = reads(&gbuf, 2, 8192);
        reqs.extend(reads(&host, 2, 8192).into_iter().map(|r| IoRequest { cookie: r.cookie + 2, ..r }));
        b.submit(&reqs).unwrap();
        let mut evs = wait_all(&mut b, 4);
        evs.sort_by_key(|e| e.cookie);
        assert!(evs[..2].iter().all(|e| matches!(e.error, Some(Error::Gpu { op: "alloc_pinned", .. }))), "{evs:?}");
        assert!(evs[2..].iter().all(|e| e.status == IoStatus::Complete), "{evs:?}");
        assert_eq!(b.in_flight(), 0);
        assert_eq!(gbuf.inflight() + host.inflight(), 0);
    }
}
