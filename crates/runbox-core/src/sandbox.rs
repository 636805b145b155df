//! Sandboxes as the front ends see them: ids, specs, info and status.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::credential::Credential;
use crate::exec::Language;
use crate::limits::{EnforcedLimits, Limits};
use crate::process::ProcessInfo;

/// A sandbox id: issued by the backend, unguessable, stable for the sandbox's life.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxId(String);

impl SandboxId {
    /// A fresh id with 128 bits from the operating system's random source, `sbx_` followed
    /// by 32 hex digits.
    ///
    /// # Panics
    ///
    /// Never in practice: only if the kernel has no random source at all, in which case no
    /// id could be unguessable and refusing to go on is right.
    #[allow(clippy::expect_used)]
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random source is unavailable");
        let mut s = String::with_capacity(36);
        s.push_str("sbx_");
        for b in bytes {
            s.push_str(&format!("{b:02x}"));
        }
        Self(s)
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for SandboxId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for SandboxId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// What a caller asks for when creating a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Resource limits; `None` takes the backend's defaults.
    pub limits: Option<Limits>,
    /// Environment variables every process in the sandbox starts with.
    pub env: BTreeMap<String, String>,
    /// Free-form labels, kept and reported back, never interpreted.
    pub metadata: BTreeMap<String, String>,
    /// Network access.
    #[serde(default)]
    pub network: Network,
    /// How long the sandbox may sit unused before the registry closes it (`None`: the
    /// default). A remote backend sets its provider's own timer past it, so a sandbox
    /// outlives a crash of this server by a bounded time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<std::time::Duration>,
    /// The caller's own key for the backend's provider (`--auth passthrough`); `None`: the
    /// backend's own. Never serialized.
    #[serde(skip)]
    pub credential: Option<Credential>,
}

/// What a sandbox may reach on the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Nothing: an empty network namespace with its own loopback.
    #[default]
    None,
    /// HTTP and HTTPS through the server's egress proxy, to these hosts (a subset of the
    /// operator's list; empty means the operator's whole list).
    Allowlist(Vec<String>),
}

/// A sandbox that was just created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// Its id.
    pub id: SandboxId,
    /// When it was created.
    pub created_at: SystemTime,
    /// The limits in force.
    pub limits: Limits,
    /// Languages that can run in it.
    pub languages: Vec<Language>,
    /// The hosts it may reach through the egress proxy (empty: no network).
    pub allowed_hosts: Vec<String>,
}

/// Lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Accepting work.
    Running,
    /// Frozen: no process runs until resumed.
    Paused,
    /// Gone.
    Closed,
}

/// A snapshot of a live sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxStatus {
    /// Its id.
    pub id: SandboxId,
    /// Lifecycle state.
    pub state: SandboxState,
    /// When it was created.
    pub created_at: SystemTime,
    /// The limits asked for.
    pub limits: Limits,
    /// Those of them that actually hold, and how.
    #[serde(default)]
    pub enforced: EnforcedLimits,
    /// Memory in use now, in bytes, when the backend can measure it.
    pub memory_bytes: Option<u64>,
    /// CPU time used so far by all its processes, in seconds, when measurable.
    pub cpu_seconds: Option<f64>,
    /// Processes and threads alive now, when measurable.
    pub pids: Option<u64>,
    /// Kernels running now.
    pub kernels: Vec<Language>,
    /// Background processes, running or ended and not yet forgotten.
    pub processes: Vec<ProcessInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_well_formed() {
        let a = SandboxId::random();
        let b = SandboxId::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert!(a.as_str().starts_with("sbx_"));
        assert!(a.as_str()[4..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
