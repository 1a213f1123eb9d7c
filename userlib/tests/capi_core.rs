//! The C faces' shared core on files (no device, no GPU): cuFile's staged I/O at any size,
//! offset and memory alignment against a model of the file, descriptor handling, and handle
//! values that can never reach a later registration.

use proptest::prelude::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use ugds::capi::{Face, Library};
use ugds::Stream;

fn temp_file(name: &str, len: usize) -> (std::path::PathBuf, std::fs::File) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    f.write_all(&data).unwrap();
    (path, f)
}

fn leak_lib(face: Face) -> &'static Library {
    Box::leak(Box::new(Library::new(face)))
}

/// A uGDS library, open, with a handle on a fresh 1 MiB file `name` (its path and descriptor
/// too).
fn ugds_handle(name: &str) -> (std::path::PathBuf, std::fs::File, &'static Library, usize) {
    let (path, f) = temp_file(name, 1 << 20);
    let lib = leak_lib(Face::Ugds);
    lib.driver_open().unwrap();
    let h = lib.handle_register(f.as_raw_fd()).unwrap();
    (path, f, lib, h)
}

#[test]
fn a_file_opened_without_o_direct_is_read_with_o_direct() {
    let (path, _f, lib, h) = ugds_handle("no-odirect");
    assert!(lib.handle(h).unwrap().storage.bypasses_page_cache(), "the library opens its own O_DIRECT descriptor");
    lib.handle_deregister(h, -1).unwrap();
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_stale_handle_never_reaches_a_new_registration() {
    let (path, f) = temp_file("stale", 1 << 20);
    let lib = leak_lib(Face::Ugds);
    lib.driver_open().unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        let h = lib.handle_register(f.as_raw_fd()).unwrap();
        assert!(!seen.contains(&h), "a handle value was reused");
        // SAFETY: a handle points at its record, whose first int is the descriptor.
        assert_eq!(unsafe { *(h as *const i32) }, f.as_raw_fd());
        lib.handle_deregister(h, 0).unwrap();
        assert!(lib.handle(h).is_none());
        seen.push(h);
    }
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is valid for 4096 bytes.
    let r = unsafe { lib.rw(false, seen[0], buf.as_mut_ptr() as usize, 4096, 0, 0) };
    assert_eq!(r.map_err(|e| e.ret()), Err(-(libc::EBADF as isize)));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn ugds_refuses_what_cufile_stages() {
    let (path, _f, lib, h) = ugds_handle("strict");
    let mut buf = vec![0u8; 8192];
    for (size, off) in [(100usize, 0i64), (512, 7), (0, 0)] {
        // SAFETY: `buf` holds 8192 bytes.
        let r = unsafe { lib.rw(false, h, buf.as_mut_ptr() as usize, size, off, 0) };
        assert_eq!(r.map_err(|e| e.ret()), Err(-(libc::EINVAL as isize)), "size {size} offset {off}");
    }
    assert!(buf.iter().all(|&b| b == 0), "a refused read wrote nothing");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn registering_a_stream_sets_it_up_before_its_first_io() {
    let lib = leak_lib(Face::Ugds);
    let s = lib.cpu_stream_create().unwrap();
    lib.stream_prepare(s);
    assert!(!lib.stream_is_set_up(s), "nothing is set up before the driver is open");
    lib.driver_open().unwrap();
    lib.stream_prepare(s);
    assert!(lib.stream_is_set_up(s), "registration set the stream up");
    lib.stream_forget(s);
    assert!(!lib.stream_is_set_up(s));
}

/// Stream-ordered reads into GPU memory (the CPU stand-in runtime) on a CPU stream: once the
/// stream is synchronized the data and the result are there, and the buffer deregisters at once:
/// nothing the read kept busy outlives the stream passing it.
#[test]
fn a_buffer_deregisters_as_soon_as_its_stream_passed_a_read_into_it() {
    let (path, _f, lib, h) = ugds_handle("async-gpu");
    let gpu = ugds::Gpu::cpu();
    let mem = gpu.alloc(4096).unwrap();
    let base = mem.device_ptr() as usize;
    let s = lib.cpu_stream_create().unwrap();
    for i in 0..100usize {
        // SAFETY: the memory stays allocated until after it is deregistered below.
        unsafe { lib.buf_register(base, 4096, Some(gpu.clone()), false) }.unwrap();
        let (size, foff, boff, mut bytes) = (4096usize, (i * 4096) as libc::off_t, 0 as libc::off_t, 0isize);
        let args = ugds::capi::LateArgs { size: &size, file_offset: &foff, buf_offset: &boff, bytes: &mut bytes };
        // SAFETY: the argument words live until the stream is synchronized below.
        unsafe { lib.rw_async(false, h, base, args, s) }.unwrap();
        lib.cpu_stream(s).unwrap().synchronize().unwrap();
        // SAFETY: the stream passed the read; nothing writes the memory now.
        let v = unsafe { std::ptr::read_volatile(&bytes) };
        assert_eq!(v, 4096, "read {i}");
        // SAFETY: the CPU runtime's device memory is host memory, 4096 bytes at `base`.
        let got = unsafe { std::slice::from_raw_parts(base as *const u8, 4096) };
        assert!(got.iter().enumerate().all(|(k, &b)| b == ((i * 4096 + k) * 31 % 251) as u8), "read {i}: data");
        lib.buf_deregister(base).unwrap_or_else(|e| panic!("read {i}: deregistration refused: {e:?}"));
    }
    lib.handle_deregister(h, 0).unwrap();
    std::fs::remove_file(path).unwrap();
}

const LEN: usize = 256 << 10;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random unaligned writes and reads through cuFile's staged path agree byte for byte with a
    /// model of the file, neighbours of every write included, and the file's length grows only
    /// to the end of what was written.
    #[test]
    fn staged_io_matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0usize..LEN + 5000, 1usize..70_000, 0usize..64), 1..12)) {
        let (path, mut f) = temp_file("staged", LEN);
        let mut model: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
        let lib = leak_lib(Face::CuFile);
        let h = lib.handle_register(f.as_raw_fd()).unwrap();
        for (i, (write, off, len, mem_off)) in ops.into_iter().enumerate() {
            let mut mem = vec![0u8; len + 64];
            let p = mem.as_mut_ptr() as usize + mem_off;
            if write {
                for (k, b) in mem[mem_off..mem_off + len].iter_mut().enumerate() {
                    *b = (k as u8).wrapping_mul(7).wrapping_add(i as u8);
                }
                // SAFETY: `mem` holds `len` bytes from `p`.
                let n = unsafe { lib.rw(true, h, p, len, off as i64, 0) }.unwrap();
                prop_assert_eq!(n, len);
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&mem[mem_off..mem_off + len]);
            } else {
                // SAFETY: as above.
                let n = unsafe { lib.rw(false, h, p, len, off as i64, 0) }.unwrap();
                let want = model.len().saturating_sub(off).min(len);
                prop_assert_eq!(n, want);
                if n > 0 {
                    prop_assert_eq!(&mem[mem_off..mem_off + n], &model[off..off + n]);
                }
            }
        }
        lib.handle_deregister(h, -1).unwrap();
        let mut disk = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut disk).unwrap();
        prop_assert_eq!(disk.len(), model.len());
        prop_assert!(disk == model, "file content differs from the model");
        std::fs::remove_file(path).unwrap();
    }
}

/// A uGDS library, open, with a handle on a fresh 1 MiB file, and 64 KiB of host memory (not
/// registered yet).
fn ugds_on_file(name: &str) -> (std::path::PathBuf, &'static Library, usize, ugds::Buffer) {
    let (path, _f, lib, h) = ugds_handle(name);
    let m = ugds::Storage::open(path.to_str().unwrap()).unwrap().alloc_host(64 << 10).unwrap();
    (path, lib, h, m)
}

/// Batch entries for the first `n` pages of the memory at `base` and of the file.
fn page_entries(h: usize, base: usize, n: usize, write: bool) -> Vec<ugds::capi::Entry> {
    (0..n)
        .map(|i| ugds::capi::Entry {
            fh: h,
            write,
            base,
            buf_offset: (i * 4096) as i64,
            file_offset: (i * 4096) as i64,
            size: 4096,
            cookie: std::ptr::null_mut(),
        })
        .collect()
}

/// GetStatus with a minimum and no timeout returns at least that many events, even when an
/// entry finishes while it looks (regression: uGDS's test_batch_basic "got 0 of 1" on the GPU
/// machine; the count of running entries was read after collecting).
#[test]
fn get_status_waits_for_min_nr_events() {
    let (path, lib, h, m) = ugds_on_file("batch-min");
    let base = m.host_ptr().unwrap() as usize;
    // SAFETY: `m` stays allocated until the end of the test.
    unsafe { lib.buf_register(base, 64 << 10, None, false) }.unwrap();
    let b = lib.batch_setup(h, 8).unwrap();
    for round in 0..300 {
        let n = 1 + round % 8;
        // SAFETY: registered memory, in range.
        unsafe { lib.batch_submit(b, &page_entries(h, base, n, false)) }.unwrap();
        let evs = lib.batch_status(b, n, 0, None).unwrap();
        assert_eq!(evs.len(), n, "round {round}");
    }
    lib.batch_destroy(b);
    lib.buf_deregister(base).unwrap();
    lib.handle_deregister(h, 0).unwrap();
    std::fs::remove_file(path).unwrap();
}

/// Once a batch's entries are reported (GetStatus) or the batch is destroyed, their buffer is
/// no longer busy: it deregisters at once. Regression, found by the `capi` fuzz target: a batch
/// worker dropped its reference to the buffer only after counting the entry finished, so a
/// deregistration right after GetStatus or Destroy could be refused with `UGDS_BUSY`.
#[test]
fn buffer_deregisters_right_after_its_batch_entries_finish() {
    let (path, lib, h, m) = ugds_on_file("batch-then-deregister");
    let base = m.host_ptr().unwrap() as usize;
    for round in 0..400 {
        // SAFETY: `m` stays allocated until the end of the test.
        unsafe { lib.buf_register(base, 64 << 10, None, false) }.unwrap();
        let b = lib.batch_setup(h, 8).unwrap();
        let n = 1 + round % 8;
        // SAFETY: registered memory, in range.
        unsafe { lib.batch_submit(b, &page_entries(h, base, n, round % 3 == 0)) }.unwrap();
        if round % 2 == 0 {
            assert_eq!(lib.batch_status(b, n, 0, None).unwrap().len(), n, "round {round}");
        } else {
            lib.batch_destroy(b);
        }
        let r = lib.buf_deregister(base);
        assert!(r.is_ok(), "round {round}: {:?}", r.map_err(|e| e.code()));
        lib.batch_destroy(b);
    }
    lib.handle_deregister(h, 0).unwrap();
    std::fs::remove_file(path).unwrap();
}

/// Concurrent staged writes of neighbouring, unaligned ranges that share blocks (as kvikio
/// splits one large write into parallel tasks) keep every byte: no read-modify-write loses a
/// neighbour's data.
#[test]
fn concurrent_unaligned_writers_keep_each_others_bytes() {
    let (path, f) = temp_file("concurrent", 1 << 20);
    let lib = leak_lib(Face::CuFile);
    let h = lib.handle_register(f.as_raw_fd()).unwrap();
    let parts = 16usize;
    let part = 10_007usize; // not a block multiple: every boundary falls inside a block
    std::thread::scope(|sc| {
        for t in 0..parts {
            sc.spawn(move || {
                let data: Vec<u8> = (0..part).map(|k| (t * 31 + k % 13) as u8 | 1).collect();
                for _ in 0..20 {
                    // SAFETY: `data` holds `part` bytes.
                    let n = unsafe { lib.rw(true, h, data.as_ptr() as usize, part, (100 + t * part) as i64, 0) };
                    assert_eq!(n.unwrap(), part);
                }
            });
        }
    });
    lib.handle_deregister(h, -1).unwrap();
    let disk = std::fs::read(&path).unwrap();
    for t in 0..parts {
        let want: Vec<u8> = (0..part).map(|k| (t * 31 + k % 13) as u8 | 1).collect();
        assert!(disk[100 + t * part..100 + (t + 1) * part] == want[..], "part {t} lost bytes");
    }
    assert_eq!(&disk[..100], &(0..100).map(|i| (i * 31 % 251) as u8).collect::<Vec<_>>()[..]);
    std::fs::remove_file(path).unwrap();
}

/// A descriptor's first line in a file a root service wrote for a client (a cache block) does
/// not turn its handle into raw I/O on the named devices: the handle reads the file's bytes.
#[test]
fn a_file_whose_first_line_is_a_volume_descriptors_is_a_file_handle() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let member = dir.join(format!("desc-member-{}", std::process::id()));
    std::fs::write(&member, vec![0u8; 4096]).unwrap();
    let path = dir.join(format!("desc-plain-{}.bin", std::process::id()));
    let mut data = format!("# ugds volume\nstripe:{}\n", member.display()).into_bytes();
    data.resize(4096, b'\n');
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let lib = leak_lib(Face::CuFile);
    lib.driver_open().unwrap();
    let h = lib.handle_register(f.as_raw_fd()).unwrap();
    assert!(lib.handle(h).unwrap().storage.describe().contains("fallback path"));
    let mut back = vec![0u8; 4096];
    // SAFETY: `back` holds 4096 bytes.
    let n = unsafe { lib.rw(false, h, back.as_mut_ptr() as usize, 4096, 0, 0) };
    assert_eq!(n.map_err(|e| e.ret()), Ok(4096));
    assert!(back == data, "the handle read other bytes than the file's");
    lib.handle_deregister(h, -1).unwrap();
    assert!(std::fs::read(&path).unwrap() == data);
    std::fs::remove_file(&path).unwrap();
    // The same bytes in a file named as a descriptor: the handle is the volume (whose member,
    // a regular file here, is refused by name), also once the file is unlinked.
    let named = dir.join(format!("desc-{}{}", std::process::id(), ugds::volume::DESCRIPTOR_SUFFIX));
    std::fs::write(&named, &data).unwrap();
    let f = std::fs::File::open(&named).unwrap();
    let is_member_error = |r: Result<usize, ugds::capi::Fail>| matches!(&r, Err(ugds::capi::Fail::Lib(ugds::Error::NotUgdsNode { path, .. })) if std::path::Path::new(path) == member);
    assert!(is_member_error(lib.handle_register(f.as_raw_fd())));
    std::fs::remove_file(&named).unwrap();
    assert!(is_member_error(lib.handle_register(f.as_raw_fd())), "an unlinked descriptor is still one");
    std::fs::remove_file(&member).unwrap();
}
