//! # runbox-e2b
//!
//! runbox's remote backend for E2B-compatible cloud sandboxes (E2B, Novita, self-hosted
//! gateways): the REST control plane, envd (processes and files, over Connect RPC) and
//! the code interpreter's streaming `/execute`, spoken directly.

mod api;
mod backend;
mod config;
mod connect;
mod envd;
mod http;
mod interpreter;
mod proto;

pub use backend::{E2bBackend, SetupError};
pub use config::{
    DEFAULT_TEMPLATE, E2B_DOMAIN, E2bConfig, ENVD_PORT, INTERPRETER_PORT, NOVITA_DOMAIN, Provider,
};
