//! Builds the sandbox's filesystem and switches to it.
//!
//! Runs in the init, inside the sandbox's fresh mount namespace, while it still holds its
//! capabilities there. The result:
//!
//! ```text
//! /                 tmpfs, read-only once built
//! /usr, /lib*, ...  read-only, nosuid, nodev binds of the host runtime (from the policy)
//! /etc              generated files plus a few read-only host files (from the policy)
//! /dev              null zero full random urandom tty, pts (new instance), shm; read-only
//! /proc             a new proc for the sandbox's PID namespace, sensitive files masked
//! /workspace, /tmp  size- and inode-capped tmpfs, writable (a bind whose target lies
//!                   under one, such as an interpreter kept under the host's /tmp, is
//!                   mounted on top of it, after it)
//! ```
//!
//! Then `pivot_root` into it and detach the old root, so no path leads back to the host.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::SetupError;
use crate::policy::{JailPolicy, Tmpfs};
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

const NONE: Option<&str> = None;

/// Device nodes bound from the host, each harmless (no disk, no memory, no kernel console).
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Files under `/proc` hidden behind `/dev/null` (kernel memory, keys, timers, the host's
/// boot command line, ...).
const PROC_MASKED_FILES: [&str; 6] = [
    "cmdline",
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
];

/// Directories under `/proc` replaced by an empty read-only tmpfs.
const PROC_MASKED_DIRS: [&str; 3] = ["acpi", "scsi", "asound"];

/// Parts of `/proc` that stay visible but read-only (kernel tunables, the sysrq trigger).
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "bus", "fs", "irq"];

/// Builds the root described by `policy` and pivots into it.
pub(crate) fn build(policy: &JailPolicy) -> Result<(), SetupError> {
    let root = policy.root_mountpoint.as_path();
    let at = |p: &Path| -> PathBuf { root.join(p.strip_prefix("/").unwrap_or(p)) };

    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
        .map_err(SetupError::at("make every mount private"))?;
    mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=16m,nr_inodes=16384,mode=0755"),
    )
    .map_err(SetupError::at(format!(
        "mount the root tmpfs on {}",
        root.display()
    )))?;

    // Binds under /workspace or /tmp would be hidden by those tmpfs: they come after them.
    let on_tmpfs = |target: &Path| {
        target.starts_with(JailPolicy::WORKSPACE) || target.starts_with(JailPolicy::TMP)
    };
    for bind in policy.spec.binds.iter().filter(|b| !on_tmpfs(&b.target)) {
        bind_read_only(&bind.source, &at(&bind.target))?;
    }
    for (path, target) in &policy.spec.symlinks {
        let link = at(path);
        make_parent(&link)?;
        symlink(target, &link).map_err(SetupError::at(format!("symlink {}", path.display())))?;
    }
    build_dev(&at(Path::new("/dev")), policy.spec.tmp)?;
    build_proc(&at(Path::new("/proc")), &at(Path::new("/dev/null")))?;

    let (uid, gid) = (policy.identity.uid(), policy.identity.gid());
    mount_tmpfs(
        &at(Path::new(JailPolicy::WORKSPACE)),
        policy.spec.workspace,
        &format!("mode=0755,uid={uid},gid={gid}"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    mount_tmpfs(
        &at(Path::new(JailPolicy::TMP)),
        policy.spec.tmp,
        "mode=1777",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;
    for bind in policy.spec.binds.iter().filter(|b| on_tmpfs(&b.target)) {
        bind_read_only(&bind.source, &at(&bind.target))?;
    }

    for file in &policy.spec.files {
        let path = at(&file.path);
        make_parent(&path)?;
        fs::write(&path, &file.contents)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(file.mode)))
            .map_err(SetupError::at(format!("write {}", file.path.display())))?;
    }

    pivot(root)?;
    set_attr(
        Path::new("/"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
    )
    .map_err(|e| e.context("make the root read-only"))?;
    Ok(())
}

fn make_parent(path: &Path) -> Result<(), SetupError> {
    match path.parent() {
        Some(parent) => fs::create_dir_all(parent)
            .map_err(SetupError::at(format!("create {}", parent.display()))),
        None => Ok(()),
    }
}

/// Creates an empty mount point of the same kind as `source` at `target`.
fn make_mount_point(source: &Path, target: &Path) -> Result<(), SetupError> {
    let is_dir = fs::metadata(source)
        .map_err(SetupError::at(format!("stat {}", source.display())))?
        .is_dir();
    if is_dir {
        fs::create_dir_all(target).map_err(SetupError::at(format!("create {}", target.display())))
    } else {
        make_parent(target)?;
        fs::File::create(target)
            .map(drop)
            .map_err(SetupError::at(format!("create {}", target.display())))
    }
}

fn cstring(path: &Path) -> Result<CString, SetupError> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| SetupError::new(format!("path {}", path.display()), e))
}

/// Adds mount attributes, recursively or not. Uses `mount_setattr` (Linux 5.12+), falling
/// back to a bind remount that carries over the flags the mount already has: inside a user
/// namespace, flags inherited from the host are locked and a remount that drops them fails.
fn set_attr(path: &Path, attrs: u64, recursive: bool) -> Result<(), SetupError> {
    let c = cstring(path)?;
    match sys::mount_setattr(&c, attrs, recursive) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => remount_with(path, attrs),
        Err(e) => Err(SetupError::new(
            format!("set attributes of {}", path.display()),
            e,
        )),
    }
}

fn remount_with(path: &Path, attrs: u64) -> Result<(), SetupError> {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let current = statvfs(path).map_err(SetupError::at(format!("statvfs {}", path.display())))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    let have = current.flags();
    for (fs_flag, ms_flag) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if have.contains(fs_flag) {
            flags |= ms_flag;
        }
    }
    for (attr, ms_flag) in [
        (MOUNT_ATTR_RDONLY, MsFlags::MS_RDONLY),
        (MOUNT_ATTR_NOSUID, MsFlags::MS_NOSUID),
        (MOUNT_ATTR_NODEV, MsFlags::MS_NODEV),
        (MOUNT_ATTR_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if attrs & attr != 0 {
            flags |= ms_flag;
        }
    }
    mount(NONE, path, NONE, flags, NONE)
        .map_err(SetupError::at(format!("remount {}", path.display())))
}

/// Binds `source` at `target`, read-only, nosuid and nodev, submounts included.
fn bind_read_only(source: &Path, target: &Path) -> Result<(), SetupError> {
    make_mount_point(source, target)?;
    mount(
        Some(source),
        target,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        NONE,
    )
    .map_err(SetupError::at(format!("bind {}", source.display())))?;
    set_attr(
        target,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        true,
    )
}

fn mount_tmpfs(target: &Path, spec: Tmpfs, extra: &str, flags: MsFlags) -> Result<(), SetupError> {
    fs::create_dir_all(target).map_err(SetupError::at(format!("create {}", target.display())))?;
    let data = format!(
        "size={},nr_inodes={},{extra}",
        spec.size_bytes.max(4096),
        spec.inodes.max(16)
    );
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(SetupError::at(format!(
        "mount tmpfs on {}",
        target.display()
    )))
}

fn build_dev(dev: &Path, shm: Tmpfs) -> Result<(), SetupError> {
    mount_tmpfs(
        dev,
        Tmpfs {
            size_bytes: 64 * 1024,
            inodes: 256,
        },
        "mode=0755",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
    )?;
    for name in DEVICES {
        let source = Path::new("/dev").join(name);
        let target = dev.join(name);
        fs::File::create(&target).map_err(SetupError::at(format!("create /dev/{name}")))?;
        mount(Some(&source), &target, NONE, MsFlags::MS_BIND, NONE)
            .map_err(SetupError::at(format!("bind /dev/{name}")))?;
        set_attr(&target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, false)?;
    }
    let pts = dev.join("pts");
    fs::create_dir_all(&pts).map_err(SetupError::at("create /dev/pts"))?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(SetupError::at("mount /dev/pts"))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(link)).map_err(SetupError::at(format!("symlink /dev/{link}")))?;
    }
    mount_tmpfs(
        &dev.join("shm"),
        shm,
        "mode=1777",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
    )?;
    set_attr(dev, MOUNT_ATTR_RDONLY, false).map_err(|e| e.context("make /dev read-only"))
}

fn build_proc(proc: &Path, dev_null: &Path) -> Result<(), SetupError> {
    fs::create_dir_all(proc).map_err(SetupError::at("create /proc"))?;
    mount(
        Some("proc"),
        proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(SetupError::at("mount /proc"))?;
    for name in PROC_READ_ONLY {
        let p = proc.join(name);
        if p.exists() {
            mount(Some(&p), &p, NONE, MsFlags::MS_BIND | MsFlags::MS_REC, NONE)
                .map_err(SetupError::at(format!("bind /proc/{name}")))?;
            set_attr(
                &p,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                true,
            )?;
        }
    }
    for name in PROC_MASKED_FILES {
        let p = proc.join(name);
        if p.exists() {
            mount(Some(dev_null), &p, NONE, MsFlags::MS_BIND, NONE)
                .map_err(SetupError::at(format!("mask /proc/{name}")))?;
        }
    }
    for name in PROC_MASKED_DIRS {
        let p = proc.join(name);
        if p.is_dir() {
            mount(
                Some("tmpfs"),
                &p,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=0"),
            )
            .map_err(SetupError::at(format!("mask /proc/{name}")))?;
        }
    }
    Ok(())
}

/// Makes `new_root` the root and detaches the old one (`pivot_root(".", ".")`).
fn pivot(new_root: &Path) -> Result<(), SetupError> {
    nix::unistd::chdir(new_root).map_err(SetupError::at("enter the new root"))?;
    nix::unistd::pivot_root(".", ".").map_err(SetupError::at("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(SetupError::at("detach the old root"))?;
    nix::unistd::chdir("/").map_err(SetupError::at("chdir /"))
}
