//! Copying ioctl argument structs to and from user space (over `kernel::uaccess`; upstream's
//! `UserSliceReader::read` / `UserSliceWriter::write` do the same for `FromBytes`/`AsBytes`).

use super::Plain;
use kernel::prelude::*;
use kernel::uaccess::UserSlice;

/// The user memory at address `addr`, `len` bytes (6.12 takes the address as `usize`, later
/// series as a `UserPtr`).
fn user_slice(addr: usize, len: usize) -> UserSlice {
    #[cfg(ugds_linux_6_12)]
    let ptr = addr;
    #[cfg(not(ugds_linux_6_12))]
    let ptr = kernel::uaccess::UserPtr::from_addr(addr);
    UserSlice::new(ptr, len)
}

/// Reads a `T` from user address `arg` (EFAULT when unmapped).
pub(crate) fn read_arg<T: Plain>(arg: usize) -> Result<T> {
    let mut v = core::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: `v` is `size_of::<T>()` writable bytes, zero-initialised.
    let bytes = unsafe { core::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), core::mem::size_of::<T>()) };
    user_slice(arg, bytes.len()).reader().read_slice(bytes)?;
    // SAFETY: every bit pattern is a valid `T` (`Plain`), and all bytes were written.
    Ok(unsafe { v.assume_init() })
}

/// Writes `v` to user address `arg` (EFAULT when unmapped).
pub(crate) fn write_arg<T: Plain>(arg: usize, v: &T) -> Result {
    // SAFETY: `T` has no padding (`Plain`), so all its bytes are initialised.
    let bytes = unsafe { core::slice::from_raw_parts((v as *const T).cast::<u8>(), core::mem::size_of::<T>()) };
    user_slice(arg, bytes.len()).writer().write_slice(bytes)
}

/// Writes a slice of `T` to user address `arg`.
pub(crate) fn write_slice<T: Plain>(arg: usize, v: &[T]) -> Result {
    // SAFETY: `T` has no padding (`Plain`), so the `v.len()` contiguous values are all
    // initialised bytes.
    let bytes = unsafe { core::slice::from_raw_parts(v.as_ptr().cast::<u8>(), core::mem::size_of_val(v)) };
    user_slice(arg, bytes.len()).writer().write_slice(bytes)
}
