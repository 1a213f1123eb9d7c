//! Foundation tests: the VM's emulated controllers, binding to ugds and back, refusals.

use crate::{
    direct_read, direct_write, driver_of, ensure_that, load_module, nvme_controllers, nvme_name, pattern, sh, xtask,
    Test,
};
use anyhow::{Context, Result};
use std::fs;

/// The foundation tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "vm_sees_two_controllers_with_asked_geometry", variant: "two-controllers", run: geometry },
        Test { name: "bind_logs_cap_vs_and_unbind_keeps_data", variant: "two-controllers", run: bind_roundtrip },
        Test { name: "bind_refuses_mounted_namespace", variant: "two-controllers", run: refuses_mounted },
        Test { name: "bind_refuses_open_namespace", variant: "two-controllers", run: refuses_open },
        Test { name: "module_unload_releases_bound_controller", variant: "two-controllers", run: unload_while_bound },
        // The same binding and refusals where the kernel shows namespaces through multipath
        // heads (Debian's kernel, namespaces that say they may be shared).
        Test { name: "multipath_heads_name_their_controller", variant: MP, run: multipath_layout },
        Test { name: "multipath_bind_through_a_head_keeps_data", variant: MP, run: bind_roundtrip },
        Test { name: "multipath_bind_refuses_mounted_head", variant: MP, run: refuses_mounted },
        Test { name: "multipath_bind_refuses_open_head", variant: MP, run: refuses_open },
    ]
}

/// The variant whose namespaces say they may be shared: `two-controllers`' geometry, so the
/// same tests run on both.
const MP: &str = "multipath";

/// Where the kernel has NVMe multipath on, each namespace is a head under its subsystem with a
/// path per controller, and the head still names its controller (bind and the refusals rely on
/// it). A kernel without multipath shows the plain layout, which must resolve too.
fn multipath_layout() -> Result<()> {
    let host = ugds::sysfs::Host::system();
    let on = fs::read_to_string("/sys/module/nvme_core/parameters/multipath").is_ok_and(|s| s.trim() == "Y");
    // Debian's kernel (the stock guest: UGDS_MODULE_ROOT set) has it; the test kernel has not.
    let stock = std::env::var_os("UGDS_MODULE_ROOT").is_some();
    ensure_that!(on == stock, "NVMe multipath is {} on this kernel", if on { "on" } else { "off" });
    for addr in nvme_controllers()? {
        let dev = crate::namespace_block_device(&addr)?;
        let name = dev.trim_start_matches("/dev/");
        let real = fs::canonicalize(format!("/sys/class/block/{name}"))?;
        let head = real.components().any(|c| c.as_os_str().to_string_lossy().starts_with("nvme-subsys"));
        ensure_that!(head == on, "{dev} lies at {} (multipath {on})", real.display());
        ensure_that!(host.resolve(&dev)? == addr, "{dev} does not resolve to {addr}");
        ensure_that!(host.block_devices(&addr).iter().any(|b| b == name), "{dev} is not among {addr}'s block devices");
    }
    Ok(())
}

fn block_attr(dev: &str, attr: &str) -> Result<u64> {
    let s = fs::read_to_string(format!("/sys/class/block/{dev}/{attr}")).with_context(|| format!("{dev}/{attr}"))?;
    Ok(s.trim().parse()?)
}

/// `--nvme size=256M,lbs=4096,mdts=2 --nvme size=128M,ns=2`: both controllers, the block sizes,
/// sizes, namespace counts and MDTS the specs asked for.
fn geometry() -> Result<()> {
    let ctrls = nvme_controllers()?;
    ensure_that!(ctrls.len() == 2, "expected 2 NVMe controllers, found {ctrls:?}");
    let c0 = nvme_name(&ctrls[0])?;
    let c1 = nvme_name(&ctrls[1])?;
    let n0 = format!("{c0}n1");
    ensure_that!(block_attr(&n0, "queue/logical_block_size")? == 4096, "{n0} block size");
    ensure_that!(block_attr(&n0, "size")? * 512 == 256 << 20, "{n0} size");
    // mdts=2: 4 pages of 4 KiB per command.
    ensure_that!(block_attr(&n0, "queue/max_hw_sectors_kb")? == 16, "{n0} max_hw_sectors_kb");
    let ns1: Vec<String> = fs::read_dir(format!("/sys/class/nvme/{c1}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&c1) && n.contains('n'))
        .collect();
    ensure_that!(ns1.len() == 2, "{c1} should have 2 namespaces, has {ns1:?}");
    for n in &ns1 {
        ensure_that!(block_attr(n, "queue/logical_block_size")? == 512, "{n} block size");
        ensure_that!(block_attr(n, "size")? * 512 == 128 << 20, "{n} size");
    }
    Ok(())
}

/// Writes a pattern through the kernel driver, binds the controller to ugds (the probe logs
/// CAP and VS), unbinds it, and reads the same pattern back through the kernel driver.
fn bind_roundtrip() -> Result<()> {
    load_module()?;
    let addr = nvme_controllers()?[0].clone();
    let dev = format!("/dev/{}n1", nvme_name(&addr)?);
    let data = pattern(0x5eed, 256 * 1024);
    direct_write(&dev, 1 << 20, &data)?;
    let (ok, out) = xtask(&["bind", &dev])?;
    ensure_that!(ok, "xtask bind failed: {out}");
    ensure_that!(driver_of(&addr).as_deref() == Some("ugds"), "{addr} is not bound to ugds after bind");
    ensure_that!(!std::path::Path::new(&dev).exists(), "{dev} still exists while bound to ugds");
    let log = sh("dmesg")?;
    let probe = log
        .lines()
        .rev()
        .find(|l| l.contains(&format!("ugds: {addr}: NVMe")))
        .with_context(|| format!("no probe line for {addr} in the kernel log"))?;
    ensure_that!(probe.contains("CAP 0x") && probe.contains(" VS 1."), "probe line lacks CAP/VS: {probe}");
    let (ok, out) = xtask(&["unbind", &addr])?;
    ensure_that!(ok, "xtask unbind failed: {out}");
    ensure_that!(driver_of(&addr).as_deref() == Some("nvme"), "{addr} did not return to nvme");
    let dev = format!("/dev/{}n1", nvme_name(&addr)?);
    let back = direct_read(&dev, 1 << 20, data.len())?;
    ensure_that!(back == data, "data read back through nvme after unbind differs");
    Ok(())
}

/// A controller whose namespace is mounted stays with nvme, and the refusal says why.
fn refuses_mounted() -> Result<()> {
    load_module()?;
    let addr = nvme_controllers()?[1].clone();
    let ns = format!("/dev/{}n1", nvme_name(&addr)?);
    sh(&format!("mkfs.ext2 -q -F {ns} && mkdir -p /tmp/mnt && mount -t ext2 {ns} /tmp/mnt"))?;
    let result = xtask(&["bind", &ns]);
    let _ = sh("umount /tmp/mnt");
    let (ok, out) = result?;
    ensure_that!(!ok, "bind of a mounted controller succeeded: {out}");
    ensure_that!(out.contains("is mounted on /tmp/mnt"), "refusal does not say why: {out}");
    ensure_that!(driver_of(&addr).as_deref() == Some("nvme"), "{addr} left nvme after a refused bind");
    Ok(())
}

/// A controller with a namespace open by a process stays with nvme, and the refusal names the
/// process.
fn refuses_open() -> Result<()> {
    load_module()?;
    let addr = nvme_controllers()?[1].clone();
    let ns = format!("/dev/{}n2", nvme_name(&addr)?);
    let held = fs::File::open(&ns)?;
    let (ok, out) = xtask(&["bind", &format!("/dev/{}", nvme_name(&addr)?)])?;
    drop(held);
    ensure_that!(!ok, "bind of an open controller succeeded: {out}");
    ensure_that!(
        out.contains(&format!("is open by pid {}", std::process::id())),
        "refusal does not name the holder: {out}"
    );
    ensure_that!(driver_of(&addr).as_deref() == Some("nvme"), "{addr} left nvme after a refused bind");
    Ok(())
}

/// Unloading the module while it drives a controller releases it (remove runs), and the
/// controller can be given back to nvme afterwards; the module loads again.
fn unload_while_bound() -> Result<()> {
    load_module()?;
    let addr = nvme_controllers()?[0].clone();
    let (ok, out) = xtask(&["bind", &addr])?;
    ensure_that!(ok, "bind failed: {out}");
    sh("rmmod ugds")?;
    ensure_that!(driver_of(&addr).is_none(), "{addr} still has a driver after rmmod");
    let log = sh("dmesg")?;
    ensure_that!(log.contains(&format!("ugds: {addr}: released")), "remove did not run for {addr}");
    let (ok, out) = xtask(&["unbind", &addr])?;
    ensure_that!(ok, "unbind failed: {out}");
    ensure_that!(driver_of(&addr).as_deref() == Some("nvme"), "{addr} did not return to nvme");
    load_module()?;
    Ok(())
}
