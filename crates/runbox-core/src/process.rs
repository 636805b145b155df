//! Background processes: commands started in a sandbox that outlive the call that started
//! them, whose output is collected for later reads.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// A background process of a sandbox, as the backend numbers them (`p1`, `p2`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcessId(String);

impl ProcessId {
    /// The `n`th process of a sandbox.
    pub fn nth(n: u64) -> Self {
        Self(format!("p{n}"))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ProcessId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for ProcessId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl std::fmt::Display for ProcessId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a background process is and whether it still runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its id in the sandbox.
    pub id: ProcessId,
    /// The command line it runs.
    pub command: String,
    /// When it started.
    pub started_at: SystemTime,
    /// Its exit code once it has ended (128 + the signal for a killed one), else `None`.
    pub exit_code: Option<i32>,
}

impl ProcessInfo {
    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.exit_code.is_none()
    }
}

/// What a sandbox's background processes are doing, for its idle clock: a sandbox is idle
/// only while no call is in progress and none of its background processes runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundActivity {
    /// At least one runs now.
    Running,
    /// None runs. The last one ended at this instant; `None` when none ever ran or the
    /// backend cannot tell.
    Ended(Option<tokio::time::Instant>),
}

/// Output of a background process not read before, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOutput {
    /// The process.
    pub info: ProcessInfo,
    /// Standard output written since the last read (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error written since the last read.
    pub stderr: String,
    /// Bytes that were dropped since the last read because unread output outgrew the
    /// per-process cap (the oldest go first).
    pub dropped_bytes: u64,
}
