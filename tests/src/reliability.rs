//! Reliability: forced timeouts and recoveries on a throttled drive, kill -9 at random moments
//! with a poison check for late DMA, an ioctl fuzzer, and a stray PRP under the IOMMU.

use crate::kmod::bound_node;
use crate::raw::{HostBuf, RawDev};
use crate::{ensure_that, kmsg, nvme_controllers, xtask, Test};
use anyhow::{Context, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use ugds::{pattern, Device, DeviceOptions, Error, Storage};
use ugds_uapi::ioctl::*;
use ugds_uapi::queue::nvm;
use ugds_uapi::Sqe;

const V: &str = "reliability";

/// The reliability tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "rel_100_forced_timeouts_100_recoveries", variant: V, run: forced_timeouts },
        Test { name: "rel_100_kill9_no_late_dma_no_leak", variant: V, run: kill9_poison },
        Test { name: "rel_ioctl_fuzzer_100k_calls", variant: V, run: ioctl_fuzzer },
        Test { name: "rel_iommu_stray_prp_blocked", variant: "iommu", run: stray_prp },
    ]
}

/// Controllers: a throttled drive (20 I/O per second: 50 ms per command) and a normal one.
pub const NVME: &[&str] = &["size=64M,throttle_iops=20,mdts=1", "size=128M"];

fn unbind_all() -> Result<()> {
    for a in nvme_controllers()? {
        if crate::driver_of(&a).as_deref() != Some("nvme") {
            let (ok, out) = xtask(&["unbind", &a])?;
            ensure_that!(ok, "unbind {a}: {out}");
        }
    }
    Ok(())
}

/// Forced timeouts on a throttled drive, each recovered by a controller reset. A storage's
/// per-command deadline is its device's (`DeviceOptions::timeout`), so the hasty reads use a
/// device opened with a 5 ms deadline and the patient ones another open file of this process
/// with 10 s; the other user is a third open file, as another process would be.
fn forced_timeouts() -> Result<()> {
    let node = bound_node(0)?;
    let opts = |timeout| DeviceOptions { queues: 1, timeout, ..Default::default() };
    let hasty_dev = Device::open_with(&node, opts(Duration::from_millis(5)))?;
    let dev = Device::open_with(&node, opts(Duration::from_secs(10)))?;
    let other = Device::open_with(&node, opts(Duration::from_secs(10)))?;
    let hasty = Storage::direct(&hasty_dev, 1)?;
    let patient = Storage::direct(&dev, 1)?;
    let ost = Storage::direct(&other, 1)?;
    // 64 KiB at MDTS 8 KiB is 8 commands: on a drive doing 20 I/O per second the burst cannot
    // finish within the 5 ms deadline, however full the throttle's bucket is.
    let big = hasty.alloc_host(65536)?;
    let buf = patient.alloc_host(4096)?;
    pattern::fill(44, 8192, &mut buf.host_view()?);
    patient.write(&buf, 0, 8192, 4096)?;
    let obuf = ost.alloc_host(4096)?;
    // The other user has done I/O before the first reset, as a running process has: its
    // thread's queue pair predates the reset (one made after it has no epoch change to report).
    ost.read(&obuf, 0, 8192, 4096)?;
    let resets0 = dev.counters()?.resets;
    let (mut timeouts, mut recoveries, mut epoch_errors, mut own_epoch_errors) = (0, 0, 0, 0);
    let start = Instant::now();
    for i in 0..100 {
        // Its own reset resynchronises the hasty storage's queue: every read after the first
        // times out again instead of reporting the epoch change it caused.
        match hasty.read(&big, 0, 0, 65536) {
            Err(Error::Timeout { .. }) => timeouts += 1,
            other => anyhow::bail!("iteration {i}: expected a timeout on the throttled drive, got {other:?}"),
        }
        ensure_that!(big.inflight() == 0, "iteration {i}: timed-out commands still counted after the reset");
        ensure_that!(big.host_view().is_ok(), "iteration {i}: the timed-out buffer is still leased after the reset");
        // This process's other open file sees the epoch change once, then reads correct data.
        buf.host_view()?.fill(0);
        match patient.read(&buf, 0, 8192, 4096) {
            Err(Error::EpochChanged { .. }) => {
                own_epoch_errors += 1;
                patient.read(&buf, 0, 8192, 4096).with_context(|| format!("iteration {i}: after recovery"))?;
            }
            Ok(_) => {}
            Err(e) => anyhow::bail!("iteration {i}: after recovery: {e}"),
        }
        ensure_that!(
            pattern::first_mismatch(44, 8192, &buf.host_view()?).is_none(),
            "iteration {i}: data differs after recovery"
        );
        recoveries += 1;
        // The other user sees the epoch change once, then carries on.
        match ost.read(&obuf, 0, 8192, 4096) {
            Err(Error::EpochChanged { .. }) => {
                epoch_errors += 1;
                ost.read(&obuf, 0, 8192, 4096)?;
            }
            Ok(_) => {}
            Err(e) => anyhow::bail!("iteration {i}: other user: {e}"),
        }
        ensure_that!(*obuf.host_view()? == *buf.host_view()?, "iteration {i}: other user reads different data");
    }
    let resets = dev.counters()?.resets - resets0;
    println!(
        "    {timeouts} forced timeouts, {recoveries} recoveries, {resets} controller resets, {epoch_errors} epoch-changed errors seen by the other user ({own_epoch_errors} by this process's patient open file), {:.1} s",
        start.elapsed().as_secs_f64()
    );
    ensure_that!(timeouts == 100 && recoveries == 100 && resets >= 100, "counts");
    ensure_that!(epoch_errors == 100, "the other user did not see every epoch change");
    ensure_that!(own_epoch_errors == 100, "this process's other open file did not see every epoch change");
    drop((big, buf, obuf, hasty, patient, ost, hasty_dev, dev, other));
    unbind_all()
}

/// Child: maps the shared memfd, registers it, and runs mixed reads (DMA into it) and writes
/// from two threads until killed.
pub fn crash_child(node: &str, memfd: i32, len: usize) -> Result<()> {
    // SAFETY: mapping the inherited memfd shared; it stays mapped until the process dies.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd, 0)
    };
    ensure_that!(p != libc::MAP_FAILED, "mmap memfd");
    let dev = Device::open_with(node, DeviceOptions { queues: 2, ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    let half = len / 2;
    // SAFETY: the mapping lives until the process dies; no Rust references to it exist (both
    // halves start on a page boundary: `half` is a multiple of 4096).
    let bufs = unsafe { [st.register_host(p.cast(), half)?, st.register_host((p as *mut u8).add(half), half)?] };
    println!("READY");
    std::thread::scope(|s| {
        for (t, buf) in bufs.into_iter().enumerate() {
            let st = &st;
            s.spawn(move || {
                let mut x = 0x1234_5678u64 + t as u64;
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % 256) * 65536;
                    let _ = if x & 1 == 0 {
                        st.read(&buf, 0, off, half as u64)
                    } else {
                        st.write(&buf, 0, off, half as u64)
                    };
                }
            });
        }
    });
    Ok(())
}

fn memfd(len: usize) -> Result<OwnedFd> {
    let name = std::ffi::CString::new("ugds-poison")?;
    // SAFETY: valid name; not CLOEXEC so the child inherits it.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    ensure_that!(fd >= 0, "memfd_create");
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall.
    ensure_that!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) } == 0, "ftruncate");
    Ok(fd)
}

fn kill9_poison() -> Result<()> {
    let node = bound_node(1)?;
    let probe = RawDev::open(&node)?;
    let baseline = probe.status()?;
    let len = 1 << 20;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let start = Instant::now();
    for i in 0..100 {
        let fd = memfd(len)?;
        let map = crate::raw::Mapping::new(fd.as_raw_fd(), 0, len, libc::PROT_READ | libc::PROT_WRITE)?;
        let mut child = crate::spawn_ready_child(&["crash-io", &node, &fd.as_raw_fd().to_string(), &len.to_string()])
            .with_context(|| format!("iteration {i}: child did not start"))?;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(rng % 150));
        child.kill()?;
        child.wait()?;
        // The module has released the child's registrations. If any command could still
        // write, it would write into these (still allocated) pages: poison them and look.
        for off in (0..len).step_by(8) {
            map.write64(off, 0xA5A5_A5A5_A5A5_A5A5);
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut back = vec![0u8; len];
        map.read_bytes(0, &mut back);
        ensure_that!(
            back.iter().all(|b| *b == 0xA5),
            "iteration {i}: memory changed after the process died (late DMA)"
        );
        let st = probe.status()?;
        ensure_that!(
            st.pinned_pages == baseline.pinned_pages
                && st.qpairs == baseline.qpairs
                && st.registrations == baseline.registrations,
            "iteration {i}: leaked: {st:?} vs {baseline:?}"
        );
        if i % 20 == 19 {
            // The next process works and reads correct data.
            let st = Storage::open(&node)?;
            let buf = st.alloc_host(65536)?;
            pattern::fill(i, 32 << 20, &mut buf.host_view()?);
            st.write(&buf, 0, 32 << 20, 65536)?;
            buf.host_view()?.fill(0);
            st.read(&buf, 0, 32 << 20, 65536)?;
            ensure_that!(pattern::first_mismatch(i, 32 << 20, &buf.host_view()?).is_none(), "next process data");
        }
    }
    println!("    100 kill -9 during mixed I/O: no late DMA into released memory, pinned pages back to {} each time, {:.1} s", baseline.pinned_pages, start.elapsed().as_secs_f64());
    drop(probe);
    unbind_all()
}

fn ioctl_fuzzer() -> Result<()> {
    let node = bound_node(1)?;
    let scratch = HostBuf::new(1 << 20)?;
    let mut arg = [0u64; 64];
    let mut x = 0xDEAD_BEEF_1234_5678u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let requests = [
        IOCTL_GET_INFO,
        IOCTL_CREATE_QPAIR,
        IOCTL_DELETE_QPAIR,
        IOCTL_REGISTER_HOST,
        IOCTL_REGISTER_DMABUF,
        IOCTL_GET_SEGMENTS,
        IOCTL_DEREGISTER,
        IOCTL_SET_EVENTFD,
    ];
    let mut by_errno = std::collections::BTreeMap::new();
    let start = Instant::now();
    for round in 0..10 {
        let dev = RawDev::open(&node)?;
        for _ in 0..10_000 {
            let r = next();
            // Mostly our requests (to get past dispatch), sometimes any number; RESET rarely.
            let req = match r % 16 {
                0 => next() as u32,
                1 if r % 997 == 1 => IOCTL_RESET,
                _ => requests[(r >> 8) as usize % requests.len()],
            };
            for w in arg.iter_mut() {
                *w = match next() % 4 {
                    0 => next(),
                    1 => next() % 2048,
                    2 => scratch.addr() + (next() % 256) * 4096,
                    _ => 0,
                };
            }
            // Pointer fields the kernel writes through must point into the scratch buffer.
            if req == IOCTL_GET_SEGMENTS {
                arg[2] = scratch.addr() + (next() % 64) * 4096;
                arg[1] = (arg[1] & 0xFFFF_FFFF) | ((next() % 64) << 32);
            }
            let res = crate::raw::ioctl_raw(dev.fd(), req, &mut arg);
            let key = res.map(|_| 0).unwrap_or_else(|e| e.raw_os_error().unwrap_or(-1));
            *by_errno.entry(key).or_insert(0u32) += 1;
        }
        drop(dev);
        let st = RawDev::open(&node)?.status()?;
        ensure_that!(
            st.pinned_pages == 0 && st.qpairs == 0 && st.registrations == 0,
            "round {round}: the fuzzer's objects leaked after close: {st:?}"
        );
    }
    println!(
        "    100000 random ioctls in {:.1} s, results by errno (0 = success): {by_errno:?}",
        start.elapsed().as_secs_f64()
    );
    unbind_all()
}

/// A command whose PRP names bus memory nobody registered: the IOMMU must block the access
/// (a DMAR fault for exactly that address) and no memory of ours may change. QEMU 7.2's NVMe
/// model does not turn the blocked access into an error status (its DMA helpers fall back to a
/// bounce buffer and ignore the fault), so the completion status and, for a write, the
/// transferred bytes are reported, not asserted.
fn stray_prp() -> Result<()> {
    kmsg::expect("DMAR: DRHD: handling fault");
    kmsg::expect("DMAR: [DMA ");
    let mut watch = kmsg::KmsgWatch::new()?;
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(16)?;
    let mut buf = HostBuf::new(8192)?;
    buf.bytes_mut().fill(0x5A);
    let h = dev.register(buf.addr(), 8192)?;
    let stray = 0x7_dead_0000u64;
    for (op, cid) in [(nvm::READ, 78u16), (nvm::WRITE, 77)] {
        let mut s = Sqe::new(op, cid);
        s.set_nsid(ns.nsid);
        s.set_prps(stray, 0);
        s.set_slba(64);
        s.set_nlb(4096u32 >> ns.lba_shift);
        qp.push(s);
        qp.ring();
        let c = qp.wait(1, Duration::from_secs(10))?;
        println!("    stray-PRP {} completed with: {}", if op == nvm::READ { "read" } else { "write" }, c[0].status());
    }
    std::thread::sleep(Duration::from_millis(100));
    let log = watch.new_messages();
    let fault = log.iter().any(|l| l.contains("fault addr 0x7dead0000"));
    ensure_that!(fault, "no IOMMU fault for the stray address; kernel log:\n{}", log.join("\n"));
    ensure_that!(buf.bytes().iter().all(|b| *b == 0x5A), "registered memory changed by a stray DMA");
    println!("    the IOMMU blocked both accesses (DMAR fault at 0x7dead0000); registered memory unchanged");
    dev.deregister(h.id, h.generation)?;
    drop(qp);
    drop(dev);
    unbind_all()
}
