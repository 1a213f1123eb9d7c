//! The thin safe layer over the module-local bindings, shaped like upstream Rust-for-Linux
//! abstractions (`kernel::pci`, `kernel::io`) so each file can be swapped for upstream later.
//! Everything unsafe in the module lives here.

pub(crate) mod io;
pub(crate) mod pci;
