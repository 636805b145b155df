//! Errors in the egress configuration: allowlist entries, address ranges and narrowing. The
//! proxy itself never fails with these; it answers each connection with an HTTP status.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can be wrong with an egress configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An allowlist entry is not `host`, `*.domain` or an IP literal, each with an optional
    /// `:port`.
    #[error(
        "invalid allowed host `{entry}`: {reason} (expected `example.org`, `*.example.org`, \
         or an IP address, each optionally followed by `:port`)"
    )]
    InvalidPattern {
        /// The entry as written.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A host name a client or the configuration gave is neither a DNS name nor an IP address.
    #[error("invalid host `{host}`: {reason}")]
    InvalidHost {
        /// The host as given.
        host: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A sandbox asked for a host the operator's allowlist does not cover.
    #[error(
        "allow_hosts entry `{requested}` is not covered by the operator's allowlist \
         (--allow-host): {allowed}"
    )]
    NotCovered {
        /// The requested entry, as written.
        requested: String,
        /// What the operator allows, for the message.
        allowed: String,
    },

    /// An address exception is neither an IP address nor a CIDR range.
    #[error(
        "invalid address range `{entry}`: expected an IP address or a CIDR range such as \
         10.1.0.0/16"
    )]
    InvalidAddressRange {
        /// The entry as written.
        entry: String,
    },
}
