//! Who a request comes from. Every sandbox belongs to the tenant that created it, and every
//! tool, resource and prompt sees only the caller's own: another tenant's sandbox is "not
//! found", exactly as an id that never existed.
//!
//! Over HTTP with authentication, the auth layer ([`crate::auth`]) puts the [`Caller`] it
//! verified into the request's extensions, where each front finds it (the MCP front hands it
//! to every tool). A request that carries none (stdio, or HTTP without authentication)
//! belongs to the server's one local tenant.

/// The tenant a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant's name: from a token's entry, or a JWT's subject.
    pub tenant: String,
    /// How many requests a minute the tenant may send (HTTP only); `None`: the server's
    /// default.
    pub requests_per_minute: Option<u32>,
    /// The caller's own key for the backend's provider (`--auth passthrough`): sandboxes
    /// the caller creates are made with it. `None`: the backend's own.
    pub credential: Option<runbox_core::Credential>,
}

impl Caller {
    /// A caller acting for `tenant`, with the server's default rate.
    pub fn new(tenant: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            requests_per_minute: None,
            credential: None,
        }
    }
}
