//! What a sandbox's init actually applied, reported back to the host when it is ready.
//!
//! `runbox doctor` prints it; the local backend logs it at debug level. A layer the kernel
//! lacks shows up here as not applied, never silently dropped.

use serde::{Deserialize, Serialize};

/// The isolation layers in force in one sandbox, as measured by its init.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerReport {
    /// Namespaces the sandbox has of its own (`user`, `mount`, `pid`, ...).
    pub namespaces: Vec<String>,
    /// Who the sandbox's processes are, in words.
    pub identity: String,
    /// Whether the root was switched with `pivot_root` and the old root detached.
    pub pivot_root: bool,
    /// Whether every capability, the bounding set and the ambient set are empty.
    pub capabilities_dropped: bool,
    /// Whether `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Number of seccomp filters installed.
    pub seccomp_filters: u32,
    /// Number of syscalls those filters refuse outright or by argument.
    pub seccomp_rules: u32,
    /// Landlock ABI the kernel offers (0 when Landlock is missing or disabled).
    pub landlock_abi: u32,
    /// Landlock enforcement: `fully enforced`, `partially enforced` or `not enforced`.
    pub landlock_status: String,
    /// Whether Landlock restricts TCP bind and connect (ABI 4+).
    pub landlock_tcp: bool,
    /// Whether Landlock scopes signals and abstract unix sockets (ABI 6+).
    pub landlock_scopes: bool,
    /// rlimits set, `(name, value)`.
    pub rlimits: Vec<(String, u64)>,
}
