//! Debian's stock kernel as a VM guest (`--kernel debian-7.3`): the kernel and its modules come
//! unmodified from Debian's packages, installed into a Debian 13 root that the harness
//! debootstraps and caches; ugds.ko is built inside that root by `kmod/ugds-kmod`, the same step
//! a user runs on such a machine (it rebuilds the kernel's Rust metadata and checks the module
//! against the kernel before anything loads it).
//!
//! The root is also a real Debian system for the guest: its `/lib/modules` serve the guest's
//! module loading (`modprobe -d ROOT`, also for the kernel's own module requests).

use crate::toolchain;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian suite of the root and the kernel packages it installs (trixie-backports).
const SUITE: &str = "trixie";
/// The kernel release of Debian 13's backported 7.3 kernel.
pub const RELEASE: &str = "7.3.4+deb13-amd64";
/// Its package version (linux-image, linux-headers and linux-source share it).
const PACKAGE_VERSION: &str = "7.3.4-1~bpo13+1";
const MIRROR: &str = "http://deb.debian.org/debian";
/// Where the installed layout puts the tool inside the root (prefix /usr/local).
const TOOL_IN_ROOT: &str = "usr/local/sbin/ugds-kmod";

/// A Debian root holding Debian's kernel, ready to boot and to build ugds.ko for.
#[derive(Debug, Clone)]
pub struct StockKernel {
    /// The debootstrapped root.
    pub root: PathBuf,
    /// Its kernel release.
    pub release: String,
}

impl StockKernel {
    /// The kernel image (Debian's vmlinuz, unmodified).
    pub fn image(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.release))
    }

    /// The guest's modules folder (`lib/modules/RELEASE` of the root).
    pub fn modules_dir(&self) -> PathBuf {
        self.root.join("usr/lib/modules").join(&self.release)
    }

    /// Runs `ugds-kmod ARGS` inside the root, as a user of that system would, with the current
    /// checkout's `kmod/` and `uapi/` installed where the installed layout puts them.
    pub fn ugds_kmod(&self, args: &[&str]) -> Result<String> {
        let out = self.run_tool(args)?;
        if !out.status.success() {
            bail!(
                "ugds-kmod {} in {} failed ({}):\n{}{}",
                args.join(" "),
                self.root.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Installs the checkout's `ugds-kmod` into the root and runs it there with `args`.
    fn run_tool(&self, args: &[&str]) -> Result<std::process::Output> {
        install_tool(&self.root)?;
        let mut all = vec![format!("/{TOOL_IN_ROOT}")];
        all.extend(args.iter().map(|s| s.to_string()));
        in_root(&self.root, &all)
    }

    /// Builds (and checks) ugds.ko for this kernel inside the root; returns its host path.
    pub fn build_module(&self) -> Result<PathBuf> {
        let inside = self.ugds_kmod(&["build", "--release", &self.release])?;
        let rel = inside.lines().last().context("ugds-kmod build printed no path")?.trim_start_matches('/');
        let ko = self.root.join(rel);
        if !ko.exists() {
            bail!("ugds-kmod build reported {inside:?}, but {} does not exist", ko.display());
        }
        Ok(ko)
    }
}

/// Runs a command chrooted into `root` with /proc and /dev mounted (in a private mount
/// namespace, so nothing stays mounted on the host).
fn in_root(root: &Path, cmd: &[String]) -> Result<std::process::Output> {
    let script = format!(
        "set -e; mount -t proc proc {r}/proc; mount --rbind /dev {r}/dev; exec chroot {r} /usr/bin/env -i \
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \"$@\"",
        r = crate::vm::shell_quote(&root.to_string_lossy())
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .args(cmd)
        .output()
        .with_context(|| format!("running {cmd:?} in {}", root.display()))
}

fn in_root_ok(root: &Path, cmd: &[&str], what: &str) -> Result<()> {
    let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    let out = in_root(root, &cmd)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(30).collect();
        bail!(
            "{what} failed in {} ({}):\n{}",
            root.display(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}

/// Installs `ugds-kmod` and the sources it builds into the root's `/usr/local`, as
/// `cargo xtask install-lib --prefix /usr/local` would on that machine.
fn install_tool(root: &Path) -> Result<()> {
    crate::install::install_kmod_tool(&root.join("usr/local"))
}

/// The packages of the root besides the base system: the kernel (what a user has installed),
/// its headers, and what the VM suite's guest side uses. `ugds-kmod deps` adds the build tools.
const PACKAGES: &[&str] = &["kmod", "xz-utils", "ca-certificates", "iproute2", "mdadm", "util-linux"];

fn cache_key() -> Result<String> {
    let mut h = Sha256::new();
    h.update(b"ugds-stock-root-v1\0");
    for s in [SUITE, RELEASE, PACKAGE_VERSION, MIRROR] {
        h.update(s.as_bytes());
        h.update(b"\0");
    }
    for p in PACKAGES {
        h.update(p.as_bytes());
        h.update(b"\0");
    }
    Ok(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The cached root, debootstrapped and provisioned unless the cache already holds it.
pub fn ensure() -> Result<StockKernel> {
    let dir = toolchain::cache_dir().join(format!("debian-{SUITE}-{RELEASE}-{}", cache_key()?));
    let root = dir.join("root");
    let k = StockKernel { root: root.clone(), release: RELEASE.into() };
    if dir.join("ready").exists() {
        eprintln!("stock kernel: Debian root cached at {}", root.display());
        return Ok(k);
    }
    if toolchain::which("debootstrap").is_none() {
        bail!("debootstrap is missing: apt-get install debootstrap (ci/packages.txt lists it)");
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    eprintln!("stock kernel: debootstrapping Debian {SUITE} into {}", root.display());
    toolchain::run(
        Command::new("debootstrap")
            .args(["--variant=minbase", "--include=ca-certificates", SUITE])
            .arg(&root)
            .arg(MIRROR)
            .stdout(std::process::Stdio::null()),
    )
    .context("debootstrap")?;
    fs::write(root.join("etc/apt/sources.list.d/backports.list"), format!("deb {MIRROR} {SUITE}-backports main\n"))?;
    // No initramfs generator: the VM boots with its own busybox initramfs, and a generator run
    // inside a chroot fails anyway.
    fs::write(root.join("etc/apt/apt.conf.d/90ugds-no-recommends"), "APT::Install-Recommends \"false\";\n")?;
    in_root_ok(&root, &["apt-get", "update", "-q"], "apt-get update")?;
    let mut pkgs: Vec<String> = PACKAGES.iter().map(|s| s.to_string()).collect();
    for p in ["linux-image", "linux-headers"] {
        pkgs.push(format!("{p}-{RELEASE}={PACKAGE_VERSION}"));
    }
    // From backports as a user installs it (`-t`: its linux-base and other dependencies too).
    let backports = format!("{SUITE}-backports");
    let mut cmd: Vec<&str> =
        vec!["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "-t", &backports];
    cmd.extend(pkgs.iter().map(String::as_str));
    eprintln!("stock kernel: installing {}", pkgs.join(" "));
    in_root_ok(&root, &cmd, "installing the kernel packages")?;
    // What building ugds.ko for this kernel needs, installed the way a user would.
    install_tool(&root)?;
    let tool = format!("/{TOOL_IN_ROOT}");
    in_root_ok(&root, &[&tool, "deps", "--release", RELEASE], "ugds-kmod deps")?;
    if !k.image().exists() || !k.modules_dir().join("kernel/drivers/nvme/host/nvme.ko.xz").exists() {
        bail!(
            "the root at {} has no {} or no nvme module after installing the kernel",
            root.display(),
            k.image().display()
        );
    }
    fs::write(dir.join("ready"), b"")?;
    Ok(k)
}

/// What the checks of `ugds-kmod` must refuse, tried against this kernel before the VM suite
/// boots it (each a test in the summary):
/// - a module built against metadata from another configuration (one option changed);
/// - a module whose imports the kernel does not export (the good module checked against a
///   copy of the headers whose `kernel` crate hash differs, as another compiler's would);
/// - the 6.12 test kernel's module (another release).
///
/// Each must exit with status 3 and say why; the module built for this kernel must pass.
pub fn refusal_tests(k: &StockKernel, good_ko: &Path, other_ko: Option<&Path>) -> crate::suite::Summary {
    let mut s = crate::suite::Summary::default();
    let mut record = |name: &str, r: Result<()>| match r {
        Ok(()) => {
            s.passed += 1;
            eprintln!("stock kernel check {name}: ok");
        }
        Err(e) => {
            s.failed += 1;
            eprintln!("stock kernel check {name}: FAILED: {e:#}");
        }
    };
    let rel = |p: &Path| -> Result<String> {
        Ok(format!(
            "/{}",
            p.strip_prefix(&k.root).with_context(|| format!("{} is outside the root", p.display()))?.display()
        ))
    };
    record(
        "module_built_for_the_kernel_passes",
        (|| {
            k.ugds_kmod(&["check", "--release", &k.release, &rel(good_ko)?])?;
            Ok(())
        })(),
    );
    record(
        "module_built_against_another_configuration_is_refused",
        (|| {
            let cfg = k.root.join("tmp/ugds-wrong.config");
            let mut text = fs::read_to_string(k.root.join(format!("usr/src/linux-headers-{}/.config", k.release)))?;
            // One option that changes the layout of structures the module touches (mm_struct's
            // owner, the page counters) and survives olddefconfig (NR_CPUS does not: MAXSMP
            // pins it).
            let (from, to) = ("CONFIG_MEMCG=y", "# CONFIG_MEMCG is not set");
            if !text.contains(from) {
                bail!("the kernel's configuration has no {from}: pick another option to change");
            }
            text = text.replace(from, to);
            fs::write(&cfg, text)?;
            expect_refusal(
                k,
                &["build", "--release", &k.release, "--config", "/tmp/ugds-wrong.config"],
                "another kernel configuration",
            )
        })(),
    );
    record(
        "module_importing_symbols_the_kernel_lacks_is_refused",
        (|| {
            let fake = k.root.join("tmp/ugds-fake-headers");
            let _ = fs::remove_dir_all(&fake);
            fs::create_dir_all(&fake)?;
            let real = k.root.join(format!("usr/src/linux-headers-{}", k.release));
            for f in [".config", "Makefile"] {
                fs::copy(real.join(f), fake.join(f))?;
            }
            let symvers = fs::read_to_string(real.join("Module.symvers"))?;
            let hash = symvers
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .find_map(|w| w.find("_6kernel").and_then(|i| w[..i].rfind("Cs").map(|j| &w[j..i + 8])))
                .context("Module.symvers names no kernel crate")?
                .to_string();
            fs::write(fake.join("Module.symvers"), symvers.replace(&hash, "Cs0000000000000_6kernel"))?;
            expect_refusal(
                k,
                &["check", "--release", &k.release, "--headers", "/tmp/ugds-fake-headers", &rel(good_ko)?],
                "names the kernel crate",
            )
        })(),
    );
    if let Some(other) = other_ko {
        record(
            "module_of_another_release_is_refused",
            (|| {
                let dest = k.root.join("tmp/ugds-other.ko");
                fs::copy(other, &dest)?;
                expect_refusal(k, &["check", "--release", &k.release, "/tmp/ugds-other.ko"], "vermagic")
            })(),
        );
    }
    s
}

/// Runs `ugds-kmod ARGS` in the root and requires exit status 3 with `why` in its message.
fn expect_refusal(k: &StockKernel, args: &[&str], why: &str) -> Result<()> {
    let out = k.run_tool(args)?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(3) {
        bail!("ugds-kmod {} exited with {} (want 3, refused):\n{err}", args.join(" "), out.status);
    }
    if !err.contains(why) {
        bail!("ugds-kmod {} refused without saying {why:?}:\n{err}", args.join(" "));
    }
    Ok(())
}
