//! The state directory (uid leases, the root mount point, the records of live servers):
//! made, or taken over, only when no other user can have a hand in it.
//!
//! As an ordinary user without `XDG_RUNTIME_DIR`, the default is `/tmp/runbox-<uid>`, a name
//! anyone can guess and create first in the shared `/tmp`: as a directory of their own (to
//! plant files runbox would trust, or watch it work) or as a symbolic link to somewhere of
//! theirs. So the directory's last component must be a real directory (never a link) owned
//! by the server's own user; group and other permissions are then taken away. Anything else
//! is refused with what to do, never worked around.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, fchmod, fstat};

use crate::error::JailError;

/// Creates `path` (mode 0700, parents as needed) or checks the one there, then makes sure
/// only its owner, this process's user, can use it.
pub(crate) fn prepare(path: &Path) -> Result<(), JailError> {
    let io_err = |source: io::Error| JailError::StateDir {
        path: path.to_owned(),
        source,
    };
    let refused = |problem: String| JailError::StateDirRefused {
        path: path.to_owned(),
        problem,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io_err)?;
    }
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(e)),
    }
    // The very directory checked is the one then used: opened without following a link.
    let dir = match open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(refused("is a symbolic link".into())),
        Err(Errno::ENOTDIR) if path.is_symlink() => {
            return Err(refused("is a symbolic link".into()));
        }
        Err(Errno::ENOTDIR) => return Err(refused("is not a directory".into())),
        Err(e) => return Err(io_err(e.into())),
    };
    let st = fstat(&dir).map_err(|e| io_err(e.into()))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me {
        return Err(refused(format!(
            "belongs to uid {}, not to this server's user (uid {me})",
            st.st_uid
        )));
    }
    if st.st_mode & 0o077 != 0 {
        fchmod(&dir, Mode::from_bits_truncate(0o700)).map_err(|e| io_err(e.into()))?;
        tracing::info!(
            path = %path.display(),
            "the state directory was open to other users; it is now 0700"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_directory_is_private_and_an_open_one_of_ours_is_closed() {
        let t = tempfile::tempdir().unwrap();
        let new = t.path().join("a/b/state");
        prepare(&new).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&new), 0o700);
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        prepare(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
    }

    #[test]
    fn a_link_or_a_file_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = prepare(&link).unwrap_err().to_string();
        assert!(
            e.contains("symbolic link") && e.contains("--state-dir"),
            "{e}"
        );
        let file = t.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = prepare(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
