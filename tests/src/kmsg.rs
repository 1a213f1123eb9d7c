//! Reading the kernel log from a point on, and spotting warnings, oopses and lockdep splats.

use anyhow::{Context, Result};
use std::ffi::CString;

/// Text that means the kernel is unhappy; any of it in the log fails the test that caused it.
pub const BAD_PATTERNS: &[&str] = &[
    "WARNING:",
    "BUG:",
    "Oops",
    "Call Trace",
    "general protection fault",
    "UBSAN:",
    "KASAN:",
    "possible circular locking",
    "possible recursive locking",
    "inconsistent lock state",
    "INFO: task",
    "self-detected stall",
    "Kernel panic",
    "refcount_t:",
    "list_add corruption",
    "list_del corruption",
    "sleeping function called from invalid context",
    "DMAR: DRHD: handling fault",
];

/// A reader positioned at the end of the kernel log when created.
pub struct KmsgWatch {
    fd: i32,
}

impl KmsgWatch {
    /// Opens /dev/kmsg and skips what is already there.
    pub fn new() -> Result<Self> {
        let path = CString::new("/dev/kmsg")?;
        // SAFETY: a valid NUL-terminated path; the fd is owned by the returned value.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("opening /dev/kmsg");
        }
        // SAFETY: fd is open; SEEK_END on /dev/kmsg positions after the newest record.
        unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
        Ok(KmsgWatch { fd })
    }

    /// The messages logged since the last call (or creation).
    pub fn new_messages(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            // SAFETY: buf is a valid writable buffer of its length.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EPIPE) {
                    continue; // records were overwritten; carry on from the oldest
                }
                break; // EAGAIN: no more records
            }
            if n == 0 {
                break;
            }
            // CAST: n > 0 here.
            let rec = String::from_utf8_lossy(&buf[..n as usize]);
            let msg = rec.split_once(';').map(|(_, m)| m).unwrap_or(&rec);
            out.push(msg.lines().next().unwrap_or("").to_string());
        }
        out
    }
}

impl Drop for KmsgWatch {
    fn drop(&mut self) {
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

thread_local! {
    static EXPECTED: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Declares that the running test provokes kernel messages containing `pattern` on purpose
/// (for example an IOMMU fault for a stray DMA address); cleared by [`bad_lines`].
pub fn expect(pattern: &'static str) {
    EXPECTED.with(|e| e.borrow_mut().push(pattern));
}

/// The lines among `msgs` that match a bad pattern and were not expected by the test; clears
/// the expectations.
pub fn bad_lines(msgs: &[String]) -> Vec<String> {
    let expected = EXPECTED.with(|e| std::mem::take(&mut *e.borrow_mut()));
    msgs.iter()
        .filter(|m| BAD_PATTERNS.iter().any(|p| m.contains(p)))
        .filter(|m| !expected.iter().any(|p| m.contains(p)))
        .cloned()
        .collect()
}
