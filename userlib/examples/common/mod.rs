//! What the examples share: the target they run on. Each example takes a target as its first
//! argument (a ugds node, file, block device, `stripe:` volume or `nvmeof://` URI) and only
//! reads from it; without one it makes a scratch file of the test pattern, where it also writes
//! and checks what it read.

/// The seed of the scratch file's pattern ([`ugds::pattern`]).
pub const SEED: u64 = 0x0e8a_4d1e;

/// What an example's `main` returns: its message on stdout, or the error's on stderr and exit
/// status 1.
pub fn report(r: Result<String, Box<dyn std::error::Error>>) -> std::process::ExitCode {
    match r {
        Ok(said) => {
            println!("{said}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Where an example does its I/O.
pub struct Target {
    /// What to open.
    pub path: String,
    /// True for the scratch file: it holds the pattern with [`SEED`], and may be written.
    pub scratch: bool,
}

impl Target {
    /// The first argument, else a scratch file of `len` bytes.
    pub fn from_args(len: usize) -> std::io::Result<Target> {
        match std::env::args().nth(1) {
            Some(path) => Ok(Target { path, scratch: false }),
            None => Target::scratch(len),
        }
    }

    /// A scratch file of `len` bytes of the pattern in the temporary directory (the fallback
    /// path), removed on drop.
    pub fn scratch(len: usize) -> std::io::Result<Target> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ugds-example-{}-{n}", std::process::id()));
        let mut data = vec![0u8; len];
        ugds::pattern::fill(SEED, 0, &mut data);
        std::fs::write(&path, data)?;
        let path = path.into_os_string().into_string().map_err(|_| std::io::ErrorKind::InvalidFilename)?;
        Ok(Target { path, scratch: true })
    }

    /// On the scratch file: an error unless `data` is the pattern at `offset`.
    pub fn check(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        match ugds::pattern::first_mismatch(SEED, offset, data) {
            Some(at) if self.scratch => Err(format!("{}: wrong data at byte {}", self.path, offset + at)),
            _ => Ok(()),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
