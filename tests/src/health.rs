//! Controller health through the module's restricted admin pass-through (`ADMIN_CMD`): which
//! opcodes pass (Identify, Get Log Page, Get Features) and that every other one is refused by
//! name before it reaches the controller; the argument rules; the CLI's health commands
//! against what QEMU's NVMe model reports; only the opener may use it.

use crate::kmod::bound_node;
use crate::raw::{errno_of, ioctl_raw, HostBuf, RawDev};
use crate::{ensure_that, pattern, Test};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use ugds_uapi::args::{admin_data_bound, LOG_PAGE_RAE};
use ugds_uapi::ioctl::*;
use ugds_uapi::log::{lid, NSID_ALL};

const V: &str = "kmod";

/// The health tests.
pub fn tests() -> Vec<Test> {
    vec![
        Test { name: "health_admin_all_256_opcodes_only_three_pass", variant: V, run: all_opcodes },
        Test { name: "health_admin_bad_arguments_refused", variant: V, run: bad_arguments },
        Test { name: "health_cli_json_matches_qemu", variant: V, run: cli_json },
        Test { name: "health_admin_non_opener_refused", variant: V, run: non_opener },
        // Controller 0 there has MDTS 2 (16 KiB transfers).
        Test { name: "health_admin_bound_follows_small_mdts", variant: "two-controllers", run: small_mdts },
    ]
}

/// An `ADMIN_CMD` argument for `opcode` with `data` as its buffer.
fn cmd(opcode: u8, nsid: u32, cdw10: u32, data: &mut [u8]) -> AdminCommand {
    AdminCommand {
        opcode,
        nsid,
        cdw: [cdw10, 0, 0, 0, 0, 0],
        data_len: data.len() as u32,
        data: data.as_mut_ptr() as u64,
        ..Default::default()
    }
}

/// The status page's counters and state, for "nothing changed".
fn snapshot(s: &StatusPage) -> (u64, u64, u64, u64, u64) {
    (s.state, s.resets, s.qpairs, s.registrations, s.pinned_pages)
}

/// Every opcode 0..=255 through the ioctl, raw and through the library: the three allowed ones
/// succeed with valid parameters; each of the other 253 is `EACCES` / `AdminOpcodeRefused` with
/// its opcode, leaves the argument and the buffer untouched, and reaches nothing: it carries
/// the queue id of a live queue pair (a Delete I/O SQ/CQ or Abort that ran would break it) and
/// namespace 1, whose data (a Format NVM, Sanitize or namespace detach would change it), the
/// status page and Identify stay as they were, and I/O works afterwards.
fn all_opcodes() -> Result<()> {
    const LEN: usize = 64 << 10;
    let node = bound_node(0)?;
    let raw = RawDev::open(&node)?;
    let ns = raw.info.namespaces[0];
    let mut qp = raw.create_qpair(16)?;
    let qid = qp.qid;
    let mut buf = HostBuf::new(LEN)?;
    buf.bytes_mut().copy_from_slice(&pattern(91, LEN));
    let h = raw.register(buf.addr(), LEN as u64)?;
    let segs = raw.segments(h)?;
    qp.rw_sync(true, &ns, 0, &segs, 0, LEN as u64)?;

    let dev = ugds::Device::open_with(&node, ugds::DeviceOptions { queues: 1, depth: 2, ..Default::default() })?;
    let id_before = dev.identify_controller()?;
    let before = snapshot(&raw.status()?);
    let mut passed = Vec::new();
    for op in 0..=255u8 {
        let mut data = vec![0xA5u8; 4096];
        let allowed = admin_allowed(op).is_some();
        if !allowed {
            // Raw: EACCES, the argument's output fields and the buffer untouched.
            let mut a = AdminCommand { result: 0x1111, status: 0x2222, ..cmd(op, ns.nsid, qid, &mut data) };
            a.cdw[1] = qid;
            let want = a;
            let r = ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a);
            match r {
                Err(e) if errno_of(&e) == libc::EACCES => {}
                other => bail!("opcode {op:#04x} through the raw ioctl: {other:?}, want EACCES"),
            }
            ensure_that!(a == want, "opcode {op:#04x}: the refused ioctl changed its argument: {a:?}");
            ensure_that!(data.iter().all(|&b| b == 0xA5), "opcode {op:#04x}: the refused ioctl wrote the buffer");
            // The library: the named error, with the opcode.
            match dev.admin_command(op, ns.nsid, [qid, qid, 0, 0, 0, 0], &mut data) {
                Err(ugds::Error::AdminOpcodeRefused { opcode }) if opcode == op => {}
                other => bail!("opcode {op:#04x} through the library: {other:?}, want AdminOpcodeRefused"),
            }
            continue;
        }
        // Valid parameters for the three allowed ones.
        let r = match op {
            0x06 => dev.admin_command(op, 0, [1, 0, 0, 0, 0, 0], &mut data).map(|_| ()),
            0x02 => {
                dev.admin_command(op, NSID_ALL, [u32::from(lid::SMART), 0, 0, 0, 0, 0], &mut data[..512]).map(|_| ())
            }
            // Number of Queues (FID 07h): no data, the value in dword 0.
            0x0A => dev.admin_command(op, 0, [0x07, 0, 0, 0, 0, 0], &mut []).map(|dw0| {
                passed.push(format!("queues {dw0:#x}"));
            }),
            _ => bail!("opcode {op:#04x} is allowed but untested"),
        };
        r.with_context(|| format!("allowed opcode {op:#04x}"))?;
        passed.push(format!("{op:#04x}"));
        match op {
            0x06 => ensure_that!(&data[4..12] == b"ugds0000", "Identify Controller's serial: {:?}", &data[4..24]),
            0x02 => {
                let k = u16::from_le_bytes([data[1], data[2]]);
                ensure_that!((273..=373).contains(&k), "SMART composite temperature {k} K");
                ensure_that!(data[512..].iter().all(|&b| b == 0xA5), "a 512-byte log read wrote past 512 bytes");
            }
            _ => {}
        }
    }
    ensure_that!(passed.len() == 4, "allowed opcodes that ran: {passed:?}");
    let after = snapshot(&raw.status()?);
    ensure_that!(before == after, "the status page changed: {before:?} -> {after:?}");
    let id_after = dev.identify_controller()?;
    ensure_that!(id_before == id_after, "Identify Controller changed across the refused opcodes");
    // The queue pair named by every refused command still works, and the data is intact.
    buf.bytes_mut().fill(0);
    qp.rw_sync(false, &ns, 0, &segs, 0, LEN as u64)?;
    ensure_that!(buf.bytes() == &pattern(91, LEN)[..], "namespace 1's data changed");
    raw.delete_qpair(qid)?;
    raw.deregister(h.id, h.generation)?;
    Ok(())
}

/// Lengths, reserved fields and buffers the module refuses, each with its errno, the buffer
/// untouched; the edges that pass.
fn bad_arguments() -> Result<()> {
    let node = bound_node(0)?;
    let raw = RawDev::open(&node)?;
    let bound = admin_data_bound(raw.info.mdts_bytes) as usize;
    let mut big = vec![0x5Au8; bound + 8];
    let smart = u32::from(lid::SMART);
    let cases: Vec<(&str, AdminCommand, i32)> = vec![
        ("identify of 0 bytes", cmd(0x06, 0, 1, &mut big[..0]), libc::EINVAL),
        ("identify of 512 bytes", cmd(0x06, 0, 1, &mut big[..512]), libc::EINVAL),
        ("identify of 8192 bytes", cmd(0x06, 0, 1, &mut big[..8192]), libc::EINVAL),
        ("log page of 0 bytes", cmd(0x02, NSID_ALL, smart, &mut big[..0]), libc::EINVAL),
        ("log page of 6 bytes", cmd(0x02, NSID_ALL, smart, &mut big[..6]), libc::EINVAL),
        ("log page of 513 bytes", cmd(0x02, NSID_ALL, smart, &mut big[..513]), libc::EINVAL),
        ("log page past the bound", cmd(0x02, NSID_ALL, smart, &mut big[..bound + 4]), libc::EINVAL),
        ("get features of 4100 bytes", cmd(0x0A, 0, 7, &mut big[..4100]), libc::EINVAL),
        ("flags (fused)", AdminCommand { flags: 1, ..cmd(0x06, 0, 1, &mut big[..4096]) }, libc::EINVAL),
        ("PSDT bits", AdminCommand { flags: 0x40, ..cmd(0x06, 0, 1, &mut big[..4096]) }, libc::EINVAL),
        ("reserved0", AdminCommand { reserved0: 1, ..cmd(0x06, 0, 1, &mut big[..4096]) }, libc::EINVAL),
        ("reserved1", AdminCommand { reserved1: 1, ..cmd(0x06, 0, 1, &mut big[..4096]) }, libc::EINVAL),
        (
            "buffer wrapping",
            AdminCommand { data: u64::MAX - 100, ..cmd(0x06, 0, 1, &mut big[..4096]) },
            libc::EOVERFLOW,
        ),
        (
            "buffer past user space",
            AdminCommand { data: 0x7FFF_FFFF_F000 - 4095, ..cmd(0x06, 0, 1, &mut big[..4096]) },
            libc::EFAULT,
        ),
        // Passes the checks, runs, and the copy-out finds no memory there.
        ("unmapped buffer", AdminCommand { data: 0x1000, ..cmd(0x06, 0, 1, &mut big[..4096]) }, libc::EFAULT),
    ];
    let before = snapshot(&raw.status()?);
    for (what, mut a, want) in cases {
        match ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a) {
            Err(e) if errno_of(&e) == want => {}
            other => bail!("{what}: {other:?}, want errno {want}"),
        }
        ensure_that!(big.iter().all(|&b| b == 0x5A), "{what}: the buffer was written");
    }
    ensure_that!(snapshot(&raw.status()?) == before, "a refused argument changed the status page");
    // The edges that pass: the largest log read (NUMD and RAE set by the module whatever the
    // caller put there), and Get Features with a page of data.
    let mut a = cmd(0x02, NSID_ALL, smart | 0xFFFF_0000 | LOG_PAGE_RAE, &mut big[..bound]);
    a.cdw[1] = 0xFFFF;
    ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a).context("a log read of the bound")?;
    ensure_that!(a.status == 0, "the log read of {bound} bytes completed with status {:#x}", a.status);
    let k = u16::from_le_bytes([big[1], big[2]]);
    ensure_that!((273..=373).contains(&k), "SMART composite temperature {k} K in the big read");
    ensure_that!(big[bound..].iter().all(|&b| b == 0x5A), "the module wrote past data_len");
    // An error status comes back as a status, not an errno: log page 0xEE does not exist.
    let mut small = [0u8; 512];
    let mut a = cmd(0x02, NSID_ALL, 0xEE, &mut small);
    ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a).context("an unknown log page")?;
    ensure_that!(a.status != 0, "log page 0xEE completed with success");
    ensure_that!(small.iter().all(|&b| b == 0), "a failed command copied data");
    let dev = ugds::Device::open_with(&node, ugds::DeviceOptions { queues: 1, depth: 2, ..Default::default() })?;
    match dev.log_page(0xEE, NSID_ALL, &mut small) {
        Err(ugds::Error::AdminFailed { opcode: 0x02, .. }) => {}
        other => bail!("the library's read of log page 0xEE: {other:?}"),
    }
    match dev.log_page(lid::SMART, NSID_ALL, &mut small[..6]) {
        Err(ugds::Error::InvalidArgument { .. }) => {}
        other => bail!("the library's 6-byte log read: {other:?}"),
    }
    // Get Features with data: Timestamp (FID 0Eh) transfers 8 bytes.
    let mut ts = [0u8; 8];
    dev.get_features(0x0E, 0, 0, &mut ts).context("Get Features Timestamp")?;
    // The controller is still fine, never reset (the library's open added its queue pair).
    ensure_that!(dev.smart_log()?.composite_temperature() > 0, "no temperature after the refusals");
    let s = raw.status()?;
    ensure_that!((s.state, s.resets) == (before.0, before.1), "the controller's state changed: {s:?}");
    Ok(())
}

/// Runs the CLI with `args` and parses its standard output as JSON.
fn cli(args: &[&str]) -> Result<Value> {
    let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
    let out = std::process::Command::new(&bin).args(args).output().with_context(|| format!("running {bin}"))?;
    ensure_that!(
        out.status.success(),
        "ugds {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("ugds {args:?}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn num(v: &Value, k: &str) -> Result<u64> {
    v.get(k).and_then(Value::as_u64).with_context(|| format!("no number {k} in {v}"))
}

fn text<'a>(v: &'a Value, k: &str) -> Result<&'a str> {
    v.get(k).and_then(Value::as_str).with_context(|| format!("no string {k} in {v}"))
}

/// `ugds id-ctrl/id-ns/smart-log/error-log/fw-log --json` against what QEMU's model reports:
/// the serial from the VM spec (`ugds0000`, `ugds0001`), namespace sizes and block sizes from
/// the spec (256 MiB of 4096-byte blocks; 128 MiB of 512-byte blocks, two namespaces), a sane
/// temperature, an error log of ELPE + 1 entries, an active firmware slot. The readable forms
/// run too.
fn cli_json() -> Result<()> {
    for (idx, serial, mib, lbs, nss) in [(0usize, "ugds0000", 256u64, 4096u64, 1u32), (1, "ugds0001", 128, 512, 2)] {
        let node = bound_node(idx)?;
        let c = cli(&["id-ctrl", &node, "--json"])?;
        ensure_that!(text(&c, "sn")? == serial, "id-ctrl sn {:?}, want {serial}", c["sn"]);
        ensure_that!(text(&c, "mn")?.contains("QEMU"), "id-ctrl mn {:?}", c["mn"]);
        ensure_that!(num(&c, "vid")? == 0x1b36, "id-ctrl vid {:?}", c["vid"]);
        ensure_that!(text(&c, "subnqn")?.ends_with(serial), "id-ctrl subnqn {:?}", c["subnqn"]);
        ensure_that!(num(&c, "nn")? >= u64::from(nss), "id-ctrl nn {:?}", c["nn"]);
        let dev = ugds::Device::open_with(&node, ugds::DeviceOptions { queues: 1, depth: 2, ..Default::default() })?;
        ensure_that!(text(&c, "fr")? == dev.firmware(), "id-ctrl fr {:?} vs the probe's {:?}", c["fr"], dev.firmware());
        for nsid in 1..=nss {
            let n = cli(&["id-ns", &node, "-n", &nsid.to_string(), "--json"])?;
            let (nsze, lba) = (num(&n, "nsze")?, num(&n, "lba_size")?);
            ensure_that!(lba == lbs, "{node} ns {nsid}: lba_size {lba}, want {lbs}");
            ensure_that!(nsze * lba == mib << 20, "{node} ns {nsid}: {nsze} blocks of {lba}, want {mib} MiB");
            let info = dev.info().namespaces.iter().find(|i| i.nsid == nsid).context("namespace in GET_INFO")?;
            ensure_that!(info.size_lbas == nsze, "GET_INFO says {} blocks, id-ns {nsze}", info.size_lbas);
            let lbafs = n.get("lbafs").and_then(Value::as_array).context("lbafs")?;
            let in_use: Vec<_> = lbafs.iter().filter(|f| f["in_use"] == Value::Bool(true)).collect();
            ensure_that!(
                in_use.len() == 1 && in_use[0]["ds"].as_u64() == Some(lbs.trailing_zeros() as u64),
                "{lbafs:?}"
            );
        }
        let s = cli(&["smart-log", &node, "--json"])?;
        let k = num(&s, "temperature")?;
        ensure_that!((273..=373).contains(&k), "smart-log temperature {k} K");
        ensure_that!(num(&s, "critical_warning")? == 0, "critical warning {:?}", s["critical_warning"]);
        ensure_that!(num(&s, "avail_spare")? <= 100 && num(&s, "percent_used")? <= 255, "{s}");
        ensure_that!(num(&s, "power_cycles").is_ok() && num(&s, "host_read_commands").is_ok(), "{s}");
        let e = cli(&["error-log", &node, "--json"])?;
        let errors = e.get("errors").and_then(Value::as_array).context("errors")?;
        ensure_that!(errors.len() as u64 == num(&c, "elpe")? + 1, "{} entries, ELPE {:?}", errors.len(), c["elpe"]);
        let f = cli(&["fw-log", &node, "--json"])?;
        let slot = num(&f, "active_slot")?;
        ensure_that!((1..=7).contains(&slot), "fw-log active slot {slot}");
        ensure_that!(!text(&f, &format!("frs{slot}"))?.is_empty(), "no revision in the active slot: {f}");
        // The readable forms.
        let bin = std::env::var("UGDS_CLI").context("UGDS_CLI not set")?;
        for sub in ["id-ctrl", "id-ns", "smart-log", "error-log", "fw-log"] {
            let out = std::process::Command::new(&bin).args([sub, &node]).output()?;
            let o = String::from_utf8_lossy(&out.stdout);
            ensure_that!(out.status.success() && o.contains(": "), "ugds {sub} {node}: {o}");
        }
        ensure_that!(crate::sh(&format!("{bin} smart-log {node}"))?.contains("temperature"), "no temperature line");
    }
    Ok(())
}

/// A child made by fork, holding the parent's open file: `ADMIN_CMD` is `EPERM` and writes
/// nothing; the library refuses by name; the parent's file keeps working.
fn non_opener() -> Result<()> {
    let node = bound_node(0)?;
    let raw = RawDev::open(&node)?;
    let dev = ugds::Device::open_with(&node, ugds::DeviceOptions { queues: 1, depth: 2, ..Default::default() })?;
    // SAFETY: the suite is single-threaded here; the child runs plain system calls and
    // allocation and leaves with `_exit`, dropping nothing of the parent's.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let mut data = vec![0x77u8; 4096];
        let mut a = cmd(0x06, 0, 1, &mut data);
        let code = match ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a) {
            Err(e) if errno_of(&e) == libc::EPERM => {
                if !data.iter().all(|&b| b == 0x77) {
                    2
                } else {
                    match dev.identify_controller() {
                        Err(ugds::Error::ForkedChild { .. }) => 0,
                        _ => 3,
                    }
                }
            }
            _ => 1,
        };
        // SAFETY: leaves the child at once, without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    ensure_that!(libc::WIFEXITED(status), "the child died ({status:#x})");
    let code = libc::WEXITSTATUS(status);
    ensure_that!(
        code == 0,
        "the child's check {code} failed (1: not EPERM, 2: buffer written, 3: library not ForkedChild)"
    );
    let mut data = vec![0u8; 4096];
    let mut a = cmd(0x06, 0, 1, &mut data);
    ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a).context("the parent's identify after the child")?;
    ensure_that!(&data[4..12] == b"ugds0000", "the parent's identify");
    ensure_that!(ugds::health::ascii(&dev.identify_controller()?.sn) == "ugds0000", "the library's identify");
    Ok(())
}

/// On a controller whose MDTS is 16 KiB, one admin transfer is at most 16 KiB (not 64): a log
/// read of 16 KiB passes, one dword more is `EINVAL`; the library's error log and id-ctrl work.
fn small_mdts() -> Result<()> {
    let node = bound_node(0)?;
    let raw = RawDev::open(&node)?;
    ensure_that!(raw.info.mdts_bytes == 16 << 10, "MDTS {} bytes, the variant asks for 16 KiB", raw.info.mdts_bytes);
    let bound = admin_data_bound(raw.info.mdts_bytes) as usize;
    ensure_that!(bound == 16 << 10, "bound {bound}");
    let mut big = vec![0x3Cu8; bound + 4];
    let smart = u32::from(lid::SMART);
    let mut a = cmd(0x02, NSID_ALL, smart, &mut big);
    match ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a) {
        Err(e) if errno_of(&e) == libc::EINVAL => {}
        other => bail!("a log read of MDTS + 4 bytes: {other:?}, want EINVAL"),
    }
    ensure_that!(big.iter().all(|&b| b == 0x3C), "the refused read wrote the buffer");
    let mut a = cmd(0x02, NSID_ALL, smart, &mut big[..bound]);
    ioctl_raw(raw.fd(), IOCTL_ADMIN_CMD, &mut a).context("a log read of MDTS bytes")?;
    ensure_that!(a.status == 0, "status {:#x}", a.status);
    let k = u16::from_le_bytes([big[1], big[2]]);
    ensure_that!((273..=373).contains(&k), "SMART composite temperature {k} K");
    let dev = ugds::Device::open_with(&node, ugds::DeviceOptions { queues: 1, depth: 2, ..Default::default() })?;
    ensure_that!(dev.admin_data_bound() == bound, "the library's bound {}", dev.admin_data_bound());
    ensure_that!(dev.identify_controller()?.mdts == 2, "Identify MDTS");
    ensure_that!(!dev.error_log()?.is_empty(), "an empty error log");
    let c = cli(&["id-ctrl", &node, "--json"])?;
    ensure_that!(num(&c, "mdts")? == 2, "id-ctrl mdts {:?}", c["mdts"]);
    Ok(())
}
