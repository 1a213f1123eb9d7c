//! The kernel side of `ugds doctor`: lockdown, Secure Boot, the kernel series, and whether the
//! installed and loaded ugds.ko match the running kernel. Each reads files under a root, so the
//! tests run them on a fake tree.

use super::{finding, Finding, Verdict};
use std::path::Path;

/// The kernel series ugds.ko is written for (kmod/README.md, "The kernel version").
pub const SUPPORTED_SERIES: [&str; 2] = ["6.12", "7.3"];

/// The EFI variable holding the Secure Boot state (4 bytes of attributes, then the value).
const SECURE_BOOT_VAR: &str = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

const SIGN_FIX: &str = "sign ugds.ko with a Machine Owner Key (sign-file, mokutil --import; docs/operations.md, \
                        \"Secure Boot and module signing\")";

fn read(root: &Path, p: &str) -> Option<String> {
    std::fs::read_to_string(root.join(p)).ok().map(|s| s.trim().to_string())
}

/// The selected lockdown mode of `[none] integrity confidentiality`.
pub fn lockdown_mode(s: &str) -> Option<&str> {
    s.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// `6.12` of `6.12.9-amd64`.
pub fn series(release: &str) -> Option<String> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let (a, b) = (it.next()?, it.next()?);
    (!a.is_empty() && !b.is_empty()).then(|| format!("{a}.{b}"))
}

/// The value of `key` in a module's `.modinfo` strings (`key=value\0`), scanning the file.
pub fn modinfo(ko: &[u8], key: &str) -> Option<String> {
    let pat = format!("{key}=");
    ko.split(|b| *b == 0).find_map(|s| s.strip_prefix(pat.as_bytes())).map(|v| String::from_utf8_lossy(v).into_owned())
}

fn lockdown(root: &Path) -> Finding {
    match read(root, "sys/kernel/security/lockdown") {
        None => finding("lockdown", Verdict::Info, "no lockdown LSM (/sys/kernel/security/lockdown)", ""),
        Some(s) => match lockdown_mode(&s) {
            Some("none") | None => finding("lockdown", Verdict::Ok, "lockdown is off: unsigned modules load", ""),
            Some(m) => finding(
                "lockdown",
                Verdict::Warn,
                format!("lockdown is {m}: the kernel loads only signed modules"),
                SIGN_FIX,
            ),
        },
    }
}

fn secure_boot(root: &Path) -> Finding {
    if !root.join("sys/firmware/efi").exists() {
        return finding("Secure Boot", Verdict::Info, "not booted through EFI: no Secure Boot", "");
    }
    match std::fs::read(root.join(SECURE_BOOT_VAR)).ok().and_then(|v| v.get(4).copied()) {
        Some(1) => finding(
            "Secure Boot",
            Verdict::Warn,
            "Secure Boot is on: ugds.ko must be signed with a key the kernel trusts",
            SIGN_FIX,
        ),
        Some(_) => finding("Secure Boot", Verdict::Ok, "Secure Boot is off", ""),
        None => finding("Secure Boot", Verdict::Info, "EFI boot, but the SecureBoot variable is not readable", ""),
    }
}

fn kernel_series(release: &str) -> Finding {
    match series(release) {
        Some(s) if SUPPORTED_SERIES.contains(&s.as_str()) => {
            finding("kernel series", Verdict::Ok, format!("Linux {s} is a series ugds.ko is written for"), "")
        }
        s => finding(
            "kernel series",
            Verdict::No,
            format!(
                "Linux {} is not a series ugds.ko is written for ({}); its build refuses other series",
                s.unwrap_or_else(|| release.to_string()),
                SUPPORTED_SERIES.join(" and ")
            ),
            "boot a 6.12 or 7.3 kernel (the fallback path serves files and block devices meanwhile)",
        ),
    }
}

fn module_match(root: &Path, release: &str) -> Finding {
    let path = format!("lib/modules/{release}/extra/ugds.ko");
    let loaded = read(root, "sys/module/ugds/srcversion");
    let Ok(ko) = std::fs::read(root.join(&path)) else {
        return match loaded {
            Some(_) => finding(
                "module build",
                Verdict::Info,
                format!("ugds.ko is loaded, but none is installed as /{path} (loaded by hand?)"),
                "cargo xtask install installs it there, for modprobe at boot",
            ),
            None => finding(
                "module build",
                Verdict::Warn,
                format!("no ugds.ko installed for Linux {release} (/{path})"),
                "cargo xtask install (builds it for the running kernel)",
            ),
        };
    };
    let vermagic = modinfo(&ko, "vermagic").unwrap_or_default();
    let built_for = vermagic.split_whitespace().next().unwrap_or("");
    if built_for != release {
        return finding(
            "module build",
            Verdict::No,
            format!("/{path} was built for Linux {built_for:?}, but {release} is running"),
            "rebuild it for this kernel: cargo xtask install",
        );
    }
    let installed = modinfo(&ko, "srcversion");
    match loaded {
        None => finding(
            "module build",
            Verdict::Warn,
            format!("/{path} matches the running kernel but is not loaded"),
            "modprobe ugds",
        ),
        Some(l) if installed.as_deref() == Some(l.as_str()) => finding(
            "module build",
            Verdict::Ok,
            format!("the loaded ugds.ko is /{path}, built for the running kernel (srcversion {l})"),
            "",
        ),
        Some(l) => finding(
            "module build",
            Verdict::Warn,
            format!(
                "the loaded ugds.ko (srcversion {l}) is not /{path} (srcversion {})",
                installed.as_deref().unwrap_or("unknown")
            ),
            "load the installed one: rmmod ugds && modprobe ugds (close every ugds user first)",
        ),
    }
}

/// Every kernel-side finding, reading files under `root` (`/` on the machine).
pub fn findings(root: &Path) -> Vec<Finding> {
    let release = read(root, "proc/sys/kernel/osrelease").unwrap_or_default();
    vec![lockdown(root), secure_boot(root), kernel_series(&release), module_match(root, &release)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, v) in files {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        d
    }

    fn verdict(f: &[Finding], topic: &str) -> (Verdict, String) {
        let x = f.iter().find(|x| x.topic == topic).unwrap();
        (x.verdict, x.detail.clone())
    }

    const KO: &[u8] = b"\x7fELF...\0license=GPL\0srcversion=ABC123\0vermagic=6.12.9-amd64 SMP preempt mod_unload \0";

    #[test]
    fn parsers() {
        assert_eq!(lockdown_mode("none [integrity] confidentiality"), Some("integrity"));
        assert_eq!(lockdown_mode("[none] integrity confidentiality"), Some("none"));
        assert_eq!(series("6.12.9-amd64").as_deref(), Some("6.12"));
        assert_eq!(series("7.3.0").as_deref(), Some("7.3"));
        assert_eq!(series("garbage"), None);
        assert_eq!(modinfo(KO, "srcversion").as_deref(), Some("ABC123"));
        assert_eq!(modinfo(KO, "vermagic").as_deref(), Some("6.12.9-amd64 SMP preempt mod_unload "));
        assert_eq!(modinfo(KO, "name"), None);
    }

    #[test]
    fn a_matching_loaded_module_on_a_supported_kernel_is_ok() {
        let t = tree(&[
            ("proc/sys/kernel/osrelease", b"6.12.9-amd64\n"),
            ("sys/kernel/security/lockdown", b"[none] integrity confidentiality\n"),
            ("lib/modules/6.12.9-amd64/extra/ugds.ko", KO),
            ("sys/module/ugds/srcversion", b"ABC123\n"),
        ]);
        let f = findings(t.path());
        assert_eq!(verdict(&f, "lockdown").0, Verdict::Ok);
        assert_eq!(verdict(&f, "Secure Boot").0, Verdict::Info);
        assert_eq!(verdict(&f, "kernel series").0, Verdict::Ok);
        assert_eq!(verdict(&f, "module build").0, Verdict::Ok, "{f:?}");
    }

    #[test]
    fn mismatches_lockdown_and_secure_boot_say_what_to_do() {
        let t = tree(&[
            ("proc/sys/kernel/osrelease", b"6.14.1\n"),
            ("sys/kernel/security/lockdown", b"none [integrity] confidentiality\n"),
            ("sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c", b"\x06\0\0\0\x01"),
            ("lib/modules/6.14.1/extra/ugds.ko", KO),
        ]);
        let f = findings(t.path());
        assert_eq!(
            verdict(&f, "lockdown"),
            (Verdict::Warn, "lockdown is integrity: the kernel loads only signed modules".into())
        );
        assert_eq!(verdict(&f, "Secure Boot").0, Verdict::Warn);
        assert_eq!(verdict(&f, "kernel series").0, Verdict::No);
        let (v, d) = verdict(&f, "module build");
        assert_eq!(v, Verdict::No);
        assert!(d.contains("built for Linux \"6.12.9-amd64\", but 6.14.1 is running"), "{d}");
        for x in &f {
            if matches!(x.verdict, Verdict::No | Verdict::Warn) {
                assert!(!x.fix.is_empty(), "{x:?}");
            }
        }
        // Loaded, but another build than the installed one.
        let t = tree(&[
            ("proc/sys/kernel/osrelease", b"6.12.9-amd64\n"),
            ("lib/modules/6.12.9-amd64/extra/ugds.ko", KO),
            ("sys/module/ugds/srcversion", b"OTHER\n"),
        ]);
        let (v, d) = verdict(&findings(t.path()), "module build");
        assert_eq!(v, Verdict::Warn);
        assert!(d.contains("srcversion OTHER"), "{d}");
    }
}
