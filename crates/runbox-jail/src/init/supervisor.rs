//! The init's work once the sandbox is built: start processes on request, signal them, and
//! reap every child, reporting the exit of those it started.

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::MsgFlags;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use crate::proto::{self, ExitStatus, FromInit, Refusal, Reply, Request, SpawnRequest, ToInit};
use crate::sys::{self, ExecPlan};

/// Serves requests until the host closes the control socket; returns the init's exit code.
pub(crate) fn serve(ctrl: OwnedFd) -> i32 {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if mask.thread_block().is_err() {
        return super::EXIT_SETUP_FAILED;
    }
    let Ok(sfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        return super::EXIT_SETUP_FAILED;
    };
    let mut started: HashSet<i32> = HashSet::new();
    let mut buf = Vec::new();
    loop {
        let (ctrl_ready, child_ready) = {
            let mut fds = [
                PollFd::new(ctrl.as_fd(), PollFlags::POLLIN),
                PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => return super::EXIT_SETUP_FAILED,
            }
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if child_ready {
            while let Ok(Some(_)) = sfd.read_signal() {}
            reap(&ctrl, &mut started);
        }
        if ctrl_ready {
            match proto::recv::<ToInit>(ctrl.as_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok((ToInit::Request { id, request }, fds)) => {
                    let result = handle(request, fds, &mut started);
                    let reply = FromInit::Reply { id, result };
                    if proto::send(ctrl.as_fd(), &reply, &[], MsgFlags::empty()).is_err() {
                        return 0;
                    }
                }
                Ok((ToInit::Policy(_) | ToInit::Go, _)) => {}
                Err(proto::ProtoError::Io(Errno::EAGAIN | Errno::EINTR)) => {}
                // The host closed the socket (or broke it): the sandbox ends with us.
                Err(_) => return 0,
            }
        }
    }
}

fn handle(
    request: Request,
    fds: Vec<OwnedFd>,
    started: &mut HashSet<i32>,
) -> Result<Reply, Refusal> {
    match request {
        Request::Ping => Ok(Reply::Pong),
        Request::Signal { pid, signal, group } => {
            let sig = Signal::try_from(signal)
                .map_err(|e| Refusal::new(format!("signal {signal}: {e}")))?;
            if pid <= 1 {
                return Err(Refusal::new(format!("refusing to signal pid {pid}")));
            }
            let target = if group {
                Pid::from_raw(-pid)
            } else {
                Pid::from_raw(pid)
            };
            match kill(target, sig) {
                // Already gone: what the caller wanted.
                Ok(()) | Err(Errno::ESRCH) => Ok(Reply::Done),
                Err(e) => Err(Refusal {
                    message: format!("kill {pid}: {e}"),
                    errno: Some(e as i32),
                }),
            }
        }
        Request::Spawn(spawn) => {
            let pid = start(&spawn, &fds)?;
            started.insert(pid);
            Ok(Reply::Spawned { pid })
        }
    }
}

fn start(spawn: &SpawnRequest, fds: &[OwnedFd]) -> Result<i32, Refusal> {
    let errno = |message: String, e: Errno| Refusal {
        message,
        errno: Some(e as i32),
    };
    if spawn.argv.is_empty() {
        return Err(Refusal::new("empty argv"));
    }
    if fds.len() < 3 {
        return Err(Refusal::new(format!(
            "a process needs stdin, stdout and stderr; got {} fds",
            fds.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let plan = ExecPlan::new(&spawn.argv, &spawn.env, &spawn.cwd, raw)
        .map_err(|e| Refusal::new(format!("argument holds a NUL byte: {e}")))?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| errno(format!("pipe: {}", e.desc()), e))?;
    match sys::fork().map_err(|e| errno(format!("fork: {}", e.desc()), e))? {
        ForkResult::Child => sys::exec_child(&plan, err_w.as_raw_fd()),
        ForkResult::Parent { child } => {
            drop(err_w);
            let mut report = Vec::with_capacity(8);
            let _ = std::fs::File::from(err_r).read_to_end(&mut report);
            if report.len() < 8 {
                return Ok(child.as_raw());
            }
            // The child failed before execve and exited: reap it here so it is never reported.
            let _ = waitpid(child, None);
            let step = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
            let e = Errno::from_raw(i32::from_ne_bytes([
                report[4], report[5], report[6], report[7],
            ]));
            let what = match step {
                sys::EXEC_STEP_SETSID => "setsid".to_owned(),
                sys::EXEC_STEP_FDS => "set up descriptors".to_owned(),
                sys::EXEC_STEP_CHDIR => format!("chdir {}", spawn.cwd),
                _ => format!("execute {}", spawn.argv[0]),
            };
            Err(errno(format!("{what}: {}", e.desc()), e))
        }
    }
}

fn reap(ctrl: &OwnedFd, started: &mut HashSet<i32>) {
    loop {
        let (pid, status) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (
                pid,
                ExitStatus {
                    code: Some(code),
                    signal: None,
                },
            ),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (
                pid,
                ExitStatus {
                    code: None,
                    signal: Some(sig as i32),
                },
            ),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return,
        };
        if started.remove(&pid.as_raw()) {
            let msg = FromInit::Exited {
                pid: pid.as_raw(),
                status,
            };
            let _ = proto::send(ctrl.as_fd(), &msg, &[], MsgFlags::empty());
        }
    }
}
