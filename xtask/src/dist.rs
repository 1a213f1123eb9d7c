//! What `cargo xtask install` puts on the machine besides loading the module, so that ugds runs
//! from the installed CLI alone: the `ugds` command, the module under /lib/modules (for
//! `modprobe ugds`), the boot-time binding unit, the udev rule for group access, an example
//! /etc/ugds/bind.conf and the operations guide. The files come from `dist/`, with the
//! installed paths filled in.

use crate::toolchain;
use anyhow::{Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where things go: everything under `destdir` (`/` on the machine itself; a staging directory
/// when packaging), programs and units under `prefix`.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The staging root (`/` to install for real).
    pub destdir: PathBuf,
    /// The installation prefix (`/usr/local`).
    pub prefix: PathBuf,
}

impl Layout {
    /// `path` (absolute) under the staging root.
    pub(crate) fn staged(&self, path: &Path) -> PathBuf {
        self.destdir.join(path.strip_prefix("/").unwrap_or(path))
    }

    fn bindir(&self) -> PathBuf {
        self.prefix.join("bin")
    }

    fn docdir(&self) -> PathBuf {
        self.prefix.join("share/doc/ugds")
    }
}

/// A `dist/` template with `@BINDIR@` and `@DOCDIR@` filled in.
pub fn render(template: &str, layout: &Layout) -> String {
    template
        .replace("@BINDIR@", &layout.bindir().display().to_string())
        .replace("@DOCDIR@", &layout.docdir().display().to_string())
}

fn put(layout: &Layout, at: &Path, text: &str, mode: u32) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = layout.staged(at);
    fs::create_dir_all(p.parent().context("no parent")?).with_context(|| format!("creating {}", p.display()))?;
    fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    Ok(p)
}

/// Installs the unit, the udev rule, the example configuration and the guide (never an existing
/// /etc/ugds/bind.conf). Returns what it wrote.
pub fn install_files(layout: &Layout) -> Result<Vec<PathBuf>> {
    let root = toolchain::workspace_root();
    let read = |p: &str| fs::read_to_string(root.join(p)).with_context(|| format!("reading {p}"));
    Ok(vec![
        put(
            layout,
            &layout.prefix.join("lib/systemd/system/ugds-bind.service"),
            &render(&read("dist/ugds-bind.service")?, layout),
            0o644,
        )?,
        // udev reads rules from /etc and /usr/lib only, whatever the prefix.
        put(
            layout,
            Path::new("/etc/udev/rules.d/70-ugds.rules"),
            &render(&read("dist/70-ugds.rules")?, layout),
            0o644,
        )?,
        put(layout, Path::new("/etc/ugds/bind.conf.example"), &read("dist/bind.conf.example")?, 0o644)?,
        put(layout, &layout.docdir().join("operations.md"), &read("docs/operations.md")?, 0o644)?,
    ])
}

/// Builds the CLI (release) and installs it as `PREFIX/bin/ugds`.
pub fn install_cli(layout: &Layout) -> Result<PathBuf> {
    toolchain::run(Command::new(env!("CARGO")).current_dir(toolchain::workspace_root()).args([
        "build",
        "--release",
        "-p",
        "ugds-cli",
    ]))
    .context("building the ugds CLI")?;
    let bin = fs::read(toolchain::workspace_root().join("target/release/ugds"))?;
    let at = layout.bindir().join("ugds");
    let p = layout.staged(&at);
    fs::create_dir_all(p.parent().context("no parent")?)?;
    // A new file renamed over the old one: a running `ugds` keeps its binary.
    let tmp = p.with_extension("new");
    fs::write(&tmp, bin)?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    }
    fs::rename(&tmp, &p)?;
    Ok(p)
}

/// Installs `ko` as /lib/modules/RELEASE/extra/ugds.ko (where `modprobe ugds` finds it, after
/// `depmod`, which runs when installing for real).
pub fn install_module(layout: &Layout, ko: &Path, release: &str) -> Result<PathBuf> {
    let at = PathBuf::from(format!("/lib/modules/{release}/extra/ugds.ko"));
    let p = layout.staged(&at);
    fs::create_dir_all(p.parent().context("no parent")?)?;
    fs::copy(ko, &p).with_context(|| format!("copying {} to {}", ko.display(), p.display()))?;
    if layout.destdir == Path::new("/") {
        toolchain::run(Command::new("depmod").arg("-a").arg(release)).context("depmod")?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_get_the_installed_paths_and_nothing_is_left_unfilled() {
        let dir = std::env::temp_dir().join(format!("ugds-dist-test-{}", std::process::id()));
        let layout = Layout { destdir: dir.clone(), prefix: "/opt/ugds".into() };
        let files = install_files(&layout).unwrap();
        assert_eq!(files.len(), 4);
        let unit = fs::read_to_string(dir.join("opt/ugds/lib/systemd/system/ugds-bind.service")).unwrap();
        assert!(unit.contains("ExecStart=/opt/ugds/bin/ugds bind --config /etc/ugds/bind.conf"), "{unit}");
        assert!(unit.contains("ExecStartPre=/sbin/modprobe ugds"), "{unit}");
        let rule = fs::read_to_string(dir.join("etc/udev/rules.d/70-ugds.rules")).unwrap();
        assert!(rule.contains("RUN+=\"/opt/ugds/bin/ugds access /dev/%k\""), "{rule}");
        for f in &files {
            let text = fs::read_to_string(f).unwrap();
            assert!(!text.contains("@BINDIR@") && !text.contains("@DOCDIR@"), "{} keeps a placeholder", f.display());
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
