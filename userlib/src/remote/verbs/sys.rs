//! The C side of rdma-core as Rust sees it: the `#[repr(C)]` layouts and constants transcribed
//! from `/usr/include/infiniband/verbs.h` and `/usr/include/rdma/rdma_cma.h` (rdma-core 44;
//! `layout_tests` proves each size and offset against the installed headers), the functions
//! looked up with `dlopen`/`dlsym`, and the missing-library error.

use crate::dl::Library;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

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
pub(super) struct IbvRecvWr {
    pub(super) wr_id: u64,
    pub(super) next: *mut IbvRecvWr,
    pub(super) sg_list: *mut IbvSge,
    pub(super) num_sge: c_int,
}

/// `struct ibv_send_wr`: the fields up to `send_flags`, then the unions (immediate data, the
/// RDMA/atomic/UD addressing, XRC, bind-MW/TSO), which a SEND leaves zero.
#[repr(C)]
#[derive(Debug)]
pub(super) struct IbvSendWr {
    pub(super) wr_id: u64,
    pub(super) next: *mut IbvSendWr,
    pub(super) sg_list: *mut IbvSge,
    pub(super) num_sge: c_int,
    pub(super) opcode: u32,
    pub(super) send_flags: u32,
    pub(super) imm_data: u32,
    pub(super) unions: [u64; 11],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IbvWc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    pub(super) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(super) imm_data: u32,
    pub(super) qp_num: u32,
    pub(super) src_qp: u32,
    pub(super) wc_flags: u32,
    pub(super) pkey_index: u16,
    pub(super) slid: u16,
    pub(super) sl: u8,
    pub(super) dlid_path_bits: u8,
}

#[cfg(any(test, feature = "test-utils"))]
impl IbvWc {
    /// A completion with these fields, the rest zero (host tests and harnesses of the command
    /// loop).
    pub(crate) fn new(wr_id: u64, status: u32, opcode: u32, byte_len: u32) -> IbvWc {
        IbvWc { wr_id, status, opcode, byte_len, ..Default::default() }
    }
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Default)]
pub(super) struct IbvQpCap {
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) max_send_sge: u32,
    pub(super) max_recv_sge: u32,
    pub(super) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug)]
pub(super) struct IbvQpInitAttr {
    pub(super) qp_context: *mut c_void,
    pub(super) send_cq: *mut c_void,
    pub(super) recv_cq: *mut c_void,
    pub(super) srq: *mut c_void,
    pub(super) cap: IbvQpCap,
    pub(super) qp_type: u32,
    pub(super) sq_sig_all: c_int,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub(super) struct IbvMr {
    pub(super) context: *mut c_void,
    pub(super) pd: *mut c_void,
    pub(super) addr: *mut c_void,
    pub(super) length: usize,
    pub(super) handle: u32,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
}

pub(super) type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut IbvWc) -> c_int;
pub(super) type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
pub(super) type PostSend = unsafe extern "C" fn(*mut c_void, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub(super) type PostRecv = unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// `struct ibv_context` up to `ops.post_recv` (the 27th function pointer of
/// `struct ibv_context_ops`; `poll_cq` is the 12th, `req_notify_cq` the 13th, `post_send` the
/// 26th).
#[repr(C)]
pub(super) struct IbvContext {
    pub(super) device: *mut c_void,
    pub(super) ops_before_poll_cq: [usize; 11],
    pub(super) poll_cq: Option<PollCq>,
    pub(super) req_notify_cq: Option<ReqNotifyCq>,
    pub(super) ops_before_post_send: [usize; 12],
    pub(super) post_send: Option<PostSend>,
    pub(super) post_recv: Option<PostRecv>,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub(super) struct IbvCompChannel {
    pub(super) context: *mut IbvContext,
    pub(super) fd: c_int,
    pub(super) refcnt: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub(super) struct RdmaEventChannel {
    pub(super) fd: c_int,
}

/// `struct rdma_cm_id` up to `qp`.
#[repr(C)]
pub(super) struct RdmaCmId {
    pub(super) verbs: *mut IbvContext,
    pub(super) channel: *mut RdmaEventChannel,
    pub(super) context: *mut c_void,
    pub(super) qp: *mut c_void,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Debug)]
pub(super) struct RdmaConnParam {
    pub(super) private_data: *const c_void,
    pub(super) private_data_len: u8,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) flow_control: u8,
    pub(super) retry_count: u8,
    pub(super) rnr_retry_count: u8,
    pub(super) srq: u8,
    pub(super) qp_num: u32,
}

/// `struct rdma_cm_event` up to `param.conn` (the union's other member, `ud`, is not read).
#[repr(C)]
pub(super) struct RdmaCmEvent {
    pub(super) id: *mut RdmaCmId,
    pub(super) listen_id: *mut RdmaCmId,
    pub(super) event: u32,
    pub(super) status: c_int,
    pub(super) conn: RdmaConnParam,
}

/// `enum rdma_cm_event_type` values used.
pub(crate) mod cm_event {
    pub(crate) const ADDR_RESOLVED: u32 = 0;
    pub(crate) const ROUTE_RESOLVED: u32 = 2;
    pub(crate) const REJECTED: u32 = 8;
    pub(crate) const ESTABLISHED: u32 = 9;
    pub(crate) const DISCONNECTED: u32 = 10;
}
pub(super) const RDMA_PS_TCP: c_int = 0x0106;
pub(super) const IBV_QPT_RC: u32 = 2;
pub(super) const IBV_WR_SEND: u32 = 2;
pub(super) const IBV_SEND_SIGNALED: u32 = 1 << 1;
/// `IBV_ACCESS_LOCAL_WRITE`, `_REMOTE_WRITE`, `_REMOTE_READ`.
pub(crate) const ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const ACCESS_REMOTE_WRITE: c_int = 2;
pub(crate) const ACCESS_REMOTE_READ: c_int = 4;
/// `IBV_WC_SUCCESS`.
pub(crate) const WC_SUCCESS: u32 = 0;
/// `IBV_WC_SEND`: the opcode of a SEND's completion.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) const WC_SEND: u32 = 0;
/// `IBV_WC_RECV`: set in the opcode of every receive completion.
pub(crate) const WC_RECV: u32 = 1 << 7;

/// The rdma-core functions used, looked up once.
pub(super) struct Lib {
    pub(super) create_event_channel: unsafe extern "C" fn() -> *mut RdmaEventChannel,
    pub(super) destroy_event_channel: unsafe extern "C" fn(*mut RdmaEventChannel),
    pub(super) create_id: unsafe extern "C" fn(*mut RdmaEventChannel, *mut *mut RdmaCmId, *mut c_void, c_int) -> c_int,
    pub(super) destroy_id: unsafe extern "C" fn(*mut RdmaCmId) -> c_int,
    pub(super) resolve_addr:
        unsafe extern "C" fn(*mut RdmaCmId, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int,
    pub(super) resolve_route: unsafe extern "C" fn(*mut RdmaCmId, c_int) -> c_int,
    pub(super) create_qp: unsafe extern "C" fn(*mut RdmaCmId, *mut c_void, *mut IbvQpInitAttr) -> c_int,
    pub(super) destroy_qp: unsafe extern "C" fn(*mut RdmaCmId),
    pub(super) connect: unsafe extern "C" fn(*mut RdmaCmId, *mut RdmaConnParam) -> c_int,
    pub(super) disconnect: unsafe extern "C" fn(*mut RdmaCmId) -> c_int,
    pub(super) get_cm_event: unsafe extern "C" fn(*mut RdmaEventChannel, *mut *mut RdmaCmEvent) -> c_int,
    pub(super) ack_cm_event: unsafe extern "C" fn(*mut RdmaCmEvent) -> c_int,
    pub(super) event_str: unsafe extern "C" fn(u32) -> *const c_char,
    pub(super) create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    pub(super) destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    pub(super) get_cq_event: unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut c_void, *mut *mut c_void) -> c_int,
    pub(super) ack_cq_events: unsafe extern "C" fn(*mut c_void, u32),
    pub(super) alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut c_void,
    pub(super) dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(super) create_cq: unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub(super) destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(super) reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr,
    pub(super) reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr>,
    pub(super) dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub(super) wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
}

/// The sonames loaded.
const VERBS_SONAME: &str = "libibverbs.so.1";
const RDMACM_SONAME: &str = "librdmacm.so.1";

impl Lib {
    pub(super) fn load(verbs_name: &str, cm_name: &str) -> std::result::Result<Lib, String> {
        // Loaded for good: rdma-core's providers stay loaded with it.
        let open = |name: &str| Library::open(name).map_err(|e| format!("{name}: {e}"));
        let (verbs, cm) = (open(verbs_name)?, open(cm_name)?);
        macro_rules! f {
            ($lib:expr, $name:literal) => {
                // SAFETY: `$name` is rdma-core's exported C function, whose declaration in
                // verbs.h / rdma_cma.h the field's type restates; the library is never closed.
                unsafe { $lib.function($name) }.ok_or_else(|| format!("{:?} is missing from rdma-core", $name))?
            };
        }
        // SAFETY: `struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t offset, size_t
        // length, uint64_t iova, int fd, int access)` (rdma-core 34+; optional); never closed.
        let reg_dmabuf_mr = unsafe { verbs.function(c"ibv_reg_dmabuf_mr") };
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

    pub(super) fn event_name(&self, ev: u32) -> String {
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

pub(super) fn lib() -> Result<&'static Lib> {
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
