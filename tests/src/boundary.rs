//! The kernel boundary under what multi-process users do: fork with a device open, stray writes
//! to the doorbell mapping, mappings racing queue deletion, resets while others write, pinned
//! memory charged to its process, exclusive opens. Each test checks the data or the errno, and
//! the suite checks the kernel log after each.

use crate::kmod::bound_node;
use crate::raw::{errno_of, HostBuf, Mapping, RawDev};
use crate::{ensure_that, pattern, spawn_ready_child, Test};
use anyhow::{bail, Context, Result};
use std::time::{Duration, Instant};
use ugds_uapi::ioctl::*;

const V: &str = "kmod";

/// The boundary tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "boundary_fork_child_refused_parent_undisturbed", variant: V, run: fork_child },
        Test { name: "boundary_doorbell_mapping_is_exactly_the_doorbells", variant: V, run: doorbell_len },
        Test { name: "boundary_doorbell_storm_leaves_controller_usable", variant: V, run: doorbell_storm },
        Test { name: "boundary_revoked_mappings_sigbus_mmap_delete_race", variant: V, run: map_delete_race },
        Test { name: "boundary_reset_ledger_no_replay", variant: V, run: reset_ledger },
        Test { name: "boundary_pinned_memory_charged_and_limited", variant: V, run: pinned_accounting },
        Test { name: "boundary_exclusive_open", variant: V, run: exclusive_open },
    ]
}

const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

/// The exact doorbell mapping length of a controller: every queue's two doorbells, page rounded.
fn doorbell_bytes(info: &DeviceInfo) -> usize {
    ((info.max_qpairs as usize + 1) * 2 * info.doorbell_stride as usize).next_multiple_of(4096)
}

/// True when this process maps anything of a ugds node.
fn maps_ugds() -> Result<bool> {
    Ok(std::fs::read_to_string("/proc/self/maps")?.lines().any(|l| l.contains("ugds_drv")))
}

/// A child made by fork inherits no mapping and no use of the parent's file: every ioctl and
/// mmap through the inherited fd is EPERM; it can open the node afresh and do I/O; the parent's
/// buffer is untouched and its queue keeps working after the child exits.
fn fork_child() -> Result<()> {
    // Within MDTS (512 KiB on QEMU's controller): one command.
    const LEN: usize = 256 << 10;
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let ns = dev.info.namespaces[0];
    let mut qp = dev.create_qpair(16)?;
    let mut buf = HostBuf::new(LEN)?;
    buf.bytes_mut().copy_from_slice(&pattern(71, LEN));
    let h = dev.register(buf.addr(), LEN as u64)?;
    let segs = dev.segments(h)?;
    qp.rw_sync(true, &ns, 2048, &segs, 0, LEN as u64)?;
    // A read in the child through the parent's queue would turn this back into pattern 71.
    buf.bytes_mut().copy_from_slice(&pattern(72, LEN));
    ensure_that!(maps_ugds()?, "the parent maps nothing of the node");
    // SAFETY: the suite is single-threaded here; the child only runs `fork_child_body` (plain
    // system calls and allocation) and leaves with `_exit`, dropping nothing of the parent's.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let code = fork_child_body(&node, &dev, h);
        // SAFETY: leaves the child at once, without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    ensure_that!(libc::WIFEXITED(status), "the child died ({status:#x})");
    let code = libc::WEXITSTATUS(status);
    ensure_that!(code == 0, "the child's check {code} failed (see fork_child_body)");
    ensure_that!(buf.bytes() == &pattern(72, LEN)[..], "the parent's registered buffer changed");
    buf.bytes_mut().fill(0);
    qp.rw_sync(false, &ns, 2048, &segs, 0, LEN as u64)?;
    ensure_that!(buf.bytes() == &pattern(71, LEN)[..], "the parent's read after the child exited differs");
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}

/// The child's side: a non-zero exit code names the first check that failed.
fn fork_child_body(node: &str, parent: &RawDev, h: RegistrationHandle) -> i32 {
    let eperm = |r: std::io::Result<()>| matches!(r, Err(ref e) if errno_of(e) == errno::EPERM);
    match maps_ugds() {
        Ok(false) => {}
        _ => return 10,
    }
    let mut info = parent.info;
    if !eperm(crate::raw::ioctl_raw(parent.fd(), IOCTL_GET_INFO, &mut info).map(drop)) {
        return 11;
    }
    let b = match HostBuf::new(4096) {
        Ok(b) => b,
        Err(_) => return 12,
    };
    if !eperm(parent.register(b.addr(), 4096).map(drop)) {
        return 13;
    }
    if !eperm(parent.segments(h).map(drop)) {
        return 14;
    }
    if !eperm(parent.create_qpair(16).map(drop)) {
        return 15;
    }
    if !eperm(Mapping::new(parent.fd(), MMAP_DOORBELLS, 4096, RW).map(drop)) {
        return 16;
    }
    if !eperm(parent.reset()) {
        return 17;
    }
    // A fresh open is the child's own.
    let Ok(own) = RawDev::open(node) else { return 20 };
    let ns = own.info.namespaces[0];
    let Ok(mut qp) = own.create_qpair(16) else { return 21 };
    let Ok(mut mine) = HostBuf::new(256 << 10) else { return 22 };
    let Ok(oh) = own.register(mine.addr(), 256 << 10) else { return 23 };
    let Ok(segs) = own.segments(oh) else { return 24 };
    if qp.rw_sync(false, &ns, 2048, &segs, 0, 256 << 10).is_err() {
        return 25;
    }
    if mine.bytes() != &pattern(71, 256 << 10)[..] {
        return 26;
    }
    mine.bytes_mut().fill(1);
    0
}

/// The doorbell mapping covers the doorbells of the controller's queues and no more: one page
/// more is refused, so nothing beyond them (the MSI-X table on QEMU's controller) is reachable.
fn doorbell_len() -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let exact = doorbell_bytes(&dev.info);
    Mapping::new(dev.fd(), MMAP_DOORBELLS, exact, RW).context("the exact doorbell mapping")?;
    match Mapping::new(dev.fd(), MMAP_DOORBELLS, exact + 4096, RW) {
        Err(e) if errno_of(&e) == errno::EINVAL => Ok(()),
        Err(e) => bail!("a longer doorbell mapping failed with {e}, not EINVAL"),
        Ok(_) => bail!("a doorbell mapping of {} bytes (exact: {exact}) was accepted", exact + 4096),
    }
}

/// The storm child: maps the doorbells and writes random values (half of them small enough to
/// be valid queue indexes) to every word, admin doorbells included, `rounds` times.
pub fn storm_child(node: &str, rounds: u32) -> Result<()> {
    let dev = RawDev::open(node)?;
    let _qp = dev.create_qpair(16)?;
    let len = doorbell_bytes(&dev.info);
    let db = Mapping::new(dev.fd(), MMAP_DOORBELLS, len, RW)?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id());
    println!("READY");
    for _ in 0..rounds {
        for off in (0..len).step_by(4) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // CAST: the low bits of the generator.
            let v = if x & 1 == 0 { (x >> 8) as u32 & 63 } else { (x >> 16) as u32 };
            db.write32(off, v);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// A process writes random values to every word of its doorbell mapping, the admin queue's
/// included. Afterwards the kernel log is clean (the suite checks it), the controller is not
/// faulted, and a new queue pair moves data correctly; the module logged the stray admin
/// completions it ignored (or saw none).
fn doorbell_storm() -> Result<()> {
    let node = bound_node(0)?;
    let mut child = spawn_ready_child(&["storm", &node, "200"])?;
    let st = child.wait()?;
    ensure_that!(st.success(), "the storm child failed: {st}");
    std::thread::sleep(Duration::from_millis(200));
    let dev = RawDev::open(&node)?;
    // The controller's own view of the I/O queues may be garbage now; a reset (what the library
    // does after a timeout) must bring it back if creating a queue does not work at once.
    let mut qp = match dev.create_qpair(32) {
        Ok(q) => q,
        Err(_) => {
            dev.reset()?;
            dev.create_qpair(32)?
        }
    };
    let ns = dev.info.namespaces[0];
    let mut buf = HostBuf::new(65536)?;
    buf.bytes_mut().copy_from_slice(&pattern(91, 65536));
    let h = dev.register(buf.addr(), 65536)?;
    let segs = dev.segments(h)?;
    qp.rw_sync(true, &ns, 512, &segs, 0, 65536)?;
    buf.bytes_mut().fill(0);
    qp.rw_sync(false, &ns, 512, &segs, 0, 65536)?;
    ensure_that!(buf.bytes() == &pattern(91, 65536)[..], "data after the storm differs");
    ensure_that!(!ControllerState(dev.status()?.state).faulted(), "the controller stayed faulted");
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}

/// Set by the SIGBUS handler: the address that faulted.
static SIGBUS_AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn on_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize & !4095;
    SIGBUS_AT.store(addr, std::sync::atomic::Ordering::SeqCst);
    // Put an anonymous page over the faulting one, so the access retried after the handler
    // returns succeeds (mmap is async-signal-safe).
    // SAFETY: replaces exactly the one page of our own revoked mapping that faulted.
    unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            4096,
            RW,
            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
}

/// Threads map a queue pair's SQ while the main thread deletes it, many rounds: every mapping
/// that was made (before or during the deletion) faults with SIGBUS afterwards, never reads
/// freed memory; then the controller is unbound and rebound with mappings alive, and those
/// fault too.
fn map_delete_race() -> Result<()> {
    let node = bound_node(0)?;
    // SAFETY: installs a handler for SIGBUS only (restored below); the handler only maps.
    let old = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGBUS, &sa, &mut old);
        old
    };
    let r = map_delete_rounds(&node, 300);
    // SAFETY: restores the previous disposition.
    unsafe { libc::sigaction(libc::SIGBUS, &old, std::ptr::null_mut()) };
    r
}

fn map_delete_rounds(node: &str, rounds: usize) -> Result<()> {
    let dev = RawDev::open(node)?;
    let fd = dev.fd();
    let (mut faulted, mut refused) = (0usize, 0usize);
    for _ in 0..rounds {
        let qp = dev.create_qpair(16)?;
        let (off, size) = (qp.args.sq_offset, qp.args.sq_size as usize);
        let qid = qp.qid;
        let mapper = std::thread::spawn(move || {
            let mut maps = Vec::new();
            for _ in 0..8 {
                match Mapping::new(fd, off, size, RW) {
                    Ok(m) => maps.push(m),
                    Err(e) if errno_of(&e) == errno::ENOENT => break,
                    Err(e) => return Err(anyhow::anyhow!("mmap: {e}")),
                }
            }
            Ok(maps)
        });
        dev.delete_qpair(qid)?;
        let maps = mapper.join().map_err(|_| anyhow::anyhow!("mapper panicked"))??;
        refused += (maps.len() < 8) as usize;
        for m in maps.iter().chain(std::iter::once(qp.sq_mapping())) {
            SIGBUS_AT.store(0, std::sync::atomic::Ordering::SeqCst);
            let v = m.read32(0);
            let at = SIGBUS_AT.load(std::sync::atomic::Ordering::SeqCst);
            ensure_that!(at == m.addr() as usize, "a mapping of a deleted SQ read {v:#x} without faulting");
            faulted += 1;
        }
        drop(maps);
        drop(qp);
    }
    ensure_that!(faulted >= rounds, "only {faulted} revoked mappings were touched");
    eprintln!("    {faulted} revoked mappings faulted with SIGBUS; {refused} rounds saw mmap refused (ENOENT)");
    Ok(())
}

/// The ledger writer child: writes (block, generation) records to its own blocks through the
/// library, retrying what a reset interrupted, and logs `TRY block generation` before each
/// attempt and `ACK block generation` for each write the library acknowledged, to `log`.
pub fn ledger_child(node: &str, first: u64, count: u64, secs: u64, log: &str) -> Result<()> {
    use std::io::Write;
    use ugds::{Device, DeviceOptions, Error, Storage};
    let mut log = std::io::BufWriter::new(std::fs::File::create(log)?);
    let dev =
        Device::open_with(node, DeviceOptions { queues: 1, timeout: Duration::from_secs(5), ..Default::default() })?;
    let st = Storage::direct(&dev, 1)?;
    let bs = 4096u64;
    let buf = st.alloc_host(bs as usize)?;
    println!("READY");
    let start = Instant::now();
    let mut gen = 0u64;
    let mut x = first | 1;
    while start.elapsed() < Duration::from_secs(secs) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let block = first + x % count;
        gen += 1;
        buf.host_view()?.copy_from_slice(&ledger_record(block, gen, bs as usize));
        writeln!(log, "TRY {block} {gen}")?;
        match st.write(&buf, 0, block * bs, bs) {
            Ok(_) => {
                writeln!(log, "ACK {block} {gen}")?;
                // A pause between writes: QEMU 10.0.2's NVMe model crashes when a reset meets
                // a write it has not completed (see `reset_ledger`); writing back to back, two
                // writers had one in flight at nearly every reset, and the emulator crashed in
                // every boot. Resets still land on writes in flight, fewer of them.
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(Error::EpochChanged { .. } | Error::DeviceFaulted | Error::Timeout { .. }) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
    log.flush()?;
    Ok(())
}

/// A 4 KiB ledger record: the block number and generation, repeated.
fn ledger_record(block: u64, gen: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&block.to_le_bytes());
        v.extend_from_slice(&gen.to_le_bytes());
    }
    v
}

/// One process resets the controller every 150 ms while two others write ledger records
/// (pausing 2 ms after each acknowledged write); afterwards every block holds the record of its
/// last acknowledged write or of a later attempt of the same block, never an older record,
/// another block's record or garbage (which a replayed stale command would leave).
fn reset_ledger() -> Result<()> {
    use std::io::BufRead;
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let blocks = 64u64;
    // A known start: generation 0 everywhere.
    {
        let mut qp = dev.create_qpair(16)?;
        let ns = dev.info.namespaces[0];
        let mut buf = HostBuf::new(blocks as usize * 4096)?;
        for b in 0..blocks {
            buf.bytes_mut()[b as usize * 4096..][..4096].copy_from_slice(&ledger_record(b, 0, 4096));
        }
        let h = dev.register(buf.addr(), blocks * 4096)?;
        let segs = dev.segments(h)?;
        qp.rw_sync(true, &ns, 0, &segs, 0, blocks * 4096)?;
        dev.delete_qpair(qp.qid)?;
        dev.deregister(h.id, h.generation)?;
    }
    let secs = 6;
    let mut writers = Vec::new();
    for w in 0..2u64 {
        let first = (w * blocks / 2).to_string();
        let n = (blocks / 2).to_string();
        let log = format!("/tmp/ugds-ledger-{w}.log");
        writers.push((spawn_ready_child(&["ledger-writer", &node, &first, &n, &secs.to_string(), &log])?, log));
    }
    let start = Instant::now();
    let mut resets = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        // Every 150 ms, not 50: QEMU 10.0.2's NVMe model sometimes frees a queue under a write
        // still in flight at a reset and then crashes (suite.rs, `EMULATOR_CRASH_BOOTS`). Since
        // polling waits stopped pausing every 64 polls the writers keep more in flight, and 120
        // resets a boot crashed it in 10 boots running on Debian's 7.3; about 35 keep a boot
        // likely to live, with as many resets as the check below asks for.
        std::thread::sleep(Duration::from_millis(150));
        if dev.reset().is_ok() {
            resets += 1;
        }
    }
    // gens[block] = (last acknowledged, every attempted generation).
    let mut acked = vec![0u64; blocks as usize];
    let mut tried: Vec<Vec<u64>> = vec![vec![0]; blocks as usize];
    // Attempts a reset cut short (tried, never acknowledged): the resets that met a write.
    let (mut tries, mut acks_logged) = (0usize, 0usize);
    for (mut c, log) in writers {
        let st = c.wait()?;
        ensure_that!(st.success(), "a ledger writer failed: {st}");
        for line in std::io::BufReader::new(std::fs::File::open(&log)?).lines() {
            let line = line?;
            let f: Vec<&str> = line.split_whitespace().collect();
            if let [kind, b, g] = f[..] {
                let (b, g): (usize, u64) = (b.parse()?, g.parse()?);
                match kind {
                    "ACK" => {
                        acked[b] = acked[b].max(g);
                        acks_logged += 1;
                    }
                    "TRY" => {
                        tried[b].push(g);
                        tries += 1;
                    }
                    _ => {}
                }
            }
        }
    }
    let mut qp = dev.create_qpair(16)?;
    let ns = dev.info.namespaces[0];
    let mut buf = HostBuf::new(blocks as usize * 4096)?;
    let h = dev.register(buf.addr(), blocks * 4096)?;
    let segs = dev.segments(h)?;
    qp.rw_sync(false, &ns, 0, &segs, 0, blocks * 4096)?;
    let mut acks = 0;
    for b in 0..blocks as usize {
        let got = &buf.bytes()[b * 4096..][..4096];
        let (blk, gen) = (u64::from_le_bytes(got[..8].try_into()?), u64::from_le_bytes(got[8..16].try_into()?));
        ensure_that!(got == &ledger_record(blk, gen, 4096)[..], "block {b} holds no whole record");
        ensure_that!(blk == b as u64, "block {b} holds block {blk}'s record (generation {gen}): a replayed command");
        ensure_that!(
            gen >= acked[b] && tried[b].contains(&gen),
            "block {b} holds generation {gen}, older than its last acknowledged write {} or never written",
            acked[b]
        );
        acks += (acked[b] > 0) as usize;
    }
    ensure_that!(resets >= 20 && acks > 0, "only {resets} resets and {acks} blocks written");
    eprintln!(
        "    {resets} resets, {} of {tries} writes cut short by one; every one of {blocks} blocks holds its last \
         acknowledged record or a later attempt",
        tries - acks_logged
    );
    dev.delete_qpair(qp.qid)?;
    dev.deregister(h.id, h.generation)?;
    buf.bytes_mut().fill(0);
    Ok(())
}

/// `VmLck` of this process, in KiB.
fn vm_lck_kib() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let line = s.lines().find(|l| l.starts_with("VmLck:")).context("no VmLck line")?;
    Ok(line.split_whitespace().nth(1).context("VmLck value")?.parse()?)
}

/// Registered host memory is charged to the process (`VmLck`) and uncharged on deregistration;
/// without CAP_IPC_LOCK, a registration beyond RLIMIT_MEMLOCK is refused with ENOMEM and pins
/// nothing.
fn pinned_accounting() -> Result<()> {
    let node = bound_node(0)?;
    let dev = RawDev::open(&node)?;
    let before = vm_lck_kib()?;
    let buf = HostBuf::new(1 << 20)?;
    let h = dev.register(buf.addr(), 1 << 20)?;
    let during = vm_lck_kib()?;
    dev.deregister(h.id, h.generation)?;
    let after = vm_lck_kib()?;
    ensure_that!(during == before + 1024 && after == before, "VmLck {before} -> {during} -> {after} kB");
    let mut child = spawn_ready_child(&["memlock", &node])?;
    let st = child.wait()?;
    ensure_that!(st.success(), "the RLIMIT_MEMLOCK child failed: {st}");
    Ok(())
}

/// The RLIMIT_MEMLOCK child: drops CAP_IPC_LOCK, limits locked memory to 64 KiB, and expects a
/// 1 MiB registration to be refused with ENOMEM (and a 32 KiB one to work).
pub fn memlock_child(node: &str) -> Result<()> {
    // Drop CAP_IPC_LOCK from the effective, permitted and inheritable sets.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut hdr = Header { version: 0x2008_0522, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget with a v3 header and two data words, as the ABI defines.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        bail!("capget: {}", std::io::Error::last_os_error());
    }
    let bit = 1u32 << 14; // CAP_IPC_LOCK
    for d in &mut data[..1] {
        d.effective &= !bit;
        d.permitted &= !bit;
        d.inheritable &= !bit;
    }
    // SAFETY: capset with the same layout.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        bail!("capset: {}", std::io::Error::last_os_error());
    }
    let lim = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
    // SAFETY: sets this process's own limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        bail!("setrlimit: {}", std::io::Error::last_os_error());
    }
    let dev = RawDev::open(node)?;
    println!("READY");
    let big = HostBuf::new(1 << 20)?;
    match dev.register(big.addr(), 1 << 20) {
        Err(e) if errno_of(&e) == errno::ENOMEM => {}
        Err(e) => bail!("a registration past RLIMIT_MEMLOCK failed with {e}, not ENOMEM"),
        Ok(_) => bail!("a 1 MiB registration passed a 64 KiB RLIMIT_MEMLOCK without CAP_IPC_LOCK"),
    }
    ensure_that!(vm_lck_kib()? == 0, "the refused registration left pages charged");
    let small = HostBuf::new(32 << 10)?;
    let h = dev.register(small.addr(), 32 << 10).context("a registration within the limit")?;
    dev.deregister(h.id, h.generation)?;
    Ok(())
}

/// `O_EXCL` opens the node alone: other opens fail with EBUSY while it is open, and it fails
/// while others are open; the library names the refusal.
fn exclusive_open() -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let node = bound_node(0)?;
    let open = |excl: bool| {
        std::fs::OpenOptions::new().read(true).write(true).custom_flags(if excl { libc::O_EXCL } else { 0 }).open(&node)
    };
    let ebusy = |r: std::io::Result<std::fs::File>| matches!(r, Err(ref e) if e.raw_os_error() == Some(libc::EBUSY));
    {
        let _x = open(true).context("an exclusive open of an unused node")?;
        ensure_that!(ebusy(open(false)), "a plain open succeeded while the node was held exclusively");
        ensure_that!(ebusy(open(true)), "a second exclusive open succeeded");
        match ugds::Device::open(&node) {
            Err(ugds::Error::DeviceBusy { .. }) => {}
            other => bail!("the library's open of an exclusively held node gave {other:?}"),
        }
    }
    {
        let _a = open(false)?;
        ensure_that!(ebusy(open(true)), "an exclusive open succeeded while another opener had the node");
        let opts = ugds::DeviceOptions { exclusive: true, ..Default::default() };
        match ugds::Device::open_with(&node, opts) {
            Err(ugds::Error::DeviceBusy { .. }) => {}
            other => bail!("the library's exclusive open beside another opener gave {other:?}"),
        }
    }
    let d = ugds::Device::open_with(&node, ugds::DeviceOptions { exclusive: true, ..Default::default() })?;
    drop(d);
    let _again = open(false).context("a plain open after the exclusive opener closed")?;
    Ok(())
}
