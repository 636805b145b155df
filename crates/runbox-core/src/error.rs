//! Errors a backend reports. Each variant names what failed and carries the context a caller
//! needs to act; the front end decides how to render it (a tool result with `isError`, an exit
//! status, a log line).

use crate::exec::Language;

/// Result alias used across runbox's library crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Boxed source error, so backend-specific error types never leak through this crate.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything a backend can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The id does not name a live sandbox of this backend (never existed, closed or expired).
    #[error("sandbox {id} not found: it never existed, was closed, or expired")]
    SandboxNotFound {
        /// The id the caller gave.
        id: String,
    },

    /// The id does not name a background process of the sandbox.
    #[error("process {id} not found in this sandbox; get_sandbox_status lists its processes")]
    ProcessNotFound {
        /// The id the caller gave.
        id: String,
    },

    /// A path given to a file operation names nothing in the sandbox.
    #[error("{path}: no such file or directory")]
    FileNotFound {
        /// The path, as the sandbox sees it.
        path: String,
    },

    /// The language is known but cannot run here (interpreter missing on this host, say).
    #[error("{language} is not available: {reason}")]
    LanguageUnavailable {
        /// The language asked for.
        language: Language,
        /// Why it cannot run.
        reason: String,
    },

    /// The request itself is wrong and will fail again unchanged.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// A configured limit stops the request (too many sandboxes, code too large, ...).
    #[error("limit reached: {0}")]
    LimitReached(String),

    /// A quota stops the request: the tenant, or the server as a whole, holds as many
    /// sandboxes or runs as it may. Retrying once some have ended can succeed.
    #[error("limit reached: {message}")]
    Quota {
        /// Which limit.
        limit: crate::quota::Limit,
        /// What was hit and what to do, for a human.
        message: String,
    },

    /// The sandbox could not be created, or broke while in use.
    #[error("sandbox failure: {message}")]
    Sandbox {
        /// What went wrong, for a human.
        message: String,
        /// The underlying cause, when there is one.
        #[source]
        source: Option<Source>,
    },

    /// The backend does not offer this operation.
    #[error("the {backend} backend does not support {operation}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The operation asked for.
        operation: &'static str,
    },
}

impl Error {
    /// A sandbox failure with a message and no underlying cause.
    pub fn sandbox(message: impl Into<String>) -> Self {
        Self::Sandbox {
            message: message.into(),
            source: None,
        }
    }

    /// A sandbox failure caused by `source`.
    pub fn sandbox_caused_by(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Sandbox {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The id of a sandbox that does not exist.
    pub fn not_found(id: impl std::fmt::Display) -> Self {
        Self::SandboxNotFound { id: id.to_string() }
    }

    /// Whether the caller can fix this by changing the request (as opposed to an
    /// infrastructure failure).
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            Self::SandboxNotFound { .. }
                | Self::ProcessNotFound { .. }
                | Self::FileNotFound { .. }
                | Self::LanguageUnavailable { .. }
                | Self::InvalidRequest(_)
                | Self::LimitReached(_)
                | Self::Quota { .. }
                | Self::Unsupported { .. }
        )
    }
}

/// An error and its causes, `: `-separated, for logs and messages.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_tell_the_caller_what_to_do() {
        let e = Error::not_found("sbx_123");
        assert!(e.to_string().contains("sbx_123"));
        assert!(e.to_string().contains("expired"), "{e}");
        assert!(e.is_caller_error());
        assert!(!Error::sandbox("boom").is_caller_error());
    }

    #[test]
    fn chains_list_every_cause() {
        let e = Error::sandbox_caused_by("could not start", std::io::Error::other("no memory"));
        assert_eq!(chain(&e), "sandbox failure: could not start: no memory");
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::other("disk on fire");
        let e = Error::sandbox_caused_by("mount failed", io);
        let src = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(src.as_deref(), Some("disk on fire"));
    }
}
