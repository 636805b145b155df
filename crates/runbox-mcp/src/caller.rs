//! Who a request comes from: the [`Caller`] of the shared HTTP layer, which puts the one it
//! verified into the request; [`RunboxServer`](crate::RunboxServer)'s `call_tool` hands it to
//! the tool as an `Extension<Caller>`. A request that carries none (stdio, or HTTP without
//! authentication) belongs to the server's one local tenant.

use rmcp::RoleServer;
use rmcp::service::RequestContext;
pub use runbox_http::Caller;

/// The caller of the request behind `ctx`: the one the HTTP auth layer verified, else
/// `default_tenant`.
pub(crate) fn caller_of(ctx: &RequestContext<RoleServer>, default_tenant: &str) -> Caller {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
        .unwrap_or_else(|| Caller::new(default_tenant))
}
