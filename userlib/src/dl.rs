//! Shared libraries loaded at run time. The HIP runtime and rdma-core are optional: they are
//! opened with `dlopen` when first needed, so the library builds and runs without them and says
//! by name what is missing. Their symbols become typed function pointers here, in one place.
//! Plain `libc::dlopen`/`dlsym` rather than the `libloading` crate: three calls, no new
//! dependency, and the libraries are never unloaded once a pointer was taken.

use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;

/// A shared library opened with `dlopen`. It has no `Drop`: a library whose functions are used
/// stays loaded for the process's life; only [`Library::close`] unloads one.
///
/// # Invariants
///
/// `handle` is a live handle returned by `dlopen`.
#[derive(Debug)]
pub(crate) struct Library {
    handle: NonNull<c_void>,
}

// SAFETY: a dlopen handle is a process-wide token, not tied to the thread that opened it, and
// dlsym/dlclose may be called from any thread (POSIX requires them to be thread-safe).
unsafe impl Send for Library {}
// SAFETY: `&Library` only allows dlsym, which is thread-safe (see `Send`).
unsafe impl Sync for Library {}

impl Library {
    /// Opens `name` (a soname or a path), binding every symbol now and keeping them local.
    /// The error is the loader's message.
    pub(crate) fn open(name: &str) -> Result<Library, String> {
        let c = CString::new(name).map_err(|_| format!("{name:?}: the name contains a NUL byte"))?;
        // SAFETY: `c` is NUL-terminated; running the library's initialisers is what loading it
        // means.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        // INVARIANT: non-null means a live handle.
        NonNull::new(h).map(|handle| Library { handle }).ok_or_else(last_error)
    }

    fn address(&self, name: &CStr) -> Option<NonNull<c_void>> {
        // SAFETY: `handle` is live (invariant); `name` is NUL-terminated.
        NonNull::new(unsafe { libc::dlsym(self.handle.as_ptr(), name.as_ptr()) })
    }

    /// The exported function `name` as the function pointer type `F`; `None` when it is not
    /// exported.
    ///
    /// # Safety
    ///
    /// `F` is an `unsafe extern "C" fn` type that restates the C declaration of `name` in this
    /// library, and the library is not [`Library::close`]d while the pointer may be called.
    pub(crate) unsafe fn function<F: Copy>(&self, name: &CStr) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let p = self.address(name)?.as_ptr();
        // SAFETY: same size (checked at compile time); the caller vouches that `p` is a
        // function of type `F`.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// Unloads a library that turned out not to be the one wanted.
    ///
    /// # Safety
    ///
    /// No pointer taken from it by [`Library::function`] is called afterwards.
    pub(crate) unsafe fn close(self) {
        // SAFETY: a live handle (invariant), consumed here; the caller keeps no pointer into it.
        unsafe { libc::dlclose(self.handle.as_ptr()) };
    }
}

/// The loader's last error message on this thread.
fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays valid until the next
    // dl call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null and NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_libc_finds_a_function_and_names_what_is_missing() {
        let lib = Library::open("libc.so.6").unwrap();
        // SAFETY: never called (not exported).
        assert!(unsafe { lib.function::<unsafe extern "C" fn()>(c"no_such_symbol_in_libc") }.is_none());
        // SAFETY: `pid_t getpid(void)`; libc stays loaded (it is never closed here).
        let getpid: unsafe extern "C" fn() -> libc::pid_t = unsafe { lib.function(c"getpid") }.unwrap();
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() }, std::process::id() as libc::pid_t);
        let e = Library::open("libugds-no-such-library.so.9").unwrap_err();
        assert!(e.contains("libugds-no-such-library.so.9"), "{e}");
        assert!(Library::open("a\0b").unwrap_err().contains("NUL"));
    }
}
