//! Waiting for completions: busy polling, sleeping on the queue's interrupt, or the adaptive mix
//! of both that is the default.
//!
//! Polling answers fastest while the waiter has a core to itself; a waiter that spins on a core
//! another thread needs makes both slower (more workers than cores collapse instead of slowing
//! down). Adaptive waiting spins only while it pays: for a budget taken from the queue's recent
//! wait times, and only while no more threads of this process wait than it has CPUs to spare
//! (a spinner among more waiters than that holds a core that a woken waiter needs); otherwise it
//! sleeps on the queue's MSI-X interrupt (an eventfd), as the kernel's own path does. Linux's
//! hybrid block polling and SPDK's interrupt mode are the models.

use crate::sys::{req, DeviceFd, EventFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How a queue's waiters wait for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Waiting {
    /// Spin while it pays, then sleep on the queue's interrupt. A wait spins for a budget
    /// taken from the queue's recent wait times (at most 2 ms), and not at all while more
    /// threads of the process wait than it has CPUs but one (a spinner stops when they come),
    /// or for a request larger than [`crate::DeviceOptions::spin_max_bytes`]. Polls only where
    /// the controller has no interrupt vector for the queue.
    #[default]
    Adaptive,
    /// Busy-poll every wait: the lowest latency while every waiter has a core of its own.
    /// With more threads of the process waiting than it has CPUs but one, a poller yields its
    /// CPU every few polls (it never sleeps).
    Poll,
    /// Sleep on the interrupt without spinning: system calls per wait, no CPU spent waiting.
    Interrupts,
}

impl Waiting {
    /// Whether queues in this mode are created with an interrupt vector.
    pub(crate) fn wants_interrupts(self) -> bool {
        !matches!(self, Waiting::Poll)
    }

    /// The mode's name, as the CLI and the engines spell it.
    pub fn name(self) -> &'static str {
        match self {
            Waiting::Adaptive => "adaptive",
            Waiting::Poll => "poll",
            Waiting::Interrupts => "interrupts",
        }
    }
}

impl std::str::FromStr for Waiting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adaptive" => Ok(Waiting::Adaptive),
            "poll" | "polling" => Ok(Waiting::Poll),
            "interrupts" | "irq" => Ok(Waiting::Interrupts),
            _ => Err(format!("{s:?} is not a way of waiting (adaptive, poll or interrupts)")),
        }
    }
}

/// The longest an adaptive wait spins before it sleeps.
pub(crate) const MAX_SPIN: Duration = Duration::from_millis(2);

/// The shortest spin budget: a queue whose waits found their completions at once still spins
/// this long before it sleeps.
const MIN_SPIN_NS: u64 = 50_000;

/// The budget is this many times the recent waits' average: a wait that runs this far past
/// the usual is rare enough that sleeping through the rest costs little.
const BUDGET_FACTOR: u64 = 4;

/// Polls between clock reads while spinning (adaptive mode: the budget is short).
const SPINS_PER_BUDGET_CHECK: u32 = 64;

/// One adaptive wait in this many on a queue measures its length for the queue's spin budget
/// (a clock read when its first pause comes and one when it ends); the others read no clock
/// until their first budget check. Under QEMU's TCG a clock read is an emulated `rdtsc` behind
/// the vDSO, and at depth most waits end within a few dozen polls.
const WAITS_PER_SAMPLE: u32 = 8;

/// A spinning poll's pause: the CPU's spin-wait hint once every [`super::SPINS_PER_CHECK`]
/// polls (when the deadline's clock is read anyway), not at each; says whether it paused. An
/// emulated CPU (QEMU's TCG) leaves its translated code at every PAUSE and takes the emulator's
/// lock, the one its device model holds while it processes commands and posts the completion
/// being waited for: once every 64 polls, QEMU's lock profile counted 14 such exits per 100
/// I/Os at QD 8 (SPDK's poller: 0.5) at 28 us of waiting each. SPDK's poller has none at all.
#[inline(always)]
fn relax(spins: u32) -> bool {
    let pause = spins.is_multiple_of(super::SPINS_PER_CHECK);
    if pause {
        std::hint::spin_loop();
    }
    pause
}

/// The longest one sleep lasts before the waiter polls again (and checks its deadline). A
/// completion wakes it earlier: the sleeper arms the interrupt first, and a reaper that took a
/// sleeper's completion off the CQ signals it.
const SLEEP_MS: i32 = 10;

/// Threads of this process in a wait now (spinning or asleep), from their first pause on.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// How many threads may wait with spinning allowed: the CPUs this process may run on, but one
/// (so a thread with work, or the one that completes an interrupt, always finds a core), at
/// least one. With more waiters than this, a spinner takes a core from a waiter whose
/// completion came (on 2 CPUs, 4 threads spinning by turns gave a p99 twice the kernel's).
fn spin_slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).saturating_sub(1).max(1))
}

/// Whether spinning pays with `waiting` threads in waits and `slots` CPUs to spare.
fn may_spin(waiting: usize, slots: usize) -> bool {
    waiting <= slots
}

/// A queue's interrupt: the eventfd its MSI-X vector signals, and what arms it.
#[derive(Debug)]
pub(crate) struct Interrupt {
    ev: EventFd,
    /// The module's file and the queue's id: its interrupt is one-shot (`ARM_IRQ`), so a
    /// queue whose waiters spin takes no interrupts. `None`: every completion signals (the
    /// device model).
    arm: Option<(Arc<DeviceFd>, u32)>,
}

impl Interrupt {
    /// The interrupt of queue `qid` of `fd`, signalling `ev`; armed once now, so that it
    /// masks itself at its first completion and stays masked until a waiter is about to sleep.
    pub(crate) fn one_shot(ev: EventFd, fd: &Arc<DeviceFd>, qid: u32) -> crate::error::Result<Self> {
        let irq = Interrupt { ev, arm: Some((fd.clone(), qid)) };
        irq.arm()?;
        Ok(irq)
    }

    /// An interrupt that signals `ev` at every completion.
    #[cfg(test)]
    pub(crate) fn always(ev: EventFd) -> Self {
        Interrupt { ev, arm: None }
    }

    fn arm(&self) -> crate::error::Result<()> {
        if let Some((fd, qid)) = &self.arm {
            let mut a = ugds_uapi::ioctl::DeleteQpair { qid: *qid, reserved: 0 };
            fd.ioctl(req::ArmIrq, &mut a)?;
        }
        Ok(())
    }

    /// Sleeps until signalled or `ms` passed: arms the interrupt first, so the next completion
    /// (or one that came while it was masked) wakes the sleeper.
    fn sleep(&self, ms: i32) {
        if let Err(e) = self.arm() {
            // Without the arm the sleep still ends at its bound: slower, not wrong.
            log::debug!("arming a queue's interrupt: {e}");
        }
        self.ev.wait(ms);
    }
}

/// A queue's waiting state: its mode, its interrupt, and what its recent waits took.
#[derive(Debug)]
pub(crate) struct QueueWait {
    /// The mode in effect (polling when the queue has no interrupt).
    mode: Waiting,
    irq: Option<Interrupt>,
    /// Requests larger than this do not spin (adaptive mode).
    spin_max_bytes: u64,
    /// Moving average of recent waits, in nanoseconds (an adaptive wait's budget).
    recent_ns: AtomicU64,
    /// Adaptive waits begun here (see [`WAITS_PER_SAMPLE`]); a count that loses an update to a
    /// race only moves a sample.
    waits: AtomicU32,
    /// Waiters asleep on (or about to sleep on) `irq`: a reaper that takes completions off the
    /// CQ signals `irq` for them, since the interrupt may have woken another thread.
    sleepers: AtomicU32,
}

impl QueueWait {
    /// The waiting state of a queue created in `mode`, with `irq` when it has an interrupt.
    pub(crate) fn new(mode: Waiting, irq: Option<Interrupt>, spin_max_bytes: u64) -> Self {
        let mode = if irq.is_none() { Waiting::Poll } else { mode };
        // Learned here, with the queue, rather than at a wait's first check of the waiters:
        // learning it makes system calls, which a wait must not.
        spin_slots();
        QueueWait {
            mode,
            irq,
            spin_max_bytes,
            recent_ns: AtomicU64::new(MIN_SPIN_NS),
            waits: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Called by a reap that took entries off the CQ: wakes the sleepers, whose completions it
    /// may have recorded (one load when nobody sleeps).
    #[inline]
    pub(crate) fn reaped(&self) {
        if self.sleepers.load(Ordering::Acquire) > 0 {
            if let Some(irq) = &self.irq {
                irq.ev.signal();
            }
        }
    }

    /// The spin budget of an adaptive wait: a few times the recent waits, within bounds.
    fn budget(&self) -> Duration {
        let ns = self.recent_ns.load(Ordering::Relaxed).saturating_mul(BUDGET_FACTOR).max(MIN_SPIN_NS);
        Duration::from_nanos(ns).min(MAX_SPIN)
    }

    /// Whether the wait beginning now measures its length (one in [`WAITS_PER_SAMPLE`]).
    #[inline]
    fn sample_due(&self) -> bool {
        // A plain load and store, not a read-modify-write: the count only spaces the samples.
        let n = self.waits.load(Ordering::Relaxed);
        self.waits.store(n.wrapping_add(1), Ordering::Relaxed);
        n.is_multiple_of(WAITS_PER_SAMPLE)
    }

    /// Folds one wait's length into the moving average (weight 1/8).
    fn record(&self, ns: u64) {
        let old = self.recent_ns.load(Ordering::Relaxed);
        let new = old - old / 8 + ns / 8;
        self.recent_ns.store(new, Ordering::Relaxed);
    }
}

/// Where a wait stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not yet paused: the first poll found nothing.
    Start,
    /// Spinning: counted among the process's waiters (an adaptive wait holding one of its spin
    /// slots, or a busy poll).
    Spinning,
    /// Counted among the queue's sleepers; the caller polls once more before the first sleep.
    Sleeping,
}

/// A wait's deadline on a clock read only when the caller asks (a [`Waiter`] says when: every
/// few thousand polls, after every sleep): the first ask starts it, and it counts from there.
/// At depth 8 in the VM, reading the clock at every poll took a quarter of the CPU time; a wait
/// that found what it wanted before its first ask reads none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    timeout: Duration,
    start: Option<Instant>,
}

impl Deadline {
    /// `timeout` from the first [`Deadline::passed`].
    #[inline]
    pub(crate) fn new(timeout: Duration) -> Self {
        Deadline { timeout, start: None }
    }

    /// Whether it passed (reads the clock). The first call starts it and says no, unless the
    /// timeout is zero: a wait of none looks once.
    #[inline]
    pub(crate) fn passed(&mut self) -> bool {
        match self.start {
            Some(t) => t.elapsed() > self.timeout,
            None if self.timeout.is_zero() => true,
            None => {
                self.start = Some(Instant::now());
                false
            }
        }
    }

    /// What is left of it (all of it before it started).
    #[inline]
    pub(crate) fn left(&self) -> Duration {
        self.start.map_or(self.timeout, |t| self.timeout.saturating_sub(t.elapsed()))
    }

    /// Starts it, if it has not started.
    #[inline]
    pub(crate) fn start(&mut self) {
        self.start.get_or_insert_with(Instant::now);
    }
}

/// One wait for completions: the caller polls, calls [`Waiter::pause`] with the queue it waits
/// on each time it found nothing, and [`Waiter::done`] when it has what it waited for.
///
/// It borrows nothing between pauses (the caller submits and reaps through `&mut` queues in
/// between); from its first pause on it holds the queue's waiting state, so that dropping it
/// gives back its spin slot or its place among the sleepers on every path.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The adaptive or interrupt-mode queue it spins or sleeps for (set at the first pause
    /// there: a wait whose first poll found everything costs nothing). A busy poll holds none:
    /// it has no per-queue place to give back.
    q: Option<Arc<QueueWait>>,
    /// Whether this wait may spin at all (adaptive mode: its request's size).
    bytes: u64,
    /// Counted in [`WAITING`] in every phase but `Start`.
    phase: Phase,
    spins: u32,
    /// How often a busy poll gave its CPU up (see [`Waiter::poll`]).
    yields: u32,
    /// When the first pause came (a sampled wait), or the first budget check (the others).
    since: Option<Instant>,
    /// Whether this wait's length feeds the queue's spin budget (`since` is its first pause).
    sampled: bool,
}

impl Waiter {
    /// A wait for a request of `bytes` bytes.
    #[inline]
    pub(crate) fn new(bytes: u64) -> Self {
        Waiter { q: None, bytes, phase: Phase::Start, spins: 0, yields: 0, since: None, sampled: false }
    }

    /// Pauses once on queue `q`: spins, or sleeps on its interrupt, as its mode and this
    /// wait's progress say. Returns whether the caller should read the clock for its deadline
    /// now (before the first sleep and after every sleep; every few thousand spins).
    #[inline]
    pub(crate) fn pause(&mut self, q: &Arc<QueueWait>) -> bool {
        // The in-memory device model answers on this thread when it is stepped (tests only).
        #[cfg(any(test, feature = "test-utils"))]
        crate::mock::on_idle_poll();
        self.spins = self.spins.wrapping_add(1);
        match q.mode {
            Waiting::Poll => self.poll(),
            // Interrupt mode is adaptive waiting that never spins: its sleepers are counted the
            // same way, so a reaper wakes them.
            Waiting::Interrupts | Waiting::Adaptive => self.spin_or_sleep(q),
        }
    }

    /// A busy poll's pause. While more threads of the process wait than it has CPUs to spare,
    /// it yields its CPU every few polls: a spinner that keeps its CPU for a whole time slice
    /// holds up a waiter whose completion came (on 2 CPUs, 4 polling threads had a p99 of 8 to
    /// 11 ms against the kernel's 1 to 2.5 ms); with a CPU of its own it never makes a system
    /// call.
    #[inline]
    fn poll(&mut self) -> bool {
        relax(self.spins);
        if self.q.is_some() {
            // A wait over several queues came here from an adaptive or interrupt-mode one:
            // it gives back its place there (among that queue's sleepers too) and starts over.
            self.release();
            self.q = None;
        }
        if self.phase == Phase::Start {
            // Counted among the waiters until `release`.
            WAITING.fetch_add(1, Ordering::AcqRel);
            self.phase = Phase::Spinning;
        } else if self.spins.is_multiple_of(SPINS_PER_BUDGET_CHECK)
            && !may_spin(WAITING.load(Ordering::Acquire), spin_slots())
        {
            self.yields = self.yields.wrapping_add(1);
            std::thread::yield_now();
        }
        self.spins.is_multiple_of(super::SPINS_PER_CHECK)
    }

    fn spin_or_sleep(&mut self, q: &Arc<QueueWait>) -> bool {
        if self.phase != Phase::Start && !self.q.as_ref().is_some_and(|held| Arc::ptr_eq(held, q)) {
            // A wait over several queues moved to another one (or came from a polling one,
            // which holds none): start over there.
            self.release();
        }
        match self.phase {
            Phase::Start => {
                if self.since.is_none() && q.sample_due() {
                    self.since = Some(Instant::now());
                    self.sampled = true;
                }
                self.q = Some(q.clone());
                // Leaving `Start`: counted among the waiters until `release`.
                WAITING.fetch_add(1, Ordering::AcqRel);
                let spinnable = q.mode == Waiting::Adaptive && self.bytes <= q.spin_max_bytes;
                if spinnable && may_spin(WAITING.load(Ordering::Acquire), spin_slots()) {
                    self.phase = Phase::Spinning;
                    false
                } else {
                    self.start_sleeping(q);
                    // About to sleep: the caller's deadline starts now, not after the sleep.
                    true
                }
            }
            Phase::Spinning => {
                relax(self.spins);
                if !self.spins.is_multiple_of(SPINS_PER_BUDGET_CHECK) {
                    return false;
                }
                // An unsampled wait starts its spin's clock here, a budget check into it.
                let spun = match self.since {
                    Some(s) => s.elapsed(),
                    None => {
                        self.since = Some(Instant::now());
                        Duration::ZERO
                    }
                };
                if spun > q.budget() || !may_spin(WAITING.load(Ordering::Acquire), spin_slots()) {
                    self.start_sleeping(q);
                    // About to sleep: the caller's deadline starts now, not after the sleep.
                    return true;
                }
                self.spins.is_multiple_of(super::SPINS_PER_CHECK)
            }
            Phase::Sleeping => {
                sleep(q, SLEEP_MS);
                true
            }
        }
    }

    /// Joins the queue's sleepers; the caller polls once more before the first sleep, so a
    /// completion reaped by another thread before this one counted itself is not slept past.
    fn start_sleeping(&mut self, q: &QueueWait) {
        q.sleepers.fetch_add(1, Ordering::AcqRel);
        self.phase = Phase::Sleeping;
    }

    /// Gives back its place among the waiters and the sleepers.
    fn release(&mut self) {
        if self.phase == Phase::Sleeping {
            if let Some(q) = &self.q {
                q.sleepers.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if self.phase != Phase::Start {
            WAITING.fetch_sub(1, Ordering::AcqRel);
        }
        self.phase = Phase::Start;
    }

    /// The wait got what it waited for: its length feeds the queue's spin budget (dropping it
    /// then gives back its place among the waiters).
    #[inline]
    pub(crate) fn done(self) {
        if let (Some(q), Some(since), true) = (&self.q, self.since, self.sampled) {
            q.record(u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    }
}

/// Sleeps on `q`'s interrupt for at most `ms` (spins once where it has none).
fn sleep(q: &QueueWait, ms: i32) {
    match &q.irq {
        Some(irq) => irq.sleep(ms),
        None => std::hint::spin_loop(),
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_poll_pauses_once_per_clock_check() {
        let pauses = (1..=3 * super::super::SPINS_PER_CHECK).filter(|&s| relax(s)).count();
        assert_eq!(pauses, 3);
    }

    /// A deadline reads no clock until asked: its first look starts it (a zero one has passed
    /// then), and it passes its timeout after that look, not after it was made.
    #[test]
    fn a_deadline_counts_from_its_first_look() {
        let mut zero = Deadline::new(Duration::ZERO);
        assert_eq!(zero.left(), Duration::ZERO);
        assert!(zero.passed(), "a wait of none looks once");
        let mut d = Deadline::new(Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(d.left(), Duration::from_millis(30), "not started: all of it is left");
        assert!(!d.passed(), "the first look starts it");
        assert!(d.left() <= Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(40));
        assert!(d.passed());
        assert_eq!(d.left(), Duration::ZERO);
    }

    #[test]
    fn modes_parse_and_name_themselves() {
        for m in [Waiting::Adaptive, Waiting::Poll, Waiting::Interrupts] {
            assert_eq!(m.name().parse::<Waiting>(), Ok(m));
        }
        assert!("spin".parse::<Waiting>().is_err());
    }

    #[test]
    fn a_queue_without_interrupt_polls() {
        let q = QueueWait::new(Waiting::Adaptive, None, u64::MAX);
        assert_eq!(q.mode, Waiting::Poll);
    }

    #[test]
    fn adaptive_spins_within_budget_then_sleeps() {
        let ev = Interrupt::always(EventFd::new().expect("eventfd"));
        let q = Arc::new(QueueWait::new(Waiting::Adaptive, Some(ev), u64::MAX));
        // Spins when it gets a slot (another test may hold them), never past the budget.
        let mut w = Waiter::new(4096);
        w.pause(&q);
        let start = Instant::now();
        while w.phase != Phase::Sleeping {
            w.pause(&q);
            assert!(start.elapsed() < Duration::from_secs(5), "never stopped spinning");
        }
        assert!(start.elapsed() <= MAX_SPIN + Duration::from_millis(50), "spun {:?}", start.elapsed());
        assert_eq!(q.sleepers.load(Ordering::Acquire), 1);
        // A sleep with nobody signalling ends at its bound, not before a completion could come.
        let t = Instant::now();
        w.pause(&q);
        assert!(t.elapsed() >= Duration::from_millis(5), "slept {:?}", t.elapsed());
        // A reaper wakes a sleeper at once.
        q.reaped();
        let t = Instant::now();
        w.pause(&q);
        assert!(t.elapsed() < Duration::from_millis(1), "a signalled sleep waited {:?}", t.elapsed());
        drop(w);
        assert_eq!(q.sleepers.load(Ordering::Acquire), 0);
    }

    /// One adaptive wait in [`WAITS_PER_SAMPLE`] on a queue measures its length (two clock
    /// reads) for the spin budget; the others leave the budget as it is.
    #[test]
    fn one_adaptive_wait_in_eight_feeds_the_spin_budget() {
        let ev = Interrupt::always(EventFd::new().expect("eventfd"));
        let q = Arc::new(QueueWait::new(Waiting::Adaptive, Some(ev), u64::MAX));
        let mut fed = Vec::new();
        for i in 0..2 * WAITS_PER_SAMPLE {
            let before = q.recent_ns.load(Ordering::Relaxed);
            let mut w = Waiter::new(4096);
            w.pause(&q);
            std::thread::sleep(Duration::from_millis(1));
            w.done();
            if q.recent_ns.load(Ordering::Relaxed) != before {
                fed.push(i);
            }
        }
        assert_eq!(fed, [0, WAITS_PER_SAMPLE], "the waits that fed the budget");
    }

    #[test]
    fn large_requests_do_not_spin() {
        let ev = Interrupt::always(EventFd::new().expect("eventfd"));
        let q = Arc::new(QueueWait::new(Waiting::Adaptive, Some(ev), 8192));
        let mut w = Waiter::new(1 << 20);
        // Its caller's deadline starts before the first sleep, not after it.
        assert!(w.pause(&q), "a wait about to sleep asks for the clock");
        assert_eq!(w.phase, Phase::Sleeping);
    }

    #[test]
    fn interrupt_mode_never_spins_and_counts_its_sleepers() {
        let q = Arc::new(QueueWait::new(
            Waiting::Interrupts,
            Some(Interrupt::always(EventFd::new().expect("eventfd"))),
            u64::MAX,
        ));
        let mut w = Waiter::new(4096);
        // The first pause only counts it among the sleepers (the caller polls once more).
        w.pause(&q);
        assert_eq!((w.phase, q.sleepers.load(Ordering::Acquire)), (Phase::Sleeping, 1));
        // A reaper's signal ends its sleep at once.
        q.reaped();
        let t = Instant::now();
        w.pause(&q);
        assert!(t.elapsed() < Duration::from_millis(5), "a signalled sleep waited {:?}", t.elapsed());
        drop(w);
        assert_eq!(q.sleepers.load(Ordering::Acquire), 0);
    }

    #[test]
    fn spinning_stops_at_more_waiters_than_spare_cpus() {
        assert!(may_spin(1, 1) && may_spin(3, 3));
        assert!(!may_spin(2, 1), "two waiters spinning on one spare CPU");
        assert!(spin_slots() >= 1);
        // A long budget, so that only the waiters' count can end the spin early.
        let q = Arc::new(QueueWait::new(
            Waiting::Adaptive,
            Some(Interrupt::always(EventFd::new().expect("eventfd"))),
            u64::MAX,
        ));
        for _ in 0..64 {
            q.record(10_000_000);
        }
        let mut waiters: Vec<Waiter> = (0..=spin_slots()).map(|_| Waiter::new(4096)).collect();
        for w in &mut waiters {
            w.pause(&q);
        }
        // The last one came with every spare CPU's worth of waiters already there: it sleeps.
        assert_eq!(waiters.last().map(|w| w.phase), Some(Phase::Sleeping));
        // Any that spun stops at its next check, long before its 2 ms budget.
        let start = Instant::now();
        for w in &mut waiters {
            for _ in 0..SPINS_PER_BUDGET_CHECK {
                if w.phase == Phase::Spinning {
                    w.pause(&q);
                }
            }
            assert_eq!(w.phase, Phase::Sleeping, "still spinning among {} waiters", spin_slots() + 1);
        }
        assert!(start.elapsed() < MAX_SPIN, "{:?}", start.elapsed());
        drop(waiters);
        assert_eq!(q.sleepers.load(Ordering::Acquire), 0);
    }

    /// Set in the process [`a_poll_makes_no_system_call_once_its_queue_exists`] starts.
    const SECCOMP_CHILD: &str = "UGDS_TEST_POLL_UNDER_SECCOMP";

    #[test]
    fn a_poll_makes_no_system_call_once_its_queue_exists() {
        // A fresh process runs the child below alone, so nothing has learned the CPU count
        // before its queue is made.
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "queue::wait::tests::poll_under_seccomp", "--ignored", "--test-threads=1"])
            .env(SECCOMP_CHILD, "1")
            .output()
            .expect("child");
        use std::os::unix::process::ExitStatusExt;
        assert_ne!(out.status.signal(), Some(libc::SIGSYS), "a poll made a system call (killed by seccomp)");
        assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stdout));
    }

    /// The child of [`a_poll_makes_no_system_call_once_its_queue_exists`]: a polling queue's
    /// waits, long enough to check the waiters against the CPUs, under a seccomp filter that
    /// kills the process on any system call but exit.
    #[test]
    #[ignore = "run in a process of its own by a_poll_makes_no_system_call_once_its_queue_exists"]
    fn poll_under_seccomp() {
        if std::env::var_os(SECCOMP_CHILD).is_none() {
            return;
        }
        let q = Arc::new(QueueWait::new(Waiting::Poll, None, u64::MAX));
        let mut w = Waiter::new(4096);
        #[repr(C)]
        struct SockFilter {
            code: u16,
            jt: u8,
            jf: u8,
            k: u32,
        }
        #[repr(C)]
        struct SockFprog {
            len: u16,
            filter: *const SockFilter,
        }
        let prog = [
            SockFilter { code: 0x20, jt: 0, jf: 0, k: 0 },   // ld seccomp_data.nr
            SockFilter { code: 0x15, jt: 2, jf: 0, k: 231 }, // exit_group: allow
            SockFilter { code: 0x15, jt: 1, jf: 0, k: 60 },  // exit: allow
            SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x8000_0000 }, // kill the process
            SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }, // allow
        ];
        let fprog = SockFprog { len: prog.len() as u16, filter: prog.as_ptr() };
        // SAFETY: prctl and seccomp with a valid filter program that outlives the calls.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0, "no_new_privs");
            assert_eq!(libc::syscall(libc::SYS_seccomp, 1, 0, &fprog as *const SockFprog), 0, "seccomp");
        }
        for _ in 0..4 * SPINS_PER_BUDGET_CHECK {
            w.pause(&q);
        }
        std::mem::forget(w);
        // SAFETY: exit_group is allowed; nothing needs to run after the waits.
        unsafe { libc::_exit(0) }
    }

    #[test]
    fn polling_yields_its_cpu_among_more_waiters_than_spare_cpus() {
        let q = Arc::new(QueueWait::new(Waiting::Poll, None, u64::MAX));
        // Every spare CPU's worth of other waiters, asleep (an interrupt-mode queue).
        let other = Arc::new(QueueWait::new(
            Waiting::Interrupts,
            Some(Interrupt::always(EventFd::new().expect("eventfd"))),
            u64::MAX,
        ));
        let mut others: Vec<Waiter> = (0..spin_slots()).map(|_| Waiter::new(4096)).collect();
        for w in &mut others {
            w.pause(&other);
        }
        let mut w = Waiter::new(4096);
        for _ in 0..4 * SPINS_PER_BUDGET_CHECK {
            w.pause(&q);
        }
        assert!(w.yields >= 3, "a poller among {} waiters yielded {} times", spin_slots() + 1, w.yields);
    }

    #[test]
    fn a_wait_moving_between_polling_and_interrupt_queues_leaves_no_place_behind() {
        let polled = Arc::new(QueueWait::new(Waiting::Poll, None, u64::MAX));
        let irq = || Some(Interrupt::always(EventFd::new().expect("eventfd")));
        let sleepy = Arc::new(QueueWait::new(Waiting::Interrupts, irq(), u64::MAX));
        let mut w = Waiter::new(4096);
        w.pause(&polled);
        w.pause(&polled);
        // On an interrupt-mode queue it never spins, and it counts among that queue's sleepers.
        w.pause(&sleepy);
        assert_eq!((w.phase, sleepy.sleepers.load(Ordering::Acquire)), (Phase::Sleeping, 1));
        // Back on the polling queue, it is no longer one of them.
        w.pause(&polled);
        assert_eq!((w.phase, sleepy.sleepers.load(Ordering::Acquire)), (Phase::Spinning, 0));
        w.pause(&sleepy);
        drop(w);
        assert_eq!(sleepy.sleepers.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_budget_follows_recent_waits() {
        let q = QueueWait::new(Waiting::Adaptive, Some(Interrupt::always(EventFd::new().expect("eventfd"))), u64::MAX);
        assert_eq!(q.budget(), Duration::from_nanos(BUDGET_FACTOR * MIN_SPIN_NS));
        for _ in 0..64 {
            q.record(300_000);
        }
        let b = q.budget();
        assert!(b > Duration::from_micros(1000) && b <= Duration::from_micros(1200), "{b:?}");
        for _ in 0..64 {
            q.record(10_000_000);
        }
        assert_eq!(q.budget(), MAX_SPIN);
    }
}
