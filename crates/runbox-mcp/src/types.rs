//! Arguments and structured results of the tools: the MCP contract. Input and output schemas
//! are generated from these types, never written by hand.
//!
//! Integers are `i64` and fractions `f64` on purpose: schemars marks unsigned integers with
//! non-standard formats (`uint64`) that JSON-Schema validators in clients warn about.

use std::collections::BTreeMap;

use std::str::FromStr;

use runbox_core::{FileKind, Language, Ran};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::lenient;

/// A language code can run in.
// Arguments name it in any case and by the usual aliases (`Python`, `py`, `js`, `node`,
// `ts`, `sh`); the schema lists only the canonical names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LanguageArg {
    /// Python 3, in a persistent kernel with notebook semantics.
    #[default]
    Python,
    /// JavaScript (Node.js), in a persistent context with top-level await.
    Javascript,
    /// TypeScript, run in the JavaScript context.
    Typescript,
    /// bash; exported variables and the working directory persist between calls.
    Bash,
}

impl FromStr for LanguageArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Language>()
            .map(language_arg)
            .map_err(|e| e.to_string())
    }
}

impl<'de> Deserialize<'de> for LanguageArg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::from_name(d)
    }
}

impl From<LanguageArg> for Language {
    fn from(l: LanguageArg) -> Self {
        match l {
            LanguageArg::Python => Language::Python,
            LanguageArg::Javascript => Language::JavaScript,
            LanguageArg::Typescript => Language::TypeScript,
            LanguageArg::Bash => Language::Bash,
        }
    }
}

/// Arguments of `run_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The code to run. In python and javascript the value of the last expression is
    /// returned, as in a notebook.
    pub code: String,
    /// The language (default python).
    #[serde(default)]
    pub language: LanguageArg,
    /// The sandbox to run in, from create_sandbox; state (variables, files) persists there
    /// between calls. Omit it to run in a fresh sandbox that is closed afterwards.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Seconds before the run is interrupted (default 60; at most the server's maximum).
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub timeout_seconds: Option<f64>,
    /// Extra environment variables for this run only.
    #[serde(default, deserialize_with = "lenient::string_map")]
    pub env: BTreeMap<String, String>,
}

/// Arguments of `run_command`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// A shell command line, run with `bash -c` in a fresh shell.
    pub command: String,
    /// The sandbox to run in; omit it to use a fresh sandbox closed afterwards.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Working directory (absolute, default /workspace).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default, deserialize_with = "lenient::string_map")]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is stopped (default 60; at most the server's maximum).
    /// Not for background commands, which run until they end or are killed.
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub timeout_seconds: Option<f64>,
    /// Start it in the background and answer at once with its process_id (needs
    /// sandbox_id); read its output with read_process_output, stop it with kill_process.
    #[serde(default, deserialize_with = "lenient::bool")]
    pub background: bool,
}

/// Arguments of `create_sandbox`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxArgs {
    /// Seconds the sandbox may stay idle before it is closed automatically (default 900).
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub timeout_seconds: Option<f64>,
    /// Environment variables every process in the sandbox starts with.
    #[serde(default, deserialize_with = "lenient::string_map")]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned by list_sandboxes.
    #[serde(default, deserialize_with = "lenient::string_map")]
    pub metadata: BTreeMap<String, String>,
    /// none (default): no network at all. allowlist: HTTP and HTTPS through the server's
    /// egress proxy, to the hosts the server allows (package indexes by default), so
    /// install_packages, pip and npm work.
    #[serde(default)]
    pub network: NetworkArg,
    /// With network allowlist: only these of the server's hosts (default: all of them).
    #[serde(default, deserialize_with = "lenient::string_list")]
    pub allow_hosts: Vec<String>,
}

/// Network access of a new sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkArg {
    /// No network.
    #[default]
    None,
    /// Allowlisted hosts through the egress proxy.
    Allowlist,
}

impl FromStr for NetworkArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Self::None),
            "allowlist" => Ok(Self::Allowlist),
            _ => Err(format!("unknown network {s:?}: use none or allowlist")),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkArg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::from_name(d)
    }
}

/// Arguments naming one sandbox.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox's id, from create_sandbox or list_sandboxes.
    pub sandbox_id: String,
}

/// An uncaught error of the code.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorOut {
    /// Its class or kind (ZeroDivisionError, TypeError, KernelDied, ...).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback, user frames only.
    pub traceback: String,
}

/// A rich result: the last expression's value or a display() call.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ResultOut {
    /// Representations by MIME type (text/plain, text/html, image/png as base64, ...).
    pub data: BTreeMap<String, serde_json::Value>,
    /// True for the value of the last expression.
    pub is_main_result: bool,
}

/// Result of `run_code`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunCodeOutput {
    /// The sandbox the code ran in.
    pub sandbox_id: String,
    /// Whether that sandbox was made for this run and is now closed.
    pub ephemeral: bool,
    /// Standard output (head and tail kept when over the cap).
    pub stdout: String,
    /// Standard error (head and tail kept when over the cap).
    pub stderr: String,
    /// Rich results, in order.
    pub results: Vec<ResultOut>,
    /// The uncaught error, if the code failed.
    pub error: Option<ErrorOut>,
    /// Exit status, for bash.
    pub exit_code: Option<i64>,
    /// Wall-clock time of the run in milliseconds.
    pub duration_ms: i64,
    /// Whether output was cut to fit the cap.
    pub truncated: bool,
    /// Whether the timeout interrupted the run.
    pub timed_out: bool,
    /// Whether the caller cancelled the run.
    pub cancelled: bool,
    /// Whether the kernel was lost and its state with it.
    pub kernel_restarted: bool,
    /// Files under /workspace the run created or changed (at most 20; in a sandbox from
    /// create_sandbox only), also sent as resource links.
    pub files: Vec<ChangedFileOut>,
    /// Things to know about this run.
    pub notes: Vec<String>,
}

/// Result of `run_command`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunCommandOutput {
    /// The sandbox the command ran in.
    pub sandbox_id: String,
    /// Whether that sandbox was made for this command and is now closed.
    pub ephemeral: bool,
    /// Standard output (head and tail kept when over the cap).
    pub stdout: String,
    /// Standard error (head and tail kept when over the cap).
    pub stderr: String,
    /// Exit status (128 + the signal number when a signal ended it); null for a command
    /// started in the background.
    pub exit_code: Option<i64>,
    /// The background process, with `background: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_id: Option<String>,
    /// Wall-clock time in milliseconds.
    pub duration_ms: i64,
    /// Whether output was cut to fit the cap.
    pub truncated: bool,
    /// Whether the timeout stopped the command.
    pub timed_out: bool,
    /// Whether the caller cancelled it.
    pub cancelled: bool,
    /// Files under /workspace the command created or changed (at most 20; in a sandbox
    /// from create_sandbox only), also sent as resource links.
    pub files: Vec<ChangedFileOut>,
    /// Things to know about this command.
    pub notes: Vec<String>,
}

/// A file a run created or changed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ChangedFileOut {
    /// Its path in the sandbox.
    pub path: String,
    /// Its size in bytes.
    pub size: i64,
    /// The resource that reads it (sandbox://{sandbox_id}/files/{path}).
    pub uri: String,
    /// Its MIME type, guessed from the name.
    pub mime_type: String,
}

/// Resource limits of a sandbox.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LimitsOut {
    /// Memory, swap and files in /workspace and /tmp included, in MiB.
    pub memory_mb: i64,
    /// Processes and threads at once.
    pub pids: i64,
    /// CPU, in cores.
    pub cpus: f64,
    /// Size of /workspace in MiB.
    pub workspace_mb: i64,
    /// Size of /tmp in MiB.
    pub tmp_mb: i64,
    /// Output kept per stream per run, in bytes.
    pub output_bytes: i64,
}

impl From<&runbox_core::Limits> for LimitsOut {
    fn from(l: &runbox_core::Limits) -> Self {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Self {
            memory_mb: i(l.memory_mb),
            pids: i64::from(l.pids),
            cpus: l.cpus,
            workspace_mb: i(l.workspace_mb),
            tmp_mb: i(l.tmp_mb),
            output_bytes: i(l.output_bytes as u64),
        }
    }
}

/// Result of `create_sandbox`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CreateSandboxOutput {
    /// Pass it to run_code, run_command and the other tools.
    pub sandbox_id: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it closes if left idle (RFC 3339); every call resets the clock.
    pub expires_at: String,
    /// Idle life in seconds.
    pub timeout_seconds: f64,
    /// Its limits.
    pub limits: LimitsOut,
    /// Languages it can run.
    pub languages: Vec<LanguageArg>,
    /// Network access: none, or allowlist.
    pub network: String,
    /// The hosts it may reach (with network allowlist).
    pub allowed_hosts: Vec<String>,
    /// Labels given at creation.
    pub metadata: BTreeMap<String, String>,
}

/// One sandbox in `list_sandboxes`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SandboxSummary {
    /// Its id.
    pub sandbox_id: String,
    /// running.
    pub state: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it closes if left idle (RFC 3339).
    pub expires_at: String,
    /// Idle life in seconds.
    pub timeout_seconds: f64,
    /// Whether code is running in it now.
    pub busy: bool,
    /// Labels given at creation.
    pub metadata: BTreeMap<String, String>,
}

/// Result of `list_sandboxes`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListSandboxesOutput {
    /// The caller's sandboxes, oldest first.
    pub sandboxes: Vec<SandboxSummary>,
}

/// One limit that holds in a sandbox.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnforcedOut {
    /// The value: bytes for memory, a count for processes.
    pub value: i64,
    /// What it applies to: sandbox (all its processes together) or process (each one on its
    /// own).
    pub per: String,
    /// What enforces it (a cgroup controller, an rlimit, the provider's VM).
    pub by: String,
}

/// The limits that actually hold in a sandbox; null where nothing enforces one.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnforcedLimitsOut {
    /// Memory, in bytes.
    pub memory: Option<EnforcedOut>,
    /// Processes and threads alive at once.
    pub processes: Option<EnforcedOut>,
    /// CPU for the whole sandbox, in cores.
    pub cpus: Option<f64>,
}

impl From<&runbox_core::EnforcedLimits> for EnforcedLimitsOut {
    fn from(e: &runbox_core::EnforcedLimits) -> Self {
        let one = |x: &runbox_core::Enforced| EnforcedOut {
            value: i64::try_from(x.value).unwrap_or(i64::MAX),
            per: match x.per {
                runbox_core::Scope::Sandbox => "sandbox",
                runbox_core::Scope::Process => "process",
            }
            .to_owned(),
            by: x.by.clone(),
        };
        Self {
            memory: e.memory.as_ref().map(one),
            processes: e.processes.as_ref().map(one),
            cpus: e.cpus,
        }
    }
}

/// Result of `get_sandbox_status`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SandboxStatusOutput {
    /// Its id.
    pub sandbox_id: String,
    /// running.
    pub state: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it closes if left idle (RFC 3339).
    pub expires_at: String,
    /// Idle life in seconds.
    pub timeout_seconds: f64,
    /// Whether code is running in it now.
    pub busy: bool,
    /// Memory in use now, bytes (when measurable).
    pub memory_bytes: Option<i64>,
    /// The memory limit of the sandbox as a whole, bytes; null when none holds (see
    /// enforced_limits).
    pub memory_limit_bytes: Option<i64>,
    /// CPU time used so far, seconds (when measurable).
    pub cpu_seconds: Option<f64>,
    /// Processes and threads alive now (when measurable).
    pub processes: Option<i64>,
    /// Languages with a running kernel.
    pub kernels: Vec<LanguageArg>,
    /// Background processes started with run_command, running or ended.
    pub background_processes: Vec<ProcessOut>,
    /// The limits asked for.
    pub limits: LimitsOut,
    /// Those that actually hold, and how (null where none does).
    pub enforced_limits: EnforcedLimitsOut,
}

/// A background process.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProcessOut {
    /// Its id in the sandbox.
    pub process_id: String,
    /// The command line.
    pub command: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit code once ended (128 + the signal for a killed one).
    pub exit_code: Option<i64>,
}

impl From<&runbox_core::ProcessInfo> for ProcessOut {
    fn from(p: &runbox_core::ProcessInfo) -> Self {
        Self {
            process_id: p.id.to_string(),
            command: p.command.clone(),
            started_at: crate::render::rfc3339(p.started_at),
            running: p.running(),
            exit_code: p.exit_code.map(i64::from),
        }
    }
}

/// Arguments naming a background process.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Its id, from run_command with background: true.
    pub process_id: String,
}

/// Arguments of `read_process_output`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadProcessArgs {
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Its id, from run_command with background: true.
    pub process_id: String,
    /// Seconds to wait for new output or for the end when there is none yet (default 0,
    /// at most 60).
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub wait_seconds: Option<f64>,
}

/// Result of `read_process_output`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProcessOutputOut {
    /// The process.
    pub process_id: String,
    /// Standard output written since the last read.
    pub stdout: String,
    /// Standard error written since the last read.
    pub stderr: String,
    /// Whether it still runs, or output of it waits to be read (a read returns as much as
    /// fits in one answer).
    pub running: bool,
    /// Its exit code once ended and all its output read.
    pub exit_code: Option<i64>,
    /// Unread bytes dropped since the last read (the oldest go once 1 MiB is waiting).
    pub dropped_bytes: i64,
}

/// Result of `kill_process`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KillProcessOutput {
    /// The process, now ended.
    pub process_id: String,
    /// Its exit code (137 when the kill ended it).
    pub exit_code: Option<i64>,
}

/// Arguments of `set_sandbox_timeout`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeoutArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Seconds it may now stay idle, counted from now (at most the server's maximum).
    #[serde(deserialize_with = "lenient::f64")]
    pub timeout_seconds: f64,
}

/// Result of `pause_sandbox`, `resume_sandbox` and `set_sandbox_timeout`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LifecycleOutput {
    /// The sandbox.
    pub sandbox_id: String,
    /// running or paused.
    pub state: String,
    /// When it closes if left idle (RFC 3339); while paused, when it closes unless resumed
    /// (the idle clock stands still, the server's pause timeout does not).
    pub expires_at: String,
    /// Idle life in seconds.
    pub timeout_seconds: f64,
}

/// Result of `close_sandbox`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CloseSandboxOutput {
    /// The closed sandbox.
    pub sandbox_id: String,
    /// Always true: it and everything running in it are gone.
    pub closed: bool,
}

/// Arguments of `list_files`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// A directory (or file) in /workspace, /tmp or /data; relative paths start at
    /// /workspace (default /workspace).
    #[serde(default)]
    pub path: Option<String>,
    /// List everything below the directory too (default false).
    #[serde(default, deserialize_with = "lenient::bool")]
    pub recursive: bool,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileTypeOut {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed by list_files).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl From<FileKind> for FileTypeOut {
    fn from(k: FileKind) -> Self {
        match k {
            FileKind::File => Self::File,
            FileKind::Directory => Self::Directory,
            FileKind::Symlink => Self::Symlink,
            FileKind::Other => Self::Other,
        }
    }
}

/// One entry of a listing.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileEntryOut {
    /// Its name.
    pub name: String,
    /// Its absolute path in the sandbox.
    pub path: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: FileTypeOut,
    /// Size in bytes.
    pub size: i64,
    /// Last modification (RFC 3339).
    pub modified: String,
}

/// Result of `list_files`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListFilesOutput {
    /// The path listed.
    pub path: String,
    /// The entries, each directory before its contents, names in order.
    pub entries: Vec<FileEntryOut>,
    /// Whether entries were left out (more than 10000, or more than fit in one answer).
    pub truncated: bool,
}

/// How file content is carried in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub enum Encoding {
    /// Text, UTF-8.
    #[serde(rename = "utf-8")]
    Utf8,
    /// Any bytes, as standard base64.
    #[serde(rename = "base64")]
    Base64,
}

impl FromStr for Encoding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "utf-8" | "utf8" | "text" => Ok(Self::Utf8),
            "base64" | "b64" => Ok(Self::Base64),
            _ => Err(format!("unknown encoding {s:?}: use utf-8 or base64")),
        }
    }
}

impl<'de> Deserialize<'de> for Encoding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::from_name(d)
    }
}

/// Arguments of `read_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// The file, in /workspace, /tmp or /data; relative paths start at /workspace.
    pub path: String,
    /// utf-8 or base64. Without it, text comes back as utf-8 and anything else as base64.
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Byte offset to start at (default 0).
    #[serde(default, deserialize_with = "lenient::opt_i64")]
    pub offset: Option<i64>,
    /// Most bytes to read (default and maximum: what fits in one answer, 256 KiB with the
    /// default message limit).
    #[serde(default, deserialize_with = "lenient::opt_i64")]
    pub length: Option<i64>,
}

/// Result of `read_file`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReadFileOutput {
    /// The file's absolute path in the sandbox.
    pub path: String,
    /// The bytes read, in `encoding`; empty for a whole image, whose bytes come once, as
    /// image content.
    pub content: String,
    /// utf-8 or base64.
    pub encoding: Encoding,
    /// Where the bytes read start.
    pub offset: i64,
    /// How many bytes were read (the next part starts at offset + length).
    pub length: i64,
    /// The file's whole size in bytes.
    pub size: i64,
    /// Whether bytes remain after those read.
    pub more: bool,
    /// Its MIME type, guessed from the name.
    pub mime_type: String,
    /// The resource that reads the file (sandbox://{sandbox_id}/files/{path}).
    pub uri: String,
}

/// Arguments of `write_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// The file, in /workspace or /tmp; relative paths start at /workspace. Missing parent
    /// directories are created.
    pub path: String,
    /// The content, in `encoding`.
    pub content: String,
    /// utf-8 (default) or base64 (for binary files).
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Add to the end of the file instead of replacing it (default false).
    #[serde(default, deserialize_with = "lenient::bool")]
    pub append: bool,
}

/// Result of `write_file`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WriteFileOutput {
    /// The file's absolute path in the sandbox.
    pub path: String,
    /// Bytes written by this call.
    pub bytes_written: i64,
    /// The file's size now.
    pub size: i64,
    /// The resource that reads it.
    pub uri: String,
}

pub(crate) fn language_arg(l: Language) -> LanguageArg {
    match l {
        Language::Python => LanguageArg::Python,
        Language::JavaScript => LanguageArg::Javascript,
        Language::TypeScript => LanguageArg::Typescript,
        Language::Bash => LanguageArg::Bash,
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn changed_files(ran: &Ran, notes: &mut Vec<String>) -> Vec<ChangedFileOut> {
    let Some(changes) = &ran.changes else {
        return Vec::new();
    };
    if changes.omitted > 0 {
        notes.push(format!(
            "{} more files changed under /workspace; list_files shows them",
            changes.omitted
        ));
    }
    changes
        .files
        .iter()
        .map(|f| ChangedFileOut {
            path: f.path.clone(),
            size: i64::try_from(f.size).unwrap_or(i64::MAX),
            uri: crate::resources::sandbox_file_uri(&ran.sandbox_id, &f.path),
            mime_type: crate::resources::mime_type(&f.path),
        })
        .collect()
}

pub(crate) fn run_code_output(ran: Ran) -> RunCodeOutput {
    let mut notes = ran.outcome.notes.clone();
    let files = changed_files(&ran, &mut notes);
    let o = ran.outcome;
    RunCodeOutput {
        sandbox_id: ran.sandbox_id.to_string(),
        ephemeral: ran.ephemeral,
        stdout: o.stdout,
        stderr: o.stderr,
        results: o
            .results
            .into_iter()
            .map(|r| ResultOut {
                data: r.data,
                is_main_result: r.is_main_result,
            })
            .collect(),
        error: o.error.map(|e| ErrorOut {
            name: e.name,
            value: e.value,
            traceback: e.traceback,
        }),
        exit_code: o.exit_code.map(i64::from),
        duration_ms: millis(o.duration),
        truncated: o.truncated,
        timed_out: o.timed_out,
        cancelled: o.cancelled,
        kernel_restarted: o.kernel_restarted,
        files,
        notes,
    }
}

pub(crate) fn run_command_output(ran: Ran) -> RunCommandOutput {
    let mut notes = ran.outcome.notes.clone();
    let files = changed_files(&ran, &mut notes);
    let o = ran.outcome;
    RunCommandOutput {
        sandbox_id: ran.sandbox_id.to_string(),
        ephemeral: ran.ephemeral,
        stdout: o.stdout,
        stderr: o.stderr,
        exit_code: Some(i64::from(o.exit_code.unwrap_or(-1))),
        process_id: None,
        duration_ms: millis(o.duration),
        truncated: o.truncated,
        timed_out: o.timed_out,
        cancelled: o.cancelled,
        files,
        notes,
    }
}

/// Arguments of `install_packages`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallPackagesArgs {
    /// The sandbox, created with network "allowlist".
    pub sandbox_id: String,
    /// Package names, optionally with versions or extras (numpy, requests==2.32,
    /// lodash@4); each is one argument of the package manager.
    #[serde(deserialize_with = "lenient::string_list")]
    pub packages: Vec<String>,
    /// pip (default; Python packages for run_code and python3) or npm (Node packages,
    /// installed in /workspace/node_modules).
    #[serde(default)]
    pub manager: ManagerArg,
    /// Seconds the install may take (default 300, at most the server's run maximum).
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub timeout_seconds: Option<f64>,
}

/// A package manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ManagerArg {
    /// Python packages.
    #[default]
    Pip,
    /// Node packages.
    Npm,
}

impl FromStr for ManagerArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pip" | "pip3" | "python" => Ok(Self::Pip),
            "npm" | "node" | "javascript" => Ok(Self::Npm),
            _ => Err(format!("unknown manager {s:?}: use pip or npm")),
        }
    }
}

impl<'de> Deserialize<'de> for ManagerArg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::from_name(d)
    }
}

/// Result of `install_packages`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InstallPackagesOutput {
    /// The sandbox.
    pub sandbox_id: String,
    /// pip or npm.
    pub manager: ManagerArg,
    /// The packages asked for.
    pub packages: Vec<String>,
    /// The package manager's exit status: 0 when everything was installed.
    pub exit_code: i64,
    /// Its standard output (head and tail kept when over the cap).
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Wall-clock time in milliseconds.
    pub duration_ms: i64,
    /// Whether the timeout stopped it.
    pub timed_out: bool,
}
