//! Controller bring-up and shutdown: disable, admin queue, enable, identify, number of queues.

use crate::admin::{AdminQueue, ADMIN_DEPTH};
use crate::bindings;
use crate::shim::dma::CoherentAllocation;
use crate::shim::pci::Device;
use crate::uapi::identify::{IdentifyController, IdentifyNamespace};
use crate::uapi::ioctl::{DeviceInfo, NamespaceInfo, ABI_VERSION, MAX_NAMESPACES};
use crate::uapi::queue::{admin, cns, feature, Sqe};
use crate::uapi::regs::{Aqa, Cap, Cc, Csts, REG_ACQ, REG_AQA, REG_ASQ, REG_CC, REG_CSTS, REG_INTMS};
use crate::Bar0;
use core::mem::offset_of;
use kernel::prelude::*;

/// Timeout of one admin command.
pub(crate) const ADMIN_TIMEOUT_MS: u32 = 5000;

/// Largest I/O queue depth handed out: each slot owns a 4 KiB PRP-list page and the pool is one
/// coherent allocation, so 1024 slots = 4 MiB (the largest contiguous allocation).
pub(crate) const MAX_IO_DEPTH: u32 = 1024;

/// I/O queue pairs asked for in Set Features (Number of Queues).
const WANT_QPAIRS: u32 = 64;

/// Waits (bounded by CAP.TO) for CSTS.RDY to equal `want`.
pub(crate) fn wait_ready(bar: &Bar0, cap: Cap, want: bool) -> Result {
    let limit_ms = cap.timeout_ms().max(500);
    let mut waited = 0;
    loop {
        let csts = Csts(bar.read32::<REG_CSTS>());
        if csts.is_gone() {
            return Err(ENODEV);
        }
        if csts.rdy() == want {
            return Ok(());
        }
        if want && csts.cfs() {
            return Err(EIO);
        }
        if waited >= limit_ms {
            return Err(crate::errno::etimedout());
        }
        // SAFETY: process context, no spinlock held.
        unsafe { bindings::msleep(1) };
        waited += 1;
    }
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

fn identify(bar: &Bar0, adminq: &mut AdminQueue, buf: &CoherentAllocation, cns_value: u32, nsid: u32) -> Result {
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_prps(buf.dma_handle(), 0);
    sqe.set_cdw(10, cns_value);
    adminq.submit(bar, sqe, ADMIN_TIMEOUT_MS).map(|_| ())
}

fn read_u16(buf: &CoherentAllocation, off: usize) -> Result<u16> {
    let mut b = [0u8; 2];
    buf.read_bytes(off, &mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn read_u32(buf: &CoherentAllocation, off: usize) -> Result<u32> {
    let mut b = [0u8; 4];
    buf.read_bytes(off, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(buf: &CoherentAllocation, off: usize) -> Result<u64> {
    let mut b = [0u8; 8];
    buf.read_bytes(off, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Identifies the controller and its active namespaces and negotiates the number of queues.
pub(crate) fn identify_all(dev: &Device, bar: &Bar0, cap: Cap, adminq: &mut AdminQueue) -> Result<DeviceInfo> {
    let buf = CoherentAllocation::alloc(dev, 4096)?;
    identify(bar, adminq, &buf, cns::CONTROLLER, 0)?;
    let mut info = DeviceInfo {
        abi_version: ABI_VERSION,
        instance: 0,
        serial: [0; 20],
        model: [0; 40],
        firmware: [0; 8],
        vid: read_u16(&buf, offset_of!(IdentifyController, vid))?,
        ssvid: read_u16(&buf, offset_of!(IdentifyController, ssvid))?,
        cap: cap.0,
        vs: 0,
        mdts_bytes: 0,
        doorbell_stride: 4 << cap.dstrd(),
        max_qpairs: 0,
        max_queue_entries: cap.max_queue_entries().min(MAX_IO_DEPTH),
        irq_vectors: 0,
        num_namespaces: 0,
        vwc: 0,
        oncs: read_u16(&buf, offset_of!(IdentifyController, oncs))? as u32,
        page_size: 4096,
        namespaces: [NamespaceInfo::default(); MAX_NAMESPACES],
    };
    buf.read_bytes(offset_of!(IdentifyController, sn), &mut info.serial)?;
    buf.read_bytes(offset_of!(IdentifyController, mn), &mut info.model)?;
    buf.read_bytes(offset_of!(IdentifyController, fr), &mut info.firmware)?;
    let mut b = [0u8; 1];
    buf.read_bytes(offset_of!(IdentifyController, mdts), &mut b)?;
    // MDTS is in units of the minimum page size; 0 means no limit. Cap what we report at 4 GiB.
    info.mdts_bytes = if b[0] == 0 { 0 } else { (cap.min_page_size() << b[0].min(20)).min(u32::MAX as u64) as u32 };
    buf.read_bytes(offset_of!(IdentifyController, vwc), &mut b)?;
    info.vwc = (b[0] & 1) as u32;

    // Active namespace list (CNS 02h): NSIDs in increasing order, zero-terminated.
    identify(bar, adminq, &buf, cns::ACTIVE_NSID_LIST, 0)?;
    let mut nsids = [0u32; MAX_NAMESPACES];
    let mut n = 0;
    for i in 0..MAX_NAMESPACES {
        let id = read_u32(&buf, i * 4)?;
        if id == 0 {
            break;
        }
        nsids[i] = id;
        n += 1;
    }
    for (i, &nsid) in nsids[..n].iter().enumerate() {
        identify(bar, adminq, &buf, cns::NAMESPACE, nsid)?;
        let nsze = read_u64(&buf, offset_of!(IdentifyNamespace, nsze))?;
        buf.read_bytes(offset_of!(IdentifyNamespace, flbas), &mut b)?;
        let idx = (b[0] & 0xF) as usize | (((b[0] >> 5) & 0x3) as usize) << 4;
        let lbaf = read_u32(&buf, offset_of!(IdentifyNamespace, lbaf) + 4 * idx)?;
        let lba_shift = (lbaf >> 16) & 0xFF;
        if !(9..=16).contains(&lba_shift) {
            pr_warn!("namespace {} has unsupported LBA size 2^{}; skipped\n", nsid, lba_shift);
            continue;
        }
        // Metadata and protection information are reported, not handled: user space refuses
        // such a namespace by name.
        let metadata_bytes = (lbaf & 0xFFFF) as u16;
        buf.read_bytes(offset_of!(IdentifyNamespace, dps), &mut b)?;
        let pi_type = b[0] & 0x7;
        info.namespaces[info.num_namespaces as usize] =
            NamespaceInfo { nsid, lba_shift: lba_shift as u8, pi_type, metadata_bytes, size_lbas: nsze };
        info.num_namespaces += 1;
        let _ = i;
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
