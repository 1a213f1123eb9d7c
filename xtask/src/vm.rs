//! `cargo xtask vm`: boots the test kernel under QEMU (TCG) with emulated NVMe controllers and
//! runs a command as root in the guest.
//!
//! The guest's root is a busybox initramfs made per run; the host's `/` is mounted read-only
//! over 9p at the same paths (the command runs chrooted into it, with a writable tmpfs on /tmp),
//! so host-built binaries run unchanged. The command's exit code comes back on the serial
//! console as a marker line. A watchdog kills a guest that outlives the timeout.

use crate::kernel::TestKernel;
use crate::stock::StockKernel;
use crate::toolchain;
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Marker the guest prints with the command's exit code.
const EXIT_MARKER: &str = "UGDS-VM-EXIT=";

/// Marker the guest prints when its set-up is done and the command starts.
const STARTED_MARKER: &str = "UGDS-VM-STARTED";

/// How long a guest may take to reach its command (a boot takes seconds, the stock kernel's
/// module loads and `--bind` included). Seen once: the 6.12 test kernel under QEMU 10 stalled
/// in early boot (RCU stalls, a vCPU whose timer never fired) and would have sat out the whole
/// timeout; [`run`] then fails as for a crash, so the suite boots the variant once more.
const BOOT_DEADLINE: Duration = Duration::from_secs(180);

/// CPUs of every guest (QEMU's `-smp`).
pub const GUEST_CPUS: u32 = 2;

/// One emulated NVMe controller: `size=1G,lbs=4096,mdts=2,qpairs=4,mqes=127,ns=2,throttle_iops=10,serial=X,shared=on`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeSpec {
    /// Bytes per namespace.
    pub size: u64,
    /// Logical block size (512 or 4096).
    pub lbs: u32,
    /// MDTS (power of two of 4 KiB pages), or the QEMU default.
    pub mdts: Option<u8>,
    /// Maximum I/O queue pairs, or the QEMU default.
    pub qpairs: Option<u32>,
    /// CAP.MQES, 0's based (127: 128-entry queues, as some cloud controllers report), or QEMU's
    /// default (2047). Needs the QEMU from the cache ([`qemu_for`]).
    pub mqes: Option<u16>,
    /// Number of namespaces.
    pub ns: u32,
    /// I/O operations per second the backing drive allows (slows the drive), or unlimited.
    pub throttle_iops: Option<u32>,
    /// Serial number.
    pub serial: Option<String>,
    /// What holds the namespaces' blocks.
    pub backend: Backend,
    /// Metadata bytes per block of the last namespace (0: none), for the refusal test.
    pub ms: u16,
    /// The namespaces say they may be shared by several controllers (NMIC), as a dual-port SSD's
    /// do: a kernel with CONFIG_NVME_MULTIPATH then shows them through a multipath head
    /// (`nvmeXnY` under the subsystem, one `nvmeXcZnY` path per controller). Off by default, as
    /// a single-port SSD reports (QEMU 10 turns it on unless told).
    pub shared: bool,
    /// A controller memory buffer of this many MiB (QEMU's `cmb_size_mb`): the kernel's nvme
    /// driver publishes it as p2pmem, the kernel's own peer-to-peer target.
    pub cmb_mb: Option<u32>,
}

/// What holds an emulated controller's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An image file in the run's temporary folder.
    File,
    /// An image file on the host's tmpfs (`/dev/shm`): real reads and writes, but no host
    /// writeback running behind a benchmark at moments of its own (on disk where there is none).
    Memory,
    /// QEMU's null driver: no disk I/O (isolates software and emulation cost; reads return
    /// zeroes).
    Null,
}

impl Default for NvmeSpec {
    fn default() -> Self {
        NvmeSpec {
            size: 256 << 20,
            lbs: 512,
            mdts: None,
            qpairs: None,
            mqes: None,
            ns: 1,
            throttle_iops: None,
            serial: None,
            backend: Backend::File,
            ms: 0,
            shared: false,
            cmb_mb: None,
        }
    }
}

/// Parses a size such as `4096`, `64K`, `256M`, `1G`.
pub fn parse_size(s: &str) -> Result<u64> {
    ugds::units::parse(s).map_err(anyhow::Error::msg)
}

impl std::str::FromStr for NvmeSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut spec = NvmeSpec::default();
        for kv in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').with_context(|| format!("{kv:?} is not key=value"))?;
            match k {
                "size" => spec.size = parse_size(v)?,
                "lbs" => {
                    spec.lbs = v.parse()?;
                    if spec.lbs != 512 && spec.lbs != 4096 {
                        bail!("lbs must be 512 or 4096, not {v}");
                    }
                }
                "mdts" => spec.mdts = Some(v.parse()?),
                "qpairs" => spec.qpairs = Some(v.parse()?),
                "mqes" => {
                    let m: u16 = v.parse().with_context(|| format!("mqes must be 1..=65535, not {v}"))?;
                    // QEMU refuses 0 (a 1-entry queue cannot hold a command).
                    if m == 0 {
                        bail!("mqes must be 1..=65535 (0's based), not 0");
                    }
                    spec.mqes = Some(m);
                }
                "ns" => {
                    spec.ns = v.parse()?;
                    if !(1..=16).contains(&spec.ns) {
                        bail!("ns must be 1..=16, not {v}");
                    }
                }
                "throttle_iops" => spec.throttle_iops = Some(v.parse()?),
                "serial" => spec.serial = Some(v.to_string()),
                "ms" => spec.ms = v.parse()?,
                "cmb" => spec.cmb_mb = Some((parse_size(v)? >> 20) as u32).filter(|&m| m > 0),
                "shared" => {
                    spec.shared = match v {
                        "on" => true,
                        "off" => false,
                        _ => bail!("shared must be on or off, not {v}"),
                    }
                }
                "backend" => match v {
                    "file" => spec.backend = Backend::File,
                    "null" => spec.backend = Backend::Null,
                    "memory" => spec.backend = Backend::Memory,
                    _ => bail!("backend must be file, memory or null, not {v}"),
                },
                _ => bail!(
                    "unknown NVMe spec key {k:?} (size, lbs, mdts, qpairs, mqes, ns, throttle_iops, serial, backend, ms, shared, cmb)"
                ),
            }
        }
        if spec.size == 0 || spec.size % u64::from(spec.lbs) != 0 {
            bail!("size must be a non-zero multiple of the block size");
        }
        Ok(spec)
    }
}

/// Everything one VM run needs.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Emulated controllers, in PCI order.
    pub nvme: Vec<NvmeSpec>,
    /// Add QEMU's intel-iommu and turn the guest IOMMU on (strict).
    pub iommu: bool,
    /// Load ugds.ko (this path) and bind every controller to it before the command.
    pub bind_module: Option<PathBuf>,
    /// Guest memory, QEMU syntax (`1G`).
    pub mem: String,
    /// Kill the guest after this long.
    pub timeout: Duration,
    /// Environment for the command.
    pub env: Vec<(String, String)>,
    /// The command and its arguments.
    pub cmd: Vec<String>,
    /// A stand-in GPU (a device with a memory BAR) for peer-to-peer tests, and where it sits.
    pub p2p: Option<crate::p2p::P2p>,
}

/// The kernel a VM boots and where its modules come from.
#[derive(Debug, Clone)]
pub enum Guest {
    /// The test kernel built here (`cargo xtask kernel`): modules from its build folder.
    Built(TestKernel),
    /// A distribution's kernel, unmodified, installed in a root (`--kernel debian-7.3`):
    /// modules through `modprobe -d ROOT`, also for the kernel's own module requests.
    Stock(StockKernel),
}

impl Guest {
    /// The kernel image QEMU boots.
    pub fn image(&self) -> PathBuf {
        match self {
            Guest::Built(k) => k.bzimage(),
            Guest::Stock(k) => k.image(),
        }
    }

    /// Modules the initramfs must load before it can mount the host (9p), decompressed into
    /// it, in load order: the test kernel builds them in; Debian ships them as modules.
    fn early_modules(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let Guest::Stock(k) = self else { return Ok(Vec::new()) };
        let mut v = Vec::new();
        for rel in ["fs/netfs/netfs", "net/9p/9pnet", "net/9p/9pnet_virtio", "fs/9p/9p"] {
            let p = k.modules_dir().join(format!("kernel/{rel}.ko.xz"));
            let out =
                Command::new("xz").arg("-dc").arg(&p).output().with_context(|| format!("xz -dc {}", p.display()))?;
            if !out.status.success() {
                bail!("decompressing {} failed", p.display());
            }
            // Numbered: the init loads them in glob order.
            let name = rel.rsplit('/').next().unwrap_or(rel);
            v.push((format!("{}-{name}.ko", v.len()), out.stdout));
        }
        Ok(v)
    }

    /// Shell lines of the guest's init that load the kernel's NVMe driver (after /host is up).
    /// Without `multipath`, a kernel built with NVMe multipath (Debian's) loads it off: QEMU 10
    /// puts every controller in a subsystem that says it may have several controllers, so the
    /// kernel would show each namespace through a multipath head even where no namespace is
    /// shared ([`NvmeSpec::shared`] asks for that layout).
    fn load_nvme_lines(&self, multipath: bool) -> String {
        match self {
            Guest::Built(k) => k
                .nvme_modules()
                .iter()
                .map(|m| format!("insmod /host{} || fail 'loading {}'\n", m.display(), m.display()))
                .collect(),
            Guest::Stock(k) => {
                // The cache path has no quote or space (it is ours); it sits inside printf's
                // single-quoted format below.
                let root = k.root.display();
                // The kernel's own module requests (a configfs mount, a dummy link, md's raid
                // personalities) go through the root's modules too.
                format!(
                    "printf '#!/bin/busybox sh\\nexec chroot /host /sbin/modprobe -d {root} \"$@\"\\n' > /bin/ugds-modprobe\n\
                     chmod 755 /bin/ugds-modprobe\n\
                     echo /bin/ugds-modprobe > /proc/sys/kernel/modprobe\n\
                     chroot /host /sbin/modprobe -d {root} nvme_core multipath={mp} || fail \"loading nvme_core from {root}\"\n\
                     chroot /host /sbin/modprobe -d {root} nvme || fail \"loading nvme from {root}\"\n",
                    mp = if multipath { "Y" } else { "N" },
                )
            }
        }
    }

    /// Environment for the VM suite: where the tests find the kernel's other modules.
    pub fn suite_env(&self) -> Vec<(String, String)> {
        match self {
            Guest::Built(k) => vec![("UGDS_KERNEL_BUILD".into(), k.build.display().to_string())],
            Guest::Stock(k) => vec![("UGDS_MODULE_ROOT".into(), k.root.display().to_string())],
        }
    }
}

/// Quotes a string for the guest's sh.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn guest_init(cfg: &VmConfig, kernel: &Guest, xtask: &Path) -> Result<String> {
    let cwd = std::env::current_dir()?;
    let mut s = String::new();
    s.push_str(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /early/*.ko; do [ -e "$m" ] && insmod "$m"; done
mkdir -p /host
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose host /host; then
  echo "ugds-vm: mounting the host file system failed"; echo UGDS-VM-EXIT=125; reboot -f
fi
# A writable /tmp, through which what the host had in /tmp stays visible (read-only): a checkout
# or build under /tmp must run by its host path too.
mkdir -p /hosttmp
mount --bind /host/tmp /hosttmp
mount -t tmpfs tmp /host/tmp
for e in /hosttmp/* /hosttmp/.[!.]*; do
  [ -e "$e" ] || continue
  n="${e#/hosttmp/}"
  if [ -d "$e" ]; then mkdir -p "/host/tmp/$n"; else touch "/host/tmp/$n"; fi
  mount --bind "$e" "/host/tmp/$n" 2>/dev/null
done
mount -t devtmpfs dev /host/dev
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
fail() { echo "ugds-vm: $*"; echo UGDS-VM-EXIT=125; sync; reboot -f; }
"#,
    );
    s.push_str(&kernel.load_nvme_lines(cfg.nvme.iter().any(|n| n.shared)));
    // Wait for the kernel driver to finish probing every controller.
    let want = cfg.nvme.len();
    writeln!(
        s,
        "i=0; while [ $(ls /sys/class/nvme 2>/dev/null | wc -l) -lt {want} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done"
    )?;
    if let Some(ko) = &cfg.bind_module {
        writeln!(s, "insmod /host{} || fail 'loading ugds.ko'", ko.display())?;
        // Bind in PCI order, so /dev/ugds_drvN follows controller order.
        writeln!(
            s,
            "for d in $(ls /sys/bus/pci/devices); do if [ \"$(cat /sys/bus/pci/devices/$d/class)\" = 0x010802 ]; then chroot /host {} bind $d || fail \"binding $d\"; fi; done",
            xtask.display()
        )?;
    }
    let mut env = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb UGDS_IN_VM=1",
    );
    for (k, v) in &cfg.env {
        write!(env, " {}={}", k, shell_quote(v))?;
    }
    let cmd: Vec<String> = cfg.cmd.iter().map(|a| shell_quote(a)).collect();
    writeln!(
        s,
        "echo\necho {STARTED_MARKER}\nchroot /host /bin/sh -c {}\nrc=$?\nsync\necho\necho {EXIT_MARKER}$rc\nreboot -f",
        shell_quote(&format!("{env}; cd {} && exec {}", shell_quote(&cwd.to_string_lossy()), cmd.join(" ")))
    )?;
    Ok(s)
}

fn make_initramfs(dir: &Path, init: &str, early: &[(String, Vec<u8>)]) -> Result<PathBuf> {
    let root = dir.join("initramfs");
    for d in ["bin", "proc", "sys", "dev", "host", "hosttmp", "tmp", "early"] {
        fs::create_dir_all(root.join(d))?;
    }
    for (name, bytes) in early {
        fs::write(root.join("early").join(name), bytes)?;
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox missing: run `apt-get install busybox-static`");
    }
    fs::copy(busybox, root.join("bin/busybox"))?;
    fs::write(root.join("init"), init)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(root.join("init"), fs::Permissions::from_mode(0o755))?;
    let cpio = dir.join("initramfs.cpio");
    let out = fs::File::create(&cpio)?;
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(out)
        .spawn()
        .context("running cpio (apt-get install cpio)")?;
    {
        let mut stdin = child.stdin.take().context("cpio stdin")?;
        for e in ["bin", "bin/busybox", "proc", "sys", "dev", "host", "tmp", "init", "early"] {
            writeln!(stdin, "{e}")?;
        }
        for (name, _) in early {
            writeln!(stdin, "early/{name}")?;
        }
    }
    if !child.wait()?.success() {
        bail!("cpio failed");
    }
    Ok(cpio)
}

/// The variable naming a Unix socket for QEMU's human monitor (HMP): unset, the VM has none.
/// For looking inside the emulator while something runs, e.g. `sync-profile on` and later
/// `info sync-profile` (which locks the vCPUs wait for, where and how long), or `log
/// trace:pci_nvme_mmio_doorbell*` (each doorbell register write the NVMe model sees).
const MONITOR_ENV: &str = "UGDS_QEMU_MONITOR";

/// `-monitor`'s value for the socket path `path` (none without one).
fn monitor(path: Option<std::ffi::OsString>) -> Result<String> {
    let Some(p) = path else { return Ok("none".into()) };
    let p = p.into_string().map_err(|p| anyhow::anyhow!("{MONITOR_ENV}={p:?} is not UTF-8"))?;
    if p.is_empty() || p.contains(',') {
        bail!("{MONITOR_ENV}={p:?}: a socket path, without commas (QEMU's option separator)");
    }
    Ok(format!("unix:{p},server=on,wait=off"))
}

/// QEMU's arguments; image files go into `dir`, those of `backend=memory` controllers into
/// `shm` (a folder on tmpfs) where there is one.
fn qemu_args(cfg: &VmConfig, kernel: &Guest, dir: &Path, shm: Option<&Path>, initrd: &Path) -> Result<Vec<String>> {
    let mut a: Vec<String> = [
        "-machine",
        "q35",
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        if cfg.p2p.is_some_and(|p| p.zen_cpu) { "EPYC" } else { "max" },
        "-m",
        &cfg.mem,
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(["-smp".into(), GUEST_CPUS.to_string()]);
    a.extend(["-monitor".into(), monitor(std::env::var_os(MONITOR_ENV))?]);
    // tsc=reliable: keep the vDSO clock (TSC) even if TCG timing trips the clocksource watchdog.
    let mut append = String::from("console=ttyS0 panic=-1 loglevel=4 rdinit=/init tsc=reliable");
    if cfg.iommu {
        // The IOMMU must come before the devices it translates for.
        a.extend(["-device".into(), "intel-iommu".into()]);
        append.push_str(" intel_iommu=on iommu.strict=1");
        if cfg.p2p.is_some_and(|p| p.passthrough) {
            append.push_str(" iommu.passthrough=1");
        }
    }
    a.extend(["-kernel".into(), kernel.image().display().to_string()]);
    a.extend(["-initrd".into(), initrd.display().to_string()]);
    a.extend(["-append".into(), append]);
    a.extend(["-virtfs".into(), "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap".into()]);
    let p2p = cfg.p2p.map(|p| crate::p2p::devices(p.topology, dir));
    if let Some(d) = &p2p {
        a.extend(d.args.iter().cloned());
    }
    for (i, spec) in cfg.nvme.iter().enumerate() {
        let serial = spec.serial.clone().unwrap_or_else(|| format!("ugds{i:04}"));
        let mut dev = format!("nvme,id=nvme{i},serial={serial}");
        if let Some(bus) = p2p.as_ref().and_then(|d| d.nvme_buses.get(i)) {
            write!(dev, ",bus={bus}")?;
        }
        if let Some(m) = spec.mdts {
            write!(dev, ",mdts={m}")?;
        }
        if let Some(q) = spec.qpairs {
            write!(dev, ",max_ioqpairs={q}")?;
        }
        if let Some(m) = spec.mqes {
            write!(dev, ",mqes={m}")?;
        }
        if let Some(m) = spec.cmb_mb {
            write!(dev, ",cmb_size_mb={m}")?;
        }
        a.extend(["-device".into(), dev]);
        for n in 1..=spec.ns {
            let mut drive = if spec.backend == Backend::Null {
                format!("driver=null-co,size={},read-zeroes=on,if=none,id=d{i}n{n}", spec.size)
            } else {
                let at = if spec.backend == Backend::Memory { shm.unwrap_or(dir) } else { dir };
                let img = at.join(format!("nvme{i}n{n}.img"));
                fs::File::create(&img)?.set_len(spec.size)?;
                format!("file={},if=none,id=d{i}n{n},format=raw,cache=unsafe", img.display())
            };
            if let Some(t) = spec.throttle_iops {
                write!(drive, ",throttling.iops-total={t}")?;
            }
            a.extend(["-drive".into(), drive]);
            a.extend([
                "-device".into(),
                format!(
                    "nvme-ns,drive=d{i}n{n},bus=nvme{i},nsid={n},logical_block_size={lbs},physical_block_size={lbs},\
                     shared={shared}{ms}",
                    lbs = spec.lbs,
                    shared = if spec.shared { "on" } else { "off" },
                    // The last namespace carries the metadata (separate buffer: mset=0).
                    ms = if spec.ms > 0 && n == spec.ns { format!(",ms={}", spec.ms) } else { String::new() },
                ),
            ]);
        }
    }
    Ok(a)
}

/// The bookworm-backports QEMU that `ci/setup.sh` extracts into the cache (its `qemu_bpo_version`,
/// without the epoch): bookworm's QEMU 7.2 has no `mqes` property on its nvme device.
pub const QEMU_BACKPORTS_VERSION: &str = "10.0.2+ds-2+deb13u1~bpo12+1";

/// Which QEMU a run uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Qemu {
    /// The system's `qemu-system-x86_64` (bookworm: 7.2).
    System,
    /// The backports build extracted under this folder, with its own firmware and modules.
    Cached(PathBuf),
}

impl Qemu {
    /// A command that starts this QEMU (firmware and modules from its own tree when cached).
    pub fn command(&self) -> Command {
        match self {
            Qemu::System => Command::new("qemu-system-x86_64"),
            Qemu::Cached(root) => {
                let mut c = Command::new(root.join("usr/bin/qemu-system-x86_64"));
                // Without these it would load the system 7.2's modules and firmware.
                c.env("QEMU_MODULE_DIR", root.join("usr/lib/x86_64-linux-gnu/qemu"));
                c.arg("-L").arg(root.join("usr/share/qemu")).arg("-L").arg(root.join("usr/share/seabios"));
                c
            }
        }
    }

    /// Names it in errors.
    pub fn describe(&self) -> String {
        match self {
            Qemu::System => "qemu-system-x86_64 (apt-get install qemu-system-x86)".into(),
            Qemu::Cached(root) => format!("QEMU {QEMU_BACKPORTS_VERSION} from {}", root.display()),
        }
    }
}

/// The QEMU a configuration runs on: the cached backports build (QEMU 10) whenever
/// `ci/setup.sh` has extracted it, else the system's. Bookworm's QEMU 7.2 has no `mqes`
/// property, and its NVMe model misbehaves under the suite's reset tests (seen: a completion
/// reporting an SQ head the queue never reached, and SIGSEGV), so it serves only a machine
/// without the cache and a configuration that sets no `mqes`. Fails, naming `ci/setup.sh`,
/// when a controller sets `mqes` and the cache lacks QEMU 10.
pub fn qemu_for(cfg: &VmConfig, cache: &Path) -> Result<Qemu> {
    let root = cache.join(format!("qemu-{QEMU_BACKPORTS_VERSION}"));
    // `ready` is written last, after setup checked that the binary runs and has `mqes`.
    if root.join("ready").exists() {
        return Ok(Qemu::Cached(root));
    }
    if cfg.nvme.iter().any(|n| n.mqes.is_some()) {
        bail!(
            "an NVMe controller with mqes= needs QEMU {QEMU_BACKPORTS_VERSION} (bookworm-backports) in {}: \
             run ci/setup.sh",
            root.display()
        );
    }
    Ok(Qemu::System)
}

/// What a finished run produced.
#[derive(Debug)]
pub struct VmOutcome {
    /// The command's exit code (125: the guest's setup failed, 124: timed out).
    pub code: i32,
    /// Everything the guest printed.
    pub output: String,
}

/// Boots the VM, runs the command, and returns its exit code and output. With `echo`, guest
/// output is also printed as it arrives.
pub fn run(cfg: &VmConfig, kernel: &Guest, echo: bool) -> Result<VmOutcome> {
    if cfg.cmd.is_empty() {
        bail!("no command given: cargo xtask vm [OPTIONS] -- CMD ARGS...");
    }
    let tmp = TempDir::new("ugds-vm")?;
    let xtask = std::env::current_exe()?;
    let mut cfg = cfg.clone();
    if let Some(t) = cfg.p2p {
        cfg.env.extend(crate::p2p::guest_env(t, &crate::p2p::bar_file(tmp.path())));
    }
    let cfg = &cfg;
    let init = guest_init(cfg, kernel, &xtask)?;
    let initrd = make_initramfs(tmp.path(), &init, &kernel.early_modules()?)?;
    let shm = match cfg.nvme.iter().any(|s| s.backend == Backend::Memory) {
        true => TempDir::new_in(Path::new("/dev/shm"), "ugds-vm")
            .map_err(|e| eprintln!("vm: {e:#}: the memory-backed controllers' images lie on disk instead"))
            .ok(),
        false => None,
    };
    let args = qemu_args(cfg, kernel, tmp.path(), shm.as_ref().map(TempDir::path), &initrd)?;
    let qemu = qemu_for(cfg, &toolchain::cache_dir())?;
    let mut child = qemu
        .command()
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", qemu.describe()))?;
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let stalled = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, timed_out, timeout) = (done.clone(), timed_out.clone(), cfg.timeout);
        let (started, stalled) = (started.clone(), stalled.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::Relaxed) {
                let boot_over = start.elapsed() > BOOT_DEADLINE && !started.load(Ordering::Relaxed);
                if boot_over || start.elapsed() > timeout {
                    (if boot_over { &stalled } else { &timed_out }).store(true, Ordering::Relaxed);
                    kill_child(pid);
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let stderr = child.stderr.take().context("qemu stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    });
    let stdout = child.stdout.take().context("qemu stdout")?;
    let mut output = String::new();
    let mut code = None;
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end_matches(['\r', '\n']);
        if let Some(rc) = line.strip_prefix(EXIT_MARKER) {
            code = rc.trim().parse::<i32>().ok();
            continue;
        }
        // The console may put escape sequences before it on the line.
        if line.ends_with(STARTED_MARKER) {
            started.store(true, Ordering::Relaxed);
            continue;
        }
        if echo {
            println!("{line}");
        }
        output.push_str(line);
        output.push('\n');
    }
    let status = child.wait()?;
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    let qemu_err = err_reader.join().unwrap_or_default();
    if stalled.load(Ordering::Relaxed) {
        bail!("the guest did not reach its command within {BOOT_DEADLINE:?} (a stalled boot): killed it");
    }
    if timed_out.load(Ordering::Relaxed) {
        eprintln!("ugds-vm: the guest did not finish within {:?}: killed it", cfg.timeout);
        return Ok(VmOutcome { code: 124, output });
    }
    let said = if qemu_err.is_empty() { String::new() } else { format!("\nqemu said: {qemu_err}") };
    match code {
        Some(c) => Ok(VmOutcome { code: c, output }),
        None => match std::os::unix::process::ExitStatusExt::signal(&status) {
            Some(signal) => Err(EmulatorCrashed { signal, detail: format!("(qemu: {status}){said}") }.into()),
            None => bail!("the guest stopped without reporting an exit code (qemu: {status}){said}"),
        },
    }
}

/// QEMU itself died by a signal: a fault of the emulator, whatever the guest did.
#[derive(Debug)]
pub struct EmulatorCrashed {
    /// The signal.
    pub signal: i32,
    /// QEMU's status and what it said.
    pub detail: String,
}

impl std::fmt::Display for EmulatorCrashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the guest stopped without reporting an exit code: QEMU died by signal {} {}",
            self.signal, self.detail
        )
    }
}

impl std::error::Error for EmulatorCrashed {}

/// Kills QEMU (our child) at the timeout.
fn kill_child(pid: u32) {
    // CAST: pids fit in i32.
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}

/// A temporary folder removed on drop (disk images, initramfs).
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh folder under the system temp dir.
    pub fn new(prefix: &str) -> Result<Self> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    /// Creates a fresh folder under `base`.
    pub fn new_in(base: &Path, prefix: &str) -> Result<Self> {
        for i in 0..1000u32 {
            let p = base.join(format!("{prefix}-{}-{i}", std::process::id()));
            if fs::create_dir(&p).is_ok() {
                return Ok(TempDir(p));
            }
        }
        bail!("could not create a temp dir under {}", base.display())
    }
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monitor_is_off_unless_a_socket_is_named() {
        assert_eq!(monitor(None).unwrap(), "none");
        assert_eq!(monitor(Some("/tmp/m.sock".into())).unwrap(), "unix:/tmp/m.sock,server=on,wait=off");
        assert!(monitor(Some("/tmp/a,b".into())).is_err());
        assert!(monitor(Some("".into())).is_err());
    }

    #[test]
    fn parses_nvme_specs() {
        let s: NvmeSpec = "size=256M,lbs=4096,mdts=2".parse().unwrap();
        assert_eq!((s.size, s.lbs, s.mdts, s.ns), (256 << 20, 4096, Some(2), 1));
        let s: NvmeSpec = "size=64M,mqes=127".parse().unwrap();
        assert_eq!(s.mqes, Some(127));
        assert!("mqes=0".parse::<NvmeSpec>().is_err());
        assert!("mqes=65536".parse::<NvmeSpec>().is_err());
        let s: NvmeSpec = "size=128M,ns=2,qpairs=1,throttle_iops=2,serial=abc".parse().unwrap();
        assert_eq!((s.ns, s.qpairs, s.throttle_iops, s.serial.as_deref()), (2, Some(1), Some(2), Some("abc")));
        assert!("lbs=1024".parse::<NvmeSpec>().is_err());
        assert!("bogus=1".parse::<NvmeSpec>().is_err());
        assert_eq!("backend=null".parse::<NvmeSpec>().unwrap().backend, Backend::Null);
        assert_eq!("backend=memory".parse::<NvmeSpec>().unwrap().backend, Backend::Memory);
        assert_eq!("size=1M".parse::<NvmeSpec>().unwrap().backend, Backend::File);
        assert!("backend=tape".parse::<NvmeSpec>().is_err());
        assert!("ns=0".parse::<NvmeSpec>().is_err());
        assert!("size=1000,lbs=4096".parse::<NvmeSpec>().is_err());
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    }

    #[test]
    fn the_cached_qemu_is_preferred_and_mqes_needs_it() {
        let cache = TempDir::new("ugds-qemu-cache").unwrap();
        let cfg = |specs: &[&str]| VmConfig {
            nvme: specs.iter().map(|s| s.parse().unwrap()).collect(),
            iommu: false,
            bind_module: None,
            mem: "1G".into(),
            timeout: Duration::from_secs(1),
            env: vec![],
            cmd: vec![],
            p2p: None,
        };
        assert_eq!(qemu_for(&cfg(&["size=64M"]), cache.path()).unwrap(), Qemu::System);
        let small = cfg(&["size=64M", "size=64M,mqes=127"]);
        let err = qemu_for(&small, cache.path()).unwrap_err().to_string();
        assert!(err.contains("ci/setup.sh"), "{err}");
        let root = cache.path().join(format!("qemu-{QEMU_BACKPORTS_VERSION}"));
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("ready"), "").unwrap();
        assert_eq!(qemu_for(&small, cache.path()).unwrap(), Qemu::Cached(root.clone()));
        assert_eq!(qemu_for(&cfg(&["size=64M"]), cache.path()).unwrap(), Qemu::Cached(root));
    }

    #[test]
    fn setup_fetches_the_qemu_xtask_runs() {
        let setup = fs::read_to_string(toolchain::workspace_root().join("ci/setup.sh")).unwrap();
        assert!(setup.contains(&format!("qemu_bpo_version='1:{QEMU_BACKPORTS_VERSION}'")));
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
