//! The peer-to-peer benchmark's guest side (`cargo xtask bench --p2p` boots it): the same reads
//! into the stand-in GPU's BAR and into host memory through ugds, and the kernel nvme driver's
//! own peer-to-peer read (O_DIRECT into another controller's CMB, published as p2pmem) and its
//! read into host memory, all behind one switch in one VM; and what registering the BAR costs
//! against registering host memory of the same size. Prints one JSON line for the host side.

use crate::kmod::bound_node;
use crate::raw::Mapping;
use crate::vfio::Bar;
use crate::{ensure_that, nvme_controllers};
use anyhow::{Context, Result};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};
use ugds::Storage;

/// Sizes of one read, bytes.
const SIZES: [u64; 2] = [4096, 1 << 20];
/// The region reads cycle over (in the BAR, in host memory and on the disks).
const REGION: u64 = 32 << 20;
/// Registrations timed per kind.
const REGISTRATIONS: usize = 20;

/// Reads per second and mean microseconds of `op(offset)` over `seconds`.
fn measure(seconds: f64, size: u64, mut op: impl FnMut(u64) -> Result<()>) -> Result<(f64, f64)> {
    for off in (0..REGION).step_by(size as usize).take(8) {
        op(off)?; // warm-up
    }
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < seconds {
        op((n * size) % REGION)?;
        n += 1;
    }
    let s = t.elapsed().as_secs_f64();
    Ok((n as f64 / s, s * 1e6 / n as f64))
}

/// Median of `f`'s durations over `n` runs, microseconds.
fn median_us(n: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[n / 2])
}

/// The guest's run: `seconds` per point.
pub fn main(seconds: f64) -> Result<()> {
    let ctrls = nvme_controllers()?;
    ensure_that!(ctrls.len() >= 3, "the benchmark needs 3 controllers, found {}", ctrls.len());
    // Controller 0 goes to ugds; 1 (the kernel's source) and 2 (the CMB) stay with the kernel.
    let node = bound_node(0)?;
    let src = crate::namespace_block_device(&ctrls[1])?;
    let p2pmem = format!("/sys/bus/pci/devices/{}/p2pmem", ctrls[2]);
    let bar = Bar::open()?;
    let fd = bar.export(0, bar.size)?;
    let st = Storage::open(&node)?;
    let gpu = st.register_dmabuf(fd.as_fd())?;
    let host = st.alloc_host(REGION as usize)?;
    // The kernel's side: O_DIRECT reads from controller 1 into controller 2's CMB, and into host
    // memory.
    use std::os::unix::fs::OpenOptionsExt;
    let disk = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&src)?;
    let alloc = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("{p2pmem}/allocate"))
        .with_context(|| format!("{p2pmem}/allocate: the CMB is not published as p2pmem"))?;
    let cmb = Mapping::new(alloc.as_raw_fd(), 0, REGION as usize, libc::PROT_READ | libc::PROT_WRITE)
        .context("mmap of p2pmem")?;
    let kernel_host = crate::AlignedBuf::new(REGION as usize);
    let pread = |dst: u64, size: u64, off: u64| -> Result<()> {
        // SAFETY: `dst` is `size` writable bytes of one of our mappings.
        let n = unsafe { libc::pread(disk.as_raw_fd(), dst as *mut libc::c_void, size as usize, off as i64) };
        ensure_that!(
            n == size as isize,
            "O_DIRECT pread of {size} at {off}: {n} ({})",
            std::io::Error::last_os_error()
        );
        Ok(())
    };
    let mut points = Vec::new();
    for size in SIZES {
        let (bar_iops, bar_us) = measure(seconds, size, |o| st.read(&gpu, o, o, size).map(drop).map_err(Into::into))?;
        let (host_iops, host_us) =
            measure(seconds, size, |o| st.read(&host, o, o, size).map(drop).map_err(Into::into))?;
        let (kp2p_iops, kp2p_us) = measure(seconds, size, |o| pread(cmb.addr() + o, size, o))?;
        let base = kernel_host.as_slice().as_ptr() as u64;
        let (khost_iops, khost_us) = measure(seconds, size, |o| pread(base + o, size, o))?;
        points.push(serde_json::json!({
            "size": size,
            "ugds_bar": { "iops": bar_iops, "mean_us": bar_us },
            "ugds_host": { "iops": host_iops, "mean_us": host_us },
            "kernel_p2pmem": { "iops": kp2p_iops, "mean_us": kp2p_us },
            "kernel_host": { "iops": khost_iops, "mean_us": khost_us },
        }));
    }
    drop((gpu, host));
    let len = 64usize << 20;
    let bar_fd = bar.export(0, len as u64)?;
    let reg_bar = median_us(REGISTRATIONS, || st.register_dmabuf(bar_fd.as_fd()).map(drop).map_err(Into::into))?;
    // Host memory of the same size, allocated and touched once: only registering it is timed.
    let mut hb = crate::raw::HostBuf::new(len)?;
    hb.bytes_mut().fill(1);
    let reg_host = median_us(REGISTRATIONS, || {
        // SAFETY: `hb` stays mapped, and untouched, while the buffer (dropped at once) lives.
        unsafe { st.register_host(hb.bytes_mut().as_mut_ptr(), len) }.map(drop).map_err(Into::into)
    })?;
    let out = serde_json::json!({
        "seconds": seconds,
        "topology": std::env::var("UGDS_P2P_TOPOLOGY").unwrap_or_default(),
        "points": points,
        "register_64m_us": { "bar_dmabuf": reg_bar, "host": reg_host },
    });
    println!("UGDS-P2P-BENCH {out}");
    std::thread::sleep(Duration::from_millis(10));
    Ok(())
}
