//! Who a request comes from. Every sandbox belongs to the tenant that created it, and every
//! tool, resource and prompt sees only the caller's own: another tenant's sandbox is "not
//! found", exactly as an id that never existed.
//!
//! Over HTTP with authentication, the transport's auth layer puts the [`Caller`] it verified
//! into the request; [`RunboxServer`](crate::RunboxServer)'s `call_tool` hands it to the tool
//! as an `Extension<Caller>`. A request that carries none (stdio, or HTTP without
//! authentication) belongs to the server's one local tenant.

use rmcp::RoleServer;
use rmcp::service::RequestContext;

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

/// The caller of the request behind `ctx`: the one the HTTP auth layer verified, else
/// `default_tenant`.
pub(crate) fn caller_of(ctx: &RequestContext<RoleServer>, default_tenant: &str) -> Caller {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
        .unwrap_or_else(|| Caller::new(default_tenant))
}
