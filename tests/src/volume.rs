//! Striped volumes (issue 15): integrity through a 4-member volume at chunk-crossing offsets,
//! members of unequal size. (The cross-check with the kernel's md RAID0 needs CONFIG_MD_RAID0 in
//! the test kernel: not yet.)

use crate::kmod::bound_node;
use crate::{ensure_that, Test};
use anyhow::Result;
use ugds::{pattern, Error, Storage};

const V: &str = "volume";

/// Four controllers; the last is smaller, so the volume is 4 x 48 MiB (md's first zone).
pub const NVME: &[&str] =
    &["size=64M,serial=vol0", "size=64M,serial=vol1", "size=64M,serial=vol2", "size=48M,serial=vol3"];

const CHUNK: u64 = 64 << 10;
const MEMBER_BYTES: u64 = 48 << 20;

/// The volume tests.
pub fn tests() -> Vec<Test> {
    vec![Test { name: "volume_integrity_at_chunk_crossing_offsets", variant: V, run: integrity }]
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
