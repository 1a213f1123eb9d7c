//! The engine's job options (fio's `struct fio_option` table for external engines): fio parses
//! them into an [`EngineOptions`] of each job's own (`td->eo`) and fills in the defaults.

use crate::sys;
use std::cell::UnsafeCell;
use std::ffi::{c_uint, c_void, CStr};
use std::mem::offset_of;
use ugds::{DataPointers, DeviceOptions, Waiting};

/// The options as fio stores them (`option_struct_size` bytes, zeroed, then the defaults).
#[repr(C)]
pub(crate) struct EngineOptions {
    /// fio writes the job's `thread_data` pointer here (every engine option struct starts with
    /// one), which is also why no option may be at offset 0.
    _td: *mut c_void,
    /// `ugds_queue`: 0 shared, 1 owned.
    queue: c_uint,
    /// `ugds_wait`: 0 adaptive, 1 poll, 2 interrupts.
    wait: c_uint,
    /// `ugds_dptr`: 0 auto, 1 PRPs only, 2 SGLs preferred.
    dptr: c_uint,
    /// `ugds_nsid`: the namespace of a node or of a volume's members.
    nsid: c_uint,
}

/// Queue pairs for synchronous I/O (iodepth 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueMode {
    /// The device's queue pairs, shared by the process's threads (one lock per queue pair).
    Shared,
    /// A queue pair of the fio thread's own, no lock (direct path on a ugds node only).
    Owned,
}

/// The options of one job, read once at `init`.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Queue pairs at iodepth 1.
    pub(crate) queue: QueueMode,
    /// Namespace id.
    pub(crate) nsid: u32,
    /// What the library's target resolver opens controllers with.
    pub(crate) device: DeviceOptions,
}

impl Settings {
    /// The settings from fio's parsed options (`None`: all defaults).
    pub(crate) fn from(eo: Option<&EngineOptions>) -> Settings {
        let (queue, wait, dptr, nsid) = eo.map_or((0, 0, 0, 1), |o| (o.queue, o.wait, o.dptr, o.nsid));
        let data_pointers = match dptr {
            1 => DataPointers::PrpOnly,
            2 => DataPointers::SglPreferred,
            _ => DataPointers::Auto,
        };
        let waiting = match wait {
            1 => Waiting::Poll,
            2 => Waiting::Interrupts,
            _ => Waiting::Adaptive,
        };
        Settings {
            queue: if queue == 1 { QueueMode::Owned } else { QueueMode::Shared },
            nsid: nsid.max(1),
            device: DeviceOptions { waiting, data_pointers, ..DeviceOptions::default() },
        }
    }
}

/// One possible value of a string option.
const fn value(ival: &'static CStr, oval: u64, help: &'static CStr) -> sys::value_pair {
    sys::value_pair { ival: ival.as_ptr(), oval, help: help.as_ptr(), orval: 0, cb: std::ptr::null_mut() }
}

/// One option of the engine's category.
const fn option(
    name: &'static CStr,
    lname: &'static CStr,
    kind: sys::fio_opt_type,
    off: usize,
    help: &'static CStr,
    def: &'static CStr,
) -> sys::fio_option {
    // SAFETY: fio_option is plain C data (pointers, integers, optional function pointers and
    // arrays of them): all zeroes is a valid value, and fio reads zero as "not set".
    let mut o: sys::fio_option = unsafe { std::mem::zeroed() };
    o.name = name.as_ptr();
    o.lname = lname.as_ptr();
    o.type_ = kind;
    // CAST: offsets inside a 24-byte struct.
    o.off1 = off as u32;
    o.help = help.as_ptr();
    o.def = def.as_ptr();
    o.category = sys::opt_category_FIO_OPT_C_ENGINE as u64;
    o.group = sys::opt_category_group_FIO_OPT_G_INVALID;
    o
}

const fn table() -> [sys::fio_option; 5] {
    let mut queue = option(
        c"ugds_queue",
        c"ugds queue pairs",
        sys::fio_opt_type_FIO_OPT_STR,
        offset_of!(EngineOptions, queue),
        c"Queue pairs for iodepth=1: the device's shared ones, or one of the thread's own",
        c"shared",
    );
    queue.posval[0] = value(c"shared", 0, c"The device's queue pairs, shared by the process's threads");
    queue.posval[1] = value(c"owned", 1, c"A queue pair of this thread's own, no lock (a ugds node only)");
    let mut wait = option(
        c"ugds_wait",
        c"ugds completion waiting",
        sys::fio_opt_type_FIO_OPT_STR,
        offset_of!(EngineOptions, wait),
        c"How waits for completions wait: spin while it pays then sleep, always spin, or always sleep",
        c"adaptive",
    );
    wait.posval[0] = value(c"adaptive", 0, c"Spin for a budget while a core is free, then sleep on the interrupt");
    wait.posval[1] = value(c"poll", 1, c"Busy-poll every wait");
    wait.posval[2] = value(c"interrupts", 2, c"Sleep on the queue's interrupt without spinning");
    let mut dptr = option(
        c"ugds_dptr",
        c"ugds data pointers",
        sys::fio_opt_type_FIO_OPT_STR,
        offset_of!(EngineOptions, dptr),
        c"How commands describe memory: PRPs or SGLs per command, PRPs only, SGLs where supported",
        c"auto",
    );
    dptr.posval[0] = value(c"auto", 0, c"PRPs for small transfers, an SGL where it is shorter");
    dptr.posval[1] = value(c"prp", 1, c"PRPs only");
    dptr.posval[2] = value(c"sgl", 2, c"SGLs where the controller supports them");
    let mut nsid = option(
        c"ugds_nsid",
        c"ugds namespace",
        sys::fio_opt_type_FIO_OPT_INT,
        offset_of!(EngineOptions, nsid),
        c"Namespace id of a ugds node, or of each member of a striped volume",
        c"1",
    );
    nsid.minval = 1;
    // SAFETY: as in `option`: the all-zero entry is fio's end of the table (name NULL).
    let end: sys::fio_option = unsafe { std::mem::zeroed() };
    [queue, wait, dptr, nsid, end]
}

/// The option table fio reads and writes (it caches lookups in it), hence a cell.
#[repr(transparent)]
pub(crate) struct Table(UnsafeCell<[sys::fio_option; 5]>);

// SAFETY: only fio touches the table, through the pointer in the engine's ops, while it parses
// job files and loads engines on its main thread; Rust code never reads or writes it.
unsafe impl Sync for Table {}

/// The options fio is given (`ioengine_ops.options`).
pub(crate) static OPTIONS: Table = Table(UnsafeCell::new(table()));

impl Table {
    /// The pointer fio takes.
    pub(crate) const fn as_ptr(&self) -> *mut sys::fio_option {
        self.0.get().cast()
    }
}

/// What fio allocates per job for the options.
pub(crate) const SIZE: usize = std::mem::size_of::<EngineOptions>();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_option_at_offset_zero_and_defaults_parse() {
        let t = table();
        for o in &t[..4] {
            assert!(o.off1 >= 8, "fio treats off1 == 0 as no storage");
        }
        assert!(t[4].name.is_null());
        let s = Settings::from(None);
        assert_eq!(s.queue, QueueMode::Shared);
        assert_eq!(s.nsid, 1);
        assert_eq!(s.device.waiting, Waiting::Adaptive);
    }

    #[test]
    fn parsed_values_map_to_the_library_options() {
        let o = EngineOptions { _td: std::ptr::null_mut(), queue: 1, wait: 2, dptr: 2, nsid: 3 };
        let s = Settings::from(Some(&o));
        assert_eq!(s.queue, QueueMode::Owned);
        assert_eq!(s.device.waiting, Waiting::Interrupts);
        let o = EngineOptions { wait: 1, ..o };
        assert_eq!(Settings::from(Some(&o)).device.waiting, Waiting::Poll);
        assert_eq!(s.device.data_pointers, DataPointers::SglPreferred);
        assert_eq!(s.nsid, 3);
    }
}
