//! Striped volumes (issue 15): integrity through a 4-member volume at chunk-crossing offsets,
//! members of unequal size, and the layout cross-checked with the kernel's md RAID0 (`mdadm
//! --build`, no superblock) in both directions.

use crate::kmod::bound_node;
use crate::{direct_read, direct_write, driver_of, ensure_that, nvme_controllers, nvme_name, sh, xtask, Test};
use anyhow::{Context, Result};
use ugds::{pattern, Error, Storage};

const V: &str = "volume";

/// Four controllers; the last is smaller, so the volume is 4 x 48 MiB (md's first zone).
pub const NVME: &[&str] =
    &["size=64M,serial=vol0", "size=64M,serial=vol1", "size=64M,serial=vol2", "size=48M,serial=vol3"];

const CHUNK: u64 = 64 << 10;
const MEMBER_BYTES: u64 = 48 << 20;

/// The volume tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "volume_integrity_at_chunk_crossing_offsets", variant: V, run: integrity },
        Test { name: "volume_layout_is_md_raid0_both_ways", variant: V, run: md_cross_check },
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
        (4 * MEMBER_BYTES - 4096, 4096),
    ]
}

fn spec() -> Result<String> {
    let nodes: Vec<String> = (0..4).map(bound_node).collect::<Result<_>>()?;
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
    Ok(())
}

/// The members' block devices once the kernel drives them again, in stripe order.
fn kernel_members() -> Result<Vec<String>> {
    let mut v = Vec::new();
    for a in nvme_controllers()? {
        if driver_of(&a).as_deref() == Some("ugds") {
            let (ok, out) = xtask(&["unbind", &a])?;
            ensure_that!(ok, "unbind {a}: {out}");
        }
        let name = nvme_name(&a)?;
        let dev = format!("/dev/{name}n1");
        for _ in 0..100 {
            if std::path::Path::new(&dev).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        v.push(dev);
    }
    Ok(v)
}

fn md_build(members: &[String]) -> Result<()> {
    // Members of unequal size make md's RAID0 multi-zone, which the kernel refuses to run
    // without a layout for the zones past the first (Linux 5.4+); the layout does not change
    // zone 0, which is all the volume uses.
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

/// `cargo xtask bind A B C D`: all or nothing (one member held open refuses the list, naming the
/// holder, and binds none), the same controller twice refused by name; then one call binds all
/// four and prints the volume spec, which opens; `bind --all` of bound ones is a no-op printing
/// the same spec; `unbind --all` gives every one back and prints the matching `mdadm --build`.
fn multi_bind() -> Result<()> {
    crate::load_module()?;
    let addrs = nvme_controllers()?;
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
    let (ok, out) = run(&["bind".into(), "--all".into(), "--chunk".into(), "64K".into()])?;
    let want = format!("volume: stripe:64K:{}", nodes.join(","));
    ensure_that!(ok && out.lines().any(|l| l == want), "bind --all of bound controllers: {out}");
    let (ok, out) = run(&["unbind".into(), "--all".into()])?;
    ensure_that!(ok, "unbind --all: {out}");
    let mut disks = Vec::new();
    for a in &addrs {
        ensure_that!(driver_of(a).as_deref() == Some("nvme"), "{a} is not back with nvme");
        disks.push(format!("/dev/{}n1", nvme_name(a)?));
    }
    let want = format!("mdadm --build /dev/md0 --level=0 --chunk=128 --raid-devices=4 {}", disks.join(" "));
    ensure_that!(out.contains(&want), "no {want:?} in: {out}");
    Ok(())
}
