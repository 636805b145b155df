//! # runbox-http
//!
//! The HTTP layer every HTTP front of runbox mounts in, so that each front (the MCP
//! endpoint, an E2B-compatible REST API, ...) contributes only its own routes and gets the
//! same guards and the same observability:
//!
//! - **Who calls** ([`Caller`], [`auth`]): a bearer token, or a front's own key header (an
//!   E2B-style `X-API-KEY`), verified by the operator's [`Authenticator`], becomes the
//!   request's [`Caller`] (its tenant); a missing or refused token gets `401`.
//! - **How often** ([`auth`]): each tenant's requests in a token bucket; past its rate `429`.
//! - **How many connections** ([`listener`]): runbox's own accept loop over hyper caps
//!   connections (all together and per peer address) and times out slow and idle ones.
//! - **What is going on** ([`Metrics`]): the server's Prometheus metrics, fed by every front
//!   and transport, served at `/metrics`; `/healthz` says the server is up and how many
//!   sandboxes it holds ([`Status`]).
//!
//! The binary builds the [`Shared`] settings, asks each front for its [`Front`], and serves
//! [`app`] with [`serve`]. What belongs to one protocol stays with its front: the MCP front
//! (`runbox-mcp`) keeps its sessions, its JSON-RPC request gate, and the `Host` and `Origin`
//! checks of `/mcp`.

pub mod auth;
mod body;
mod caller;
mod front;
mod listener;
mod metrics;

pub use auth::{AuthFailure, Authenticator, HttpAuth, RESOURCE_METADATA_PREFIX};
pub use body::HeldBody;
pub use caller::Caller;
pub use front::{Front, Shared, Status, app, serve};
pub use listener::ConnectionLimits;
pub use metrics::{Metrics, Rejection, RunOutcome};
