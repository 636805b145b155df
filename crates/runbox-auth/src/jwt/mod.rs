//! OAuth 2.1 resource server: validation of JWT access tokens.
//!
//! runbox does not issue these tokens; an authorization server (the "issuer": Keycloak,
//! Auth0, Entra ID, …) does. [`JwtValidator`] checks each token against the issuer's
//! published signing keys (its JWKS) and checks the claims a resource server must: the
//! issuer, the audience (runbox's own identifier), the expiry and the not-before time. The
//! token's `sub` becomes the tenant.
//!
//! The JWKS is fetched on the first token (or by [`JwtValidator::refresh`]) and kept in
//! memory. A token signed with a key id the cache does not know triggers one refetch, at
//! most every 30 seconds, so keys rotated at the issuer are picked up while a flood of
//! made-up key ids cannot hammer it. The cache is also refreshed when it is an hour old.

mod jwks;

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use reqwest::Url;
use serde::Deserialize;

use self::jwks::{ACCEPTED, Metadata, VerifyKey};
use crate::{AuthError, AuthMethod, Principal, TenantLimits};

/// The least time between two refetches caused by unknown key ids.
const UNKNOWN_KID_REFETCH: Duration = Duration::from_secs(30);

/// After a failed fetch with no keys in hand, how long requests fail at once (with the
/// error of that fetch) before another fetch is tried.
const FAILED_FETCH_RETRY: Duration = Duration::from_secs(5);

/// How old the key cache may get before it is refetched (keeping the old keys if that
/// fails), so that keys withdrawn at the issuer stop working here too.
const MAX_KEY_AGE: Duration = Duration::from_secs(3600);

/// The longest `sub` accepted as a tenant.
const MAX_SUBJECT_LEN: usize = 256;

/// Where to find the authorization server and what to require of its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    /// The authorization server's issuer identifier, exactly as it appears in tokens' `iss`
    /// claim and its metadata's `issuer`. Must be `https://`, except `http://` for
    /// loopback hosts (`localhost`, 127.0.0.0/8, `::1`).
    pub issuer: String,
    /// The audience tokens must be issued for (their `aud` must contain it): normally
    /// runbox's own URL, for example `https://runbox.example.com/mcp`.
    pub audience: String,
    /// The JWKS URL. When `None`, it is discovered from the issuer's metadata
    /// (`/.well-known/oauth-authorization-server`, then
    /// `/.well-known/openid-configuration`). Same scheme rules as the issuer.
    pub jwks_url: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`; 60 seconds by default. Whole seconds.
    pub leeway: Duration,
}

impl JwtConfig {
    /// A configuration with discovery and the default leeway (60 s).
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> JwtConfig {
        JwtConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks_url: None,
            leeway: Duration::from_secs(60),
        }
    }
}

/// Why a JWT was refused. The messages say plainly what was wrong and carry nothing from
/// the token itself, so they can go into a `WWW-Authenticate` header's
/// `error_description` as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not a well-formed JWT, or a claim of the wrong type.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The token's `alg` is not one runbox accepts (`none`, HS256, …).
    #[error(
        "token algorithm {0} is not accepted (accepted: RS256, RS384, RS512, PS256, ES256, ES384, EdDSA)"
    )]
    UnsupportedAlgorithm(&'static str),
    /// The token's `alg` does not fit the key its `kid` names.
    #[error("token algorithm does not match the signing key")]
    AlgorithmMismatch,
    /// No key in the authorization server's JWKS has the token's key id.
    #[error("token is signed with a key the authorization server does not publish")]
    UnknownKey,
    /// The signature does not verify with the authorization server's key.
    #[error("token signature is invalid")]
    BadSignature,
    /// The token has expired.
    #[error("token has expired")]
    Expired,
    /// The token's `nbf` is in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// The token's `iss` is missing or not the configured issuer.
    #[error("token was not issued by the expected authorization server")]
    WrongIssuer,
    /// The token's `aud` is missing or does not contain runbox's audience.
    #[error("token is not meant for this server (wrong audience)")]
    WrongAudience,
    /// The token has no usable `sub` (missing, empty, longer than 256 characters, or with
    /// control characters).
    #[error("token has no usable subject")]
    NoSubject,
    /// The authorization server's keys could not be fetched: a problem on the server side,
    /// not the caller's (answer 503 rather than 401). The detail names URLs and HTTP
    /// statuses, never token content, and has no quotes, backslashes or control
    /// characters.
    #[error("the authorization server's signing keys are unavailable: {0}")]
    JwksUnavailable(String),
}

impl JwtError {
    /// Whether the refusal is the server's problem (the keys could not be fetched) rather
    /// than the token's.
    pub fn is_server_side(&self) -> bool {
        matches!(self, JwtError::JwksUnavailable(_))
    }
}

/// Validates JWT access tokens issued by one authorization server.
///
/// Cheap to share behind an `Arc`; `validate` takes `&self` and may run concurrently.
/// Fetching keys uses `reqwest`, so [`validate`](Self::validate) and
/// [`refresh`](Self::refresh) must run inside a Tokio runtime.
#[derive(Debug)]
pub struct JwtValidator {
    issuer: String,
    issuer_url: Url,
    audience: String,
    leeway: u64,
    configured_jwks: Option<Url>,
    http: reqwest::Client,
    /// The keys in hand; read without waiting on a fetch.
    keys: RwLock<Arc<KeySet>>,
    /// Held while fetching, so that concurrent requests share one fetch.
    fetch: tokio::sync::Mutex<FetchState>,
}

#[derive(Debug, Default)]
struct KeySet {
    keys: Vec<VerifyKey>,
    /// When these keys were fetched; `None` before the first successful fetch.
    fetched_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct FetchState {
    /// The JWKS URL found by discovery, kept while fetches from it succeed.
    discovered: Option<Url>,
    last_attempt: Option<Instant>,
    last_error: Option<String>,
    last_unknown_kid_refetch: Option<Instant>,
}

/// Why a fetch is wanted; decides whether it is still needed once the fetch lock is held.
#[derive(Debug, Clone, Copy)]
enum Want<'a> {
    /// No keys yet.
    First,
    /// The keys are older than [`MAX_KEY_AGE`].
    Stale,
    /// A token names this key id, which is not in the cache.
    Kid(&'a str),
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
}

impl JwtValidator {
    /// Checks the configuration and builds the HTTP client. Nothing is fetched yet: the
    /// keys are fetched on the first [`validate`](Self::validate), or by
    /// [`refresh`](Self::refresh) to fail fast at startup.
    pub fn new(config: JwtConfig) -> Result<JwtValidator, AuthError> {
        let issuer_url =
            jwks::check_url("issuer", &config.issuer).map_err(AuthError::InvalidConfig)?;
        if issuer_url.query().is_some() || issuer_url.fragment().is_some() {
            return Err(AuthError::InvalidConfig(format!(
                "issuer {:?} must not have a query or fragment",
                config.issuer
            )));
        }
        if config.audience.is_empty() {
            return Err(AuthError::InvalidConfig("the audience is empty".into()));
        }
        let configured_jwks = config
            .jwks_url
            .as_deref()
            .map(|u| jwks::check_url("JWKS URL", u))
            .transpose()
            .map_err(AuthError::InvalidConfig)?;

        // This crate is built with jsonwebtoken's RustCrypto backend. Installing it
        // explicitly keeps jsonwebtoken working should another crate in the build also
        // enable its aws-lc backend (with both, it cannot choose and panics). Installing
        // fails harmlessly if a provider is already in place.
        let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();

        let mut http = reqwest::Client::builder()
            .timeout(jwks::FETCH_TIMEOUT)
            .connect_timeout(jwks::FETCH_TIMEOUT)
            .user_agent(concat!("runbox/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                if attempt.previous().len() >= 5 {
                    attempt.error("too many redirects")
                } else if attempt.url().scheme() == "https" || jwks::is_loopback(attempt.url()) {
                    attempt.follow()
                } else {
                    attempt.error("redirect away from https")
                }
            }));
        // An authorization server on loopback is reached directly, never through a proxy
        // configured in the environment.
        if jwks::is_loopback(&issuer_url) && configured_jwks.as_ref().is_none_or(jwks::is_loopback)
        {
            http = http.no_proxy();
        }
        let http = http.build().map_err(|e| AuthError::Http(e.to_string()))?;

        Ok(JwtValidator {
            issuer: config.issuer,
            issuer_url,
            audience: config.audience,
            leeway: config.leeway.as_secs(),
            configured_jwks,
            http,
            keys: RwLock::new(Arc::new(KeySet::default())),
            fetch: tokio::sync::Mutex::new(FetchState::default()),
        })
    }

    /// The configured issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Fetches the JWKS now (discovering its URL first if needed), replacing the cached
    /// keys on success. Call it at startup to fail fast on a misconfigured issuer; after
    /// that, the validator refetches by itself.
    pub async fn refresh(&self) -> Result<(), JwtError> {
        let mut state = self.fetch.lock().await;
        self.fetch_locked(&mut state).await
    }

    /// Validates an access token (the bearer value, without `Bearer `) and returns the
    /// principal it stands for: tenant = the `sub` claim, default limits.
    ///
    /// Checks, in order: the token's shape (and no `crit` header); its `alg` (RS256, RS384, RS512, PS256, ES256,
    /// ES384 or EdDSA; never `none` or HS*); a JWKS key with its `kid` (the only key that
    /// fits its `alg`, when it has no `kid`) whose type fits the `alg`; the signature; `iss`;
    /// `aud`; `exp` (required) and `nbf` (if present), with the configured leeway; `sub`.
    pub async fn validate(&self, token: &str) -> Result<Principal, JwtError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| JwtError::Malformed("not a signed JWT with a known algorithm"))?;
        if !ACCEPTED.contains(&header.alg) {
            return Err(JwtError::UnsupportedAlgorithm(algorithm_name(header.alg)));
        }
        // No extension is understood, so a token that marks one critical is refused
        // (RFC 7515 §4.1.11). Keys named in the header (`jku`, `jwk`, `x5u`) are ignored:
        // only the issuer's JWKS is trusted.
        if header.crit.is_some() {
            return Err(JwtError::Malformed(
                "critical header extensions are not supported",
            ));
        }
        let alg = header.alg;
        let kid = header.kid.as_deref();

        let mut keys = self.keys(Want::First).await?;
        if keys
            .fetched_at
            .is_some_and(|at| at.elapsed() >= MAX_KEY_AGE)
        {
            keys = self.keys(Want::Stale).await?;
        }
        if let Some(kid) = kid
            && !keys.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
        {
            keys = self.keys(Want::Kid(kid)).await?;
        }

        let named: Vec<&VerifyKey> = match kid {
            Some(kid) => keys
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .collect(),
            None => keys.keys.iter().collect(),
        };
        if named.is_empty() {
            return Err(JwtError::UnknownKey);
        }
        let fitting: Vec<&VerifyKey> = named
            .into_iter()
            .filter(|k| k.algorithms.contains(&alg))
            .collect();
        let key = match (kid, fitting.as_slice()) {
            (_, []) => return Err(JwtError::AlgorithmMismatch),
            (_, [key]) => *key,
            // Several keys share the kid, or there is no kid and several keys fit: refuse
            // rather than try each.
            _ => return Err(JwtError::UnknownKey),
        };

        let mut validation = Validation::new(alg);
        validation.leeway = self.leeway;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);

        let data = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|e| map_error(e.kind()))?;
        let tenant = data.claims.sub.ok_or(JwtError::NoSubject)?;
        if tenant.is_empty()
            || tenant.chars().count() > MAX_SUBJECT_LEN
            || tenant.chars().any(char::is_control)
        {
            return Err(JwtError::NoSubject);
        }
        Ok(Principal {
            tenant,
            limits: TenantLimits::default(),
            via: AuthMethod::Jwt,
        })
    }

    /// The keys in hand, fetching first if `want` says a fetch is due.
    async fn keys(&self, want: Want<'_>) -> Result<Arc<KeySet>, JwtError> {
        let current = self.snapshot();
        if !needs_fetch(&current, want) {
            return Ok(current);
        }
        let mut state = self.fetch.lock().await;
        // Another request may have fetched while this one waited.
        let current = self.snapshot();
        if !needs_fetch(&current, want) {
            return Ok(current);
        }
        let now = Instant::now();
        match want {
            Want::First => {
                if let (Some(at), Some(error)) = (state.last_attempt, &state.last_error)
                    && now.duration_since(at) < FAILED_FETCH_RETRY
                {
                    return Err(JwtError::JwksUnavailable(error.clone()));
                }
                self.fetch_locked(&mut state).await?;
            }
            Want::Stale => {
                if state
                    .last_attempt
                    .is_none_or(|at| now.duration_since(at) >= UNKNOWN_KID_REFETCH)
                    && let Err(e) = self.fetch_locked(&mut state).await
                {
                    tracing::warn!(error = %e, "cannot refresh the JWKS; keeping the keys in hand");
                }
            }
            Want::Kid(_) => {
                if state
                    .last_unknown_kid_refetch
                    .is_some_and(|at| now.duration_since(at) < UNKNOWN_KID_REFETCH)
                {
                    return Ok(current);
                }
                state.last_unknown_kid_refetch = Some(now);
                self.fetch_locked(&mut state).await?;
            }
        }
        Ok(self.snapshot())
    }

    fn snapshot(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Fetches the JWKS and replaces the keys; the caller holds the fetch lock.
    async fn fetch_locked(&self, state: &mut FetchState) -> Result<(), JwtError> {
        state.last_attempt = Some(Instant::now());
        match self.fetch_keys(state).await {
            Ok(keys) => {
                tracing::info!(issuer = %self.issuer, keys = keys.len(), "fetched the authorization server's signing keys");
                state.last_error = None;
                *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(KeySet {
                    keys,
                    fetched_at: Some(Instant::now()),
                });
                Ok(())
            }
            Err(error) => {
                tracing::error!(issuer = %self.issuer, %error, "cannot fetch the authorization server's signing keys");
                state.discovered = None;
                let error = header_safe(&error);
                state.last_error = Some(error.clone());
                Err(JwtError::JwksUnavailable(error))
            }
        }
    }

    async fn fetch_keys(&self, state: &mut FetchState) -> Result<Vec<VerifyKey>, String> {
        let url = match (&self.configured_jwks, &state.discovered) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) => {
                let url = self.discover().await?;
                state.discovered = Some(url.clone());
                url
            }
        };
        let body = jwks::get(&self.http, &url).await?;
        let keys = jwks::parse_jwks(&body)?;
        if keys.is_empty() {
            return Err(format!(
                "the JWKS at {url} has no key runbox can verify with"
            ));
        }
        Ok(keys)
    }

    /// Finds the JWKS URL in the issuer's metadata.
    async fn discover(&self) -> Result<Url, String> {
        let mut errors = Vec::new();
        for url in jwks::discovery_urls(&self.issuer_url) {
            let body = match jwks::get(&self.http, &url).await {
                Ok(body) => body,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let metadata: Metadata = match serde_json::from_slice(&body) {
                Ok(m) => m,
                Err(e) => {
                    errors.push(format!("{url} is not authorization server metadata: {e}"));
                    continue;
                }
            };
            if metadata.issuer != self.issuer {
                // RFC 8414 §3.3: metadata for another issuer must not be used.
                return Err(format!(
                    "{url} describes issuer {:?}, not the configured {:?}",
                    metadata.issuer, self.issuer
                ));
            }
            let Some(jwks_uri) = metadata.jwks_uri else {
                return Err(format!("{url} has no jwks_uri"));
            };
            return jwks::check_url("jwks_uri", &jwks_uri);
        }
        Err(format!(
            "no authorization server metadata found: {}",
            errors.join("; ")
        ))
    }
}

fn needs_fetch(keys: &KeySet, want: Want<'_>) -> bool {
    match want {
        Want::First => keys.fetched_at.is_none(),
        Want::Stale => keys
            .fetched_at
            .is_some_and(|at| at.elapsed() >= MAX_KEY_AGE),
        Want::Kid(kid) => !keys.keys.iter().any(|k| k.kid.as_deref() == Some(kid)),
    }
}

fn map_error(kind: &ErrorKind) -> JwtError {
    match kind {
        ErrorKind::InvalidSignature => JwtError::BadSignature,
        ErrorKind::ExpiredSignature => JwtError::Expired,
        ErrorKind::ImmatureSignature => JwtError::NotYetValid,
        ErrorKind::InvalidIssuer => JwtError::WrongIssuer,
        ErrorKind::InvalidAudience => JwtError::WrongAudience,
        ErrorKind::InvalidAlgorithm => JwtError::AlgorithmMismatch,
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "iss" => JwtError::WrongIssuer,
            "aud" => JwtError::WrongAudience,
            "sub" => JwtError::NoSubject,
            "exp" => JwtError::Malformed("the token has no valid expiry (exp)"),
            _ => JwtError::Malformed("a required claim is missing"),
        },
        ErrorKind::InvalidClaimFormat(_) => JwtError::Malformed("a claim has the wrong type"),
        // A key from the JWKS that the crypto backend cannot use (a point off the curve,
        // …): the signature cannot be verified.
        ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => JwtError::BadSignature,
        _ => JwtError::Malformed("not a valid JWT"),
    }
}

/// `text` with nothing that needs escaping in an HTTP header's quoted string: quotes and
/// backslashes become `'`, control characters spaces.
fn header_safe(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

fn algorithm_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::EdDSA => "EdDSA",
        _ => "(other)",
    }
}

/// The OAuth 2.0 Protected Resource Metadata document (RFC 9728) for runbox: serve it at
/// `/.well-known/oauth-protected-resource` so that MCP clients find the authorization
/// server. `resource` is runbox's identifier (the audience, e.g.
/// `https://runbox.example.com/mcp`); `issuer` is the authorization server.
pub fn protected_resource_metadata(resource: &str, issuer: &str) -> serde_json::Value {
    serde_json::json!({
        "resource": resource,
        "authorization_servers": [issuer],
        "bearer_methods_supported": ["header"],
    })
}

#[cfg(test)]
mod tests;
