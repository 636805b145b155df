//! Host uids for sandboxes when the server runs as root.
//!
//! Each live sandbox gets its own unprivileged uid (and gid of the same number) from a range
//! far above ordinary users. A distinct uid per sandbox means one sandbox's processes can
//! never signal or read another's, and `RLIMIT_NPROC` counts per sandbox. Leases are
//! `flock`s on files in the state directory, so several runbox servers on one host never
//! hand out the same uid, and a crashed server's leases vanish with it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

/// First uid of the default range: far above human users and the usual subuid ranges.
pub const DEFAULT_UID_BASE: u32 = 1_500_000_000;
/// Size of the default range.
pub const DEFAULT_UID_COUNT: u32 = 65_536;

/// Hands out uids from a range.
#[derive(Debug)]
pub struct UidPool {
    dir: PathBuf,
    base: u32,
    count: u32,
}

/// A uid held for the life of one sandbox; released on drop.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: Flock<File>,
}

impl UidLease {
    /// The uid (and gid).
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl UidPool {
    /// A pool over `[base, base + count)` keeping its lock files in `dir`.
    pub fn new(dir: PathBuf, base: u32, count: u32) -> io::Result<Self> {
        if base == 0 || count == 0 || base.checked_add(count).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "uid range must be non-empty and exclude 0",
            ));
        }
        fs::create_dir_all(&dir)?;
        Ok(Self { dir, base, count })
    }

    /// Leases a free uid.
    pub fn lease(&self) -> io::Result<UidLease> {
        let mut r = [0u8; 4];
        getrandom::fill(&mut r).map_err(|e| io::Error::other(e.to_string()))?;
        let start = u32::from_ne_bytes(r) % self.count;
        for i in 0..self.count {
            let uid = self.base + (start + i) % self.count;
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(self.dir.join(uid.to_string()))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(UidLease { uid, _lock: lock }),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => return Err(e.into()),
            }
        }
        Err(io::Error::other(format!(
            "all {} sandbox uids from {} are in use",
            self.count, self.base
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_until_released() {
        let t = tempfile::tempdir().unwrap();
        let pool = UidPool::new(t.path().to_path_buf(), 5000, 3).unwrap();
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        let c = pool.lease().unwrap();
        let mut got = vec![a.uid(), b.uid(), c.uid()];
        got.sort();
        assert_eq!(got, vec![5000, 5001, 5002]);
        let err = pool.lease().unwrap_err();
        assert!(err.to_string().contains("in use"));
        let freed = b.uid();
        drop(b);
        assert_eq!(pool.lease().unwrap().uid(), freed);
    }

    #[test]
    fn a_range_with_uid_0_is_refused() {
        let t = tempfile::tempdir().unwrap();
        assert!(UidPool::new(t.path().to_path_buf(), 0, 10).is_err());
    }
}
