//! `cargo xtask spdk`: SPDK's `spdk_nvme_perf`, the peer `cargo xtask bench --spdk` measures
//! beside the kernel and ugds, built from SPDK's source against Debian's DPDK (bookworm's
//! `libdpdk-dev`, 22.11) and cached outside the repository like the test kernel.
//!
//! The source is a release, [`TAG`]: the last SPDK release that links against DPDK 22.11 (26.01
//! and later link `librte_argparse`, which DPDK has from 24.03 on). Its submodules (DPDK, ISA-L,
//! ...) are not needed: DPDK is the system's, ISA-L is left out (no crypto or compression, which
//! `spdk_nvme_perf` does not use), and only the libraries and the one application are built.
//! Two lines of the source are changed ([`PATCHES`], each must match exactly once), and the
//! cache key covers them, the configure options, the DPDK version and the compiler.

use crate::toolchain;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The SPDK release built, as its `VERSION` file says it.
pub const VERSION: &str = "25.09";

/// Its tag in SPDK's git repository.
pub const TAG: &str = "v25.09";

/// Debian packages the build needs (bookworm's names): DPDK and what SPDK's libraries link, and
/// the Python modules SPDK's RPC code generator imports (Debian's python3, not a pyenv one).
pub const PACKAGES: &[&str] = &[
    "make",
    "gcc",
    "pkg-config",
    "libdpdk-dev",
    "libnuma-dev",
    "libaio-dev",
    "uuid-dev",
    "libssl-dev",
    "python3-jinja2",
    "python3-tabulate",
];

/// `./configure` options: the system's DPDK (`--with-dpdk`, which makes the build shared), a
/// baseline x86-64 with SSE4.2 (`corei7`, what Debian's DPDK is built for: the guest is QEMU's
/// TCG `-cpu max`, which has no AVX-512 whatever the host has), nothing that needs a submodule
/// or a library `spdk_nvme_perf` does not use.
pub const CONFIGURE: &[&str] = &[
    "--with-dpdk",
    "--target-arch=corei7",
    "--disable-tests",
    "--disable-unit-tests",
    "--disable-examples",
    "--without-crypto",
    "--without-vhost",
    "--without-virtio",
    "--without-fio",
    "--without-xnvme",
    "--without-rdma",
    "--without-uring",
    "--without-ocf",
    "--without-idxd",
    "--without-usdt",
    "--without-fsdev",
    "--without-nvme-cuse",
    "--without-sma",
    "--without-golang",
    "--without-avahi",
    "--without-fc",
    "--without-daos",
    "--without-rbd",
    "--without-ublk",
    "--without-iscsi-initiator",
    "--without-vfio-user",
    "--without-dpdk-compressdev",
    "--without-raid5f",
];

/// `make` variables: Debian's DPDK is built with intel-ipsec-mb, which configure takes as a
/// reason to build the `intel-ipsec-mb` submodule; nothing here uses it.
const MAKE_VARS: &[&str] = &["CONFIG_IPSEC_MB=n"];

/// One changed line of SPDK's source.
#[derive(Debug, Clone, Copy)]
pub struct Patch {
    /// File, relative to the source root.
    pub file: &'static str,
    /// The whole line as SPDK has it.
    pub from: &'static str,
    /// What it becomes.
    pub to: &'static str,
    /// Why.
    pub why: &'static str,
}

/// The changes to SPDK's source.
pub const PATCHES: &[Patch] = &[
    Patch {
        file: "configure",
        from: "if [[ $arch == x86_64* ]] || [[ $arch == aarch64* ]]; then",
        to: "if false; then",
        why: "x86-64 always builds ISA-L from its submodule; take the branch other architectures take \
              (no ISA-L: no crypto or compression, CRCs in C)",
    },
    Patch {
        file: "lib/env_dpdk/pci_dpdk.c",
        from: "\t\tif (minor > 4) {",
        to: "\t\tif (0) {",
        why: "SPDK refuses DPDK 22.11 LTS releases after 22.11.4 in case one changed DPDK's private PCI \
              structures; bookworm has 22.11.11, whose public PCI headers match SPDK's copy of 22.11's \
              (an LTS release keeps the ABI)",
    },
];

/// A built `spdk_nvme_perf`.
#[derive(Debug, Clone)]
pub struct Built {
    /// The cache folder (`spdk-VERSION-KEY`).
    pub dir: PathBuf,
}

impl Built {
    /// The source tree the build ran in.
    pub fn src(&self) -> PathBuf {
        self.dir.join("src")
    }

    /// The application (its shared libraries in `../lib`).
    pub fn perf(&self) -> PathBuf {
        self.src().join("build/bin/spdk_nvme_perf")
    }

    fn stamp(&self) -> PathBuf {
        self.dir.join(".ugds-complete")
    }
}

/// Replaces the one line of `text` equal to `p.from` by `p.to`; an error unless exactly one is.
pub fn apply(text: &str, p: &Patch) -> Result<String> {
    let hits = text.lines().filter(|l| *l == p.from).count();
    if hits != 1 {
        bail!("patching {}: {hits} lines read {:?} (expected one): not SPDK {VERSION}'s source?", p.file, p.from);
    }
    let mut out = String::with_capacity(text.len());
    for l in text.split_inclusive('\n') {
        let (line, end) = l.strip_suffix('\n').map_or((l, ""), |s| (s, "\n"));
        out.push_str(if line == p.from { p.to } else { line });
        out.push_str(end);
    }
    Ok(out)
}

/// The cache key: hex SHA-256 (16 digits) over the release, the DPDK and compiler versions, the
/// configure options, the make variables and the patches.
pub fn cache_key(dpdk: &str, cc: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"ugds-spdk-v1\0");
    for part in [VERSION, dpdk, cc] {
        h.update(part.as_bytes());
        h.update(b"\0");
    }
    for a in CONFIGURE.iter().chain(MAKE_VARS) {
        h.update(a.as_bytes());
        h.update(b"\0");
    }
    for p in PATCHES {
        for s in [p.file, p.from, p.to] {
            h.update(s.as_bytes());
            h.update(b"\0");
        }
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The packages of [`PACKAGES`] that are not installed.
fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            toolchain::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .map_or(true, |s| !s.ends_with("installed") || s.contains("not-installed"))
        })
        .collect()
}

/// Installs what is missing (as root, with apt-get), else names the command that would.
fn install_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    let cmd = format!("apt-get install -y --no-install-recommends {}", missing.join(" "));
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("SPDK's build needs Debian packages that are missing: run `{cmd}` as root");
    }
    eprintln!("spdk: installing {}", missing.join(" "));
    toolchain::run(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing))
        .with_context(|| format!("`{cmd}` failed (an `apt-get update` first?)"))
}

/// The build's PATH: the system's tools first (SPDK's generator needs Debian's python3 with its
/// jinja2 and tabulate, not a pyenv shim).
const BUILD_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The versions the key covers: DPDK's (pkg-config) and the compiler's first line.
fn versions() -> Result<(String, String)> {
    let dpdk = toolchain::output(Command::new("pkg-config").args(["--modversion", "libdpdk"]))
        .context("pkg-config does not know libdpdk (apt-get install libdpdk-dev)")?;
    let cc = toolchain::output(Command::new("/usr/bin/cc").arg("--version")).context("cc --version")?;
    Ok((dpdk, cc.lines().next().unwrap_or_default().to_string()))
}

/// Where the build for this machine's DPDK and compiler lives (built or not).
pub fn locate() -> Result<Built> {
    let (dpdk, cc) = versions()?;
    Ok(Built { dir: toolchain::cache_dir().join(format!("spdk-{VERSION}-{}", cache_key(&dpdk, &cc))) })
}

/// The cached build, or an error that says what to run.
pub fn cached() -> Result<Built> {
    if !missing_packages().is_empty() {
        bail!("SPDK is not built: its packages are missing; run `cargo xtask spdk --src DIR` (DIR: SPDK's git repository holding tag {TAG}, or its {VERSION} source tree)");
    }
    let b = locate()?;
    if !b.stamp().exists() {
        bail!(
            "SPDK {VERSION}'s spdk_nvme_perf is not built (no {}): run `cargo xtask spdk --src DIR` \
             (DIR: SPDK's git repository holding tag {TAG}, or its {VERSION} source tree)",
            b.stamp().display()
        );
    }
    Ok(b)
}

/// Puts SPDK's source from `src` (a git repository with [`TAG`], or a source tree of
/// [`VERSION`]) into `dst`.
fn extract(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    let tag = format!("{TAG}^{{commit}}");
    let is_git = Command::new("git")
        .arg("-C")
        .arg(src)
        .args(["rev-parse", "--verify", "--quiet", &tag])
        .output()
        .is_ok_and(|o| o.status.success());
    let how = if is_git {
        format!("git -C '{}' archive {TAG} | tar -x -C '{}'", src.display(), dst.display())
    } else {
        let version = fs::read_to_string(src.join("VERSION")).with_context(|| {
            format!("{} is neither a git repository with tag {TAG} nor an SPDK source tree (no VERSION)", src.display())
        })?;
        if !version.trim().starts_with(VERSION) {
            bail!("{} holds SPDK {}, not {VERSION}", src.display(), version.trim());
        }
        format!("tar -C '{}' --exclude=.git -cf - . | tar -x -C '{}'", src.display(), dst.display())
    };
    toolchain::run(Command::new("bash").arg("-c").arg(format!("set -o pipefail; {how}")))
}

/// Runs one build step with its output appended to `log`; on failure shows the log's tail.
fn step(cmd: &mut Command, log: &Path, what: &str) -> Result<()> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let status = cmd
        .env("PATH", BUILD_PATH)
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("starting {what}"))?;
    if !status.success() {
        eprintln!("--- last lines of {} ---\n{}", log.display(), toolchain::tail(log, 30));
        bail!("SPDK {what} failed ({status}); full log: {}", log.display());
    }
    Ok(())
}

/// Builds `spdk_nvme_perf` from `src` unless the cache holds it; `src` may be left out when it
/// does.
pub fn ensure(src: Option<&Path>) -> Result<Built> {
    install_packages()?;
    let b = locate()?;
    if b.stamp().exists() {
        eprintln!("spdk: cached at {}", b.dir.display());
        return Ok(b);
    }
    let Some(src) = src else { return cached() };
    let t = std::time::Instant::now();
    let _ = fs::remove_dir_all(&b.dir);
    extract(src, &b.src())?;
    for p in PATCHES {
        let f = b.src().join(p.file);
        let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        fs::write(&f, apply(&text, p)?)?;
        eprintln!("spdk: patched {}: {}", p.file, p.why);
    }
    let log = b.dir.join("build.log");
    eprintln!("spdk: building SPDK {VERSION} in {} (log: {})", b.src().display(), log.display());
    step(Command::new("./configure").current_dir(b.src()).args(CONFIGURE), &log, "configure")?;
    let jobs = format!("-j{}", toolchain::jobs());
    // The libraries without the applications (`spdk_top` would need ncurses), then the one.
    step(Command::new("make").current_dir(b.src()).arg(&jobs).args(MAKE_VARS).arg("CONFIG_APPS=n"), &log, "libraries")?;
    step(
        Command::new("make").current_dir(b.src()).arg(&jobs).args(MAKE_VARS).args(["-C", "app/spdk_nvme_perf"]),
        &log,
        "spdk_nvme_perf",
    )?;
    if !b.perf().exists() {
        bail!("the build finished without {}", b.perf().display());
    }
    fs::write(b.stamp(), format!("{VERSION} from {}\n", src.display()))?;
    eprintln!("spdk: built {} in {:.0?}", b.perf().display(), t.elapsed());
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A patch changes its one line and keeps every other byte; a line missing or doubled is an
    /// error (another SPDK release).
    #[test]
    fn patches_change_exactly_one_line() {
        let p = &PATCHES[1];
        let text = "\tif (year == 22 && month == 11) {\n\t\tif (minor > 4) {\n\t\t\tgoto not_supported;\n";
        assert_eq!(
            apply(text, p).unwrap(),
            "\tif (year == 22 && month == 11) {\n\t\tif (0) {\n\t\t\tgoto not_supported;\n"
        );
        // No trailing newline: kept as it was.
        assert_eq!(apply("x\n\t\tif (minor > 4) {", p).unwrap(), "x\n\t\tif (0) {");
        assert!(apply("\t\tif (minor > 5) {\n", p).is_err());
        assert!(apply("\t\tif (minor > 4) {\n\t\tif (minor > 4) {\n", p).is_err());
        // Indented differently: not the line.
        assert!(apply("\tif (minor > 4) {\n", p).is_err());
        let c = &PATCHES[0];
        let conf = "elif x; then\nif [[ $arch == x86_64* ]] || [[ $arch == aarch64* ]]; then\n\tCONFIG[ISAL]=y\n";
        assert_eq!(apply(conf, c).unwrap(), "elif x; then\nif false; then\n\tCONFIG[ISAL]=y\n");
    }

    /// The key moves with DPDK's and the compiler's versions.
    #[test]
    fn the_key_covers_dpdk_and_the_compiler() {
        let k = cache_key("22.11.11", "cc (Debian 12.2.0-14) 12.2.0");
        assert_eq!(k.len(), 16);
        assert_eq!(k, cache_key("22.11.11", "cc (Debian 12.2.0-14) 12.2.0"));
        assert_ne!(k, cache_key("22.11.4", "cc (Debian 12.2.0-14) 12.2.0"));
        assert_ne!(k, cache_key("22.11.11", "cc (Debian 14.2.0-19) 14.2.0"));
    }
}
