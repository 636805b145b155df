//! What can stop a chat, each said plainly with what to do about it.

/// An error that ends a chat turn (or, before the chat starts, the command).
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// No API key for a hosted model API.
    #[error(
        "no API key for the model API at {base_url}: pass --api-key, or set OPENAI_API_KEY \
         (or NOVITA_API_KEY for Novita); a local server needs --base-url instead"
    )]
    NoApiKey { base_url: String },

    /// The model API could not be reached at all (refused, unknown host, timeout).
    #[error("cannot reach the model API at {base_url}: {reason}")]
    ModelUnreachable { base_url: String, reason: String },

    /// The model API refused the key (401 or 403).
    #[error(
        "the model API at {base_url} refused the API key (HTTP {status}): {message}\n\
         check --api-key, OPENAI_API_KEY or NOVITA_API_KEY"
    )]
    KeyRefused {
        base_url: String,
        status: u16,
        message: String,
    },

    /// The model API answered the request with an error status.
    #[error("the model API at {base_url} answered HTTP {status}: {message}{hint}")]
    ModelRejected {
        base_url: String,
        status: u16,
        message: String,
        hint: &'static str,
    },

    /// The model API's answer was cut off, or was not a chat completion.
    #[error("the model API at {base_url} {reason}")]
    ModelProtocol { base_url: String, reason: String },

    /// The MCP server could not be started or connected to.
    #[error("cannot connect to the MCP server at {target}: {reason}")]
    McpConnect { target: String, reason: String },

    /// The MCP server refused the bearer token.
    #[error("the MCP server at {target} refused the token: pass a valid one with --token")]
    McpAuth { target: String },
}

/// The innermost cause of an error, which is the readable part of an HTTP client's error
/// ("Connection refused (os error 111)" rather than "error sending request").
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
