//! NVMe/RDMA transport binding wire layouts: the RDMA CM private data of a connect request,
//! accept and reject (NVMe over Fabrics 1.1, section 7.3.1, "RDMA CM"; the same fields as the
//! Linux kernel's `include/linux/nvme-rdma.h`), and the keyed SGL data block descriptor that
//! names host memory by address and remote key. Capsules are the 64-byte SQE (plus in-capsule
//! data) and the 16-byte CQE themselves: no header of their own.

/// Record format 1.0 of the private data.
pub const RECFMT_1_0: u16 = 0;

/// Status codes of a reject's private data (`sts`).
pub mod reject {
    /// Invalid private data length.
    pub const INVALID_LEN: u16 = 0x01;
    /// Invalid record format.
    pub const INVALID_RECFMT: u16 = 0x02;
    /// Invalid queue ID.
    pub const INVALID_QID: u16 = 0x03;
    /// Invalid host send queue size.
    pub const INVALID_HSQSIZE: u16 = 0x04;
    /// Invalid host receive queue size.
    pub const INVALID_HRQSIZE: u16 = 0x05;
    /// No resources.
    pub const NO_RSC: u16 = 0x06;
    /// Invalid IRD.
    pub const INVALID_IRD: u16 = 0x07;
    /// Invalid ORD.
    pub const INVALID_ORD: u16 = 0x08;
    /// Invalid controller ID.
    pub const INVALID_CNTLID: u16 = 0x09;
}

/// What a reject status means.
pub fn reject_reason(sts: u16) -> &'static str {
    match sts {
        reject::INVALID_LEN => "invalid private data length",
        reject::INVALID_RECFMT => "invalid record format",
        reject::INVALID_QID => "invalid queue ID",
        reject::INVALID_HSQSIZE => "invalid host send queue size",
        reject::INVALID_HRQSIZE => "invalid host receive queue size",
        reject::NO_RSC => "no resources",
        reject::INVALID_IRD => "invalid IRD",
        reject::INVALID_ORD => "invalid ORD",
        reject::INVALID_CNTLID => "invalid controller ID",
        _ => "an unknown reject status",
    }
}

/// Private data of the host's RDMA CM connect request (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct CmRequest {
    recfmt: u16,
    qid: u16,
    hrqsize: u16,
    hsqsize: u16,
    cntlid: u16,
    rsvd: [u8; 22],
}

const _: () = assert!(core::mem::size_of::<CmRequest>() == 32);
const _: () = assert!(core::mem::offset_of!(CmRequest, qid) == 2);
const _: () = assert!(core::mem::offset_of!(CmRequest, hrqsize) == 4);
const _: () = assert!(core::mem::offset_of!(CmRequest, hsqsize) == 6);
const _: () = assert!(core::mem::offset_of!(CmRequest, cntlid) == 8);

impl CmRequest {
    /// Queue `qid` with `hrqsize` receive buffers on the host and `hsqsize` (0's based)
    /// submission queue entries; `cntlid` is the controller an I/O queue joins (0xFFFF on the
    /// admin queue).
    pub const fn new(qid: u16, hrqsize: u16, hsqsize: u16, cntlid: u16) -> Self {
        CmRequest {
            recfmt: RECFMT_1_0.to_le(),
            qid: qid.to_le(),
            hrqsize: hrqsize.to_le(),
            hsqsize: hsqsize.to_le(),
            cntlid: cntlid.to_le(),
            rsvd: [0; 22],
        }
    }
    /// Queue ID.
    pub const fn qid(&self) -> u16 {
        u16::from_le(self.qid)
    }
    /// Host receive queue size.
    pub const fn hrqsize(&self) -> u16 {
        u16::from_le(self.hrqsize)
    }
    /// Host send queue size, 0's based.
    pub const fn hsqsize(&self) -> u16 {
        u16::from_le(self.hsqsize)
    }
}

/// Private data of the controller's accept (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct CmAccept {
    recfmt: u16,
    crqsize: u16,
    rsvd: [u8; 28],
}

const _: () = assert!(core::mem::size_of::<CmAccept>() == 32);

impl CmAccept {
    /// Controller receive queue size.
    pub const fn crqsize(&self) -> u16 {
        u16::from_le(self.crqsize)
    }
}

/// Private data of the controller's reject (4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct CmReject {
    recfmt: u16,
    sts: u16,
}

const _: () = assert!(core::mem::size_of::<CmReject>() == 4);

impl CmReject {
    /// A reject with status `sts` (tests).
    pub const fn new(sts: u16) -> Self {
        CmReject { recfmt: RECFMT_1_0.to_le(), sts: sts.to_le() }
    }
    /// Record format.
    pub const fn recfmt(&self) -> u16 {
        u16::from_le(self.recfmt)
    }
    /// Status (see [`reject`]).
    pub const fn sts(&self) -> u16 {
        u16::from_le(self.sts)
    }
}

/// SGL descriptor type byte: keyed data block (type 4), address subtype (0).
pub const SGL_KEYED_ADDRESS: u8 = 0x40;

/// The longest keyed data block: its length field has 24 bits.
pub const KEYED_MAX_LEN: u32 = (1 << 24) - 1;

/// A keyed SGL data block descriptor as the two quadwords of an SQE's data pointer: `addr`
/// (quadword 0), then the 24-bit length, the 32-bit key and the type byte (quadword 1).
/// Lengths past [`KEYED_MAX_LEN`] do not fit (`None`).
pub const fn keyed_sgl(addr: u64, len: u32, key: u32) -> Option<(u64, u64)> {
    if len > KEYED_MAX_LEN {
        return None;
    }
    Some((addr, len as u64 | (key as u64) << 24 | (SGL_KEYED_ADDRESS as u64) << 56))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_sgl_bytes() {
        let (a, b) = keyed_sgl(0x1122_3344_5566_7788, 0x0A_BCDE, 0xDEAD_BEEF).unwrap();
        assert_eq!(a, 0x1122_3344_5566_7788);
        let bytes = b.to_le_bytes();
        // Length (3 bytes LE), key (4 bytes LE), type.
        assert_eq!(bytes, [0xDE, 0xBC, 0x0A, 0xEF, 0xBE, 0xAD, 0xDE, 0x40]);
        assert!(keyed_sgl(0, 1 << 24, 0).is_none());
    }

    #[test]
    fn private_data_fields() {
        let r = CmRequest::new(3, 128, 127, 7);
        assert_eq!((r.qid(), r.hrqsize(), r.hsqsize()), (3, 128, 127));
        assert_eq!(CmReject::new(reject::INVALID_QID).sts(), 3);
        assert_eq!(reject_reason(reject::NO_RSC), "no resources");
    }
}
