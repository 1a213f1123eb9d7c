//! Telling a ugds device node from anything else, by its sysfs class rather than its name.

use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// The sysfs class of ugds device nodes: `/sys/class/ugds_drv`, nodes `/dev/ugds_drvN` (the
/// names uGDS uses, so its tools and LMCache's uGDS backend accept them).
pub const NODE_CLASS: &str = "ugds_drv";

/// True when `path` (or what it points to, e.g. `/proc/self/fd/N`) is a ugds device node: a
/// character device whose `/sys/dev/char/MAJ:MIN/subsystem` is the class [`NODE_CLASS`]. The
/// check goes by the sysfs class, never by the name, so a node of another driver named like
/// ours is not taken for one, and a ugds node under any name is.
pub fn is_ugds_node(path: impl AsRef<std::path::Path>) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return false };
    if !meta.file_type().is_char_device() {
        return false;
    }
    let rdev = meta.rdev();
    let subsystem = format!("/sys/dev/char/{}:{}/subsystem", libc::major(rdev), libc::minor(rdev));
    std::fs::read_link(subsystem).is_ok_and(|class| class.file_name().is_some_and(|n| n == NODE_CLASS))
}

/// What `path` is, in words (for errors that name a wrong target).
pub fn describe_path(path: impl AsRef<std::path::Path>) -> String {
    let Ok(meta) = std::fs::metadata(&path) else { return "missing".into() };
    let t = meta.file_type();
    if t.is_file() {
        format!("a regular file of {} bytes", meta.len())
    } else if t.is_dir() {
        "a directory".into()
    } else if t.is_block_device() {
        "a block device".into()
    } else if t.is_char_device() {
        let rdev = meta.rdev();
        let subsystem = format!("/sys/dev/char/{}:{}/subsystem", libc::major(rdev), libc::minor(rdev));
        match std::fs::read_link(subsystem).ok().and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned())) {
            Some(class) => format!("a character device of the class {class}"),
            None => "a character device".into(),
        }
    } else {
        "neither a file nor a device".into()
    }
}

#[cfg(test)]
mod tests {
    use super::is_ugds_node;

    /// Only a character device of the class `ugds_drv` is a ugds node: not a missing path, a
    /// regular file, a directory, another driver's character device, or a link to one.
    #[test]
    fn is_ugds_node_needs_the_sysfs_class() {
        assert!(!is_ugds_node("/nonexistent/ugds_drv0"));
        assert!(!is_ugds_node("/proc/self/exe"));
        assert!(!is_ugds_node("/dev"));
        assert!(!is_ugds_node("/dev/null"));
        let f = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        assert!(!is_ugds_node(format!("/proc/self/fd/{}", f.as_raw_fd())));
    }
}
