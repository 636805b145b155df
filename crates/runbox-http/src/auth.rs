//! Authentication and rate limits, in front of every front's routes.
//!
//! [`authenticate`] requires a token, `Authorization: Bearer <token>` or one of the front's
//! own key headers (an E2B-style API takes `X-API-KEY`), and asks the operator's
//! [`Authenticator`] (runbox's own tokens, an OAuth issuer's JWTs, or both) which tenant it
//! stands for. A missing or refused token gets `401` with a `WWW-Authenticate: Bearer`
//! challenge, which with OAuth points to the front's protected-resource metadata (RFC 9728)
//! so that clients can find the authorization server. A verified request carries its
//! [`Caller`] on to the front, which acts for that tenant only.
//!
//! [`rate_limit`] then counts the tenant's requests (those the front counts: the MCP front
//! its `POST`s, each carrying one JSON-RPC message) in a token bucket: past its rate the
//! answer is `429` with `Retry-After`. `/healthz`, `/metrics` and the metadata documents are
//! served without a token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::caller::Caller;
use crate::metrics::{Metrics, Rejection};

/// Why a bearer token was refused: said to the client, so never a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthFailure {
    /// The token is wrong: unknown, revoked, expired, badly signed... (`401`).
    #[error("{0}")]
    Invalid(String),
    /// The token cannot be checked now (the issuer's keys are unreachable): `503`, the
    /// client may retry.
    #[error("{0}")]
    Unavailable(String),
}

/// Verifies bearer tokens: the caller a token stands for, or why it is refused.
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// The caller `token` (the value after `Bearer `) stands for.
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthFailure>;
}

/// Authentication of the HTTP server.
#[derive(Clone)]
pub struct HttpAuth {
    /// Verifies tokens.
    pub authenticator: Arc<dyn Authenticator>,
    /// OAuth authorization servers (issuers) whose tokens are accepted; empty without OAuth.
    /// With any, the protected-resource metadata is served and the challenge points to it.
    pub authorization_servers: Vec<String>,
    /// This server's public base URL (`https://runbox.example.com`), as clients reach it;
    /// `None`: `http://` and each request's `Host`.
    pub public_url: Option<String>,
}

impl std::fmt::Debug for HttpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAuth")
            .field("authorization_servers", &self.authorization_servers)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

/// The prefix of protected-resource metadata: a resource's is served at this prefix and the
/// resource's path (RFC 9728 §3.1); the bare prefix serves the first resource's too.
pub const RESOURCE_METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";

impl HttpAuth {
    fn base_url(&self, headers: &HeaderMap) -> String {
        if let Some(url) = &self.public_url {
            return url.trim_end_matches('/').to_owned();
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost");
        format!("http://{host}")
    }

    /// The RFC 9728 document for the resource at `path` (`/mcp`).
    pub(crate) fn resource_metadata(&self, headers: &HeaderMap, path: &str) -> serde_json::Value {
        serde_json::json!({
            "resource": format!("{}{path}", self.base_url(headers)),
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "runbox",
        })
    }

    /// The `WWW-Authenticate` challenge of the resource at `resource` (`/mcp`; `None`: one
    /// without OAuth metadata); `error` is the reason a token was refused (none when there was
    /// no token, as RFC 6750 §3.1 asks).
    fn challenge(
        &self,
        headers: &HeaderMap,
        resource: Option<&str>,
        error: Option<&str>,
    ) -> String {
        let mut c = String::from("Bearer realm=\"runbox\"");
        if let Some(path) = resource
            && !self.authorization_servers.is_empty()
        {
            c.push_str(&format!(
                ", resource_metadata=\"{}{RESOURCE_METADATA_PREFIX}{path}\"",
                self.base_url(headers)
            ));
        }
        if let Some(description) = error {
            let clean: String = description
                .chars()
                .map(|c| match c {
                    '"' | '\\' => '\'',
                    c if c.is_control() => ' ',
                    c => c,
                })
                .collect();
            c.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{clean}\""
            ));
        }
        c
    }
}

/// What the auth layer of one front needs.
#[derive(Clone)]
pub(crate) struct AuthState {
    pub auth: HttpAuth,
    pub metrics: Arc<Metrics>,
    /// Headers whose value is a token too, besides `Authorization: Bearer`.
    pub key_headers: Arc<[HeaderName]>,
    /// The front's OAuth resource path, if it has one.
    pub resource: Option<String>,
}

fn unauthorized(state: &AuthState, headers: &HeaderMap, error: Option<&str>) -> Response {
    state.metrics.rejected(Rejection::Unauthenticated);
    let challenge = state
        .auth
        .challenge(headers, state.resource.as_deref(), error);
    let wanted = std::iter::once("Authorization: Bearer <token>".to_owned())
        .chain(state.key_headers.iter().map(|h| format!("{h}: <token>")))
        .collect::<Vec<_>>()
        .join(" or ");
    let body = serde_json::json!({
        "error": if error.is_some() { "invalid_token" } else { "unauthorized" },
        "error_description": error.map_or_else(
            || format!("this server requires {wanted}"),
            str::to_owned,
        ),
    });
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// The token a request presents: its `Authorization: Bearer` value, else the first of
/// `key_headers` it carries.
fn presented(headers: &HeaderMap, key_headers: &[HeaderName]) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        });
    bearer.or_else(|| {
        key_headers
            .iter()
            .find_map(|h| headers.get(h)?.to_str().ok())
            .map(|v| v.trim().to_owned())
    })
}

/// The auth layer: a request goes on to the front only with a token the authenticator
/// accepts, carrying its [`Caller`].
pub(crate) async fn authenticate(
    State(state): State<AuthState>,
    mut req: Request,
    next: Next,
) -> Response {
    let presented = presented(req.headers(), &state.key_headers);
    let Some(token) = presented.filter(|t| !t.is_empty()) else {
        return unauthorized(&state, req.headers(), None);
    };
    match state.auth.authenticator.authenticate(&token).await {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(AuthFailure::Invalid(why)) => {
            tracing::debug!("refused a bearer token: {why}");
            unauthorized(&state, req.headers(), Some(&why))
        }
        Err(AuthFailure::Unavailable(why)) => {
            tracing::warn!("cannot check a bearer token: {why}");
            let body = serde_json::json!({
                "error": "temporarily_unavailable",
                "error_description": format!("cannot check the token now: {why}"),
            });
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(5u32));
            response
        }
    }
}

/// Requests per minute, per tenant, in token buckets: a tenant may send its whole minute's
/// worth at once, then one more each `60 / rate` seconds.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    default_per_minute: Option<u32>,
    default_tenant: String,
    buckets: Mutex<HashMap<String, Bucket>>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// The tenant's rate when last seen: what refills it.
    per_minute: u32,
}

impl Bucket {
    fn capacity(per_minute: u32) -> f64 {
        f64::from(per_minute.max(1))
    }

    /// Its tokens at `now`, refilled at its own rate since it was last used.
    fn level(&self, now: Instant) -> f64 {
        let capacity = Self::capacity(self.per_minute);
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * capacity / 60.0;
        (self.tokens + refill).min(capacity)
    }
}

/// Buckets kept before full ones (tenants quiet for a while) are dropped.
const MAX_BUCKETS: usize = 10_000;

impl RateLimiter {
    pub(crate) fn new(
        default_per_minute: Option<u32>,
        default_tenant: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            default_per_minute,
            default_tenant,
            buckets: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Takes one request from `tenant`'s bucket, or says how long until there is one.
    fn take(&self, tenant: &str, per_minute: u32, now: Instant) -> Result<(), Duration> {
        let capacity = Bucket::capacity(per_minute);
        let per_second = capacity / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(tenant) {
            // A full bucket is what a new one would be: forgetting it changes nothing.
            buckets.retain(|_, b| b.level(now) < Bucket::capacity(b.per_minute));
        }
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: capacity,
            at: now,
            per_minute,
        });
        bucket.tokens = bucket.level(now).min(capacity);
        bucket.at = now;
        bucket.per_minute = per_minute;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
        }
    }
}

/// What the rate-limit layer of one front needs.
#[derive(Clone)]
pub(crate) struct RateState {
    pub limiter: Arc<RateLimiter>,
    /// Which requests count: the MCP front's POSTs, an API's every request.
    pub counted: fn(&Method) -> bool,
}

/// The rate-limit layer (after [`authenticate`], which tells whose request it is).
pub(crate) async fn rate_limit(
    State(RateState { limiter, counted }): State<RateState>,
    req: Request,
    next: Next,
) -> Response {
    if !counted(req.method()) {
        return next.run(req).await;
    }
    let caller = req.extensions().get::<Caller>();
    let tenant = caller.map_or(limiter.default_tenant.as_str(), |c| c.tenant.as_str());
    let Some(per_minute) = caller
        .and_then(|c| c.requests_per_minute)
        .or(limiter.default_per_minute)
    else {
        return next.run(req).await;
    };
    match limiter.take(tenant, per_minute, Instant::now()) {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            limiter.metrics.rejected(Rejection::RateLimited);
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let body = serde_json::json!({
                "error": "rate_limited",
                "error_description": format!(
                    "tenant {tenant} may send {per_minute} requests a minute; retry in {seconds} s"
                ),
            });
            let mut response = (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter() -> RateLimiter {
        RateLimiter::new(None, "local".into(), Arc::new(Metrics::new()))
    }

    #[test]
    fn a_bucket_allows_a_minutes_worth_then_refills_at_the_rate() {
        let l = limiter();
        let t0 = Instant::now();
        for _ in 0..6 {
            assert!(l.take("a", 6, t0).is_ok());
        }
        let wait = l.take("a", 6, t0).unwrap_err();
        assert!(
            wait > Duration::from_secs(9) && wait <= Duration::from_secs(10),
            "{wait:?}"
        );
        // Another tenant has a bucket of its own.
        assert!(l.take("b", 6, t0).is_ok());
        // One request's worth comes back after 60 / 6 = 10 s.
        assert!(l.take("a", 6, t0 + Duration::from_secs(10)).is_ok());
        assert!(l.take("a", 6, t0 + Duration::from_secs(10)).is_err());
    }

    #[test]
    fn challenges_point_to_the_metadata_only_with_oauth_and_never_break_quotes() {
        struct Never;
        #[async_trait::async_trait]
        impl Authenticator for Never {
            async fn authenticate(&self, _: &str) -> Result<Caller, AuthFailure> {
                Err(AuthFailure::Invalid("no".into()))
            }
        }
        let mut auth = HttpAuth {
            authenticator: Arc::new(Never),
            authorization_servers: Vec::new(),
            public_url: None,
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8000"));
        assert_eq!(
            auth.challenge(&headers, Some("/mcp"), None),
            "Bearer realm=\"runbox\""
        );
        auth.authorization_servers = vec!["https://idp.example".into()];
        assert_eq!(
            auth.challenge(&headers, None, None),
            "Bearer realm=\"runbox\"",
            "a front without a resource has no metadata to point to"
        );
        let c = auth.challenge(&headers, Some("/mcp"), Some("bad \"token\"\n"));
        assert_eq!(
            c,
            "Bearer realm=\"runbox\", resource_metadata=\"http://127.0.0.1:8000/.well-known/\
             oauth-protected-resource/mcp\", error=\"invalid_token\", error_description=\"bad \
             'token' \""
        );
        auth.public_url = Some("https://runbox.example/".into());
        assert_eq!(
            auth.resource_metadata(&headers, "/mcp")["resource"],
            "https://runbox.example/mcp"
        );
    }
}
