//! Controller health: the data structures the module's restricted admin pass-through returns
//! (Identify Controller and Namespace, the SMART / Health, Error Information and Firmware Slot
//! logs), parsed from bytes. [`crate::Device`] reads them (`identify_controller`,
//! `smart_log`, ...); the parsers here take any byte image, so a log saved elsewhere (or built
//! in a test) reads the same way. docs/health.md says what the pass-through allows.

use crate::error::{Error, Result};
use zerocopy::{FromBytes, Immutable, KnownLayout};

pub use ugds_uapi::identify::{IdentifyController, IdentifyNamespace, LbaFormat};
pub use ugds_uapi::log::{critical, lid, ErrorLogEntry, FirmwareSlotLog, SmartLog, NSID_ALL};

/// `T` from the first `size_of::<T>()` bytes of `bytes`; [`Error::InvalidArgument`] naming
/// `what` when there are fewer.
fn parse<T: FromBytes + KnownLayout + Immutable>(what: &'static str, bytes: &[u8]) -> Result<T> {
    T::read_from_prefix(bytes).map(|(v, _)| v).map_err(|_| {
        Error::invalid("bytes", format!("{what}: {} bytes, the structure has {}", bytes.len(), size_of::<T>()))
    })
}

/// The SMART / Health Information log (LID 02h) from its 512-byte image.
pub fn parse_smart_log(bytes: &[u8]) -> Result<SmartLog> {
    parse("SMART / Health Information log", bytes)
}

/// The Firmware Slot Information log (LID 03h) from its 512-byte image.
pub fn parse_firmware_log(bytes: &[u8]) -> Result<FirmwareSlotLog> {
    parse("Firmware Slot Information log", bytes)
}

/// Identify Controller from its 4096-byte image.
pub fn parse_identify_controller(bytes: &[u8]) -> Result<IdentifyController> {
    parse("Identify Controller", bytes)
}

/// Identify Namespace from its 4096-byte image.
pub fn parse_identify_namespace(bytes: &[u8]) -> Result<IdentifyNamespace> {
    parse("Identify Namespace", bytes)
}

/// Every entry of an Error Information log image (LID 01h: 64-byte entries, most recent
/// first; an entry whose error count is 0 is empty and is kept, so indexes match the log).
/// The image must be a whole number of entries.
pub fn parse_error_log(bytes: &[u8]) -> Result<Vec<ErrorLogEntry>> {
    const ENTRY: usize = size_of::<ErrorLogEntry>();
    if bytes.is_empty() || !bytes.len().is_multiple_of(ENTRY) {
        return Err(Error::invalid(
            "bytes",
            format!("Error Information log: {} bytes is not a whole number of {ENTRY}-byte entries", bytes.len()),
        ));
    }
    bytes.chunks_exact(ENTRY).map(|c| parse("Error Information log entry", c)).collect()
}

/// A space- or NUL-padded ASCII field (serial, model, firmware revision, NQN) as a string,
/// trimmed; bytes that are not UTF-8 become U+FFFD.
pub fn ascii(field: &[u8]) -> String {
    String::from_utf8_lossy(field).trim_end_matches([' ', '\0']).to_string()
}

/// A temperature in kelvins (as the SMART log reports it) in degrees Celsius; `None` for 0,
/// which the log uses for "not reported".
pub fn celsius(kelvin: u16) -> Option<i32> {
    (kelvin != 0).then(|| i32::from(kelvin) - 273)
}

/// The names of the Critical Warning bits set in `bits` ([`SmartLog::critical_warning`]).
pub fn critical_warnings(bits: u8) -> Vec<&'static str> {
    const NAMES: [(u8, &str); 6] = [
        (critical::SPARE, "available spare below threshold"),
        (critical::TEMPERATURE, "temperature out of range"),
        (critical::RELIABILITY, "reliability degraded"),
        (critical::READ_ONLY, "media read-only"),
        (critical::VOLATILE_BACKUP, "volatile memory backup failed"),
        (critical::PMR_READ_ONLY, "persistent memory region read-only"),
    ];
    NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect()
}

#[cfg(test)]
mod tests;
