//! Authentication for runbox's HTTP transport.
//!
//! Two ways in, one result:
//!
//! - **Bearer tokens** ([`tokens`]): `runbox token add` writes a random `rbx_…` token's
//!   SHA-256 hash into a TOML file; [`TokenStore`] checks presented tokens against that file
//!   and notices edits (a `revoke`, a new token) on the next request, with no restart.
//! - **OAuth 2.1 access tokens** ([`jwt`]): runbox acts as a resource server. [`JwtValidator`]
//!   checks a JWT's signature against the authorization server's published keys (JWKS) and
//!   its issuer, audience and lifetime.
//!
//! Either way the caller ends up with a [`Principal`]: the tenant the request acts for, that
//! tenant's [`TenantLimits`], and how it authenticated. This crate has no HTTP server code;
//! the transport turns a missing or refused credential into a `401` itself.

mod error;
pub mod jwt;
mod principal;
pub mod tokens;

pub use error::AuthError;
pub use jwt::{JwtConfig, JwtError, JwtValidator, protected_resource_metadata};
pub use principal::{AuthMethod, Principal, TenantLimits};
pub use tokens::{
    NewToken, TokenEntry, TokenFile, TokenStore, add_token, default_token_path, revoke_token,
};
