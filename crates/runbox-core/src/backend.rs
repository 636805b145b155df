//! The backend trait.
//!
//! Backends are chosen at run time from configuration (local, e2b, ...), and the MCP layer
//! holds one as `Arc<dyn Backend>`: dynamic dispatch costs a pointer chase per call, which is
//! nothing beside starting a process, and keeps the front ends free of generics and lets
//! tests put a fake behind the same seam. `async_trait` makes the trait object-safe.

use async_trait::async_trait;

use crate::error::Error;
use crate::error::Result;
use crate::exec::{CommandRequest, ExecContext, ExecOutcome, ExecRequest, InstallRequest};
use crate::files::{FileContent, FileWritten, Listing};
use crate::process::{BackgroundActivity, ProcessId, ProcessInfo, ProcessOutput};
use crate::sandbox::{SandboxId, SandboxInfo, SandboxSpec, SandboxStatus};

/// A place where sandboxes live.
///
/// Errors the caller can act on (unknown id, unavailable language, a limit) come back as
/// [`crate::Error`] variants for which `is_caller_error` is true; failures of the code itself
/// (an exception, a non-zero exit, a timeout) are not errors but part of the
/// [`ExecOutcome`].
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A short name for logs and messages (`local`, `e2b`).
    fn name(&self) -> &'static str;

    /// Creates a sandbox and returns once it can run code.
    async fn create(&self, spec: SandboxSpec) -> Result<SandboxInfo>;

    /// Runs code in a sandbox, streaming output to `ctx.output` as it comes.
    async fn exec(&self, id: &SandboxId, req: ExecRequest, ctx: ExecContext)
    -> Result<ExecOutcome>;

    /// Runs a command line in a fresh shell in a sandbox (the outcome's `exit_code` is its
    /// status), streaming output to `ctx.output` as it comes.
    async fn command(
        &self,
        id: &SandboxId,
        req: CommandRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome>;

    /// Lists a directory of a sandbox (and, with `recursive`, everything below it).
    async fn list_files(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<Listing>;

    /// Reads up to `length` bytes (the backend's cap when `None`) of a file from `offset`.
    async fn read_file(
        &self,
        id: &SandboxId,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileContent>;

    /// Writes (or, with `append`, appends) `data` to a file, creating it and its parent
    /// directories as needed.
    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Vec<u8>,
        append: bool,
    ) -> Result<FileWritten>;

    /// The files under `/workspace`, to tell what a run created or changed (see
    /// [`crate::changes`]). A backend may skip bulky trees (package directories) and cap the
    /// listing lower than [`Backend::list_files`] does; by default it is that listing.
    async fn workspace_snapshot(&self, id: &SandboxId) -> Result<Listing> {
        self.list_files(id, "/workspace", true).await
    }

    /// Starts a command line in the background: it runs on after this returns, its output
    /// kept (up to a cap) for [`Backend::read_process`].
    async fn start_process(&self, id: &SandboxId, req: CommandRequest) -> Result<ProcessInfo> {
        let _ = (id, req);
        Err(self.unsupported("background processes"))
    }

    /// Output of a background process not read before, waiting up to `wait` for some to
    /// arrive or for the process to end.
    async fn read_process(
        &self,
        id: &SandboxId,
        process: &ProcessId,
        wait: std::time::Duration,
    ) -> Result<ProcessOutput> {
        let _ = (id, process, wait);
        Err(self.unsupported("background processes"))
    }

    /// Kills a background process and everything it started; returns once it has ended.
    async fn kill_process(&self, id: &SandboxId, process: &ProcessId) -> Result<ProcessInfo> {
        let _ = (id, process);
        Err(self.unsupported("background processes"))
    }

    /// Whether a background process of the sandbox runs now, or when the last one ended:
    /// the registry asks before it closes an idle sandbox that has had some. By default,
    /// from [`Backend::status`] (which cannot tell when a process ended).
    async fn background_activity(&self, id: &SandboxId) -> Result<BackgroundActivity> {
        let status = self.status(id).await?;
        Ok(if status.processes.iter().any(ProcessInfo::running) {
            BackgroundActivity::Running
        } else {
            BackgroundActivity::Ended(None)
        })
    }

    /// Installs packages where the sandbox's kernels and interpreters find them, through
    /// its network access; the outcome carries the package manager's log and status.
    async fn install(
        &self,
        id: &SandboxId,
        req: InstallRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome> {
        let _ = (id, req, ctx);
        Err(self.unsupported("package installs"))
    }

    /// The registry's idle timeout of a sandbox changed to `idle`: a backend whose provider
    /// keeps a timer of its own moves it past that. Nothing to do by default.
    async fn idle_timeout_changed(&self, id: &SandboxId, idle: std::time::Duration) -> Result<()> {
        let _ = (id, idle);
        Ok(())
    }

    /// Freezes (`true`) or thaws every process of a sandbox, state intact.
    async fn set_paused(&self, id: &SandboxId, paused: bool) -> Result<()> {
        let _ = (id, paused);
        Err(self.unsupported("pause and resume"))
    }

    /// The error for an operation this backend does not have.
    fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported {
            backend: self.name(),
            operation,
        }
    }

    /// Reports a sandbox's state and resource use.
    async fn status(&self, id: &SandboxId) -> Result<SandboxStatus>;

    /// Ends a sandbox and everything running in it.
    async fn close(&self, id: &SandboxId) -> Result<()>;

    /// Ends every sandbox of this backend (server shutdown).
    async fn shutdown(&self);
}
