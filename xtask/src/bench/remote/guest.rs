//! The remote benchmark's steps inside the VM: the kernel's modules, the nvmet target (and for
//! RDMA a soft-RoCE device on a dummy interface), then every point measured by the kernel's
//! initiator with fio and by ours (`ugds bench` on the target's URI), in turns, one JSON line
//! per measurement.

use super::{Grid, CONFIGFS, NQN, PORT, RDMA_ADDR};
use crate::bench::volume::disk_of;
use crate::bench::{fio_point_with, repeats, sh, Job, Latency, MARK};
use crate::bind;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Loads module `name` (as `modinfo` names it, `-` or `_`) of the test kernel build at `build`,
/// after what it depends on; a module built in or already loaded is left alone.
fn load_module(build: &Path, name: &str) -> Result<()> {
    let norm = |s: &str| s.replace('-', "_");
    if Path::new(&format!("/sys/module/{}", norm(name))).exists() {
        return Ok(());
    }
    let base = |l: &str| norm(l.trim().rsplit('/').next().unwrap_or("").trim_end_matches(".o").trim_end_matches(".ko"));
    let order = std::fs::read_to_string(build.join("modules.order")).context("modules.order of the test kernel")?;
    let Some(rel) = order.lines().find(|l| base(l) == norm(name)) else {
        let builtin = std::fs::read_to_string(build.join("modules.builtin")).unwrap_or_default();
        if builtin.lines().any(|l| base(l) == norm(name)) {
            return Ok(());
        }
        bail!("the test kernel has no module {name} (see ci/kernel.fragment)");
    };
    let ko = build.join(rel.trim().trim_end_matches(".o").to_string() + ".ko");
    let ko = ko.display().to_string();
    let deps = sh(&format!("modinfo -F depends {ko}"))?;
    for d in deps.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        load_module(build, d)?;
    }
    sh(&format!("insmod {ko}")).map(|_| ())
}

/// nvmet exporting `backing` as namespace 1 of [`NQN`] to any host on the grid's transport;
/// for RDMA first a soft-RoCE device on a dummy interface carrying [`RDMA_ADDR`].
fn setup_target(build: &Path, grid: &Grid, backing: &str) -> Result<()> {
    load_module(build, "nvmet")?;
    load_module(build, &format!("nvmet-{}", grid.transport))?;
    sh("ip link set lo up")?;
    if grid.transport == "rdma" {
        // rxe's ICRC asks the crypto API for "crc32", which would load this module on demand
        // through modprobe (not in this guest): without it adding the device fails.
        load_module(build, "crc32_generic")?;
        load_module(build, "rdma_rxe")?;
        // A built-in dummy driver creates dummy0 at boot (numdummies=1).
        if !Path::new("/sys/class/net/dummy0").exists() {
            sh("ip link add dummy0 type dummy")?;
        }
        sh(&format!(
            "ip addr add {RDMA_ADDR}/24 dev dummy0 && ip link set dummy0 up && \
             rdma link add rxe0 type rxe netdev dummy0 2>&1"
        ))
        .context("soft-RoCE on dummy0 (needs CONFIG_DUMMY, CONFIG_RDMA_RXE and iproute2's rdma)")?;
    }
    if !Path::new(CONFIGFS).exists() {
        sh("mount -t configfs none /sys/kernel/config")?;
    }
    let sub = format!("{CONFIGFS}/subsystems/{NQN}");
    sh(&format!(
        "mkdir -p {sub} && echo 1 > {sub}/attr_allow_any_host && mkdir -p {sub}/namespaces/1 && \
         echo {backing} > {sub}/namespaces/1/device_path && echo 1 > {sub}/namespaces/1/enable"
    ))?;
    let port = format!("{CONFIGFS}/ports/1");
    sh(&format!(
        "mkdir -p {port} && echo {} > {port}/addr_trtype && echo ipv4 > {port}/addr_adrfam && \
         echo {} > {port}/addr_traddr && echo {PORT} > {port}/addr_trsvcid && ln -s {sub} {port}/subsystems/{NQN}",
        grid.transport,
        grid.address()
    ))
    .with_context(|| format!("the nvmet port on {}", grid.transport))?;
    Ok(())
}

/// Connects the kernel's initiator (nvme-tcp or nvme-rdma) to the target; returns its
/// controller's name and its namespace 1's block device.
fn kernel_connect(build: &Path, grid: &Grid) -> Result<(String, String)> {
    load_module(build, &format!("nvme-{}", grid.transport))?;
    use std::io::{Read, Write};
    let mut fab = std::fs::OpenOptions::new().read(true).write(true).open("/dev/nvme-fabrics")?;
    fab.write_all(
        format!("transport={},traddr={},trsvcid={PORT},nqn={NQN}", grid.transport, grid.address()).as_bytes(),
    )
    .with_context(|| format!("connecting the kernel's nvme-{} initiator", grid.transport))?;
    let mut reply = String::new();
    fab.read_to_string(&mut reply)?;
    // "instance=N,cntlid=M"
    let n = reply
        .split(',')
        .find_map(|kv| kv.trim().strip_prefix("instance="))
        .with_context(|| format!("/dev/nvme-fabrics replied {reply:?}"))?;
    let ctrl = format!("nvme{n}");
    let t = Instant::now();
    loop {
        let ns1 = std::fs::read_dir(format!("/sys/class/nvme/{ctrl}"))?
            .filter_map(|e| e.ok())
            .find(|e| std::fs::read_to_string(e.path().join("nsid")).is_ok_and(|s| s.trim() == "1"));
        if let Some(e) = ns1 {
            let dev = format!("/dev/{}", e.file_name().to_string_lossy());
            if Path::new(&dev).exists() {
                return Ok((ctrl, dev));
            }
        }
        if t.elapsed() > Duration::from_secs(20) {
            bail!("{ctrl} has no namespace 1 after 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sockets process `pid` holds open, counted from /proc/PID/fd: over TCP, the CLI's
/// connections (the admin queue and its I/O queues). Sampled while the process runs, so it
/// must be cheap: reading /proc/net/tcp walks every bucket of the kernel's connection table,
/// which under TCG cost about 2.5 % of the guest's CPU at four reads a second, during ugds's
/// turns only.
fn sockets_of(pid: u32) -> usize {
    sockets_in(Path::new(&format!("/proc/{pid}/fd")))
}

/// The links in `dir` (a /proc/PID/fd) that name a socket.
fn sockets_in(dir: &Path) -> usize {
    let Ok(fds) = std::fs::read_dir(dir) else { return 0 };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// This machine's TCP counters that say a connection stalled (every connection here is to or
/// from the target), as (the point's key, file, section, counter).
const STALLS: [(&str, &str, &str, &str); 4] = [
    ("tcp_retransmits", "/proc/net/snmp", "Tcp:", "RetransSegs"),
    ("tcp_timeouts", "/proc/net/netstat", "TcpExt:", "TCPTimeouts"),
    // A receiver too slow for its buffer advertises a zero window; the sender then waits for a
    // window update or its persist timer (window probes).
    ("tcp_zero_windows", "/proc/net/netstat", "TcpExt:", "TCPToZeroWindowAdv"),
    ("tcp_window_probes", "/proc/net/netstat", "TcpExt:", "TCPWinProbe"),
];

/// The [`STALLS`] counters now.
fn tcp_stalls() -> [u64; STALLS.len()] {
    STALLS.map(|(_, file, section, name)| {
        counter(&std::fs::read_to_string(file).unwrap_or_default(), section, name).unwrap_or(0)
    })
}

/// Counter `name` of `section` in /proc/net/snmp's or /proc/net/netstat's form (a line of
/// names, then a line of values, both starting with the section).
fn counter(text: &str, section: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.split_whitespace().next() == Some(section));
    let (names, values) = (lines.next()?, lines.next()?);
    names.split_whitespace().zip(values.split_whitespace()).find(|(n, _)| *n == name)?.1.parse().ok()
}

/// One `ugds bench` point of `cli` (as `engine`) on the target's URI; on TCP with the most I/O
/// queues (its sockets less the admin queue's) it held during the point, counted where `cli`
/// is the CLI itself or a script that `exec`s it. A failure is the point's `error`, by the
/// CLI's own message.
fn ugds_point(cli: &str, engine: &str, grid: &Grid, rw: &str, size: &str, depth: usize) -> Value {
    let mut v = json!({"engine": engine, "rw": rw, "size": size, "depth": depth});
    // Pinned through taskset, which execs the CLI: the process sampled below is the CLI's.
    let mut child = Command::new(if grid.cpus.is_some() { "taskset" } else { cli });
    if let Some(c) = &grid.cpus {
        child.args(["-c", c, cli]);
    }
    // fio's options under fio's names: `rw` passes through, `size` is the region.
    let child = child
        .args(["--json", "bench", &grid.uri(), "--rw", rw, "--bs", size, "--iodepth", &depth.to_string()])
        .args(["--runtime", &grid.seconds.to_string(), "--size", &ugds::units::human(grid.span)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            v["error"] = json!(format!("starting {cli}: {e}"));
            return v;
        }
    };
    let mut most = 0;
    while let Ok(None) = child.try_wait() {
        if grid.transport == "tcp" {
            most = most.max(sockets_of(child.id()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => {
            v["error"] = json!(format!("waiting for {cli}: {e}"));
            return v;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Value>(stdout.trim()) {
        Ok(mut r) if out.status.success() => {
            for k in ["engine", "rw", "size", "depth"] {
                r[k] = v[k].clone();
            }
            if grid.transport == "tcp" {
                r["io_queues"] = json!(most.saturating_sub(1));
            }
            r
        }
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            // The CLI's own message, without its "ugds: error: " prefix.
            let last = last.trim().trim_start_matches("ugds: error: ");
            let code = out.status.code().map_or_else(|| "a signal".into(), |c| c.to_string());
            v["error"] = json!(format!("ugds bench exited with {code}: {last}"));
            v
        }
    }
}

/// Guest side: the target and the kernel's initiator, then every point measured `repeats`
/// times per engine, the engines alternating, one JSON line per measurement (a failed one
/// carries its `error`). `baseline`: another build's CLI, run in ugds's turns too (ours first
/// in even repeats, the baseline's in odd ones).
pub fn guest(cli: &str, grid: &str, baseline: Option<&str>) -> Result<()> {
    let grid = Grid::from_json(&serde_json::from_str(grid)?)?;
    let build = PathBuf::from(std::env::var("UGDS_KERNEL_BUILD").context("UGDS_KERNEL_BUILD")?);
    let addr = bind::nvme_controllers()?.into_iter().next().context("no emulated NVMe controller")?;
    let backing = disk_of(&addr)?;
    let span = ugds::units::human(grid.span);
    if grid.backend == "file" {
        // Write the working set once, so reads of the file-backed disk read data.
        sh(&format!(
            "fio --name=fill --filename={backing} --ioengine=io_uring --direct=1 --rw=write --bs=1M --size={span} --output=/dev/null"
        ))?;
    }
    setup_target(&build, &grid, &backing)?;
    let (ctrl, dev) = kernel_connect(&build, &grid)?;
    eprintln!("bench: the kernel's nvme-{} initiator is {ctrl} ({dev})", grid.transport);
    let mut point = 0usize;
    for rw in &grid.rws {
        for size in &grid.sizes {
            for &depth in &grid.depths {
                // Alternate which engine starts, so neither always runs on a target just warmed
                // (or just disturbed) by the other.
                for (repeat, ugds_side) in repeats::order(grid.repeats, point % 2 == 1) {
                    // The turn's runs: the kernel's (no CLI), or ours and the baseline's by turns.
                    let mut runs: Vec<(Option<&str>, &str)> =
                        if ugds_side { vec![(Some(cli), "ugds")] } else { vec![(None, "kernel")] };
                    if let Some(b) = baseline.filter(|_| ugds_side) {
                        runs.insert(usize::from(repeat % 2 == 0), (Some(b), "ugds-baseline"));
                    }
                    for (who, engine) in runs {
                        let before = tcp_stalls();
                        let mut v = match who {
                            Some(cli) => ugds_point(cli, engine, &grid, rw, size, depth),
                            None => {
                                let job = Job { rw, size, depth, seconds: grid.seconds, span: &span };
                                fio_point_with(&dev, job, Latency::Total, grid.cpus.as_deref()).unwrap_or_else(|e| {
                                    json!({"engine": "kernel", "rw": rw, "size": size, "depth": depth, "error": format!("{e:#}")})
                                })
                            }
                        };
                        if grid.transport == "tcp" {
                            let after = tcp_stalls();
                            for (i, (key, ..)) in STALLS.iter().enumerate() {
                                v[*key] = json!(after[i].saturating_sub(before[i]));
                            }
                        }
                        v["repeat"] = json!(repeat);
                        println!("{MARK}{v}");
                    }
                }
                point += 1;
            }
        }
    }
    sh(&format!("echo 1 > /sys/class/nvme/{ctrl}/delete_controller"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_section_and_name() {
        let t = "Ip: Forwarding TTL\nIp: 1 64\nTcp: RtoMin RetransSegs InErrs\nTcp: 200 12 0\n";
        assert_eq!(counter(t, "Tcp:", "RetransSegs"), Some(12));
        assert_eq!(counter(t, "Ip:", "TTL"), Some(64));
        assert_eq!(counter(t, "Tcp:", "Nothing"), None);
        assert_eq!(counter(t, "Udp:", "RetransSegs"), None);
        assert!(counter(&std::fs::read_to_string("/proc/net/snmp").unwrap(), "Tcp:", "RetransSegs").is_some());
    }

    #[test]
    fn sockets_are_counted_from_a_process_fd_folder() {
        let dir = std::env::temp_dir().join(format!("ugds-fds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        for (name, to) in [("3", "socket:[101]"), ("4", "pipe:[7]"), ("5", "/dev/null"), ("6", "socket:[102]")] {
            std::os::unix::fs::symlink(to, dir.join(name)).unwrap();
        }
        assert_eq!(sockets_in(&dir), 2);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(sockets_in(&dir), 0);
        // A live process: this one holds at least the listener.
        let _l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(sockets_of(std::process::id()) >= 1);
    }
}
