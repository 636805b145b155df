//! Errors of the jail, named after what failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::proto::ProtoError;

/// Something went wrong starting, using or ending a sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JailError {
    /// The state directory could not be prepared.
    #[error("state directory {}: {source}", path.display())]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The state directory is one another user could have made or may reach.
    #[error(
        "state directory {} {problem}: another user may have made it first, to see or steer \
         what runbox does. Remove it if it is not yours (or make it a directory of your own \
         with mode 0700), or choose another: --state-dir DIR, or XDG_RUNTIME_DIR set to a \
         private directory",
        path.display()
    )]
    StateDirRefused {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Cgroups are required and this host offers none to this user.
    #[error(
        "cgroups are unavailable: {0}. Without them a sandbox's memory is capped only per \
         process (RLIMIT_DATA: many processes may each use the limit) and its CPU not at all. \
         Give runbox a cgroup subtree of its own (as root, or delegated to this user and named \
         with --cgroup-parent), or pass --no-cgroups to run with per-process limits only"
    )]
    NoCgroups(crate::cgroup::CgroupUnavailable),
    /// The init binary could not be started.
    #[error("cannot start the sandbox init {}: {source}", exe.display())]
    SpawnInit {
        /// The binary.
        exe: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The init reported a failed setup step.
    #[error("sandbox setup failed at step \"{step}\": {error}")]
    Setup {
        /// The step.
        step: String,
        /// The error, with errno.
        error: String,
    },
    /// The init exited during setup without a report.
    #[error("the sandbox init ({}) exited during setup ({status}) without a report", exe.display())]
    InitDied {
        /// The binary.
        exe: PathBuf,
        /// Its exit status.
        status: String,
    },
    /// Setup took too long.
    #[error("sandbox setup timed out after {0:?}")]
    SetupTimeout(Duration),
    /// No sandbox uid is free.
    #[error("no free sandbox uid: {0}")]
    Uid(io::Error),
    /// The sandbox's cgroup could not be made or joined.
    #[error("sandbox cgroup: {0}")]
    Cgroup(io::Error),
    /// The control socket failed.
    #[error("{0}")]
    Control(#[from] ProtoError),
    /// The sandbox has ended (its init is gone).
    #[error("the sandbox has ended")]
    Ended,
    /// The init refused or failed a request.
    #[error("{0}")]
    Refused(crate::proto::Refusal),
}

impl JailError {
    /// The errno behind a refused request, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            JailError::Refused(r) => r.errno,
            _ => None,
        }
    }
}
