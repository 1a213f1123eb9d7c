//! rdma-core (libibverbs and librdmacm) from Rust: the one module of the RDMA transport that
//! holds `unsafe`. The libraries are loaded at run time with `dlopen` (as `gpu/hip.rs` loads
//! HIP, and for the same reason: two calls we already have through `libc`, and a library that
//! is never unloaded), so ugds builds and runs where rdma-core is absent; an RDMA open there
//! fails with [`Error::Unsupported`] naming the missing library.
//!
//! # Where the declarations come from
//!
//! `sys` restates `/usr/include/infiniband/verbs.h` and `/usr/include/rdma/rdma_cma.h` of
//! rdma-core 44. `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` there: they call through `context->ops`, so the struct prefixes replicate
//! exactly the fields on that way (and the others we read or fill), and `layout_tests` compiles
//! a C program against the installed headers to prove every size, offset and constant used.
//! bindgen was not used: it would need libclang and the headers at build time, which is what
//! loading at run time avoids, for a dozen small structs.
//!
//! # What the safe types promise
//!
//! [`Endpoint`] is one connected RC queue pair with its own protection domain, completion
//! queue and a registered region of capsule and response slots; [`Mr`] a registration of
//! memory borrowed for its lifetime (it borrows the endpoint too, so it is deregistered before
//! the PD goes), or, from the `unsafe` [`Endpoint::register_raw`], one whose user keeps the
//! memory and the endpoint alive instead (a batch's command, a queue's own chunks). Dropping
//! an endpoint destroys its queue pair before the region is deregistered and freed, so the NIC
//! can no longer reach that memory. A [`Mr`] is dropped by its user only after every command
//! naming it completed, or after [`Endpoint::kill`] moved the queue pair to the error state
//! (see `rdma.rs`).

mod sys;

#[cfg(any(test, feature = "test-utils"))]
pub(crate) use sys::WC_SEND;
use sys::*;
pub(crate) use sys::{wc_status, IbvSge, IbvWc, WC_RECV, WC_SUCCESS};

use crate::error::Error;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// How a connection attempt failed.
#[derive(Debug)]
pub(crate) enum CmError {
    /// rdma-core is missing (the error says which library).
    Missing(Error),
    /// The peer rejected the connect request; its private data (the NVMe/RDMA reject record
    /// when it is one).
    Rejected { status: i32, private: Vec<u8> },
    /// A step failed or timed out.
    Failed { step: &'static str, why: std::io::Error },
}

/// Bytes of one capsule slot: the SQE (in-capsule data goes from the caller's memory as a
/// second gather element).
pub(crate) const CAPSULE: usize = 64;
/// Bytes of one response slot: the CQE.
pub(crate) const RESPONSE: usize = 16;

/// What the target may do to registered memory: for the caller's memory, never more than the
/// command's direction needs; a queue's own chunks ([`TargetAccess::Either`]) take both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetAccess {
    /// The target RDMA-reads the memory (a write to the target; our SENDs read it too, which
    /// needs no flag).
    Read,
    /// The target RDMA-writes the memory (a read from the target).
    Write,
    /// Either: memory of a queue's own that stages small commands' data both ways.
    Either,
}

impl TargetAccess {
    /// The `ibv_access_flags` of a registration for this access.
    pub(crate) fn flags(self) -> c_int {
        match self {
            TargetAccess::Read => ACCESS_REMOTE_READ,
            // Verbs refuses REMOTE_WRITE without LOCAL_WRITE.
            TargetAccess::Write => ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            TargetAccess::Either => ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
        }
    }
}

/// Where the target reaches registered memory, and the key a local SEND gathers it with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    pub(crate) addr: u64,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// A registration of memory that outlives `'a`, with the PD of an endpoint that outlives `'a`
/// (so it is deregistered before that PD is freed).
#[derive(Debug)]
pub(crate) struct Mr<'a> {
    mr: *mut IbvMr,
    keys: Keys,
    _mem: PhantomData<(&'a mut [u8], &'a Endpoint)>,
}

impl Mr<'_> {
    /// The registration's keys, at its start.
    pub(crate) fn keys(&self) -> Keys {
        self.keys
    }
}

// SAFETY: an ibv_mr may be deregistered from any thread (verbs are thread-safe per the
// rdma-core documentation); the memory it names is borrowed as `PhantomData` says.
unsafe impl Send for Mr<'_> {}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: `mr` came from ibv_reg_mr/ibv_reg_dmabuf_mr and is deregistered once.
            unsafe { (l.dereg_mr)(self.mr) };
        }
    }
}

/// One connected RC queue pair with its own PD, CQ and a registered region of `slots`
/// capsule slots followed by `slots` response slots.
///
/// # Invariants
///
/// Every pointer field is live until `Drop`, which releases them in reverse order of
/// creation, the queue pair first; `region` is `region_len` bytes from `alloc_zeroed`.
#[derive(Debug)]
pub(crate) struct Endpoint {
    lib: &'static Lib,
    ch: *mut RdmaEventChannel,
    id: *mut RdmaCmId,
    pd: *mut c_void,
    comp: *mut IbvCompChannel,
    cq: *mut c_void,
    qp: *mut c_void,
    region: *mut u8,
    region_len: usize,
    region_mr: *mut IbvMr,
    slots: usize,
    connected: std::sync::atomic::AtomicBool,
    /// An epoll descriptor readable while the completion channel or the CM event channel is:
    /// what a batch waits on (closed after `Drop` released the channels).
    ready: Option<OwnedFd>,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("rdma-core")
    }
}

// SAFETY: rdma-core's verbs objects may be used from any thread; the pointers are owned by
// the endpoint alone.
unsafe impl Send for Endpoint {}
// SAFETY: through `&Endpoint`: registrations (ibv_reg_mr is thread-safe), posts and polls
// (providers lock their queues: verbs are thread-safe per the rdma-core documentation), and
// plain reads; the only mutable state is an atomic.
unsafe impl Sync for Endpoint {}

fn os_err(step: &'static str) -> CmError {
    CmError::Failed { step, why: std::io::Error::last_os_error() }
}

/// `addr` as a C socket address.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid (unspecified) address.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in>(), sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in6>(), sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

impl Endpoint {
    /// Resolves `addr`, creates the queue pair (`slots` sends and receives, `send_sge` gather
    /// elements per send), posts a receive on every response slot and connects with
    /// `private` as the request's private data; every step within `timeout`.
    pub(crate) fn connect(
        addr: SocketAddr,
        private: &[u8],
        slots: usize,
        send_sge: u32,
        timeout: Duration,
    ) -> std::result::Result<Endpoint, CmError> {
        let lib = lib().map_err(CmError::Missing)?;
        let deadline = Instant::now() + timeout;
        // SAFETY: no arguments; NULL (with errno) on failure.
        let ch = unsafe { (lib.create_event_channel)() };
        if ch.is_null() {
            return Err(os_err("rdma_create_event_channel"));
        }
        // INVARIANT: the fields are filled in as they are created; Drop releases what is
        // non-null.
        let mut ep = Endpoint {
            lib,
            ch,
            id: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            comp: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            region: std::ptr::null_mut(),
            region_len: 0,
            region_mr: std::ptr::null_mut(),
            slots,
            connected: std::sync::atomic::AtomicBool::new(false),
            ready: None,
        };
        // SAFETY: `ch` is live; `id` receives the new id.
        if unsafe { (lib.create_id)(ch, &mut ep.id, std::ptr::null_mut(), RDMA_PS_TCP) } != 0 {
            return Err(os_err("rdma_create_id"));
        }
        let (mut dst, _) = sockaddr(addr);
        let ms = |d: Instant| d.saturating_duration_since(Instant::now()).as_millis().clamp(1, 60_000) as c_int;
        // SAFETY: `id` is live; `dst` is a valid sockaddr for its family; no source address.
        if unsafe { (lib.resolve_addr)(ep.id, std::ptr::null_mut(), (&raw mut dst).cast(), ms(deadline)) } != 0 {
            return Err(os_err("rdma_resolve_addr"));
        }
        ep.expect(cm_event::ADDR_RESOLVED, "address resolution", deadline)?;
        // SAFETY: `id` is live and its address is resolved.
        if unsafe { (lib.resolve_route)(ep.id, ms(deadline)) } != 0 {
            return Err(os_err("rdma_resolve_route"));
        }
        ep.expect(cm_event::ROUTE_RESOLVED, "route resolution", deadline)?;
        // SAFETY: `id` is live with a resolved route, so `verbs` is its device's context.
        let verbs = unsafe { (*ep.id).verbs };
        if verbs.is_null() {
            return Err(CmError::Failed { step: "route resolution", why: std::io::Error::other("no RDMA device") });
        }
        // SAFETY: `verbs` is a live device context.
        ep.pd = unsafe { (lib.alloc_pd)(verbs) };
        if ep.pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        // SAFETY: `verbs` is live.
        ep.comp = unsafe { (lib.create_comp_channel)(verbs) };
        if ep.comp.is_null() {
            return Err(os_err("ibv_create_comp_channel"));
        }
        // Non-blocking, so taking the channel's events (`take_events`) never sleeps: rdma-core
        // documents this for completion channels.
        // SAFETY: `comp` is live; its fd is the channel's own, open for the channel's life.
        let cfd = unsafe { (*ep.comp).fd };
        // SAFETY: plain fcntl calls on an open descriptor.
        let nonblocking = unsafe {
            let flags = libc::fcntl(cfd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(cfd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            return Err(os_err("fcntl(O_NONBLOCK) on the completion channel"));
        }
        // SAFETY: no pointers; a new descriptor or -1.
        let efd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if efd < 0 {
            return Err(os_err("epoll_create1"));
        }
        // SAFETY: `efd` is a new descriptor owned by nothing else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        // SAFETY: `ch` is live.
        let mfd = unsafe { (*ep.ch).fd };
        for fd in [cfd, mfd] {
            // CAST: a descriptor is non-negative.
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
            // SAFETY: both descriptors are open; `ev` is valid for the call.
            if unsafe { libc::epoll_ctl(efd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(os_err("epoll_ctl"));
            }
        }
        ep.ready = Some(efd);
        // CAST: slots is at most a few hundred.
        let cqe = (2 * slots + 2) as c_int;
        // SAFETY: `verbs` and `comp` are live; vector 0.
        ep.cq = unsafe { (lib.create_cq)(verbs, cqe, std::ptr::null_mut(), ep.comp.cast(), 0) };
        if ep.cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        let mut attr = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: ep.cq,
            recv_cq: ep.cq,
            srq: std::ptr::null_mut(),
            // CAST: slots is at most a few hundred.
            cap: IbvQpCap {
                max_send_wr: slots as u32 + 1,
                max_recv_wr: slots as u32 + 1,
                max_send_sge: send_sge,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `id`, `pd` and `cq` are live; `attr` is a valid init attribute.
        if unsafe { (lib.create_qp)(ep.id, ep.pd, &mut attr) } != 0 {
            return Err(os_err("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so `id->qp` is the new queue pair.
        ep.qp = unsafe { (*ep.id).qp };
        ep.region_len = slots * (CAPSULE + RESPONSE);
        let layout = std::alloc::Layout::from_size_align(ep.region_len.max(64), 64)
            .map_err(|_| CmError::Failed { step: "allocation", why: std::io::Error::other("bad layout") })?;
        // SAFETY: the layout has a non-zero size.
        ep.region = unsafe { std::alloc::alloc_zeroed(layout) };
        if ep.region.is_null() {
            return Err(CmError::Failed { step: "allocation", why: std::io::Error::other("out of memory") });
        }
        // SAFETY: `pd` is live; the region is `region_len` bytes owned by the endpoint until
        // after this registration is released (Drop).
        ep.region_mr = unsafe { (lib.reg_mr)(ep.pd, ep.region.cast(), ep.region_len, ACCESS_LOCAL_WRITE) };
        if ep.region_mr.is_null() {
            return Err(os_err("ibv_reg_mr"));
        }
        for s in 0..slots {
            ep.post_recv(s).map_err(|why| CmError::Failed { step: "ibv_post_recv", why })?;
        }
        let mut param = RdmaConnParam {
            private_data: private.as_ptr().cast(),
            // CAST: the NVMe/RDMA request is 32 bytes.
            private_data_len: private.len().min(255) as u8,
            // The target RDMA-reads write data from us.
            responder_resources: 16,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: `id` has a QP; `param` and the private data it points at outlive the call
        // (rdma_connect copies them).
        if unsafe { (lib.connect)(ep.id, &mut param) } != 0 {
            return Err(os_err("rdma_connect"));
        }
        ep.expect(cm_event::ESTABLISHED, "connect", deadline)?;
        ep.connected.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(ep)
    }

    /// Waits for the next CM event until `deadline`; anything but `want` is an error (a
    /// reject with its private data).
    fn expect(&mut self, want: u32, step: &'static str, deadline: Instant) -> std::result::Result<(), CmError> {
        // SAFETY: `ch` is live.
        let fd = unsafe { (*self.ch).fd };
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // CAST: clamped to an int's range of milliseconds.
        let ms = left.as_millis().min(i32::MAX as u128) as c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            return Err(os_err("poll on the RDMA CM event channel"));
        }
        if n == 0 {
            return Err(CmError::Failed { step, why: std::io::Error::from_raw_os_error(libc::ETIMEDOUT) });
        }
        let (kind, status, private) = self.read_cm_event().map_err(|why| CmError::Failed { step, why })?;
        if kind == want {
            return Ok(());
        }
        if kind == cm_event::REJECTED {
            return Err(CmError::Rejected { status, private });
        }
        let name = self.lib.event_name(kind);
        let why = if status < 0 {
            std::io::Error::from_raw_os_error(-status)
        } else {
            std::io::Error::other(format!("{name} (status {status})"))
        };
        let why = std::io::Error::new(why.kind(), format!("{name}: {why}"));
        Err(CmError::Failed { step, why })
    }

    /// Reads one CM event (the channel must be readable): its type, status and private data.
    fn read_cm_event(&self) -> std::io::Result<(u32, i32, Vec<u8>)> {
        let mut ev: *mut RdmaCmEvent = std::ptr::null_mut();
        // SAFETY: `ch` is live and readable, so this does not block.
        if unsafe { (self.lib.get_cm_event)(self.ch, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: rdma_get_cm_event succeeded: `ev` is a live event until acked.
        let out = unsafe {
            let e = &*ev;
            let p = if e.conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(e.conn.private_data.cast::<u8>(), usize::from(e.conn.private_data_len))
                    .to_vec()
            };
            (e.event, e.status, p)
        };
        // SAFETY: `ev` is acked once, after its contents were copied.
        unsafe { (self.lib.ack_cm_event)(ev) };
        Ok(out)
    }

    /// Registers `mem` with this endpoint's PD for the target to read (and for local SENDs):
    /// never for writing, as `mem` is shared.
    pub(crate) fn register<'a>(&'a self, mem: &'a [u8]) -> std::io::Result<Mr<'a>> {
        let access = TargetAccess::Read.flags();
        // SAFETY: `pd` is live; `mem` stays borrowed (and so mapped) while the Mr lives, and the
        // access flags let no one write it through the registration.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, mem.as_ptr().cast_mut().cast(), mem.len().max(1), access) };
        wrap(mr, mem.as_ptr() as u64)
    }

    /// Registers `mem` for the target to write into.
    pub(crate) fn register_mut<'a>(&'a self, mem: &'a mut [u8]) -> std::io::Result<Mr<'a>> {
        let access = TargetAccess::Write.flags();
        // SAFETY: `pd` is live; `mem` is borrowed exclusively for the Mr's lifetime, so the
        // NIC's writes race with no Rust reference.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, mem.as_mut_ptr().cast(), mem.len().max(1), access) };
        wrap(mr, mem.as_ptr() as u64)
    }

    /// Registers `len` bytes at `offset` of dma-buf `fd` (GPU memory) at I/O virtual address
    /// `iova`, for the target to `access`.
    pub(crate) fn register_dmabuf(
        &self,
        fd: c_int,
        offset: u64,
        len: usize,
        iova: u64,
        access: TargetAccess,
    ) -> std::io::Result<Mr<'_>> {
        let Some(f) = self.lib.reg_dmabuf_mr else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has it)",
            ));
        };
        let access = access.flags();
        // SAFETY: `pd` is live; the kernel checks `fd` and the range against the dma-buf and
        // takes its own reference, so no host memory of ours is named.
        let mr = unsafe { f(self.pd, offset, len, iova, fd, access) };
        wrap(mr, iova)
    }

    /// Registers `len` bytes at `ptr` for the target to `access`, for a command kept in flight
    /// past any borrow (a batch's).
    ///
    /// # Safety
    /// The memory stays mapped, and (for [`TargetAccess::Write`]) nothing else reads or writes
    /// it, until the queue pair is killed ([`Endpoint::kill`]) or the command's response came;
    /// the registration is dropped before this endpoint.
    pub(crate) unsafe fn register_raw(
        &self,
        ptr: NonNull<u8>,
        len: usize,
        access: TargetAccess,
    ) -> std::io::Result<Mr<'static>> {
        // SAFETY: `pd` is live; the caller keeps the memory mapped and unshared as above, and
        // drops the registration before the PD goes (with this endpoint).
        let mr = unsafe { (self.lib.reg_mr)(self.pd, ptr.as_ptr().cast(), len.max(1), access.flags()) };
        wrap(mr, ptr.as_ptr() as u64)
    }

    /// Slots (capsules and responses).
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    fn context(&self) -> &IbvContext {
        // SAFETY: `id` is live with a QP, so `verbs` is a live context for the endpoint's life.
        unsafe { &*(*self.id).verbs }
    }

    /// Posts a receive on response slot `slot` (work request ID `slot`).
    pub(crate) fn post_recv(&self, slot: usize) -> std::io::Result<()> {
        assert!(slot < self.slots, "response slot {slot} of {}", self.slots);
        // SAFETY: in bounds of the region (checked above).
        let at = unsafe { self.region.add(self.slots * CAPSULE + slot * RESPONSE) };
        // SAFETY: `region_mr` is live.
        let lkey = unsafe { (*self.region_mr).lkey };
        // CAST: RESPONSE is 16.
        let mut sge = IbvSge { addr: at as u64, length: RESPONSE as u32, lkey };
        let mut wr = IbvRecvWr { wr_id: slot as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        let f = self.context().post_recv.ok_or_else(|| std::io::Error::other("the provider has no post_recv"))?;
        // SAFETY: `qp` is live; `wr` and `sge` are valid for the call (the provider copies
        // them); the slot lies in registered memory owned by the endpoint.
        match unsafe { f(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// The 16 bytes received in response slot `slot` (after its receive completed).
    pub(crate) fn response(&self, slot: usize) -> [u8; RESPONSE] {
        assert!(slot < self.slots, "response slot {slot} of {}", self.slots);
        let mut out = [0u8; RESPONSE];
        // SAFETY: in bounds of the region; the receive into it completed, so the NIC no longer
        // writes it until it is posted again (after this copy).
        unsafe {
            std::ptr::copy_nonoverlapping(self.region.add(self.slots * CAPSULE + slot * RESPONSE), out.as_mut_ptr(), 16)
        };
        out
    }

    /// Copies `sqe` into capsule slot `slot` and posts it as a signaled SEND (work request ID
    /// `wr_id`), followed by `data` (in-capsule data in registered memory) when given.
    pub(crate) fn send(
        &self,
        slot: usize,
        wr_id: u64,
        sqe: &[u8; CAPSULE],
        data: Option<IbvSge>,
    ) -> std::io::Result<()> {
        assert!(slot < self.slots, "capsule slot {slot} of {}", self.slots);
        // SAFETY: in bounds of the region; the slot's previous SEND completed (the caller
        // reuses a slot only after its send completion), so the NIC does not read it now.
        let at = unsafe {
            let p = self.region.add(slot * CAPSULE);
            std::ptr::copy_nonoverlapping(sqe.as_ptr(), p, CAPSULE);
            p
        };
        // SAFETY: `region_mr` is live.
        let lkey = unsafe { (*self.region_mr).lkey };
        // CAST: CAPSULE is 64.
        let mut sges = [IbvSge { addr: at as u64, length: CAPSULE as u32, lkey }, data.unwrap_or_default()];
        let mut wr = IbvSendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: if data.is_some() { 2 } else { 1 },
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            unions: [0; 11],
        };
        let mut bad = std::ptr::null_mut();
        let f = self.context().post_send.ok_or_else(|| std::io::Error::other("the provider has no post_send"))?;
        // SAFETY: `qp` is live; `wr` and `sges` are valid for the call (the provider copies
        // them); both elements name registered memory that stays registered until the SEND
        // completes (the capsule region: the endpoint's; the data: the caller's Mr).
        match unsafe { f(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// A descriptor readable once a completion came on an armed CQ ([`Endpoint::arm`]), or
    /// the connection had an event (a disconnect: [`Endpoint::check_connection`]).
    pub(crate) fn ready_fd(&self) -> RawFd {
        // SAFETY: `comp` is live (its descriptor: only before `connect` made the epoll one).
        self.ready.as_ref().map_or_else(|| unsafe { (*self.comp).fd }, |f| f.as_raw_fd())
    }

    /// An error when the connection had an event (after connecting, only its end), without
    /// waiting.
    pub(crate) fn check_connection(&self) -> std::io::Result<()> {
        // SAFETY: `ch` is live.
        let mut fds = [libc::pollfd { fd: unsafe { (*self.ch).fd }, events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd; no wait.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) } > 0 {
            return Err(self.connection_event());
        }
        Ok(())
    }

    /// The error for the connection's event, read from the readable CM channel.
    fn connection_event(&self) -> std::io::Error {
        let (kind, status, _) = match self.read_cm_event() {
            Ok(e) => e,
            Err(e) => return e,
        };
        let what = if kind == cm_event::DISCONNECTED { "the target disconnected" } else { "the connection ended" };
        std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            format!("{what}: {} (status {status})", self.lib.event_name(kind)),
        )
    }

    /// Arms the CQ: the next completion raises one event on the completion channel. One that
    /// came before is not signalled: poll after arming.
    pub(crate) fn arm(&self) -> std::io::Result<()> {
        let arm =
            self.context().req_notify_cq.ok_or_else(|| std::io::Error::other("the provider has no req_notify_cq"))?;
        // SAFETY: `cq` is live and has a completion channel; 0: any completion.
        match unsafe { arm(self.cq, 0) } {
            0 => Ok(()),
            r => Err(std::io::Error::from_raw_os_error(r)),
        }
    }

    /// Takes (and acknowledges) every event waiting on the completion channel, without
    /// waiting; after one the CQ is disarmed. Returns how many there were.
    pub(crate) fn take_events(&self) -> usize {
        let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mut n = 0;
        // SAFETY: `comp` is live and non-blocking (set at connect), so this never sleeps; each
        // event is acked at once (ibv_destroy_cq waits for every event to be acked).
        unsafe {
            while (self.lib.get_cq_event)(self.comp, &mut cq, &mut ctx) == 0 {
                (self.lib.ack_cq_events)(cq, 1);
                n += 1;
            }
        }
        n
    }

    /// Takes up to `out.len()` completions without waiting.
    pub(crate) fn poll(&self, out: &mut [IbvWc]) -> std::io::Result<usize> {
        let f = self.context().poll_cq.ok_or_else(|| std::io::Error::other("the provider has no poll_cq"))?;
        // CAST: a handful of entries.
        // SAFETY: `cq` is live; `out` has room for the number asked for.
        let n = unsafe { f(self.cq, out.len() as c_int, out.as_mut_ptr()) };
        if n < 0 {
            return Err(std::io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        // CAST: non-negative, at most out.len().
        Ok(n as usize)
    }

    /// Takes up to `out.len()` completions, waiting up to `timeout` for the first: polls a
    /// few times, then arms the CQ and sleeps in `poll(2)` on its completion channel and on
    /// the CM event channel, so a target that disconnects fails the wait at once
    /// (ECONNRESET) instead of at the timeout.
    pub(crate) fn wait(&self, out: &mut [IbvWc], timeout: Duration) -> std::io::Result<usize> {
        const SPINS: u32 = 64;
        let deadline = Instant::now() + timeout;
        for _ in 0..SPINS {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            std::hint::spin_loop();
        }
        loop {
            self.arm()?;
            // A completion that came before the CQ was armed raises no event.
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
            }
            // SAFETY: `comp` and `ch` are live.
            let (cfd, mfd) = unsafe { ((*self.comp).fd, (*self.ch).fd) };
            let mut fds = [
                libc::pollfd { fd: cfd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: mfd, events: libc::POLLIN, revents: 0 },
            ];
            // CAST: clamped to an int's range of milliseconds; at least 1.
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as c_int;
            // SAFETY: two valid pollfds.
            let k = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if k < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                return Err(self.connection_event());
            }
            if fds[0].revents != 0 {
                self.take_events();
            }
        }
    }
}

/// The result of a registration at `addr`, as an [`Mr`] of the lifetime its caller promises.
fn wrap<'a>(mr: *mut IbvMr, addr: u64) -> std::io::Result<Mr<'a>> {
    if mr.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a non-null result of a registration is a live ibv_mr.
    let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
    Ok(Mr { mr, keys: Keys { addr, lkey, rkey }, _mem: PhantomData })
}

impl Endpoint {
    /// Disconnects: the queue pair goes to the error state, so the target can no longer read
    /// or write any registration through it (its pending work requests are flushed). Used
    /// after an error, before the I/O's registrations are released.
    pub(crate) fn kill(&self) {
        if self.connected.swap(false, std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: `id` is live and connected; disconnecting twice is prevented above.
            unsafe { (self.lib.disconnect)(self.id) };
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let l = self.lib;
        // SAFETY: each object is released once, the queue pair first (after which the NIC no
        // longer reaches any memory through it), then its region's registration, the region,
        // the CQ, the PD, the id and the channel, each only if it was created.
        unsafe {
            if self.connected.load(std::sync::atomic::Ordering::Relaxed) {
                (l.disconnect)(self.id);
            }
            if !self.qp.is_null() {
                (l.destroy_qp)(self.id);
            }
            if !self.region_mr.is_null() {
                (l.dereg_mr)(self.region_mr);
            }
            if !self.region.is_null() {
                let layout = std::alloc::Layout::from_size_align_unchecked(self.region_len.max(64), 64);
                std::alloc::dealloc(self.region, layout);
            }
            if !self.cq.is_null() {
                (l.destroy_cq)(self.cq);
            }
            if !self.comp.is_null() {
                (l.destroy_comp_channel)(self.comp);
            }
            if !self.pd.is_null() {
                (l.dealloc_pd)(self.pd);
            }
            if !self.id.is_null() {
                (l.destroy_id)(self.id);
            }
            (l.destroy_event_channel)(self.ch);
        }
    }
}

#[cfg(test)]
mod layout_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_gives_the_target_only_its_directions_access() {
        // A write to the target: it reads our memory, and may not write it.
        assert_eq!(TargetAccess::Read.flags(), ACCESS_REMOTE_READ);
        // A read from the target: it writes our memory (REMOTE_WRITE needs LOCAL_WRITE), and
        // may not read what else the memory holds.
        assert_eq!(TargetAccess::Write.flags(), ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    }
}
