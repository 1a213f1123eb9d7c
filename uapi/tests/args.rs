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

#[test]
fn list_openers_capacity_is_bounded() {
    let l = |capacity| ListOpeners { capacity, count: 7, openers: 0x1000 };
    assert_eq!(l(0).check(), Ok(0));
    assert_eq!(l(MAX_OPENERS).check(), Ok(MAX_OPENERS as usize));
    assert_eq!(l(MAX_OPENERS + 1).check(), Err(ArgError::Invalid("capacity")));
    assert_eq!(l(u32::MAX).check().map_err(|e| e.errno()), Err(errno::EINVAL));
}
