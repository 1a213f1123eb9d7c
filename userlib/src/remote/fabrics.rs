//! A Fabrics controller over any transport (`transport.rs`: TCP or RDMA): Connect on the admin
//! queue (QID 0) for a new dynamic controller, Property Get/Set to read CAP and enable it
//! (CC.EN, then CSTS.RDY), Identify Controller and Namespace, Number of Queues, I/O queues
//! connected on demand (one connection each, handed to one synchronous I/O at a time or held by
//! a batch), and Keep Alive from a thread of its own.

use super::transport::{self, Cmd, Data, Done, FabricsQueue};
use super::uri::RemoteSpec;
use crate::error::{Error, Rejection, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use ugds_uapi::identify::{IdentifyController, IdentifyNamespace};
use ugds_uapi::queue::{admin, cns, feature};
use ugds_uapi::regs::{Cap, Cc, Csts, REG_CAP, REG_CC, REG_CSTS};
use ugds_uapi::tcp::{connect_status, fctype, ConnectData, CONNECT_DISABLE_SQFLOW, FABRICS_OPCODE};
use ugds_uapi::{Sqe, Status, StatusType};
use zerocopy::{FromBytes, IntoBytes};

/// Keep Alive timeout asked for in the admin Connect; a Keep Alive goes out every third of it.
const KATO_MS: u32 = 15_000;
/// Admin queue entries.
const ADMIN_DEPTH: u16 = 32;
/// I/O queue entries (the Linux initiator's default queue size).
const IO_DEPTH: u16 = 128;
/// I/O queues asked for (each is one connection).
const IO_QUEUES: u16 = 8;
/// Keep Alive opcode.
const KEEP_ALIVE: u8 = 0x18;
/// Offset of IOCCSZ (I/O queue command capsule supported size, in 16-byte units) in Identify
/// Controller, and of ICDOFF (in-capsule data offset) after it.
const IOCCSZ_OFFSET: usize = 1792;
const ICDOFF_OFFSET: usize = 1798;

/// A namespace's shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NsInfo {
    pub(crate) nsid: u32,
    pub(crate) block_size: u64,
    pub(crate) blocks: u64,
    /// `blocks * block_size`, which [`Controller::namespace`] checked fits a u64.
    pub(crate) bytes: u64,
}

/// An I/O queue of some transport.
pub(crate) type Queue = Box<dyn FabricsQueue>;

#[derive(Debug, Default)]
struct Pool {
    free: Vec<Queue>,
    /// QIDs of queues that were dropped (their connection broke), for the next connection.
    spare: Vec<u16>,
    next_qid: u16,
    /// Callers waiting in [`Controller::take_queue`] for a queue to come back: a queue is
    /// returned after every synchronous I/O, and a wake-up is a system call even when nobody
    /// waits, so one is made only for a waiter.
    waiters: usize,
}

/// A connected, enabled controller.
#[derive(Debug)]
pub(crate) struct Controller {
    pub(crate) spec: RemoteSpec,
    /// `HOST:PORT`.
    pub(crate) target: String,
    hostnqn: String,
    hostid: [u8; 16],
    pub(crate) cntlid: u16,
    admin: Arc<Mutex<Queue>>,
    /// Model and serial, trimmed.
    pub(crate) model: String,
    pub(crate) serial: String,
    /// The largest transfer of one command (MDTS, or our own cap).
    pub(crate) max_transfer: u64,
    /// A volatile write cache is present (Flush does something).
    pub(crate) vwc: bool,
    in_capsule: usize,
    io_depth: usize,
    max_queues: u16,
    pool: Mutex<Pool>,
    returned: Condvar,
    /// Wake-ups made in `put_queue` (tests).
    #[cfg(test)]
    pub(crate) wakes: std::sync::atomic::AtomicU64,
    keep_alive: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// Set when the controller is known gone on the target (its admin queue failed, or an I/O
    /// queue could not join it): the path then connects a new one.
    dead: Arc<AtomicBool>,
}

/// A Fabrics command of type `fct`.
fn fabrics(fct: u8) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE, 0);
    // FCTYPE is byte 4, where other commands have the low byte of the NSID.
    s.set_nsid(u32::from(fct));
    s
}

/// What a Connect's failure status means.
fn connect_reason(s: Status) -> &'static str {
    if s.sct != StatusType::CommandSpecific {
        return "the Connect command failed";
    }
    match s.sc {
        connect_status::INVALID_PARAMETERS => "invalid parameters: most likely no such subsystem NQN on this port",
        connect_status::INVALID_HOST => "this host NQN is not allowed to use the subsystem",
        connect_status::CONTROLLER_BUSY => "the controller is busy",
        connect_status::INCOMPATIBLE_FORMAT => "incompatible Connect format",
        connect_status::RESTART_DISCOVERY => "the target asks to restart discovery",
        _ => "the Connect command failed",
    }
}

impl Controller {
    /// Connects to the subsystem of `spec`, enables a new controller and identifies it.
    pub(crate) fn connect(spec: &RemoteSpec) -> Result<Controller> {
        let target = spec.address();
        let hostnqn = spec.host_nqn();
        let hostid = spec.host_id_for(Some(&hostnqn));
        let (q, cntlid) = connect_queue(spec, &hostnqn, hostid, 0, ADMIN_DEPTH, 0xFFFF)?;
        let mut c = Controller {
            spec: spec.clone(),
            target,
            hostnqn,
            hostid,
            cntlid,
            admin: Arc::new(Mutex::new(q)),
            model: String::new(),
            serial: String::new(),
            max_transfer: super::MAX_COMMAND_BYTES,
            vwc: false,
            in_capsule: 0,
            io_depth: 1,
            max_queues: 0,
            pool: Mutex::new(Pool { next_qid: 1, ..Default::default() }),
            returned: Condvar::new(),
            #[cfg(test)]
            wakes: Default::default(),
            keep_alive: None,
            dead: Arc::new(AtomicBool::new(false)),
        };
        let cap = Cap(c.property_get(REG_CAP, true)?);
        c.enable(cap)?;
        c.identify_controller(cap)?;
        let n = IO_QUEUES - 1;
        let d = c.admin_cmd(
            {
                let mut s = Sqe::new(admin::SET_FEATURES, 0);
                s.set_cdw(10, feature::NUMBER_OF_QUEUES);
                s.set_cdw(11, u32::from(n) << 16 | u32::from(n));
                s
            },
            Data::None,
            "Set Features (Number of Queues)",
        )?;
        // CAST: NSQA and NCQA, 0's based, in the low and high halves of dword 0.
        let granted = (d.result as u16).min((d.result >> 16) as u16);
        c.max_queues = granted.saturating_add(1).min(IO_QUEUES);
        c.io_depth = usize::from(IO_DEPTH.min(cap.mqes().saturating_add(1)));
        c.start_keep_alive();
        Ok(c)
    }

    /// Runs one admin command; a failure status is an error.
    fn admin_cmd(&self, sqe: Sqe, data: Data<'_>, op: &'static str) -> Result<Done> {
        let mut q = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let mut cmds = [Cmd { sqe, data }];
        let d = q.execute(&mut cmds, op)?[0];
        if !d.status.is_success() {
            return Err(Error::Nvme { op, slba: 0, status: d.status });
        }
        Ok(d)
    }

    fn property_get(&self, offset: usize, eight: bool) -> Result<u64> {
        let mut s = fabrics(fctype::PROPERTY_GET);
        s.set_cdw(10, u32::from(eight));
        // CAST: register offsets are small.
        s.set_cdw(11, offset as u32);
        Ok(self.admin_cmd(s, Data::None, "Property Get")?.result)
    }

    fn property_set(&self, offset: usize, value: u32) -> Result<()> {
        let mut s = fabrics(fctype::PROPERTY_SET);
        // CAST: register offsets are small.
        s.set_cdw(11, offset as u32);
        s.set_cdw(12, value);
        self.admin_cmd(s, Data::None, "Property Set").map(|_| ())
    }

    /// CC.EN = 1 with the NVM command set and 64/16-byte entries, then waits (CAP.TO bounded
    /// by the URI's timeout) for CSTS.RDY.
    fn enable(&self, cap: Cap) -> Result<()> {
        let cc = Cc(0).with_css(0).with_mps(0).with_iosqes(6).with_iocqes(4).with_en(true);
        self.property_set(REG_CC, cc.0)?;
        let limit = u64::from(cap.timeout_ms()).clamp(500, self.spec.timeout_ms.max(500));
        let deadline = Instant::now() + Duration::from_millis(limit);
        loop {
            // CAST: CSTS is a 32-bit register.
            let csts = Csts(self.property_get(REG_CSTS, false)? as u32);
            if csts.cfs() {
                return Err(Error::DeviceFaulted);
            }
            if csts.rdy() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout { op: "controller enable (CSTS.RDY)", slba: 0, timeout_ms: limit });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn identify(&self, cns_value: u32, nsid: u32, op: &'static str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        let mut s = Sqe::new(admin::IDENTIFY, 0);
        s.set_nsid(nsid);
        s.set_cdw(10, cns_value);
        self.admin_cmd(s, Data::In(&mut buf), op)?;
        Ok(buf)
    }

    fn identify_controller(&mut self, cap: Cap) -> Result<()> {
        let raw = self.identify(cns::CONTROLLER, 0, "Identify Controller")?;
        let id = IdentifyController::read_from_bytes(&raw[..])
            .map_err(|_| Error::DeviceProtocol("short Identify Controller data".into()))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        self.model = text(&id.mn);
        self.serial = text(&id.sn);
        self.vwc = id.has_volatile_write_cache();
        if let Some(m) = id.mdts_bytes(cap.min_page_size()) {
            self.max_transfer = self.max_transfer.min(m);
        }
        let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        let ioccsz = word(IOCCSZ_OFFSET) as usize;
        let icdoff = u16::from_le_bytes([raw[ICDOFF_OFFSET], raw[ICDOFF_OFFSET + 1]]);
        // Data goes at offset 0 of the capsule's data: a controller that wants it elsewhere
        // gets it by R2T only.
        self.in_capsule = if icdoff == 0 { (ioccsz * 16).saturating_sub(64).min(1 << 20) } else { 0 };
        Ok(())
    }

    /// Identify Namespace `nsid`; a namespace that is not there is [`Error::NoNamespace`].
    pub(crate) fn namespace(&self, nsid: u32) -> Result<NsInfo> {
        let raw = match self.identify(cns::NAMESPACE, nsid, "Identify Namespace") {
            Ok(r) => r,
            // Invalid Namespace or Format, or the namespace is not ready.
            Err(Error::Nvme { status, .. })
                if status.sct == StatusType::Generic && [0x0B, 0x82].contains(&status.sc) =>
            {
                return Err(Error::NoNamespace(nsid));
            }
            Err(e) => return Err(e),
        };
        let id = IdentifyNamespace::read_from_bytes(&raw[..])
            .map_err(|_| Error::DeviceProtocol("short Identify Namespace data".into()))?;
        // An inactive namespace identifies as zeroes.
        if id.size_lbas() == 0 {
            return Err(Error::NoNamespace(nsid));
        }
        let shift = id.lba_shift();
        if !(9..=16).contains(&shift) || id.format().ms() != 0 {
            return Err(Error::Unsupported {
                what: "this namespace's format",
                why: format!("{}-byte blocks with {} metadata bytes", 1u64 << shift.min(63), id.format().ms()),
                fix: "format the target's namespace with 512..65536-byte blocks and no metadata",
            });
        }
        let (block_size, blocks) = (1u64 << shift, id.size_lbas());
        // The target says how large the namespace is: a size past u64 is its error, not a
        // capacity that wraps.
        let bytes = blocks.checked_mul(block_size).ok_or_else(|| Error::RemoteProtocol {
            target: self.target.clone(),
            reason: format!(
                "namespace {nsid} is {blocks} blocks of {block_size} bytes (NSZE), a size that overflows 64 bits"
            ),
        })?;
        Ok(NsInfo { nsid, block_size, blocks, bytes })
    }

    /// Sends Keep Alive every third of the timeout until the controller is dropped.
    fn start_keep_alive(&mut self) {
        let (tx, rx) = mpsc::channel::<()>();
        let admin = self.admin.clone();
        let dead = self.dead.clone();
        let every = Duration::from_millis(u64::from(KATO_MS) / 3);
        let h = std::thread::Builder::new().name("ugds-nvmeof-ka".into()).spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                let mut q = admin.lock().unwrap_or_else(|e| e.into_inner());
                let mut cmds = [Cmd { sqe: Sqe::new(KEEP_ALIVE, 0), data: Data::None }];
                if q.execute(&mut cmds, "Keep Alive").is_err() {
                    // The admin connection is gone, and with it the controller.
                    dead.store(true, Ordering::Relaxed);
                    return;
                }
            }
        });
        // Without the thread the target ends the controller after KATO of silence; I/O then
        // fails by name, so a spawn failure is not fatal here.
        if let Ok(h) = h {
            self.keep_alive = Some((tx, h));
        }
    }

    /// An I/O queue for one I/O: a free one, a new connection while fewer than the granted
    /// number exist, else the next one returned.
    pub(crate) fn take_queue(&self) -> Result<Queue> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(q) = pool.free.pop() {
                return Ok(q);
            }
            if let Some(qid) = self.next_qid(&mut pool) {
                drop(pool);
                return self.connect_io(qid);
            }
            pool.waiters += 1;
            pool = self.returned.wait(pool).unwrap_or_else(|e| e.into_inner());
            pool.waiters -= 1;
        }
    }

    /// An I/O queue for a batch to hold, never waiting for one: `None` unless another stays
    /// free or connectable for synchronous I/O (a batch that took the last one would make
    /// the next read wait for the batch's end).
    pub(crate) fn take_spare_queue(&self) -> Result<Option<Queue>> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let unopened = (self.max_queues + 1).saturating_sub(pool.next_qid);
        if pool.free.len() + pool.spare.len() + usize::from(unopened) < 2 {
            return Ok(None);
        }
        if let Some(q) = pool.free.pop() {
            return Ok(Some(q));
        }
        match self.next_qid(&mut pool) {
            Some(qid) => {
                drop(pool);
                self.connect_io(qid).map(Some)
            }
            None => Ok(None),
        }
    }

    /// A QID for a new connection: a broken one's, or the next while fewer than the granted
    /// number exist.
    fn next_qid(&self, pool: &mut Pool) -> Option<u16> {
        match pool.spare.pop() {
            Some(q) => Some(q),
            None if pool.next_qid <= self.max_queues => {
                pool.next_qid += 1;
                Some(pool.next_qid - 1)
            }
            None => None,
        }
    }

    /// Connects I/O queue `qid`; on failure its QID goes back and the controller is taken
    /// for gone.
    fn connect_io(&self, qid: u16) -> Result<Queue> {
        // CAST: IO_DEPTH fits a u16.
        match connect_queue(&self.spec, &self.hostnqn, self.hostid, qid, self.io_depth as u16, self.cntlid) {
            Ok((mut q, _)) => {
                q.set_in_capsule(self.in_capsule);
                Ok(q)
            }
            Err(e) => {
                // The target no longer knows the controller, or cannot be reached.
                self.dead.store(true, Ordering::Relaxed);
                let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                pool.spare.push(qid);
                // A caller waiting for a queue may connect with it.
                self.wake_a_waiter(pool);
                Err(e)
            }
        }
    }

    /// True once the controller is known gone (see [`Controller::probe`]).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// After an I/O queue failed: a Keep Alive on the admin queue says whether the controller
    /// itself is still there (bounded by the timeout); if not, it is marked dead.
    pub(crate) fn probe(&self) {
        let mut cmds = [Cmd { sqe: Sqe::new(KEEP_ALIVE, 0), data: Data::None }];
        let mut q = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(q.execute(&mut cmds, "Keep Alive"), Ok(d) if d[0].status.is_success()) {
            self.dead.store(true, Ordering::Relaxed);
        }
    }

    /// Gives a queue back; a broken one is closed and its QID used for a new connection.
    pub(crate) fn put_queue(&self, q: Queue) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_broken() {
            pool.spare.push(q.qid());
        } else {
            pool.free.push(q);
        }
        self.wake_a_waiter(pool);
    }

    /// Wakes one caller waiting in [`Controller::take_queue`], if one waits, after `pool`
    /// (locked, where a waiter counts itself before it waits) got a queue or a QID back.
    fn wake_a_waiter(&self, pool: std::sync::MutexGuard<'_, Pool>) {
        if pool.waiters > 0 {
            drop(pool);
            #[cfg(test)]
            self.wakes.fetch_add(1, Ordering::Relaxed);
            self.returned.notify_one();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some((tx, h)) = self.keep_alive.take() {
            drop(tx);
            let _ = h.join();
        }
    }
}

/// Opens one connection and sends the Fabrics Connect for queue `qid` (`cntlid` 0xFFFF on the
/// admin queue: a new dynamic controller). Returns the queue and the controller ID.
fn connect_queue(
    spec: &RemoteSpec,
    hostnqn: &str,
    hostid: [u8; 16],
    qid: u16,
    depth: u16,
    cntlid: u16,
) -> Result<(Queue, u16)> {
    let mut q = transport::open(spec, qid, depth, cntlid)?;
    let data = ConnectData::new(hostid, cntlid, spec.subsysnqn.as_bytes(), hostnqn.as_bytes());
    let bytes = data.as_bytes();
    let mut s = fabrics(fctype::CONNECT);
    s.set_cdw(10, u32::from(qid) << 16);
    s.set_cdw(11, u32::from(depth - 1) | u32::from(CONNECT_DISABLE_SQFLOW) << 16);
    s.set_cdw(12, if qid == 0 { KATO_MS } else { 0 });
    let mut cmds = [Cmd { sqe: s, data: Data::Out(bytes) }];
    let d = q.execute(&mut cmds, "Fabrics Connect")?[0];
    if !d.status.is_success() {
        return Err(Error::RemoteRejected {
            target: spec.address(),
            subsysnqn: spec.subsysnqn.clone(),
            reason: connect_reason(d.status),
            status: Rejection::Connect(d.status),
        });
    }
    q.set_in_capsule(0);
    // CAST: the controller ID is dword 0's low half.
    Ok((q, d.result as u16))
}
