//! Gives `libcufile_ugds.so` its SONAME, `libcufile_ugds.so.0`, so that a program relinked with
//! `-lcufile_ugds` finds it again at run time under `PREFIX/lib`. The drop-in copy installed as
//! `PREFIX/lib/ugds-cufile/libcufile.so.0` gets the SONAME `libcufile.so.0` at install time
//! (`cargo xtask install-lib` rewrites it), so both names work from one build.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcufile_ugds.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
