//! The thin safe layer over the module-local bindings, shaped like upstream Rust-for-Linux
//! abstractions (`kernel::pci`, `kernel::io`, `kernel::dma`, `kernel::miscdevice`, ...) so each
//! file can be swapped for upstream later; kmod/README.md maps every file to the abstraction it
//! stands in for.
//!
//! The boundary: only `shim/` names `crate::bindings` or holds a raw pointer to a kernel
//! struct. Shim files hand each other shim types (`&pci::Device`, `&mut mm::Vma`); the raw
//! accessors on them are `pub(super)`, visible inside `shim/` only. The modules above (ctrl,
//! admin, qpair, registry, device, chardev, table, ugds_main) see shim types and the `kernel`
//! crate only.
//!
//! Kernel version: these files are written against Linux 6.12 (its C API and its `kernel`
//! crate). The version is checked in one place, kmod/Kbuild, before anything is compiled.
//!
//! Nearly all `unsafe` in the module lives here.

pub(crate) mod chrdev;
pub(crate) mod delay;
pub(crate) mod dma;
pub(crate) mod dmabuf;
pub(crate) mod io;
pub(crate) mod irq;
pub(crate) mod mm;
pub(crate) mod pci;
pub(crate) mod pin;
pub(crate) mod scatterlist;
pub(crate) mod task;
pub(crate) mod uaccess;

/// Plain old data: may be copied from arbitrary bytes (user memory, memory a device wrote) and
/// copied out as bytes. It stands in for upstream's `FromBytes + AsBytes` pair (6.12:
/// `kernel::types`, 6.15+: `kernel::transmute`).
///
/// # Safety
///
/// Implementors are `#[repr(C)]` (or primitive), contain no padding and no pointers or
/// references, and every bit pattern is a valid value.
pub(crate) unsafe trait Plain: Copy + 'static {}

macro_rules! impl_plain {
    ($($t:ty),*) => {
        // SAFETY: primitive integers: no padding, every bit pattern valid.
        $(unsafe impl Plain for $t {})*
    };
}
impl_plain!(u8, u16, u32, u64, i32);

// SAFETY: an array of plain values has no padding between elements (size is a multiple of
// alignment) and every bit pattern of each element is valid.
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}
