//! Helpers shared by the host integration tests.

use std::io::Write;
use std::path::PathBuf;

/// A file of `len` bytes of the test pattern with `seed`, in the temporary directory; removed
/// on drop. `name` keeps concurrent tests' files apart.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Creates it.
    pub fn new(name: &str, len: usize, seed: u64) -> TempFile {
        let p = std::env::temp_dir().join(format!("ugds-{name}-{}", std::process::id()));
        let mut data = vec![0u8; len];
        ugds::pattern::fill(seed, 0, &mut data);
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        TempFile(p)
    }

    /// Its path.
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
