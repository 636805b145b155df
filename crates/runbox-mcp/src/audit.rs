//! The audit log (`--audit-log FILE`): one JSON line per tool call, with its time, tenant,
//! tool, sandbox, outcome and duration. The code itself is written only when the operator
//! asks for it (`--audit-code`): it can hold whatever a user pasted into a chat.
//!
//! Lines are appended with one `write` each to a file opened with `O_APPEND`, so lines of
//! concurrent calls never interleave and several servers may share a file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// An open audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
    include_code: bool,
}

/// One tool call, as the log records it.
#[derive(Debug, Serialize)]
pub(crate) struct Entry<'a> {
    /// When the call ended, RFC 3339 in UTC with milliseconds.
    pub time: String,
    pub tenant: &'a str,
    pub tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<&'a str>,
    /// ok, error (a tool result with `isError`) or invalid (a protocol error).
    pub outcome: &'static str,
    pub duration_ms: f64,
    /// The code or command, with `--audit-code` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'a str>,
}

impl AuditLog {
    /// Opens (creating it, mode 0600) `path` for appending.
    pub fn open(path: &Path, include_code: bool) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            path: path.to_owned(),
            file: Mutex::new(file),
            include_code,
        })
    }

    /// Whether entries carry the code.
    pub(crate) fn include_code(&self) -> bool {
        self.include_code
    }

    /// Appends one line. A failed write is logged, never the caller's problem.
    pub(crate) fn record(&self, entry: &Entry<'_>) {
        let mut line = match serde_json::to_vec(entry) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("audit entry did not serialize: {e}");
                return;
            }
        };
        line.push(b'\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.write_all(&line) {
            tracing::error!(path = %self.path.display(), "writing the audit log: {e}");
        }
    }
}

/// Milliseconds, to the microsecond.
pub(crate) fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// Now, as the log writes times.
pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_one_json_line_and_code_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        let entry = |code| Entry {
            time: now(),
            tenant: "alice",
            tool: "run_code",
            sandbox_id: Some("sbx_1"),
            outcome: "ok",
            duration_ms: 1.5,
            code,
        };
        log.record(&entry(None));
        log.record(&entry(Some("print(1)")));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["tenant"], "alice");
        assert_eq!(lines[0]["sandbox_id"], "sbx_1");
        assert!(lines[0].get("code").is_none());
        assert_eq!(lines[1]["code"], "print(1)");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
