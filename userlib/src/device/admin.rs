//! The module's restricted admin pass-through on [`Device`]: Identify, Get Log Page and Get
//! Features run on the kernel's admin queue, every other opcode is refused by the module
//! ([`Error::AdminOpcodeRefused`]) before it reaches the controller. docs/health.md says why.

use super::Device;
use crate::error::{Error, Result};
use crate::health::{
    lid, parse_error_log, parse_firmware_log, parse_identify_controller, parse_identify_namespace, parse_smart_log,
    ErrorLogEntry, FirmwareSlotLog, IdentifyController, IdentifyNamespace, SmartLog, NSID_ALL,
};
use crate::sys::req;
use ugds_uapi::args::{admin_data_bound, IDENTIFY_BYTES};
use ugds_uapi::ioctl::AdminCommand;
use ugds_uapi::queue::{admin, cns};
use ugds_uapi::Status;

/// How long the module waits for one admin command (kmod `ADMIN_TIMEOUT_MS`).
const ADMIN_TIMEOUT_MS: u64 = 5000;

impl Device {
    /// Runs one admin command through the module: `opcode` with `nsid` and command dwords
    /// 10..15 (`cdw[0]` is CDW10), the data (if any) into `data`. Returns completion dword 0.
    ///
    /// Only Identify (0x06, `data` exactly 4096 bytes), Get Log Page (0x02, 4 bytes up to 64 KiB
    /// or the controller's MDTS, a multiple of 4; the module sets NUMD from `data` and RAE) and
    /// Get Features (0x0A, up to 4096 bytes) run. Errors: [`Error::AdminOpcodeRefused`] for
    /// any other opcode, [`Error::InvalidArgument`] for a length the opcode does not take,
    /// [`Error::AdminFailed`] when the controller completes it with an error status,
    /// [`Error::DeviceFaulted`] while the controller needs a reset, [`Error::Timeout`] when it
    /// did not answer (the module then resets it).
    pub fn admin_command(&self, opcode: u8, nsid: u32, cdw: [u32; 6], data: &mut [u8]) -> Result<u32> {
        self.inner.born.check("device")?;
        let data_len = u32::try_from(data.len()).map_err(|_| Error::invalid("data", "longer than 4 GiB"))?;
        let ptr = if data.is_empty() { 0 } else { data.as_mut_ptr() as u64 };
        let mut a = AdminCommand { opcode, nsid, cdw, data_len, data: ptr, ..Default::default() };
        // SAFETY: `a.data` is `data`, a live slice of `data_len` bytes that this call borrows
        // exclusively (or 0 with no data); the module writes at most `data_len` bytes there.
        let r = unsafe { self.inner.fd.ioctl_unchecked(req::AdminCmd, &mut a) };
        match r {
            Ok(_) => {}
            Err(Error::Control { op, source }) => {
                return Err(match source.raw_os_error() {
                    Some(libc::EACCES) => Error::AdminOpcodeRefused { opcode },
                    Some(libc::EINVAL) => Error::invalid(
                        "data",
                        format!(
                            "{} bytes is not a length admin opcode {opcode:#04x} takes (Identify: 4096; \
                             Get Log Page: 4..={} in dwords; Get Features: 0..=4096 in dwords)",
                            data.len(),
                            admin_data_bound(self.inner.info.mdts_bytes)
                        ),
                    ),
                    Some(libc::EIO) if self.inner.status.state().faulted() => Error::DeviceFaulted,
                    Some(libc::ETIMEDOUT) => {
                        Error::Timeout { op: "admin command", slba: 0, timeout_ms: ADMIN_TIMEOUT_MS }
                    }
                    _ => Error::Control { op, source },
                })
            }
            Err(e) => return Err(e),
        }
        if a.status != 0 {
            // CAST: the status field is 15 bits (the module fills it from a 16-bit field).
            return Err(Error::AdminFailed { opcode, status: Status::from_field(a.status as u16) });
        }
        Ok(a.result)
    }

    /// Identify with `cns` (CDW10 bits 7:0) for `nsid` into a 4096-byte structure.
    pub fn identify(&self, cns: u8, nsid: u32) -> Result<Box<[u8; 4096]>> {
        let mut buf = Box::new([0u8; IDENTIFY_BYTES as usize]);
        self.admin_command(admin::IDENTIFY, nsid, [u32::from(cns), 0, 0, 0, 0, 0], &mut buf[..])?;
        Ok(buf)
    }

    /// Identify Controller, as the controller reports it now.
    pub fn identify_controller(&self) -> Result<IdentifyController> {
        parse_identify_controller(&self.identify(cns::CONTROLLER as u8, 0)?[..])
    }

    /// Identify Namespace `nsid` (any namespace the controller has, also one ugds does not
    /// serve, such as one formatted with metadata).
    pub fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace> {
        parse_identify_namespace(&self.identify(cns::NAMESPACE as u8, nsid)?[..])
    }

    /// Get Log Page `lid` for `nsid` ([`NSID_ALL`] for the controller) into `buf`, whose length
    /// is the transfer: 4 bytes up to [`Device::admin_data_bound`], a multiple of 4.
    pub fn log_page(&self, lid: u8, nsid: u32, buf: &mut [u8]) -> Result<()> {
        self.admin_command(admin::GET_LOG_PAGE, nsid, [u32::from(lid), 0, 0, 0, 0, 0], buf).map(|_| ())
    }

    /// Get Features `fid` with select `sel` (0 current, 1 default, 2 saved, 3 supported
    /// capabilities) and feature-specific CDW11; a feature with a data structure fills `data`
    /// (empty for the others). Returns completion dword 0: the value of most features.
    pub fn get_features(&self, fid: u8, sel: u8, cdw11: u32, data: &mut [u8]) -> Result<u32> {
        let cdw10 = u32::from(fid) | u32::from(sel & 0x7) << 8;
        self.admin_command(admin::GET_FEATURES, 0, [cdw10, cdw11, 0, 0, 0, 0], data)
    }

    /// The most bytes one admin command transfers on this controller: 64 KiB or its MDTS.
    pub fn admin_data_bound(&self) -> usize {
        // CAST: u32 to usize widens.
        admin_data_bound(self.inner.info.mdts_bytes) as usize
    }

    /// The SMART / Health Information log of the controller.
    pub fn smart_log(&self) -> Result<SmartLog> {
        let mut b = [0u8; 512];
        self.log_page(lid::SMART, NSID_ALL, &mut b)?;
        parse_smart_log(&b)
    }

    /// The Error Information log: as many entries as the controller keeps (Identify
    /// Controller ELPE + 1), at most what one admin command transfers; most recent first.
    pub fn error_log(&self) -> Result<Vec<ErrorLogEntry>> {
        const ENTRY: usize = size_of::<ErrorLogEntry>();
        let entries = (usize::from(self.identify_controller()?.elpe) + 1).min(self.admin_data_bound() / ENTRY);
        let mut b = vec![0u8; entries * ENTRY];
        self.log_page(lid::ERROR, NSID_ALL, &mut b)?;
        parse_error_log(&b)
    }

    /// The Firmware Slot Information log.
    pub fn firmware_log(&self) -> Result<FirmwareSlotLog> {
        let mut b = [0u8; 512];
        self.log_page(lid::FIRMWARE_SLOT, NSID_ALL, &mut b)?;
        parse_firmware_log(&b)
    }
}
