//! The thin safe layer over the module-local bindings, shaped like upstream Rust-for-Linux
//! abstractions (`kernel::pci`, `kernel::io`, `kernel::dma`, `kernel::miscdevice`; `chrdev`
//! extends the last with the device class and number region of the C chrdev API) so each file
//! can be swapped for upstream later. Nearly all `unsafe` in the module lives here.

pub(crate) mod dma;
pub(crate) mod dmabuf;
pub(crate) mod io;
pub(crate) mod irq;
pub(crate) mod chrdev;
pub(crate) mod pci;
pub(crate) mod pin;
pub(crate) mod uaccess;
