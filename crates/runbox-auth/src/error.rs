//! Errors about the tokens file and the authentication configuration.

use std::io;
use std::path::PathBuf;

/// A problem with the tokens file or with the authentication configuration.
///
/// Messages name the file (and the line, for syntax problems) so that they can be shown to
/// an operator as they are.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The tokens file exists but could not be read.
    #[error("cannot read tokens file {}: {source}", path.display())]
    Read {
        /// The tokens file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The tokens file is not valid: bad TOML, an unknown field, an invalid name, a
    /// duplicate.
    #[error("tokens file {}{}: {message}", path.display(), line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Parse {
        /// The tokens file.
        path: PathBuf,
        /// The 1-based line the problem is on, when known.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The tokens file (or its folder, lock file or temporary file) could not be written.
    #[error("cannot write tokens file {}: {source}", path.display())]
    Write {
        /// The file or folder that could not be written.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A token name or tenant is not 1–64 characters of `[A-Za-z0-9._-]`.
    #[error(
        "invalid {what} {value:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-'"
    )]
    InvalidName {
        /// `"name"` or `"tenant"`.
        what: &'static str,
        /// The value given.
        value: String,
    },
    /// `add` was given a name that is already in the file.
    #[error("a token named {0:?} already exists; revoke it first or choose another name")]
    DuplicateName(String),
    /// `revoke` was given a name that is not in the file.
    #[error("no token named {0:?}")]
    UnknownName(String),
    /// The operating system's random number generator failed.
    #[error("cannot generate a random token: {0}")]
    Random(String),
    /// No tokens file location could be worked out from the environment.
    #[error("cannot locate the tokens file: set RUNBOX_TOKENS, XDG_CONFIG_HOME or HOME")]
    NoTokenPath,
    /// The JWT configuration is unusable (for example an `http://` issuer that is not on
    /// loopback).
    #[error("invalid OAuth configuration: {0}")]
    InvalidConfig(String),
    /// The HTTP client used to fetch the authorization server's keys could not be built.
    #[error("cannot set up the HTTP client for the authorization server: {0}")]
    Http(String),
}
