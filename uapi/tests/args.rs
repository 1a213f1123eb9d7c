//! The ioctl argument rules (`ugds_uapi::args`): every rule the module applies, each errno, the
//! order between rules, and the edges of every bound.

use ugds_uapi::args::*;
use ugds_uapi::ioctl::{errno, *};

/// The module's limits on x86-64 with QEMU's default MQES (2048 entries).
const LIMITS: Limits = Limits { max_queue_entries: 2048, user_end: 0x7FFF_FFFF_F000 };

fn qpair(depth: u32, flags: u32) -> CreateQpair {
    CreateQpair { depth, flags, ..Default::default() }
}

#[test]
fn create_qpair_depth_bounds_and_flags() {
    for d in [0, 1, 2049, u32::MAX] {
        assert_eq!(qpair(d, 0).check(&LIMITS), Err(ArgError::Invalid("depth")), "depth {d}");
    }
    assert_eq!(qpair(2, 0).check(&LIMITS), Ok(QpairRequest { depth: 2, irq: false }));
    assert_eq!(qpair(2048, QPAIR_FLAG_IRQ).check(&LIMITS), Ok(QpairRequest { depth: 2048, irq: true }));
    assert_eq!(qpair(16, 0x8000).check(&LIMITS), Err(ArgError::Invalid("flags")));
    // Flags are checked before the depth (both EINVAL, but the name says which rule).
    assert_eq!(qpair(0, 2).check(&LIMITS), Err(ArgError::Invalid("flags")));
    // The output fields do not matter.
    let a = CreateQpair { depth: 16, qid: 9, sq_offset: u64::MAX, ..Default::default() };
    assert_eq!(a.check(&LIMITS), Ok(QpairRequest { depth: 16, irq: false }));
    // A controller that allows fewer entries than 2 accepts no depth at all.
    let tiny = Limits { max_queue_entries: 1, ..LIMITS };
    assert_eq!(qpair(2, 0).check(&tiny), Err(ArgError::Invalid("depth")));
}

#[test]
fn delete_qpair_reserved_must_be_zero() {
    assert_eq!(DeleteQpair { qid: 3, reserved: 0 }.check(), Ok(3));
    assert_eq!(DeleteQpair { qid: 3, reserved: 1 }.check(), Err(ArgError::Invalid("reserved")));
}

fn host(addr: u64, len: u64) -> Result<HostRange, ArgError> {
    RegisterHost { addr, len, handle: RegistrationHandle::default() }.check(&LIMITS)
}

#[test]
fn register_host_lengths_alignment_overflow_and_user_end() {
    let a = 0x7f00_0000_0000;
    assert_eq!(host(a, 8192), Ok(HostRange { addr: a, len: 8192, end: a + 8192 }));
    assert_eq!(host(a, 0), Err(ArgError::Invalid("len")));
    assert_eq!(host(a, 100), Err(ArgError::Invalid("len")));
    assert_eq!(host(a, MAX_HOST_REGISTRATION + 4096), Err(ArgError::Invalid("len")));
    assert_eq!(host(a, 1 << 40), Err(ArgError::Invalid("len")));
    assert_eq!(host(a + 1, 4096), Err(ArgError::Invalid("addr")));
    assert_eq!(host(!4095, 8192), Err(ArgError::Overflow));
    assert_eq!(host(0xffff_8880_0000_0000, 4096), Err(ArgError::Fault));
    // The last page below the user end is fine; one more byte of range is not.
    assert_eq!(host(LIMITS.user_end - 4096, 4096).map(|r| r.end), Ok(LIMITS.user_end));
    assert_eq!(host(LIMITS.user_end, 4096), Err(ArgError::Fault));
    // The largest registration is accepted, and its page count fits a u32.
    let r = host(0, MAX_HOST_REGISTRATION).unwrap();
    assert!(u32::try_from(r.pages()).is_ok());
    // EINVAL comes before EOVERFLOW: an unaligned, wrapping range is EINVAL.
    assert_eq!(host(!0, 8192).map_err(ArgError::errno), Err(errno::EINVAL));
    assert_eq!(host(!4095, 8192).map_err(ArgError::errno), Err(errno::EOVERFLOW));
    assert_eq!(host(0xffff_8880_0000_0000, 4096).map_err(ArgError::errno), Err(errno::EFAULT));
}

fn dmabuf(fd: i32, reserved: u32, offset: u64, len: u64) -> Result<DmabufRange, ArgError> {
    RegisterDmabuf { fd, reserved, offset, len, handle: RegistrationHandle::default() }.check()
}

#[test]
fn register_dmabuf_reserved_lengths_overflow_and_fd() {
    assert_eq!(dmabuf(5, 0, 4096, 8192), Ok(DmabufRange { fd: 5, offset: 4096, len: 8192 }));
    assert_eq!(dmabuf(5, 1, 0, 4096), Err(ArgError::Invalid("reserved")));
    assert_eq!(dmabuf(5, 0, 0, 0), Err(ArgError::Invalid("len")));
    assert_eq!(dmabuf(5, 0, 0, 4095), Err(ArgError::Invalid("len")));
    assert_eq!(dmabuf(5, 0, 1, 4096), Err(ArgError::Invalid("offset")));
    assert_eq!(dmabuf(5, 0, !4095, 8192), Err(ArgError::Overflow));
    assert_eq!(dmabuf(-1, 0, 0, 4096), Err(ArgError::BadFd));
    // Range errors come before the descriptor's (as the bad-dmabuf VM test expects).
    assert_eq!(dmabuf(-1, 0, !4095, 8192), Err(ArgError::Overflow));
    assert_eq!(dmabuf(-1, 0, 0, 0), Err(ArgError::Invalid("len")));
    // No upper bound on the length: the dma-buf's own size limits it when attached.
    assert!(dmabuf(0, 0, 0, 1 << 60).is_ok());
}

fn segs(first: u32, count: u32, nsegs: usize) -> Result<SegmentWindow, ArgError> {
    GetSegments { id: 1, generation: 1, first, count, segments: 0 }.check(nsegs)
}

#[test]
fn get_segments_window_is_clipped_to_the_registration() {
    assert_eq!(segs(0, 16, 3), Ok(SegmentWindow { first: 0, count: 3 }));
    assert_eq!(segs(1, 1, 3), Ok(SegmentWindow { first: 1, count: 1 }));
    assert_eq!(segs(3, 5, 3), Ok(SegmentWindow { first: 3, count: 0 }));
    assert_eq!(segs(4, 1, 3), Err(ArgError::Invalid("first")));
    assert_eq!(segs(u32::MAX, u32::MAX, 3), Err(ArgError::Invalid("first")));
    assert_eq!(segs(2, u32::MAX, 3), Ok(SegmentWindow { first: 2, count: 1 }));
    assert_eq!(segs(0, 0, 0), Ok(SegmentWindow { first: 0, count: 0 }));
}

#[test]
fn set_eventfd_detach_attach_and_bad_fd() {
    assert_eq!(SetEventfd { qid: 1, fd: -1 }.check(), Ok(EventfdAction::Detach));
    assert_eq!(SetEventfd { qid: 1, fd: 0 }.check(), Ok(EventfdAction::Attach(0)));
    assert_eq!(SetEventfd { qid: 1, fd: i32::MAX }.check(), Ok(EventfdAction::Attach(i32::MAX)));
    assert_eq!(SetEventfd { qid: 1, fd: -2 }.check(), Err(ArgError::BadFd));
    assert_eq!(SetEventfd { qid: 1, fd: i32::MIN }.check(), Err(ArgError::BadFd));
}

#[test]
fn every_refusal_has_the_documented_errno() {
    assert_eq!(ArgError::Invalid("x").errno(), errno::EINVAL);
    assert_eq!(ArgError::Overflow.errno(), errno::EOVERFLOW);
    assert_eq!(ArgError::Fault.errno(), errno::EFAULT);
    assert_eq!(ArgError::BadFd.errno(), errno::EBADF);
}

fn admin_cmd(opcode: u8, data_len: u32) -> AdminCommand {
    AdminCommand { opcode, data_len, data: 0x10_0000, ..Default::default() }
}

#[test]
fn admin_cmd_allows_only_three_opcodes_checked_first() {
    let mut allowed = Vec::new();
    for op in 0..=255u8 {
        // Flags and reserved bits set too: the opcode rule comes first.
        let a = AdminCommand { flags: 0xFF, reserved1: 1, data_len: 3, ..admin_cmd(op, 0) };
        match a.check(&LIMITS, 0) {
            Err(ArgError::Refused(o)) => {
                assert_eq!(o, op);
                assert_eq!(ArgError::Refused(o).errno(), errno::EACCES);
                assert!(admin_allowed(op).is_none());
            }
            Err(ArgError::Invalid("flags")) => allowed.push(op),
            other => panic!("opcode {op:#x}: {other:?}"),
        }
    }
    assert_eq!(allowed, [0x02, 0x06, 0x0A]);
    assert_eq!(admin_allowed(0x02), Some("Get Log Page"));
    assert_eq!(admin_allowed(0x80), None, "Format NVM");
}

#[test]
fn admin_cmd_lengths_by_opcode() {
    let inval = Err(ArgError::Invalid("data_len"));
    // Identify: exactly one page.
    for len in [0, 4, 512, 4092, 4100, 8192] {
        assert_eq!(admin_cmd(0x06, len).check(&LIMITS, 0), inval, "identify {len}");
    }
    assert!(admin_cmd(0x06, 4096).check(&LIMITS, 0).is_ok());
    // Get Log Page: 4..=bound, dword multiples; the bound is MDTS below 64 KiB.
    for len in [0, 2, 513, MAX_ADMIN_DATA + 4, !3u32] {
        assert_eq!(admin_cmd(0x02, len).check(&LIMITS, 0), inval, "log {len}");
    }
    assert!(admin_cmd(0x02, MAX_ADMIN_DATA).check(&LIMITS, 0).is_ok());
    assert!(admin_cmd(0x02, MAX_ADMIN_DATA).check(&LIMITS, 1 << 20).is_ok());
    assert_eq!(admin_cmd(0x02, 8196).check(&LIMITS, 8192), inval);
    assert!(admin_cmd(0x02, 8192).check(&LIMITS, 8192).is_ok());
    // Get Features: no data, or up to a page.
    assert!(admin_cmd(0x0A, 0).check(&LIMITS, 0).is_ok());
    assert!(admin_cmd(0x0A, 4096).check(&LIMITS, 0).is_ok());
    assert_eq!(admin_cmd(0x0A, 4100).check(&LIMITS, 0), inval);
    assert_eq!(admin_cmd(0x0A, 6).check(&LIMITS, 0), inval);
}

#[test]
fn admin_cmd_reserved_and_buffer() {
    let a = AdminCommand { reserved0: 1, ..admin_cmd(0x06, 4096) };
    assert_eq!(a.check(&LIMITS, 0), Err(ArgError::Invalid("reserved")));
    let a = AdminCommand { flags: 0x40, ..admin_cmd(0x06, 4096) };
    assert_eq!(a.check(&LIMITS, 0), Err(ArgError::Invalid("flags")));
    let a = AdminCommand { data: u64::MAX - 100, ..admin_cmd(0x06, 4096) };
    assert_eq!(a.check(&LIMITS, 0), Err(ArgError::Overflow));
    let a = AdminCommand { data: LIMITS.user_end - 4095, ..admin_cmd(0x06, 4096) };
    assert_eq!(a.check(&LIMITS, 0), Err(ArgError::Fault));
    let a = AdminCommand { data: LIMITS.user_end - 4096, ..admin_cmd(0x06, 4096) };
    assert!(a.check(&LIMITS, 0).is_ok());
    // No data: the pointer does not matter.
    let a = AdminCommand { data: u64::MAX, ..admin_cmd(0x0A, 0) };
    assert!(a.check(&LIMITS, 0).is_ok());
}

#[test]
fn admin_cmd_builds_its_own_command() {
    // Get Log Page, SMART (LID 2), 512 bytes, with NUMD and RAE bits the caller set wrongly.
    let a = AdminCommand {
        nsid: 0xFFFF_FFFF,
        cdw: [0xFFFF_0002, 0x1234_FFFF, 7, 8, 9, 10],
        result: 5,
        status: 6,
        ..admin_cmd(0x02, 512)
    };
    let r = a.check(&LIMITS, 0).unwrap();
    assert_eq!(r.len, 512);
    // NUMD = 127 (zero-based dwords), RAE set, LID kept; LSI (CDW11 31:16) kept.
    assert_eq!(r.cdw[0], 127 << 16 | LOG_PAGE_RAE | 0x02);
    assert_eq!(r.cdw[1], 0x1234_0000);
    let big = admin_cmd(0x02, MAX_ADMIN_DATA).check(&LIMITS, 0).unwrap();
    let numd = MAX_ADMIN_DATA / 4 - 1;
    assert_eq!((big.cdw[0] >> 16, big.cdw[1] & 0xFFFF), (numd & 0xFFFF, numd >> 16));
    let s = r.sqe(0x1000, 0x2000);
    assert_eq!(s.opcode(), 0x02);
    let raw: [u32; 16] = dwords(&s);
    // CDW0: opcode only (no fused bits, PSDT 0 = PRPs, cid 0); NSID; CDW2-3 and MPTR zero.
    assert_eq!(raw[0], 0x02);
    assert_eq!(raw[1], 0xFFFF_FFFF);
    assert_eq!(&raw[2..6], &[0, 0, 0, 0]);
    assert_eq!(&raw[6..10], &[0x1000, 0, 0x2000, 0]);
    assert_eq!(&raw[10..16], &r.cdw);
}

/// The 16 dwords of an entry, through its byte layout.
fn dwords(s: &ugds_uapi::queue::Sqe) -> [u32; 16] {
    use zerocopy::IntoBytes;
    let b = s.as_bytes();
    std::array::from_fn(|i| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()))
}

/// The module's `ADMIN_CMD` buffer for `len` bytes: `pages` data pages and the guard page, each
/// page a list of the page indexes its entries name (as PRP entries, page index times 4096).
fn admin_buffer(len: u32) -> Vec<[usize; PRP_ENTRIES]> {
    let pages = admin_data_pages(len);
    let mut mem = vec![[0usize; PRP_ENTRIES]; pages + 1];
    for (i, e) in mem[pages].iter_mut().enumerate() {
        *e = admin_guard_entry(pages, i);
    }
    mem
}

/// A controller's walk of PRP1 (page 0) and PRP2 (the guard page) for a transfer of `bytes`
/// (base spec 2.0, 4.1.1: PRP2 is the second data page for two pages, else a list pointer; the
/// last entry of a list page points to the next list when more entries are needed, and is the
/// last data page otherwise). Returns the pages it writes data to, in order, and every page it
/// reads as a list, each with its step in the walk.
/// (page, step of the walk) pairs.
type Steps = Vec<(usize, usize)>;

fn prp_walk(mem: &[[usize; PRP_ENTRIES]], bytes: usize) -> (Steps, Steps) {
    let guard = mem.len() - 1;
    let need = bytes.div_ceil(ADMIN_PAGE);
    let mut step = 0;
    let mut data = vec![(0, step)];
    let mut lists = Vec::new();
    if need == 2 {
        data.push((guard, 1));
    } else if need > 2 {
        let mut list = guard;
        let mut i = 0;
        lists.push((list, step));
        while data.len() < need {
            step += 1;
            let left = need - data.len();
            let e = mem[list][i];
            if i == PRP_ENTRIES - 1 && left > 1 {
                list = e;
                lists.push((list, step));
                i = 0;
                continue;
            }
            data.push((e, step));
            i += 1;
        }
    }
    (data, lists)
}

#[test]
fn admin_buffer_keeps_every_prp_the_controller_can_derive_inside_it() {
    for len in [0u32, 4, 512, 4096, 4100, 8192, 8196, 12288, 16384, 65532, MAX_ADMIN_DATA] {
        let mem = admin_buffer(len);
        let pages = mem.len();
        // Whatever length the controller derives, up to far past the buffer (4 MiB: several
        // trips through the self-chained list), it reaches only the buffer's pages.
        for bytes in (1..=4 << 20).step_by(4096 - 4) {
            let (data, lists) = prp_walk(&mem, bytes);
            assert!(data.iter().chain(&lists).all(|&(p, _)| p < pages), "len {len}, transfer {bytes}");
            // A page it writes as data is never read as a list afterwards (the guard page is
            // written only as the very last page of a long walk, or in a two-page transfer).
            for &(p, at) in &data {
                assert!(!lists.iter().any(|&(l, when)| l == p && when > at), "len {len}, transfer {bytes}: page {p}");
            }
        }
        // The exact transfer lands where the copy-out reads it, each page once.
        let data: Vec<usize> = prp_walk(&mem, len.max(1) as usize).0.into_iter().map(|(p, _)| p).collect();
        let want: Vec<usize> = (0..data.len()).map(|k| admin_page_of(len, k)).collect();
        assert_eq!(data, want, "len {len}");
        let mut uniq = data.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), data.len(), "len {len}: a page used twice");
    }
}

#[test]
fn list_openers_capacity_is_bounded() {
    let l = |capacity| ListOpeners { capacity, count: 7, openers: 0x1000 };
    assert_eq!(l(0).check(), Ok(0));
    assert_eq!(l(MAX_OPENERS).check(), Ok(MAX_OPENERS as usize));
    assert_eq!(l(MAX_OPENERS + 1).check(), Err(ArgError::Invalid("capacity")));
    assert_eq!(l(u32::MAX).check().map_err(|e| e.errno()), Err(errno::EINVAL));
}
