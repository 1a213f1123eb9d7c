#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! The VM integration suite's harness: test registry, VM variants, helpers for talking to the
//! guest's devices, and the kernel-log check that runs after every test.
//!
//! Tests run as root inside the test VM (`cargo xtask test` boots it), against QEMU's NVMe model.
#![deny(missing_docs)]

pub mod batch;
pub mod boundary;
pub mod fio;
pub mod fork;
pub mod foundation;
pub mod health;
pub mod kmod;
pub mod kmsg;
pub mod mqes;
pub mod nixl;
pub mod ops;
pub mod owned;
pub mod p2p;
pub mod p2p_bench;
pub mod portable;
pub mod python;
pub mod raw;
pub mod reliability;
pub mod remote;
pub mod remote_rdma;
pub mod sgl;
pub mod userlib;
pub mod vfio;
pub mod volume;

use anyhow::{bail, Context, Result};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

/// A VM configuration some tests need.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// Name, as passed to `--variant`.
    pub name: &'static str,
    /// `--nvme` specs, one per controller.
    pub nvme: &'static [&'static str],
    /// Guest IOMMU on.
    pub iommu: bool,
    /// A stand-in GPU for peer-to-peer tests (`cargo xtask vm --p2p`): `switch`, `root`, or none.
    pub p2p: Option<&'static str>,
}

/// Every VM variant the suite uses.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "two-controllers",
        nvme: &["size=256M,lbs=4096,mdts=2", "size=128M,ns=2"],
        iommu: false,
        p2p: None,
    },
    Variant {
        name: "multipath",
        nvme: &["size=256M,lbs=4096,mdts=2,shared=on", "size=128M,ns=2,shared=on"],
        iommu: false,
        p2p: None,
    },
    Variant { name: "userlib", nvme: userlib::NVME, iommu: false, p2p: None },
    Variant { name: "iommu", nvme: &["size=64M"], iommu: true, p2p: None },
    Variant { name: "batch", nvme: batch::NVME, iommu: false, p2p: None },
    Variant { name: "reliability", nvme: reliability::NVME, iommu: false, p2p: None },
    Variant { name: "portable", nvme: portable::NVME, iommu: false, p2p: None },
    Variant { name: "volume", nvme: volume::NVME, iommu: false, p2p: None },
    // The Python package's suites on ugds nodes (the wheel the host phase installed).
    Variant { name: "python", nvme: python::NVME, iommu: false, p2p: None },
    // Namespace 2 is formatted with 8 bytes of metadata per block (QEMU's `ms=8`).
    Variant { name: "capabilities", nvme: &["size=16M,ns=2,ms=8"], iommu: false, p2p: None },
    // MQES 127 (128-entry queues): needs the QEMU 10 that ci/setup.sh caches.
    Variant { name: "small-mqes", nvme: mqes::NVME, iommu: false, p2p: None },
    // The kernel's nvmet exports the (kernel-owned) disk over NVMe/TCP on the loopback interface
    // and over NVMe/RDMA on soft-RoCE (rdma_rxe on a dummy interface).
    Variant { name: "remote", nvme: remote::NVME, iommu: false, p2p: None },
    Variant { name: "ops", nvme: ops::NVME, iommu: false, p2p: None },
    // The fio engine: a node, a second namespace, a 2-member volume (fio 3.33 from the host).
    Variant { name: "fio", nvme: fio::NVME, iommu: false, p2p: None },
    // One pass, with the IOMMU translating: the plugin moves no memory the other variants do not.
    Variant { name: "nixl", nvme: nixl::NVME, iommu: true, p2p: None },
    Variant {
        name: "kmod",
        nvme: &["size=256M,lbs=4096", "size=128M,lbs=512,ns=2", "size=64M,throttle_iops=200"],
        iommu: false,
        p2p: None,
    },
    // The SSD and another device's memory BAR (vfio-pci's dma-buf export, Linux 7.3; vfio-pci
    // needs the guest IOMMU on Debian's kernel): behind one switch (the IOMMU in passthrough,
    // see p2p.rs), on the root complex (q35's host bridge: refused), and on the root complex
    // with an AMD Zen CPU (trusted: through the translating IOMMU).
    Variant { name: "p2p-switch", nvme: p2p::NVME, iommu: true, p2p: Some("switch+pt") },
    Variant { name: "p2p-root", nvme: p2p::NVME, iommu: true, p2p: Some("root") },
    Variant { name: "p2p-root-zen", nvme: p2p::NVME, iommu: true, p2p: Some("root+zen") },
];

/// One test.
pub struct Test {
    /// Name (what `--filter` matches).
    pub name: &'static str,
    /// The variant it runs in.
    pub variant: &'static str,
    /// The body.
    pub run: fn() -> Result<()>,
}

/// Every test, in run order.
pub fn all_tests() -> Vec<Test> {
    let mut v = foundation::tests();
    v.extend(kmod::tests());
    v.extend(boundary::tests());
    v.extend(health::tests());
    v.extend(userlib::tests());
    v.extend(owned::tests());
    v.extend(sgl::tests());
    v.extend(reliability::tests());
    v.extend(batch::tests());
    v.extend(fork::tests());
    v.extend(portable::tests());
    v.extend(volume::tests());
    v.extend(mqes::tests());
    v.extend(ops::tests());
    v.extend(python::tests());
    v.extend(remote::tests());
    v.extend(remote_rdma::tests());
    v.extend(p2p::tests());
    v.extend(fio::tests());
    v.extend(nixl::tests());
    v
}

/// A script's last result line from `tag` on (`UGDS-PY passed=3 failed=0 ...`), and a
/// reader of its `key=N` counts.
pub fn result_line<'a>(text: &'a str, tag: &str) -> Option<ResultLine<'a>> {
    text.lines().rev().find_map(|l| l.find(tag).map(|i| ResultLine(&l[i..])))
}

/// See [`result_line`].
#[derive(Debug, Clone, Copy)]
pub struct ResultLine<'a>(pub &'a str);

impl ResultLine<'_> {
    /// The count `key=N`.
    pub fn count(&self, key: &str) -> Result<u64> {
        self.0
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('='))?.parse().ok())
            .with_context(|| format!("no {key} in {:?}", self.0))
    }
}

/// Runs a shell command, returning stdout; fails with its stderr when it exits non-zero.
pub fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("/bin/sh").arg("-c").arg(cmd).output().with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the host-built xtask binary (`$UGDS_XTASK`) with `args`: (success, stdout + stderr).
pub fn xtask(args: &[&str]) -> Result<(bool, String)> {
    let bin = std::env::var("UGDS_XTASK").context("UGDS_XTASK is not set (run through cargo xtask test)")?;
    let out = Command::new(&bin).args(args).output().with_context(|| format!("running {bin}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

/// Loads ugds.ko (`$UGDS_KMOD`) unless it is loaded; the first time through `ugds-kmod load`: the
/// module is checked against the running kernel (vermagic, configuration, every imported symbol against
/// /proc/kallsyms) before it is inserted, as on a user's machine. On a stock kernel the tool runs
/// inside the kernel's Debian root (`$UGDS_MODULE_ROOT`, where it is installed and the module was
/// built); on the test kernel, from this checkout against its build folder.
pub fn load_module() -> Result<()> {
    if Path::new("/sys/module/ugds").exists() {
        return Ok(());
    }
    let ko = std::env::var("UGDS_KMOD").context("UGDS_KMOD is not set")?;
    // The check reads every kernel symbol: once per suite run is enough for one module file
    // (kmod_load_unload_50 loads it 50 times).
    static CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if CHECKED.load(std::sync::atomic::Ordering::Relaxed) {
        return sh(&format!("insmod {ko}")).map(|_| ());
    }
    let release = sh("uname -r")?.trim().to_string();
    if let Ok(root) = std::env::var("UGDS_MODULE_ROOT") {
        let inside = ko.strip_prefix(root.trim_end_matches('/')).with_context(|| format!("{ko} is not in {root}"))?;
        // The root reaches the guest read-only: give the tool its /proc (kallsyms) and a /tmp.
        if !Path::new(&format!("{root}/proc/self")).exists() {
            sh(&format!("mount -t proc proc {root}/proc && mount -t tmpfs tmp {root}/tmp"))?;
        }
        sh(&format!("chroot {root} /usr/local/sbin/ugds-kmod load --release {release} {inside}"))?;
    } else {
        let build = std::env::var("UGDS_KERNEL_BUILD").context("UGDS_KERNEL_BUILD is not set")?;
        let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmod/ugds-kmod");
        sh(&format!("{} load --release {release} --headers {build} {ko}", tool.display()))?;
    }
    CHECKED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Unloads ugds.ko if loaded.
pub fn unload_module() -> Result<()> {
    if Path::new("/sys/module/ugds").exists() {
        sh("rmmod ugds")?;
    }
    Ok(())
}

/// PCI addresses of the NVMe controllers, in PCI order.
pub fn nvme_controllers() -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in fs::read_dir("/sys/bus/pci/devices")? {
        let e = e?;
        if fs::read_to_string(e.path().join("class"))?.trim() == "0x010802" {
            v.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    v.sort();
    Ok(v)
}

/// The driver bound to a PCI device.
pub fn driver_of(addr: &str) -> Option<String> {
    fs::canonicalize(format!("/sys/bus/pci/devices/{addr}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// The kernel's name (`nvmeN`) of the controller at a PCI address, while nvme drives it.
pub fn nvme_name(addr: &str) -> Result<String> {
    let mut d = fs::read_dir(format!("/sys/bus/pci/devices/{addr}/nvme"))
        .with_context(|| format!("{addr} has no nvme controller"))?;
    let e = d.next().context("empty nvme dir")??;
    Ok(e.file_name().to_string_lossy().into_owned())
}

/// The block device of namespace 1 of the controller at `addr` once the kernel nvme driver has
/// probed it, waiting up to 20 s (see [`namespace_device`]).
pub fn namespace_block_device(addr: &str) -> Result<String> {
    namespace_device(addr, 1)
}

/// The block device of namespace `nsid` of the controller at `addr` once the kernel nvme driver
/// has probed it, waiting up to 20 s. Found through sysfs (the controller's block devices, as
/// [`ugds::sysfs::Host::block_devices`] sees them, and their `nsid`), not by assuming `nvmeXnN`:
/// the kernel numbers a namespace after its subsystem's namespace heads, so a head not yet
/// released makes the new disk `nvmeXn2`.
pub fn namespace_device(addr: &str, nsid: u32) -> Result<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let want = nsid.to_string();
    let host = ugds::sysfs::Host::system();
    loop {
        // The library's view of a controller's disks: its own, or the multipath heads it is a
        // path of.
        let found = host
            .block_devices(addr)
            .into_iter()
            .find(|n| fs::read_to_string(format!("/sys/class/block/{n}/nsid")).is_ok_and(|s| s.trim() == want));
        if let Some(n) = found {
            let dev = format!("/dev/{n}");
            if std::path::Path::new(&dev).exists() {
                return Ok(dev);
            }
        }
        if std::time::Instant::now() > deadline {
            bail!("{addr}: no block device for namespace {nsid} within 20 s of the nvme driver binding");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts this suite binary as `--child ARGS...` and waits for the child's `READY` line.
pub fn spawn_ready_child(args: &[&str]) -> Result<std::process::Child> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--child")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("child stdout")?).read_line(&mut line)?;
    if line.trim() != "READY" {
        let _ = child.kill();
        let _ = child.wait();
        bail!("child {args:?} did not get ready: {line:?}");
    }
    Ok(child)
}

/// Deterministic test data: a xorshift stream from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A 4 KiB-aligned heap buffer for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn layout(len: usize) -> std::alloc::Layout {
        // 4096 is a power of two and len is rounded up: the layout is always valid.
        std::alloc::Layout::from_size_align(len.max(4096).next_multiple_of(4096), 4096).expect("valid layout")
    }
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedBuf { ptr, len }
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.len)) }
    }
}

/// Writes `data` at `offset` of a block device with O_DIRECT (through the kernel nvme driver).
pub fn direct_write(dev: &str, offset: u64, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .with_context(|| format!("opening {dev}"))?;
    let mut buf = AlignedBuf::new(data.len());
    buf.as_mut_slice().copy_from_slice(data);
    f.write_all_at(buf.as_slice(), offset).with_context(|| format!("writing {dev}"))?;
    f.sync_all()?;
    Ok(())
}

/// Reads `len` bytes at `offset` of a block device with O_DIRECT.
pub fn direct_read(dev: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .with_context(|| format!("opening {dev}"))?;
    let mut buf = AlignedBuf::new(len);
    f.read_exact_at(buf.as_mut_slice(), offset).with_context(|| format!("reading {dev}"))?;
    Ok(buf.as_slice().to_vec())
}

/// Fails with `msg` unless `cond`.
#[macro_export]
macro_rules! ensure_that {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            anyhow::bail!($($msg)+);
        }
    };
}
