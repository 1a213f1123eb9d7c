//! Rewrites the SONAME of a copy of a shared library, in place, to a name no longer than the
//! old one (the rest of the old string becomes NUL padding). The cuFile drop-in needs this: one
//! build of `libcufile_ugds.so` (SONAME `libcufile_ugds.so.0`, for programs relinked against it)
//! is also installed as `lib/ugds-cufile/libcufile.so.0`, whose SONAME must be `libcufile.so.0`
//! so that `ctypes.util.find_library("cufile")` names a file that exists in that directory.
//!
//! Linkers share string tails in `.dynstr` (a symbol `so.0` could point into the middle of
//! `libcufile_ugds.so.0`), so the rewrite first collects every reference into `.dynstr` (dynamic
//! entries, dynamic symbols, version definitions and needs) and refuses when any other one
//! points into the old string.

use anyhow::{bail, ensure, Context, Result};
use std::path::Path;

const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_SONAME: u64 = 14;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

fn rd<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N]> {
    let s = b.get(at..at + N).context("ELF file truncated")?;
    Ok(s.try_into().expect("N bytes"))
}
fn u16_at(b: &[u8], at: usize) -> Result<usize> {
    Ok(u16::from_le_bytes(rd(b, at)?) as usize)
}
fn u32_at(b: &[u8], at: usize) -> Result<u64> {
    Ok(u32::from_le_bytes(rd(b, at)?) as u64)
}
fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(rd(b, at)?))
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    info: usize,
}

fn sections(b: &[u8]) -> Result<Vec<Section>> {
    ensure!(b.get(..4) == Some(b"\x7fELF"), "not an ELF file");
    ensure!(b.get(4) == Some(&2) && b.get(5) == Some(&1), "only 64-bit little-endian ELF is handled");
    let shoff = u64_at(b, 0x28)? as usize;
    let shentsize = u16_at(b, 0x3a)?;
    let shnum = u16_at(b, 0x3c)?;
    ensure!(shentsize == 64, "unexpected section header size {shentsize}");
    (0..shnum)
        .map(|i| {
            let h = shoff + i * 64;
            Ok(Section {
                kind: u32_at(b, h + 4)? as u32,
                offset: u64_at(b, h + 24)? as usize,
                size: u64_at(b, h + 32)? as usize,
                link: u32_at(b, h + 40)? as usize,
                info: u32_at(b, h + 44)? as usize,
            })
        })
        .collect()
}

/// The SONAME's offset in the file and every other `.dynstr` offset referenced.
fn references(b: &[u8], secs: &[Section]) -> Result<(usize, usize, Vec<u64>)> {
    let dynamic = secs.iter().find(|s| s.kind == SHT_DYNAMIC).context("no .dynamic section")?;
    let dynstr_idx = dynamic.link;
    let dynstr = secs.get(dynstr_idx).context("bad .dynamic link")?;
    let mut soname = None;
    let mut refs = Vec::new();
    for e in (dynamic.offset..dynamic.offset + dynamic.size).step_by(16) {
        let (tag, val) = (u64_at(b, e)?, u64_at(b, e + 8)?);
        match tag {
            DT_NULL => break,
            DT_SONAME => soname = Some(val),
            DT_NEEDED | DT_RPATH | DT_RUNPATH => refs.push(val),
            _ => {}
        }
    }
    for s in secs.iter().filter(|s| s.link == dynstr_idx) {
        match s.kind {
            SHT_DYNSYM => {
                for e in (s.offset..s.offset + s.size).step_by(24) {
                    refs.push(u32_at(b, e)?);
                }
            }
            SHT_GNU_VERDEF => {
                let mut d = s.offset;
                for _ in 0..s.info {
                    let (cnt, aux, next) = (u16_at(b, d + 6)?, u32_at(b, d + 12)?, u32_at(b, d + 16)?);
                    let mut a = d + aux as usize;
                    for _ in 0..cnt {
                        refs.push(u32_at(b, a)?);
                        a += u32_at(b, a + 4)? as usize;
                    }
                    d += next as usize;
                }
            }
            SHT_GNU_VERNEED => {
                let mut n = s.offset;
                for _ in 0..s.info {
                    let (cnt, file, aux, next) =
                        (u16_at(b, n + 2)?, u32_at(b, n + 4)?, u32_at(b, n + 8)?, u32_at(b, n + 12)?);
                    refs.push(file);
                    let mut a = n + aux as usize;
                    for _ in 0..cnt {
                        refs.push(u32_at(b, a + 8)?);
                        a += u32_at(b, a + 12)? as usize;
                    }
                    n += next as usize;
                }
            }
            _ => {}
        }
    }
    let soname = soname.context("the library has no SONAME")? as usize;
    Ok((dynstr.offset + soname, soname, refs))
}

/// The current SONAME of the library at `path`.
pub fn read(path: &Path) -> Result<String> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (at, _, _) = references(&b, &sections(&b)?)?;
    let end = b[at..].iter().position(|&c| c == 0).context("unterminated SONAME")?;
    Ok(String::from_utf8_lossy(&b[at..at + end]).into_owned())
}

/// Sets the SONAME of the library at `path` to `name` (no longer than the current one).
pub fn set(path: &Path, name: &str) -> Result<()> {
    let mut b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (at, rel, refs) = references(&b, &sections(&b)?)?;
    let old_len = b[at..].iter().position(|&c| c == 0).context("unterminated SONAME")?;
    ensure!(!name.is_empty() && !name.contains('\0'), "bad SONAME {name:?}");
    if name.len() > old_len {
        bail!("{}: new SONAME {name:?} is longer than the old one ({old_len} bytes)", path.display());
    }
    let span = rel as u64..=(rel + old_len) as u64;
    if let Some(r) = refs.iter().find(|r| span.contains(r)) {
        bail!("{}: another .dynstr reference ({r}) shares the SONAME's bytes; not rewriting", path.display());
    }
    b[at..at + old_len].fill(0);
    b[at..at + name.len()].copy_from_slice(name.as_bytes());
    std::fs::write(path, &b).with_context(|| format!("writing {}", path.display()))?;
    let now = read(path)?;
    ensure!(now == name, "{}: SONAME reads {now:?} after rewriting it to {name:?}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Builds a small shared library with gcc (skipped where gcc is missing).
    fn build(dir: &Path, soname: &str) -> Option<std::path::PathBuf> {
        let src = dir.join("t.c");
        std::fs::write(&src, "int so_answer(void) { return 42; }\nint so0(void) { return 0; }\n").unwrap();
        let out = dir.join("libt.so");
        let ok = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&src)
            .arg(format!("-Wl,-soname,{soname}"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then_some(out)
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ugds-soname-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn rewrites_to_a_shorter_name_and_readelf_agrees() {
        let d = tmp("ok");
        let Some(lib) = build(&d, "libcufile_ugds.so.0") else { return eprintln!("no gcc: skipped") };
        assert_eq!(read(&lib).unwrap(), "libcufile_ugds.so.0");
        set(&lib, "libcufile.so.0").unwrap();
        assert_eq!(read(&lib).unwrap(), "libcufile.so.0");
        let out = Command::new("readelf").arg("-d").arg(&lib).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Library soname: [libcufile.so.0]"), "{text}");
        // The symbols are untouched.
        let nm = Command::new("nm").arg("-D").arg(&lib).output().unwrap();
        assert!(String::from_utf8_lossy(&nm.stdout).contains("so_answer"));
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn refuses_longer_names_and_non_elf() {
        let d = tmp("bad");
        std::fs::write(d.join("x"), b"not elf").unwrap();
        assert!(set(&d.join("x"), "a").is_err());
        let Some(lib) = build(&d, "libt.so.0") else { return eprintln!("no gcc: skipped") };
        assert!(set(&lib, "libmuchlonger.so.0").is_err());
        assert_eq!(read(&lib).unwrap(), "libt.so.0");
        std::fs::remove_dir_all(d).ok();
    }
}
