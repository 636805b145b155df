//! The sandbox policy: plain data describing what the init must build and apply.
//!
//! The host decides everything here (which paths, which ids, which limits); the init,
//! running inside the new namespaces, only carries it out. Keeping the policy as data makes
//! it testable and loggable, and keeps the mechanism (code in `init`) free of decisions.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupLimits;

/// How the sandbox's user is isolated from the host's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Identity {
    /// The server runs as root: no user namespace; the sandbox runs as this unprivileged host
    /// uid and gid, distinct per live sandbox, never 0.
    HostUid {
        /// Host uid of every sandbox process.
        uid: u32,
        /// Host gid of every sandbox process.
        gid: u32,
    },
    /// The server runs as an ordinary user: a user namespace maps the sandbox's single uid
    /// (and gid) to the server's own; nothing maps to host root.
    UserNamespace {
        /// The uid inside the namespace.
        uid: u32,
        /// The gid inside the namespace.
        gid: u32,
    },
}

impl Identity {
    /// The uid sandbox processes see for themselves.
    pub fn uid(&self) -> u32 {
        match self {
            Identity::HostUid { uid, .. } | Identity::UserNamespace { uid, .. } => *uid,
        }
    }

    /// The gid sandbox processes see for themselves.
    pub fn gid(&self) -> u32 {
        match self {
            Identity::HostUid { gid, .. } | Identity::UserNamespace { gid, .. } => *gid,
        }
    }
}

/// A read-only bind of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path (file or directory).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
}

/// A file the init writes into the sandbox's (then read-only) root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct File {
    /// Absolute path inside the sandbox.
    pub path: PathBuf,
    /// Contents.
    pub contents: String,
    /// Permission bits.
    pub mode: u32,
}

/// A size- and inode-capped tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tmpfs {
    /// Size cap in bytes.
    pub size_bytes: u64,
    /// Cap on files and directories.
    pub inodes: u64,
}

/// Resource limits applied with `setrlimit` (soft = hard, so code cannot raise them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// `RLIMIT_NPROC`: processes per uid (counted per user namespace on Linux 5.14+).
    pub nproc: u64,
    /// `RLIMIT_NOFILE`: open files per process.
    pub nofile: u64,
    /// `RLIMIT_FSIZE`: largest file a process may write, in bytes.
    pub fsize: u64,
    /// `RLIMIT_CPU`: CPU seconds per process (0 = unlimited).
    pub cpu_seconds: u64,
    /// `RLIMIT_MEMLOCK`: locked memory in bytes.
    pub memlock: u64,
    /// `RLIMIT_STACK`: main thread stack in bytes (0 = unchanged).
    pub stack: u64,
    /// `RLIMIT_DATA`: a process's private writable memory (heap, anonymous mappings, thread
    /// stacks) in bytes, 0 = unlimited. The memory limit of a sandbox without a cgroup: it
    /// holds per process, not for the sandbox. (`RLIMIT_AS` would count the address space
    /// V8 and the JVM reserve without using it.)
    #[serde(default)]
    pub data: u64,
}

/// The Landlock layer: what the sandbox's processes may touch even if every other layer
/// failed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LandlockPolicy {
    /// Paths (inside the sandbox) whose directories may be listed, and nothing more.
    pub list: Vec<PathBuf>,
    /// Paths that may be read and executed.
    pub read_exec: Vec<PathBuf>,
    /// Paths that may be read, written, created in and removed from.
    pub read_write: Vec<PathBuf>,
    /// Device directory: read, write and ioctl on existing nodes.
    pub devices: Vec<PathBuf>,
    /// TCP ports the sandbox may bind and connect to (Landlock ABI 4+). Everything else is
    /// refused even on the sandbox's own loopback.
    pub tcp_ports: Vec<u16>,
}

/// What a backend asks the jail for: the sandbox's filesystem, limits and restrictions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JailSpec {
    /// Host name inside the sandbox.
    pub hostname: String,
    /// Read-only binds of the host's runtime.
    pub binds: Vec<Bind>,
    /// Symbolic links to create in the root, `(path, target)`.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Files to write into the root. `/etc/passwd` and `/etc/group` are added by the jail,
    /// which alone knows the sandbox's ids.
    pub files: Vec<File>,
    /// The writable home.
    pub workspace: Tmpfs,
    /// The writable `/tmp` (and `/dev/shm`).
    pub tmp: Tmpfs,
    /// Per-process limits.
    pub rlimits: Rlimits,
    /// Filesystem, network and scope restrictions.
    pub landlock: LandlockPolicy,
    /// Limits on the whole sandbox (the cgroup layer).
    pub resources: CgroupLimits,
    /// Directories (inside the sandbox) whose `O_PATH` descriptors the init hands to the host
    /// with its ready report, so the host can reach files beneath them (with `openat2` and
    /// `RESOLVE_BENEATH`) without going through `/proc`. At most [`crate::proto::MAX_FDS`].
    pub export_dirs: Vec<PathBuf>,
    /// Ports on which the init listens on the sandbox's own `127.0.0.1`, before any sandboxed
    /// code runs, handing the listening sockets to the host with its ready report: the host
    /// accepts what sandboxed code connects there (the egress proxy). Sandboxed code cannot
    /// bind them itself (they are taken) and reaches them only if Landlock's `tcp_ports`
    /// lists them.
    #[serde(default)]
    pub listen_tcp: Vec<u16>,
}

/// Everything the init needs to build one sandbox: the spec plus what the host decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JailPolicy {
    /// Who the sandbox's processes are.
    pub identity: Identity,
    /// Host directory on which the sandbox's root tmpfs is mounted, inside the sandbox's own
    /// mount namespace (the host never sees the mount).
    pub root_mountpoint: PathBuf,
    /// The backend's request.
    pub spec: JailSpec,
}

impl JailPolicy {
    /// Where the writable home is mounted inside the sandbox.
    pub const WORKSPACE: &'static str = "/workspace";
    /// The sandbox's writable temporary directory.
    pub const TMP: &'static str = "/tmp";
}
