//! # runbox-mcp
//!
//! runbox's MCP surface: the tools (`server` for runs and sandboxes, `files` for the file
//! tools), their schemas and results (`types`), resources (`resources`: sandbox files and the
//! operator's data files), prompts (`prompts`), and the stdio and streamable HTTP
//! transports (the HTTP one a front of `runbox-http`, which authenticates, rate-limits and
//! serves it). It speaks only to `runbox_core` (the registry in front of a backend) and
//! never to a backend directly, so every tool answers in the same shape whatever the
//! backend. It owns the mapping from backend outcomes and errors to tool results
//! (`render`): failures a caller can act on are tool results with `isError`, never protocol
//! errors, and never silent empty answers.

mod audit;
mod budget;
mod caller;
mod completions;
mod files;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod jsonrpc;
mod lenient;
mod lifecycle;
mod logging;
mod outputs;
mod packages;
mod profiles;
mod prompts;
mod render;
mod resources;
mod server;
mod subscriptions;
mod tasks;
mod transport;
pub mod types;

pub use audit::AuditLog;
pub use budget::{DEFAULT_MESSAGE_LIMIT, MAX_MESSAGE_LIMIT, MIN_MESSAGE_LIMIT};
pub use caller::Caller;
pub use profiles::{Profile, UnknownProfile};
pub use resources::SANDBOX_FILE_TEMPLATE;
pub use server::{INSTRUCTIONS, PackageNetwork, RunboxServer, ServerSettings};
pub use tasks::TaskSettings;
pub use transport::{
    HttpOptions, MAX_REQUEST_BYTES, SessionLimits, TransportError, http_front, serve_stdio,
};
