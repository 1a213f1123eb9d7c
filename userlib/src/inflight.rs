//! [`InFlight`]: the one token for "the device, the kernel or a GPU copy engine may still read or
//! write this memory" — a command that timed out and that no controller reset confirmed stopped,
//! an io_uring given up with requests in it, a copy queue that cannot say its copies are done.
//! Every path that gives up on data movement makes one and moves into it what that movement may
//! still touch (its leases, staging chunks, bounce buffers, copy queues, rings); every path above
//! passes it up with the error ([`Failed`]), adding what it holds in turn. Nothing a token holds
//! is ever dropped: a dropped token keeps all of it for the life of the process (and counts it,
//! see [`kept`]), so none of it goes back to a pool, is unmapped or is unpinned.
//!
//! A borrowed I/O lease (`Lease<&Buffer>`) cannot outlive its borrow, so a token keeps it by
//! leaving its count raised for good: the buffer then refuses CPU access and deregistration
//! (`RegistrationBusy`), and when dropped keeps its memory and its registrations (the module's
//! pin or dma-buf attachment) instead of releasing them. A [`crate::device::Registration`] is
//! therefore only ever released by a buffer with no I/O lease outstanding.

use crate::buffer::{Buffer, Lease};
use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens kept for good by this process (each one a failed I/O whose memory stays in use).
static KEPT: AtomicU64 = AtomicU64::new(0);

/// How many [`InFlight`] tokens this process has kept for good: I/Os that gave up while the
/// device, the kernel or a copy engine may still use their memory, which therefore stays
/// allocated, pinned and out of every pool.
pub fn kept() -> u64 {
    KEPT.load(Ordering::Relaxed)
}

/// Why data movement may still run after its I/O gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// A command timed out (or the controller faulted) and no reset confirmed it stopped.
    Command,
    /// An io_uring was given up with requests in it.
    #[cfg_attr(not(feature = "fallback"), allow(dead_code))]
    Ring,
    /// A copy queue cannot say its copies are done.
    Copy,
    /// A GPU stream may still run work that reads or writes the memory.
    Stream,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Command => "a command no controller reset confirmed stopped",
            Why::Ring => "an io_uring given up with requests in it",
            Why::Copy => "a copy queue that cannot say its copies are done",
            Why::Stream => "a stream that may still run",
        })
    }
}

/// Memory (and what moves data into it) that the device, the kernel or a GPU copy engine may
/// still access after the I/O that named it gave up.
///
/// # Invariants
///
/// Nothing in `held` is ever dropped: [`Drop`] leaks it. Borrowed leases added with
/// [`InFlight::keep_lease`] are never released.
#[must_use = "memory the device may still use: pass the token up with the error (dropping it keeps the memory for good)"]
pub(crate) struct InFlight {
    /// Why the movement may still run.
    why: Why,
    /// What it may still touch (owned leases, chunks, bounce buffers, queues, rings).
    held: Vec<Box<dyn Send>>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InFlight({}, {} held)", self.why, self.held.len())
    }
}

impl InFlight {
    /// A token for movement that may still run, for the reason `why`; holds nothing yet (no
    /// allocation until something is held).
    pub(crate) fn new(why: Why) -> InFlight {
        InFlight { why, held: Vec::new() }
    }

    /// Why the movement may still run.
    #[cfg_attr(not(feature = "fallback"), allow(dead_code))]
    pub(crate) fn why(&self) -> Why {
        self.why
    }

    /// Keeps `x` (memory, or what may still move data into it) with the token.
    pub(crate) fn hold<T: Send + 'static>(&mut self, x: T) {
        self.held.push(Box::new(x));
    }

    /// [`InFlight::hold`] by value, for chaining.
    pub(crate) fn holding<T: Send + 'static>(mut self, x: T) -> InFlight {
        self.hold(x);
        self
    }

    /// Keeps a borrowed lease's count raised for good (see the module's documentation).
    pub(crate) fn keep_lease(&mut self, lease: Lease<&Buffer>) {
        lease.keep_forever();
    }

    /// Takes what `other` holds as well.
    pub(crate) fn merge(&mut self, mut other: InFlight) {
        self.held.append(&mut other.held);
    }

    /// Ends the token here: everything it holds is kept for the life of the process (the same as
    /// dropping it; named, for the places where a token's story ends).
    pub(crate) fn keep(self) {}
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // INVARIANT: what may still be accessed by hardware or the kernel is leaked, never
        // dropped: not freed, unmapped, unpinned or returned to a pool.
        std::mem::forget(std::mem::take(&mut self.held));
        KEPT.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why an I/O failed, and what of it may still run: the result of every path's I/O below the
/// public API. Boxed, so that an [`IoResult`] is two words and the success path, which returns
/// it through every layer, copies no error-sized result (an `Error` is 72 bytes, a token 32).
#[derive(Debug)]
pub(crate) struct Failed<E = Error>(Box<Failure<E>>);

// Two words: every layer of the I/O path returns one (see `Failed`).
const _: () = assert!(size_of::<IoResult<u64>>() <= 16);

/// What a [`Failed`] holds.
#[derive(Debug)]
pub(crate) struct Failure<E> {
    /// The error.
    pub(crate) error: E,
    /// What the device, the kernel or a copy engine may still access.
    pub(crate) in_flight: Option<InFlight>,
}

impl<E> std::ops::Deref for Failed<E> {
    type Target = Failure<E>;
    fn deref(&self) -> &Failure<E> {
        &self.0
    }
}

impl<E> std::ops::DerefMut for Failed<E> {
    fn deref_mut(&mut self) -> &mut Failure<E> {
        &mut self.0
    }
}

impl<E> From<E> for Failed<E> {
    #[cold]
    fn from(error: E) -> Self {
        Failed(Box::new(Failure { error, in_flight: None }))
    }
}

impl<E> Failed<E> {
    /// A failure whose movement may still run.
    #[cold]
    pub(crate) fn running(error: E, in_flight: InFlight) -> Self {
        Failed(Box::new(Failure { error, in_flight: Some(in_flight) }))
    }

    /// The error and the token, if any.
    pub(crate) fn into_parts(self) -> (E, Option<InFlight>) {
        let Failure { error, in_flight } = *self.0;
        (error, in_flight)
    }

    /// The same failure with another error (the token goes along).
    pub(crate) fn map<F>(self, f: impl FnOnce(E) -> F) -> Failed<F> {
        let (error, in_flight) = self.into_parts();
        Failed(Box::new(Failure { error: f(error), in_flight }))
    }

    /// Keeps `x` with the token when there is one; otherwise `x` is handed back.
    pub(crate) fn hold_if_running<T: Send + 'static>(&mut self, x: T) -> Option<T> {
        match self.in_flight.as_mut() {
            Some(t) => {
                t.hold(x);
                None
            }
            None => Some(x),
        }
    }

    /// Keeps a borrowed lease for good when something may still run; otherwise releases it.
    pub(crate) fn settle_lease(&mut self, lease: Lease<&Buffer>) {
        match self.in_flight.as_mut() {
            Some(t) => t.keep_lease(lease),
            None => drop(lease),
        }
    }

    /// Adds `token` (merged into the one already there, if any).
    pub(crate) fn add(&mut self, token: InFlight) {
        match self.in_flight.as_mut() {
            Some(t) => t.merge(token),
            None => self.in_flight = Some(token),
        }
    }

    /// The error for the public API: the token, if any, is kept for good.
    pub(crate) fn into_error(self) -> E {
        let (error, in_flight) = self.into_parts();
        if let Some(t) = in_flight {
            t.keep();
        }
        error
    }
}

/// Ends an I/O's lease with its result: released, or kept for good with the failure's token.
pub(crate) fn settle<T>(r: IoResult<T>, lease: Lease<&Buffer>) -> IoResult<T> {
    match r {
        Ok(v) => Ok(v),
        Err(mut f) => {
            f.settle_lease(lease);
            Err(f)
        }
    }
}

/// The result of an I/O below the public API.
pub(crate) type IoResult<T, E = Error> = std::result::Result<T, Failed<E>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Sets its flag when dropped.
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// What a token holds is never dropped, however the token ends; a failure without a token
    /// hands things back.
    #[test]
    fn what_a_token_holds_is_never_dropped() {
        let (a, b) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let before = kept();
        let t = InFlight::new(Why::Copy).holding(Dropped(a.clone()));
        let mut f = Failed::running(Error::invalid("x", "y"), t);
        assert!(f.hold_if_running(Dropped(b.clone())).is_none());
        let e = f.into_error();
        assert!(matches!(e, Error::InvalidArgument { .. }));
        assert!(!a.load(Ordering::Relaxed) && !b.load(Ordering::Relaxed));
        assert!(kept() > before);
        let t = InFlight::new(Why::Ring);
        assert_eq!(format!("{t:?}"), format!("InFlight({}, 0 held)", Why::Ring));
        let mut plain: Failed = Error::invalid("x", "y").into();
        assert!(plain.in_flight.is_none());
        let back = plain.hold_if_running(Dropped(b.clone()));
        assert!(back.is_some());
        drop(back);
        assert!(b.load(Ordering::Relaxed));
    }
}
