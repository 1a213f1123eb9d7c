//! Layout checks against the spec's offsets and status decoding for every listed status.

use static_assertions::{assert_eq_size, const_assert_eq};
use std::mem::{offset_of, size_of};
use ugds_uapi::identify::{IdentifyController, IdentifyNamespace, LbaFormat};
use ugds_uapi::ioctl::*;
use ugds_uapi::regs::*;
use ugds_uapi::status::*;
use ugds_uapi::{Cqe, Sqe};
use zerocopy::{FromBytes, IntoBytes};

assert_eq_size!(Sqe, [u8; 64]);
assert_eq_size!(Cqe, [u8; 16]);
assert_eq_size!(IdentifyController, [u8; 4096]);
assert_eq_size!(IdentifyNamespace, [u8; 4096]);
assert_eq_size!(LbaFormat, u32);
const_assert_eq!(offset_of!(IdentifyController, mdts), 77);
const_assert_eq!(offset_of!(IdentifyNamespace, lbaf), 128);

#[test]
fn sqe_fields_land_at_spec_offsets() {
    let mut s = Sqe::new(0x02, 0xBEEF);
    s.set_nsid(7);
    s.set_prps(0x1122_3344_5566_7788, 0x99AA_BBCC_DDEE_F000);
    s.set_slba(0x0000_0001_0000_0002);
    s.set_nlb(8);
    let b = s.as_bytes();
    assert_eq!(b[0], 0x02);
    assert_eq!(u16::from_le_bytes([b[2], b[3]]), 0xBEEF);
    assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 7);
    assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 0x1122_3344_5566_7788);
    assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap()), 0x99AA_BBCC_DDEE_F000);
    assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 2); // CDW10 SLBA low
    assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 1); // CDW11 SLBA high
    assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 7); // CDW12 NLB zero-based
    assert_eq!((s.opcode(), s.cid(), s.nlb(), s.slba()), (2, 0xBEEF, 8, 0x1_0000_0002));
    assert_eq!(s.psdt(), 0);
}

#[test]
fn cqe_decodes_phase_cid_and_status() {
    let mut raw = [0u8; 16];
    raw[0..4].copy_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    raw[8..10].copy_from_slice(&5u16.to_le_bytes());
    raw[10..12].copy_from_slice(&3u16.to_le_bytes());
    raw[12..14].copy_from_slice(&42u16.to_le_bytes());
    // Phase 1, SC 0x81 (Unrecovered Read Error), SCT 2, DNR.
    let field: u16 = 0x81 | 2 << 8 | 1 << 14;
    raw[14..16].copy_from_slice(&(field << 1 | 1).to_le_bytes());
    let c = Cqe::read_from_bytes(&raw[..]).unwrap();
    assert_eq!((c.dw0(), c.sq_head(), c.sq_id(), c.cid(), c.phase()), (0xDEAD_BEEF, 5, 3, 42, true));
    let st = c.status();
    assert_eq!(st.sct, StatusType::Media);
    assert_eq!(st.sc, 0x81);
    assert!(st.dnr && !st.more);
    assert_eq!(st.name(), Some("Unrecovered Read Error"));
    assert!(st.to_string().contains("do not retry"));
    let back = Cqe::new(0xDEAD_BEEF, 5, 3, 42, st, true);
    assert_eq!(back.as_bytes(), &raw[..]);
}

#[test]
fn every_listed_status_decodes_to_its_name() {
    let tables: [(StatusType, &[(u8, &str)]); 4] = [
        (StatusType::Generic, GENERIC_STATUS),
        (StatusType::CommandSpecific, COMMAND_SPECIFIC_STATUS),
        (StatusType::Media, MEDIA_STATUS),
        (StatusType::Path, PATH_STATUS),
    ];
    let mut n = 0;
    for (sct, table) in tables {
        for &(sc, name) in table {
            for phase in [false, true] {
                let raw = Status::new(sct, sc).to_field() << 1 | phase as u16;
                let st = Status::from_field(raw >> 1);
                assert_eq!(st.sct, sct);
                assert_eq!(st.sc, sc);
                assert_eq!(st.name(), Some(name), "{sct:?} {sc:#x}");
                assert!(st.to_string().starts_with(name));
            }
            n += 1;
        }
    }
    assert!(n > 80, "only {n} statuses listed");
    assert!(Status::from_field(0).is_success());
    // Reserved codes have no name and say so.
    let unknown = Status::new(StatusType::Generic, 0x17);
    assert_eq!(unknown.name(), None);
    assert!(unknown.to_string().contains("unknown status"));
    assert_eq!(Status::new(StatusType::Vendor, 1).name(), None);
}

#[test]
fn registers_decode_fields() {
    // QEMU's CAP: MQES 2047, CQR, TO 15, DSTRD 0, CSS NVM, MPSMAX 4.
    let cap = Cap(0x0040_2000_0f01_07ff | 1 << 37);
    assert_eq!(cap.mqes(), 0x7ff);
    assert_eq!(cap.max_queue_entries(), 2048);
    assert!(cap.cqr());
    assert_eq!(cap.to(), 0x0f);
    assert_eq!(cap.timeout_ms(), 7500);
    assert_eq!(cap.dstrd(), 0);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!(cap.min_page_size(), 4096);
    let vs = Vs(0x0001_0400);
    assert_eq!((vs.major(), vs.minor(), vs.tertiary()), (1, 4, 0));
    let cc = Cc::default().with_iosqes(6).with_iocqes(4).with_mps(0).with_css(0).with_en(true);
    assert_eq!(cc.0, 0x0046_0001);
    assert_eq!((cc.iosqes(), cc.iocqes(), cc.en()), (6, 4, true));
    assert_eq!(cc.with_shn(Shutdown::Normal).shn(), 1);
    assert!(Csts(1).rdy() && !Csts(1).cfs() && Csts(2).cfs());
    assert!(Csts(u32::MAX).is_gone());
    let aqa = Aqa::new(32, 64);
    assert_eq!((aqa.asqs(), aqa.acqs()), (31, 63));
    assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
    assert_eq!(cq_head_doorbell(0, 0), 0x1004);
    assert_eq!(sq_tail_doorbell(3, 2), 0x1000 + 6 * 16);
    assert_eq!(cq_head_doorbell(3, 2), 0x1000 + 7 * 16);
}

#[test]
fn identify_fields_decode() {
    let mut raw = [0u8; 4096];
    raw[77] = 5;
    raw[525] = 1;
    raw[516..520].copy_from_slice(&2u32.to_le_bytes());
    let id = IdentifyController::read_from_bytes(&raw[..]).unwrap();
    assert_eq!(id.mdts_bytes(4096), Some(128 * 1024));
    assert!(id.has_volatile_write_cache());
    assert_eq!(u32::from_le(id.nn), 2);
    let mut ns = [0u8; 4096];
    ns[0..8].copy_from_slice(&1000u64.to_le_bytes());
    ns[26] = 0x21; // index 1 | high bits 1 → format 17
    ns[128 + 17 * 4..128 + 18 * 4].copy_from_slice(&(12u32 << 16).to_le_bytes());
    let ns = IdentifyNamespace::read_from_bytes(&ns[..]).unwrap();
    assert_eq!(ns.format_index(), 17);
    assert_eq!(ns.lba_shift(), 12);
    assert_eq!(ns.size_lbas(), 1000);
}

/// Epoch and fault flag travel in one word, so a reader can never pair a new epoch with a stale
/// fault flag (what two separately written fields allowed: a failed reset read as a clean one).
#[test]
fn controller_state_word_keeps_epoch_and_fault_together() {
    for (epoch, faulted) in [(1, false), (2, true), (3, false), (u64::MAX >> 1, true)] {
        let s = ControllerState::new(epoch, faulted);
        assert_eq!((s.epoch(), s.faulted()), (epoch, faulted));
    }
    assert_eq!(core::mem::offset_of!(StatusPage, state) % 8, 0, "one aligned 8-byte load");
    assert_ne!(ControllerState::new(2, true), ControllerState::new(2, false));
}

#[test]
fn ioctl_structs_and_numbers() {
    assert_eq!(size_of::<DeviceInfo>(), 392);
    assert_eq!(size_of::<NamespaceInfo>(), 16);
    assert_eq!(size_of::<CreateQpair>(), 88);
    assert_eq!(size_of::<DeleteQpair>(), 8);
    assert_eq!(size_of::<RegistrationHandle>(), 16);
    assert_eq!(size_of::<RegisterHost>(), 32);
    assert_eq!(size_of::<RegisterDmabuf>(), 40);
    assert_eq!(size_of::<Segment>(), 16);
    assert_eq!(size_of::<GetSegments>(), 24);
    assert_eq!(size_of::<Deregister>(), 8);
    assert_eq!(size_of::<SetEventfd>(), 8);
    assert_eq!(size_of::<StatusPage>(), 64);
    assert_eq!(size_of::<Opener>(), 32);
    assert_eq!(size_of::<ListOpeners>(), 16);
    assert_eq!(size_of::<AdminCommand>(), 56);
    // _IOR(0xD7, 0, 392) as the kernel's macros compute it.
    assert_eq!(IOCTL_GET_INFO, 2 << 30 | 392 << 16 | 0xD7 << 8);
    assert_eq!(IOCTL_RESET, 1 << 30 | 8 << 16 | 0xD7 << 8 | 8);
    assert_eq!(size_of::<Reset>(), 8);
    let all = [
        IOCTL_GET_INFO,
        IOCTL_CREATE_QPAIR,
        IOCTL_DELETE_QPAIR,
        IOCTL_REGISTER_HOST,
        IOCTL_REGISTER_DMABUF,
        IOCTL_GET_SEGMENTS,
        IOCTL_DEREGISTER,
        IOCTL_SET_EVENTFD,
        IOCTL_RESET,
        IOCTL_REARM_QPAIR,
        IOCTL_LIST_OPENERS,
        IOCTL_ADMIN_CMD,
    ];
    for (i, a) in all.iter().enumerate() {
        assert_eq!(a & 0xFF, i as u32, "request numbers are dense and distinct");
    }
    for k in [MmapKind::Doorbells, MmapKind::Status, MmapKind::Sq, MmapKind::Cq, MmapKind::PrpPool] {
        for q in [0u16, 1, 77, u16::MAX] {
            let off = mmap_offset(k, q);
            assert_eq!(off % 4096, 0);
            assert_eq!(parse_mmap_offset(off), Some((k, q)));
        }
    }
    assert_eq!(parse_mmap_offset(4096), None);
    assert_eq!(parse_mmap_offset(mmap_offset(MmapKind::Sq, 1) + 4096), None);
    assert_eq!(parse_mmap_offset(9 << 40), None);
}
