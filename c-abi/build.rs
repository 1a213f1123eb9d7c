//! Gives `libugds.so` its SONAME, `libugds.so.0`: programs linked with `-lugds` record that
//! name, and `ctypes.util.find_library("ugds")` reports it. Built as `libugds_c.so` and installed
//! as `libugds.so.0.1.0` with the symlinks `libugds.so.0` and `libugds.so` (`cargo xtask install-lib`).
//!
//! Plain `rustc-link-arg`, not `rustc-cdylib-link-arg`: cargo passes a dependency's cdylib link
//! arguments on to every cdylib that depends on it (kept for compatibility), after the
//! dependent's own, so `libcufile_ugds.so` would end up named `libugds.so.0`. The plain form
//! stays within this package. It also gives this package's test binaries a DT_SONAME, which is
//! harmless: the loader uses an executable's SONAME only to match a later
//! `dlopen` of that very name, and nothing here dlopens `libugds.so.0`.

fn main() {
    println!("cargo:rustc-link-arg=-Wl,-soname,libugds.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
