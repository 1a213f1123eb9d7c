//! Data path tests (crate `ugds`): integrity against the kernel driver in both directions over
//! several geometries, threads on few queues, scattered registrations, bad requests, the
//! syscall-free loop, the CLI.

use crate::kmod::bound_node;
use crate::{driver_of, ensure_that, nvme_controllers, nvme_name, sh, xtask, AlignedBuf, Test};
use anyhow::{Context, Result};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use ugds::{pattern, Device, DeviceOptions, Error};

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

fn unbind(addr: &str) -> Result<()> {
    if driver_of(addr).as_deref() != Some("nvme") {
        let (ok, out) = xtask(&["unbind", addr])?;
        ensure_that!(ok, "unbind {addr}: {out}");
    }
    Ok(())
}

/// The kernel's block devices of a controller as (nsid, name): the name's number is an
/// instance counter, not the namespace id, so the `nsid` attribute decides.
fn kernel_namespaces(ctrl: &str) -> Result<Vec<(u32, String)>> {
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

fn kernel_check(dev: &str, seed: u64, off: u64, len: u64) -> Result<()> {
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
    for idx in 0..NVME.len() {
        let addr = nvme_controllers()?[idx].clone();
        let node = bound_node(idx)?;
        let dev = Device::open(&node)?;
        let mut plan = Vec::new();
        for ns in dev.namespaces() {
            let seed = 1000 + idx as u64 * 10 + ns.id() as u64;
            let mut reg = dev.alloc(8 << 20)?;
            for (off, len) in ranges(seed, ns.block_size(), ns.capacity(), 6) {
                let buf = reg.as_mut_slice().context("host memory")?;
                pattern::fill(seed, off, &mut buf[..len as usize]);
                ns.write(&reg, 0, off, len).with_context(|| format!("ctrl {idx} ns {} write {off}+{len}", ns.id()))?;
                plan.push((ns.id(), seed, off, len));
            }
        }
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

fn kernel_writes_ugds_reads() -> Result<()> {
    for idx in 0..NVME.len() {
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
        let dev = Device::open(&node)?;
        let mut reg = dev.alloc(8 << 20)?;
        for (nsid, seed, off, len) in plan {
            let ns = dev.namespace(nsid)?;
            ns.read(&mut reg, 0, off, len)?;
            let buf = &reg.as_slice().context("host memory")?[..len as usize];
            if let Some(bad) = pattern::first_mismatch(seed, off, buf) {
                anyhow::bail!("controller {idx} ns {nsid}: ugds read byte {bad} differs (range {off}+{len})");
            }
        }
        drop(reg);
        drop(dev);
        unbind(&addr)?;
    }
    Ok(())
}

fn eight_threads_one_queue() -> Result<()> {
    let node = bound_node(3)?;
    let dev = Device::open_with(&node, DeviceOptions { queues: 1, depth: 64, ..Default::default() })?;
    let ns = dev.namespace(1)?;
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let (dev, ns) = (&dev, &ns);
                s.spawn(move || -> Result<()> {
                    let mut reg = dev.alloc(256 * 1024)?;
                    for i in 0..10u64 {
                        let off = (t * 10 + i) * 256 * 1024;
                        let seed = 77 + t;
                        pattern::fill(seed, off, reg.as_mut_slice().context("mem")?);
                        ns.write(&reg, 0, off, 256 * 1024)?;
                        reg.as_mut_slice().context("mem")?.fill(0);
                        ns.read(&mut reg, 0, off, 256 * 1024)?;
                        if let Some(b) = pattern::first_mismatch(seed, off, &reg.as_slice().context("mem")?) {
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
    drop(dev);
    unbind(&nvme_controllers()?[3])
}

fn scattered_registration() -> Result<()> {
    let node = bound_node(1)?;
    let dev = Device::open(&node)?;
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(4 << 20)?;
    // Without an IOMMU, anonymous memory maps to scattered bus addresses; with one, the DMA API
    // may merge it into one IOVA range.
    let iommu = std::fs::read_dir("/sys/kernel/iommu_groups").map(|d| d.count() > 0).unwrap_or(false);
    ensure_that!(
        iommu || reg.segments().len() > 1,
        "expected a scattered registration, got {} segment(s)",
        reg.segments().len()
    );
    // Offsets inside the registration that are not page aligned (PRP1 with an offset), and
    // transfers larger than MDTS (8 KiB here) that split into many commands.
    for (roff, len) in [(512u64, 512u64), (1028, 4096), (4096 + 2052, 65536), (12, 1 << 20)] {
        let doff = 4096 * 7;
        pattern::fill(9, doff, &mut reg.as_mut_slice().context("mem")?[roff as usize..(roff + len) as usize]);
        ns.write(&reg, roff, doff, len)?;
        reg.as_mut_slice().context("mem")?.fill(0);
        ns.read(&mut reg, roff, doff, len)?;
        let got = &reg.as_slice().context("mem")?[roff as usize..(roff + len) as usize];
        ensure_that!(pattern::first_mismatch(9, doff, got).is_none(), "reg offset {roff} len {len}: data differs");
    }
    drop(reg);
    drop(dev);
    unbind(&nvme_controllers()?[1])
}

fn checksum(dev: &Device) -> Result<u64> {
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(8 << 20)?;
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut off = 0;
    while off < ns.capacity() {
        let n = (8 << 20).min(ns.capacity() - off);
        ns.read(&mut reg, 0, off, n)?;
        for w in reg.as_slice().context("mem")?[..n as usize].chunks(8) {
            h = (h ^ u64::from_le_bytes(w.try_into()?)).wrapping_mul(0x100_0000_01b3);
        }
        off += n;
    }
    Ok(h)
}

fn expect_invalid(what: &str, r: ugds::Result<()>, arg: &str) -> Result<()> {
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
    let before = checksum(&dev)?;
    let ns = dev.namespace(1)?;
    let bs = ns.block_size();
    let mut reg = dev.alloc(64 * 1024)?;
    reg.as_mut_slice().context("mem")?.fill(0xAB);
    let foreign = other.alloc(4096)?;
    expect_invalid("past the end", ns.write(&reg, 0, ns.capacity(), bs), "dev_offset")?;
    expect_invalid("straddling the end", ns.write(&reg, 0, ns.capacity() - bs, 2 * bs), "dev_offset")?;
    expect_invalid("unaligned device offset", ns.write(&reg, 0, 1, bs), "dev_offset")?;
    expect_invalid("length not a block multiple", ns.write(&reg, 0, 0, bs + 1), "len")?;
    expect_invalid("zero length", ns.write(&reg, 0, 0, 0), "len")?;
    expect_invalid("past the registration", ns.write(&reg, 60 * 1024, 0, 8192), "reg_offset")?;
    expect_invalid("unaligned registration offset", ns.write(&reg, 2, 0, bs), "reg_offset")?;
    expect_invalid("registration of another device", ns.write(&foreign, 0, 0, bs), "reg")?;
    expect_invalid("read past the end", ns.read(&mut reg, 0, u64::MAX - bs + 1, bs), "dev_offset")?;
    match dev.namespace(9) {
        Err(Error::NoNamespace(9)) => {}
        other => anyhow::bail!("namespace 9: {other:?}"),
    }
    let msg = ns.write(&reg, 0, ns.capacity(), bs).unwrap_err().to_string();
    ensure_that!(msg.contains("dev_offset") && msg.contains("runs past"), "message does not say what and why: {msg}");
    ensure_that!(checksum(&dev)? == before, "a rejected request changed the disk");
    drop((reg, foreign, dev, other));
    unbind(&nvme_controllers()?[2])?;
    unbind(&nvme_controllers()?[3])
}

fn flush_zeroes_trim() -> Result<()> {
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(65536)?;
    pattern::fill(3, 1 << 20, reg.as_mut_slice().context("mem")?);
    ns.write(&reg, 0, 1 << 20, 65536)?;
    ns.flush()?;
    ns.write_zeroes(1 << 20, 16384)?;
    ns.read(&mut reg, 0, 1 << 20, 65536)?;
    let b = reg.as_slice().context("mem")?;
    ensure_that!(b[..16384].iter().all(|x| *x == 0), "write zeroes left data");
    ensure_that!(pattern::first_mismatch(3, (1 << 20) + 16384, &b[16384..]).is_none(), "write zeroes touched too much");
    drop(b);
    ns.deallocate(1 << 20, 65536)?;
    ns.read(&mut reg, 0, 1 << 20, 65536)?;
    drop(reg);
    drop(dev);
    unbind(&nvme_controllers()?[0])
}

/// Child: after setup, forbid every system call but exit, then run 10 000 I/Os.
pub fn syscall_free_child(node: &str) -> Result<()> {
    let dev = Device::open_with(node, DeviceOptions { queues: 1, ..Default::default() })?;
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(4096)?;
    // Warm up (first touches, lazy thread-locals).
    for i in 0..10 {
        ns.write(&reg, 0, i * 4096, 4096)?;
        ns.read(&mut reg, 0, i * 4096, 4096)?;
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
        ok &= ns.write(&reg, 0, (i % 1000) * 4096, 4096).is_ok();
        ok &= ns.read(&mut reg, 0, (i % 1000) * 4096, 4096).is_ok();
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
    ensure_that!(
        !past.status.success() && String::from_utf8_lossy(&past.stderr).contains("dev_offset"),
        "out-of-range read not reported: {}",
        String::from_utf8_lossy(&past.stderr)
    );
    ensure_that!(!std::path::Path::new(&to).exists(), "a refused read created its output file");
    let b = sh(&format!("{bin} bench {node} --seconds 1 --size 4K"))?;
    ensure_that!(b.contains("IOPS") && b.contains("p99"), "bench: {b}");
    println!("    {}", b.trim());
    unbind(&nvme_controllers()?[0])
}

fn dmabuf_io() -> Result<()> {
    use std::os::fd::AsRawFd;
    let node = bound_node(0)?;
    let dev = Device::open(&node)?;
    let ns = dev.namespace(1)?;
    let len = 256 * 1024usize;
    let ub = crate::kmod::udmabuf(len)?;
    let mut data = vec![0u8; len];
    pattern::fill(21, 8 << 20, &mut data);
    for (i, c) in data.chunks(8).enumerate() {
        ub.map.write64(i * 8, u64::from_le_bytes(c.try_into()?));
    }
    let mut dreg = dev.register_dmabuf(ub.fd.as_raw_fd(), 0, len as u64)?;
    ensure_that!(dreg.as_slice().is_none(), "a dma-buf registration exposes no host slice");
    ns.write(&dreg, 0, 8 << 20, len as u64)?;
    let mut hreg = dev.alloc(len)?;
    ns.read(&mut hreg, 0, 8 << 20, len as u64)?;
    ensure_that!(*hreg.as_slice().context("mem")? == data[..], "dma-buf -> disk -> host differs");
    ns.read(&mut dreg, 0, 0, len as u64)?;
    let mut back = vec![0u8; len];
    ub.map.read_bytes(0, &mut back);
    ns.read(&mut hreg, 0, 0, len as u64)?;
    ensure_that!(*hreg.as_slice().context("mem")? == back[..], "disk -> dma-buf differs from disk -> host");
    drop((dreg, hreg, dev));
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
    let dev = Device::open(&node)?;
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(1 << 20)?;
    pattern::fill(8, 0, reg.as_mut_slice().context("mem")?);
    ns.write(&reg, 0, 0, 1 << 20)?;
    reg.as_mut_slice().context("mem")?.fill(0);
    ns.read(&mut reg, 0, 0, 1 << 20)?;
    ensure_that!(
        pattern::first_mismatch(8, 0, &reg.as_slice().context("mem")?).is_none(),
        "data differs under the IOMMU"
    );
    drop((reg, dev));
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

/// Interrupt mode reads the same data as polling, with under 20 % of its CPU time per 1 MiB read.
/// The drive takes milliseconds per command, as a real SSD takes hundreds of microseconds: under
/// TCG a wake-up costs tens of microseconds of emulated CPU, so an instant device would measure
/// the emulator, not the waiting.
fn interrupt_mode() -> Result<()> {
    let node = bound_node(4)?;
    let poll = Device::open_with(&node, DeviceOptions { queues: 1, ..Default::default() })?;
    let irq = Device::open_with(&node, DeviceOptions { queues: 1, interrupts: true, ..Default::default() })?;
    let off = 16u64 << 20;
    let mut reg = poll.alloc(1 << 20)?;
    pattern::fill(12, off, reg.as_mut_slice().context("mem")?);
    poll.namespace(1)?.write(&reg, 0, off, 1 << 20)?;
    let mut figures = Vec::new();
    for (mode, dev) in [("polling", &poll), ("interrupts", &irq)] {
        let ns = dev.namespace(1)?;
        let mut buf = dev.alloc(1 << 20)?;
        // CPU time is sampled at the scheduler tick here: measure one long loop, not sums of
        // per-read deltas, and verify outside it.
        ns.read(&mut buf, 0, off, 1 << 20)?;
        ensure_that!(
            pattern::first_mismatch(12, off, &buf.as_slice().context("mem")?).is_none(),
            "{mode}: data differs"
        );
        let n = 10;
        let (c0, t0) = (thread_cpu(), std::time::Instant::now());
        for _ in 0..n {
            ns.read(&mut buf, 0, off, 1 << 20)?;
        }
        let cpu = (thread_cpu() - c0).as_secs_f64() * 1e6 / n as f64;
        let wall = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        ensure_that!(
            pattern::first_mismatch(12, off, &buf.as_slice().context("mem")?).is_none(),
            "{mode}: data differs"
        );
        println!("    {mode}: {cpu:.0} us CPU and {wall:.0} us wall per 1 MiB read");
        figures.push(cpu);
    }
    let below = figures[1] < 0.2 * figures[0];
    ensure_that!(below, "interrupt mode used {:.0} us CPU vs polling {:.0} us", figures[1], figures[0]);
    drop((reg, poll, irq));
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
    let ns = dev.namespace(1)?;
    let mut reg = dev.alloc(8192)?;
    let mut data = vec![0u8; 8192];
    pattern::fill(77, 4096, &mut data);
    reg.as_mut_slice().context("host memory")?.copy_from_slice(&data);
    ns.write(&reg, 0, 4096, 8192)?;
    reg.as_mut_slice().context("host memory")?.fill(0);
    ns.read(&mut reg, 0, 4096, 8192)?;
    ensure_that!(reg.as_slice().context("view")?[..] == data[..], "namespace 1 round trip differs");
    let out = sh(&format!("{} info {node}", std::env::var("UGDS_CLI").unwrap_or_else(|_| "ugds".into())))?;
    ensure_that!(out.contains("namespace 1") && out.contains("namespace 2"), "ugds info: {out}");
    Ok(())
}
