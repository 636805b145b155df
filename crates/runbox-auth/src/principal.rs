//! Who a request acts for, once authenticated.

/// Per-tenant limits, set on tokens in the tokens file. `None` means no limit for this
/// tenant (the server's global limits still apply). When several tokens of one tenant set
/// the same limit, the smallest applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// The most sandboxes the tenant may hold at once.
    pub max_sandboxes: Option<u32>,
    /// The most runs the tenant may have executing at the same moment.
    pub max_concurrent_runs: Option<u32>,
    /// The most requests the tenant may make per minute.
    pub requests_per_minute: Option<u32>,
}

/// An authenticated caller: the tenant it acts for and that tenant's limits.
///
/// Sandboxes belong to a tenant, so two tokens with the same tenant see the same
/// sandboxes, and two tenants never see each other's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant: a token's `tenant` (1–64 characters of `[A-Za-z0-9._-]`), or a JWT's
    /// `sub` claim (any string of 1–256 characters without control characters, since it is
    /// chosen by the authorization server, not by runbox).
    pub tenant: String,
    /// The tenant's limits; always the defaults for JWTs.
    pub limits: TenantLimits,
    /// How the caller authenticated.
    pub via: AuthMethod,
}

/// How a [`Principal`] authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    /// A bearer token from the tokens file.
    Token {
        /// The token's name in the file (what `runbox token revoke` takes).
        name: String,
    },
    /// An OAuth 2.1 access token (a JWT) issued by the configured authorization server.
    Jwt,
}
