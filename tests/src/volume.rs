//! Striped volumes (issue 15): integrity through a 4-member volume at chunk-crossing offsets,
//! members of unequal size, the layout cross-checked with the kernel's md RAID0 (`mdadm
//! --build`, no superblock) in both directions, the C ABI and cuFile faces through a volume
//! descriptor file, one member timing out while the others work, and kill -9 mid-stripe.

use crate::kmod::bound_node;
use crate::raw::RawDev;
use crate::{direct_read, direct_write, driver_of, ensure_that, nvme_controllers, nvme_name, sh, xtask, Test};
use anyhow::{Context, Result};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use ugds::{pattern, DeviceOptions, Error, Storage, VolumeSpec};

const V: &str = "volume";

/// Four controllers; the last is smaller, so the volume is 4 x 48 MiB (md's first zone). A
/// fifth, throttled to 10 I/O per second with 8 KiB commands, is the slow member of the timeout
/// test only.
pub const NVME: &[&str] = &[
    "size=64M,serial=vol0",
    "size=64M,serial=vol1",
    "size=64M,serial=vol2",
    "size=48M,serial=vol3",
    "size=48M,serial=vol4,throttle_iops=10,mdts=1",
];

/// The volume's members (controllers 0..4); controller 4 is the throttled one.
const MEMBERS: usize = 4;
const THROTTLED: usize = 4;

const CHUNK: u64 = 64 << 10;
const MEMBER_BYTES: u64 = 48 << 20;

/// The volume tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "volume_integrity_at_chunk_crossing_offsets", variant: V, run: integrity },
        Test { name: "volume_layout_is_md_raid0_both_ways", variant: V, run: md_cross_check },
        Test { name: "volume_c_abi_and_cufile_through_a_descriptor_file", variant: V, run: descriptor_faces },
        Test { name: "volume_member_timeout_others_keep_working", variant: V, run: member_timeout },
        Test { name: "volume_kill9_mid_stripe_members_read_cleanly", variant: V, run: kill9_mid_stripe },
        Test { name: "volume_queue_batch_across_members", variant: V, run: queue_batch },
        Test { name: "volume_stream_ordered_groups_on_member_queues", variant: V, run: stream_groups },
        // That variant's two controllers have 4096- and 512-byte blocks.
        Test { name: "volume_of_mixed_block_sizes_is_refused_by_name", variant: "two-controllers", run: mixed_lbs },
        Test { name: "volume_bound_by_one_multi_bind", variant: V, run: multi_bind },
    ]
}

/// (offset, len) pairs from 4 KiB to 32 MiB, each crossing chunk boundaries where it can.
fn ranges() -> Vec<(u64, u64)> {
    vec![
        (0, 4096),
        (CHUNK - 4096, 8192),
        (3 * CHUNK - 4096, CHUNK),
        (5 * CHUNK + 4096, 4 * CHUNK + 4096),
        (17 * CHUNK - 8192, 1 << 20),
        (33 << 20, (8 << 20) + 4096),
        (64 << 20, 32 << 20),
        (100 << 20, 64 << 20),
        (4 * MEMBER_BYTES - 4096, 4096),
    ]
}

fn spec() -> Result<String> {
    let nodes: Vec<String> = (0..MEMBERS).map(bound_node).collect::<Result<_>>()?;
    Ok(format!("stripe:{}K:{}", CHUNK >> 10, nodes.join(",")))
}

fn seed(off: u64) -> u64 {
    0x5EED ^ off
}

/// Writes each range's pattern through `st` and reads it back.
fn write_and_verify(st: &Storage, ranges: &[(u64, u64)]) -> Result<()> {
    let max = ranges.iter().map(|r| r.1).max().unwrap_or(0) as usize;
    let buf = st.alloc_host(max)?;
    for &(off, len) in ranges {
        pattern::fill(seed(off), off, &mut buf.host_view()?[..len as usize]);
        st.write(&buf, 0, off, len)?;
    }
    for &(off, len) in ranges {
        buf.host_view()?.fill(0);
        ensure_that!(st.read(&buf, 0, off, len)? == len, "short read at {off}");
        if let Some(bad) = pattern::first_mismatch(seed(off), off, &buf.host_view()?[..len as usize]) {
            anyhow::bail!("volume read of [{off}, +{len}) differs at byte {bad}");
        }
    }
    Ok(())
}

fn integrity() -> Result<()> {
    let st = Storage::open(&spec()?)?;
    ensure_that!(st.is_direct(), "{}", st.describe());
    ensure_that!(st.capacity()? == 4 * MEMBER_BYTES, "capacity {} (want 4 x the smallest member)", st.capacity()?);
    write_and_verify(&st, &ranges())?;
    let c = st.path_counts();
    ensure_that!(c.direct_host == 2 * ranges().len() as u64 && c.fallback == 0, "{c:?}");
    // Past the end: a named error, nothing written.
    let buf = st.alloc_host(8192)?;
    match st.write(&buf, 0, 4 * MEMBER_BYTES - 4096, 8192) {
        Err(Error::InvalidArgument { arg: "file_offset", .. }) => {}
        other => anyhow::bail!("a write past the volume's end: {other:?}"),
    }
    // Misnamed volumes fail by name.
    match Storage::open("stripe:3000:/dev/ugds_drv0") {
        Err(Error::InvalidArgument { arg: "chunk", .. }) => {}
        other => anyhow::bail!("chunk 3000: {other:?}"),
    }
    let first = bound_node(0)?;
    match Storage::open(format!("stripe:{first},/dev/null")) {
        Err(Error::NotUgdsNode { path, .. }) if path == "/dev/null" => {}
        other => anyhow::bail!("a member that is not a ugds node: {other:?}"),
    }
    // One controller under two names.
    let alias = "/tmp/ugds-volume-alias";
    let _ = std::fs::remove_file(alias);
    std::os::unix::fs::symlink(&first, alias)?;
    let twice = Storage::open(format!("stripe:{first},{alias}"));
    std::fs::remove_file(alias)?;
    match twice {
        Err(Error::InvalidArgument { arg: "volume", reason }) if reason.contains("same ugds device") => {}
        other => anyhow::bail!("one controller under two names: {other:?}"),
    }
    Ok(())
}

/// The members' block devices once the kernel drives them again, in stripe order.
fn kernel_members() -> Result<Vec<String>> {
    let mut v = Vec::new();
    for a in nvme_controllers()?.into_iter().take(MEMBERS) {
        if driver_of(&a).as_deref() == Some("ugds") {
            let (ok, out) = xtask(&["unbind", &a])?;
            ensure_that!(ok, "unbind {a}: {out}");
        }
        v.push(crate::namespace_block_device(&a)?);
    }
    Ok(v)
}

fn md_build(members: &[String]) -> Result<()> {
    // Members of unequal size make md's RAID0 multi-zone, which the kernel refuses to run
    // without a layout for the zones past the first (Linux 5.4+); the layout does not change
    // zone 0, which is all the volume uses.
    // Built in on the test kernel, a module on Debian's.
    crate::remote::insmod("drivers/md/raid0.ko", "raid0")?;
    sh("echo 2 > /sys/module/raid0/parameters/default_layout")?;
    sh(&format!(
        "mdadm --build /dev/md0 --level=0 --chunk={} --raid-devices={} {} 2>&1",
        CHUNK >> 10,
        members.len(),
        members.join(" ")
    ))
    .context("mdadm --build (needs CONFIG_MD_RAID0 in the test kernel and mdadm on the host)")?;
    Ok(())
}

fn md_cross_check() -> Result<()> {
    // ugds writes, md reads.
    let ranges = ranges();
    write_and_verify(&*Storage::open(&spec()?)?, &ranges)?;
    let members = kernel_members()?;
    md_build(&members)?;
    let r = (|| -> Result<()> {
        for &(off, len) in &ranges {
            let got = direct_read("/dev/md0", off, len as usize)?;
            if let Some(bad) = pattern::first_mismatch(seed(off), off, &got) {
                anyhow::bail!("md0 read of [{off}, +{len}) written by the ugds volume differs at byte {bad}");
            }
        }
        // md writes, ugds reads: new data at other offsets (chunk-crossing too).
        for &(off, len) in &[(7 * CHUNK - 4096, 3 * CHUNK), (100 << 20, 2 << 20)] {
            let mut data = vec![0u8; len as usize];
            pattern::fill(seed(off) ^ 1, off, &mut data);
            direct_write("/dev/md0", off, &data)?;
        }
        Ok(())
    })();
    sh("mdadm --stop /dev/md0 2>&1")?;
    r?;
    let st = Storage::open(&spec()?)?;
    let buf = st.alloc_host(3 * CHUNK as usize)?;
    for &(off, len) in &[(7 * CHUNK - 4096, 3 * CHUNK), (100 << 20, 2 << 20)] {
        let len = len.min(3 * CHUNK);
        st.read(&buf, 0, off, len)?;
        if let Some(bad) = pattern::first_mismatch(seed(off) ^ 1, off, &buf.host_view()?[..len as usize]) {
            anyhow::bail!("volume read of [{off}, +{len}) written through md0 differs at byte {bad}");
        }
    }
    Ok(())
}

/// The C ABI's suite (`ugds_test`, gcc against the installed library) on a volume descriptor
/// file, then the cuFile face's unaligned writes through a handle on the same file: both reach
/// the 4-member volume (checked through the volume), never the descriptor file's bytes.
fn descriptor_faces() -> Result<()> {
    use ugds::capi::{Face, Library};
    let bin = std::env::var("UGDS_C_SUITE").context("UGDS_C_SUITE is not set (run through cargo xtask test)")?;
    let desc = "/tmp/vm-volume.ugds-volume";
    std::fs::write(desc, VolumeSpec::parse(&spec()?)?.descriptor())?;
    let text = std::fs::read(desc)?;
    let st = Storage::open(desc)?;
    ensure_that!(st.describe().contains("striped volume"), "{desc}: {}", st.describe());
    // What the node's caller prepares through the kernel, prepared through the volume.
    let buf = st.alloc_host(2 << 20)?;
    pattern::fill(0x16, 16 << 20, &mut buf.host_view()?[..1 << 20]);
    st.write(&buf, 0, 16 << 20, 1 << 20)?;
    buf.host_view()?.fill(0);
    st.write(&buf, 0, 8 << 20, 2 << 20)?;
    crate::portable::run_c_suite(&bin, desc)?;
    st.read(&buf, 0, 8 << 20, 2 << 20)?;
    ensure_that!(
        pattern::first_mismatch(0x8, 8 << 20, &buf.host_view()?).is_none(),
        "uGDSWrite's data differs on the volume"
    );
    ensure_that!(std::fs::read(desc)? == text, "the descriptor file changed");

    // cuFile: unaligned writes from unaligned memory across chunk boundaries.
    let base = 40u64 << 20;
    let span = 4 * CHUNK as usize;
    let mut model = vec![0u8; span];
    pattern::fill(0x40, base, &mut model);
    buf.host_view()?[..span].copy_from_slice(&model);
    st.write(&buf, 0, base, span as u64)?;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(desc)?;
    let lib: &'static Library = Box::leak(Box::new(Library::new(Face::CuFile)));
    let h = lib.handle_register(f.as_raw_fd()).map_err(|e| anyhow::anyhow!("cuFile handle on {desc}: {e:?}"))?;
    ensure_that!(
        lib.handle(h).is_some_and(|x| x.storage.describe().contains("striped volume")),
        "the cuFile handle on {desc} is not the volume"
    );
    for (i, (off, len)) in [(CHUNK as usize - 7, 100usize), (2 * CHUNK as usize - 1, 2), (11, 3 * CHUNK as usize + 5)]
        .into_iter()
        .enumerate()
    {
        let mem: Vec<u8> = (0..len + 3).map(|k| (k as u8).wrapping_mul(29) ^ i as u8).collect();
        // SAFETY: `mem` holds len + 3 bytes and outlives the call.
        let n = unsafe { lib.rw(true, h, mem.as_ptr() as usize + 3, len, (base as usize + off) as i64, 0) };
        ensure_that!(n.as_ref().is_ok_and(|n| *n == len), "cuFile write {len} at +{off}: {n:?}");
        model[off..off + len].copy_from_slice(&mem[3..]);
    }
    let mut back = vec![0u8; span + 1];
    // SAFETY: `back` holds span + 1 bytes.
    let n = unsafe { lib.rw(false, h, back.as_mut_ptr() as usize + 1, span, base as i64, 0) };
    ensure_that!(n.as_ref().is_ok_and(|n| *n == span), "cuFile read: {n:?}");
    ensure_that!(back[1..] == model[..], "cuFile read-back differs from the model");
    lib.handle_deregister(h, -1).map_err(|e| anyhow::anyhow!("deregister: {e:?}"))?;
    drop(f);
    let again = Storage::open(&spec()?)?;
    let check = again.alloc_host(span)?;
    again.read(&check, 0, base, span as u64)?;
    ensure_that!(*check.host_view()? == model[..], "the volume holds other bytes than cuFile wrote");
    crate::portable::handles_keep_access_mode(desc)?;
    ensure_that!(std::fs::read(desc)? == text, "the descriptor file changed");
    std::fs::remove_file(desc)?;
    Ok(())
}

/// One member (controller 4, throttled) times out again and again while another thread reads
/// through the same volume from the other members without an error; each timeout names the
/// member and its offset, the member recovers through its own controller reset, and a patient
/// reader then reads the member's data correctly.
fn member_timeout() -> Result<()> {
    let nodes = vec![bound_node(0)?, bound_node(1)?, bound_node(THROTTLED)?];
    let slow = nodes[2].clone();
    let spec = VolumeSpec { members: nodes, nsid: 1, chunk: CHUNK };
    // 200 ms is far beyond a command of the healthy members; a 64 KiB piece on the throttled
    // member is 8 commands at 10 per second. One queue per member, so each timeout's reset
    // resynchronises the queue the next read uses (another queue of the same open would see
    // the epoch change once instead, as another user does).
    let hasty = Storage::volume(
        &spec,
        &DeviceOptions { timeout: Duration::from_millis(200), queues: 1, ..Default::default() },
    )?;
    let patient = Storage::volume(&spec, &DeviceOptions { timeout: Duration::from_secs(30), ..Default::default() })?;
    let all = 3 * CHUNK;
    let buf = patient.alloc_host(all as usize)?;
    pattern::fill(0x77, 0, &mut buf.host_view()?);
    patient.write(&buf, 0, 0, all)?;
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (timeouts, healthy_reads) = std::thread::scope(|s| -> Result<(usize, usize)> {
        // Chunks 0 and 1 live on members 0 and 1 only.
        let reader = s.spawn(|| -> Result<usize> {
            let b = hasty.alloc_host(2 * CHUNK as usize)?;
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                b.host_view()?.fill(0);
                hasty.read(&b, 0, 0, 2 * CHUNK).with_context(|| format!("healthy members, read {n}"))?;
                if let Some(bad) = pattern::first_mismatch(0x77, 0, &b.host_view()?) {
                    anyhow::bail!("healthy members, read {n}: byte {bad} differs");
                }
                n += 1;
            }
            Ok(n)
        });
        let big = hasty.alloc_host(all as usize)?;
        let mut timeouts = 0;
        let r = (|| -> Result<()> {
            for i in 0..5 {
                match hasty.read(&big, 0, 0, all) {
                    Err(Error::Member { member, offset: 0, source })
                        if member == slow && matches!(*source, Error::Timeout { .. }) =>
                    {
                        timeouts += 1
                    }
                    other => anyhow::bail!("timeout {i}: expected the slow member {slow} to time out, got {other:?}"),
                }
                ensure_that!(big.host_view().is_ok(), "timeout {i}: the buffer is still leased after the reset");
            }
            Ok(())
        })();
        stop.store(true, Ordering::Release);
        let n = reader.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
        r?;
        Ok((timeouts, n))
    })?;
    let elapsed = start.elapsed();
    // The slow member recovered: its chunk reads back (the patient open sees the resets' epoch
    // change once, by name, then carries on).
    buf.host_view()?.fill(0);
    let mut epoch_errors = 0;
    loop {
        match patient.read(&buf, 0, 0, all) {
            Ok(_) => break,
            Err(Error::Member { source, .. }) if matches!(*source, Error::EpochChanged { .. }) && epoch_errors < 3 => {
                epoch_errors += 1
            }
            Err(e) => anyhow::bail!("after recovery: {e}"),
        }
    }
    ensure_that!(pattern::first_mismatch(0x77, 0, &buf.host_view()?).is_none(), "data differs after recovery");
    println!(
        "    {timeouts} timeouts of {slow}, each naming it; {healthy_reads} reads of the healthy members meanwhile, none failed; {:.1} s",
        elapsed.as_secs_f64()
    );
    ensure_that!(timeouts == 5, "timeouts {timeouts}");
    ensure_that!(healthy_reads > 0, "the healthy members' reader never completed a read");
    Ok(())
}

/// Child: writes 4 MiB stripes across the volume `spec` until killed.
pub fn writer_child(spec: &str) -> Result<()> {
    let st = Storage::open(spec)?;
    let len = 4u64 << 20;
    let buf = st.alloc_host(len as usize)?;
    pattern::fill(0xC1, 0, &mut buf.host_view()?);
    println!("READY");
    let span = st.capacity()? - len;
    let mut off = 0u64;
    loop {
        st.write(&buf, 0, off, len)?;
        off = (off + len + 3 * CHUNK) % span / 4096 * 4096;
    }
}

/// 20 times: a process writing stripes across all four members is killed at a random moment;
/// no member keeps a queue pair, registration or pinned page of it; afterwards the kernel
/// driver reads every member from end to end without an error, and the volume works again.
fn kill9_mid_stripe() -> Result<()> {
    let vol = spec()?;
    let nodes: Vec<String> = (0..MEMBERS).map(bound_node).collect::<Result<_>>()?;
    let probes: Vec<RawDev> = nodes.iter().map(|n| RawDev::open(n)).collect::<Result<_>>()?;
    let baseline: Vec<_> = probes.iter().map(|p| p.status()).collect::<std::io::Result<_>>()?;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..20 {
        let mut child = crate::spawn_ready_child(&["volume-writer", &vol])
            .with_context(|| format!("iteration {i}: the writer did not start"))?;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(rng % 200));
        child.kill()?;
        child.wait()?;
        for (m, p) in probes.iter().enumerate() {
            let (now, then) = (p.status()?, &baseline[m]);
            ensure_that!(
                now.pinned_pages == then.pinned_pages
                    && now.qpairs == then.qpairs
                    && now.registrations == then.registrations,
                "iteration {i}: member {} kept the killed writer's state: {now:?} vs {then:?}",
                nodes[m]
            );
        }
    }
    drop(probes);
    let mut bytes = 0u64;
    for dev in kernel_members()? {
        let size: u64 = sh(&format!("blockdev --getsize64 {dev}"))?.trim().parse()?;
        let mut off = 0;
        while off < size {
            let n = (8u64 << 20).min(size - off);
            direct_read(&dev, off, n as usize).with_context(|| format!("the kernel reading {dev} at {off}"))?;
            off += n;
        }
        bytes += size;
    }
    // The volume works again after the members go back to ugds.
    write_and_verify(&*Storage::open(&spec()?)?, &ranges()[..4])?;
    println!("    20 kill -9 mid-stripe: no member kept state; the kernel read {} MiB of members cleanly", bytes >> 20);
    Ok(())
}

/// `cargo xtask bind A B C D`: all or nothing (one member held open refuses the list, naming the
/// holder, and binds none), the same controller twice refused by name; then one call binds all
/// four and prints the volume spec, which opens; `bind --all` of bound ones is a no-op printing
/// the same spec; `unbind --all` gives every one back and prints the matching `mdadm --build`.
fn multi_bind() -> Result<()> {
    crate::load_module()?;
    let every = nvme_controllers()?;
    let addrs: Vec<String> = every.iter().take(MEMBERS).cloned().collect();
    for a in &every {
        if driver_of(a).as_deref() == Some("ugds") {
            let (ok, out) = xtask(&["unbind", a])?;
            ensure_that!(ok, "unbind {a}: {out}");
        }
    }
    let _ = kernel_members()?;
    // Mixed forms: a controller node, a namespace, PCI addresses.
    let targets = vec![
        format!("/dev/{}", nvme_name(&addrs[0])?),
        format!("/dev/{}n1", nvme_name(&addrs[1])?),
        addrs[2].clone(),
        addrs[3].clone(),
    ];
    let args =
        |extra: &[String]| -> Vec<String> { ["bind".to_string()].into_iter().chain(extra.iter().cloned()).collect() };
    let run = |a: &[String]| xtask(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let held = std::fs::File::open(format!("/dev/{}n1", nvme_name(&addrs[2])?))?;
    let (ok, out) = run(&args(&targets))?;
    drop(held);
    ensure_that!(!ok, "a list with a held member bound: {out}");
    ensure_that!(
        out.contains(&format!("{}: ", addrs[2])) && out.contains(&format!("is open by pid {}", std::process::id())),
        "the refusal does not name the held controller and its holder: {out}"
    );
    for a in &addrs {
        ensure_that!(driver_of(a).as_deref() == Some("nvme"), "{a} left nvme after a refused list");
    }
    let (ok, out) = run(&args(&[targets[0].clone(), addrs[0].clone()]))?;
    ensure_that!(!ok && out.contains("are the same controller"), "the same controller twice: {out}");
    let (ok, out) = run(&args(&targets))?;
    ensure_that!(ok, "bind of four: {out}");
    let nodes: Vec<String> = (0..4).map(bound_node).collect::<Result<_>>()?;
    for (a, n) in addrs.iter().zip(&nodes) {
        ensure_that!(out.contains(&format!("{a}: bound to ugds: {n}")), "no line for {a} ({n}): {out}");
    }
    let want = format!("volume: stripe:128K:{}", nodes.join(","));
    ensure_that!(out.lines().any(|l| l == want), "no {want:?} in: {out}");
    let st = Storage::open(want.trim_start_matches("volume: "))?;
    ensure_that!(st.capacity()? == 4 * MEMBER_BYTES, "capacity {}", st.capacity()?);
    drop(st);
    // `--all` also takes the variant's fifth (throttled) controller.
    let (ok, out) = run(&["bind".into(), "--all".into(), "--chunk".into(), "64K".into()])?;
    let every_node: Vec<String> = (0..every.len()).map(bound_node).collect::<Result<_>>()?;
    let want = format!("volume: stripe:64K:{}", every_node.join(","));
    ensure_that!(ok && out.lines().any(|l| l == want), "bind --all of bound controllers: {out}");
    let (ok, out) = run(&["unbind".into(), "--all".into()])?;
    ensure_that!(ok, "unbind --all: {out}");
    let mut disks = Vec::new();
    for a in &every {
        ensure_that!(driver_of(a).as_deref() == Some("nvme"), "{a} is not back with nvme");
        disks.push(crate::namespace_block_device(a)?);
    }
    let want =
        format!("mdadm --build /dev/md0 --level=0 --chunk=128 --raid-devices={} {}", disks.len(), disks.join(" "));
    ensure_that!(out.contains(&want), "no {want:?} in: {out}");
    Ok(())
}

/// A batch on a volume has a queue pair on every member: 192 writes then 192 reads of 4 KiB to
/// one chunk at chunk-crossing offsets (split into two pieces on two members), plus entries
/// of three chunks (pieces on every member, on the same queue pairs: no worker thread) and one
/// past the end (an `Invalid` event); every event once, data checked through the volume's
/// synchronous path.
fn queue_batch() -> Result<()> {
    use std::sync::Arc;
    use ugds::batch::{IoStatus, Op};
    use ugds::{IoRequest, StorageBatch};
    let st = Storage::open(&spec()?)?;
    let n = 192u64;
    let slot = 4 * CHUNK;
    let buf = Arc::new(st.alloc_host((n * slot) as usize)?);
    let mut b = StorageBatch::new(&st, n as usize + 2)?;
    ensure_that!(b.is_native(), "a volume's batch should have queue pairs of its own");
    // Entry i: a length from 4 KiB to one chunk, starting just before a chunk boundary where
    // it can, spread over the volume; two entries of 3 chunks; one past the end.
    let mut reqs: Vec<IoRequest> = (0..n)
        .map(|i| {
            let len = (4096 * (1 + i % 16)).min(CHUNK);
            let boundary = (i * 37 % 700 + 1) * CHUNK;
            IoRequest {
                op: Op::Write,
                buf: buf.clone(),
                buf_offset: i * slot,
                file_offset: boundary - 4096 * (i % 3),
                len,
                cookie: i,
            }
        })
        .collect();
    reqs[5].len = 3 * CHUNK;
    reqs[6].len = 3 * CHUNK;
    reqs[6].file_offset = (100 << 20) + 4096;
    reqs[90].file_offset = 4 * MEMBER_BYTES;
    // Non-overlapping targets: entry i's range ends before entry j's starts unless i == j.
    let mut spans: Vec<(u64, u64)> =
        reqs.iter().filter(|r| r.cookie != 90).map(|r| (r.file_offset, r.file_offset + r.len)).collect();
    spans.sort();
    let overlaps = spans.windows(2).any(|w| w[0].1 > w[1].0);
    ensure_that!(!overlaps, "test setup: entries overlap");
    {
        let mut v = buf.host_view()?;
        for r in &reqs {
            pattern::fill(
                0xB0 ^ r.cookie,
                r.file_offset,
                &mut v[r.buf_offset as usize..(r.buf_offset + r.len) as usize],
            );
        }
    }
    let run = |b: &mut StorageBatch, reqs: &[IoRequest]| -> Result<Vec<ugds::IoEvent>> {
        b.submit(reqs)?;
        let mut ev = Vec::new();
        while ev.len() < reqs.len() {
            let got = b.status(reqs.len() - ev.len(), Duration::from_secs(30))?;
            ensure_that!(!got.is_empty(), "no events within 30 s ({} of {})", ev.len(), reqs.len());
            ev.extend(got);
        }
        Ok(ev)
    };
    for (phase, op) in [("write", Op::Write), ("read", Op::Read)] {
        if op == Op::Read {
            buf.host_view()?.fill(0);
        }
        let rs: Vec<IoRequest> = reqs.iter().cloned().map(|r| IoRequest { op, ..r }).collect();
        let ev = run(&mut b, &rs)?;
        let mut seen = vec![0u32; n as usize];
        for e in &ev {
            seen[e.cookie as usize] += 1;
            let r = &rs[e.cookie as usize];
            if r.cookie == 90 {
                ensure_that!(e.status == IoStatus::Invalid, "{phase} past the end: {e:?}");
            } else {
                ensure_that!(e.status == IoStatus::Complete && e.bytes == r.len, "{phase} entry {}: {e:?}", r.cookie);
            }
        }
        ensure_that!(seen.iter().all(|c| *c == 1), "{phase}: an entry reported other than once");
        ensure_that!(b.pooled_entries() == 0, "{phase}: {} entries ran on worker threads", b.pooled_entries());
    }
    let v = buf.host_view()?;
    for r in reqs.iter().filter(|r| r.cookie != 90) {
        if let Some(bad) = pattern::first_mismatch(
            0xB0 ^ r.cookie,
            r.file_offset,
            &v[r.buf_offset as usize..(r.buf_offset + r.len) as usize],
        ) {
            anyhow::bail!(
                "batch entry {} ([{}, +{}) on the volume) differs at byte {bad}",
                r.cookie,
                r.file_offset,
                r.len
            );
        }
    }
    drop(v);
    // The batch's writes as the synchronous path reads them.
    let check = st.alloc_host(CHUNK as usize)?;
    for r in reqs.iter().filter(|r| r.cookie != 90 && r.len <= CHUNK).step_by(17) {
        st.read(&check, 0, r.file_offset, r.len)?;
        ensure_that!(
            pattern::first_mismatch(0xB0 ^ r.cookie, r.file_offset, &check.host_view()?[..r.len as usize]).is_none(),
            "entry {} differs through the synchronous path",
            r.cookie
        );
    }
    let c = st.path_counts();
    println!("    {} entries x 2 through queue pairs on {MEMBERS} members; path counts {c:?}", n - 1);
    Ok(())
}

/// Stream-ordered groups on a volume run on queue pairs of the registration's own on every
/// member: a group of 8 writes of three chunks and a page at chunk-crossing offsets, then a
/// group reading them back, in stream order; every result the operation's size, the data
/// checked in memory and through the volume's synchronous path.
fn stream_groups() -> Result<()> {
    use std::sync::Arc;
    use ugds::{AsyncArgs, AsyncOp, CpuStream, Op, StreamIo};
    let st = Storage::open(&spec()?)?;
    let (n, len) = (8u64, 3 * CHUNK + 4096);
    let slot = 4 * CHUNK;
    let buf = Arc::new(st.alloc_host((2 * n * slot) as usize)?);
    let at = |i: u64| (i * 29 % 600 + 1) * CHUNK - 4096 * (i % 3);
    {
        let mut v = buf.host_view()?;
        for i in 0..n {
            pattern::fill(0xC0 ^ i, at(i), &mut v[(i * slot) as usize..(i * slot + len) as usize]);
        }
    }
    let sio = StreamIo::new(CpuStream::new()?)?;
    let group = |op: Op, base: u64| -> Vec<AsyncOp> {
        (0..n)
            .map(|i| AsyncOp {
                op,
                buf: buf.clone(),
                args: AsyncArgs::new(len, at(i) as i64, (base + i * slot) as i64),
            })
            .collect()
    };
    let (writes, reads) = (group(Op::Write, 0), group(Op::Read, n * slot));
    sio.submit(&st, &writes)?;
    sio.submit(&st, &reads)?;
    sio.synchronize()?;
    for (i, o) in writes.iter().chain(&reads).enumerate() {
        ensure_that!(o.args.result() == len as i64, "operation {i}: result {}", o.args.result());
    }
    let v = buf.host_view()?;
    for i in 0..n {
        let got = &v[((n + i) * slot) as usize..((n + i) * slot + len) as usize];
        ensure_that!(pattern::first_mismatch(0xC0 ^ i, at(i), got).is_none(), "read {i} differs");
    }
    drop(v);
    let check = st.alloc_host(len as usize)?;
    for i in 0..n {
        st.read(&check, 0, at(i), len)?;
        let got = check.host_view()?;
        ensure_that!(pattern::first_mismatch(0xC0 ^ i, at(i), &got).is_none(), "write {i} differs through read");
    }
    Ok(())
}

/// Members with different block sizes (4096 and 512) are refused by name, before any I/O.
fn mixed_lbs() -> Result<()> {
    let (a, b) = (bound_node(0)?, bound_node(1)?);
    match Storage::open(format!("stripe:{a},{b}")) {
        Err(Error::InvalidArgument { arg: "volume", reason }) if reason.contains("share a block size") => Ok(()),
        other => anyhow::bail!("a volume of 4096- and 512-byte members: {other:?}"),
    }
}
