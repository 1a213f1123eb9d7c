//! Data path tests (crate `ugds`): integrity against the kernel driver in both directions over
//! several geometries, threads on few queues, scattered registrations, bad requests, the
//! syscall-free loop, the CLI.

use crate::kmod::bound_node;
use crate::{driver_of, ensure_that, nvme_controllers, nvme_name, sh, xtask, AlignedBuf, Test};
use anyhow::{Context, Result};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use ugds::{pattern, DataPointers, Device, DeviceOptions, Error, Gpu, Path, Storage, Waiting};

const V: &str = "userlib";

/// The data path tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "ugds_integrity_ugds_writes_kernel_reads", variant: V, run: ugds_writes_kernel_reads },
        Test { name: "ugds_integrity_kernel_writes_ugds_reads", variant: V, run: kernel_writes_ugds_reads },
        Test { name: "ugds_eight_threads_on_one_queue", variant: V, run: eight_threads_one_queue },
        Test { name: "ugds_scattered_registration_unaligned_offsets", variant: V, run: scattered_registration },
        Test { name: "ugds_bad_requests_named_errors_disk_unchanged", variant: V, run: bad_requests },
        Test { name: "ugds_flush_write_zeroes_deallocate", variant: V, run: flush_zeroes_trim },
        Test { name: "ugds_dmabuf_registration_io", variant: V, run: dmabuf_io },
        Test { name: "ugds_interrupt_mode_same_data_less_cpu", variant: V, run: interrupt_mode },
        Test { name: "ugds_iommu_translated_io", variant: "iommu", run: iommu_io },
        Test { name: "ugds_no_syscalls_in_steady_state", variant: V, run: no_syscalls },
        Test { name: "ugds_cli_info_write_read_bench", variant: V, run: cli },
        Test { name: "ugds_namespace_with_metadata_refused_by_name", variant: "capabilities", run: metadata_namespace },
    ]
}

/// The variant's controllers: 4096-byte blocks; 512-byte blocks with MDTS 8 KiB; two
/// namespaces; a single I/O queue pair; a drive with SSD-like latency (20 commands per second,
/// so each command takes ~50 ms) for the interrupt-mode CPU comparison.
pub const NVME: &[&str] = &[
    "size=128M,lbs=4096",
    "size=64M,lbs=512,mdts=1",
    "size=32M,ns=2",
    "size=32M,qpairs=1",
    "size=32M,throttle_iops=20",
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random (offset, len) pairs: one block to 8 MiB, block aligned, inside `cap`.
fn ranges(seed: u64, bs: u64, cap: u64, n: usize) -> Vec<(u64, u64)> {
    let mut r = Rng(seed | 1);
    (0..n)
        .map(|_| {
            let len = ((r.next() % (8 << 20)) / bs).max(1) * bs;
            let len = len.min(cap);
            let off = (r.next() % ((cap - len) / bs + 1)) * bs;
            (off, len)
        })
        .collect()
}

pub(crate) fn unbind(addr: &str) -> Result<()> {
    if driver_of(addr).as_deref() != Some("nvme") {
        let (ok, out) = xtask(&["unbind", addr])?;
        ensure_that!(ok, "unbind {addr}: {out}");
    }
    Ok(())
}

/// The kernel's block devices of a controller as (nsid, name): the name's number is an
/// instance counter, not the namespace id, so the `nsid` attribute decides.
pub(crate) fn kernel_namespaces(ctrl: &str) -> Result<Vec<(u32, String)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/sys/class/nvme/{ctrl}"))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Ok(id) = std::fs::read_to_string(format!("/sys/class/block/{name}/nsid")) {
            v.push((id.trim().parse()?, name));
        }
    }
    v.sort();
    Ok(v)
}

pub(crate) fn kernel_check(dev: &str, seed: u64, off: u64, len: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev)?;
    let mut buf = AlignedBuf::new(len as usize);
    f.read_exact_at(buf.as_mut_slice(), off)?;
    if let Some(bad) = pattern::first_mismatch(seed, off, buf.as_slice()) {
        anyhow::bail!("{dev}: byte {bad} differs from the pattern (range {off}+{len})");
    }
    Ok(())
}

fn kernel_fill(dev: &str, seed: u64, off: u64, len: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(dev)?;
    let mut buf = AlignedBuf::new(len as usize);
    pattern::fill(seed, off, buf.as_mut_slice());
    f.write_all_at(buf.as_slice(), off)?;
    f.sync_all()?;
    Ok(())
}

fn ugds_writes_kernel_reads() -> Result<()> {
    integrity_ugds_writes(DataPointers::Auto, NVME.len())
}

fn kernel_writes_ugds_reads() -> Result<()> {
    integrity_kernel_writes(DataPointers::Auto, NVME.len())
}

/// Checks which data pointers a device's transfers took: none but PRPs when PRPs are forced,
/// none but SGLs when SGLs are forced (QEMU's controller supports them, and no transfer of
/// these tests needs more descriptors than a list page holds).
pub(crate) fn check_dptr(dev: &Device, dp: DataPointers, what: &str) -> Result<()> {
    let c = dev.dptr_counts();
    match dp {
        DataPointers::PrpOnly => ensure_that!(c.sgl == 0 && c.prp > 0, "{what}: PRPs forced, counts {c:?}"),
        DataPointers::SglPreferred => {
            ensure_that!(dev.supports_sgls(), "{what}: the controller reports no SGL support");
            ensure_that!(c.prp == 0 && c.sgl > 0, "{what}: SGLs forced, counts {c:?}");
        }
        _ => {}
    }
    Ok(())
}

/// ugds writes random ranges (up to 8 MiB) on every namespace of the first `ctrls`
/// controllers with data pointers `dp`; the kernel driver reads them back.
pub(crate) fn integrity_ugds_writes(dp: DataPointers, ctrls: usize) -> Result<()> {
    for idx in 0..ctrls {
        let addr = nvme_controllers()?[idx].clone();
        let node = bound_node(idx)?;
        let dev = Device::open_with(&node, DeviceOptions { data_pointers: dp, ..Default::default() })?;
        let mut plan = Vec::new();
        for ns in dev.namespaces() {
            let seed = 1000 + idx as u64 * 10 + ns.id() as u64;
            let st = Storage::direct(&dev, ns.id())?;
            let buf = st.alloc_host(8 << 20)?;
            for (off, len) in ranges(seed, ns.block_size(), ns.capacity(), 6) {
                pattern::fill(seed, off, &mut buf.host_view()?[..len as usize]);
                let n = st
                    .write(&buf, 0, off, len)
                    .with_context(|| format!("ctrl {idx} ns {} write {off}+{len}", ns.id()))?;
                ensure_that!(n == len, "ctrl {idx} ns {}: wrote {n} of {len} bytes", ns.id());
                plan.push((ns.id(), seed, off, len));
            }
        }
        check_dptr(&dev, dp, &format!("controller {idx}"))?;
        drop(dev);
        unbind(&addr)?;
        let kns = kernel_namespaces(&nvme_name(&addr)?)?;
        for (nsid, seed, off, len) in plan {
            let blk = &kns.iter().find(|(id, _)| *id == nsid).context("namespace missing in the kernel")?.1;
            kernel_check(&format!("/dev/{blk}"), seed, off, len).with_context(|| format!("controller {idx}"))?;
        }
    }
    Ok(())
}

/// The kernel driver writes random ranges on every namespace of the first `ctrls` controllers;
/// ugds reads them back with data pointers `dp`.
pub(crate) fn integrity_kernel_writes(dp: DataPointers, ctrls: usize) -> Result<()> {
    for idx in 0..ctrls {
        let addr = nvme_controllers()?[idx].clone();
        unbind(&addr)?;
        let mut plan = Vec::new();
        for (nsid, blk) in kernel_namespaces(&nvme_name(&addr)?)? {
            let dev = format!("/dev/{blk}");
            let attr = |a: &str| -> Result<u64> {
                Ok(std::fs::read_to_string(format!("/sys/class/block/{blk}/{a}"))?.trim().parse()?)
            };
            let (bs, cap) = (attr("queue/logical_block_size")?, attr("size")? * 512);
            let seed = 5000 + idx as u64 * 10 + nsid as u64;
            for (off, len) in ranges(seed, bs, cap, 4) {
                kernel_fill(&dev, seed, off, len)?;
                plan.push((nsid, seed, off, len));
            }
        }
        let node = bound_node(idx)?;
        let dev = Device::open_with(&node, DeviceOptions { data_pointers: dp, ..Default::default() })?;
        let mut checked = 0;
        for ns in dev.namespaces() {
            let nsid = ns.id();
            let st = Storage::direct(&dev, nsid)?;
            let buf = st.alloc_host(8 << 20)?;
            for &(_, seed, off, len) in plan.iter().filter(|p| p.0 == nsid) {
                let n = st.read(&buf, 0, off, len)?;
                ensure_that!(n == len, "controller {idx} ns {nsid}: read {n} of {len} bytes");
                let view = buf.host_view()?;
                if let Some(bad) = pattern::first_mismatch(seed, off, &view[..len as usize]) {
                    anyhow::bail!("controller {idx} ns {nsid}: ugds read byte {bad} differs (range {off}+{len})");
                }
                checked += 1;
            }
        }
        ensure_that!(
            checked == plan.len(),
            "controller {idx}: ugds has {checked} of the kernel's {} ranges",
            plan.len()
        );
        check_dptr(&dev, dp, &format!("controller {idx}"))?;
        drop(dev);
        unbind(&addr)?;
    }
    Ok(())
}

fn eight_threads_one_queue() -> Result<()> {
    let node = bound_node(3)?;
    let dev = Device::open_with(&node, DeviceOptions { queues: 1, depth: 64, ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let st = &st;
                s.spawn(move || -> Result<()> {
                    let buf = st.alloc_host(256 * 1024)?;
                    for i in 0..10u64 {
                        let off = (t * 10 + i) * 256 * 1024;
                        let seed = 77 + t;
                        pattern::fill(seed, off, &mut buf.host_view()?);
                        st.write(&buf, 0, off, 256 * 1024)?;
                        buf.host_view()?.fill(0);
                        st.read(&buf, 0, off, 256 * 1024)?;
                        if let Some(b) = pattern::first_mismatch(seed, off, &buf.host_view()?) {
                            anyhow::bail!("thread {t}: byte {b} wrong");
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("thread panicked"))??;
        }
        Ok(())
    })?;
    drop((st, dev));
    unbind(&nvme_controllers()?[3])
}

fn scattered_registration() -> Result<()> {
    let node = bound_node(1)?;
    let dev = Device::open(&node)?;
    let st = Storage::direct(&dev, 1)?;
    // Anonymous memory is not scattered for certain: a fresh VM's allocator may hand out
    // neighbouring pages, or neighbouring transparent huge pages (Debian's 7.3 did: one 4 MiB
    // segment). Every other page of a faulted-in mapping, moved side by side, is scattered.
    let pages = ScatteredPages::new(4 << 20)?;
    // SAFETY: `pages` stays mapped until after the buffer is dropped below, and the test touches
    // it only through the buffer's host views.
    let buf = unsafe { st.register_host(pages.ptr, pages.len) }?;
    // Without an IOMMU the bus addresses are the scattered physical ones; with one, the DMA API
    // may merge them into one IOVA range. The library's segment list is private: the same pinned
    // pages, registered once more through the module's ioctls on another open file, show it.
    let iommu = std::fs::read_dir("/sys/kernel/iommu_groups").map(|d| d.count() > 0).unwrap_or(false);
    let raw = crate::raw::RawDev::open(&node)?;
    let addr = buf.host_ptr().context("host memory has an address")? as u64;
    let h = raw.register(addr, buf.len() as u64)?;
    let nsegs = raw.segments(h)?.len();
    raw.deregister(h.id, h.generation)?;
    drop(raw);
    // No two neighbouring pages are physical neighbours, so without an IOMMU nearly every page
    // is a segment of its own (a quarter leaves room for chance neighbours).
    let want = buf.len() / 4096 / 4;
    ensure_that!(iommu || nsegs > want, "expected a scattered registration (over {want} segments), got {nsegs}");
    // Offsets inside the buffer that are not page aligned (PRP1 with an offset), and transfers
    // larger than MDTS (8 KiB here) that split into many commands.
    for (boff, len) in [(512u64, 512u64), (1028, 4096), (4096 + 2052, 65536), (12, 1 << 20)] {
        let doff = 4096 * 7;
        pattern::fill(9, doff, &mut buf.host_view()?[boff as usize..(boff + len) as usize]);
        st.write(&buf, boff, doff, len)?;
        buf.host_view()?.fill(0);
        st.read(&buf, boff, doff, len)?;
        let got = &buf.host_view()?[boff as usize..(boff + len) as usize];
        ensure_that!(pattern::first_mismatch(9, doff, got).is_none(), "buffer offset {boff} len {len}: data differs");
    }
    drop((buf, st, dev, pages));
    unbind(&nvme_controllers()?[1])
}

/// Host memory whose physical pages are not neighbours by construction: a mapping of twice the
/// size is faulted in with 4 KiB pages, then every other page is moved into a mapping of its own
/// (`mremap`), so two neighbouring pages here were never neighbours there.
struct ScatteredPages {
    ptr: *mut u8,
    len: usize,
}

impl ScatteredPages {
    fn new(len: usize) -> Result<Self> {
        const PAGE: usize = 4096;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: fresh anonymous mappings that nothing else refers to; every page moved or
        // written lies inside the mapping made here, and the source is unmapped at the end.
        unsafe {
            let src = libc::mmap(std::ptr::null_mut(), 2 * len, rw, anon, -1, 0);
            anyhow::ensure!(src != libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            let src = src.cast::<u8>();
            // Small pages: a huge page moved in 4 KiB pieces would still be one run.
            let _ = libc::madvise(src.cast(), 2 * len, libc::MADV_NOHUGEPAGE);
            for i in (0..2 * len).step_by(PAGE) {
                src.add(i).write_volatile(1);
            }
            let dst = libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, anon, -1, 0);
            if dst == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                libc::munmap(src.cast(), 2 * len);
                anyhow::bail!("mmap: {e}");
            }
            let this = Self { ptr: dst.cast(), len };
            for i in (0..len).step_by(PAGE) {
                let to = this.ptr.add(i).cast();
                let moved =
                    libc::mremap(src.add(2 * i).cast(), PAGE, PAGE, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to);
                if moved != to {
                    let e = std::io::Error::last_os_error();
                    libc::munmap(src.cast(), 2 * len);
                    anyhow::bail!("mremap: {e}");
                }
            }
            libc::munmap(src.cast(), 2 * len);
            Ok(this)
        }
    }
}

impl Drop for ScatteredPages {
    fn drop(&mut self) {
        // SAFETY: the mapping is this value's own, and the buffer registered on it is gone.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn checksum(st: &Storage) -> Result<u64> {
    let buf = st.alloc_host(8 << 20)?;
    let cap = st.capacity()?;
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut off = 0;
    while off < cap {
        let n = (8 << 20).min(cap - off);
        st.read(&buf, 0, off, n)?;
        for w in buf.host_view()?[..n as usize].chunks(8) {
            h = (h ^ u64::from_le_bytes(w.try_into()?)).wrapping_mul(0x100_0000_01b3);
        }
        off += n;
    }
    Ok(h)
}

fn expect_invalid<T: std::fmt::Debug>(what: &str, r: ugds::Result<T>, arg: &str) -> Result<()> {
    match r {
        Err(Error::InvalidArgument { arg: a, reason }) if a == arg => {
            ensure_that!(!reason.is_empty(), "{what}: empty reason");
            Ok(())
        }
        other => anyhow::bail!("{what}: expected InvalidArgument({arg}), got {other:?}"),
    }
}

fn bad_requests() -> Result<()> {
    let node = bound_node(2)?;
    let other_node = bound_node(3)?;
    let dev = Device::open(&node)?;
    let other = Device::open_with(&other_node, DeviceOptions { queues: 1, ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    let before = checksum(&st)?;
    let (bs, cap) = (st.block_size(), st.capacity()?);
    let buf = st.alloc_host(64 * 1024)?;
    buf.host_view()?.fill(0xAB);
    let other_st = Storage::direct(&other, 1)?;
    let foreign = other_st.alloc_host(4096)?;
    // Another storage of the same device: a buffer belongs to the storage it was registered for.
    let sibling = Storage::direct(&dev, 1)?.alloc_host(4096)?;
    let counts = st.path_counts();
    expect_invalid("past the end", st.write(&buf, 0, cap, bs), "file_offset")?;
    expect_invalid("straddling the end", st.write(&buf, 0, cap - bs, 2 * bs), "file_offset")?;
    expect_invalid("unaligned device offset", st.write(&buf, 0, 1, bs), "file_offset")?;
    expect_invalid("length not a block multiple", st.write(&buf, 0, 0, bs + 1), "len")?;
    expect_invalid("zero length", st.write(&buf, 0, 0, 0), "len")?;
    expect_invalid("past the buffer", st.write(&buf, 60 * 1024, 0, 8192), "buf_offset")?;
    expect_invalid("unaligned buffer offset", st.write(&buf, 2, 0, bs), "buf_offset")?;
    expect_invalid("buffer of another device", st.write(&foreign, 0, 0, bs), "buf")?;
    expect_invalid("buffer of another storage", st.write(&sibling, 0, 0, bs), "buf")?;
    expect_invalid("read past the end", st.read(&buf, 0, u64::MAX - bs + 1, bs), "file_offset")?;
    match dev.namespace(9) {
        Err(Error::NoNamespace(9)) => {}
        other => anyhow::bail!("namespace 9: {other:?}"),
    }
    match Storage::direct(&dev, 9) {
        Err(Error::NoNamespace(9)) => {}
        other => anyhow::bail!("storage on namespace 9: {other:?}"),
    }
    let msg = st.write(&buf, 0, cap, bs).unwrap_err().to_string();
    ensure_that!(msg.contains("file_offset") && msg.contains("runs past"), "message does not say what and why: {msg}");
    ensure_that!(st.path_counts() == counts, "rejected requests were counted: {:?}", st.path_counts());
    ensure_that!(checksum(&st)? == before, "a rejected request changed the disk");
    drop((buf, foreign, sibling, st, other_st, dev, other));
    unbind(&nvme_controllers()?[2])?;
    unbind(&nvme_controllers()?[3])
}

fn flush_zeroes_trim() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let ns = dev.namespace(1)?;
    let st = Storage::direct(&dev, 1)?;
    let buf = st.alloc_host(65536)?;
    pattern::fill(3, 1 << 20, &mut buf.host_view()?);
    st.write(&buf, 0, 1 << 20, 65536)?;
    st.flush()?;
    ns.flush()?;
    ns.write_zeroes(1 << 20, 16384)?;
    st.read(&buf, 0, 1 << 20, 65536)?;
    let b = buf.host_view()?;
    ensure_that!(b[..16384].iter().all(|x| *x == 0), "write zeroes left data");
    ensure_that!(pattern::first_mismatch(3, (1 << 20) + 16384, &b[16384..]).is_none(), "write zeroes touched too much");
    drop(b);
    ns.deallocate(1 << 20, 65536)?;
    st.read(&buf, 0, 1 << 20, 65536)?;
    drop((buf, st, dev));
    unbind(&nvme_controllers()?[0])
}

/// Child: after setup, forbid every system call but exit, then run 10 000 I/Os.
pub fn syscall_free_child(node: &str) -> Result<()> {
    // Polling makes no system call at all; adaptive waiting (the default) makes them only for
    // a wait that sleeps, which a loaded host makes happen at random.
    let dev = Device::open_with(node, DeviceOptions { queues: 1, waiting: Waiting::Poll, ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    let buf = st.alloc_host(4096)?;
    // Warm up (first touches, lazy thread-locals).
    for i in 0..10 {
        st.write(&buf, 0, i * 4096, 4096)?;
        st.read(&buf, 0, i * 4096, 4096)?;
    }
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    let prog = [
        SockFilter { code: 0x20, jt: 0, jf: 0, k: 0 },   // ld seccomp_data.nr
        SockFilter { code: 0x15, jt: 2, jf: 0, k: 231 }, // exit_group -> allow
        SockFilter { code: 0x15, jt: 1, jf: 0, k: 60 },  // exit -> allow
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x8000_0000 }, // kill process
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }, // allow
    ];
    let fprog = SockFprog { len: prog.len() as u16, filter: prog.as_ptr() };
    // SAFETY: prctl/seccomp with a valid, live filter program.
    unsafe {
        ensure_that!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs");
        ensure_that!(libc::syscall(libc::SYS_seccomp, 1, 0, &fprog as *const SockFprog) == 0, "seccomp");
    }
    let mut ok = true;
    for i in 0..5000u64 {
        ok &= st.write(&buf, 0, (i % 1000) * 4096, 4096).is_ok_and(|n| n == 4096);
        ok &= st.read(&buf, 0, (i % 1000) * 4096, 4096).is_ok_and(|n| n == 4096);
    }
    // SAFETY: exit_group is allowed; no destructors need to run.
    unsafe { libc::_exit(if ok { 0 } else { 3 }) }
}

fn no_syscalls() -> Result<()> {
    let node = bound_node(0)?;
    let me = std::env::current_exe()?;
    let out = std::process::Command::new(me).args(["--child", "syscall-free", &node]).output()?;
    use std::os::unix::process::ExitStatusExt;
    ensure_that!(
        out.status.signal() != Some(libc::SIGSYS),
        "the I/O loop made a system call (killed by seccomp): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure_that!(out.status.success(), "child failed: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    println!(
        "    10000 I/Os (5000 writes + 5000 reads of 4 KiB) under a seccomp filter that kills on any system call: ok"
    );
    unbind(&nvme_controllers()?[0])
}

fn cli() -> Result<()> {
    let node = bound_node(0)?;
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let info = sh(&format!("{bin} --json info {node}"))?;
    ensure_that!(info.contains("\"model\":\"QEMU NVMe Ctrl\"") && info.contains("\"block_size\":4096"), "info: {info}");
    sh(&format!("{bin} write {node} --offset 64K --len 1M --pattern 5"))?;
    sh(&format!("{bin} read {node} --offset 64K --len 1M --check-pattern 5"))?;
    let bad = std::process::Command::new(&bin)
        .args(["read", &node, "--offset", "64K", "--len", "1M", "--check-pattern", "6"])
        .output()?;
    ensure_that!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("pattern mismatch at byte offset 65536"),
        "wrong seed not detected"
    );
    let to = format!("/tmp/ugds-cli-past-{}", std::process::id());
    let past = std::process::Command::new(&bin)
        .args(["read", &node, "--offset", "1G", "--len", "4K", "--to", &to])
        .output()?;
    // The CLI names the refused range (1 GiB = 1073741824), the target and why, as for files.
    let why = String::from_utf8_lossy(&past.stderr);
    ensure_that!(
        !past.status.success() && why.contains("[1073741824, +4096) runs past the end") && why.contains(&node),
        "out-of-range read not reported: {why}"
    );
    ensure_that!(!std::path::Path::new(&to).exists(), "a refused read created its output file");
    let b = sh(&format!("{bin} bench {node} --rw randread --runtime 1 --bs 4K"))?;
    ensure_that!(b.contains("IOPS") && b.contains("99.99th"), "bench: {b}");
    println!("    {}", b.trim());
    unbind(&nvme_controllers()?[0])
}

/// GPU memory of the CPU stand-in (a memfd, exported as a real dma-buf by udmabuf) registered
/// peer-to-peer: the SSD reads and writes it by DMA, and the data matches host-memory I/O.
fn dmabuf_io() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let st = Storage::direct(&dev, 1)?;
    let len = 256 * 1024usize;
    let mut data = vec![0u8; len];
    pattern::fill(21, 8 << 20, &mut data);
    let gpu = Gpu::cpu();
    let dbuf = st.register_gpu(Arc::new(gpu.alloc(len)?), false)?;
    ensure_that!(dbuf.path() == Path::DirectP2p, "the dma-buf took {}", dbuf.path());
    ensure_that!(dbuf.host_view().is_err(), "a dma-buf registration exposes no host slice");
    dbuf.copy_in(0, &data)?;
    st.write(&dbuf, 0, 8 << 20, len as u64)?;
    let hbuf = st.alloc_host(len)?;
    st.read(&hbuf, 0, 8 << 20, len as u64)?;
    ensure_that!(*hbuf.host_view()? == data[..], "dma-buf -> disk -> host differs");
    st.read(&dbuf, 0, 0, len as u64)?;
    let mut back = vec![0u8; len];
    dbuf.copy_out(0, &mut back)?;
    st.read(&hbuf, 0, 0, len as u64)?;
    ensure_that!(*hbuf.host_view()? == back[..], "disk -> dma-buf differs from disk -> host");
    let c = st.path_counts();
    ensure_that!(c.direct_p2p == 2 && c.direct_host == 2 && c.direct_staged == 0, "path counts: {c:?}");
    drop((dbuf, hbuf, st, dev));
    unbind(&nvme_controllers()?[0])
}

/// With the guest IOMMU translating (DMA API addresses are IOVAs), ugds I/O is still correct.
fn iommu_io() -> Result<()> {
    let groups = std::fs::read_dir("/sys/kernel/iommu_groups").map(|d| d.count()).unwrap_or(0);
    ensure_that!(groups > 0, "no IOMMU groups: the guest IOMMU is off");
    let addr = nvme_controllers()?[0].clone();
    let ty = std::fs::read_to_string(format!("/sys/bus/pci/devices/{addr}/iommu_group/type"))?;
    ensure_that!(ty.trim().starts_with("DMA"), "the NVMe function is not translated: {ty}");
    let node = bound_node(0)?;
    let st = Storage::open(&node)?;
    ensure_that!(st.is_direct(), "{node} did not take the direct path: {}", st.describe());
    let buf = st.alloc_host(1 << 20)?;
    pattern::fill(8, 0, &mut buf.host_view()?);
    st.write(&buf, 0, 0, 1 << 20)?;
    buf.host_view()?.fill(0);
    st.read(&buf, 0, 0, 1 << 20)?;
    ensure_that!(pattern::first_mismatch(8, 0, &buf.host_view()?).is_none(), "data differs under the IOMMU");
    drop((buf, st));
    unbind(&addr)?;
    kernel_check(&format!("/dev/{}n1", nvme_name(&addr)?), 8, 0, 1 << 20)
}

fn thread_cpu() -> std::time::Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Interrupt mode, and adaptive waiting for a request above its spin limit, read the same data
/// as polling, with under 20 % of its CPU time per 1 MiB read.
/// The drive takes milliseconds per command, as a real SSD takes hundreds of microseconds: under
/// TCG a wake-up costs tens of microseconds of emulated CPU, so an instant device would measure
/// the emulator, not the waiting.
fn interrupt_mode() -> Result<()> {
    let node = bound_node(4)?;
    let opts = |waiting, spin_max_bytes| DeviceOptions { queues: 1, waiting, spin_max_bytes, ..Default::default() };
    let poll = Device::open_with(&node, opts(Waiting::Poll, u64::MAX))?;
    let irq = Device::open_with(&node, opts(Waiting::Interrupts, u64::MAX))?;
    let adaptive = Device::open_with(&node, opts(Waiting::Adaptive, 64 << 10))?;
    ensure_that!(
        (poll.waiting(), irq.waiting(), adaptive.waiting()) == (Waiting::Poll, Waiting::Interrupts, Waiting::Adaptive),
        "modes in effect: {:?} {:?} {:?}",
        poll.waiting(),
        irq.waiting(),
        adaptive.waiting()
    );
    let off = 16u64 << 20;
    let poll_st = Storage::direct(&poll, 1)?;
    let irq_st = Storage::direct(&irq, 1)?;
    let adaptive_st = Storage::direct(&adaptive, 1)?;
    let src = poll_st.alloc_host(1 << 20)?;
    pattern::fill(12, off, &mut src.host_view()?);
    poll_st.write(&src, 0, off, 1 << 20)?;
    let mut figures = Vec::new();
    for (mode, st) in [("polling", &poll_st), ("interrupts", &irq_st), ("adaptive above its spin limit", &adaptive_st)]
    {
        let buf = st.alloc_host(1 << 20)?;
        // CPU time is sampled at the scheduler tick here: measure one long loop, not sums of
        // per-read deltas, and verify outside it.
        st.read(&buf, 0, off, 1 << 20)?;
        ensure_that!(pattern::first_mismatch(12, off, &buf.host_view()?).is_none(), "{mode}: data differs");
        let n = 10;
        let (c0, t0) = (thread_cpu(), std::time::Instant::now());
        for _ in 0..n {
            st.read(&buf, 0, off, 1 << 20)?;
        }
        let cpu = (thread_cpu() - c0).as_secs_f64() * 1e6 / n as f64;
        let wall = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        ensure_that!(pattern::first_mismatch(12, off, &buf.host_view()?).is_none(), "{mode}: data differs");
        println!("    {mode}: {cpu:.0} us CPU and {wall:.0} us wall per 1 MiB read");
        figures.push(cpu);
    }
    let below = figures[1] < 0.2 * figures[0];
    ensure_that!(below, "interrupt mode used {:.0} us CPU vs polling {:.0} us", figures[1], figures[0]);
    let below = figures[2] < 0.2 * figures[0];
    ensure_that!(below, "adaptive waiting used {:.0} us CPU vs polling {:.0} us", figures[2], figures[0]);
    drop((src, poll_st, irq_st, adaptive_st, poll, irq, adaptive));
    unbind(&nvme_controllers()?[4])
}

/// A namespace formatted with metadata (QEMU `ms=8`) is refused by name, with what to do; the
/// controller's other, metadata-free namespace works.
fn metadata_namespace() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open_with(&node, DeviceOptions { queues: 1, ..Default::default() })?;
    match dev.namespace(2) {
        Err(e @ Error::Unsupported { .. }) => {
            let s = e.to_string();
            ensure_that!(s.contains("8 bytes of metadata") && s.contains("nvme format"), "unhelpful error: {s}");
        }
        other => anyhow::bail!("namespace 2 (ms=8): expected Unsupported, got {:?}", other.map(|_| ())),
    }
    match Storage::direct(&dev, 2) {
        Err(Error::Unsupported { .. }) => {}
        other => anyhow::bail!("a storage on namespace 2 (ms=8): expected Unsupported, got {other:?}"),
    }
    let st = Storage::direct(&dev, 1)?;
    let buf = st.alloc_host(8192)?;
    let mut data = vec![0u8; 8192];
    pattern::fill(77, 4096, &mut data);
    buf.copy_in(0, &data)?;
    st.write(&buf, 0, 4096, 8192)?;
    buf.host_view()?.fill(0);
    st.read(&buf, 0, 4096, 8192)?;
    ensure_that!(buf.host_view()?[..] == data[..], "namespace 1 round trip differs");
    let out = sh(&format!("{} info {node}", std::env::var("UGDS_CLI").unwrap_or_else(|_| "ugds".into())))?;
    ensure_that!(out.contains("namespace 1") && out.contains("namespace 2"), "ugds info: {out}");
    Ok(())
}
