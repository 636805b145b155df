//! # runbox-jail
//!
//! Linux isolation for runbox's local sandboxes. It owns every layer of SECURITY.md and
//! nothing else: it knows nothing of languages, kernels or MCP.
//!
//! - **Host side** ([`JailHost`], [`Jail`]): leases an unprivileged uid (as root) or plans a
//!   user namespace (as an ordinary user), creates the sandbox's cgroup, re-executes the
//!   runbox binary as the sandbox's init with a control socket, and then starts processes in
//!   the sandbox on request, passing their stdio as file descriptors.
//! - **Sandbox side** ([`init::main`]): creates the namespaces, builds a fresh root and
//!   pivots into it, drops to the sandbox's identity with no capabilities, sets rlimits,
//!   `no_new_privs`, Landlock and seccomp, then serves as PID 1.
//! - **Policy** ([`JailSpec`]): plain data, decided by the backend; the mechanism here only
//!   carries it out.
//! - **Crash recovery** (`recovery`): each host registers as the owner of the sandboxes it
//!   starts (a record locked with `flock` for its life); a host starting up removes what
//!   owners that died left behind (cgroups, and the processes of paused sandboxes), never
//!   what a live one owns ([`Recovered`]).
//!
//! All of runbox's `unsafe` code is in the private `sys` module of this crate, each block
//! with the reason it is sound. This crate must never run sandboxed code outside a sandbox:
//! there is no code path that starts a process without every required layer.

pub mod cgroup;
mod error;
mod host;
pub mod init;
pub mod policy;
pub mod probe;
pub mod proto;
mod recovery;
mod report;
mod state;
mod sys;
mod uid;

pub use cgroup::{CgroupLimits, CgroupVersion, Controller, SandboxCgroup, Usage};
pub use error::JailError;
pub use host::{CgroupMode, Jail, JailHost, JailHostConfig, Spawned, USERNS_UID};
pub use policy::{Bind, File, JailSpec, LandlockPolicy, Rlimits, Tmpfs};
pub use proto::{ExitStatus, SpawnRequest};
pub use recovery::Recovered;
pub use report::LayerReport;
pub use uid::{DEFAULT_UID_BASE, DEFAULT_UID_COUNT};
