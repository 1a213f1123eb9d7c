//! Peer-to-peer DMA between the SSD and another device's BAR, the kernel side of the GPU path,
//! proven without a GPU: QEMU's NVMe model writes into (and reads from) the memory BAR of an
//! emulated device that vfio-pci exports as a dma-buf, as a GPU driver exports its memory.
//!
//! What the kernel allows depends on the set-up the VM was booted with (`UGDS_P2P_TOPOLOGY`):
//! - `switch+pt`: both devices behind one PCIe switch; the kernel routes through the switch
//!   with bus addresses. The IOMMU translates nothing for kernel drivers (passthrough), as
//!   QEMU translates every DMA of a device behind its IOMMU, switch or not: with a translating
//!   IOMMU the kernel's bus addresses would fault there although a real switch routes them.
//! - `root`: both on q35's root complex, whose host bridge Linux does not trust: refused.
//! - `root+zen`: the same with an AMD Zen CPU, whose host bridge Linux trusts: through the
//!   host bridge and the (translating) IOMMU.
//!
//! Debian's kernel has no VFIO no-IOMMU mode, so every variant runs with the guest IOMMU on.

use crate::kmod::bound_node;
use crate::raw::{HostBuf, RawDev};
use crate::vfio::{read_backing_file, Bar};
use crate::{direct_read, ensure_that, nvme_controllers, pattern, sh, xtask, Test};
use anyhow::{Context, Result};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::{AsyncArgs, AsyncParams, Buffer, Error, IoRequest, IoStatus, Op, Path, Storage, StorageBatch, StreamIo};

/// One controller; under the switch it sits beside the stand-in GPU.
pub const NVME: &[&str] = &["size=256M,lbs=4096"];

/// The variants (each boots its own topology).
pub const VARIANTS: [&str; 3] = ["p2p-switch", "p2p-root", "p2p-root-zen"];

/// The tests, one list per variant.
pub fn tests() -> Vec<Test> {
    let mut v = Vec::new();
    for variant in VARIANTS {
        v.push(Test { name: "p2p_route_as_doctor_predicts", variant, run: route_as_predicted });
    }
    // Where the kernel allows the route: the data moves.
    for variant in ["p2p-switch", "p2p-root-zen"] {
        v.push(Test { name: "p2p_sync_reads_and_writes", variant, run: sync_reads_and_writes });
        v.push(Test { name: "p2p_batch_and_stream_ordered", variant, run: batch_and_stream });
        v.push(Test { name: "p2p_revoke_mid_stream", variant, run: revoke_mid_stream });
        v.push(Test { name: "p2p_kill9_with_io_in_flight", variant, run: kill9_in_flight });
        v.push(Test { name: "p2p_c_and_python_faces", variant, run: c_and_python_faces });
    }
    v
}

/// Whether the kernel should allow peer-to-peer in this VM's set-up.
fn expected_allowed() -> Result<bool> {
    let t = std::env::var("UGDS_P2P_TOPOLOGY").context("UGDS_P2P_TOPOLOGY is not set (cargo xtask vm --p2p)")?;
    Ok(t.starts_with("switch") || t.contains("zen"))
}

/// The controller's node, the stand-in GPU opened through vfio, and whether P2P is expected.
fn setup() -> Result<(String, Bar, bool)> {
    let node = bound_node(0)?;
    let bar = Bar::open()?;
    Ok((node, bar, expected_allowed()?))
}

/// What a data test works with: the controller's node and a storage on it, the stand-in GPU, its
/// BAR mapped for the CPU and exported whole as a dma-buf.
struct Rig {
    node: String,
    bar: Bar,
    map: crate::raw::Mapping,
    fd: std::os::fd::OwnedFd,
    st: Arc<Storage>,
}

/// The [`Rig`] of a set-up where the kernel allows the route.
fn rig() -> Result<Rig> {
    let (node, bar, allowed) = setup()?;
    ensure_that!(allowed, "a data test in a set-up where the kernel refuses peer-to-peer");
    let map = bar.map()?;
    let fd = bar.export(0, bar.size)?;
    let st = Storage::open(&node)?;
    Ok(Rig { node, bar, map, fd, st })
}

fn route_as_predicted() -> Result<()> {
    let (node, bar, allowed) = setup()?;
    let nvme = nvme_controllers()?[0].clone();
    let route = ugds::sysfs::Host::system().p2p_route(&nvme, &bar.addr)?;
    ensure_that!(
        route.allowed() == Some(allowed),
        "predicted {route} (allowed {:?}), expected {allowed}",
        route.allowed()
    );
    // The CLI's doctor says the same, in JSON, for the peer it was pointed at.
    let cli = std::env::var("UGDS_CLI").context("UGDS_CLI is not set")?;
    let out = sh(&format!("UGDS_P2P_PEER={} {cli} doctor --json || true", bar.addr))?;
    // One finding per line.
    let said = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|f| f["p2p"]["peer"] == bar.addr.as_str())
        .with_context(|| format!("doctor has no route to {}: {out}", bar.addr))?;
    ensure_that!(said["p2p"]["allowed"] == allowed, "doctor said {said}, expected allowed {allowed}");
    // The kernel agrees: the module registers the BAR or refuses it by name.
    let dev = RawDev::open(&node)?;
    let fd = bar.export(0, bar.size)?;
    match (dev.register_dmabuf(fd.as_raw_fd(), 0, bar.size), allowed) {
        (Ok(h), true) => dev.deregister(h.id, h.generation)?,
        (Err(e), false) => ensure_that!(e.raw_os_error() == Some(libc::EXDEV), "refused with {e}, expected EXDEV"),
        (r, _) => anyhow::bail!("registration {:?}, but doctor predicted allowed={allowed}", r.map(|h| h.nsegs)),
    }
    drop(dev);
    // And the library, with its own error.
    let st = Storage::open(&node)?;
    match (st.register_dmabuf(fd.as_fd()), allowed) {
        (Ok(b), true) => ensure_that!(b.path() == Path::DirectP2p, "registered on {}", b.path()),
        (Err(Error::PeerToPeerRefused), false) => {}
        (r, _) => anyhow::bail!("library registration: {:?}", r.map(|b| b.path())),
    }
    let st = dev_status(&node)?;
    ensure_that!(st.registrations == 0, "a registration stayed: {st:?}");
    Ok(())
}

fn dev_status(node: &str) -> Result<ugds_uapi::ioctl::StatusPage> {
    Ok(RawDev::open(node)?.status()?)
}

/// Sizes and buffer offsets (odd multiples of 4 KiB) of the byte-for-byte round trips.
const CASES: [(u64, u64); 5] =
    [(4096, 4096 * 3), (12288, 4096 * 7), (1 << 20, 4096 * 11), (3 << 20, 4096), (64 << 20, 4096 * 13)];

fn sync_reads_and_writes() -> Result<()> {
    let Rig { bar: _bar, map, fd, st, .. } = rig()?;
    let buf = st.register_dmabuf(fd.as_fd())?;
    ensure_that!(buf.host_view().is_err(), "a CPU view of another driver's memory was granted");
    let host = st.alloc_host(64 << 20)?;
    let mut file_offset = 0u64;
    let mut written = Vec::new();
    for (i, &(len, boff)) in CASES.iter().enumerate() {
        // BAR -> disk: what the CPU put into the BAR lands on the disk.
        let data = pattern(0x5eed + i as u64, len as usize);
        map.write_bytes(boff as usize, &data);
        st.write(&buf, boff, file_offset, len)?;
        st.read(&host, 0, file_offset, len)?;
        ensure_that!(
            host.host_view()?[..len as usize] == data[..],
            "{len} bytes BAR -> disk at buffer offset {boff}: the disk differs"
        );
        // Disk -> BAR at another offset: the BAR holds the disk's bytes, seen by the CPU through
        // vfio and by the VM's host through the BAR's backing file.
        let boff2 = boff + 4096 * 2;
        map.write_bytes(boff2 as usize, &vec![0xEE; len as usize]);
        st.read(&buf, boff2, file_offset, len)?;
        let mut seen = vec![0u8; len as usize];
        map.read_bytes(boff2 as usize, &mut seen);
        ensure_that!(seen == data, "{len} bytes disk -> BAR at buffer offset {boff2}: the BAR differs");
        ensure_that!(
            read_backing_file(boff2, len as usize)? == data,
            "{len} bytes disk -> BAR: the host's backing file differs"
        );
        written.push((file_offset, data));
        file_offset += len.next_multiple_of(1 << 20);
    }
    let c = st.path_counts();
    ensure_that!(c.direct_p2p >= 2 * CASES.len() as u64 && c.direct_staged == 0 && c.fallback == 0, "paths: {c:?}");
    drop((buf, host, st));
    // The kernel's own driver reads what the BAR wrote.
    let ctrl = nvme_controllers()?[0].clone();
    let (ok, out) = xtask(&["unbind", &ctrl])?;
    ensure_that!(ok, "unbind: {out}");
    let blk = crate::namespace_block_device(&ctrl)?;
    for (off, data) in written {
        ensure_that!(direct_read(&blk, off, data.len())? == data, "the kernel nvme driver reads other bytes at {off}");
    }
    Ok(())
}

fn batch_and_stream() -> Result<()> {
    let Rig { bar: _bar, map, fd, st, .. } = rig()?;
    let buf = Arc::new(st.register_dmabuf(fd.as_fd())?);
    // A queue batch: 32 writes of 64 KiB out of the BAR, one doorbell.
    let n = 32u64;
    let data = pattern(0xba7c, (n * 65536) as usize);
    map.write_bytes(4096, &data);
    let mut b = StorageBatch::new(&st, n as usize)?;
    ensure_that!(b.is_native(), "no queue pair of its own");
    let reqs: Vec<IoRequest> = (0..n)
        .map(|i| IoRequest {
            op: Op::Write,
            buf: buf.clone(),
            buf_offset: 4096 + i * 65536,
            file_offset: (100 << 20) + i * 65536,
            len: 65536,
            cookie: i,
        })
        .collect();
    b.submit(&reqs)?;
    let ev = b.status(n as usize, Duration::from_secs(60))?;
    ensure_that!(ev.len() == n as usize, "{} events", ev.len());
    for e in &ev {
        ensure_that!(e.status == IoStatus::Complete && e.bytes == 65536, "{e:?}");
    }
    // Stream-ordered reads back into another part of the BAR.
    let sio = StreamIo::new(ugds::CpuStream::new()?)?;
    let args: Vec<_> = (0..n)
        .map(|i| AsyncArgs::new(65536, (100 << 20) + (i * 65536) as i64, ((8 << 20) + i * 65536) as i64))
        .collect();
    for a in &args {
        sio.read_async(&st, &buf, a)?;
    }
    sio.synchronize()?;
    for (i, a) in args.iter().enumerate() {
        ensure_that!(a.result() == 65536, "stream read {i}: {}", a.result());
    }
    let mut seen = vec![0u8; data.len()];
    map.read_bytes(8 << 20, &mut seen);
    ensure_that!(seen == data, "the stream-ordered reads put other bytes into the BAR");
    Ok(())
}

/// Reads into the BAR in a loop until the exporter revokes it: the I/O then fails by name,
/// and nothing reaches the BAR after the revocation.
fn revoke_mid_stream() -> Result<()> {
    let Rig { node, bar, map, fd, st } = rig()?;
    let buf = st.register_dmabuf(fd.as_fd())?;
    let len = 1u64 << 20;
    let before = dev_status(&node)?;
    let mut pre = HostBuf::new(len as usize)?;
    pre.bytes_mut().copy_from_slice(&pattern(0x4e70, len as usize));
    map.write_bytes(0, pre.bytes());
    st.write(&buf, 0, 0, len)?;
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let ended = std::thread::scope(|s| {
        let reader = s.spawn(|| -> Result<Error> {
            loop {
                match st.read(&buf, 16 << 20, 0, len) {
                    Ok(_) => ops.fetch_add(1, Ordering::Relaxed),
                    // The revocation resets the controller: I/O in flight then is lost, and a
                    // retry learns why.
                    Err(Error::EpochChanged { .. }) => continue,
                    Err(Error::DeviceFaulted) => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    Err(e) => return Ok(e),
                };
                if stop.load(Ordering::Relaxed) {
                    anyhow::bail!("the reader was never told the memory was revoked");
                }
            }
        });
        let t = Instant::now();
        while ops.load(Ordering::Relaxed) < 5 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = bar.revoke();
        let after = ops.load(Ordering::Relaxed);
        // Whatever lands in the BAR from here on came after the revocation.
        map.write_bytes(16 << 20, &vec![0u8; len as usize]);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let e = reader.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        eprintln!("revoked by {}", r?);
        Ok::<_, anyhow::Error>((e?, after))
    });
    let (e, after) = ended?;
    ensure_that!(matches!(e, Error::Revoked), "I/O after the revocation failed with {e}, not Revoked");
    ensure_that!(after >= 5, "only {after} reads before the revocation");
    let mut seen = vec![1u8; len as usize];
    map.read_bytes(16 << 20, &mut seen);
    ensure_that!(seen.iter().all(|&b| b == 0), "the SSD wrote into the BAR after the revocation");
    let s = dev_status(&node)?;
    ensure_that!(s.revocations == before.revocations + 1, "revocations counted: {before:?} -> {s:?}");
    // One reset, the revocation's: the reader that saw the controller faulted while it ran
    // did not ask for another.
    ensure_that!(s.resets == before.resets + 1, "resets: {} -> {}", before.resets, s.resets);
    // Writes from it fail the same way; the other memory still works.
    ensure_that!(matches!(st.write(&buf, 0, 0, 4096), Err(Error::Revoked)), "a write from the revoked buffer");
    let host = st.alloc_host(len as usize)?;
    // This thread's queue has not seen the revocation's reset yet: its first I/O learns of it.
    match st.read(&host, 0, 0, len) {
        Err(Error::EpochChanged { .. }) => st.read(&host, 0, 0, len)?,
        r => r?,
    };
    ensure_that!(host.host_view()?[..] == pre.bytes()[..], "host I/O after the revocation");
    Ok(())
}

/// A process reading into the BAR dies by SIGKILL with commands in flight: once it is gone the
/// SSD writes nothing more there.
fn kill9_in_flight() -> Result<()> {
    ensure_that!(expected_allowed()?, "a data test in a set-up where the kernel refuses peer-to-peer");
    let node = bound_node(0)?;
    // The child opens the device through vfio itself: a VFIO group is open in one process at
    // a time.
    let mut child = crate::spawn_ready_child(&["p2p-reader", &node])?;
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait()?;
    let bar = Bar::open()?;
    let map = bar.map()?;
    map.write_bytes(0, &vec![0u8; 4 << 20]);
    std::thread::sleep(Duration::from_millis(500));
    let mut seen = vec![1u8; 4 << 20];
    map.read_bytes(0, &mut seen);
    ensure_that!(seen.iter().all(|&b| b == 0), "the SSD wrote into the BAR after its reader died");
    let s = dev_status(&node)?;
    ensure_that!(s.registrations == 0 && s.qpairs == 0, "the dead reader left {s:?}");
    Ok(())
}

/// The child of [`kill9_in_flight`]: reads into the BAR from 4 threads until killed.
pub fn reader_child(node: &str) -> Result<()> {
    let bar = Bar::open()?;
    let fd = bar.export(0, bar.size)?;
    let st = Storage::open(node)?;
    let buf: Buffer = st.register_dmabuf(fd.as_fd())?;
    println!("READY");
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (st, buf) = (&st, &buf);
            s.spawn(move || loop {
                let _ = st.read(buf, t << 20, t << 20, 1 << 20);
            });
        }
    });
    Ok(())
}

/// A C program against the installed `libugds.so` and `ugds.h`: the dma-buf registers by its
/// descriptor, then uGDS's own read names it by the address the library returned.
const C_FACE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <ugds.h>
int main(int argc, char **argv) {
  int fd = atoi(argv[2]);
  uGDSHandle_t fh;
  void *base = NULL;
  if (uGDSDriverOpen().err != UGDS_SUCCESS) return 2;
  if (ugdsxHandleRegisterTarget(&fh, argv[1]).err != UGDS_SUCCESS) return 3;
  uGDSError_t e = ugdsxBufRegisterDmabuf(fd, &base);
  if (e.err != UGDS_SUCCESS) { printf("register: %d\n", (int)e.err); return 4; }
  ssize_t n = uGDSRead(fh, base, 1 << 20, 0, 4096 * 5);
  if (n != 1 << 20) { printf("read: %zd\n", n); return 5; }
  if (uGDSBufDeregister(base).err != UGDS_SUCCESS) return 6;
  uGDSHandleDeregister(fh);
  uGDSDriverClose();
  printf("C-OK\n");
  return 0;
}
"#;

/// Runs `cmd` with the dma-buf inherited as a descriptor of its own, passed as its last
/// argument; returns its output when it printed `ok`.
fn with_inherited(fd: &std::os::fd::OwnedFd, cmd: &mut std::process::Command, ok: &str) -> Result<String> {
    // SAFETY: a plain dup; the new descriptor (without close-on-exec) is closed below.
    let inherited = unsafe { libc::dup(fd.as_raw_fd()) };
    ensure_that!(inherited >= 0, "dup: {}", std::io::Error::last_os_error());
    let out = cmd.arg(inherited.to_string()).output();
    // SAFETY: closing our own duplicate.
    unsafe { libc::close(inherited) };
    let out = out?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure_that!(out.status.success() && text.contains(ok), "{cmd:?}: {}: {text}", out.status);
    Ok(text)
}

/// The C face (a C program against `libugds.so`: `ugdsxBufRegisterDmabuf`, then uGDS's own calls
/// by the address it returns) and the Python package (`Storage.register_dmabuf`), each in a
/// process given the dma-buf's descriptor, read the disk into the BAR.
fn c_and_python_faces() -> Result<()> {
    let Rig { node, bar: _bar, map, fd, st } = rig()?;
    let len = 1usize << 20;
    let data = pattern(0xcface, len);
    {
        let host = st.alloc_host(len)?;
        host.copy_in(0, &data)?;
        st.write(&host, 0, 0, len as u64)?;
    }
    let root = std::env::current_dir()?;
    let prefix = root.join("target/c-prefix");
    std::fs::write("/tmp/p2p_face.c", C_FACE)?;
    sh(&format!(
        "gcc -O1 -o /tmp/p2p_face /tmp/p2p_face.c -I{p}/include -L{p}/lib -lugds -Wl,-rpath,{p}/lib",
        p = prefix.display()
    ))?;
    map.write_bytes(4096 * 5, &vec![0u8; len]);
    // argv[1] the node, argv[2] the descriptor (added by `with_inherited`).
    let mut c = std::process::Command::new("/tmp/p2p_face");
    c.arg(&node);
    with_inherited(&fd, &mut c, "C-OK")?;
    let mut seen = vec![0u8; len];
    map.read_bytes(4096 * 5, &mut seen);
    ensure_that!(seen == data, "the C face's read put other bytes into the BAR");
    map.write_bytes(4096 * 9, &vec![0u8; len]);
    let script = "import sys, ugds\n\
        st = ugds.open(sys.argv[1])\n\
        b = st.register_dmabuf(int(sys.argv[2]))\n\
        assert st.read(b, 0, 1 << 20, buf_offset=4096 * 9) == 1 << 20\n\
        try:\n    b.copy_in(b'x' * 4096, 0)\nexcept ugds.Error:\n    pass\nelse:\n    sys.exit('copy_in into a dma-buf worked')\n\
        print('PY-OK', b.path)\n";
    let mut py = std::process::Command::new(root.join("target/pyenv/bin/python"));
    py.args(["-c", script, &node]);
    let said = with_inherited(&fd, &mut py, "PY-OK")?;
    ensure_that!(said.contains("direct"), "Python's buffer took another path: {said}");
    map.read_bytes(4096 * 9, &mut seen);
    ensure_that!(seen == data, "Python's read put other bytes into the BAR");
    Ok(())
}
