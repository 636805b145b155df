//! Running code: the request a front end sends and the outcome a backend returns.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// A language runbox can run. Python and JavaScript run in persistent kernels (state kept
/// between calls); bash runs each call in a fresh shell that keeps exported variables and
/// the working directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// CPython, notebook semantics.
    Python,
    /// Node.js, one persistent context with top-level `await`.
    #[serde(alias = "js")]
    JavaScript,
    /// TypeScript, transpiled and run in the JavaScript context.
    #[serde(alias = "ts")]
    TypeScript,
    /// GNU bash.
    #[serde(alias = "sh", alias = "shell")]
    Bash,
}

impl Language {
    /// Every language, in a stable order.
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::JavaScript,
        Language::TypeScript,
        Language::Bash,
    ];

    /// The canonical lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::TypeScript => "typescript",
            Language::Bash => "bash",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a language name runbox does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown language {0:?}: use one of python, javascript, typescript, bash")]
pub struct UnknownLanguage(pub String);

impl FromStr for Language {
    type Err = UnknownLanguage;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Ok(Language::Python),
            "javascript" | "js" | "node" | "nodejs" => Ok(Language::JavaScript),
            "typescript" | "ts" => Ok(Language::TypeScript),
            "bash" | "sh" | "shell" => Ok(Language::Bash),
            _ => Err(UnknownLanguage(s.to_owned())),
        }
    }
}

/// One piece of code to run in a sandbox.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// The language to run it in.
    pub language: Language,
    /// The source text.
    pub code: String,
    /// Wall-clock limit for this run. When it passes, the run is interrupted.
    pub timeout: Duration,
    /// Extra environment variables for this run only.
    pub env: BTreeMap<String, String>,
}

impl ExecRequest {
    /// A request with no extra environment.
    pub fn new(language: Language, code: impl Into<String>, timeout: Duration) -> Self {
        Self {
            language,
            code: code.into(),
            timeout,
            env: BTreeMap::new(),
        }
    }
}

/// A shell command line to run in a fresh shell (no state carried between commands).
#[derive(Debug, Clone)]
pub struct CommandRequest {
    /// The command line, run by `bash -c`.
    pub command: String,
    /// Working directory inside the sandbox (default: the sandbox's home, `/workspace`).
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit; when it passes the command's processes are stopped.
    pub timeout: Duration,
}

impl CommandRequest {
    /// A command with no extra environment, run in the sandbox's home.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: command.into(),
            cwd: None,
            env: BTreeMap::new(),
            timeout,
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Output as it arrives during a run, already decoded (invalid UTF-8 replaced) and cut at
/// character boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// Where it came from.
    pub stream: OutputStream,
    /// The text.
    pub text: String,
}

/// Receives output while a run is in progress. Called from the backend's I/O tasks: it must
/// not block.
pub type OutputSink = Arc<dyn Fn(OutputChunk) + Send + Sync>;

/// What a front end passes along with a request: where live output goes, and a token that
/// interrupts the run when cancelled.
#[derive(Clone, Default)]
pub struct ExecContext {
    /// Live output, if the caller wants it.
    pub output: Option<OutputSink>,
    /// Cancelling this interrupts the run as a timeout would.
    pub cancel: CancellationToken,
    /// The caller's own provider key, for a sandbox made for this run alone (see
    /// [`crate::SandboxSpec::credential`]).
    pub credential: Option<crate::Credential>,
}

impl fmt::Debug for ExecContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecContext")
            .field("output", &self.output.is_some())
            .field("cancel", &self.cancel.is_cancelled())
            .field("credential", &self.credential)
            .finish()
    }
}

impl ExecContext {
    /// A context that streams output to `sink`.
    pub fn streaming(sink: OutputSink) -> Self {
        Self {
            output: Some(sink),
            ..Self::default()
        }
    }
}

/// An uncaught error in the user's code, shaped like a notebook's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecError {
    /// The exception's class or kind (`ZeroDivisionError`, `TypeError`, `Timeout`, ...).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The formatted traceback, user frames only.
    pub traceback: String,
}

/// A rich result: the value of a cell's last expression or an explicit `display()`, as a
/// bundle of representations keyed by MIME type (`text/plain`, `text/html`, `image/png`
/// base64, `application/json`, ...), like a Jupyter `execute_result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RichResult {
    /// MIME type to representation.
    pub data: BTreeMap<String, serde_json::Value>,
    /// True for the value of the last expression, false for `display()` calls.
    pub is_main_result: bool,
}

impl RichResult {
    /// The `text/plain` representation, when there is one.
    pub fn text(&self) -> Option<&str> {
        self.data.get("text/plain").and_then(|v| v.as_str())
    }
}

/// What a run produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// Standard output (head and tail kept when over the cap).
    pub stdout: String,
    /// Standard error (head and tail kept when over the cap).
    pub stderr: String,
    /// Rich results, in the order they were produced.
    pub results: Vec<RichResult>,
    /// The uncaught error, if the code failed.
    pub error: Option<ExecError>,
    /// Exit status, for runs that are processes (bash). `None` for kernel cells.
    pub exit_code: Option<i32>,
    /// Wall-clock time of the run.
    #[serde(with = "duration_ms")]
    pub duration: Duration,
    /// Whether any output was cut to fit the cap.
    pub truncated: bool,
    /// Whether the run was interrupted because its timeout passed.
    pub timed_out: bool,
    /// Whether the run was interrupted because the caller cancelled it.
    pub cancelled: bool,
    /// Whether the kernel had to be killed and started afresh (state was lost).
    pub kernel_restarted: bool,
    /// Things the caller should know about this run, in plain words.
    pub notes: Vec<String>,
}

impl ExecOutcome {
    /// Whether the code ran to completion without an error or a failing exit status.
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
            && !self.timed_out
            && !self.cancelled
            && self.exit_code.is_none_or(|c| c == 0)
    }
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_names_and_aliases() {
        assert_eq!("Python".parse::<Language>(), Ok(Language::Python));
        assert_eq!("node".parse::<Language>(), Ok(Language::JavaScript));
        assert_eq!("ts".parse::<Language>(), Ok(Language::TypeScript));
        assert_eq!("sh".parse::<Language>(), Ok(Language::Bash));
        let err = "cobol".parse::<Language>().unwrap_err();
        assert!(err.to_string().contains("python, javascript"));
        for l in Language::ALL {
            assert_eq!(l.as_str().parse::<Language>(), Ok(l));
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(json, format!("\"{}\"", l.as_str()));
        }
    }

    #[test]
    fn success_means_no_error_no_timeout_and_zero_exit() {
        let ok = ExecOutcome::default();
        assert!(ok.succeeded());
        let failed_exit = ExecOutcome {
            exit_code: Some(3),
            ..Default::default()
        };
        assert!(!failed_exit.succeeded());
        let timed_out = ExecOutcome {
            timed_out: true,
            ..Default::default()
        };
        assert!(!timed_out.succeeded());
        let raised = ExecOutcome {
            error: Some(ExecError {
                name: "ValueError".into(),
                value: "x".into(),
                traceback: String::new(),
            }),
            ..Default::default()
        };
        assert!(!raised.succeeded());
    }

    #[test]
    fn outcome_serializes_duration_as_milliseconds() {
        let o = ExecOutcome {
            duration: Duration::from_millis(1500),
            ..Default::default()
        };
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["duration"], 1500);
    }
}

/// A package manager `install_packages` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageManager {
    /// Python packages, importable by the Python kernel and `python3`.
    Pip,
    /// Node packages, requirable by the JavaScript kernel and `node`.
    Npm,
}

impl std::fmt::Display for PackageManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pip => "pip",
            Self::Npm => "npm",
        })
    }
}

/// Packages to install in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRequest {
    /// Which package manager.
    pub manager: PackageManager,
    /// Package specifications (`name`, `name==1.2`, `name@^3`), each one argument of the
    /// package manager, never shell text.
    pub packages: Vec<String>,
    /// How long the install may take.
    pub timeout: std::time::Duration,
}
