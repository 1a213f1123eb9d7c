//! Kernel module tests: probe, queue pairs and registrations driven by the raw driver, several
//! processes, kill -9 with commands in flight, load/unload and bind/unbind loops, and the
//! bad-input matrix (each case returns its documented errno and changes nothing).

use crate::raw::{errno_of, ioctl_raw, HostBuf, Mapping, RawDev, RawQpair};
use crate::{direct_read, driver_of, ensure_that, load_module, nvme_controllers, nvme_name, pattern, sh, xtask, Test};
use anyhow::{Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use ugds_uapi::ioctl::*;
use ugds_uapi::queue::nvm;

const V: &str = "kmod";

/// The kernel module tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "kmod_probe_logs_model_mdts_and_namespaces", variant: V, run: probe_log },
        Test { name: "kmod_node_is_ugds_drv_class_chardev_0600_gone_after_unbind", variant: V, run: node_class },
        Test { name: "kmod_raw_io_host_memory_matches_kernel_driver", variant: V, run: raw_io },
        Test { name: "kmod_raw_io_udmabuf", variant: V, run: udmabuf_io },
        Test { name: "kmod_eventfd_signalled_by_msix", variant: V, run: eventfd_irq },
        Test { name: "kmod_bad_eventfd_arguments", variant: V, run: bad_eventfd },
        Test { name: "kmod_armed_interrupt_is_one_shot", variant: V, run: armed_irq_one_shot },
        Test { name: "kmod_an_arm_right_after_a_signal_is_kept", variant: V, run: arm_right_after_a_signal },
        Test { name: "kmod_reset_keeps_queue_pairs_for_rearm", variant: V, run: reset_keeps_queues },
        Test { name: "kmod_unbind_while_open_revokes_everything", variant: V, run: unbind_while_open },
        Test { name: "kmod_bad_dmabuf_fd_and_range", variant: V, run: bad_dmabuf },
        Test { name: "kmod_two_processes_one_controller", variant: V, run: two_processes },
        Test { name: "kmod_kill9_with_64_commands_in_flight", variant: V, run: kill9_inflight },
        Test { name: "kmod_bind_unbind_20_with_io", variant: V, run: bind_unbind_20 },
        Test { name: "kmod_load_unload_50", variant: V, run: load_unload_50 },
        Test { name: "kmod_bad_register_zero_huge_unaligned_overflow", variant: V, run: bad_register_ranges },
        Test { name: "kmod_bad_register_unmapped_memory", variant: V, run: bad_register_unmapped },
        Test { name: "kmod_bad_ids_generations_double_free", variant: V, run: bad_ids },
        Test { name: "kmod_bad_qpair_depth", variant: V, run: bad_depth },
        Test { name: "kmod_bad_mmap_offsets_sizes_permissions", variant: V, run: bad_mmap },
        Test { name: "kmod_shadow_doorbells_given_to_the_controller", variant: V, run: shadow_doorbells },
        Test { name: "kmod_bad_other_files_objects", variant: V, run: bad_other_file },
        Test { name: "kmod_bad_unknown_ioctl", variant: V, run: bad_unknown_ioctl },
    ]
}

/// Binds controller `idx` to ugds (loading the module) and returns its node (`/dev/ugds_drvN`).
pub fn bound_node(idx: usize) -> Result<String> {
    load_module()?;
    let addr = nvme_controllers()?.get(idx).cloned().context("no such controller")?;
    if driver_of(&addr).as_deref() != Some("ugds") {
        let (ok, out) = xtask(&["bind", &addr])?;
        ensure_that!(ok, "bind {addr}: {out}");
    }
    node_of(&addr)?.context("bound, but no ugds_drv node under the PCI device")
}

/// The ugds node of a controller (sysfs lists the class's devices under the PCI device in a
/// directory named after the class), if it has one.
fn node_of(addr: &str) -> Result<Option<String>> {
    let dir = format!("/sys/bus/pci/devices/{addr}/{}", ugds::device::NODE_CLASS);
    let Ok(mut d) = std::fs::read_dir(&dir) else { return Ok(None) };
    Ok(d.next().transpose()?.map(|n| format!("/dev/{}", n.file_name().to_string_lossy())))
}

fn unbind_all() -> Result<()> {
    for a in nvme_controllers()? {
        if driver_of(&a).as_deref() != Some("nvme") {
            let (ok, out) = xtask(&["unbind", &a])?;
            ensure_that!(ok, "unbind {a}: {out}");
        }
    }
    Ok(())
}

fn probe_log() -> Result<()> {
    let ctrls = nvme_controllers()?;
    bound_node(0)?;
    bound_node(1)?;
    let log = sh("dmesg")?;
    let has = |s: &str| log.lines().any(|l| l.contains(s));
    ensure_that!(has(&format!("{}: /dev/ugds_drv", ctrls[0])) && has("QEMU NVMe Ctrl"), "no model line:\n{log}");
    ensure_that!(has("MDTS 524288 bytes"), "no MDTS in the probe log");
    ensure_that!(
        has(&format!("{}: namespace 1: 65536 blocks of 4096 bytes (256 MiB)", ctrls[0])),
        "lbs=4096 namespace line"
    );
    for ns in [1, 2] {
        ensure_that!(
            has(&format!("{}: namespace {ns}: 262144 blocks of 512 bytes (128 MiB)", ctrls[1])),
            "lbs=512 namespace {ns} line"
        );
    }
    unbind_all()
}

/// The node is what uGDS's tools and LMCache's uGDS backend look for: `/dev/ugds_drvN`, printed by
/// `xtask bind`, a character device of mode 0600 whose `/sys/dev/char/MAJ:MIN/subsystem` is the
/// class `ugds_drv`, numbered in the module's region (`/proc/devices`), minor = instance. A
/// file opened before unbind cannot be reopened (through /proc/self/fd) afterwards; unbind by the
/// node's path removes node, class entry and number; unloading removes class and region.
fn node_class() -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    load_module()?;
    let addr = nvme_controllers()?[0].clone();
    if driver_of(&addr).as_deref() == Some("ugds") {
        unbind_all()?;
    }
    let (ok, out) = xtask(&["bind", &addr])?;
    ensure_that!(ok, "bind {addr}: {out}");
    let node = node_of(&addr)?.context("no node after bind")?;
    ensure_that!(node.starts_with("/dev/ugds_drv"), "node {node} is not named ugds_drvN");
    ensure_that!(out.contains(&format!("bound to ugds: {node}")), "bind did not print {node}: {out}");
    let meta = std::fs::metadata(&node).with_context(|| node.clone())?;
    ensure_that!(meta.file_type().is_char_device(), "{node} is not a character device");
    ensure_that!(meta.permissions().mode() & 0o7777 == 0o600, "{node} has mode {:o}", meta.permissions().mode());
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    let sys = format!("/sys/dev/char/{major}:{minor}");
    let subsystem = std::fs::canonicalize(format!("{sys}/subsystem"))?;
    ensure_that!(subsystem.ends_with("class/ugds_drv"), "{sys}/subsystem is {}", subsystem.display());
    let parent = std::fs::canonicalize(format!("{sys}/device"))?;
    ensure_that!(parent.file_name().is_some_and(|n| n == addr.as_str()), "{sys}/device is {}", parent.display());
    ensure_that!(ugds::device::is_ugds_node(&node), "is_ugds_node({node}) is false");
    ensure_that!(!ugds::device::is_ugds_node("/dev/null"), "is_ugds_node(/dev/null) is true");
    ensure_that!(!ugds::device::is_ugds_node("/proc/self/exe"), "is_ugds_node of a regular file is true");
    let devices = std::fs::read_to_string("/proc/devices")?;
    ensure_that!(
        devices.lines().any(|l| l.trim() == format!("{major} ugds_drv")),
        "no '{major} ugds_drv' in /proc/devices"
    );
    let dev = RawDev::open(&node)?;
    ensure_that!(dev.info.instance == minor, "instance {} but minor {minor}", dev.info.instance);
    ensure_that!(
        ugds::device::is_ugds_node(format!("/proc/self/fd/{}", dev.fd())),
        "an open node's fd is not recognised"
    );
    let (ok, out) = xtask(&["unbind", &node])?;
    ensure_that!(ok, "unbind {node}: {out}");
    ensure_that!(driver_of(&addr).as_deref() == Some("nvme"), "{addr} is not back with nvme after unbind by {node}");
    ensure_that!(!std::path::Path::new(&node).exists(), "{node} still exists after unbind");
    ensure_that!(!std::path::Path::new(&sys).exists(), "{sys} still exists after unbind");
    let name = node.trim_start_matches("/dev/");
    ensure_that!(
        !std::path::Path::new(&format!("/sys/class/ugds_drv/{name}")).exists(),
        "class entry left after unbind"
    );
    // The file still open keeps its cdev; reopening it reaches a removed device: refused.
    let again = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{}", dev.fd()));
    ensure_that!(
        again.as_ref().err().and_then(|e| e.raw_os_error()) == Some(errno::ENODEV),
        "reopening a removed node: {again:?}"
    );
    drop(dev);
    sh("rmmod ugds")?;
    ensure_that!(!std::path::Path::new("/sys/class/ugds_drv").exists(), "/sys/class/ugds_drv left after rmmod");
    let devices = std::fs::read_to_string("/proc/devices")?;
    ensure_that!(!devices.lines().any(|l| l.ends_with(" ugds_drv")), "ugds_drv left in /proc/devices after rmmod");
    load_module()
}

/// Writes `len` bytes of `pattern(seed)` at `slba` through the raw driver in 256 KiB commands and
/// reads them back into a second buffer; returns the data.
fn raw_write_read(dev: &RawDev, seed: u64, slba: u64, len: usize) -> Result<Vec<u8>> {
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(64)?;
    let mut wbuf = HostBuf::new(len)?;
    let rbuf = HostBuf::new(len)?;
    let data = pattern(seed, len);
    wbuf.bytes_mut().copy_from_slice(&data);
    let wh = dev.register(wbuf.addr(), len as u64)?;
    let rh = dev.register(rbuf.addr(), len as u64)?;
    let (wsegs, rsegs) = (dev.segments(wh)?, dev.segments(rh)?);
    ensure_that!(wsegs.iter().map(|s| s.len).sum::<u64>() == len as u64, "segments do not cover the registration");
    let chunk = 256 * 1024u64;
    for off in (0..len as u64).step_by(chunk as usize) {
        let n = chunk.min(len as u64 - off);
        qp.rw_sync(true, &ns, slba + (off >> ns.lba_shift), &wsegs, off, n)?;
    }
    for off in (0..len as u64).step_by(chunk as usize) {
        let n = chunk.min(len as u64 - off);
        qp.rw_sync(false, &ns, slba + (off >> ns.lba_shift), &rsegs, off, n)?;
    }
    ensure_that!(rbuf.bytes() == &data[..], "data read back through ugds differs");
    dev.delete_qpair(qp.qid)?;
    dev.deregister(wh.id, wh.generation)?;
    dev.deregister(rh.id, rh.generation)?;
    Ok(data)
}

fn raw_io() -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let before = dev.status()?;
    let data = raw_write_read(&dev, 77, 100, 1 << 20)?;
    let after = dev.status()?;
    ensure_that!(
        after.pinned_pages == before.pinned_pages && after.registrations == 0 && after.qpairs == 0,
        "counters did not return: {after:?}"
    );
    drop(dev);
    unbind_all()?;
    let addr = nvme_controllers()?[0].clone();
    let back = direct_read(&format!("/dev/{}n1", nvme_name(&addr)?), 100 * 4096, data.len())?;
    ensure_that!(back == data, "the kernel nvme driver reads different data than ugds wrote");
    Ok(())
}

/// Child process entry points (`ugds-vm-suite --child ...`).
pub fn child_main(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("io") => {
            let (node, seed, slba) = (&args[1], args[2].parse()?, args[3].parse()?);
            let dev = RawDev::open(node)?;
            for _ in 0..5 {
                raw_write_read(&dev, seed, slba, 256 * 1024)?;
            }
            Ok(())
        }
        Some("syscall-free") => crate::userlib::syscall_free_child(&args[1]),
        Some("storm") => crate::boundary::storm_child(&args[1], args[2].parse()?),
        Some("ledger-writer") => {
            crate::boundary::ledger_child(&args[1], args[2].parse()?, args[3].parse()?, args[4].parse()?, &args[5])
        }
        Some("memlock") => crate::boundary::memlock_child(&args[1]),
        Some("volume-writer") => crate::volume::writer_child(&args[1]),
        Some("p2p-reader") => crate::p2p::reader_child(&args[1]),
        Some("crash-io") => crate::reliability::crash_child(&args[1], args[2].parse()?, args[3].parse()?),
        Some("touch-after-unbind") => {
            // Map an SQ, have the parent unbind, then touch the mapping: must fault (SIGBUS).
            let dev = RawDev::open(&args[1])?;
            let qp = dev.create_qpair(16)?;
            qp.peek_sq();
            println!("MAPPED");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let e = dev.create_qpair(16).err().context("create after unbind succeeded")?;
            println!("ERRNO {}", errno_of(&e));
            qp.peek_sq();
            println!("NOFAULT");
            Ok(())
        }
        Some("inflight") => {
            let dev = RawDev::open(&args[1])?;
            let ns = dev.info.namespaces[0];
            let mut qp = dev.create_qpair(128)?;
            let buf = HostBuf::new(64 * 65536)?;
            let h = dev.register(buf.addr(), buf.bytes().len() as u64)?;
            let segs = dev.segments(h)?;
            for i in 0..64u64 {
                qp.push_rw(nvm::READ, &ns, i * 16, &segs, i * 65536, 65536)?;
            }
            qp.ring();
            println!("READY");
            std::thread::sleep(Duration::from_secs(600));
            Ok(())
        }
        other => anyhow::bail!("unknown child mode {other:?}"),
    }
}

fn two_processes() -> Result<()> {
    let node = bound_node(1)?;
    let me = std::env::current_exe()?;
    // Run them at the same time: spawn both, then wait.
    let mut children = Vec::new();
    for (seed, slba) in [(1u64, 0u64), (2, 8192)] {
        children.push(
            Command::new(&me)
                .args(["--child", "io", &node, &seed.to_string(), &slba.to_string()])
                .stderr(Stdio::piped())
                .spawn()?,
        );
    }
    for c in children {
        let out = c.wait_with_output()?;
        ensure_that!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let st = RawDev::open(&node)?.status()?;
    ensure_that!(
        st.qpairs == 0 && st.registrations == 0 && st.pinned_pages == 0,
        "leftovers after both exited: {st:?}"
    );
    unbind_all()
}

fn kill9_inflight() -> Result<()> {
    let node = bound_node(2)?;
    let baseline = RawDev::open(&node)?.status()?;
    let mut child =
        crate::spawn_ready_child(&["inflight", &node]).context("child did not get its commands in flight")?;
    let during = RawDev::open(&node)?.status()?;
    ensure_that!(during.pinned_pages == baseline.pinned_pages + 1024, "child's pages not counted: {during:?}");
    child.kill()?;
    child.wait()?;
    let dev = RawDev::open(&node)?;
    let after = dev.status()?;
    ensure_that!(
        after.pinned_pages == baseline.pinned_pages
            && after.qpairs == baseline.qpairs
            && after.registrations == baseline.registrations,
        "kill -9 left resources: before {baseline:?} after {after:?}"
    );
    raw_write_read(&dev, 9, 4096, 64 * 1024)?;
    drop(dev);
    unbind_all()
}

fn bind_unbind_20() -> Result<()> {
    for i in 0..20 {
        let node = bound_node(0)?;
        let dev = RawDev::open(&node)?;
        raw_write_read(&dev, i, 2048 + i * 16, 64 * 1024)?;
        let st = dev.status()?;
        ensure_that!(st.pinned_pages == 0 && st.qpairs == 0, "iteration {i}: {st:?}");
        drop(dev);
        unbind_all()?;
    }
    Ok(())
}

fn load_unload_50() -> Result<()> {
    for i in 0..50 {
        let node = bound_node(0)?;
        let dev = RawDev::open(&node)?;
        if i % 10 == 0 {
            raw_write_read(&dev, i, 4096, 16 * 1024)?;
        }
        drop(dev);
        sh("rmmod ugds").with_context(|| format!("iteration {i}"))?;
    }
    unbind_all()
}

/// Runs `f` against a fresh open of controller 0 and checks the status counters did not change.
fn unchanged(f: impl FnOnce(&RawDev) -> Result<()>) -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let before = dev.status()?;
    f(&dev)?;
    let after = dev.status()?;
    ensure_that!(before == after, "a rejected call changed state: {before:?} -> {after:?}");
    Ok(())
}

fn expect_errno<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>, want: i32) -> Result<()> {
    match r {
        Ok(v) => anyhow::bail!("{what}: succeeded ({v:?}), expected errno {want}"),
        Err(e) => {
            ensure_that!(errno_of(&e) == want, "{what}: errno {} ({e}), expected {want}", errno_of(&e));
            Ok(())
        }
    }
}

fn bad_register_ranges() -> Result<()> {
    unchanged(|dev| {
        let buf = HostBuf::new(8192)?;
        expect_errno("zero length", dev.register(buf.addr(), 0), errno::EINVAL)?;
        expect_errno("huge length", dev.register(buf.addr(), 1 << 40), errno::EINVAL)?;
        expect_errno("unaligned address", dev.register(buf.addr() + 1, 4096), errno::EINVAL)?;
        expect_errno("unaligned length", dev.register(buf.addr(), 100), errno::EINVAL)?;
        expect_errno("overflowing range", dev.register(!4095, 8192), errno::EOVERFLOW)?;
        expect_errno("kernel address", dev.register(0xffff_8880_0000_0000, 4096), errno::EFAULT)?;
        Ok(())
    })
}

fn bad_register_unmapped() -> Result<()> {
    unchanged(|dev| {
        let buf = HostBuf::new(3 * 4096)?;
        let addr = buf.addr();
        // Punch a hole in the middle page: the range is no longer fully mapped.
        // SAFETY: unmapping a page of our own mapping that nothing else uses.
        unsafe { libc::munmap((addr + 4096) as *mut libc::c_void, 4096) };
        expect_errno("partly unmapped range", dev.register(addr, 3 * 4096), errno::EFAULT)?;
        expect_errno("unmapped page", dev.register(addr + 4096, 4096), errno::EFAULT)?;
        Ok(())
    })
}

fn bad_ids() -> Result<()> {
    unchanged(|dev| {
        expect_errno("delete bogus qid", dev.delete_qpair(999), errno::ENOENT)?;
        let qp = dev.create_qpair(16)?;
        dev.delete_qpair(qp.qid)?;
        expect_errno("double delete", dev.delete_qpair(qp.qid), errno::ENOENT)?;
        drop(qp);
        let buf = HostBuf::new(4096)?;
        let h = dev.register(buf.addr(), 4096)?;
        expect_errno("bogus registration id", dev.deregister(h.id + 100, h.generation), errno::ENOENT)?;
        expect_errno("stale generation", dev.deregister(h.id, h.generation.wrapping_add(1)), errno::ESTALE)?;
        let mut stale = h;
        stale.generation += 7;
        expect_errno("segments of a stale generation", dev.segments(stale), errno::ESTALE)?;
        dev.deregister(h.id, h.generation)?;
        expect_errno("double deregister", dev.deregister(h.id, h.generation), errno::ENOENT)?;
        Ok(())
    })
}

fn bad_depth() -> Result<()> {
    unchanged(|dev| {
        let max = dev.info.max_queue_entries;
        for d in [0, 1, max + 1, u32::MAX] {
            expect_errno(&format!("depth {d}"), dev.create_qpair(d).map(|q| q.qid), errno::EINVAL)?;
        }
        let mut a = CreateQpair { depth: 16, flags: 0x8000, ..Default::default() };
        expect_errno("unknown flags", ioctl_raw(dev.fd(), IOCTL_CREATE_QPAIR, &mut a), errno::EINVAL)?;
        Ok(())
    })
}

/// QEMU's controller offers Doorbell Buffer Config: the module gives it the pages, the event
/// indexes map read-only, and the controller publishes in them how far it read a queue.
fn shadow_doorbells() -> Result<()> {
    let dev = RawDev::open(&bound_node(0)?)?;
    ensure_that!(
        dev.info.flags & DEVICE_SHADOW_DOORBELLS != 0,
        "the controller offers Doorbell Buffer Config, yet the module reports no shadow doorbells"
    );
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let writable = Mapping::new(dev.fd(), MMAP_EVENT_INDEXES, 4096, rw).map(|_| ());
    expect_errno("writable event indexes", writable, errno::EPERM)?;
    let long = Mapping::new(dev.fd(), MMAP_SHADOW_DOORBELLS, 8192, rw).map(|_| ());
    expect_errno("shadow doorbells past their page", long, errno::EINVAL)?;
    let events = Mapping::new(dev.fd(), MMAP_EVENT_INDEXES, 4096, libc::PROT_READ)?;
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(16)?;
    let buf = HostBuf::new(4096)?;
    let h = dev.register(buf.addr(), 4096)?;
    let segs = dev.segments(h)?;
    for _ in 0..3 {
        qp.rw_sync(false, &ns, 0, &segs, 0, 4096)?;
    }
    let sq_event = events.read32(qp.args.sq_doorbell as usize);
    ensure_that!(
        sq_event == 3,
        "the SQ's event index is {sq_event} after 3 commands: the controller did not use the pages"
    );
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}

fn bad_mmap() -> Result<()> {
    unchanged(|dev| {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let qp = dev.create_qpair(16)?;
        let a = qp.args;
        expect_errno("unknown offset", Mapping::new(dev.fd(), 4096, 4096, rw).map(|_| ()), errno::EINVAL)?;
        expect_errno("offset of another kind", Mapping::new(dev.fd(), 9 << 40, 4096, rw).map(|_| ()), errno::EINVAL)?;
        expect_errno(
            "SQ too long",
            Mapping::new(dev.fd(), a.sq_offset, a.sq_size as usize * 2, rw).map(|_| ()),
            errno::EINVAL,
        )?;
        expect_errno(
            "CQ of a bogus qid",
            Mapping::new(dev.fd(), mmap_offset(MmapKind::Cq, 77), 4096, rw).map(|_| ()),
            errno::ENOENT,
        )?;
        expect_errno("writable status page", Mapping::new(dev.fd(), MMAP_STATUS, 4096, rw).map(|_| ()), errno::EPERM)?;
        expect_errno(
            "doorbells beyond BAR0",
            Mapping::new(dev.fd(), MMAP_DOORBELLS, 1 << 20, rw).map(|_| ()),
            errno::EINVAL,
        )?;
        // A private mapping of device memory is refused.
        // SAFETY: a fresh mapping request; nothing existing is affected.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, rw, libc::MAP_PRIVATE, dev.fd(), a.sq_offset as i64) };
        ensure_that!(p == libc::MAP_FAILED, "a private mapping was allowed");
        // The status page, once mapped read-only, cannot be made writable.
        let st = Mapping::new(dev.fd(), MMAP_STATUS, 4096, libc::PROT_READ)?;
        drop(st);
        dev.delete_qpair(qp.qid)?;
        Ok(())
    })
}

fn bad_other_file() -> Result<()> {
    let node = bound_node(0)?;
    let a = RawDev::open(&node)?;
    let b = RawDev::open(&node)?;
    let qp = a.create_qpair(16)?;
    let buf = HostBuf::new(4096)?;
    let h = a.register(buf.addr(), 4096)?;
    let before = a.status()?;
    expect_errno("delete another file's qpair", b.delete_qpair(qp.qid), errno::ENOENT)?;
    expect_errno("deregister another file's registration", b.deregister(h.id, h.generation), errno::ENOENT)?;
    expect_errno("segments of another file's registration", b.segments(h), errno::ENOENT)?;
    expect_errno(
        "map another file's SQ",
        Mapping::new(b.fd(), qp.args.sq_offset, qp.args.sq_size as usize, libc::PROT_READ | libc::PROT_WRITE)
            .map(|_| ()),
        errno::ENOENT,
    )?;
    ensure_that!(a.status()? == before, "another file's calls changed state");
    drop(b);
    // The owner still has everything.
    ensure_that!(a.segments(h)?.len() as u32 == h.nsegs, "owner lost its registration");
    a.delete_qpair(qp.qid)?;
    a.deregister(h.id, h.generation)?;
    Ok(())
}

fn bad_unknown_ioctl() -> Result<()> {
    unchanged(|dev| {
        let mut x = 0u64;
        expect_errno("unknown request", ioctl_raw(dev.fd(), ioc_for_test(0x7F), &mut x), libc::ENOTTY)?;
        Ok(())
    })
}

fn ioc_for_test(nr: u8) -> u32 {
    (3 << 30) | (8 << 16) | ((IOCTL_TYPE as u32) << 8) | nr as u32
}

/// A udmabuf over a sealed memfd: a real dma-buf exporter without a GPU.
pub struct Udmabuf {
    /// The memfd's shared mapping (what the dma-buf's pages hold).
    pub map: Mapping,
    /// The dma-buf fd.
    pub fd: std::os::fd::OwnedFd,
}

/// Creates a `len`-byte udmabuf.
pub fn udmabuf(len: usize) -> Result<Udmabuf> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let name = std::ffi::CString::new("ugds-test")?;
    // SAFETY: valid name; the fd is owned below.
    let memfd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC) };
    ensure_that!(memfd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd we own.
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    // SAFETY: plain syscalls on our fd.
    unsafe {
        ensure_that!(libc::ftruncate(memfd.as_raw_fd(), len as i64) == 0, "ftruncate");
        ensure_that!(libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0, "seal");
    }
    let map = Mapping::new(memfd.as_raw_fd(), 0, len, libc::PROT_READ | libc::PROT_WRITE)?;
    let dev = std::fs::File::open("/dev/udmabuf").context("/dev/udmabuf")?;
    #[repr(C)]
    struct UdmabufCreate {
        memfd: u32,
        flags: u32,
        offset: u64,
        size: u64,
    }
    let mut c = UdmabufCreate { memfd: memfd.as_raw_fd() as u32, flags: 1, offset: 0, size: len as u64 };
    // _IOW('u', 0x42, struct udmabuf_create)
    let req = (1u32 << 30) | (24 << 16) | ((b'u' as u32) << 8) | 0x42;
    let fd = ioctl_raw(dev.as_raw_fd(), req, &mut c).context("UDMABUF_CREATE")?;
    // SAFETY: the ioctl returned a new fd we own.
    Ok(Udmabuf { map, fd: unsafe { OwnedFd::from_raw_fd(fd) } })
}

fn udmabuf_io() -> Result<()> {
    use std::os::fd::AsRawFd;
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let ns = dev.info.namespaces[0];
    let len = 512 * 1024usize;
    let ub = udmabuf(len)?;
    let data = pattern(0xd3a, len);
    for (i, c) in data.chunks(8).enumerate() {
        ub.map.write64(i * 8, u64::from_le_bytes(c.try_into()?));
    }
    let dh = dev.register_dmabuf(ub.fd.as_raw_fd(), 0, len as u64)?;
    let dsegs = dev.segments(dh)?;
    ensure_that!(dsegs.iter().map(|s| s.len).sum::<u64>() == len as u64, "dma-buf segments do not cover it");
    let st = dev.status()?;
    ensure_that!(st.registrations == 1 && st.pinned_pages == (len / 4096) as u64, "counters: {st:?}");
    let mut qp = dev.create_qpair(32)?;
    let chunk = 128 * 1024u64;
    // dma-buf -> disk, then disk -> host registration.
    for off in (0..len as u64).step_by(chunk as usize) {
        qp.rw_sync(true, &ns, 8192 + (off >> ns.lba_shift), &dsegs, off, chunk)?;
    }
    let hb = HostBuf::new(len)?;
    let hh = dev.register(hb.addr(), len as u64)?;
    let hsegs = dev.segments(hh)?;
    for off in (0..len as u64).step_by(chunk as usize) {
        qp.rw_sync(false, &ns, 8192 + (off >> ns.lba_shift), &hsegs, off, chunk)?;
    }
    ensure_that!(hb.bytes() == &data[..], "host copy of what the dma-buf wrote differs");
    // disk -> dma-buf (a different region), checked through the memfd mapping.
    for off in (0..len as u64).step_by(chunk as usize) {
        qp.rw_sync(false, &ns, 100 + (off >> ns.lba_shift), &dsegs, off, chunk)?;
    }
    let mut back = vec![0u8; len];
    ub.map.read_bytes(0, &mut back);
    let expect = direct_read_via_qp(&dev, &mut qp, &ns, 100, len)?;
    ensure_that!(back == expect, "dma-buf does not hold what the disk has");
    dev.deregister(dh.id, dh.generation)?;
    dev.deregister(hh.id, hh.generation)?;
    dev.delete_qpair(qp.qid)?;
    let st = dev.status()?;
    ensure_that!(st.registrations == 0 && st.pinned_pages == 0, "counters after: {st:?}");
    drop(dev);
    unbind_all()
}

fn direct_read_via_qp(
    dev: &RawDev,
    qp: &mut crate::raw::RawQpair,
    ns: &NamespaceInfo,
    slba: u64,
    len: usize,
) -> Result<Vec<u8>> {
    let hb = HostBuf::new(len)?;
    let h = dev.register(hb.addr(), len as u64)?;
    let segs = dev.segments(h)?;
    for off in (0..len as u64).step_by(128 * 1024) {
        qp.rw_sync(false, ns, slba + (off >> ns.lba_shift), &segs, off, (128 * 1024).min(len as u64 - off))?;
    }
    let v = hb.bytes().to_vec();
    dev.deregister(h.id, h.generation)?;
    Ok(v)
}

fn bad_dmabuf() -> Result<()> {
    use std::os::fd::AsRawFd;
    let ub = udmabuf(64 * 1024)?;
    unchanged(|dev| {
        let f = std::fs::File::open("/proc/self/status")?;
        expect_errno("regular file fd", dev.register_dmabuf(f.as_raw_fd(), 0, 4096), errno::EINVAL)?;
        expect_errno("negative fd", dev.register_dmabuf(-1, 0, 4096), errno::EBADF)?;
        expect_errno("closed fd", dev.register_dmabuf(9999, 0, 4096), errno::EBADF)?;
        expect_errno(
            "range past the end",
            dev.register_dmabuf(ub.fd.as_raw_fd(), 32 * 1024, 64 * 1024),
            errno::EINVAL,
        )?;
        expect_errno("unaligned offset", dev.register_dmabuf(ub.fd.as_raw_fd(), 100, 4096), errno::EINVAL)?;
        expect_errno("zero length", dev.register_dmabuf(ub.fd.as_raw_fd(), 0, 0), errno::EINVAL)?;
        expect_errno("overflow", dev.register_dmabuf(ub.fd.as_raw_fd(), !4095, 8192), errno::EOVERFLOW)?;
        Ok(())
    })
}

fn unbind_while_open() -> Result<()> {
    use std::io::Write;
    let node = bound_node(0)?;
    let me = std::env::current_exe()?;
    let mut child = Command::new(&me)
        .args(["--child", "touch-after-unbind", &node])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    ensure_that!(line.trim() == "MAPPED", "child: {line:?}");
    unbind_all()?;
    writeln!(child.stdin.take().context("stdin")?, "go")?;
    line.clear();
    out.read_line(&mut line)?;
    ensure_that!(line.trim() == format!("ERRNO {}", errno::ENODEV), "calls after unbind: {line:?}");
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    ensure_that!(status.signal() == Some(libc::SIGBUS), "touching a revoked mapping did not fault: {status:?}");
    Ok(())
}

fn eventfd() -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    ensure_that!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn eventfd_irq() -> Result<()> {
    use std::os::fd::AsRawFd;
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    ensure_that!(dev.info.irq_vectors >= 1, "no interrupt vectors: {}", dev.info.irq_vectors);
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair_flags(16, QPAIR_FLAG_IRQ)?;
    ensure_that!(qp.args.irq_vector == qp.qid, "vector {} for qid {}", qp.args.irq_vector, qp.qid);
    let efd = eventfd()?;
    dev.set_eventfd(qp.qid, efd.as_raw_fd())?;
    let buf = HostBuf::new(65536)?;
    let h = dev.register(buf.addr(), 65536)?;
    let segs = dev.segments(h)?;
    for round in 0..3 {
        qp.push_rw(nvm::READ, &ns, 0, &segs, 0, 65536)?;
        qp.ring();
        let mut pfd = libc::pollfd { fd: efd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
        ensure_that!(n == 1, "round {round}: the eventfd was not signalled within 5 s");
        let mut count = 0u64;
        // SAFETY: reading 8 bytes into a u64.
        let r = unsafe { libc::read(efd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        ensure_that!(r == 8 && count >= 1, "eventfd read {r} count {count}");
        let c = qp.wait(1, Duration::from_secs(1))?;
        ensure_that!(c[0].status().is_success(), "read failed: {}", c[0].status());
    }
    dev.set_eventfd(qp.qid, -1)?;
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}

/// Whether `efd` is signalled within `ms`; clears it.
fn signalled(efd: &std::os::fd::OwnedFd, ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: efd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, ms) } != 1 {
        return false;
    }
    let mut count = 0u64;
    // SAFETY: reading 8 bytes into a u64.
    unsafe { libc::read(efd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    true
}

/// An arm made as soon as the eventfd says the last one fired is kept: the next completion
/// signals. The handler used to signal before it masked the vector, so an arm that came in
/// between found the handler still armed, returned, and the handler's mask then swallowed the
/// next interrupt. Here the arm's own delivery of a latched completion fires the handler, and
/// the thread arms again the moment it sees the signal, 2000 times.
fn arm_right_after_a_signal() -> Result<()> {
    let (dev, mut qp, efd, reads) = irq_queue()?;
    let read = |qp: &mut RawQpair| reads.read(&dev, qp);
    // Armed once and fired: masked from here on.
    dev.arm_irq(qp.qid)?;
    read(&mut qp)?;
    ensure_that!(signalled(&efd, 5000), "the first armed interrupt did not signal");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for round in 0..2000 {
        // From each CPU in turn: the handler runs on the vector's CPU, this thread on another
        // one half the time (where it can see the signal before the handler's next step).
        pin_to_cpu(round % cpus)?;
        // A completion while masked, latched; the arm delivers it at once.
        read(&mut qp)?;
        dev.arm_irq(qp.qid)?;
        ensure_that!(signalled(&efd, 5000), "round {round}: the arm did not deliver the latched completion");
        // Armed again the moment the signal is seen: the next completion must signal.
        dev.arm_irq(qp.qid)?;
        read(&mut qp)?;
        ensure_that!(signalled(&efd, 2000), "round {round}: an arm made right after a signal was lost");
    }
    dev.set_eventfd(qp.qid, -1)?;
    dev.delete_qpair(qp.qid)?;
    reads.release(&dev)
}

/// A 4 KiB buffer registered for reads of block 0 (the interrupt tests' reads).
struct PageReads {
    _buf: HostBuf,
    h: RegistrationHandle,
    segs: Vec<Segment>,
}

impl PageReads {
    /// Reads block 0 on `qp` and waits for its completion by polling.
    fn read(&self, dev: &RawDev, qp: &mut RawQpair) -> Result<()> {
        qp.push_rw(nvm::READ, &dev.info.namespaces[0], 0, &self.segs, 0, 4096)?;
        qp.ring();
        let c = qp.wait(1, Duration::from_secs(5))?;
        ensure_that!(c[0].status().is_success(), "read failed: {}", c[0].status());
        Ok(())
    }

    fn release(self, dev: &RawDev) -> Result<()> {
        Ok(dev.deregister(self.h.id, self.h.generation)?)
    }
}

/// The first bound node opened raw, a queue pair with interrupts on whose vector signals a
/// new eventfd, and a page registered for reads.
fn irq_queue() -> Result<(RawDev, RawQpair, std::os::fd::OwnedFd, PageReads)> {
    use std::os::fd::AsRawFd;
    let dev = RawDev::open(&bound_node(0)?)?;
    let qp = dev.create_qpair_flags(16, QPAIR_FLAG_IRQ)?;
    let efd = eventfd()?;
    dev.set_eventfd(qp.qid, efd.as_raw_fd())?;
    let buf = HostBuf::new(4096)?;
    let h = dev.register(buf.addr(), 4096)?;
    let segs = dev.segments(h)?;
    Ok((dev, qp, efd, PageReads { _buf: buf, h, segs }))
}

/// Runs the calling thread on CPU `cpu` only.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `cpu` is below the machine's CPU count, far below the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of its size, for the calling thread (0).
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    ensure_that!(r == 0, "sched_setaffinity to CPU {cpu}: {}", std::io::Error::last_os_error());
    Ok(())
}

/// An armed interrupt signals once, then stays masked: a completion while masked raises
/// nothing until the next arm, which delivers it.
fn armed_irq_one_shot() -> Result<()> {
    use std::os::fd::AsRawFd;
    let (dev, mut qp, efd, reads) = irq_queue()?;
    let read = |qp: &mut RawQpair| reads.read(&dev, qp);
    for round in 0..3 {
        dev.arm_irq(qp.qid)?;
        read(&mut qp)?;
        ensure_that!(signalled(&efd, 5000), "round {round}: the armed interrupt did not signal");
        // Not armed again: masked.
        read(&mut qp)?;
        ensure_that!(!signalled(&efd, 300), "round {round}: a completion signalled while masked");
        // The arm delivers the completion that came while masked.
        dev.arm_irq(qp.qid)?;
        ensure_that!(signalled(&efd, 5000), "round {round}: the arm did not deliver the masked completion");
    }
    // Masked when it goes: detaching and deleting leave nothing for the next queue to inherit.
    read(&mut qp)?;
    dev.set_eventfd(qp.qid, -1)?;
    dev.delete_qpair(qp.qid)?;
    let mut again = dev.create_qpair_flags(16, QPAIR_FLAG_IRQ)?;
    let efd2 = eventfd()?;
    dev.set_eventfd(again.qid, efd2.as_raw_fd())?;
    read(&mut again)?;
    ensure_that!(signalled(&efd2, 5000), "a new handler on a vector freed while masked did not signal");
    dev.set_eventfd(again.qid, -1)?;
    dev.delete_qpair(again.qid)?;
    reads.release(&dev)
}

fn bad_eventfd() -> Result<()> {
    use std::os::fd::AsRawFd;
    unchanged(|dev| {
        let efd = eventfd()?;
        let polled = dev.create_qpair(16)?;
        expect_errno("queue without interrupts", dev.set_eventfd(polled.qid, efd.as_raw_fd()), errno::EINVAL)?;
        expect_errno("bogus qid", dev.set_eventfd(999, efd.as_raw_fd()), errno::ENOENT)?;
        let irq = dev.create_qpair_flags(16, QPAIR_FLAG_IRQ)?;
        let f = std::fs::File::open("/proc/self/status")?;
        expect_errno("not an eventfd", dev.set_eventfd(irq.qid, f.as_raw_fd()), errno::EINVAL)?;
        expect_errno("closed fd", dev.set_eventfd(irq.qid, 9999), errno::EBADF)?;
        expect_errno("negative fd", dev.set_eventfd(irq.qid, -5), errno::EBADF)?;
        expect_errno("arm without an eventfd", dev.arm_irq(irq.qid), errno::EINVAL)?;
        expect_errno("arm a polled queue", dev.arm_irq(polled.qid), errno::EINVAL)?;
        expect_errno("arm a bogus qid", dev.arm_irq(999), errno::ENOENT)?;
        dev.delete_qpair(irq.qid)?;
        dev.delete_qpair(polled.qid)?;
        Ok(())
    })
}

fn reset_keeps_queues() -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(32)?;
    let mut buf = HostBuf::new(16384)?;
    buf.bytes_mut().copy_from_slice(&pattern(31, 16384));
    let h = dev.register(buf.addr(), 16384)?;
    let segs = dev.segments(h)?;
    qp.rw_sync(true, &ns, 777, &segs, 0, 16384)?;
    let before = dev.status()?;
    dev.reset()?;
    let after = dev.status()?;
    let (b, a) = (ControllerState(before.state), ControllerState(after.state));
    ensure_that!(a.epoch() > b.epoch() && after.resets == before.resets + 1, "{before:?} -> {after:?}");
    ensure_that!(after.qpairs == 1 && after.registrations == 1 && !a.faulted(), "{after:?}");
    qp.reset_ring();
    dev.rearm_qpair(qp.qid)?;
    buf.bytes_mut().fill(0);
    qp.rw_sync(false, &ns, 777, &segs, 0, 16384)?;
    ensure_that!(buf.bytes() == &pattern(31, 16384)[..], "data after reset differs");
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}
