//! The sandbox side: what runs after the host starts `runbox __sandbox-init`.
//!
//! Two processes, both single-threaded:
//!
//! 1. **stage one** reads the policy from the control socket (fd 3), creates the namespaces
//!    (`unshare`; with a user namespace it writes its own one-line uid and gid maps, so no
//!    pid-reuse race exists), and forks. It stays outside the new PID namespace as a thin
//!    waiter that exits with the init's status, so the host has a child to wait for.
//! 2. **the init**, PID 1 of the new PID namespace: builds the filesystem and pivots into it
//!    ([`mounts`]), names the host, brings up loopback, drops to the sandbox's identity with
//!    nothing left ([`lockdown`]), reports [`FromInit::Ready`] and then only starts processes
//!    on request and reaps every child ([`supervisor`]). When the host closes the control
//!    socket, or stage one dies, the init exits and the kernel kills every process left in
//!    the namespace.

mod landlock;
mod lockdown;
mod mounts;
pub(crate) mod seccomp;
mod supervisor;

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::Signal;
use nix::sys::socket::MsgFlags;
use nix::sys::stat::{Mode, umask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::ForkResult;

use crate::policy::{Identity, JailPolicy};
use crate::proto::{self, FromInit, ToInit};
use crate::report::LayerReport;
use crate::sys;

/// The argument that makes the runbox binary act as a sandbox's init.
pub const INIT_ARG: &str = "__sandbox-init";

/// Exit status of stage one or the init when the sandbox could not be built.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// A failed setup step, reported to the host as [`FromInit::SetupFailed`].
#[derive(Debug)]
pub(crate) struct SetupError {
    step: String,
    error: String,
}

impl SetupError {
    pub(crate) fn new(step: impl Into<String>, error: impl fmt::Display) -> Self {
        Self {
            step: step.into(),
            error: error.to_string(),
        }
    }

    /// For `map_err`: the step's name now, the error later.
    pub(crate) fn at<E: fmt::Display>(step: impl Into<String>) -> impl FnOnce(E) -> SetupError {
        let step = step.into();
        move |e| SetupError {
            step,
            error: e.to_string(),
        }
    }

    pub(crate) fn context(self, outer: &str) -> Self {
        Self {
            step: format!("{outer}: {}", self.step),
            error: self.error,
        }
    }
}

/// Entry point of `runbox __sandbox-init`. Must run before anything starts a thread (no
/// async runtime): `unshare(CLONE_NEWUSER)` refuses multi-threaded callers.
pub fn main() -> ! {
    sys::exit_now(stage_one())
}

fn send_failure(ctrl: &OwnedFd, e: &SetupError) {
    let msg = FromInit::SetupFailed {
        step: e.step.clone(),
        error: e.error.clone(),
    };
    // If the host is gone there is nobody to tell.
    let _ = proto::send(ctrl.as_fd(), &msg, &[], MsgFlags::empty());
}

fn stage_one() -> i32 {
    umask(Mode::from_bits_truncate(0o022));
    let Some(ctrl) = sys::adopt_inherited_fd(3) else {
        eprintln!("runbox: {INIT_ARG} is started by runbox itself; use `runbox run` instead");
        return EXIT_SETUP_FAILED;
    };
    sys::close_fds_from(4);
    let mut buf = Vec::new();
    let policy = match proto::recv::<ToInit>(ctrl.as_fd(), &mut buf, MsgFlags::empty()) {
        Ok((ToInit::Policy(policy), _)) => policy,
        Ok(_) => {
            send_failure(
                &ctrl,
                &SetupError::new("read policy", "first message was not a policy"),
            );
            return EXIT_SETUP_FAILED;
        }
        Err(e) => {
            send_failure(&ctrl, &SetupError::new("read policy", e));
            return EXIT_SETUP_FAILED;
        }
    };
    match create_namespaces(&policy) {
        Ok(()) => {}
        Err(e) => {
            send_failure(&ctrl, &e);
            return EXIT_SETUP_FAILED;
        }
    }
    match sys::fork() {
        Ok(ForkResult::Child) => run_init(&policy, ctrl),
        Ok(ForkResult::Parent { child }) => {
            // The host moves the init into the sandbox's cgroup while it builds the root.
            let forked = FromInit::Forked {
                pid: child.as_raw(),
            };
            let _ = proto::send(ctrl.as_fd(), &forked, &[], MsgFlags::empty());
            drop(ctrl);
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => return code,
                    Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => return EXIT_SETUP_FAILED,
                }
            }
        }
        Err(e) => {
            send_failure(&ctrl, &SetupError::new("fork the init", e));
            EXIT_SETUP_FAILED
        }
    }
}

/// The namespaces stage one creates, besides the user namespace of rootless mode. The
/// cgroup namespace comes later, from the init, once it is in the sandbox's cgroup (so that
/// cgroup is the namespace's root).
pub(crate) const NAMESPACES: [(&str, CloneFlags); 5] = [
    ("mount", CloneFlags::CLONE_NEWNS),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("network", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
];

fn create_namespaces(policy: &JailPolicy) -> Result<(), SetupError> {
    let mut flags = NAMESPACES
        .iter()
        .fold(CloneFlags::empty(), |f, (_, n)| f | *n);
    let outside = (nix::unistd::geteuid(), nix::unistd::getegid());
    let user_ns = matches!(policy.identity, Identity::UserNamespace { .. });
    if user_ns {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(SetupError::at("unshare the namespaces"))?;
    if user_ns {
        // A process may map its own euid and egid, one line each, after denying setgroups:
        // nothing inside maps to host root, and no other host id is reachable.
        let write = |file: &str, contents: String| {
            std::fs::write(format!("/proc/self/{file}"), contents)
                .map_err(SetupError::at(format!("write /proc/self/{file}")))
        };
        write("setgroups", "deny".into())?;
        write(
            "uid_map",
            format!("{} {} 1\n", policy.identity.uid(), outside.0),
        )?;
        write(
            "gid_map",
            format!("{} {} 1\n", policy.identity.gid(), outside.1),
        )?;
    }
    Ok(())
}

fn run_init(policy: &JailPolicy, ctrl: OwnedFd) -> ! {
    let mut report = LayerReport::default();
    let mut listeners = Vec::new();
    match setup(policy, &ctrl, &mut report, &mut listeners) {
        Ok(()) => {
            let dirs = match export_dirs(policy) {
                Ok(d) => d,
                Err(e) => {
                    send_failure(&ctrl, &e);
                    sys::exit_now(EXIT_SETUP_FAILED);
                }
            };
            // The directories, then the listening sockets, in the order the spec names them.
            let fds: Vec<_> = dirs.iter().chain(&listeners).map(AsFd::as_fd).collect();
            if proto::send(
                ctrl.as_fd(),
                &FromInit::Ready(report),
                &fds,
                MsgFlags::empty(),
            )
            .is_err()
            {
                sys::exit_now(EXIT_SETUP_FAILED);
            }
            drop(dirs);
            drop(listeners);
            sys::exit_now(supervisor::serve(ctrl))
        }
        Err(e) => {
            send_failure(&ctrl, &e);
            sys::exit_now(EXIT_SETUP_FAILED)
        }
    }
}

fn setup(
    policy: &JailPolicy,
    ctrl: &OwnedFd,
    report: &mut LayerReport,
    listeners: &mut Vec<OwnedFd>,
) -> Result<(), SetupError> {
    // If stage one dies, so do we (and with us the whole PID namespace).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(SetupError::at("set the parent-death signal"))?;
    report.namespaces = NAMESPACES.iter().map(|(n, _)| (*n).to_owned()).collect();
    report.namespaces.push("cgroup".into());
    report.identity = match policy.identity {
        Identity::HostUid { uid, gid } => {
            format!(
                "host uid {uid} gid {gid}, unprivileged, no user namespace (the server runs as root)"
            )
        }
        Identity::UserNamespace { uid, gid } => {
            report.namespaces.insert(0, "user".into());
            format!(
                "uid {uid} gid {gid} in a user namespace mapped to the server's own uid; nothing maps to root"
            )
        }
    };

    mounts::build(policy)?;
    report.pivot_root = true;
    nix::unistd::sethostname(&policy.spec.hostname).map_err(SetupError::at("set the host name"))?;
    sys::loopback_up().map_err(SetupError::at("bring up loopback"))?;
    listeners.extend(listen_tcp(policy)?);
    redirect_stdio_to_null()?;
    wait_for_go(ctrl)?;
    unshare(CloneFlags::CLONE_NEWCGROUP).map_err(SetupError::at("unshare the cgroup namespace"))?;
    lockdown::apply(policy, report)
}

/// Opens the directories the host asked for, as `O_PATH` descriptors of this tree.
fn export_dirs(policy: &JailPolicy) -> Result<Vec<OwnedFd>, SetupError> {
    use nix::fcntl::{OFlag, open};
    if policy.spec.export_dirs.len() > proto::MAX_FDS {
        return Err(SetupError::new("export directories", "too many"));
    }
    policy
        .spec
        .export_dirs
        .iter()
        .map(|d| {
            open(
                d,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(SetupError::at(format!("open {}", d.display())))
        })
        .collect()
}

/// Listens on the sandbox's `127.0.0.1` at each port of [`JailSpec::listen_tcp`].
fn listen_tcp(policy: &JailPolicy) -> Result<Vec<OwnedFd>, SetupError> {
    if policy.spec.export_dirs.len() + policy.spec.listen_tcp.len() > proto::MAX_FDS {
        return Err(SetupError::new("listen", "too many descriptors to export"));
    }
    policy
        .spec
        .listen_tcp
        .iter()
        .map(|&port| {
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
                .map(OwnedFd::from)
                .map_err(|e| SetupError::new(format!("listen on 127.0.0.1:{port}"), e.to_string()))
        })
        .collect()
}

/// Waits until the host has moved stage one and the init into the sandbox's cgroup.
fn wait_for_go(ctrl: &OwnedFd) -> Result<(), SetupError> {
    let mut buf = Vec::new();
    match proto::recv::<ToInit>(ctrl.as_fd(), &mut buf, MsgFlags::empty()) {
        Ok((ToInit::Go, _)) => Ok(()),
        Ok(_) => Err(SetupError::new(
            "wait for the cgroup",
            "unexpected message before Go",
        )),
        Err(e) => Err(SetupError::new("wait for the cgroup", e)),
    }
}

/// The init's own stdio pointed at the host's stderr until now; from here on it holds
/// nothing of the host's.
fn redirect_stdio_to_null() -> Result<(), SetupError> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(SetupError::at("open /dev/null"))?;
    nix::unistd::dup2_stdin(&null).map_err(SetupError::at("redirect stdin"))?;
    nix::unistd::dup2_stdout(&null).map_err(SetupError::at("redirect stdout"))?;
    nix::unistd::dup2_stderr(&null).map_err(SetupError::at("redirect stderr"))?;
    Ok(())
}
