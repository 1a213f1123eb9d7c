//! [`Namespace`]: where a controller's reads and writes go, and the checks that a namespace and
//! an optional command can be used at all.

use super::{lanes, thread_index, thread_queues, Inner, Registration, WaitPolicy};
use crate::cmd::{self, Command, DsmRange};
use crate::error::{Error, Result};
use crate::inflight::{Failed, InFlight, IoResult, Why};
use crate::queue::{self, QueuePair, RequestQueue, Waiter};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_uapi::ioctl::*;

/// Refuses a namespace whose blocks carry metadata or protection information, or whose size in
/// bytes does not fit 64 bits (a controller reporting nonsense: every range check would wrap).
pub(super) fn usable_namespace(info: &NamespaceInfo) -> Result<()> {
    if info.size_lbas.checked_mul(1u64 << info.lba_shift.min(63)).is_none() {
        return Err(Error::DeviceProtocol(format!(
            "namespace {}: {} blocks of 2^{} bytes overflow 64 bits",
            info.nsid, info.size_lbas, info.lba_shift
        )));
    }
    if info.metadata_bytes == 0 && info.pi_type == 0 {
        return Ok(());
    }
    Err(Error::Unsupported {
        what: "a namespace formatted with metadata",
        why: format!(
            "namespace {} has {} bytes of metadata per block and protection information type {}; \
             ugds moves data blocks only",
            info.nsid, info.metadata_bytes, info.pi_type
        ),
        fix: "format it with a metadata-free LBA format (`nvme format /dev/nvmeXnY --lbaf=N --pi=0`, \
              after unbinding), or use another namespace",
    })
}

/// Identify Controller ONCS bits (NVMe base spec 2.0, figure 275).
const ONCS_DATASET_MANAGEMENT: u32 = 1 << 2;
const ONCS_WRITE_ZEROES: u32 = 1 << 3;

/// Refuses an optional NVM command the controller does not support (its ONCS bit is clear).
fn optional_command(oncs: u32, bit: u32, what: &'static str) -> Result<()> {
    if oncs & bit != 0 {
        return Ok(());
    }
    Err(Error::Unsupported {
        what,
        why: format!("the controller does not support it (Identify Controller ONCS {oncs:#x} lacks bit {:#x})", bit),
        fix: "write a zeroed buffer instead, or use a controller that supports the command",
    })
}

/// A namespace of a [`Device`]: where reads and writes go.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub(super) dev: Arc<Inner>,
    pub(super) info: NamespaceInfo,
    pub(super) timeout: Duration,
}

impl Namespace {
    /// The same namespace with another per-command deadline (for calls made through it).
    pub fn with_timeout(&self, timeout: Duration) -> Namespace {
        Namespace { timeout, ..self.clone() }
    }

    /// The starting LBA and block count of a single-command request (batch entries), or why
    /// it needs more than one command. The request was checked by [`crate::Storage`].
    #[inline]
    pub(crate) fn one_command(&self, dev_offset: u64, len: u64) -> Result<(u64, u32)> {
        let per_cmd = self.max_command_bytes();
        if len > per_cmd {
            return Err(Error::invalid("len", format!("{len} bytes exceed one command's {per_cmd}")));
        }
        let shift = self.info.lba_shift;
        Ok((dev_offset >> shift, (len >> shift) as u32))
    }

    /// The largest transfer one command (and so one batch entry) may carry.
    pub fn max_command_bytes(&self) -> u64 {
        self.dev.max_cmd_bytes.min(65536 << self.info.lba_shift)
    }

    /// Metadata bytes per block (0: none; such a namespace cannot be used, see
    /// [`Device::namespace`]).
    pub fn metadata_bytes(&self) -> u16 {
        self.info.metadata_bytes
    }

    /// Protection information type (0: none).
    pub fn pi_type(&self) -> u8 {
        self.info.pi_type
    }

    /// Namespace id.
    pub fn id(&self) -> u32 {
        self.info.nsid
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u64 {
        1 << self.info.lba_shift
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.info.size_lbas << self.info.lba_shift
    }

    /// Checks a device range (non-zero, block aligned, inside the namespace); the error names
    /// the argument.
    pub fn check_range(&self, dev_offset: u64, len: u64) -> Result<()> {
        let bs = self.block_size();
        if len == 0 {
            return Err(Error::invalid("len", "must be non-zero"));
        }
        if !len.is_multiple_of(bs) {
            return Err(Error::invalid("len", format!("{len} is not a multiple of the {bs}-byte block size")));
        }
        if !dev_offset.is_multiple_of(bs) {
            return Err(Error::invalid(
                "dev_offset",
                format!("{dev_offset} is not a multiple of the {bs}-byte block size"),
            ));
        }
        if dev_offset.checked_add(len).is_none_or(|e| e > self.capacity()) {
            return Err(Error::invalid(
                "dev_offset",
                format!("[{dev_offset}, +{len}) runs past the namespace's {} bytes", self.capacity()),
            ));
        }
        Ok(())
    }

    /// This thread's shared queue pair. A device opened on a controller has at least one; a
    /// device made over a single queue pair its batch owns (a test's) has none.
    pub(super) fn queue(&self) -> Result<&QueuePair> {
        let i = thread_index().checked_rem(self.dev.queues.len()).ok_or_else(no_shared_queue)?;
        Ok(&self.dev.queues[i])
    }

    /// How the device's queue pairs wait (owned ones too).
    pub(super) fn wait_policy(&self) -> WaitPolicy {
        self.dev.wait
    }

    /// Entries per synchronous queue pair.
    pub(super) fn queue_depth(&self) -> u32 {
        self.dev.queues.first().map_or(2, |q| q.depth())
    }

    /// Moves `len` bytes between `reg` at `reg_offset` and the namespace at `dev_offset` (one
    /// command, or bursts of commands all in flight at once), on the calling thread's own queue
    /// pair where it has one (see [`DeviceOptions::thread_queues`](super::DeviceOptions)), else
    /// on a shared one. The request was checked by [`crate::Storage`] (the PRP builder still
    /// refuses a range outside the registration). On a timeout the controller is reset; when
    /// that fails the failure carries an [`InFlight`] token (the commands may still run), and
    /// the caller must keep the memory pinned with it.
    pub(crate) fn rw(
        &self,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> IoResult<()> {
        // Before the thread's claim is looked at: a forked child's claims are its parent's.
        self.dev.born.check("device")?;
        let dev = &self.dev;
        let own = thread_queues::with_own(
            &dev.threads,
            || dev.create_thread_queue(),
            |held| self.rw_on(held, write, reg, reg_offset, dev_offset, len),
        );
        match own {
            Some(r) => r,
            None => self.rw_on(self.queue()?, write, reg, reg_offset, dev_offset, len),
        }
    }

    /// [`Namespace::rw`] on queue `q`: the thread's own, a shared one, or one the caller owns.
    /// A request one command carries (the common synchronous read or write) goes straight to the
    /// queue; any other (larger, empty, or with memory registered on another device, which the
    /// lane refuses by name) runs as a lane ([`lanes::run_one`]).
    pub(super) fn rw_on(
        &self,
        mut q: impl RequestQueue,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
    ) -> IoResult<()> {
        self.dev.born.check("device")?;
        if len > 0 && len <= self.max_command_bytes() && Arc::ptr_eq(&reg.dev, &self.dev) {
            return self.rw_one_command(write, reg, reg_offset, dev_offset, len, &mut q);
        }
        let extents = [lanes::Extent { reg_offset, dev_offset, len }];
        let lane = lanes::Lane { ns: self, reg, extents: &extents };
        lanes::run_one(write, &lane, q).map_err(|f| f.failure)
    }

    /// A request that one command carries: built, submitted and waited for with no burst
    /// state, so its cost is the queue's own. Failures map as a lane's do.
    #[inline]
    fn rw_one_command(
        &self,
        write: bool,
        reg: &Registration,
        reg_offset: u64,
        dev_offset: u64,
        len: u64,
        q: &mut impl RequestQueue,
    ) -> IoResult<()> {
        let shift = self.info.lba_shift;
        // CAST: `len` fits one command (checked by the caller), at most 65536 blocks.
        let (slba, nlb) = (dev_offset >> shift, (len >> shift) as u32);
        // SAFETY: the caller's lease keeps the registration and its memory for the call (and for
        // good, through the failure's token, when the command may outlive it); `len` is exactly
        // `nlb` blocks (`Storage` checked it is a multiple of the block size).
        let data = unsafe { reg.range(reg_offset, len) }.map_err(|err| self.failure(q, err))?;
        let cmd =
            if write { cmd::Write::new(slba, nlb, data).build() } else { cmd::Read::new(slba, nlb, data).build() };
        let status = &self.dev.status;
        let t = q.submit_one(self.info.nsid, &cmd, status, self.timeout).map_err(|err| self.failure(q, err))?;
        let mut wait = Waiter::new(len);
        let mut since: Option<Instant> = None;
        loop {
            match q.collect_one(t, status) {
                Ok(Some(st)) => {
                    wait.done();
                    if !st.is_success() {
                        return Err(Error::Nvme { op: cmd.name(), slba, status: st }.into());
                    }
                    return Ok(());
                }
                Ok(None) => {}
                Err(err) => return Err(self.failure(q, err)),
            }
            // The clock is read only every few thousand polls and after each sleep.
            if wait.pause(q.wait_state()) {
                let now = Instant::now();
                if now.duration_since(*since.get_or_insert(now)) > self.timeout {
                    // The command stays in flight until the reset clears it.
                    return Err(self.failure(q, queue::timeout_error(&cmd, self.timeout)));
                }
            }
        }
    }

    /// The failure for `error`: a timeout, a faulted controller or a completion the queue could
    /// not believe may leave commands running (an [`InFlight`] token), unless a reset confirms
    /// the controller stopped (then `q`, the queue the caller was using, adopts the new epoch,
    /// as the shared path's does).
    pub(super) fn failure(&self, q: &mut impl RequestQueue, error: Error) -> Failed {
        match error {
            e @ (Error::Timeout { .. } | Error::DeviceFaulted | Error::DeviceProtocol(_)) => {
                if self.reset_controller() {
                    q.resync(&self.dev.status);
                    return e.into();
                }
                Failed::running(e, InFlight::new(Why::Command))
            }
            e => e.into(),
        }
    }

    fn execute(&self, cmds: &[Command<'_>]) -> Result<()> {
        self.queue()?.execute(self.info.nsid, cmds, &self.dev.status, self.timeout)
    }

    /// After a timeout: reset the controller (the module disables it, waits for CSTS.RDY=0,
    /// re-enables it and re-creates every live queue, owned ones included). True when the
    /// controller is known to have stopped, so memory of the timed-out commands is safe again.
    /// The caller resynchronises the queue it was using; every other queue of this process
    /// reports the epoch change once to its next user.
    pub(super) fn reset_controller(&self) -> bool {
        self.dev.reset().is_ok()
    }

    /// [`Namespace::reset_controller`], then this thread's shared queue adopts the new epoch.
    fn recover(&self) -> bool {
        let ok = self.reset_controller();
        if let (true, Ok(q)) = (ok, self.queue()) {
            q.resync(&self.dev.status);
        }
        ok
    }

    fn no_data(&self, cmd: Command<'_>) -> Result<()> {
        self.dev.born.check("device")?;
        let r = self.execute(&[cmd]);
        if matches!(r, Err(Error::Timeout { .. })) {
            self.recover();
        }
        r
    }

    /// Flushes the volatile write cache. A controller without one (Identify VWC bit 0 clear)
    /// has nothing to flush: nothing is sent, which is exact.
    pub fn flush(&self) -> Result<()> {
        if self.dev.info.vwc & 1 == 0 {
            return Ok(());
        }
        self.no_data(cmd::Flush::new().build())
    }

    fn blocks(&self, dev_offset: u64, len: u64) -> Result<Vec<(u64, u32)>> {
        self.check_range(dev_offset, len)?;
        let shift = self.info.lba_shift;
        let mut v = Vec::new();
        let (mut slba, mut left) = (dev_offset >> shift, len >> shift);
        while left > 0 {
            let n = left.min(65536);
            v.push((slba, n as u32));
            slba += n;
            left -= n;
        }
        Ok(v)
    }

    /// Writes zeroes to `[dev_offset, dev_offset + len)`; refused by name when the controller
    /// lacks Write Zeroes (ONCS bit 3).
    pub fn write_zeroes(&self, dev_offset: u64, len: u64) -> Result<()> {
        optional_command(self.dev.info.oncs, ONCS_WRITE_ZEROES, "Write Zeroes")?;
        for (slba, nlb) in self.blocks(dev_offset, len)? {
            self.no_data(cmd::WriteZeroes::new(slba, nlb).build())?;
        }
        Ok(())
    }

    /// Deallocates (trims) `[dev_offset, dev_offset + len)`; refused by name when the controller
    /// lacks Dataset Management (ONCS bit 2).
    pub fn deallocate(&self, dev_offset: u64, len: u64) -> Result<()> {
        optional_command(self.dev.info.oncs, ONCS_DATASET_MANAGEMENT, "Dataset Management (deallocate)")?;
        for (slba, nlb) in self.blocks(dev_offset, len)? {
            let range = [DsmRange::new(slba, nlb)];
            self.no_data(cmd::DatasetManagement::new(&range).deallocate(true).build())?;
        }
        Ok(())
    }
}

/// The error of a request on a device without a shared queue pair ([`Namespace::queue`]).
pub(super) fn no_shared_queue() -> Error {
    Error::invalid("queues", "the device has no shared queue pair")
}

#[cfg(test)]
mod tests {
    #[test]
    fn namespaces_with_metadata_are_refused_by_name() {
        use super::usable_namespace;
        use ugds_uapi::ioctl::NamespaceInfo;
        let plain = NamespaceInfo { nsid: 1, lba_shift: 12, size_lbas: 8, ..Default::default() };
        assert!(usable_namespace(&plain).is_ok());
        let md = NamespaceInfo { metadata_bytes: 8, ..plain };
        let e = usable_namespace(&md).unwrap_err().to_string();
        assert!(e.contains("8 bytes of metadata") && e.contains("nvme format"), "{e}");
        assert!(usable_namespace(&NamespaceInfo { pi_type: 1, ..plain }).is_err());
        // A size whose bytes overflow 64 bits is a protocol error, not a capacity that wrapped.
        let huge = NamespaceInfo { size_lbas: 1 << 53, ..plain };
        assert!(matches!(usable_namespace(&huge), Err(crate::Error::DeviceProtocol(_))));
        assert!(usable_namespace(&NamespaceInfo { size_lbas: (1 << 52) - 1, ..plain }).is_ok());
    }

    #[test]
    fn optional_commands_follow_oncs() {
        use super::{optional_command, ONCS_DATASET_MANAGEMENT, ONCS_WRITE_ZEROES};
        assert!(optional_command(ONCS_WRITE_ZEROES, ONCS_WRITE_ZEROES, "Write Zeroes").is_ok());
        let e = optional_command(ONCS_DATASET_MANAGEMENT, ONCS_WRITE_ZEROES, "Write Zeroes").unwrap_err();
        assert!(e.to_string().contains("Write Zeroes") && e.to_string().contains("ONCS"), "{e}");
        assert!(optional_command(0, ONCS_DATASET_MANAGEMENT, "Dataset Management (deallocate)").is_err());
    }
}
