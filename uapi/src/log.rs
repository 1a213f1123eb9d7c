//! Log pages ugds reads through `ADMIN_CMD` (base spec 2.0, 5.16.1): Error Information (LID
//! 01h), SMART / Health Information (02h) and Firmware Slot Information (03h), at the spec's
//! offsets. Every field is a little-endian byte array (the logs put 16-bit values at odd
//! offsets and 128-bit counters everywhere), read through a getter returning the host value.

/// Log page identifiers.
pub mod lid {
    /// Error Information (64-byte entries, Identify Controller ELPE + 1 of them).
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information (512 bytes).
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information (512 bytes).
    pub const FIRMWARE_SLOT: u8 = 0x03;
}

/// The namespace id that names the controller as a whole (all namespaces).
pub const NSID_ALL: u32 = 0xFFFF_FFFF;

const fn le16(b: [u8; 2]) -> u16 {
    u16::from_le_bytes(b)
}

const fn le32(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

const fn le64(b: [u8; 8]) -> u64 {
    u64::from_le_bytes(b)
}

const fn le128(b: [u8; 16]) -> u128 {
    u128::from_le_bytes(b)
}

/// SMART / Health Information log (LID 02h), 512 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct SmartLog {
    /// Critical Warning bits ([`critical`]).
    pub critical_warning: u8,
    composite_temperature: [u8; 2],
    /// Available Spare, percent of the spare capacity left.
    pub available_spare: u8,
    /// Available Spare Threshold, percent.
    pub available_spare_threshold: u8,
    /// Percentage Used of the life the manufacturer estimates (may exceed 100).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary.
    pub endurance_group_critical_warning: u8,
    rsvd7: [u8; 25],
    data_units_read: [u8; 16],
    data_units_written: [u8; 16],
    host_read_commands: [u8; 16],
    host_write_commands: [u8; 16],
    controller_busy_time: [u8; 16],
    power_cycles: [u8; 16],
    power_on_hours: [u8; 16],
    unsafe_shutdowns: [u8; 16],
    media_errors: [u8; 16],
    error_log_entries: [u8; 16],
    warning_temperature_time: [u8; 4],
    critical_temperature_time: [u8; 4],
    temperature_sensors: [[u8; 2]; 8],
    thermal_transitions: [[u8; 4]; 2],
    thermal_time: [[u8; 4]; 2],
    rsvd232: [u8; 280],
}

const _: () = assert!(core::mem::size_of::<SmartLog>() == 512);
const _: () = assert!(core::mem::offset_of!(SmartLog, composite_temperature) == 1);
const _: () = assert!(core::mem::offset_of!(SmartLog, available_spare) == 3);
const _: () = assert!(core::mem::offset_of!(SmartLog, percentage_used) == 5);
const _: () = assert!(core::mem::offset_of!(SmartLog, data_units_read) == 32);
const _: () = assert!(core::mem::offset_of!(SmartLog, host_read_commands) == 64);
const _: () = assert!(core::mem::offset_of!(SmartLog, power_cycles) == 112);
const _: () = assert!(core::mem::offset_of!(SmartLog, power_on_hours) == 128);
const _: () = assert!(core::mem::offset_of!(SmartLog, media_errors) == 160);
const _: () = assert!(core::mem::offset_of!(SmartLog, error_log_entries) == 176);
const _: () = assert!(core::mem::offset_of!(SmartLog, warning_temperature_time) == 192);
const _: () = assert!(core::mem::offset_of!(SmartLog, temperature_sensors) == 200);
const _: () = assert!(core::mem::offset_of!(SmartLog, thermal_transitions) == 216);
const _: () = assert!(core::mem::offset_of!(SmartLog, thermal_time) == 224);

/// Critical Warning bits of [`SmartLog::critical_warning`].
pub mod critical {
    /// Available spare capacity fell below the threshold.
    pub const SPARE: u8 = 1 << 0;
    /// A temperature is above an over-temperature or below an under-temperature threshold.
    pub const TEMPERATURE: u8 = 1 << 1;
    /// NVM subsystem reliability degraded (media errors, internal errors).
    pub const RELIABILITY: u8 = 1 << 2;
    /// All media are read-only.
    pub const READ_ONLY: u8 = 1 << 3;
    /// The volatile memory backup device failed.
    pub const VOLATILE_BACKUP: u8 = 1 << 4;
    /// Persistent memory region became read-only or unreliable.
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

impl SmartLog {
    /// Composite Temperature in kelvins (0: not reported).
    pub const fn composite_temperature(&self) -> u16 {
        le16(self.composite_temperature)
    }
    /// Data Units Read: thousands of 512-byte units read by the host.
    pub const fn data_units_read(&self) -> u128 {
        le128(self.data_units_read)
    }
    /// Data Units Written: thousands of 512-byte units written by the host.
    pub const fn data_units_written(&self) -> u128 {
        le128(self.data_units_written)
    }
    /// Host Read Commands completed.
    pub const fn host_read_commands(&self) -> u128 {
        le128(self.host_read_commands)
    }
    /// Host Write Commands completed.
    pub const fn host_write_commands(&self) -> u128 {
        le128(self.host_write_commands)
    }
    /// Controller Busy Time in minutes.
    pub const fn controller_busy_time(&self) -> u128 {
        le128(self.controller_busy_time)
    }
    /// Power Cycles.
    pub const fn power_cycles(&self) -> u128 {
        le128(self.power_cycles)
    }
    /// Power On Hours.
    pub const fn power_on_hours(&self) -> u128 {
        le128(self.power_on_hours)
    }
    /// Unsafe Shutdowns.
    pub const fn unsafe_shutdowns(&self) -> u128 {
        le128(self.unsafe_shutdowns)
    }
    /// Media and Data Integrity Errors.
    pub const fn media_errors(&self) -> u128 {
        le128(self.media_errors)
    }
    /// Number of Error Information Log Entries over the controller's life.
    pub const fn error_log_entries(&self) -> u128 {
        le128(self.error_log_entries)
    }
    /// Warning Composite Temperature Time, minutes.
    pub const fn warning_temperature_time(&self) -> u32 {
        le32(self.warning_temperature_time)
    }
    /// Critical Composite Temperature Time, minutes.
    pub const fn critical_temperature_time(&self) -> u32 {
        le32(self.critical_temperature_time)
    }
    /// Temperature Sensor `i` (0..8) in kelvins; 0 when not implemented or `i` is out of range.
    pub const fn temperature_sensor(&self, i: usize) -> u16 {
        if i < 8 {
            le16(self.temperature_sensors[i])
        } else {
            0
        }
    }
    /// Thermal Management Temperature `t` (1 or 2) Transition Count; 0 for another `t`.
    pub const fn thermal_transitions(&self, t: usize) -> u32 {
        if t == 1 || t == 2 {
            le32(self.thermal_transitions[t - 1])
        } else {
            0
        }
    }
    /// Total Time For Thermal Management Temperature `t` (1 or 2), seconds; 0 for another `t`.
    pub const fn thermal_time(&self, t: usize) -> u32 {
        if t == 1 || t == 2 {
            le32(self.thermal_time[t - 1])
        } else {
            0
        }
    }
}

/// One Error Information log entry (LID 01h), 64 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct ErrorLogEntry {
    error_count: [u8; 8],
    sqid: [u8; 2],
    cid: [u8; 2],
    status: [u8; 2],
    parameter_error_location: [u8; 2],
    lba: [u8; 8],
    nsid: [u8; 4],
    /// Vendor Specific Information Available: a log page id with more, 0 for none.
    pub vendor_specific: u8,
    /// Transport Type (NVMe over Fabrics; 0 on PCIe).
    pub transport_type: u8,
    rsvd30: [u8; 2],
    command_specific: [u8; 8],
    transport_specific: [u8; 2],
    rsvd42: [u8; 22],
}

const _: () = assert!(core::mem::size_of::<ErrorLogEntry>() == 64);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, sqid) == 8);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, status) == 12);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, lba) == 16);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, nsid) == 24);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, vendor_specific) == 28);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, command_specific) == 32);
const _: () = assert!(core::mem::offset_of!(ErrorLogEntry, transport_specific) == 40);

impl ErrorLogEntry {
    /// Error Count: a unique, increasing id of the error; 0 marks an empty entry.
    pub const fn error_count(&self) -> u64 {
        le64(self.error_count)
    }
    /// Submission Queue ID of the failed command (0xFFFF: not tied to one).
    pub const fn sqid(&self) -> u16 {
        le16(self.sqid)
    }
    /// Command ID of the failed command (0xFFFF: not tied to one).
    pub const fn cid(&self) -> u16 {
        le16(self.cid)
    }
    /// The Status Field as a completion carries it: bit 0 the phase tag, bits 15:1 the status.
    pub const fn status_field(&self) -> u16 {
        le16(self.status)
    }
    /// The status (bits 15:1 of the Status Field), decoded.
    pub const fn status(&self) -> super::Status {
        super::Status::from_field(self.status_field() >> 1)
    }
    /// Parameter Error Location: byte (bits 7:0) and bit (10:8) of the command field in error;
    /// 0xFFFF when not applicable.
    pub const fn parameter_error_location(&self) -> u16 {
        le16(self.parameter_error_location)
    }
    /// The first LBA that had the error.
    pub const fn lba(&self) -> u64 {
        le64(self.lba)
    }
    /// The namespace of the error.
    pub const fn nsid(&self) -> u32 {
        le32(self.nsid)
    }
    /// Command Specific Information.
    pub const fn command_specific(&self) -> u64 {
        le64(self.command_specific)
    }
    /// Transport Type Specific Information.
    pub const fn transport_specific(&self) -> u16 {
        le16(self.transport_specific)
    }
}

/// Firmware Slot Information log (LID 03h), 512 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "zerocopy",
    derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)
)]
#[repr(C)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: bits 2:0 the slot running now, bits 6:4 the slot activated at the
    /// next reset (0: none).
    pub afi: u8,
    rsvd1: [u8; 7],
    /// Firmware Revision for slots 1 to 7 (ASCII, space padded; all zero: slot empty).
    pub frs: [[u8; 8]; 7],
    rsvd64: [u8; 448],
}

const _: () = assert!(core::mem::size_of::<FirmwareSlotLog>() == 512);
const _: () = assert!(core::mem::offset_of!(FirmwareSlotLog, frs) == 8);

impl FirmwareSlotLog {
    /// The slot (1..=7) of the firmware running now.
    pub const fn active_slot(&self) -> u8 {
        self.afi & 0x7
    }
    /// The slot that becomes active at the next controller reset (0: the same as now).
    pub const fn next_slot(&self) -> u8 {
        (self.afi >> 4) & 0x7
    }
}
