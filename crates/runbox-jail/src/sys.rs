//! Every `unsafe` block in runbox.
//!
//! Each function here wraps one operation that Rust cannot check: adopting a descriptor the
//! kernel handed over, forking, running code between `fork` and `execve`, and the few
//! syscalls and ioctls that `nix` does not wrap. Each block says why it is sound. Everything
//! else in runbox, the jail included, is safe code built on these and on `nix`.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::raw::c_char;

/// Takes ownership of a descriptor received through `SCM_RIGHTS`.
pub(crate) fn owned_fd_from_scm_rights(raw: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `raw` in our table while delivering the message; nothing
    // else in the process knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Takes ownership of a descriptor inherited at a known number (the init's control socket,
/// fd 3, placed there by the host before `execve`).
///
/// Returns `None` when nothing is open at that number.
pub(crate) fn adopt_inherited_fd(raw: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    let open = unsafe { libc::fcntl(raw, libc::F_GETFD) } >= 0;
    if !open {
        return None;
    }
    // SAFETY: called once at start-up of the init, before any other code could have opened
    // or taken this number; the host placed the socket here for us alone.
    Some(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `fork(2)`.
pub(crate) fn fork() -> nix::Result<nix::unistd::ForkResult> {
    // SAFETY: only called from the sandbox's stage-one process and its init, which are
    // single-threaded (no runtime, no thread was ever started), so the child cannot inherit
    // a lock held by another thread; the child either runs only async-signal-safe code up to
    // `execve` (`exec_child`) or continues as the single-threaded init.
    unsafe { nix::unistd::fork() }
}

/// Closes every descriptor numbered `first` and above.
pub(crate) fn close_fds_from(first: RawFd) {
    // SAFETY: close_range(2) takes plain integers and only closes descriptors; callers own
    // every descriptor above `first` (the process is single-threaded and about to exec or
    // has just started).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    if rc != 0 {
        // Kernels before 5.9: close one by one.
        for fd in first..4096 {
            // SAFETY: as above; closing a number that is not open returns EBADF, harmless.
            unsafe { libc::close(fd) };
        }
    }
}

/// `mount_setattr(2)` attribute bits.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets mount attributes on the mount at `path` and, with `recursive`, on every mount below
/// it. Attributes are only ever added, so locked flags inherited from the host are kept.
pub(crate) fn mount_setattr(path: &CStr, set: u64, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } as libc::c_uint;
    // SAFETY: `path` is a valid NUL-terminated string and `attr` a properly sized, initialised
    // struct that lives across the call; the kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Brings the loopback interface of the current network namespace up.
pub(crate) fn loopback_up() -> io::Result<()> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    use std::os::fd::AsRawFd;
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `ifr` into `ifr`, which
    // is a valid, writable ifreq for the duration of the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member of the union.
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    ifr.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads `ifr`, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `ctrl` the child's fd 3 and detaches the child from the host's session (no
/// controlling terminal), between `fork` and `execve` of the stage-one process.
pub(crate) fn stage1_pre_exec(cmd: &mut tokio::process::Command, ctrl: RawFd) {
    // SAFETY: the closure runs in the forked child before execve and calls only
    // async-signal-safe functions (fcntl, dup2, setsid); it allocates nothing and touches no
    // lock. `ctrl` stays open in the parent until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if ctrl == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(ctrl, 3) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Everything `exec_child` needs, prepared before `fork` so the child allocates nothing.
#[derive(Debug)]
pub(crate) struct ExecPlan {
    path: CString,
    // Kept alive for the pointers in `argv_ptrs` and `envp_ptrs`.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    envp_ptrs: Vec<*const c_char>,
    cwd: CString,
    fds: Vec<RawFd>,
}

/// Which step of `exec_child` failed, reported through the error pipe.
pub(crate) const EXEC_STEP_SETSID: u32 = 1;
pub(crate) const EXEC_STEP_FDS: u32 = 2;
pub(crate) const EXEC_STEP_CHDIR: u32 = 3;
pub(crate) const EXEC_STEP_EXECVE: u32 = 4;

impl ExecPlan {
    /// Prepares a plan; fails when an argument holds a NUL byte.
    pub(crate) fn new(
        argv: &[String],
        env: &[String],
        cwd: &str,
        fds: Vec<RawFd>,
    ) -> Result<Self, std::ffi::NulError> {
        let argv_c: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envp_c: Vec<CString> = env
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let path = argv_c.first().cloned().unwrap_or_default();
        let mut argv_ptrs: Vec<*const c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<*const c_char> = envp_c.iter().map(|c| c.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        Ok(Self {
            path,
            _argv: argv_c,
            _envp: envp_c,
            argv_ptrs,
            envp_ptrs,
            cwd: CString::new(cwd.as_bytes())?,
            fds,
        })
    }
}

/// In a freshly forked child of the init: resets signals, starts a new session, installs
/// the plan's descriptors as fds 0, 1, 2, ..., closes every other descriptor, changes
/// directory and executes the program. On failure writes `(step, errno)` to `err_pipe`
/// and exits with status 127. Never returns.
pub(crate) fn exec_child(plan: &ExecPlan, err_pipe: RawFd) -> ! {
    // Every call below is async-signal-safe and the plan was prepared before fork: nothing
    // here allocates.
    fn fail(err_pipe: RawFd, step: u32) -> ! {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0) as u32;
        let mut buf = [0u8; 8];
        buf[..4].copy_from_slice(&step.to_ne_bytes());
        buf[4..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: writes 8 bytes from a live stack buffer; _exit ends the process without
        // running destructors or atexit handlers (which would be unsafe after fork).
        unsafe {
            libc::write(err_pipe, buf.as_ptr().cast(), buf.len());
            libc::_exit(127)
        }
    }

    // SAFETY: signal-mask and disposition calls on our own process with valid arguments. The
    // init blocks SIGCHLD for its signalfd and Rust's runtime ignores SIGPIPE; both settings
    // would otherwise be inherited through execve.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..libc::SIGRTMIN() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
    // SAFETY: setsid has no arguments; it fails only if we already lead a group, which a
    // fresh child never does.
    if unsafe { libc::setsid() } < 0 {
        fail(err_pipe, EXEC_STEP_SETSID);
    }
    // Move the error pipe and every source descriptor above the range we are about to fill,
    // so no dup2 below can clobber a source that is still needed.
    const HIGH: RawFd = crate::proto::MAX_FDS as RawFd;
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor we hold to the lowest free number at or
    // above HIGH; the array is on the stack.
    let err_pipe = unsafe { libc::fcntl(err_pipe, libc::F_DUPFD_CLOEXEC, HIGH) };
    if err_pipe < 0 {
        // SAFETY: as in `fail`.
        unsafe { libc::_exit(127) };
    }
    let mut high = [0 as RawFd; crate::proto::MAX_FDS];
    let n = plan.fds.len().min(high.len());
    for (slot, &source) in high.iter_mut().zip(&plan.fds[..n]) {
        // SAFETY: as above.
        let fd = unsafe { libc::fcntl(source, libc::F_DUPFD_CLOEXEC, HIGH) };
        if fd < 0 {
            fail(err_pipe, EXEC_STEP_FDS);
        }
        *slot = fd;
    }
    for (target, &fd) in high[..n].iter().enumerate() {
        // SAFETY: dup2 onto a small number we are about to own; it clears close-on-exec on
        // the target.
        if unsafe { libc::dup2(fd, target as RawFd) } < 0 {
            fail(err_pipe, EXEC_STEP_FDS);
        }
    }
    // Close everything else except the error pipe, which closes itself on exec.
    // SAFETY: close_range on numbers we own; the process is about to exec.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            n as libc::c_uint,
            (err_pipe - 1) as libc::c_uint,
            0,
        );
        libc::syscall(
            libc::SYS_close_range,
            (err_pipe + 1) as libc::c_uint,
            libc::c_uint::MAX,
            0,
        );
    }
    // SAFETY: cwd is a valid C string kept alive by `plan`.
    if unsafe { libc::chdir(plan.cwd.as_ptr()) } < 0 {
        fail(err_pipe, EXEC_STEP_CHDIR);
    }
    // SAFETY: path, argv and envp are NUL-terminated strings and NULL-terminated pointer
    // arrays kept alive by `plan`.
    unsafe {
        libc::execve(
            plan.path.as_ptr(),
            plan.argv_ptrs.as_ptr(),
            plan.envp_ptrs.as_ptr(),
        )
    };
    fail(err_pipe, EXEC_STEP_EXECVE)
}

/// `_exit(2)`: ends the process at once, without running destructors.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and never returns.
    unsafe { libc::_exit(code) }
}

/// The Landlock ABI version the running kernel offers, or 0 when Landlock is missing or
/// disabled.
pub(crate) fn landlock_abi_version() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer, zero size and the VERSION flag, the syscall only
    // returns the ABI version (or an error); it reads and writes no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// Empties the capability bounding set (every capability number the kernel knows).
pub(crate) fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes plain integers; EINVAL marks the first number past
        // the kernel's last capability.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Whether any capability is left in the bounding set.
pub(crate) fn bounding_set_empty() -> bool {
    (0..64).all(|cap| {
        // SAFETY: PR_CAPBSET_READ takes plain integers and returns 1, 0 or -1 (EINVAL).
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
        rc != 1
    })
}

/// Registers a descriptor with tokio's reactor.
pub(crate) fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor, owned by the `AsyncFd` from here on and
    // closed only when it is dropped; its `as_raw_fd` always returns the same number.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}
