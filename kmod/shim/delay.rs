//! Sleeping and bounded polling, process context only (shaped like upstream
//! `kernel::time::delay::fsleep`, 6.15+, and `kernel::io::poll::read_poll_timeout`, 6.17+).

use crate::bindings;
use kernel::prelude::*;

/// TASK_UNINTERRUPTIBLE, from the target kernel's headers (bindgen).
const TASK_UNINTERRUPTIBLE: u32 = bindings::TASK_UNINTERRUPTIBLE;

/// Sleeps for at least `us` microseconds: up to 20 ms on a high-resolution timer
/// (`usleep_range(us, 2 * us)`), longer with `msleep`. This is C's `fsleep` (a static inline in
/// linux/delay.h, so not callable from Rust on 6.12) without its busy-wait branch.
///
/// Must run in process context with no spinlock held (a sleeping mutex is fine).
pub(crate) fn fsleep(us: u32) {
    if us == 0 {
        return;
    }
    if us <= 20_000 {
        // SAFETY: no memory-safety precondition; sleeping in process context is this function's
        // documented contract (upstream's `fsleep` is a safe function for the same reason).
        unsafe { bindings::usleep_range_state(us as _, 2 * us as kernel::ffi::c_ulong, TASK_UNINTERRUPTIBLE) };
    } else {
        // SAFETY: no memory-safety precondition; process context per this function's contract.
        unsafe { bindings::msleep(us.div_ceil(1000)) };
    }
}

/// Calls `op` until `cond` accepts its value, sleeping `sleep_us` between calls, for at most
/// `timeout_us` of wall-clock time (CLOCK_MONOTONIC, so slow sleeps do not stretch the bound).
///
/// Errors: what `op` returns (polling stops at once), `ETIMEDOUT` when the time is up.
pub(crate) fn read_poll_timeout<T>(
    mut op: impl FnMut() -> Result<T>,
    mut cond: impl FnMut(&T) -> bool,
    sleep_us: u32,
    timeout_us: u64,
) -> Result<T> {
    let start = monotonic_ns();
    let limit_ns = i64::try_from(timeout_us.saturating_mul(1000)).unwrap_or(i64::MAX);
    loop {
        let v = op()?;
        if cond(&v) {
            return Ok(v);
        }
        if monotonic_ns().saturating_sub(start) > limit_ns {
            return Err(crate::errno::etimedout());
        }
        fsleep(sleep_us);
    }
}

/// CLOCK_MONOTONIC in nanoseconds (C's `ktime_get`, exported on every series, where the
/// `kernel` crate's clock type differs: `Ktime` on 6.12, `Instant<Monotonic>` later).
fn monotonic_ns() -> i64 {
    // SAFETY: no precondition; `ktime_get` reads the monotonic clock from any context.
    unsafe { bindings::ktime_get() }
}
