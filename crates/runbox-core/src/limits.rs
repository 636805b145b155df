//! Per-sandbox resource limits: plain data, validated in one place.

use serde::{Deserialize, Serialize};

/// Resource limits of one sandbox. Every field has a default chosen for an agent running data
/// analysis on a laptop; operators raise or lower them in configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Memory of every process in the sandbox together, swap included, in MiB. Files written
    /// to `/workspace` and `/tmp` live in memory (tmpfs) and count against it too.
    pub memory_mb: u64,
    /// Processes and threads alive at once (stops fork bombs).
    pub pids: u32,
    /// CPU time per wall-clock second, in cores (1.0 = one full core).
    pub cpus: f64,
    /// Size of the writable `/workspace`, in MiB.
    pub workspace_mb: u64,
    /// Size of `/tmp`, in MiB.
    pub tmp_mb: u64,
    /// Files and directories each of `/workspace` and `/tmp` may hold (stops inode floods).
    pub inodes: u64,
    /// Open file descriptors per process.
    pub open_files: u64,
    /// Output kept per stream per run, in bytes; beyond it the head and tail are kept.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mb: 1024,
            pids: 256,
            cpus: 1.0,
            workspace_mb: 512,
            tmp_mb: 128,
            inodes: 65_536,
            open_files: 1024,
            output_bytes: 100_000,
        }
    }
}

/// What part of a sandbox one enforced limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every process of the sandbox together.
    Sandbox,
    /// Each process on its own: a sandbox of many processes may use many times the limit.
    Process,
}

/// One limit that holds in a sandbox: its value, what it applies to, and what enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforced {
    /// The value (bytes for memory, a count for processes).
    pub value: u64,
    /// What it applies to.
    pub per: Scope,
    /// What enforces it, in a few words (`cgroup memory.max`, `RLIMIT_DATA`, ...).
    pub by: String,
}

/// The limits that actually hold in one sandbox, as far as its backend enforces
/// [`Limits`]: `None` where nothing does. Reported by status; never more than is true.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnforcedLimits {
    /// Memory, in bytes.
    pub memory: Option<Enforced>,
    /// Processes and threads alive at once.
    pub processes: Option<Enforced>,
    /// CPU time per wall-clock second, in cores, for the whole sandbox.
    pub cpus: Option<f64>,
}

/// In words: `memory 1024 MiB per sandbox (cgroup memory, swap included), 256 processes per
/// sandbox (cgroup pids), CPU 1 core`.
impl std::fmt::Display for EnforcedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |e: &Enforced| match e.per {
            Scope::Sandbox => format!("per sandbox ({})", e.by),
            Scope::Process => format!("per process ({}; none for the sandbox as a whole)", e.by),
        };
        match &self.memory {
            Some(m) => write!(f, "memory {} MiB {}", m.value >> 20, per(m))?,
            None => f.write_str("memory not limited")?,
        }
        match &self.processes {
            Some(p) => write!(f, ", {} processes {}", p.value, per(p))?,
            None => f.write_str(", processes not limited")?,
        }
        match self.cpus {
            Some(c) if (c - 1.0).abs() < f64::EPSILON => f.write_str(", CPU 1 core"),
            Some(c) => write!(f, ", CPU {c} cores"),
            None => f.write_str(", CPU not limited"),
        }
    }
}

impl EnforcedLimits {
    /// The memory limit of the sandbox as a whole, if one holds.
    pub fn sandbox_memory_bytes(&self) -> Option<u64> {
        self.memory
            .as_ref()
            .filter(|m| m.per == Scope::Sandbox)
            .map(|m| m.value)
    }
}

/// A limit outside the range runbox can honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit {field} = {value} is out of range: {expected}")]
pub struct LimitsError {
    /// The offending field.
    pub field: &'static str,
    /// Its value, as given.
    pub value: String,
    /// What would be accepted.
    pub expected: &'static str,
}

impl Limits {
    /// Smallest memory limit: an interpreter needs some room to start.
    pub const MIN_MEMORY_MB: u64 = 32;
    /// Smallest process limit: init, a kernel and a shell with a pipe or two.
    pub const MIN_PIDS: u32 = 8;
    /// Smallest output cap: enough for a traceback.
    pub const MIN_OUTPUT_BYTES: usize = 1024;

    /// Checks every field, returning the first that is out of range.
    pub fn validate(&self) -> Result<(), LimitsError> {
        fn err(field: &'static str, value: impl ToString, expected: &'static str) -> LimitsError {
            LimitsError {
                field,
                value: value.to_string(),
                expected,
            }
        }
        if self.memory_mb < Self::MIN_MEMORY_MB || self.memory_mb > 1 << 20 {
            return Err(err("memory_mb", self.memory_mb, "32 to 1048576 MiB"));
        }
        if self.pids < Self::MIN_PIDS || self.pids > 1 << 20 {
            return Err(err("pids", self.pids, "8 to 1048576"));
        }
        if !(self.cpus.is_finite() && self.cpus >= 0.01 && self.cpus <= 1024.0) {
            return Err(err("cpus", self.cpus, "0.01 to 1024 cores"));
        }
        if self.workspace_mb == 0 || self.workspace_mb > 1 << 20 {
            return Err(err("workspace_mb", self.workspace_mb, "1 to 1048576 MiB"));
        }
        if self.tmp_mb == 0 || self.tmp_mb > 1 << 20 {
            return Err(err("tmp_mb", self.tmp_mb, "1 to 1048576 MiB"));
        }
        if self.inodes < 64 || self.inodes > 1 << 32 {
            return Err(err("inodes", self.inodes, "64 to 4294967296"));
        }
        if self.open_files < 64 || self.open_files > 1 << 20 {
            return Err(err("open_files", self.open_files, "64 to 1048576"));
        }
        if self.output_bytes < Self::MIN_OUTPUT_BYTES || self.output_bytes > 1 << 30 {
            return Err(err(
                "output_bytes",
                self.output_bytes,
                "1024 bytes to 1 GiB",
            ));
        }
        Ok(())
    }

    /// Memory limit in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mb.saturating_mul(1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Limits::default().validate().unwrap();
    }

    #[test]
    fn each_field_is_checked() {
        let cases: Vec<(Limits, &str)> = vec![
            (
                Limits {
                    memory_mb: 1,
                    ..Default::default()
                },
                "memory_mb",
            ),
            (
                Limits {
                    pids: 2,
                    ..Default::default()
                },
                "pids",
            ),
            (
                Limits {
                    cpus: 0.0,
                    ..Default::default()
                },
                "cpus",
            ),
            (
                Limits {
                    cpus: f64::NAN,
                    ..Default::default()
                },
                "cpus",
            ),
            (
                Limits {
                    workspace_mb: 0,
                    ..Default::default()
                },
                "workspace_mb",
            ),
            (
                Limits {
                    tmp_mb: 0,
                    ..Default::default()
                },
                "tmp_mb",
            ),
            (
                Limits {
                    inodes: 1,
                    ..Default::default()
                },
                "inodes",
            ),
            (
                Limits {
                    open_files: 3,
                    ..Default::default()
                },
                "open_files",
            ),
            (
                Limits {
                    output_bytes: 10,
                    ..Default::default()
                },
                "output_bytes",
            ),
        ];
        for (limits, field) in cases {
            let e = limits.validate().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.to_string().contains(field));
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = serde_json::from_str::<Limits>(r#"{"memroy_mb": 5}"#).unwrap_err();
        assert!(e.to_string().contains("memroy_mb"));
        let l: Limits = serde_json::from_str(r#"{"memory_mb": 64}"#).unwrap();
        assert_eq!(l.memory_mb, 64);
        assert_eq!(l.pids, Limits::default().pids);
    }
}
