//! Every function CUDA 13.0's cufile.h declares (plus `cuFileDriverClose_v2`, which the header
//! maps `cuFileDriverClose` to) is exported by the built `libcufile_ugds.so`. The list is data:
//! `cufile_symbols.txt`, one name a line, checked against the header on the GPU machine.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn expected() -> Vec<String> {
    let text = include_str!("../cufile_symbols.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// The shared library cargo built with this test: `target/<profile>/deps/` (or its parent when
/// `cargo build` uplifted it); the newest one wins.
fn shared_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    [deps.join("libcufile_ugds.so"), deps.parent().map(|p| p.join("libcufile_ugds.so")).unwrap_or_default()]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("libcufile_ugds.so next to the test binary (cargo builds the cdylib with the tests)")
}

/// Defined functions in the dynamic symbol table (`nm -D --defined-only`).
fn exported(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib).output().expect("running nm (binutils)");
    assert!(out.status.success(), "nm failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then(|| name.split('@').next().unwrap_or(name).to_owned())
        })
        .collect()
}

#[test]
fn symbol_list_is_the_cuda_13_0_set() {
    let names = expected();
    let unique: BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate names in cufile_symbols.txt");
    // 42 declared by cufile.h of CUDA 13.0 (libcufile 1.15), plus cuFileDriverClose_v2.
    assert_eq!(names.len(), 43);
    assert!(names.iter().all(|n| n.starts_with("cuFile")));
}

#[test]
fn shim_exports_every_cufile_function() {
    let lib = shared_library();
    let have = exported(&lib);
    let missing: Vec<_> = expected().into_iter().filter(|n| !have.contains(n)).collect();
    assert!(missing.is_empty(), "{} does not export: {missing:?}", lib.display());
}
