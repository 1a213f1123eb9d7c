//! Calls the built `libcufile_ugds.so` through its C symbols (dlopen + dlsym), as a cuFile
//! client does: the properties, version, parameter and statistics functions with C's types
//! (`bool` as one byte, enums as `int`). The library loaded this way has its own copy of the
//! process-wide state, separate from the crate linked into this test.

use std::ffi::{c_char, c_int, c_void, CStr};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Status {
    err: c_int,
    cu_err: c_int,
}

const SUCCESS: c_int = 0;
const INVALID_VALUE: c_int = 5022;
const ALREADY_OPEN: c_int = 5026;
const NOT_INITIALIZED: c_int = 5001;

struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let exe = std::env::current_exe().unwrap();
        let path = exe.parent().unwrap().join("libcufile_ugds.so");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a path to the shared library cargo built for this test.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        Lib(h)
    }

    /// The address of `name`, as a function pointer of type `F`.
    ///
    /// # Safety
    ///
    /// `F` must be an `extern "C" fn` type matching the symbol's C signature.
    unsafe fn sym<F: Copy>(&self, name: &CStr) -> F {
        // SAFETY: a handle from dlopen and a C string.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!p.is_null(), "{name:?} not exported");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: the caller names the right function type.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

#[test]
fn c_callers_see_cufile_semantics() {
    let lib = Lib::open();
    // SAFETY: each type is the function's signature in cufile.h (C `bool` is one byte, enums
    // are `int`, `CUfileError_t` is two ints returned by value).
    unsafe {
        let get_version: extern "C" fn(*mut c_int) -> Status = lib.sym(c"cuFileGetVersion");
        let set_poll: extern "C" fn(bool, usize) -> Status = lib.sym(c"cuFileDriverSetPollMode");
        let get_props: extern "C" fn(*mut [u8; 56]) -> Status = lib.sym(c"cuFileDriverGetProperties");
        let get_bool: extern "C" fn(c_int, *mut bool) -> Status = lib.sym(c"cuFileGetParameterBool");
        let set_bool: extern "C" fn(c_int, bool) -> Status = lib.sym(c"cuFileSetParameterBool");
        let get_str: extern "C" fn(c_int, *mut c_char, c_int) -> Status = lib.sym(c"cuFileGetParameterString");
        let set_size: extern "C" fn(c_int, usize) -> Status = lib.sym(c"cuFileSetParameterSizeT");
        let stats_start: extern "C" fn() -> Status = lib.sym(c"cuFileStatsStart");
        let set_level: extern "C" fn(c_int) -> Status = lib.sym(c"cuFileSetStatsLevel");

        let mut v = 0;
        assert_eq!(get_version(&mut v).err, SUCCESS);
        assert_eq!(v, 1150);
        assert_eq!(get_version(std::ptr::null_mut()).err, INVALID_VALUE);

        // Parameters, before anything opened the driver.
        assert_eq!(set_bool(5, true).err, SUCCESS);
        let mut b = false;
        assert_eq!(get_bool(5, &mut b).err, SUCCESS);
        assert!(b);
        let mut s = [0 as c_char; 16];
        assert_eq!(get_str(0, s.as_mut_ptr(), 16).err, SUCCESS);
        assert_eq!(CStr::from_ptr(s.as_ptr()).to_str().unwrap(), "ERROR");
        assert_eq!(set_level(1).err, SUCCESS);
        assert_eq!(stats_start().err, NOT_INITIALIZED);

        // GetProperties opens the driver: parameters are frozen, tunables still apply.
        let mut p = [0u8; 56];
        assert_eq!(get_props(&mut p).err, SUCCESS);
        let poll_thresh = u64::from_le_bytes(p[8..16].try_into().unwrap());
        assert_eq!(poll_thresh, 16384);
        assert_eq!(set_size(2, 4).err, ALREADY_OPEN);
        assert_eq!(set_poll(false, 32).err, SUCCESS);
        assert_eq!(get_props(&mut p).err, SUCCESS);
        let dcontrol = u32::from_le_bytes(p[28..32].try_into().unwrap());
        assert_eq!(dcontrol & 1, 0, "poll mode off");
        assert_eq!(u64::from_le_bytes(p[8..16].try_into().unwrap()), 32);
        assert_eq!(stats_start().err, SUCCESS);
    }
}
