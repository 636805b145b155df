//! # runbox-mcp
//!
//! runbox's MCP surface: the tools, their schemas and results, and the stdio and streamable
//! HTTP transports. It speaks only to `runbox_core` (the registry in front of a backend) and
//! never to a backend directly, so every tool answers in the same shape whatever the
//! backend. It owns the mapping from backend outcomes and errors to tool results
//! (`render`): failures a caller can act on are tool results with `isError`, never protocol
//! errors, and never silent empty answers.

mod render;
mod server;
mod transport;
pub mod types;

pub use server::{INSTRUCTIONS, RunboxServer, ServerSettings};
pub use transport::{HttpOptions, TransportError, http_app, serve_http, serve_stdio};
