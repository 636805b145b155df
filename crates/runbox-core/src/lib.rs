//! # runbox-core
//!
//! The seam between runbox's front ends (the MCP server, the `runbox run` CLI) and its
//! backends (the embedded local sandbox, remote clouds). It owns:
//!
//! - [`Backend`], the small trait every backend implements (create, exec, status, close);
//! - the backend-neutral request and outcome types ([`ExecRequest`], [`ExecOutcome`], ...);
//! - resource [`Limits`] and their validation;
//! - the [`Error`] type whose variants a front end can turn into messages a caller can act on;
//! - the [`Registry`]: which tenant owns which sandbox, idle expiry, and a warm pool, in
//!   front of any backend, with the [`Quotas`] that keep tenants from exhausting the host;
//! - the [`SandboxEvent`]s the registry publishes to each sandbox's owner (created,
//!   expired, kernel restarted, egress refused).
//!
//! It must never depend on a backend or on a protocol: no MCP type, no Linux syscall and no
//! HTTP client appears here. Data flows one way: a front end builds a request from its
//! protocol, a backend answers with an outcome, the front end renders it.

mod backend;
pub mod capture;
mod credential;
mod error;
pub mod events;
mod exec;
mod files;
mod limits;
mod process;
mod quota;
mod registry;
mod sandbox;

pub use backend::Backend;
pub use credential::Credential;
pub use error::{Error, Result, chain};
pub use events::{EventKind, SandboxEvent};
pub use exec::{
    CommandRequest, ExecContext, ExecError, ExecOutcome, ExecRequest, InstallRequest, Language,
    OutputChunk, OutputSink, OutputStream, PackageManager, RichResult,
};
pub use files::{Changes, FileContent, FileEntry, FileKind, FileWritten, Listing, changes};
pub use limits::{Enforced, EnforcedLimits, Limits, LimitsError, Scope};
pub use process::{BackgroundActivity, ProcessId, ProcessInfo, ProcessOutput};
pub use quota::{Limit, QuotaLookup, Quotas, TenantQuota};
pub use registry::{
    Census, CreateRequest, MAX_CHANGES, Ran, Registry, RegistryConfig, SandboxView, Work,
};
pub use sandbox::{Network, SandboxId, SandboxInfo, SandboxSpec, SandboxState, SandboxStatus};
