//! `cuFileGetBARSizeInKB`: the size of a GPU's BAR1 (the aperture through which peers such as
//! an NVMe SSD reach GPU memory). The CUDA driver API (loaded at run time) names the device's
//! PCI address; the size is that of the device's second memory region in sysfs.
//!
//! cufile.h's comment says MiB but the function's name says KiB; NVIDIA's libcufile 1.15 reports
//! KiB (268435456 for an H200's 256 GiB BAR1, measured), and so do we.

use crate::config::{driver_opened, guard, ok, status};
use cudarc::driver::sys as cu;
use std::ffi::{c_char, c_int, CStr};
use ugds::capi::uGDSError_t;
use ugds::capi::uGDSOpError::{self, *};

/// Size in bytes of region `n` (0-based) of a sysfs `resource` file (one line per resource:
/// start, end, flags, in hex): the `n`th non-empty line among the six standard BARs. NVIDIA's
/// "BAR1" is region 1 in this sense, not PCI resource index 1: a 64-bit BAR0 takes indices 0
/// and 1 (the H200 here has BAR1 at index 2), a 32-bit one only index 0 (BAR1 at index 1).
pub fn region_bytes(resource: &str, n: usize) -> Option<u64> {
    let size = |line: &str| -> Option<u64> {
        let mut f = line.split_whitespace().map(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16));
        let (start, end) = (f.next()?.ok()?, f.next()?.ok()?);
        (end > start).then(|| end - start + 1)
    };
    resource.lines().take(6).filter_map(size).nth(n)
}

/// The sysfs name of a CUDA PCI bus id: lower case, a four-digit domain (CUDA may print eight).
pub fn sysfs_name(bus_id: &str) -> Option<String> {
    let mut parts = bus_id.trim().splitn(2, ':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let rest = parts.next()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

fn cuda(op_err: uGDSOpError, r: cu::CUresult) -> Result<(), uGDSError_t> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        // CAST: CUresult is a C enum (int).
        Err(uGDSError_t { err: op_err, cu_err: r as c_int })
    }
}

/// BAR1 of GPU `index`, in KiB.
fn bar1_kb(index: c_int) -> Result<usize, uGDSError_t> {
    // SAFETY: only tries to open libcuda.
    if !unsafe { cu::is_culib_present() } {
        // No CUDA driver: no GPU to report on.
        return Err(status(UGDS_DEVICE_NOT_FOUND));
    }
    let mut dev = 0;
    let mut buf = [0 as c_char; 64];
    // SAFETY: plain driver calls with out-pointers to locals; the buffer's length is passed.
    unsafe {
        cuda(UGDS_CUDA_DRIVER_ERROR, cu::cuInit(0))?;
        let r = cu::cuDeviceGet(&mut dev, index);
        if r == cu::CUresult::CUDA_ERROR_INVALID_DEVICE {
            return Err(uGDSError_t { err: UGDS_INVALID_VALUE, cu_err: r as c_int });
        }
        cuda(UGDS_CUDA_DRIVER_ERROR, r)?;
        cuda(UGDS_CUDA_DRIVER_ERROR, cu::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev))?;
    }
    // SAFETY: the driver NUL-terminates within the length (the buffer is zeroed besides).
    let id = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    let name = sysfs_name(&id).ok_or(status(UGDS_INTERNAL_ERROR))?;
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{name}/resource"))
        .map_err(|_| status(UGDS_PLATFORM_NOT_SUPPORTED))?;
    let bytes = region_bytes(&text, 1).ok_or(status(UGDS_PLATFORM_NOT_SUPPORTED))?;
    usize::try_from(bytes / 1024).map_err(|_| status(UGDS_INTERNAL_ERROR))
}

/// Writes GPU `gpuIndex`'s BAR1 size in KiB to `barSize`.
///
/// Opens the driver implicitly, as NVIDIA's library does. Errors: NULL `barSize` or a negative
/// or unknown index: `CU_FILE_INVALID_VALUE` (the latter with the CUDA error in `cu_err`); no
/// CUDA driver on this machine: `CU_FILE_DEVICE_NOT_FOUND`; another CUDA failure:
/// `CU_FILE_CUDA_DRIVER_ERROR`; no sysfs entry: `CU_FILE_PLATFORM_NOT_SUPPORTED`.
///
/// # Safety
///
/// `barSize` must be NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetBARSizeInKB(gpuIndex: c_int, barSize: *mut usize) -> uGDSError_t {
    if barSize.is_null() || gpuIndex < 0 {
        return status(UGDS_INVALID_VALUE);
    }
    driver_opened();
    guard(|| match bar1_kb(gpuIndex) {
        Ok(kb) => {
            // SAFETY: checked non-null.
            unsafe { barSize.write(kb) };
            ok()
        }
        Err(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{driver_closed, driver_is_open, test_lock};

    #[test]
    fn finds_bar1_after_a_32_bit_bar0() {
        // BAR0 32-bit 16 MiB; BAR1 64-bit 128 GiB (indices 1-2); BAR3 32 MiB.
        let text = "0x00000000e2000000 0x00000000e2ffffff 0x0000000000040200\n\
                    0x0000220000000000 0x0000221fffffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000222000000000 0x0000222001ffffff 0x000000000014220c\n";
        assert_eq!(region_bytes(text, 0), Some(16 << 20));
        assert_eq!(region_bytes(text, 1), Some(128 << 30));
        assert_eq!(region_bytes(text, 2), Some(32 << 20));
        assert_eq!(region_bytes(text, 3), None);
        assert_eq!(region_bytes("garbage here\n", 0), None);
    }

    #[test]
    fn finds_bar1_after_a_64_bit_bar0() {
        // The H200 of the GPU machine (regression: BAR1 is PCI resource 2 there); NVIDIA's
        // cuFileGetBARSizeInKB reported 268435456 KiB for it.
        let text = "0x0000104002000000 0x0000104002ffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000100000000000 0x0000103fffffffff 0x000000000014220c\n";
        assert_eq!(region_bytes(text, 1).map(|b| b / 1024), Some(268_435_456));
    }

    #[test]
    fn sysfs_names() {
        assert_eq!(sysfs_name("0000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(sysfs_name("00000000:C1:00.0").as_deref(), Some("0000:c1:00.0"));
        assert_eq!(sysfs_name("nonsense"), None);
    }

    #[test]
    fn bad_arguments_and_implicit_open() {
        let _l = test_lock();
        let mut v = 0usize;
        // SAFETY: NULL is refused; a local otherwise.
        unsafe {
            assert_eq!(cuFileGetBARSizeInKB(0, std::ptr::null_mut()).err, UGDS_INVALID_VALUE);
            assert_eq!(cuFileGetBARSizeInKB(-1, &mut v).err, UGDS_INVALID_VALUE);
            driver_closed();
            let r = cuFileGetBARSizeInKB(0, &mut v);
            assert!(driver_is_open());
            // SAFETY: only tries to open libcuda.
            if cu::is_culib_present() {
                // A machine with CUDA: a size, or a CUDA error (no device), never a crash.
                assert!(r.err == UGDS_SUCCESS || r.err != UGDS_DEVICE_NOT_FOUND, "{r:?}");
                if r.err == UGDS_SUCCESS {
                    assert!(v > 0);
                }
            } else {
                assert_eq!(r.err, UGDS_DEVICE_NOT_FOUND);
            }
            driver_closed();
        }
    }
}
