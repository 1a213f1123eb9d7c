//! [`Control`]: a ugds node opened for its control plane only (what `ugds list` and
//! `ugds status` read): GET_INFO, the status page and the controller's open files. It creates no
//! queue pair and registers nothing, so looking costs the controller nothing.

use crate::error::{Error, Result};
use crate::fork::Born;
use crate::mmio::StatusView;
use crate::sys::{req, DeviceFd};
use ugds_uapi::ioctl::{ControllerState, DeviceInfo, ListOpeners, Opener, StatusPage, MAX_OPENERS};

/// An open ugds node without queue pairs: identity, health and openers of its controller.
#[derive(Debug)]
pub struct Control {
    fd: DeviceFd,
    info: DeviceInfo,
    status: StatusView,
    born: Born,
}

impl Control {
    /// Opens `path` (a ugds node), checks the module's ABI version and maps the status page.
    /// A path that is not UTF-8 is [`Error::InvalidArgument`].
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Control> {
        Self::open_node(crate::error::utf8_path(path.as_ref())?)
    }

    fn open_node(path: &str) -> Result<Control> {
        if !super::is_ugds_node(path) {
            return Err(Error::NotUgdsNode {
                path: path.to_string(),
                what: super::describe_path(path),
                fix: "name a node of a controller bound to ugds (`ugds list` shows them; `ugds bind` makes one)",
            });
        }
        let born = crate::fork::watch()?;
        let fd = DeviceFd::open(path, false)?;
        let info = super::get_info(&fd)?;
        let status = StatusView::map(fd.raw())?;
        Ok(Control { fd, info, status, born })
    }

    /// What the controller reported (GET_INFO).
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Model number.
    pub fn model(&self) -> String {
        super::ascii(&self.info.model)
    }

    /// Serial number.
    pub fn serial(&self) -> String {
        super::ascii(&self.info.serial)
    }

    /// Firmware revision.
    pub fn firmware(&self) -> String {
        super::ascii(&self.info.firmware)
    }

    /// The state word of the status page: epoch and fault flag, read in one load.
    pub fn state(&self) -> Result<ControllerState> {
        self.born.check("control handle")?;
        Ok(self.status.state())
    }

    /// The whole status page.
    pub fn counters(&self) -> Result<StatusPage> {
        self.born.check("control handle")?;
        Ok(self.status.snapshot())
    }

    /// Every open file of the controller (this handle's own included, with nothing owned), as
    /// LIST_OPENERS reports them.
    pub fn openers(&self) -> Result<Vec<Opener>> {
        self.born.check("control handle")?;
        let mut room = 16u32;
        loop {
            let mut v = vec![Opener::default(); room as usize];
            let mut a = ListOpeners { capacity: room, count: 0, openers: v.as_mut_ptr() as u64 };
            // SAFETY: `a.openers` points to `v`, a live vector of `a.capacity` openers that
            // nothing else references during the call.
            let n = unsafe { self.fd.ioctl_unchecked(req::ListOpeners, &mut a) }?;
            if a.count <= room || room >= MAX_OPENERS {
                // CAST: the module copies at most `capacity` entries.
                v.truncate((n as usize).min(v.len()));
                return Ok(v);
            }
            room = a.count.min(MAX_OPENERS);
        }
    }
}
