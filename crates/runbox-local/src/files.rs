//! The file tools' side of a local sandbox: list, read and write files from the host.
//!
//! The server may be root, so this is an escape path unless every path stays inside the
//! sandbox. The host holds a directory descriptor for each area the tools may reach (the
//! sandbox's `/workspace` and `/tmp`, each a tmpfs of its own), handed over by the sandbox's
//! init before any sandboxed code ran.
//! Every path resolves beneath one of them with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`: no `..`, absolute symlink, magic link or mount
//! crossing can leave the area, not into the host and not into the sandbox's own `/proc`
//! either (which a root server could otherwise read regardless of the sandbox's
//! protections). Resolution is atomic per call, so a symlink swapped in during a call is
//! either followed within the area or refused. Files the server creates belong to the
//! sandbox's user.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use runbox_core::{Error, FileContent, FileEntry, FileKind, FileWritten, Listing};
use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Uid, fchown, fstat, mkdirat, openat2,
    statat,
};
use rustix::io::Errno;

/// Most bytes one read returns; larger files are read in parts with offset and length.
pub(crate) const MAX_READ: u64 = 8 << 20;
/// Most bytes one write takes.
pub(crate) const MAX_WRITE: usize = 16 << 20;
/// Most entries one listing returns.
pub(crate) const MAX_LIST: usize = 10_000;
/// Most entries a snapshot of /workspace takes (see [`FileAreas::snapshot`]).
const MAX_SNAPSHOT: usize = 5_000;
/// Deepest directory a recursive listing enters.
const MAX_DEPTH: usize = 64;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

struct Area {
    /// Where it is mounted in the sandbox.
    mount: String,
    /// An `O_PATH` descriptor of that directory, held since the sandbox was created.
    fd: OwnedFd,
    /// Whether the tools may only read there.
    read_only: bool,
}

/// The parts of a sandbox the file tools reach.
pub(crate) struct FileAreas {
    areas: Vec<Area>,
    /// The sandbox's uid and gid when the server is root (files it creates are chowned).
    owner: Option<(u32, u32)>,
}

impl std::fmt::Debug for FileAreas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mounts: Vec<&str> = self.areas.iter().map(|a| a.mount.as_str()).collect();
        f.debug_struct("FileAreas")
            .field("areas", &mounts)
            .field("owner", &self.owner)
            .finish()
    }
}

/// The writable mounts the file tools reach; the operator's data, when there is some, is
/// reached read-only at [`DATA_DIR`].
pub(crate) const AREAS: [&str; 2] = ["/workspace", "/tmp"];
/// Where the operator's data directory is mounted, read-only.
pub(crate) const DATA_DIR: &str = "/data";

fn io_error(path: &str, what: &str, e: Errno) -> Error {
    match e {
        Errno::NOENT => Error::FileNotFound {
            path: path.to_owned(),
        },
        Errno::XDEV | Errno::LOOP => Error::InvalidRequest(format!(
            "{path} leads outside the directory it names (through '..', a symbolic link or a \
             mount); refused"
        )),
        Errno::NOTDIR => {
            Error::InvalidRequest(format!("{path}: a part of the path is not a directory"))
        }
        Errno::ISDIR => Error::InvalidRequest(format!("{path} is a directory")),
        // A FIFO with no reader, a socket, a device that is not there.
        Errno::NXIO => Error::InvalidRequest(format!("{path} is not a regular file")),
        Errno::ACCESS | Errno::PERM | Errno::ROFS => {
            Error::InvalidRequest(format!("{path}: permission denied"))
        }
        Errno::NOSPC | Errno::DQUOT => Error::LimitReached(format!(
            "no space left for {path}: the sandbox's disk (its tmpfs size or file count) is full; delete files \
             you no longer need"
        )),
        Errno::FBIG => Error::LimitReached(format!(
            "{path}: the file is larger than the sandbox allows"
        )),
        Errno::NAMETOOLONG => Error::InvalidRequest(format!("{path}: name too long")),
        e => Error::sandbox_caused_by(format!("{what} {path}"), std::io::Error::from(e)),
    }
}

fn kind_of(mode: u32) -> FileKind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn modified(stat: &rustix::fs::Stat) -> SystemTime {
    let secs = u64::try_from(stat.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(stat.st_mtime_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
}

impl FileAreas {
    /// Takes the areas `mounts` (those its spec exported) of a freshly started sandbox.
    pub(crate) fn open(jail: &runbox_jail::Jail, mounts: &[PathBuf]) -> Result<Self, Error> {
        let mut areas = Vec::new();
        for mount in mounts {
            let mount = mount.to_string_lossy().into_owned();
            let fd = jail
                .exported_dir(Path::new(&mount))
                .ok_or_else(|| Error::sandbox(format!("the sandbox did not export {mount}")))?
                .try_clone_to_owned()
                .map_err(|e| {
                    Error::sandbox_caused_by(format!("cannot keep the sandbox's {mount}"), e)
                })?;
            areas.push(Area {
                read_only: mount == DATA_DIR,
                mount,
                fd,
            });
        }
        let owner = match jail.identity() {
            runbox_jail::policy::Identity::HostUid { uid, gid } => Some((*uid, *gid)),
            runbox_jail::policy::Identity::UserNamespace { .. } => None,
        };
        Ok(Self { areas, owner })
    }

    fn outside(&self, path: &str) -> Error {
        let mounts: Vec<&str> = self.areas.iter().map(|a| a.mount.as_str()).collect();
        Error::InvalidRequest(format!(
            "{path} is outside the file tools' reach: they work in {} (a relative path is taken \
             from /workspace); read other files with run_command, e.g. `cat`",
            mounts.join(", ")
        ))
    }

    /// The area a sandbox path is in, and the path relative to it (`.` for the area itself).
    fn locate(&self, path: &str) -> Result<(&Area, String, String), Error> {
        if path.contains('\0') {
            return Err(Error::InvalidRequest(
                "a path must not contain NUL bytes".into(),
            ));
        }
        let absolute = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/workspace/{path}")
        };
        for area in &self.areas {
            if let Ok(rel) = Path::new(&absolute).strip_prefix(&area.mount) {
                let rel = rel.to_string_lossy().into_owned();
                let rel = if rel.is_empty() { ".".to_owned() } else { rel };
                let shown = absolute.trim_end_matches('/').to_owned();
                return Ok((area, rel, if shown.is_empty() { "/".into() } else { shown }));
            }
        }
        Err(self.outside(path))
    }

    fn chown(&self, fd: impl AsFd) -> rustix::io::Result<()> {
        match self.owner {
            Some((uid, gid)) => fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))),
            None => Ok(()),
        }
    }

    /// Lists `path` (a directory, or a single file), recursively with `recursive`.
    pub(crate) fn list(&self, path: &str, recursive: bool) -> Result<Listing, Error> {
        let (area, rel, shown) = self.locate(path)?;
        // Resolve beneath the area first (a symlink at the end is reported, not followed);
        // nothing here may touch a path outside it, not even to stat it.
        let target = openat2(
            &area.fd,
            &rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| io_error(&shown, "open", e))?;
        let stat = fstat(&target).map_err(|e| io_error(&shown, "stat", e))?;
        let mut out = Listing::default();
        if kind_of(stat.st_mode) != FileKind::Directory {
            let name = Path::new(&shown)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.entries.push(FileEntry {
                name,
                path: shown,
                kind: kind_of(stat.st_mode),
                size: stat.st_size as u64,
                modified: modified(&stat),
            });
            return Ok(out);
        }
        let dir = openat2(
            &target,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| io_error(&shown, "open", e))?;
        let walk = Walk {
            recursive,
            prune: false,
            max: MAX_LIST,
        };
        walk.dir(&dir, &shown, 0, &mut out)
            .map_err(|e| io_error(&shown, "list", e))?;
        Ok(out)
    }

    /// Everything under /workspace, to tell which files a run created or changed: like a
    /// recursive listing, but without descending into hidden directories or the trees
    /// package managers fill (`node_modules`, `__pycache__`, `site-packages`), and capped
    /// lower, so that a run in a big workspace stays cheap.
    pub(crate) fn snapshot(&self) -> Result<Listing, Error> {
        let (area, _, shown) = self.locate("/workspace")?;
        let dir = openat2(
            &area.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| io_error(&shown, "open", e))?;
        let mut out = Listing::default();
        let walk = Walk {
            recursive: true,
            prune: true,
            max: MAX_SNAPSHOT,
        };
        walk.dir(&dir, &shown, 0, &mut out)
            .map_err(|e| io_error(&shown, "list", e))?;
        Ok(out)
    }

    /// Reads up to `length` bytes (at most [`MAX_READ`]) of `path` from `offset`.
    pub(crate) fn read(
        &self,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileContent, Error> {
        if let Some(l) = length.filter(|l| *l > MAX_READ) {
            return Err(Error::LimitReached(format!(
                "length {l} exceeds the {MAX_READ}-byte maximum of one read; read in parts with offset and length"
            )));
        }
        let (area, rel, shown) = self.locate(path)?;
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd = openat2(&area.fd, &rel, flags, Mode::empty(), RESOLVE)
            .map_err(|e| io_error(&shown, "open", e))?;
        let stat = fstat(&fd).map_err(|e| io_error(&shown, "stat", e))?;
        match kind_of(stat.st_mode) {
            FileKind::File => {}
            FileKind::Directory => {
                return Err(Error::InvalidRequest(format!(
                    "{shown} is a directory; use list_files"
                )));
            }
            _ => {
                return Err(Error::InvalidRequest(format!(
                    "{shown} is not a regular file"
                )));
            }
        }
        let size = stat.st_size as u64;
        let want = length.unwrap_or(MAX_READ).min(size.saturating_sub(offset));
        let mut data = vec![0u8; usize::try_from(want).unwrap_or(0)];
        let mut got = 0;
        while got < data.len() {
            match rustix::io::pread(&fd, &mut data[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_error(&shown, "read", e)),
            }
        }
        data.truncate(got);
        Ok(FileContent {
            path: shown,
            data,
            offset,
            size,
        })
    }

    /// Opens (creating what is missing, owned by the sandbox's user) the directories
    /// `parts` beneath `area`, one `openat2` at a time.
    fn open_dirs(
        &self,
        area: &Area,
        parts: &[&std::ffi::OsStr],
        shown: &str,
    ) -> Result<OwnedFd, Error> {
        // Directories are opened for reading (not O_PATH): a new one must be chowned.
        let mut dir = openat2(
            &area.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| io_error(shown, "open", e))?;
        for &part in parts {
            let open = |d: &OwnedFd| {
                openat2(
                    d,
                    part,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
            };
            dir = match open(&dir) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_error(shown, "create a directory for", e)),
                    }
                    let fd = open(&dir).map_err(|e| io_error(shown, "open", e))?;
                    self.chown(&fd).map_err(|e| io_error(shown, "chown", e))?;
                    fd
                }
                Err(e) => return Err(io_error(shown, "open", e)),
            };
        }
        Ok(dir)
    }

    /// Creates `path` and its missing parents in a writable area, owned by the sandbox's
    /// user.
    pub(crate) fn create_dir_all(&self, path: &str) -> Result<(), Error> {
        let (area, rel, shown) = self.locate(path)?;
        if area.read_only {
            return Err(Error::InvalidRequest(format!("{shown} is read-only")));
        }
        let parts = names(Path::new(&rel), area, &shown, "create")?;
        self.open_dirs(area, &parts, &shown).map(drop)
    }

    /// Writes (or appends) `data` to `path`, creating missing parent directories.
    pub(crate) fn write(
        &self,
        path: &str,
        data: &[u8],
        append: bool,
    ) -> Result<FileWritten, Error> {
        if data.len() > MAX_WRITE {
            return Err(Error::LimitReached(format!(
                "{} bytes exceed the {MAX_WRITE}-byte maximum of one write; write in parts with append",
                data.len()
            )));
        }
        let (area, rel, shown) = self.locate(path)?;
        if area.read_only {
            return Err(Error::InvalidRequest(format!(
                "{shown}: {} is read-only (the operator's data); write to /workspace instead",
                area.mount
            )));
        }
        let mut parts = names(Path::new(&rel), area, &shown, "write")?;
        let Some(name) = parts.pop() else {
            return Err(Error::InvalidRequest(format!(
                "{shown} is a directory; give a file name"
            )));
        };
        let dir = self.open_dirs(area, &parts, &shown)?;
        let mode = if append {
            OFlags::APPEND
        } else {
            OFlags::TRUNC
        };
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::CLOEXEC
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | mode;
        let fd = openat2(&dir, name, flags, Mode::from_raw_mode(0o644), RESOLVE)
            .map_err(|e| io_error(&shown, "open", e))?;
        if kind_of(fstat(&fd).map_err(|e| io_error(&shown, "stat", e))?.st_mode) != FileKind::File {
            return Err(Error::InvalidRequest(format!(
                "{shown} is not a regular file"
            )));
        }
        self.chown(&fd).map_err(|e| io_error(&shown, "chown", e))?;
        let mut rest = data;
        while !rest.is_empty() {
            match rustix::io::write(&fd, rest) {
                Ok(n) => rest = &rest[n..],
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_error(&shown, "write", e)),
            }
        }
        let size = fstat(&fd).map_err(|e| io_error(&shown, "stat", e))?.st_size as u64;
        Ok(FileWritten { path: shown, size })
    }
}

/// The names along `rel` (a path in `area`) for a call that creates what is missing (`what`
/// it does): a `..` is refused, not dropped, which would create another path than the one
/// named.
fn names<'a>(
    rel: &'a Path,
    area: &Area,
    shown: &str,
    what: &str,
) -> Result<Vec<&'a std::ffi::OsStr>, Error> {
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            _ => {
                return Err(Error::InvalidRequest(format!(
                    "{shown}: '..' is not allowed in a path to {what}; give the path from {}",
                    area.mount
                )));
            }
        }
    }
    Ok(parts)
}

#[cfg(any(test, feature = "fuzzing"))]
impl FileAreas {
    /// Areas over plain host directories (`(mount, dir, read_only)`), with no sandbox: for
    /// tests and the fuzz targets.
    pub(crate) fn from_dirs(dirs: &[(&str, &Path, bool)]) -> Result<Self, Error> {
        let mut areas = Vec::new();
        for &(mount, dir, read_only) in dirs {
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let fd = rustix::fs::open(dir, flags, Mode::empty()).map_err(|e| {
                Error::sandbox_caused_by(format!("cannot open {}", dir.display()), e)
            })?;
            areas.push(Area {
                mount: mount.to_owned(),
                fd,
                read_only,
            });
        }
        Ok(Self { areas, owner: None })
    }
}

/// Directories a snapshot does not enter: where package managers and tools keep their
/// trees, which are large and rarely what a run is meant to produce.
const PRUNED: [&[u8]; 4] = [b"node_modules", b"__pycache__", b"site-packages", b"venv"];

/// How a directory is listed.
struct Walk {
    recursive: bool,
    /// Skip hidden directories and [`PRUNED`] ones.
    prune: bool,
    /// Most entries.
    max: usize,
}

impl Walk {
    /// Lists `dir` into `out`, depth first, names in order, never following symbolic links.
    fn dir(
        &self,
        dir: &OwnedFd,
        shown: &str,
        depth: usize,
        out: &mut Listing,
    ) -> rustix::io::Result<()> {
        let mut names: Vec<std::ffi::CString> = Vec::new();
        for entry in Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name.to_owned());
            }
        }
        names.sort();
        for name in names {
            if out.entries.len() >= self.max {
                out.truncated = true;
                return Ok(());
            }
            let Ok(stat) = statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let display = name.to_string_lossy().into_owned();
            let path = if shown == "/" {
                format!("/{display}")
            } else {
                format!("{shown}/{display}")
            };
            let kind = kind_of(stat.st_mode);
            out.entries.push(FileEntry {
                name: display,
                path: path.clone(),
                kind,
                size: stat.st_size as u64,
                modified: modified(&stat),
            });
            let bytes = name.to_bytes();
            let pruned = self.prune && (bytes.starts_with(b".") || PRUNED.contains(&bytes));
            if self.recursive && kind == FileKind::Directory && depth < MAX_DEPTH && !pruned {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                if let Ok(sub) = openat2(dir, name.as_c_str(), flags, Mode::empty(), RESOLVE) {
                    self.dir(&sub, &path, depth + 1, out)?;
                }
            }
        }
        Ok(())
    }
}

/// The file tools over plain host directories, for the fuzz targets in `fuzz/`; not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    use runbox_core::{Error, FileContent, FileWritten, Listing};

    /// A sandbox's file areas, each a host directory.
    #[derive(Debug)]
    pub struct FileAreas(super::FileAreas);

    impl FileAreas {
        /// Areas `(mount, host directory, read_only)`, e.g. `("/workspace", dir, false)`.
        pub fn for_fuzzing(areas: &[(&str, &Path, bool)]) -> Result<Self, Error> {
            super::FileAreas::from_dirs(areas).map(Self)
        }

        /// As `list_files`.
        pub fn list(&self, path: &str, recursive: bool) -> Result<Listing, Error> {
            self.0.list(path, recursive)
        }

        /// As `read_file`.
        pub fn read(
            &self,
            path: &str,
            offset: u64,
            length: Option<u64>,
        ) -> Result<FileContent, Error> {
            self.0.read(path, offset, length)
        }

        /// As `write_file`.
        pub fn write(&self, path: &str, data: &[u8], append: bool) -> Result<FileWritten, Error> {
            self.0.write(path, data, append)
        }

        /// Creates a directory and its parents.
        pub fn create_dir_all(&self, path: &str) -> Result<(), Error> {
            self.0.create_dir_all(path)
        }

        /// What a run's changes are found from.
        pub fn snapshot(&self) -> Result<Listing, Error> {
            self.0.snapshot()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A sandbox's areas as host directories beside an `outside` one with a secret in it.
    struct Tree(PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(name: &str) -> (Tree, FileAreas) {
        let root =
            std::env::temp_dir().join(format!("runbox-files-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["workspace/sub", "tmp", "data", "outside"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("outside/secret"), "secret").unwrap();
        std::fs::write(root.join("data/d.csv"), "a,b\n").unwrap();
        let ws = root.join("workspace");
        symlink(root.join("outside/secret"), ws.join("abs")).unwrap();
        symlink("../../outside", ws.join("up")).unwrap();
        symlink("../data", ws.join("data")).unwrap();
        symlink("sub", ws.join("inside")).unwrap();
        symlink("loop", ws.join("loop")).unwrap();
        symlink("/proc/self/root", ws.join("proc")).unwrap();
        let areas = FileAreas::from_dirs(&[
            ("/workspace", &ws, false),
            ("/tmp", &root.join("tmp"), false),
            (DATA_DIR, &root.join("data"), true),
        ])
        .unwrap();
        (Tree(root), areas)
    }

    #[test]
    fn no_path_reaches_outside_the_areas() {
        let (tree, files) = tree("escape");
        for path in [
            "abs",
            "/workspace/abs",
            "up/secret",
            "up/../up/secret",
            "/workspace/../outside/secret",
            "/tmp/../workspace/abs",
            "/tmp/../../outside/secret",
            "data/d.csv",
            "proc/etc/hostname",
            "loop",
            "/etc/hostname",
            "/",
            "/workspacex/a",
            "a\0b",
        ] {
            assert!(files.read(path, 0, None).is_err(), "read {path}");
            assert!(files.write(path, b"x", false).is_err(), "write {path}");
            assert!(
                files.write(&format!("{path}/new"), b"x", false).is_err(),
                "write {path}/new"
            );
            assert!(
                files.create_dir_all(&format!("{path}/new")).is_err(),
                "mkdir {path}/new"
            );
        }
        assert!(files.list("up/", true).unwrap().entries[0].kind == FileKind::Symlink);
        assert!(files.list("/workspace/up/.", true).unwrap().entries.len() == 1);
        assert!(files.list("/workspace/up/../up", true).is_err());
        let outside = std::fs::read_dir(tree.0.join("outside")).unwrap().count();
        assert_eq!(outside, 1, "nothing was created outside");
        assert_eq!(
            std::fs::read(tree.0.join("outside/secret")).unwrap(),
            b"secret"
        );
    }

    #[test]
    fn a_dotdot_in_a_directory_to_make_is_refused_not_dropped() {
        // It used to be dropped: `/tmp/../workspace/x` made /tmp/workspace/x, and `..` "made"
        // the area's parent (found by fuzz/ path_resolution).
        let (tree, files) = tree("dotdot");
        for path in [
            "..",
            "/workspace/..",
            "new/../deep",
            "/tmp/../workspace/x",
            "/workspace/sub/../../outside",
        ] {
            let e = files.create_dir_all(path).unwrap_err();
            assert!(matches!(e, Error::InvalidRequest(_)), "{path}: {e}");
        }
        assert!(!tree.0.join("workspace/new").exists());
        assert!(!tree.0.join("tmp/workspace").exists());
        files.create_dir_all("./new/./deep/").unwrap();
        assert!(tree.0.join("workspace/new/deep").is_dir());
    }

    #[test]
    fn a_fifo_is_refused_as_not_a_regular_file() {
        // Opening it to write (with no reader) failed as a sandbox failure (ENXIO).
        let (tree, files) = tree("fifo");
        let fifo = tree.0.join("workspace/fifo");
        let mode = Mode::from_raw_mode(0o644);
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, mode, 0).unwrap();
        let wrote = files.write("fifo", b"x", false);
        assert!(matches!(wrote, Err(Error::InvalidRequest(_))), "{wrote:?}");
        let read = files.read("fifo", 0, None);
        assert!(matches!(read, Err(Error::InvalidRequest(_))), "{read:?}");
    }

    #[test]
    fn data_is_read_only_and_the_rest_works_through_inner_links() {
        let (tree, files) = tree("inner");
        assert_eq!(files.read("/data/d.csv", 0, None).unwrap().data, b"a,b\n");
        assert!(files.write("/data/d.csv", b"x", false).is_err());
        assert!(files.write("/data/new/x", b"x", false).is_err());
        assert!(files.create_dir_all("/data/new").is_err());
        assert_eq!(std::fs::read(tree.0.join("data/d.csv")).unwrap(), b"a,b\n");
        let written = files.write("inside/deep/f.txt", b"hi", false).unwrap();
        assert_eq!(written.path, "/workspace/inside/deep/f.txt");
        assert_eq!(
            std::fs::read(tree.0.join("workspace/sub/deep/f.txt")).unwrap(),
            b"hi"
        );
        assert_eq!(
            files
                .read("/workspace/sub/deep/f.txt", 1, None)
                .unwrap()
                .data,
            b"i"
        );
        files.create_dir_all("/tmp/a/b").unwrap();
        assert!(tree.0.join("tmp/a/b").is_dir());
    }
}
