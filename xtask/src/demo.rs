//! `cargo xtask demo`: the README's first command. Installs what is missing, builds everything,
//! boots the VM with an emulated SSD (or uses `--device /dev/ugds_drvN` on real hardware), writes
//! and verifies data through ugds, cross-checks it through the kernel nvme driver, and prints a
//! short ugds-vs-kernel (fio, io_uring, O_DIRECT) comparison measured in the same run.

use crate::bench::repeats;
use crate::{bind, kernel, kmod, toolchain, vm};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The benchmark rows: (name, fio rw, block size, jobs/threads, how ugds's waits wait). The
/// last row shows what adaptive waiting (the default) is for: busy polling with more threads
/// than the VM's two CPUs.
const ROWS: &[(&str, &str, &str, usize, &str)] = &[
    ("4K random read, 1 thread", "randread", "4K", 1, "adaptive"),
    ("4K random write, 1 thread", "randwrite", "4K", 1, "adaptive"),
    ("128K random read, 1 thread", "randread", "128K", 1, "adaptive"),
    ("4K random read, 4 threads", "randread", "4K", 4, "adaptive"),
    ("4K random read, 4 threads, ugds polling only", "randread", "4K", 4, "poll"),
];

/// The fields of `/etc/os-release` the demo decides on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID` (`debian`, `ubuntu`, ...).
    pub id: String,
    /// `VERSION_ID` (`12`).
    pub version_id: String,
    /// `PRETTY_NAME`, for messages.
    pub pretty_name: String,
}

impl OsRelease {
    /// Parses os-release(5) text: `KEY=value` lines, values optionally quoted.
    pub fn parse(text: &str) -> OsRelease {
        let mut os = OsRelease::default();
        for line in text.lines() {
            let Some((k, v)) = line.trim().split_once('=') else { continue };
            let v = v.trim().trim_matches(|c| c == '"' || c == '\'').to_string();
            match k.trim() {
                "ID" => os.id = v,
                "VERSION_ID" => os.version_id = v,
                "PRETTY_NAME" => os.pretty_name = v,
                _ => {}
            }
        }
        os
    }
}

/// Why the demo will not run on this machine, with what to do instead; `None` when it can.
/// The demo installs Debian packages (some only Debian has: `linux-source-6.12`, `rustc-web`,
/// QEMU from bookworm-backports), builds a kernel from Debian's source and, on a real device,
/// binds a PCI function: it needs Debian and root.
pub fn refusal(os: &OsRelease, uid: u32) -> Option<String> {
    let name = if os.pretty_name.is_empty() { os.id.as_str() } else { os.pretty_name.as_str() };
    if os.id != "debian" {
        let name = if name.is_empty() { "an unknown system (no /etc/os-release)" } else { name };
        return Some(format!(
            "the demo needs Debian 12 (bookworm): it installs Debian's packages (linux-source-6.12, rustc-web, QEMU \
             from bookworm-backports) and builds the test kernel from Debian's source; this machine runs {name}. \
             Run it in a Debian 12 VM or container (e.g. `docker run --privileged -it debian:bookworm`), or build and \
             install by hand as docs/install.md describes"
        ));
    }
    if uid != 0 {
        return Some(
            "the demo installs packages with apt-get and loads a kernel module: run it as root, e.g. \
             `sudo -E env PATH=$PATH cargo xtask demo` (the environment keeps your Rust toolchain)"
                .to_string(),
        );
    }
    None
}

/// The apt packages of `ci/packages.txt` (comments and blank lines skipped).
pub fn listed_packages(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// What the demo will install and build, said before it starts: the apt packages that are
/// missing, the toolchains `ci/setup.sh` adds, and the kernel build.
fn announce(device: bool) -> Result<()> {
    let root = toolchain::workspace_root();
    let listed = listed_packages(&std::fs::read_to_string(root.join("ci/packages.txt"))?);
    let installed = |p: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = listed.iter().map(String::as_str).filter(|p| !installed(p)).collect();
    eprintln!("demo: what this will install and build (ci/setup.sh; each step is skipped when present):");
    if missing.is_empty() {
        eprintln!("  apt packages: none missing ({} listed in ci/packages.txt)", listed.len());
    } else {
        eprintln!("  apt packages (apt-get install): {}", missing.join(" "));
    }
    eprintln!("  cargo install: bindgen-cli 0.73.0, cargo-fuzz 0.13.2 (into ~/.cargo/bin)");
    eprintln!("  rustup: the nightly toolchain, minimal profile (for cargo-fuzz)");
    eprintln!(
        "  QEMU 10 from bookworm-backports, extracted into {} (the system's QEMU stays)",
        toolchain::cache_dir().display()
    );
    eprintln!("  cargo build --release: the ugds CLI");
    if !device {
        eprintln!(
            "  the 6.12 test kernel from linux-source-6.12 and the ugds module, into the cache (the first time: long)"
        );
    }
    Ok(())
}

/// Host side: check the machine, say what will be installed, set up, build, boot the VM (or run
/// on a real device), report.
pub fn run(device: Option<String>, seconds: u64, repeats: u64) -> Result<()> {
    let os = OsRelease::parse(&std::fs::read_to_string("/etc/os-release").unwrap_or_default());
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if let Some(why) = refusal(&os, uid) {
        bail!("{why}");
    }
    announce(device.is_some())?;
    let t = Instant::now();
    let release = toolchain::setup_and_build_release(&["-p", "ugds-cli", "--bins"])?;
    let cli = release.join("ugds");
    let me = std::env::current_exe()?;
    if let Some(dev) = device {
        return guest(&cli.display().to_string(), &dev, seconds, repeats);
    }
    let k = kernel::Choice::Test612.ensure()?;
    let ko = kmod::build_for(&k)?;
    eprintln!("demo: built in {:.0?}; booting the VM with a 1 GiB emulated NVMe SSD", t.elapsed());
    let cfg = vm::VmConfig {
        // The image in the host's memory: no host writeback lands on one engine's turn.
        nvme: vec!["size=1G,lbs=4096,backend=memory".parse()?],
        iommu: false,
        bind_module: None,
        mem: "2G".into(),
        timeout: Duration::from_secs(1200 + 2 * repeats * seconds * ROWS.len() as u64),
        env: vec![("UGDS_KMOD".into(), ko.display().to_string())],
        cmd: vec![
            me.display().to_string(),
            "demo-guest".into(),
            cli.display().to_string(),
            seconds.to_string(),
            repeats.to_string(),
        ],
        p2p: None,
    };
    let out = vm::run(&cfg, &k, true)?;
    if out.code != 0 {
        bail!("the demo failed in the VM (exit {})", out.code);
    }
    eprintln!("demo: done in {:.0?}", t.elapsed());
    Ok(())
}

fn sh(cmd: &str) -> Result<String> {
    toolchain::output(Command::new("/bin/sh").arg("-c").arg(cmd))
}

struct Figures {
    iops: f64,
    p50_us: f64,
    p99_us: f64,
}

fn fio(blk: &str, rw: &str, bs: &str, jobs: usize, seconds: u64) -> Result<Figures> {
    let out = sh(&format!(
        "fio --output-format=json --name=k --filename={blk} --ioengine=io_uring --direct=1 --fixedbufs \
         --registerfiles --rw={rw} --bs={bs} --iodepth=1 --numjobs={jobs} --group_reporting --size=256M \
         --runtime={seconds} --time_based --randrepeat=0"
    ))?;
    let v: Value = serde_json::from_str(out.get(out.find('{').unwrap_or(0)..).unwrap_or(""))?;
    let job = &v["jobs"][0];
    let side = if rw.contains("write") { &job["write"] } else { &job["read"] };
    let pct = |p: &str| side["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Figures { iops: side["iops"].as_f64().unwrap_or(0.0), p50_us: pct("50.000000"), p99_us: pct("99.000000") })
}

fn ugds_bench(cli: &str, node: &str, rw: &str, bs: &str, threads: usize, wait: &str, seconds: u64) -> Result<Figures> {
    let out = sh(&format!(
        "{cli} --json bench {node} --rw {rw} --bs {bs} --numjobs {threads} --wait {wait} --runtime {seconds} --size 256M"
    ))?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(Figures {
        iops: v["iops"].as_f64().unwrap_or(0.0),
        p50_us: v["p50_us"].as_f64().unwrap_or(0.0),
        p99_us: v["p99_us"].as_f64().unwrap_or(0.0),
    })
}

fn first_controller() -> Result<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/bus/pci/devices")?
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read_to_string(e.path().join("class")).map(|c| c.trim() == "0x010802").unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v.into_iter().next().context("no NVMe controller")
}

fn block_of(addr: &str) -> Result<String> {
    let ctrl = std::fs::read_dir(format!("/sys/bus/pci/devices/{addr}/nvme"))?
        .next()
        .context("controller has no nvme instance")??
        .file_name()
        .to_string_lossy()
        .into_owned();
    Ok(format!("/dev/{ctrl}n1"))
}

/// Guest side (or a real machine with `--device`): verify, compare, print.
pub fn guest(cli: &str, device: &str, seconds: u64, repeats: u64) -> Result<()> {
    let in_vm = device == "vm";
    if in_vm && !Path::new("/sys/module/ugds").exists() {
        let ko = std::env::var("UGDS_KMOD").context("UGDS_KMOD not set")?;
        sh(&format!("insmod {ko}"))?;
    }
    let addr = if in_vm { first_controller()? } else { bind::resolve(device)? };
    let node = |addr: &str| -> Result<String> {
        bind::ugds_nodes(addr).first().map(|n| format!("/dev/{n}")).context("no /dev/ugds_drvN after bind")
    };
    println!("== 1. write and verify through ugds, then cross-check through the kernel nvme driver");
    bind::bind(&addr)?;
    let n = node(&addr)?;
    println!("{}", sh(&format!("{cli} info {n}"))?.trim());
    println!("{}", sh(&format!("{cli} write {n} --offset 0 --len 64M --pattern 2026"))?.trim());
    println!("{}", sh(&format!("{cli} read {n} --offset 0 --len 64M --check-pattern 2026"))?.trim());
    bind::unbind(&addr)?;
    let blk = block_of(&addr)?;
    sh(&format!("dd if={blk} of=/tmp/ugds-demo.bin bs=1M count=64 iflag=direct status=none"))?;
    let data = std::fs::read("/tmp/ugds-demo.bin")?;
    let mut want = vec![0u8; data.len()];
    ugds::pattern::fill(2026, 0, &mut want);
    if data != want {
        bail!("the kernel driver reads different bytes than ugds wrote");
    }
    println!("kernel nvme driver read the same 64 MiB back from {blk}: identical");

    let rounds = if repeats > 1 { format!(", {repeats} times each") } else { String::new() };
    println!(
        "\n== 2. ugds vs the kernel driver (fio, io_uring, O_DIRECT, fixed buffers, registered files), {seconds} s each{rounds}, same controller, the engines taking turns row by row"
    );
    // The controller is with the kernel's driver after the cross-check.
    let mut with_ugds = false;
    let mut points = Vec::new();
    for (row, (_, rw, bs, jobs, wait)) in ROWS.iter().enumerate() {
        for (_, ugds_turn) in repeats::order(repeats as usize, with_ugds) {
            if ugds_turn != with_ugds {
                if ugds_turn {
                    bind::bind(&addr)?;
                } else {
                    bind::unbind(&addr)?;
                }
                with_ugds = ugds_turn;
            }
            let (engine, f) = if ugds_turn {
                ("ugds", ugds_bench(cli, &node(&addr)?, rw, bs, *jobs, wait, seconds)?)
            } else {
                // The kernel may name the controller anew after each rebind.
                ("kernel", fio(&block_of(&addr)?, rw, bs, *jobs, seconds)?)
            };
            points.push(json!({"engine": engine, "row": row, "iops": f.iops, "p50_us": f.p50_us, "p99_us": f.p99_us}));
        }
    }
    // In the VM the controller goes back to the kernel; a real one stays with ugds, as it came.
    if in_vm && with_ugds {
        bind::unbind(&addr)?;
    } else if !in_vm && !with_ugds {
        bind::bind(&addr)?;
    }
    let merged = repeats::merge(&points, &["row"]);
    let of = |engine: &str, row: usize| {
        merged.iter().find(|p| p["engine"] == engine && p["row"] == row).cloned().unwrap_or(Value::Null)
    };
    println!("\n| workload | kernel IOPS | ugds IOPS | ugds/kernel | kernel p50/p99 us | ugds p50/p99 us |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (row, (name, ..)) in ROWS.iter().enumerate() {
        let (k, u) = (of("kernel", row), of("ugds", row));
        let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(0.0);
        println!(
            "| {name} | {:.0} | {:.0} | {} | {:.0} / {:.0} | {:.0} / {:.0} |",
            f(&k, "iops"),
            f(&u, "iops"),
            repeats::cell(repeats::ratio(&u, &k)),
            f(&k, "p50_us"),
            f(&k, "p99_us"),
            f(&u, "p50_us"),
            f(&u, "p99_us")
        );
    }
    if repeats > 1 {
        println!(
            "\nIOPS and latencies are medians of {repeats}; a ratio is the median of the ratios of turns taken side by side, with their range; noisy: an engine's measurements of the row disagree by more than {}x.",
            repeats::NOISY
        );
    }
    if in_vm {
        println!("\n(QEMU's emulated NVMe under TCG: absolute figures say little; the ratio is the point.)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOKWORM: &str = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
        VERSION_ID=\"12\"\nID=debian\nHOME_URL=\"https://www.debian.org/\"\n";
    const UBUNTU: &str = "NAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\nID=ubuntu\nID_LIKE=debian\n\
        PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n";

    #[test]
    fn parses_os_release() {
        let os = OsRelease::parse(BOOKWORM);
        assert_eq!((os.id.as_str(), os.version_id.as_str()), ("debian", "12"));
        assert_eq!(os.pretty_name, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(OsRelease::parse("ID='fedora'\n# comment\n\nbad line\n").id, "fedora");
    }

    #[test]
    fn runs_on_debian_as_root_only() {
        assert_eq!(refusal(&OsRelease::parse(BOOKWORM), 0), None);
        let not_root = refusal(&OsRelease::parse(BOOKWORM), 1000).unwrap();
        assert!(not_root.contains("as root") && not_root.contains("sudo"), "{not_root}");
        // A Debian derivative lacks Debian's packages: refused, naming the system and the way out.
        let ubuntu = refusal(&OsRelease::parse(UBUNTU), 0).unwrap();
        assert!(ubuntu.contains("Ubuntu 24.04.1 LTS") && ubuntu.contains("docs/install.md"), "{ubuntu}");
        let none = refusal(&OsRelease::parse(""), 0).unwrap();
        assert!(none.contains("no /etc/os-release"), "{none}");
        // The system comes first: a non-root user on another system hears about the system.
        assert!(refusal(&OsRelease::parse(UBUNTU), 1000).unwrap().contains("Debian 12"));
    }

    #[test]
    fn lists_packages() {
        assert_eq!(listed_packages("# c\nfio\n\n  gcc  \n"), ["fio", "gcc"]);
        let real =
            listed_packages(&std::fs::read_to_string(toolchain::workspace_root().join("ci/packages.txt")).unwrap());
        assert!(real.iter().any(|p| p == "linux-source-6.12"));
    }
}
