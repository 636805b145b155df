//! Host uids for sandboxes when the server runs as root.
//!
//! Each live sandbox gets its own unprivileged uid (and gid of the same number) from a range
//! far above ordinary users. A distinct uid per sandbox means one sandbox's processes can
//! never signal or read another's, and `RLIMIT_NPROC` counts per sandbox. Leases are
//! `flock`s on files in the state directory, so several runbox servers on one host never
//! hand out the same uid, and a crashed server's leases vanish with it.
//!
//! A lease's file exists only while some sandbox holds it: the holder deletes it, still
//! locked, when it lets go, and a server starting up deletes the files crashed servers left
//! (those it can lock). Whoever locks a file checks that it is still the one at its path
//! (not one deleted in between), so a deleted file's lock never counts as a lease.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

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

/// A uid held for the life of one sandbox; released (and its file deleted) on drop.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    path: PathBuf,
    _lock: Flock<File>,
}

impl Drop for UidLease {
    fn drop(&mut self) {
        // Deleted while still locked (the lock goes after this, with the field): whoever
        // opened the file meanwhile finds it is no longer at its path once it has the lock.
        let _ = fs::remove_file(&self.path);
    }
}

/// Locks the lease file at `path` if it is free, checking that the file locked is the one
/// at the path now; `Ok(None)` when another holds it or it was deleted meanwhile.
fn try_lock(path: &Path, create: bool) -> io::Result<Option<Flock<File>>> {
    let file = match OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) if crate::recovery::is_at(&lock, path) => Ok(Some(lock)),
        Ok(_) | Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
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

    /// Deletes the lease files no one holds (left by servers that died); returns how many.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_str().and_then(|n| n.parse::<u32>().ok()).is_none() {
                continue;
            }
            let path = e.path();
            if let Ok(Some(_lock)) = try_lock(&path, false)
                && fs::remove_file(&path).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    /// Leases a free uid.
    pub fn lease(&self) -> io::Result<UidLease> {
        let mut r = [0u8; 4];
        getrandom::fill(&mut r).map_err(|e| io::Error::other(e.to_string()))?;
        let start = u32::from_ne_bytes(r) % self.count;
        for i in 0..self.count {
            let uid = self.base + (start + i) % self.count;
            let path = self.dir.join(uid.to_string());
            // A file deleted by its last holder between our open and our lock is not a
            // lease; one more try makes a fresh one.
            for _ in 0..2 {
                if let Some(lock) = try_lock(&path, true)? {
                    return Ok(UidLease {
                        uid,
                        path,
                        _lock: lock,
                    });
                }
                if !path.exists() {
                    continue;
                }
                break;
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
    fn a_lease_file_lives_only_while_held_and_a_sweep_takes_the_unheld() {
        let t = tempfile::tempdir().unwrap();
        let pool = UidPool::new(t.path().to_path_buf(), 7000, 4).unwrap();
        let a = pool.lease().unwrap();
        let held = t.path().join(a.uid().to_string());
        assert!(held.exists());
        // Left by a server that died: no one holds them.
        fs::write(t.path().join("7001"), "").unwrap();
        fs::write(t.path().join("7002"), "").unwrap();
        fs::write(t.path().join("notes"), "").unwrap();
        let removed = pool.sweep();
        assert_eq!(
            removed,
            usize::from(a.uid() != 7001) + usize::from(a.uid() != 7002)
        );
        assert!(held.exists(), "a held lease was swept");
        assert!(t.path().join("notes").exists());
        drop(a);
        assert!(!held.exists(), "a released lease left its file");
        // The pool works as before.
        let b = pool.lease().unwrap();
        assert!(t.path().join(b.uid().to_string()).exists());
    }

    #[test]
    fn a_range_with_uid_0_is_refused() {
        let t = tempfile::tempdir().unwrap();
        assert!(UidPool::new(t.path().to_path_buf(), 0, 10).is_err());
    }
}
