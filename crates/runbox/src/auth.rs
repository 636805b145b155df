//! The server's authentication: runbox's own tokens (a tokens file, reloaded when it
//! changes) and OAuth access tokens (JWTs of one issuer), behind the HTTP transport's
//! [`Authenticator`]. Each token stands for a tenant; a token's limits in the file become
//! that tenant's quotas.

use std::sync::Arc;

use anyhow::Context;
use runbox_auth::{JwtConfig, JwtValidator, Principal, TokenStore};
use runbox_core::{QuotaLookup, TenantQuota};
use runbox_mcp::{AuthFailure, Authenticator, Caller, HttpAuth};

use crate::config::AuthConfig;

/// Verifies tokens against the tokens file, then the OAuth issuer.
struct ServerAuth {
    tokens: Option<Arc<TokenStore>>,
    jwt: Option<JwtValidator>,
}

fn caller(p: Principal) -> Caller {
    Caller {
        tenant: p.tenant,
        requests_per_minute: p.limits.requests_per_minute,
        credential: None,
    }
}

#[async_trait::async_trait]
impl Authenticator for ServerAuth {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthFailure> {
        // runbox's own tokens have a prefix no JWT can start with (a JWT starts with its
        // base64url-encoded JSON header, "eyJ").
        if let Some(store) = &self.tokens
            && token.starts_with(runbox_auth::tokens::TOKEN_PREFIX)
        {
            return store
                .verify(token)
                .map(caller)
                .ok_or_else(|| AuthFailure::Invalid("unknown or revoked token".into()));
        }
        match &self.jwt {
            Some(jwt) => jwt.validate(token).await.map(caller).map_err(|e| {
                if e.is_server_side() {
                    AuthFailure::Unavailable(e.to_string())
                } else {
                    AuthFailure::Invalid(e.to_string())
                }
            }),
            None => Err(AuthFailure::Invalid("unknown or revoked token".into())),
        }
    }
}

/// The HTTP transport's authentication, and the tenants' own quotas from the tokens file;
/// `None` when the operator configured none.
pub(crate) async fn setup(
    config: &AuthConfig,
) -> anyhow::Result<Option<(HttpAuth, Option<QuotaLookup>)>> {
    if !config.any() {
        return Ok(None);
    }
    let tokens = match &config.tokens {
        Some(path) => {
            let store = TokenStore::open(path)
                .with_context(|| format!("tokens file {}", path.display()))?;
            tracing::info!(path = %path.display(), "requiring bearer tokens from the tokens file");
            Some(Arc::new(store))
        }
        None => None,
    };
    let jwt = match &config.oauth {
        Some(o) => {
            let mut c = JwtConfig::new(&o.issuer, &o.audience);
            c.jwks_url = o.jwks_url.clone();
            let v = JwtValidator::new(c).context("OAuth settings")?;
            // Fetched now to find a wrong issuer at start; an issuer that is down now is
            // tried again on the first token.
            match v.refresh().await {
                Ok(()) => tracing::info!(issuer = %o.issuer, "accepting OAuth access tokens"),
                Err(e) => tracing::warn!(
                    issuer = %o.issuer,
                    "cannot fetch the issuer's keys yet ({e}); trying again on the first token"
                ),
            }
            Some(v)
        }
        None => None,
    };
    let lookup: Option<QuotaLookup> = tokens.as_ref().map(|store| {
        let store = Arc::clone(store);
        Arc::new(move |tenant: &str| {
            store.tenant_limits(tenant).map(|l| TenantQuota {
                max_sandboxes: l.max_sandboxes.map(|n| n as usize),
                max_concurrent_runs: l.max_concurrent_runs.map(|n| n as usize),
            })
        }) as QuotaLookup
    });
    let auth = HttpAuth {
        authorization_servers: config.oauth.iter().map(|o| o.issuer.clone()).collect(),
        public_url: config.public_url.clone(),
        authenticator: Arc::new(ServerAuth { tokens, jwt }),
    };
    Ok(Some((auth, lookup)))
}
