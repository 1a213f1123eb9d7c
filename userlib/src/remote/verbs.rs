//! rdma-core (libibverbs and librdmacm) from Rust: the one module of the RDMA transport that
//! holds `unsafe`. The libraries are loaded at run time with `dlopen` (as `gpu/hip.rs` loads
//! HIP, and for the same reason: two calls we already have through `libc`, and a library that
//! is never unloaded), so ugds builds and runs where rdma-core is absent; an RDMA open there
//! fails with [`Error::Unsupported`] naming the missing library.
//!
//! # Where the declarations come from
//!
//! The function signatures restate `/usr/include/infiniband/verbs.h` and
//! `/usr/include/rdma/rdma_cma.h` of rdma-core 44. `ibv_post_send`, `ibv_post_recv` and
//! `ibv_poll_cq` are `static inline` there: they call through `context->ops`, so the struct
//! prefixes below replicate exactly the fields on that way (and the others we read or fill),
//! and `layout_tests` compiles a C program against the installed headers to prove every size
//! and offset used here. Constants (enum values, flags) are the headers' too.
//!
//! # What the safe types promise
//!
//! [`Endpoint`] is one connected RC queue pair with its own protection domain, completion
//! queue and a registered region of capsule and response slots; [`Mr`] a registration of
//! memory borrowed for its lifetime. Dropping an endpoint destroys its queue pair before the
//! region is deregistered and freed, so the NIC can no longer reach that memory; a [`Mr`] is
//! dropped by its user only after the queue pair that could use its key is destroyed or every
//! command naming it has completed (see `rdma.rs`).

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IbvSge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Debug)]
struct IbvRecvWr {
    wr_id: u64,
    next: *mut IbvRecvWr,
    sg_list: *mut IbvSge,
    num_sge: c_int,
}

/// `struct ibv_send_wr`: the fields up to `send_flags`, then the unions (immediate data, the
/// RDMA/atomic/UD addressing, XRC, bind-MW/TSO), which a SEND leaves zero.
#[repr(C)]
#[derive(Debug)]
struct IbvSendWr {
    wr_id: u64,
    next: *mut IbvSendWr,
    sg_list: *mut IbvSge,
    num_sge: c_int,
    opcode: u32,
    send_flags: u32,
    imm_data: u32,
    unions: [u64; 11],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IbvWc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    vendor_err: u32,
    pub(crate) byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Default)]
struct IbvQpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug)]
struct IbvQpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: IbvQpCap,
    qp_type: u32,
    sq_sig_all: c_int,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
struct IbvMr {
    context: *mut c_void,
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut IbvWc) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// `struct ibv_context` up to `ops.post_recv` (the 27th function pointer of
/// `struct ibv_context_ops`; `poll_cq` is the 12th, `req_notify_cq` the 13th, `post_send` the
/// 26th).
#[repr(C)]
struct IbvContext {
    device: *mut c_void,
    ops_before_poll_cq: [usize; 11],
    poll_cq: Option<PollCq>,
    req_notify_cq: Option<ReqNotifyCq>,
    ops_before_post_send: [usize; 12],
    post_send: Option<PostSend>,
    post_recv: Option<PostRecv>,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
struct IbvCompChannel {
    context: *mut IbvContext,
    fd: c_int,
    refcnt: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
struct RdmaEventChannel {
    fd: c_int,
}

/// `struct rdma_cm_id` up to `qp`.
#[repr(C)]
struct RdmaCmId {
    verbs: *mut IbvContext,
    channel: *mut RdmaEventChannel,
    context: *mut c_void,
    qp: *mut c_void,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Debug)]
struct RdmaConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

/// `struct rdma_cm_event` up to `param.conn` (the union's other member, `ud`, is not read).
#[repr(C)]
struct RdmaCmEvent {
    id: *mut RdmaCmId,
    listen_id: *mut RdmaCmId,
    event: u32,
    status: c_int,
    conn: RdmaConnParam,
}

/// `enum rdma_cm_event_type` values used.
pub(crate) mod cm_event {
    pub(crate) const ADDR_RESOLVED: u32 = 0;
    pub(crate) const ROUTE_RESOLVED: u32 = 2;
    pub(crate) const REJECTED: u32 = 8;
    pub(crate) const ESTABLISHED: u32 = 9;
    pub(crate) const DISCONNECTED: u32 = 10;
}
const RDMA_PS_TCP: c_int = 0x0106;
const IBV_QPT_RC: u32 = 2;
const IBV_WR_SEND: u32 = 2;
const IBV_SEND_SIGNALED: u32 = 1 << 1;
/// `IBV_ACCESS_LOCAL_WRITE`, `_REMOTE_WRITE`, `_REMOTE_READ`.
pub(crate) const ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const ACCESS_REMOTE_WRITE: c_int = 2;
pub(crate) const ACCESS_REMOTE_READ: c_int = 4;
/// `IBV_WC_SUCCESS`.
pub(crate) const WC_SUCCESS: u32 = 0;
/// `IBV_WC_RECV`: set in the opcode of every receive completion.
pub(crate) const WC_RECV: u32 = 1 << 7;

/// The rdma-core functions used, looked up once.
struct Lib {
    create_event_channel: unsafe extern "C" fn() -> *mut RdmaEventChannel,
    destroy_event_channel: unsafe extern "C" fn(*mut RdmaEventChannel),
    create_id: unsafe extern "C" fn(*mut RdmaEventChannel, *mut *mut RdmaCmId, *mut c_void, c_int) -> c_int,
    destroy_id: unsafe extern "C" fn(*mut RdmaCmId) -> c_int,
    resolve_addr: unsafe extern "C" fn(*mut RdmaCmId, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int,
    resolve_route: unsafe extern "C" fn(*mut RdmaCmId, c_int) -> c_int,
    create_qp: unsafe extern "C" fn(*mut RdmaCmId, *mut c_void, *mut IbvQpInitAttr) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut RdmaCmId),
    connect: unsafe extern "C" fn(*mut RdmaCmId, *mut RdmaConnParam) -> c_int,
    disconnect: unsafe extern "C" fn(*mut RdmaCmId) -> c_int,
    get_cm_event: unsafe extern "C" fn(*mut RdmaEventChannel, *mut *mut RdmaCmEvent) -> c_int,
    ack_cm_event: unsafe extern "C" fn(*mut RdmaCmEvent) -> c_int,
    event_str: unsafe extern "C" fn(u32) -> *const c_char,
    create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    get_cq_event: unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut c_void, *mut *mut c_void) -> c_int,
    ack_cq_events: unsafe extern "C" fn(*mut c_void, u32),
    alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut c_void,
    dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    create_cq: unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr,
    reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr>,
    dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
}

/// The sonames loaded.
const VERBS_SONAME: &str = "libibverbs.so.1";
const RDMACM_SONAME: &str = "librdmacm.so.1";

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call on
    // this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null and NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Loads `soname` for good (never closed: rdma-core's providers stay loaded with it).
fn open_lib(soname: &str) -> std::result::Result<*mut c_void, String> {
    let c = std::ffi::CString::new(soname).map_err(|_| format!("{soname:?} has a NUL"))?;
    // SAFETY: dlopen with a NUL-terminated name; running rdma-core's initialisers is what
    // loading it means.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!("{soname}: {}", dl_error()));
    }
    Ok(h)
}

fn sym(lib: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `lib` is a live handle from dlopen (never closed); `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

impl Lib {
    fn load(verbs_name: &str, cm_name: &str) -> std::result::Result<Lib, String> {
        let verbs = open_lib(verbs_name)?;
        let cm = open_lib(cm_name)?;
        let need = |lib, name: &CStr| sym(lib, name).ok_or_else(|| format!("{name:?} is missing from rdma-core"));
        macro_rules! f {
            ($lib:expr, $name:literal) => {{
                let p = need($lib, $name)?;
                // SAFETY: `p` is the address of the exported C function `$name`, whose C
                // declaration in verbs.h / rdma_cma.h the field's type restates.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        let reg_dmabuf_mr = sym(verbs, c"ibv_reg_dmabuf_mr").map(|p| {
            // SAFETY: the address of `struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t
            // offset, size_t length, uint64_t iova, int fd, int access)` (rdma-core 34+).
            unsafe { std::mem::transmute::<*mut c_void, _>(p) }
        });
        Ok(Lib {
            create_event_channel: f!(cm, c"rdma_create_event_channel"),
            destroy_event_channel: f!(cm, c"rdma_destroy_event_channel"),
            create_id: f!(cm, c"rdma_create_id"),
            destroy_id: f!(cm, c"rdma_destroy_id"),
            resolve_addr: f!(cm, c"rdma_resolve_addr"),
            resolve_route: f!(cm, c"rdma_resolve_route"),
            create_qp: f!(cm, c"rdma_create_qp"),
            destroy_qp: f!(cm, c"rdma_destroy_qp"),
            connect: f!(cm, c"rdma_connect"),
            disconnect: f!(cm, c"rdma_disconnect"),
            get_cm_event: f!(cm, c"rdma_get_cm_event"),
            ack_cm_event: f!(cm, c"rdma_ack_cm_event"),
            event_str: f!(cm, c"rdma_event_str"),
            create_comp_channel: f!(verbs, c"ibv_create_comp_channel"),
            destroy_comp_channel: f!(verbs, c"ibv_destroy_comp_channel"),
            get_cq_event: f!(verbs, c"ibv_get_cq_event"),
            ack_cq_events: f!(verbs, c"ibv_ack_cq_events"),
            alloc_pd: f!(verbs, c"ibv_alloc_pd"),
            dealloc_pd: f!(verbs, c"ibv_dealloc_pd"),
            create_cq: f!(verbs, c"ibv_create_cq"),
            destroy_cq: f!(verbs, c"ibv_destroy_cq"),
            reg_mr: f!(verbs, c"ibv_reg_mr"),
            reg_dmabuf_mr,
            dereg_mr: f!(verbs, c"ibv_dereg_mr"),
            wc_status_str: f!(verbs, c"ibv_wc_status_str"),
        })
    }

    fn event_name(&self, ev: u32) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        let p = unsafe { (self.event_str)(ev) };
        if p.is_null() {
            return format!("event {ev}");
        }
        // SAFETY: non-null, static, NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// What `Lib::load` of the default sonames gave.
static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();

fn missing(why: String) -> Error {
    Error::Unsupported {
        what: "NVMe over RDMA",
        why: format!("rdma-core is missing: {why}"),
        fix: "install rdma-core's libraries (Debian: libibverbs1, librdmacm1 and ibverbs-providers)",
    }
}

fn lib() -> Result<&'static Lib> {
    LIB.get_or_init(|| Lib::load(VERBS_SONAME, RDMACM_SONAME)).as_ref().map_err(|e| missing(e.clone()))
}

/// Checks that rdma-core can be loaded from `verbs` and `cm` (tests of the missing-library
/// error).
#[cfg(test)]
pub(crate) fn try_load(verbs: &str, cm: &str) -> Result<()> {
    Lib::load(verbs, cm).map(|_| ()).map_err(missing)
}

/// The name of a work completion status.
pub(crate) fn wc_status(status: u32) -> String {
    let Ok(l) = lib() else { return format!("status {status}") };
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let p = unsafe { (l.wc_status_str)(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, static, NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

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

/// A registration of memory that outlives `'a`, with the PD of an endpoint that outlives `'a`
/// (so it is deregistered before that PD is freed).
#[derive(Debug)]
pub(crate) struct Mr<'a> {
    mr: *mut IbvMr,
    pub(crate) addr: u64,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    _mem: PhantomData<(&'a mut [u8], &'a Endpoint)>,
}

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

    /// Registers `mem` for `access` with this endpoint's PD.
    pub(crate) fn register<'a>(&'a self, mem: &'a [u8], access: c_int) -> std::io::Result<Mr<'a>> {
        // SAFETY: `pd` is live; `mem` stays borrowed (and so mapped) while the Mr lives. The
        // NIC writes into it only with ACCESS_REMOTE_WRITE, which callers ask for only for
        // memory they hold exclusively (see `register_mut`).
        let mr = unsafe { (self.lib.reg_mr)(self.pd, mem.as_ptr().cast_mut().cast(), mem.len().max(1), access) };
        self.wrap(mr, mem.as_ptr() as u64)
    }

    /// Registers `mem` for the target to write into (and read).
    pub(crate) fn register_mut<'a>(&'a self, mem: &'a mut [u8]) -> std::io::Result<Mr<'a>> {
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        // SAFETY: `pd` is live; `mem` is borrowed exclusively for the Mr's lifetime, so the
        // NIC's writes race with no Rust reference.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, mem.as_mut_ptr().cast(), mem.len().max(1), access) };
        self.wrap(mr, mem.as_ptr() as u64)
    }

    /// Registers `len` bytes at `offset` of dma-buf `fd` (GPU memory) at I/O virtual address
    /// `iova`, for remote reads and writes.
    pub(crate) fn register_dmabuf(&self, fd: c_int, offset: u64, len: usize, iova: u64) -> std::io::Result<Mr<'_>> {
        let Some(f) = self.lib.reg_dmabuf_mr else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has it)",
            ));
        };
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        // SAFETY: `pd` is live; the kernel checks `fd` and the range against the dma-buf and
        // takes its own reference, so no host memory of ours is named.
        let mr = unsafe { f(self.pd, offset, len, iova, fd, access) };
        self.wrap(mr, iova)
    }

    fn wrap<'a>(&'a self, mr: *mut IbvMr, addr: u64) -> std::io::Result<Mr<'a>> {
        if mr.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a non-null result of a registration is a live ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Mr { mr, addr, lkey, rkey, _mem: PhantomData })
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

    /// Takes up to `out.len()` completions without waiting.
    fn poll(&self, out: &mut [IbvWc]) -> std::io::Result<usize> {
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
        let arm =
            self.context().req_notify_cq.ok_or_else(|| std::io::Error::other("the provider has no req_notify_cq"))?;
        loop {
            // SAFETY: `cq` is live and has a completion channel; 0: any completion.
            let r = unsafe { arm(self.cq, 0) };
            if r != 0 {
                return Err(std::io::Error::from_raw_os_error(r));
            }
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
                let (kind, status, _) = self.read_cm_event()?;
                let what =
                    if kind == cm_event::DISCONNECTED { "the target disconnected" } else { "the connection ended" };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    format!("{what}: {} (status {status})", self.lib.event_name(kind)),
                ));
            }
            if fds[0].revents != 0 {
                let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
                // SAFETY: `comp` is live and readable, so this does not block; the event is
                // acked at once (ibv_destroy_cq waits for every event to be acked).
                unsafe {
                    if (self.lib.get_cq_event)(self.comp, &mut cq, &mut ctx) == 0 {
                        (self.lib.ack_cq_events)(cq, 1);
                    }
                }
            }
        }
    }
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
#[path = "verbs_layout_tests.rs"]
mod layout_tests;
