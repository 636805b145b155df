//! # runbox-local
//!
//! The embedded default backend: sandboxes on this machine, no daemon, milliseconds to
//! start. It owns what runs *inside* a sandbox and nothing about how a sandbox is isolated
//! (that is `runbox-jail`):
//!
//! - [`layout`](crate::layout): the sandbox's filesystem and restrictions as a jail spec;
//! - [`runtime`]: the host's interpreters, found once;
//! - `kernel`: persistent Python and JavaScript kernels (drivers in `kernels/`, embedded
//!   at build time) and bash runs that keep exported variables and the working directory;
//! - `output`: capped capture, live streaming, end-of-run markers.
//!
//! Code never runs outside a jail here: every process is started by a sandbox's init.

mod backend;
mod files;
mod kernel;
mod layout;
mod output;
mod process;
pub mod runtime;
mod sandbox;
mod transpile;

pub use backend::{Diagnostics, Egress, EgressConfig, EgressEventSink, LocalBackend, LocalConfig};
#[cfg(feature = "fuzzing")]
pub use files::fuzzing;
pub use runtime::{Interpreter, InterpreterPaths, Runtime};
