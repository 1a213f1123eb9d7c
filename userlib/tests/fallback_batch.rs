//! Batches on the fallback path (a file with O_DIRECT on the host's disk file system): every
//! entry in flight on the batch's own io_uring, host memory and GPU memory (the CPU stand-in
//! runtime) staged through the batch's pinned slots, at depths 1 to 256.

mod common;
use common::TempFile;
use std::sync::Arc;
use std::time::Duration;
use ugds::batch::{IoEvent, IoStatus, Op};
use ugds::{pattern, Buffer, Error, Gpu, IoRequest, Storage, StorageBatch};

const SEED: u64 = 0xba7c_4f11;

/// Collects `n` events.
fn events(b: &mut StorageBatch, n: usize) -> Vec<IoEvent> {
    let mut out = Vec::new();
    while out.len() < n {
        let ev = b.status(n - out.len(), Duration::from_secs(20)).unwrap();
        assert!(!ev.is_empty(), "no progress with {} of {n} events", out.len());
        out.extend(ev);
    }
    out.sort_by_key(|e| e.cookie);
    out
}

/// A small deterministic generator (the tests must not depend on a crate the library lacks).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 += 1;
        pattern::splitmix64(self.0) % n
    }
}

/// One entry of a mixed batch, and what it must leave behind.
struct Planned {
    req: IoRequest,
    seed: u64,
}

/// Depths 1 to 256 of mixed reads and writes of odd sizes (block multiples that are not powers
/// of two, some of several commands), into host memory (aligned and not) and GPU memory (slots
/// and whole chunks): every byte lands where it should, each entry runs on the batch's ring
/// (none on a worker thread), and each counts once on the fallback path.
#[test]
fn deep_batches_of_mixed_reads_and_writes_keep_every_byte() {
    const REGION: u64 = 3 << 20;
    const MAXD: u64 = 256;
    let f = TempFile::new("fbq-mixed", (REGION * 24) as usize, SEED);
    let st = Storage::open(f.path()).unwrap();
    assert!(st.bypasses_page_cache(), "the test file system must take O_DIRECT");
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host((MAXD * (256 << 10) + 4096) as usize).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc((MAXD * (256 << 10)) as usize).unwrap()), false).unwrap());
    let mut rng = Rng(7);
    let mut counted = 0;
    for depth in [1usize, 2, 7, 32, 100, 256] {
        let mut b = StorageBatch::new(&st, depth).unwrap();
        assert!(b.is_native(), "a file batch has a ring of its own");
        // Entry i owns file bytes [i * slot, (i + 1) * slot) and buffer bytes likewise, so
        // entries never overlap; a few large entries get a region of several commands.
        let slot = (REGION * 24 / depth as u64).min(256 << 10) & !4095;
        let mut plan = Vec::new();
        for i in 0..depth as u64 {
            let big = depth <= 8 && i % 2 == 1;
            let (file_base, room) = if big { (REGION * (2 * i + 2), REGION - 4096) } else { (i * slot, slot - 4096) };
            let len = if big { (1 << 20) + 512 * (1 + rng.below(2000)) } else { 512 * (1 + rng.below(room / 512)) };
            let len = len.min(room);
            let on_gpu = rng.below(2) == 0;
            let buf = if on_gpu { gbuf.clone() } else { host.clone() };
            // Host entries sometimes start off the O_DIRECT alignment (they bounce).
            let skew = if !on_gpu && rng.below(3) == 0 { 1 + rng.below(511) } else { 0 };
            let buf_base = if big { i * REGION } else { i * slot };
            let op = if rng.below(3) == 0 { Op::Write } else { Op::Read };
            let seed = SEED ^ (depth as u64) << 20 ^ i;
            let req = IoRequest { op, buf, buf_offset: buf_base + skew, file_offset: file_base, len, cookie: i };
            if op == Op::Write {
                let mut data = vec![0u8; len as usize];
                pattern::fill(seed, file_base, &mut data);
                req.buf.copy_in(req.buf_offset as usize, &data).unwrap();
            }
            plan.push(Planned { req, seed });
        }
        {
            let group = plan;
            let before = b.ring_entries();
            let reqs: Vec<IoRequest> = group.iter().map(|p| p.req.clone()).collect();
            b.submit(&reqs).unwrap();
            let evs = events(&mut b, reqs.len());
            assert_eq!(b.ring_entries() - before, reqs.len() as u64, "every entry ran on the batch's ring");
            assert_eq!(b.in_flight(), 0);
            for (p, e) in group.iter().zip(&evs) {
                let r = &p.req;
                assert_eq!(e.cookie, r.cookie);
                assert_eq!(e.status, IoStatus::Complete, "depth {depth}: {e:?}");
                assert_eq!(e.bytes, r.len, "depth {depth} entry {}", r.cookie);
                counted += 1;
                let mut out = vec![0u8; r.len as usize];
                if r.op == Op::Read {
                    r.buf.copy_out(r.buf_offset as usize, &mut out).unwrap();
                    let bad = pattern::first_mismatch(SEED, r.file_offset, &out);
                    assert_eq!(
                        bad, None,
                        "depth {depth}: read {} of {} at {} into {:?}+{}",
                        r.cookie, r.len, r.file_offset, r.buf, r.buf_offset
                    );
                } else {
                    let file = std::fs::File::open(f.path()).unwrap();
                    std::os::unix::fs::FileExt::read_exact_at(&file, &mut out, r.file_offset).unwrap();
                    let bad = pattern::first_mismatch(p.seed, r.file_offset, &out);
                    assert_eq!(
                        bad, None,
                        "depth {depth}: write {} of {} at {} from {:?}+{}",
                        r.cookie, r.len, r.file_offset, r.buf, r.buf_offset
                    );
                    // Put the original bytes back for the next depth's reads.
                    pattern::fill(SEED, r.file_offset, &mut out);
                    std::os::unix::fs::FileExt::write_all_at(&file_rw(f.path()), &out, r.file_offset).unwrap();
                }
            }
        }
    }
    let c = st.path_counts();
    assert_eq!(c.fallback, counted, "each entry counts once, on the fallback path");
    assert_eq!(host.inflight() + gbuf.inflight(), 0, "every lease was given back");
}

fn file_rw(path: &str) -> std::fs::File {
    std::fs::OpenOptions::new().write(true).open(path).unwrap()
}

/// A write the file system refuses (past its largest file) fails alone with the kernel's
/// error; a read wholly past the end of the file completes with 0 bytes; an offset that
/// overflows is refused by name at submit; the rest of the batch completes.
#[test]
fn an_entry_past_the_end_fails_alone_with_a_named_error() {
    let f = TempFile::new("fbq-end", 1 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let buf = Arc::new(st.alloc_host(16 * 4096).unwrap());
    let mut b = StorageBatch::new(&st, 16).unwrap();
    let mut reqs: Vec<IoRequest> = (0..16u64)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: buf.clone(),
            buf_offset: i * 4096,
            file_offset: i * 8192,
            len: 4096,
            cookie: i,
        })
        .collect();
    reqs[3] = IoRequest { op: Op::Write, file_offset: 1 << 50, ..reqs[3].clone() };
    reqs[7].file_offset = 4 << 20;
    reqs[9].file_offset = i64::MAX as u64 - 4095;
    b.submit(&reqs).unwrap();
    let evs = events(&mut b, 16);
    for e in &evs {
        match e.cookie {
            3 => {
                assert_eq!(e.status, IoStatus::Failed, "{e:?}");
                let err = e.error.as_ref().unwrap();
                assert!(matches!(err, Error::Io { op, .. } if op.contains("write") && op.contains(f.path())), "{err}");
                assert_eq!(err.errno(), -libc::EFBIG, "{err}");
            }
            7 => assert_eq!((e.status, e.bytes), (IoStatus::Complete, 0), "a read past the end of the file"),
            9 => assert!(matches!(e.error, Some(Error::InvalidArgument { arg: "file_offset", .. })), "{e:?}"),
            i => {
                assert_eq!((e.status, e.bytes), (IoStatus::Complete, 4096), "{e:?}");
                let mut out = vec![0u8; 4096];
                buf.copy_out((i * 4096) as usize, &mut out).unwrap();
                assert_eq!(pattern::first_mismatch(SEED, i * 8192, &out), None, "entry {i}");
            }
        }
    }
    assert_eq!(b.ring_entries(), 15, "the invalid entry never started");
    assert_eq!(buf.inflight(), 0);
}

/// Dropping a batch with entries in flight (large reads of several commands each, into host
/// and GPU memory) waits for them: afterwards no lease is held and the data is all there.
#[test]
fn dropping_a_batch_with_entries_in_flight_waits_for_them() {
    const LEN: u64 = (3 << 20) + 4096;
    let f = TempFile::new("fbq-drop", 32 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host((8 * LEN) as usize).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(8 << 20).unwrap()), false).unwrap());
    let mut reqs: Vec<IoRequest> = (0..8u64)
        .map(|i| IoRequest {
            op: Op::Read,
            buf: host.clone(),
            buf_offset: i * LEN,
            file_offset: i * LEN,
            len: LEN,
            cookie: i,
        })
        .collect();
    // GPU entries: a whole staging chunk each, and small ones in slots.
    for i in 0..8u64 {
        let len = if i < 3 { 2 << 20 } else { 8192 };
        let buf_offset = if i < 3 { i * (2 << 20) } else { (6 << 20) + i * 8192 };
        reqs.push(IoRequest {
            op: Op::Read,
            buf: gbuf.clone(),
            buf_offset,
            file_offset: (28 << 20) + i * 8192,
            len,
            cookie: 8 + i,
        });
    }
    let mut b = StorageBatch::new(&st, 16).unwrap();
    b.submit(&reqs).unwrap();
    assert!(b.in_flight() > 0);
    drop(b);
    assert_eq!(host.inflight() + gbuf.inflight(), 0, "the drop waited for every entry");
    for r in &reqs {
        let mut out = vec![0u8; r.len as usize];
        r.buf.copy_out(r.buf_offset as usize, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, r.file_offset, &out), None, "entry {}", r.cookie);
    }
    assert_eq!(st.path_counts().fallback, 16, "entries finished by the drop count too");
}

/// A batch of one, many times over, host and GPU memory, reads and writes: each runs on the ring
/// and completes with its data.
#[test]
fn a_batch_of_one_runs_on_the_ring() {
    let f = TempFile::new("fbq-one", 4 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::cpu();
    let bufs: [Arc<Buffer>; 2] = [
        Arc::new(st.alloc_host(64 << 10).unwrap()),
        Arc::new(st.register_gpu(Arc::new(gpu.alloc(64 << 10).unwrap()), false).unwrap()),
    ];
    let mut b = StorageBatch::new(&st, 1).unwrap();
    for n in 0..200u64 {
        let buf = bufs[(n % 2) as usize].clone();
        let file_offset = (n % 64) * 65536;
        let op = if n % 5 == 4 { Op::Write } else { Op::Read };
        let len = 4096 * (1 + n % 16);
        if op == Op::Write {
            // Writes put back the pattern that is there, so later reads still check it.
            let mut data = vec![0u8; len as usize];
            pattern::fill(SEED, file_offset, &mut data);
            buf.copy_in(0, &data).unwrap();
        }
        b.submit(&[IoRequest { op, buf: buf.clone(), buf_offset: 0, file_offset, len, cookie: n }]).unwrap();
        let ev = events(&mut b, 1);
        assert_eq!((ev[0].cookie, ev[0].status, ev[0].bytes), (n, IoStatus::Complete, len), "{:?}", ev[0]);
        let mut out = vec![0u8; len as usize];
        buf.copy_out(0, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, file_offset, &out), None, "round {n}");
    }
    assert_eq!(b.ring_entries(), 200);
    assert_eq!(st.path_counts().fallback, 200);
}

/// Entries the ring does not take (unaligned host memory larger than its bounce limit, GPU
/// memory larger than a staging chunk) still run, on the worker threads, in the same batch.
#[test]
fn entries_the_ring_does_not_take_run_on_the_workers_in_the_same_batch() {
    let f = TempFile::new("fbq-pool", 24 << 20, SEED);
    let st = Storage::open(f.path()).unwrap();
    let gpu = Gpu::cpu();
    let host = Arc::new(st.alloc_host(12 << 20).unwrap());
    let gbuf = Arc::new(st.register_gpu(Arc::new(gpu.alloc(8 << 20).unwrap()), false).unwrap());
    let reqs = vec![
        IoRequest { op: Op::Read, buf: host.clone(), buf_offset: 3, file_offset: 0, len: 5 << 20, cookie: 0 },
        IoRequest { op: Op::Read, buf: gbuf.clone(), buf_offset: 0, file_offset: 6 << 20, len: 5 << 20, cookie: 1 },
        IoRequest { op: Op::Read, buf: host.clone(), buf_offset: 6 << 20, file_offset: 12 << 20, len: 4096, cookie: 2 },
        IoRequest { op: Op::Read, buf: gbuf.clone(), buf_offset: 6 << 20, file_offset: 16 << 20, len: 8192, cookie: 3 },
    ];
    let mut b = StorageBatch::new(&st, 4).unwrap();
    b.submit(&reqs).unwrap();
    let evs = events(&mut b, 4);
    assert_eq!(b.ring_entries(), 2, "two entries on the ring, two on the workers");
    for (r, e) in reqs.iter().zip(&evs) {
        assert_eq!((e.status, e.bytes), (IoStatus::Complete, r.len), "{e:?}");
        let mut out = vec![0u8; r.len as usize];
        r.buf.copy_out(r.buf_offset as usize, &mut out).unwrap();
        assert_eq!(pattern::first_mismatch(SEED, r.file_offset, &out), None, "entry {}", r.cookie);
    }
}
