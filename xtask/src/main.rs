#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! `cargo xtask`: kernel, vm, install, bind, unbind, test, fuzz.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

mod bench;
mod bind;
mod clib;
mod cost;
mod demo;
mod dist;
#[cfg(test)]
mod docs_check;
mod fio;
mod fuzz;
mod install;
mod kernel;
mod kmod;
mod nixl;
mod p2p;
mod soname;
mod spdk;
mod stock;
mod suite;
mod toolchain;
mod vm;
mod wheel;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ugds build, VM and test automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the Rust-enabled test kernel, or fetch a stock one into its Debian root (cached
    /// outside the repository); prints the kernel image's path.
    Kernel {
        /// Build the debug flavour (KASAN, lockdep, atomic-sleep checks).
        #[arg(long)]
        debug: bool,
        /// Which kernel.
        #[arg(long, value_enum, default_value = "6.12")]
        kernel: kernel::Choice,
    },
    /// Boot the test kernel with emulated NVMe controllers and run CMD as root in the guest.
    Vm {
        /// An emulated controller: size=1G,lbs=4096,mdts=N,qpairs=N,mqes=N,ns=N,throttle_iops=N,serial=S,shared=on|off,backend=file|memory|null
        /// (repeat for more controllers).
        #[arg(long = "nvme", value_name = "SPEC")]
        nvme: Vec<vm::NvmeSpec>,
        /// Add an emulated Intel IOMMU and turn the guest IOMMU on (strict).
        #[arg(long)]
        iommu: bool,
        /// Add a stand-in GPU (ivshmem-plain: a 128 MiB memory BAR backed by a host file) behind
        /// one PCIe switch with the first controller, or on the root complex.
        #[arg(long, value_enum)]
        p2p: Option<p2p::Topology>,
        /// With --p2p: model an AMD Zen CPU, whose host bridge Linux trusts for peer-to-peer.
        #[arg(long, requires = "p2p")]
        p2p_zen: bool,
        /// With --p2p and --iommu: the IOMMU in passthrough for kernel drivers.
        #[arg(long, requires = "p2p")]
        p2p_passthrough: bool,
        /// Build and load ugds.ko and bind every controller to it before CMD.
        #[arg(long)]
        bind: bool,
        /// Guest memory.
        #[arg(long, default_value = "1G")]
        mem: String,
        /// Kill the guest after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Use the debug kernel flavour (same as `--kernel 6.12-debug`).
        #[arg(long)]
        debug_kernel: bool,
        /// The kernel to boot.
        #[arg(long, value_enum, default_value = "6.12")]
        kernel: kernel::Choice,
        /// The command to run in the guest, with its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Build kmod/ against the running kernel (or --kdir) and load it; install it for modprobe,
    /// the `ugds` CLI under PREFIX, the boot-time binding unit, the udev rule, an example
    /// /etc/ugds/bind.conf and the operations guide (docs/operations.md).
    Install {
        /// Kernel build tree (default: /lib/modules/$(uname -r)/build).
        #[arg(long)]
        kdir: Option<PathBuf>,
        /// Installation prefix of the CLI, the systemd unit and the guide.
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
        /// Stage every file under this directory instead of the machine (packaging): nothing is
        /// loaded and depmod does not run.
        #[arg(long)]
        destdir: Option<PathBuf>,
    },
    /// Give NVMe controllers (/dev/nvmeX, /dev/nvmeXnY or PCI addresses) to ugds; with several,
    /// prints the volume spec naming them in order.
    Bind(Controllers),
    /// Give controllers (PCI addresses or /dev/ugds_drvN) back to the kernel nvme driver; with
    /// several, prints the `mdadm --build` line giving the same layout over their namespaces.
    Unbind(Controllers),
    /// The main job: build, boot the VM with an emulated SSD (or use --device), write and verify
    /// through ugds, cross-check through the kernel driver, compare speed with fio.
    Demo {
        /// A real controller already bound to ugds (/dev/ugds_drvN) instead of the VM. Its data is
        /// overwritten.
        #[arg(long)]
        device: Option<String>,
        /// Seconds per benchmark point.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Measurements per engine and row, the engines taking turns (kernel, ugds, ugds,
        /// kernel, ...); the table gives medians and the ratios' range.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
        repeats: u64,
    },
    /// Benchmark grid: the kernel driver (fio + io_uring) vs ugds (`ugds bench`, and fio with
    /// ugds's ioengine, same job) on the same emulated controllers (an image in host memory,
    /// null-backed), each point measured --repeats times per engine, interleaved; plus the data
    /// path's own cost; writes JSON, markdown and PNG plots.
    ///
    /// With --members: a striped ugds volume vs the kernel's md RAID0 + fio over 1..N emulated
    /// controllers (one VM boot), ratio and scaling per point; into target/bench-volume.
    ///
    /// With --remote tcp|rdma: our NVMe over Fabrics initiator vs the kernel's (nvme-tcp or
    /// nvme-rdma + fio) on the same nvmet target in one VM, ratio per point; into
    /// target/bench-remote.
    #[command(group = clap::ArgGroup::new("grid").args(["members", "remote"]).multiple(false))]
    Bench {
        /// Seconds per point.
        #[arg(long, default_value_t = 1)]
        seconds: u64,
        /// Measurements per engine and point, interleaved with the kernel's (not with --p2p).
        #[arg(long, default_value_t = 3, conflicts_with = "p2p")]
        repeats: usize,
        /// Output folder (default target/bench, target/bench-volume with --members,
        /// target/bench-remote with --remote).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Member counts of the volume benchmark (e.g. 1,2,4).
        #[arg(long, value_delimiter = ',')]
        members: Vec<usize>,
        /// The remote benchmark's transport: tcp or rdma.
        #[arg(long, value_parser = ["tcp", "rdma"])]
        remote: Option<String>,
        /// I/O sizes, comma-separated (default: the main grid 4K,16K,64K,128K; volume and remote
        /// 4K,64K,128K,1M).
        #[arg(long, value_delimiter = ',', conflicts_with = "p2p")]
        sizes: Option<Vec<String>>,
        /// Queue depths, comma-separated (default: the main grid 1,8,32,128; volume and remote
        /// 1,32,128).
        #[arg(long, value_delimiter = ',', conflicts_with = "p2p")]
        depths: Option<Vec<usize>>,
        /// randread, randwrite or both, comma-separated (default: both).
        #[arg(long = "rw", value_delimiter = ',', conflicts_with = "p2p")]
        rws: Option<Vec<String>>,
        /// Emulated controllers' backend: file, null or both (the main grid: both unless given;
        /// volume benchmark: null unless given; file or null behind the remote benchmark's
        /// target, null unless given).
        #[arg(long)]
        backend: Option<String>,
        /// SPDK's `spdk_nvme_perf` as a third engine of the main grid, on the same controllers
        /// (bound to uio_pci_generic for its turn), interleaved with the others; built by
        /// `cargo xtask spdk`.
        #[arg(long, conflicts_with_all = ["members", "remote", "p2p"])]
        spdk: bool,
        /// Working set over the volume or the remote namespace.
        #[arg(long, value_parser = vm::parse_size, default_value = "1G", requires = "grid")]
        span: u64,
        /// Chunk size of the volume and of md RAID0 (volume benchmark).
        #[arg(long, value_parser = vm::parse_size, default_value = "128K", requires = "members", conflicts_with = "remote")]
        chunk: u64,
        /// Another build's `ugds` CLI (e.g. target/release/ugds of an older commit's worktree):
        /// the main grid (or, with --remote, the remote one; with --members, on the volumes)
        /// runs its `ugds bench` in the same turns as ours and adds a table of ours over it per
        /// point (IOPS and p50 latency).
        #[arg(long, value_name = "PATH", conflicts_with = "p2p")]
        baseline_cli: Option<PathBuf>,
        /// With --remote: confine both engines' processes (fio, and each `ugds bench`) to these
        /// CPUs (e.g. 1): the scheduler then cannot move them between CPUs at each wake-up.
        #[arg(long, value_name = "LIST", requires = "remote")]
        cpus: Option<String>,
        /// Reads into another device's memory BAR (peer-to-peer, Debian's 7.3 kernel) against host
        /// memory and against the kernel nvme driver's own peer-to-peer read, in one VM.
        #[arg(long, conflicts_with_all = ["remote", "members"])]
        p2p: bool,
    },
    /// (internal) The remote benchmark's steps inside the VM.
    #[command(hide = true)]
    BenchRemoteGuest {
        /// The ugds CLI binary.
        cli: String,
        /// The grid, as JSON.
        grid: String,
        /// Another build's ugds CLI, measured in ugds's turns too.
        #[arg(long)]
        baseline_cli: Option<String>,
    },
    /// (internal) The volume benchmark's steps inside the VM.
    #[command(hide = true)]
    BenchVolumeGuest {
        /// The ugds CLI binary.
        cli: String,
        /// The grid, as JSON.
        grid: String,
        /// Another build's ugds CLI, measured on the volumes in ugds's turns too.
        #[arg(long)]
        baseline_cli: Option<String>,
    },
    /// (internal) The benchmark's steps inside the VM.
    #[command(hide = true)]
    BenchGuest {
        /// The ugds CLI binary.
        cli: String,
        /// ugds's fio engine (libugds_fio.so).
        fio_engine: String,
        /// Seconds per point.
        seconds: u64,
        /// Measurements per engine and point.
        repeats: usize,
        /// The controllers' backends, in PCI order.
        #[arg(long, value_delimiter = ',', default_value = "file,null")]
        backends: Vec<String>,
        /// spdk_nvme_perf, for SPDK's turns.
        #[arg(long)]
        spdk: Option<String>,
        /// I/O sizes (default: the main grid's).
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<String>>,
        /// Queue depths (default: the main grid's).
        #[arg(long, value_delimiter = ',')]
        depths: Option<Vec<usize>>,
        /// randread and/or randwrite (default: both).
        #[arg(long, value_delimiter = ',')]
        rws: Option<Vec<String>>,
        /// Another build's ugds CLI, measured in ugds's turns beside ours.
        #[arg(long)]
        baseline_cli: Option<String>,
    },
    /// Builds SPDK's `spdk_nvme_perf` (the release `cargo xtask bench --spdk` measures) from
    /// SPDK's source against Debian's DPDK, into the cache (~/.cache/ugds/spdk-VERSION-KEY);
    /// installs the Debian packages it needs. Prints the application's path.
    Spdk {
        /// SPDK's git repository (holding the release's tag) or the release's source tree; not
        /// needed when the cache holds the build. Default: $UGDS_SPDK_SRC.
        #[arg(long, value_name = "DIR")]
        src: Option<PathBuf>,
    },
    /// (internal) The demo's steps inside the VM.
    #[command(hide = true)]
    DemoGuest {
        /// The ugds CLI binary.
        cli: String,
        /// Seconds per point.
        seconds: u64,
        /// Measurements per engine and row.
        repeats: u64,
    },
    /// Generates include/ugds.h from the C ABI with cbindgen (`--check`: fail when stale).
    Header {
        /// Compare instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Regenerates the fio engine's bindings (fio-engine/src/sys.rs) from fio's source tree
    /// (the release /usr/bin/fio is: fio-3.33), configuring it first if it has no config-host.h.
    FioBindings {
        /// The fio source tree (e.g. `git archive fio-3.33` of github.com/axboe/fio).
        #[arg(long, value_name = "DIR")]
        fio_src: PathBuf,
        /// Compare instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Installs libugds.so/.a, libcufile_ugds.so (also as lib/ugds-cufile/libcufile.so.0), ugds.h,
    /// ugds.pc, the fio engine (lib/fio/libugds_fio.so) and the NIXL plugin
    /// (lib/nixl/libplugin_UGDS.so) under a prefix, and checks SONAMEs and
    /// ctypes' find_library.
    InstallLib {
        /// The prefix (lib/, include/, lib/pkgconfig/ go under it).
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
    },
    /// The NIXL plugin's host phase alone (part of `test`): NIXL's Python API (nixl-cu12, into
    /// target/nixl-pyenv) runs tests/nixl/test_nixl_ugds.py with UGDS and POSIX on a file.
    TestNixl,
    /// Builds what the GPU machine runs into target/gpu (see tests/gpu/run.sh).
    GpuBundle,
    /// Builds the Python package (python/) into target/wheels/ugds-*.whl with maturin (from PyPI,
    /// into target/pyenv): one abi3 wheel for CPython >= 3.9, no CUDA dependency.
    Wheel,
    /// Builds the coverage-guided fuzz targets (fuzz/: ring, capi, ioctl, tcp, rdma; cargo-fuzz
    /// on the nightly toolchain) and runs each; prints executions and findings, fails on a crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
    },
    /// The data path's own cost per 4 KiB command on the host (native ns, and callgrind
    /// instructions with the device model's share subtracted), bursts 1 and 32.
    Cost,
    /// Host tests, then the VM suite; prints `N passed, M failed`.
    Test {
        /// Only host tests.
        #[arg(long)]
        host_only: bool,
        /// Only the VM suite (for a second kernel: the host phases do not depend on it).
        #[arg(long, conflicts_with = "host_only")]
        vm_only: bool,
        /// Only run VM tests whose name contains this (skips the host phases and the variants
        /// without a matching test).
        #[arg(long)]
        filter: Option<String>,
        /// Run every VM variant with the guest IOMMU on (translating, strict).
        #[arg(long)]
        iommu: bool,
        /// Use the debug kernel flavour (KASAN, lockdep, DEBUG_ATOMIC_SLEEP; same as
        /// `--kernel 6.12-debug`).
        #[arg(long)]
        debug_kernel: bool,
        /// The kernel the VM suite boots.
        #[arg(long, value_enum, default_value = "6.12")]
        kernel: kernel::Choice,
        /// Skip the second pass with the guest IOMMU on.
        #[arg(long)]
        quick: bool,
    },
}

/// The controllers `bind` and `unbind` act on.
#[derive(clap::Args)]
struct Controllers {
    /// The controllers, in stripe order (bind: all or nothing, one in use refuses the list).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    targets: Vec<String>,
    /// Every controller it applies to: for bind those not in use (the others are named and
    /// left alone), for unbind those bound to ugds.
    #[arg(long)]
    all: bool,
    /// Chunk size of the volume spec (bind) or `mdadm --build` line (unbind) printed at the end.
    #[arg(long, value_parser = vm::parse_size, default_value = "128K")]
    chunk: u64,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Kernel { debug, kernel } => {
            let k = kernel.with_debug(debug).ensure()?;
            println!("{}", k.image().display());
        }
        Cmd::Vm { nvme, iommu, p2p, p2p_zen, p2p_passthrough, bind, mem, timeout, debug_kernel, kernel, cmd } => {
            let k = kernel.with_debug(debug_kernel).ensure()?;
            let bind_module = if bind { Some(kmod::build_for(&k)?) } else { None };
            let nvme = if nvme.is_empty() { vec![vm::NvmeSpec::default()] } else { nvme };
            let cfg = vm::VmConfig {
                nvme,
                iommu,
                bind_module,
                mem,
                timeout: Duration::from_secs(timeout),
                env: Vec::new(),
                cmd,
                p2p: p2p.map(|topology| p2p::P2p { topology, zen_cpu: p2p_zen, passthrough: p2p_passthrough }),
            };
            let out = vm::run(&cfg, &k, true)?;
            std::process::exit(out.code);
        }
        Cmd::Install { kdir, prefix, destdir } => install::install(kdir, &prefix, destdir.as_deref())?,
        Cmd::Bind(Controllers { targets, all, chunk }) => {
            let (bound, refused) = bind::bind_many(&targets, all)?;
            for b in &bound {
                println!("{}: bound to ugds: {}", b.addr, b.node);
            }
            if !refused.is_empty() {
                println!("left with their driver (in use):{}", bind::describe_refused(&refused));
            }
            if all || targets.len() > 1 {
                let nodes: Vec<String> = bound.iter().map(|b| b.node.clone()).collect();
                println!("volume: {}", bind::volume_spec(chunk, &nodes)?);
            }
        }
        Cmd::Unbind(Controllers { targets, all, chunk }) => {
            let released = bind::unbind_many(&targets, all)?;
            for r in &released {
                let disk = r.disk.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                println!("{}: given back to {}{disk}", r.addr, r.driver.as_deref().unwrap_or("no driver"));
            }
            let disks: Vec<String> = released.iter().filter_map(|r| r.disk.clone()).collect();
            if (all || targets.len() > 1) && disks.len() == released.len() {
                println!("md RAID0 with the same layout: {}", bind::md_build_line(chunk, &disks));
            }
        }
        Cmd::Demo { device, seconds, repeats } => demo::run(device, seconds, repeats)?,
        Cmd::Header { check } => clib::header(check)?,
        Cmd::FioBindings { fio_src, check } => fio::bindings(&fio_src, check)?,
        Cmd::InstallLib { prefix } => clib::install(&prefix)?,
        Cmd::GpuBundle => clib::gpu_bundle()?,
        Cmd::TestNixl => {
            let (p, f) = nixl::host_tests()?;
            println!("{p} passed, {f} failed");
            if f > 0 {
                std::process::exit(1);
            }
        }
        Cmd::Wheel => wheel::run()?,
        Cmd::Bench {
            seconds,
            repeats,
            out,
            members,
            remote,
            sizes,
            depths,
            rws,
            backend,
            span,
            chunk,
            p2p,
            spdk,
            baseline_cli,
            cpus,
        } => {
            let grid_only = members.is_empty() && remote.is_none() && !p2p;
            let backend = backend.unwrap_or_else(|| if grid_only { "both".into() } else { "null".into() });
            // Each grid's own defaults for the axes not given.
            let axes = if grid_only { bench::Axes::main() } else { bench::Axes::volume() }.with(sizes, depths, rws);
            let bench::Axes { sizes, depths, rws } = axes.clone();
            if p2p {
                bench::p2p::run(seconds.max(1), out)?
            } else if let Some(transport) = remote {
                let grid = bench::remote::Grid { transport, sizes, depths, rws, backend, seconds, span, repeats, cpus };
                bench::remote::run(&grid.checked()?, out, baseline_cli.as_deref())?
            } else if members.is_empty() {
                let backends = bench::volume::backends(&backend)?;
                bench::run(seconds, repeats, out, &backends, spdk, axes, baseline_cli.as_deref())?
            } else {
                let backends = bench::volume::backends(&backend)?;
                let grid = bench::volume::Grid { members, sizes, depths, rws, backends, seconds, span, chunk, repeats };
                bench::volume::run(&grid.checked()?, out, baseline_cli.as_deref())?
            }
        }
        Cmd::BenchVolumeGuest { cli, grid, baseline_cli } => {
            bench::volume::guest(&cli, &grid, baseline_cli.as_deref())?
        }
        Cmd::BenchRemoteGuest { cli, grid, baseline_cli } => {
            bench::remote::guest(&cli, &grid, baseline_cli.as_deref())?
        }
        Cmd::BenchGuest { cli, fio_engine, seconds, repeats, backends, spdk, sizes, depths, rws, baseline_cli } => {
            let axes = bench::Axes::main().with(sizes, depths, rws).checked_main()?;
            bench::guest(
                &cli,
                &fio_engine,
                seconds,
                repeats,
                &backends,
                spdk.as_deref(),
                &axes,
                baseline_cli.as_deref(),
            )?
        }
        Cmd::Spdk { src } => {
            let src = src.or_else(|| std::env::var_os("UGDS_SPDK_SRC").map(PathBuf::from));
            println!("{}", spdk::ensure(src.as_deref())?.perf().display());
        }
        Cmd::DemoGuest { cli, seconds, repeats } => demo::guest(&cli, "vm", seconds, repeats)?,
        Cmd::Cost => {
            cost::run()?;
        }
        Cmd::Fuzz { seconds, target } => fuzz::run(seconds, target.as_deref())?,
        Cmd::Test { host_only, vm_only, filter, iommu, debug_kernel, kernel, quick } => {
            let kernel = kernel.with_debug(debug_kernel);
            let summary = suite::run(&suite::Plan { host_only, vm_only, filter, iommu, kernel, quick })?;
            println!("{} passed, {} failed", summary.passed, summary.failed);
            if summary.failed > 0 {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
