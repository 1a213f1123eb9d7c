//! Controller bring-up and shutdown: disable, admin queue, enable, identify, number of queues.

use crate::admin::{AdminQueue, IdentifyBuffers, ADMIN_DEPTH};
use crate::shim::delay::read_poll_timeout;
use crate::shim::dma::{dma_read, DmaAddress};
use crate::uapi::ioctl::{DeviceInfo, NamespaceInfo, ABI_VERSION, DEVICE_SHADOW_DOORBELLS, MAX_NAMESPACES};
use crate::uapi::queue::{admin, cns, feature, Sqe};
use crate::uapi::regs::{Aqa, Cap, Cc, Csts, REG_ACQ, REG_AQA, REG_ASQ, REG_CC, REG_CSTS, REG_INTMS};
use crate::Bar0;
use kernel::prelude::*;

/// Timeout of one admin command.
pub(crate) const ADMIN_TIMEOUT_MS: u32 = 5000;

/// Largest I/O queue depth handed out: each slot owns a 4 KiB PRP-list page and the pool is one
/// coherent allocation, so 1024 slots = 4 MiB (the largest contiguous allocation).
pub(crate) const MAX_IO_DEPTH: u32 = 1024;

/// I/O queue pairs asked for in Set Features (Number of Queues).
const WANT_QPAIRS: u32 = 64;

/// Waits (bounded by CAP.TO, at least 500 ms) for CSTS.RDY to equal `want`.
pub(crate) fn wait_ready(bar: &Bar0, cap: Cap, want: bool) -> Result {
    let limit_ms = cap.timeout_ms().max(500);
    let read_csts = || {
        let csts = Csts(bar.read32::<REG_CSTS>());
        if csts.is_gone() {
            return Err(ENODEV);
        }
        if want && csts.cfs() && !csts.rdy() {
            return Err(EIO);
        }
        Ok(csts)
    };
    read_poll_timeout(read_csts, |csts| csts.rdy() == want, 1000, limit_ms as u64 * 1000).map(|_| ())
}

/// Clears CC.EN and waits for CSTS.RDY=0: after this the controller does no more DMA.
pub(crate) fn disable(bar: &Bar0, cap: Cap) -> Result {
    let cc = Cc(bar.read32::<REG_CC>());
    if cc.en() {
        bar.write32::<REG_CC>(cc.with_en(false).0);
    }
    wait_ready(bar, cap, false)
}

/// Programs the admin queue and enables the controller (4 KiB pages, 64/16-byte entries).
pub(crate) fn enable(bar: &Bar0, cap: Cap, adminq: &mut AdminQueue) -> Result {
    adminq.reset_state()?;
    let (asq, acq) = adminq.dma_addrs();
    bar.write32::<REG_AQA>(Aqa::new(ADMIN_DEPTH, ADMIN_DEPTH).0);
    // CAST: the low and high halves of the 64-bit queue base registers.
    bar.write32::<REG_ASQ>(asq as u32);
    bar.write32::<{ REG_ASQ + 4 }>((asq >> 32) as u32);
    bar.write32::<REG_ACQ>(acq as u32);
    bar.write32::<{ REG_ACQ + 4 }>((acq >> 32) as u32);
    // Pin-based interrupts are never used.
    bar.write32::<REG_INTMS>(u32::MAX);
    let cc = Cc::default().with_css(0).with_mps(0).with_iosqes(6).with_iocqes(4).with_en(true);
    bar.write32::<REG_CC>(cc.0);
    wait_ready(bar, cap, true)
}

/// Runs Identify with `cns_value` into the admin queue's buffer that `buf` picks.
fn identify(
    bar: &Bar0,
    adminq: &mut AdminQueue,
    buf: impl FnOnce(&IdentifyBuffers) -> DmaAddress,
    cns_value: u32,
    nsid: u32,
) -> Result {
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_prps(buf(&adminq.ident), 0);
    sqe.set_cdw(10, cns_value);
    adminq.submit(bar, sqe, ADMIN_TIMEOUT_MS).map(|_| ())
}

/// Identifies the controller and its active namespaces and negotiates the number of queues. On
/// failure the caller disables the controller before the admin queue (and its buffers) go.
pub(crate) fn identify_all(bar: &Bar0, cap: Cap, adminq: &mut AdminQueue) -> Result<DeviceInfo> {
    identify(bar, adminq, |b| b.controller.dma_handle(), cns::CONTROLLER, 0)?;
    let id = &adminq.ident.controller;
    let mdts = dma_read!(id[0].mdts)?;
    // OACS bit 8: Doorbell Buffer Config. Cleared again by the probe if the pages are not set up.
    let oacs = u16::from_le(dma_read!(id[0].oacs)?);
    let mut info = DeviceInfo {
        abi_version: ABI_VERSION,
        instance: 0,
        serial: dma_read!(id[0].sn)?,
        model: dma_read!(id[0].mn)?,
        firmware: dma_read!(id[0].fr)?,
        vid: u16::from_le(dma_read!(id[0].vid)?),
        ssvid: u16::from_le(dma_read!(id[0].ssvid)?),
        cap: cap.0,
        vs: 0,
        // MDTS is in units of the minimum page size; 0 means no limit. Cap what we report at 4 GiB.
        mdts_bytes: if mdts == 0 { 0 } else { (cap.min_page_size() << mdts.min(20)).min(u32::MAX as u64) as u32 },
        doorbell_stride: 4 << cap.dstrd(),
        max_qpairs: 0,
        max_queue_entries: cap.max_queue_entries().min(MAX_IO_DEPTH),
        irq_vectors: 0,
        num_namespaces: 0,
        vwc: (dma_read!(id[0].vwc)? & 1) as u32,
        oncs: u16::from_le(dma_read!(id[0].oncs)?) as u32,
        page_size: 4096,
        namespaces: [NamespaceInfo::default(); MAX_NAMESPACES],
        // User space builds SGLs for I/O commands when bits 1:0 say the controller takes them.
        sgls: u32::from_le(dma_read!(id[0].sgls)?),
        flags: if oacs & 1 << 8 != 0 { DEVICE_SHADOW_DOORBELLS } else { 0 },
    };

    // Active namespace list (CNS 02h): NSIDs in increasing order, zero-terminated.
    identify(bar, adminq, |b| b.nsids.dma_handle(), cns::ACTIVE_NSID_LIST, 0)?;
    for i in 0..MAX_NAMESPACES {
        let nsid = u32::from_le(adminq.ident.nsids.read(i)?);
        if nsid == 0 {
            break;
        }
        identify(bar, adminq, |b| b.namespace.dma_handle(), cns::NAMESPACE, nsid)?;
        let ns = &adminq.ident.namespace;
        let flbas = dma_read!(ns[0].flbas)?;
        // FLBAS bits 3:0 are the format index's low bits, bits 6:5 its high bits.
        let lbaf = dma_read!(ns[0].lbaf)?[(flbas & 0xF) as usize | (((flbas >> 5) & 0x3) as usize) << 4];
        let lba_shift = lbaf.lbads();
        if !(9..=16).contains(&lba_shift) {
            pr_warn!("namespace {} has unsupported LBA size 2^{}; skipped\n", nsid, lba_shift);
            continue;
        }
        // Metadata and protection information are reported, not handled: user space refuses
        // such a namespace by name.
        info.namespaces[info.num_namespaces as usize] = NamespaceInfo {
            nsid,
            lba_shift,
            pi_type: dma_read!(ns[0].dps)? & 0x7,
            metadata_bytes: lbaf.ms(),
            size_lbas: u64::from_le(dma_read!(ns[0].nsze)?),
        };
        info.num_namespaces += 1;
    }

    let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
    sqe.set_cdw(10, feature::NUMBER_OF_QUEUES);
    sqe.set_cdw(11, (WANT_QPAIRS - 1) | (WANT_QPAIRS - 1) << 16);
    let cqe = adminq.submit(bar, sqe, ADMIN_TIMEOUT_MS)?;
    let nsqa = (cqe.dw0() & 0xFFFF) + 1;
    let ncqa = (cqe.dw0() >> 16) + 1;
    info.max_qpairs = nsqa.min(ncqa).min(WANT_QPAIRS);
    Ok(info)
}

/// A space-padded ASCII field as a `&str` (for logging), trimmed.
pub(crate) fn ascii(field: &[u8]) -> &str {
    let s = core::str::from_utf8(field).unwrap_or("?");
    s.trim_end_matches([' ', '\0'])
}
