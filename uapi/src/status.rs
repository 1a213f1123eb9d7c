//! Completion status (base spec 2.0, section 4.6.1.2; NVM command set spec 1.0 for 0x80+),
//! decoded into status code type and status code, each with the spec's name.

/// Status Code Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusType {
    /// 0: Generic Command Status.
    Generic,
    /// 1: Command Specific Status.
    CommandSpecific,
    /// 2: Media and Data Integrity Errors.
    Media,
    /// 3: Path Related Status.
    Path,
    /// 7: Vendor Specific.
    Vendor,
    /// 4..=6: reserved.
    Reserved(u8),
}

impl StatusType {
    /// Decodes the 3-bit SCT field.
    pub const fn from_bits(v: u8) -> Self {
        match v & 0x7 {
            0 => StatusType::Generic,
            1 => StatusType::CommandSpecific,
            2 => StatusType::Media,
            3 => StatusType::Path,
            7 => StatusType::Vendor,
            r => StatusType::Reserved(r),
        }
    }
    /// The 3-bit SCT field.
    pub const fn bits(self) -> u8 {
        match self {
            StatusType::Generic => 0,
            StatusType::CommandSpecific => 1,
            StatusType::Media => 2,
            StatusType::Path => 3,
            StatusType::Vendor => 7,
            StatusType::Reserved(r) => r & 0x7,
        }
    }
    /// The spec's name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            StatusType::Generic => "Generic Command Status",
            StatusType::CommandSpecific => "Command Specific Status",
            StatusType::Media => "Media and Data Integrity Error",
            StatusType::Path => "Path Related Status",
            StatusType::Vendor => "Vendor Specific",
            StatusType::Reserved(_) => "Reserved Status Code Type",
        }
    }
}

/// A decoded completion status: type, code, and the More / Do Not Retry / retry-delay bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Status code type.
    pub sct: StatusType,
    /// Status code.
    pub sc: u8,
    /// CRD: command retry delay index (0..=3).
    pub crd: u8,
    /// M: more status information in the Error Information log.
    pub more: bool,
    /// DNR: do not retry.
    pub dnr: bool,
}

/// Generic command status codes with their names.
pub const GENERIC_STATUS: &[(u8, &str)] = &[
    (0x00, "Successful Completion"),
    (0x01, "Invalid Command Opcode"),
    (0x02, "Invalid Field in Command"),
    (0x03, "Command ID Conflict"),
    (0x04, "Data Transfer Error"),
    (0x05, "Commands Aborted due to Power Loss Notification"),
    (0x06, "Internal Error"),
    (0x07, "Command Abort Requested"),
    (0x08, "Command Aborted due to SQ Deletion"),
    (0x09, "Command Aborted due to Failed Fused Command"),
    (0x0A, "Command Aborted due to Missing Fused Command"),
    (0x0B, "Invalid Namespace or Format"),
    (0x0C, "Command Sequence Error"),
    (0x0D, "Invalid SGL Segment Descriptor"),
    (0x0E, "Invalid Number of SGL Descriptors"),
    (0x0F, "Data SGL Length Invalid"),
    (0x10, "Metadata SGL Length Invalid"),
    (0x11, "SGL Descriptor Type Invalid"),
    (0x12, "Invalid Use of Controller Memory Buffer"),
    (0x13, "PRP Offset Invalid"),
    (0x14, "Atomic Write Unit Exceeded"),
    (0x15, "Operation Denied"),
    (0x16, "SGL Offset Invalid"),
    (0x18, "Host Identifier Inconsistent Format"),
    (0x19, "Keep Alive Timer Expired"),
    (0x1A, "Keep Alive Timeout Invalid"),
    (0x1B, "Command Aborted due to Preempt and Abort"),
    (0x1C, "Sanitize Failed"),
    (0x1D, "Sanitize In Progress"),
    (0x1E, "SGL Data Block Granularity Invalid"),
    (0x1F, "Command Not Supported for Queue in CMB"),
    (0x20, "Namespace is Write Protected"),
    (0x21, "Command Interrupted"),
    (0x22, "Transient Transport Error"),
    (0x23, "Command Prohibited by Command and Feature Lockdown"),
    (0x24, "Admin Command Media Not Ready"),
    (0x80, "LBA Out of Range"),
    (0x81, "Capacity Exceeded"),
    (0x82, "Namespace Not Ready"),
    (0x83, "Reservation Conflict"),
    (0x84, "Format In Progress"),
];

/// Command specific status codes (admin commands below 0x80, NVM commands from 0x80).
pub const COMMAND_SPECIFIC_STATUS: &[(u8, &str)] = &[
    (0x00, "Completion Queue Invalid"),
    (0x01, "Invalid Queue Identifier"),
    (0x02, "Invalid Queue Size"),
    (0x03, "Abort Command Limit Exceeded"),
    (0x05, "Asynchronous Event Request Limit Exceeded"),
    (0x06, "Invalid Firmware Slot"),
    (0x07, "Invalid Firmware Image"),
    (0x08, "Invalid Interrupt Vector"),
    (0x09, "Invalid Log Page"),
    (0x0A, "Invalid Format"),
    (0x0B, "Firmware Activation Requires Conventional Reset"),
    (0x0C, "Invalid Queue Deletion"),
    (0x0D, "Feature Identifier Not Saveable"),
    (0x0E, "Feature Not Changeable"),
    (0x0F, "Feature Not Namespace Specific"),
    (0x10, "Firmware Activation Requires NVM Subsystem Reset"),
    (0x11, "Firmware Activation Requires Controller Level Reset"),
    (0x12, "Firmware Activation Requires Maximum Time Violation"),
    (0x13, "Firmware Activation Prohibited"),
    (0x14, "Overlapping Range"),
    (0x15, "Namespace Insufficient Capacity"),
    (0x16, "Namespace Identifier Unavailable"),
    (0x18, "Namespace Already Attached"),
    (0x19, "Namespace Is Private"),
    (0x1A, "Namespace Not Attached"),
    (0x1B, "Thin Provisioning Not Supported"),
    (0x1C, "Controller List Invalid"),
    (0x80, "Conflicting Attributes"),
    (0x81, "Invalid Protection Information"),
    (0x82, "Attempted Write to Read Only Range"),
    (0x83, "Command Size Limit Exceeded"),
];

/// Media and data integrity error codes.
pub const MEDIA_STATUS: &[(u8, &str)] = &[
    (0x80, "Write Fault"),
    (0x81, "Unrecovered Read Error"),
    (0x82, "End-to-end Guard Check Error"),
    (0x83, "End-to-end Application Tag Check Error"),
    (0x84, "End-to-end Reference Tag Check Error"),
    (0x85, "Compare Failure"),
    (0x86, "Access Denied"),
    (0x87, "Deallocated or Unwritten Logical Block"),
    (0x88, "End-to-end Storage Tag Check Error"),
];

/// Path related status codes.
pub const PATH_STATUS: &[(u8, &str)] = &[
    (0x00, "Internal Path Error"),
    (0x01, "Asymmetric Access Persistent Loss"),
    (0x02, "Asymmetric Access Inaccessible"),
    (0x03, "Asymmetric Access Transition"),
    (0x60, "Controller Pathing Error"),
    (0x70, "Host Pathing Error"),
    (0x71, "Command Aborted By Host"),
];

const fn lookup(table: &'static [(u8, &'static str)], sc: u8) -> Option<&'static str> {
    let mut i = 0;
    while i < table.len() {
        if table[i].0 == sc {
            return Some(table[i].1);
        }
        i += 1;
    }
    None
}

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status::new(StatusType::Generic, 0);

    /// A status with no retry/more bits.
    pub const fn new(sct: StatusType, sc: u8) -> Self {
        Status { sct, sc, crd: 0, more: false, dnr: false }
    }

    /// Decodes the 15-bit status field (CQE DW3 bits 31:17, shifted down).
    pub const fn from_field(f: u16) -> Self {
        Status {
            // CAST: masked fields.
            sc: (f & 0xFF) as u8,
            sct: StatusType::from_bits(((f >> 8) & 0x7) as u8),
            crd: ((f >> 11) & 0x3) as u8,
            more: (f >> 13) & 1 != 0,
            dnr: (f >> 14) & 1 != 0,
        }
    }

    /// Encodes back into the 15-bit status field.
    pub const fn to_field(self) -> u16 {
        self.sc as u16
            | (self.sct.bits() as u16) << 8
            | ((self.crd & 3) as u16) << 11
            | (self.more as u16) << 13
            | (self.dnr as u16) << 14
    }

    /// True for Successful Completion.
    pub const fn is_success(self) -> bool {
        matches!(self.sct, StatusType::Generic) && self.sc == 0
    }

    /// The spec's name for this status code, or `None` for a code the spec reserves.
    pub const fn name(self) -> Option<&'static str> {
        match self.sct {
            StatusType::Generic => lookup(GENERIC_STATUS, self.sc),
            StatusType::CommandSpecific => lookup(COMMAND_SPECIFIC_STATUS, self.sc),
            StatusType::Media => lookup(MEDIA_STATUS, self.sc),
            StatusType::Path => lookup(PATH_STATUS, self.sc),
            StatusType::Vendor | StatusType::Reserved(_) => None,
        }
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}")?,
            None => write!(f, "unknown status")?,
        }
        write!(f, " (SCT {:#x} {}, SC {:#04x}", self.sct.bits(), self.sct.name(), self.sc)?;
        if self.dnr {
            write!(f, ", do not retry")?;
        }
        write!(f, ")")
    }
}
