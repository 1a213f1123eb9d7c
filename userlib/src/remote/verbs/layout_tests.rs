//! Proves every size and offset `verbs.rs` relies on against the installed rdma-core headers:
//! a C program compiled with gcc prints them, and each is compared with Rust's. Skipped, with
//! a message, where gcc or the headers are missing.

use super::sys::*;
use crate::error::Error;
use std::mem::{offset_of, size_of};

/// (C expression, the Rust value) pairs.
fn rust_side() -> Vec<(&'static str, usize)> {
    vec![
        ("sizeof(struct ibv_sge)", size_of::<IbvSge>()),
        ("offsetof(struct ibv_sge, length)", offset_of!(IbvSge, length)),
        ("offsetof(struct ibv_sge, lkey)", offset_of!(IbvSge, lkey)),
        ("sizeof(struct ibv_recv_wr)", size_of::<IbvRecvWr>()),
        ("offsetof(struct ibv_recv_wr, next)", offset_of!(IbvRecvWr, next)),
        ("offsetof(struct ibv_recv_wr, sg_list)", offset_of!(IbvRecvWr, sg_list)),
        ("offsetof(struct ibv_recv_wr, num_sge)", offset_of!(IbvRecvWr, num_sge)),
        ("sizeof(struct ibv_send_wr)", size_of::<IbvSendWr>()),
        ("offsetof(struct ibv_send_wr, next)", offset_of!(IbvSendWr, next)),
        ("offsetof(struct ibv_send_wr, sg_list)", offset_of!(IbvSendWr, sg_list)),
        ("offsetof(struct ibv_send_wr, num_sge)", offset_of!(IbvSendWr, num_sge)),
        ("offsetof(struct ibv_send_wr, opcode)", offset_of!(IbvSendWr, opcode)),
        ("offsetof(struct ibv_send_wr, send_flags)", offset_of!(IbvSendWr, send_flags)),
        ("offsetof(struct ibv_send_wr, imm_data)", offset_of!(IbvSendWr, imm_data)),
        ("offsetof(struct ibv_send_wr, wr)", offset_of!(IbvSendWr, unions)),
        ("sizeof(struct ibv_wc)", size_of::<IbvWc>()),
        ("offsetof(struct ibv_wc, status)", offset_of!(IbvWc, status)),
        ("offsetof(struct ibv_wc, opcode)", offset_of!(IbvWc, opcode)),
        ("offsetof(struct ibv_wc, byte_len)", offset_of!(IbvWc, byte_len)),
        ("offsetof(struct ibv_wc, qp_num)", offset_of!(IbvWc, qp_num)),
        ("offsetof(struct ibv_wc, wc_flags)", offset_of!(IbvWc, wc_flags)),
        ("offsetof(struct ibv_wc, sl)", offset_of!(IbvWc, sl)),
        ("sizeof(struct ibv_qp_cap)", size_of::<IbvQpCap>()),
        ("offsetof(struct ibv_qp_cap, max_inline_data)", offset_of!(IbvQpCap, max_inline_data)),
        ("sizeof(struct ibv_qp_init_attr)", size_of::<IbvQpInitAttr>()),
        ("offsetof(struct ibv_qp_init_attr, send_cq)", offset_of!(IbvQpInitAttr, send_cq)),
        ("offsetof(struct ibv_qp_init_attr, recv_cq)", offset_of!(IbvQpInitAttr, recv_cq)),
        ("offsetof(struct ibv_qp_init_attr, cap)", offset_of!(IbvQpInitAttr, cap)),
        ("offsetof(struct ibv_qp_init_attr, qp_type)", offset_of!(IbvQpInitAttr, qp_type)),
        ("offsetof(struct ibv_qp_init_attr, sq_sig_all)", offset_of!(IbvQpInitAttr, sq_sig_all)),
        ("sizeof(struct ibv_mr)", size_of::<IbvMr>()),
        ("offsetof(struct ibv_mr, length)", offset_of!(IbvMr, length)),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(IbvMr, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(IbvMr, rkey)),
        ("offsetof(struct ibv_context, ops)", offset_of!(IbvContext, ops_before_poll_cq)),
        ("offsetof(struct ibv_context, ops.poll_cq)", offset_of!(IbvContext, poll_cq)),
        ("offsetof(struct ibv_context, ops.req_notify_cq)", offset_of!(IbvContext, req_notify_cq)),
        ("offsetof(struct ibv_context, ops.post_send)", offset_of!(IbvContext, post_send)),
        ("offsetof(struct ibv_comp_channel, fd)", offset_of!(IbvCompChannel, fd)),
        ("offsetof(struct ibv_context, ops.post_recv)", offset_of!(IbvContext, post_recv)),
        ("offsetof(struct ibv_cq, context)", 0),
        ("offsetof(struct ibv_qp, context)", 0),
        ("offsetof(struct rdma_event_channel, fd)", offset_of!(RdmaEventChannel, fd)),
        ("offsetof(struct rdma_cm_id, verbs)", offset_of!(RdmaCmId, verbs)),
        ("offsetof(struct rdma_cm_id, qp)", offset_of!(RdmaCmId, qp)),
        ("sizeof(struct rdma_conn_param)", size_of::<RdmaConnParam>()),
        ("offsetof(struct rdma_conn_param, private_data_len)", offset_of!(RdmaConnParam, private_data_len)),
        ("offsetof(struct rdma_conn_param, responder_resources)", offset_of!(RdmaConnParam, responder_resources)),
        ("offsetof(struct rdma_conn_param, initiator_depth)", offset_of!(RdmaConnParam, initiator_depth)),
        ("offsetof(struct rdma_conn_param, flow_control)", offset_of!(RdmaConnParam, flow_control)),
        ("offsetof(struct rdma_conn_param, retry_count)", offset_of!(RdmaConnParam, retry_count)),
        ("offsetof(struct rdma_conn_param, rnr_retry_count)", offset_of!(RdmaConnParam, rnr_retry_count)),
        ("offsetof(struct rdma_conn_param, srq)", offset_of!(RdmaConnParam, srq)),
        ("offsetof(struct rdma_conn_param, qp_num)", offset_of!(RdmaConnParam, qp_num)),
        ("offsetof(struct rdma_cm_event, event)", offset_of!(RdmaCmEvent, event)),
        ("offsetof(struct rdma_cm_event, status)", offset_of!(RdmaCmEvent, status)),
        ("offsetof(struct rdma_cm_event, param.conn)", offset_of!(RdmaCmEvent, conn)),
        // Enum values and flags.
        ("RDMA_CM_EVENT_ADDR_RESOLVED", cm_event::ADDR_RESOLVED as usize),
        ("RDMA_CM_EVENT_ROUTE_RESOLVED", cm_event::ROUTE_RESOLVED as usize),
        ("RDMA_CM_EVENT_REJECTED", cm_event::REJECTED as usize),
        ("RDMA_CM_EVENT_ESTABLISHED", cm_event::ESTABLISHED as usize),
        ("RDMA_CM_EVENT_DISCONNECTED", cm_event::DISCONNECTED as usize),
        ("RDMA_PS_TCP", RDMA_PS_TCP as usize),
        ("IBV_QPT_RC", IBV_QPT_RC as usize),
        ("IBV_WR_SEND", IBV_WR_SEND as usize),
        ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize),
        ("IBV_ACCESS_LOCAL_WRITE", ACCESS_LOCAL_WRITE as usize),
        ("IBV_ACCESS_REMOTE_WRITE", ACCESS_REMOTE_WRITE as usize),
        ("IBV_ACCESS_REMOTE_READ", ACCESS_REMOTE_READ as usize),
        ("IBV_WC_SUCCESS", WC_SUCCESS as usize),
        ("IBV_WC_RECV", WC_RECV as usize),
        ("IBV_WC_SEND", WC_SEND as usize),
    ]
}

#[test]
fn verbs_layouts_match_the_installed_headers() {
    let headers = ["/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"];
    if let Some(h) = headers.iter().find(|h| !std::path::Path::new(h).exists()) {
        eprintln!("SKIPPED verbs_layouts_match_the_installed_headers: {h} is missing (install libibverbs-dev and librdmacm-dev)");
        return;
    }
    let pairs = rust_side();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _) in &pairs {
        c.push_str(&format!("  printf(\"%lu\\n\", (unsigned long)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("ugds-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, bin) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, c).unwrap();
    let cc = match std::process::Command::new("gcc").arg("-o").arg(&bin).arg(&src).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED verbs_layouts_match_the_installed_headers: gcc: {e}");
            return;
        }
    };
    assert!(cc.status.success(), "gcc failed: {}", String::from_utf8_lossy(&cc.stderr));
    let out = std::process::Command::new(&bin).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(got.len(), pairs.len());
    let wrong: Vec<String> = pairs
        .iter()
        .zip(&got)
        .filter(|((_, r), c)| r != *c)
        .map(|((e, r), c)| format!("{e}: C {c}, Rust {r}"))
        .collect();
    assert!(wrong.is_empty(), "layouts differ from the headers: {wrong:#?}");
}

#[test]
fn a_missing_rdma_core_is_a_named_error() {
    let e = try_load("libibverbs-not-here.so.1", "librdmacm.so.1").unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported { what: "NVMe over RDMA", why, .. } if why.contains("rdma-core is missing") && why.contains("libibverbs-not-here")),
        "{e}"
    );
}
