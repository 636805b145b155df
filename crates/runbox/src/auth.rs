//! The server's authentication: runbox's own tokens (a tokens file, reloaded when it
//! changes) and OAuth access tokens (JWTs of one issuer), behind the shared HTTP layer's
//! [`Authenticator`]. Each token stands for a tenant; a token's limits in the file become
//! that tenant's quotas. With `--auth passthrough` (the e2b backend), the bearer value is
//! instead the caller's own provider key, and the tenant is named after its hash.

use std::sync::Arc;

use anyhow::Context;
use runbox_auth::{JwtConfig, JwtValidator, Principal, TokenStore};
use runbox_core::{QuotaLookup, TenantQuota};
use runbox_http::{AuthFailure, Authenticator, Caller, HttpAuth};

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

/// Takes the bearer value as the caller's own provider API key. runbox cannot tell a good
/// key from a bad one (the provider answers that on the first sandbox), so any plausible
/// value is a caller: the tenant is named after the key's SHA-256, so each key sees only
/// the sandboxes it made, and no log or audit line carries the key itself.
struct Passthrough;

/// Longest key accepted.
const MAX_KEY: usize = 512;

/// The tenant of a provider key: `key-` and 128 bits of its SHA-256.
fn key_tenant(key: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let mut s = String::from("key-");
    for b in &digest[..16] {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[async_trait::async_trait]
impl Authenticator for Passthrough {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthFailure> {
        let key = token.trim();
        if key.is_empty() || key.len() > MAX_KEY || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthFailure::Invalid(
                "send your cloud sandbox provider's API key as the bearer token".into(),
            ));
        }
        Ok(Caller {
            tenant: key_tenant(key),
            requests_per_minute: None,
            credential: Some(runbox_core::Credential::new(key)),
        })
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
    if config.passthrough {
        tracing::info!("callers' bearer values are their own provider keys (--auth passthrough)");
        let auth = HttpAuth {
            authorization_servers: Vec::new(),
            public_url: config.public_url.clone(),
            authenticator: Arc::new(Passthrough),
        };
        return Ok(Some((auth, None)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passthrough_names_the_tenant_after_the_key_and_keeps_the_key() {
        let a = Passthrough.authenticate("sk_alice").await.unwrap();
        let b = Passthrough.authenticate("sk_bob").await.unwrap();
        assert_ne!(a.tenant, b.tenant);
        assert_eq!(
            a.tenant,
            Passthrough.authenticate(" sk_alice ").await.unwrap().tenant
        );
        assert!(
            a.tenant.starts_with("key-") && a.tenant.len() == 36,
            "{}",
            a.tenant
        );
        assert!(!a.tenant.contains("alice"));
        assert_eq!(a.credential.unwrap().expose(), "sk_alice");
        for bad in ["", "   ", "two words", &"k".repeat(MAX_KEY + 1)] {
            assert!(Passthrough.authenticate(bad).await.is_err(), "{bad:?}");
        }
    }
}
