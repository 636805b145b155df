//! The control protocol between the host and a sandbox's init.
//!
//! One `SOCK_SEQPACKET` unix socket per sandbox: every message is one JSON document in one
//! datagram, and file descriptors travel beside it as `SCM_RIGHTS`.
//!
//! Start-up: the host sends the [`ToInit::Policy`]; stage one creates the namespaces, forks
//! the init and reports its host pid ([`FromInit::Forked`]); the host moves both into the
//! sandbox's cgroup while the init builds the filesystem, then sends [`ToInit::Go`]; the init
//! enters its cgroup namespace, locks itself down and reports [`FromInit::Ready`]. Moving a
//! process between cgroups can wait for an RCU grace period (milliseconds), so it runs beside
//! the init's work rather than before it; nothing sandboxed runs before `Go`.
//!
//! Then requests: the init answers each by id and reports, unasked, the exit of every
//! process it started. Only the init writes to this socket from the sandbox side,
//! so nothing the sandboxed code prints can forge a message.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::policy::JailPolicy;
use crate::report::LayerReport;

/// Largest control message, in bytes (the policy with embedded kernel drivers is the
/// largest, a few tens of KiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Most descriptors one message may carry.
pub const MAX_FDS: usize = 8;

/// Host to init.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToInit {
    /// The first message: what to build.
    Policy(Box<JailPolicy>),
    /// Stage one and the init are in the sandbox's cgroup: the init may finish its setup.
    Go,
    /// A request, answered by a [`FromInit::Reply`] with the same id.
    Request {
        /// Correlates the reply.
        id: u64,
        /// What to do.
        request: Request,
    },
}

/// Something the host asks the init to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Start a process. The descriptors attached to the message become its fds 0, 1, 2, ...
    /// in order.
    Spawn(SpawnRequest),
    /// Send a signal to a process (or its whole process group).
    Signal {
        /// The process, as the sandbox sees it.
        pid: i32,
        /// Signal number.
        signal: i32,
        /// Signal the process group `pid` leads instead.
        group: bool,
    },
    /// Answer with [`Reply::Pong`]: a liveness check.
    Ping,
}

/// How to start a process inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// Program (absolute path inside the sandbox) and its arguments.
    pub argv: Vec<String>,
    /// The complete environment, `KEY=VALUE`; nothing else is inherited.
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    pub cwd: String,
}

/// Init to host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromInit {
    /// From stage one, right after it forked the init: the init's pid as the host sees it,
    /// so the host can move it into the sandbox's cgroup while it builds the filesystem.
    Forked {
        /// Host pid of the init.
        pid: i32,
    },
    /// The sandbox is built and every layer applied; it accepts requests.
    Ready(LayerReport),
    /// Building the sandbox failed; the init exits after sending this.
    SetupFailed {
        /// The step that failed (`mount /proc`, `seccomp`, ...).
        step: String,
        /// The error, with its errno.
        error: String,
    },
    /// The answer to a request.
    Reply {
        /// The request's id.
        id: u64,
        /// What happened.
        result: Result<Reply, Refusal>,
    },
    /// A process started with [`Request::Spawn`] ended.
    Exited {
        /// Its pid inside the sandbox.
        pid: i32,
        /// How it ended.
        status: ExitStatus,
    },
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The process started with this pid (as the sandbox sees it).
    Spawned {
        /// Pid inside the sandbox's PID namespace.
        pid: i32,
    },
    /// Done.
    Done,
    /// Alive.
    Pong,
}

/// Why the init could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// What failed, for a human.
    pub message: String,
    /// The errno behind it, when there is one (`EAGAIN` from `fork`: the process limit).
    pub errno: Option<i32>,
}

impl Refusal {
    /// A refusal with no errno.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            errno: None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The shell's convention: the code, or 128 + the signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }
}

/// Why a message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The socket failed.
    #[error("control socket: {0}")]
    Io(#[from] nix::Error),
    /// The peer closed the socket.
    #[error("control socket closed by the peer")]
    Closed,
    /// A message did not fit or did not parse.
    #[error("bad control message: {0}")]
    Malformed(String),
}

/// Sends one message with `fds` attached.
pub fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    fds: &[BorrowedFd<'_>],
    flags: MsgFlags,
) -> Result<(), ProtoError> {
    let bytes = serde_json::to_vec(msg).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if bytes.len() > MAX_MESSAGE {
        return Err(ProtoError::Malformed(format!(
            "message of {} bytes exceeds {MAX_MESSAGE}",
            bytes.len()
        )));
    }
    if fds.len() > MAX_FDS {
        return Err(ProtoError::Malformed(format!(
            "{} fds exceed {MAX_FDS}",
            fds.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        cmsgs,
        flags | MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if n != bytes.len() {
        return Err(ProtoError::Malformed(format!(
            "short send: {n} of {}",
            bytes.len()
        )));
    }
    Ok(())
}

/// Receives one message and the descriptors attached to it (close-on-exec).
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    flags: MsgFlags,
) -> Result<(T, Vec<OwnedFd>), ProtoError> {
    buf.resize(MAX_MESSAGE, 0);
    let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (len, fds, truncated) = {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            flags | MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                fds.extend(raw.into_iter().map(crate::sys::owned_fd_from_scm_rights));
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    if len == 0 {
        return Err(ProtoError::Closed);
    }
    if truncated {
        return Err(ProtoError::Malformed(
            "message or descriptors truncated".into(),
        ));
    }
    let msg =
        serde_json::from_slice(&buf[..len]).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    Ok((msg, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_descriptors_cross_a_seqpacket_pair() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let msg = ToInit::Request {
            id: 7,
            request: Request::Spawn(SpawnRequest {
                argv: vec!["/bin/true".into()],
                env: vec!["A=1".into()],
                cwd: "/".into(),
            }),
        };
        send(a.as_fd(), &msg, &[w.as_fd()], MsgFlags::empty()).unwrap();
        drop(w);
        let mut buf = Vec::new();
        let (got, fds): (ToInit, _) = recv(b.as_fd(), &mut buf, MsgFlags::empty()).unwrap();
        match got {
            ToInit::Request {
                id: 7,
                request: Request::Spawn(s),
            } => {
                assert_eq!(s.argv, vec!["/bin/true"]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end: writing to it reaches `r`.
        let mut wfile = std::fs::File::from(fds.into_iter().next().unwrap());
        wfile.write_all(b"hi").unwrap();
        drop(wfile);
        let mut s = String::new();
        std::fs::File::from(r).read_to_string(&mut s).unwrap();
        assert_eq!(s, "hi");
        drop(a);
        let end = recv::<ToInit>(b.as_fd(), &mut buf, MsgFlags::empty());
        assert!(matches!(end, Err(ProtoError::Closed)));
    }

    #[test]
    fn exit_status_follows_the_shell_convention() {
        assert_eq!(
            ExitStatus {
                code: Some(3),
                signal: None
            }
            .shell_code(),
            3
        );
        assert_eq!(
            ExitStatus {
                code: None,
                signal: Some(9)
            }
            .shell_code(),
            137
        );
    }
}
