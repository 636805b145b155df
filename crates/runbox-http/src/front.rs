//! Composition: the shared routes (`/healthz`, `/metrics`, OAuth metadata) and every front's
//! routes behind the shared authentication and rate limits, served by the shared listener.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Method, header};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::auth::{
    AuthState, HttpAuth, RESOURCE_METADATA_PREFIX, RateLimiter, RateState, authenticate, rate_limit,
};
use crate::listener::{self, ConnectionLimits};
use crate::metrics::Metrics;

/// What `/healthz` and `/metrics` tell of the server's sandboxes.
pub trait Status: Send + Sync + 'static {
    /// The fields of `/healthz` beside `"status": "ok"` (the backend, how many sandboxes).
    fn health(&self) -> serde_json::Map<String, serde_json::Value>;
    /// The sandboxes and runs now, for the metrics' gauges.
    fn census(&self) -> runbox_core::Census;
}

/// What every front shares.
#[derive(Clone)]
pub struct Shared {
    /// Who may use the fronts; `None`: anyone who can connect (the server's one local
    /// tenant).
    pub auth: Option<HttpAuth>,
    /// Requests a minute each tenant may send unless its token says otherwise; `None`: no
    /// limit.
    pub rate_limit: Option<u32>,
    /// The tenant of requests without a [`Caller`](crate::Caller) (no authentication).
    pub default_tenant: String,
    /// The server's metrics, served at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The sandboxes, as `/healthz` and `/metrics` tell them.
    pub status: Arc<dyn Status>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("auth", &self.auth)
            .field("rate_limit", &self.rate_limit)
            .field("default_tenant", &self.default_tenant)
            .finish_non_exhaustive()
    }
}

/// One front's routes, and how the shared layer guards them.
#[derive(Debug)]
pub struct Front {
    router: axum::Router,
    key_headers: Vec<HeaderName>,
    counted: fn(&Method) -> bool,
    resource: Option<String>,
}

impl Front {
    /// A front serving `router`'s routes. Every request needs a bearer token when the server
    /// has authentication, and every request counts against its tenant's rate.
    pub fn new(router: axum::Router) -> Self {
        Self {
            router,
            key_headers: Vec::new(),
            counted: |_| true,
            resource: None,
        }
    }

    /// Also takes the token from this header (an E2B-style API's `X-API-KEY`) when there is
    /// no `Authorization: Bearer`.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_headers.push(name);
        self
    }

    /// Counts only the requests `counted` says against the tenant's rate (the MCP front: its
    /// POSTs, each one message; not the GET of a stream or the DELETE of a session).
    pub fn rate_counts(mut self, counted: fn(&Method) -> bool) -> Self {
        self.counted = counted;
        self
    }

    /// Names the front an OAuth protected resource at `path` (`/mcp`): with an OAuth issuer,
    /// its metadata is served at the well-known prefix and `path`, and its `401`s point to it.
    pub fn oauth_resource(mut self, path: impl Into<String>) -> Self {
        self.resource = Some(path.into());
        self
    }
}

async fn healthz(State(status): State<Arc<dyn Status>>) -> Json<serde_json::Value> {
    let mut body = serde_json::Map::new();
    body.insert("status".into(), "ok".into());
    body.extend(status.health());
    Json(body.into())
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    let text = shared.metrics.render(shared.status.census());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

/// The HTTP application: `/healthz`, `/metrics`, and each front's routes behind
/// authentication (when configured) and rate limits; with OAuth, each front's
/// protected-resource metadata.
pub fn app(shared: &Shared, fronts: Vec<Front>) -> axum::Router {
    let mut app = axum::Router::new()
        .route("/healthz", get(healthz))
        .with_state(Arc::clone(&shared.status))
        .merge(
            axum::Router::new()
                .route("/metrics", get(metrics))
                .with_state(shared.clone()),
        );
    let limiter = Arc::new(RateLimiter::new(
        shared.rate_limit,
        shared.default_tenant.clone(),
        Arc::clone(&shared.metrics),
    ));
    let mut first_resource = true;
    for front in fronts {
        // Layers run outside in: authentication first, then the rate of the tenant it found.
        let mut routes = front.router.layer(from_fn_with_state(
            RateState {
                limiter: Arc::clone(&limiter),
                counted: front.counted,
            },
            rate_limit,
        ));
        if let Some(auth) = &shared.auth {
            routes = routes.layer(from_fn_with_state(
                AuthState {
                    auth: auth.clone(),
                    metrics: Arc::clone(&shared.metrics),
                    key_headers: front.key_headers.into(),
                    resource: front.resource.clone(),
                },
                authenticate,
            ));
            if let Some(path) = front.resource
                && !auth.authorization_servers.is_empty()
            {
                let mut metadata = axum::Router::new().route(
                    &format!("{RESOURCE_METADATA_PREFIX}{path}"),
                    get(resource_metadata),
                );
                if first_resource {
                    metadata = metadata.route(RESOURCE_METADATA_PREFIX, get(resource_metadata));
                    first_resource = false;
                }
                app = app.merge(metadata.with_state((auth.clone(), path)));
            }
        }
        app = app.merge(routes);
    }
    app
}

async fn resource_metadata(
    State((auth, path)): State<(HttpAuth, String)>,
    headers: HeaderMap,
) -> impl IntoResponse {
    Json(auth.resource_metadata(&headers, &path))
}

/// How long requests in flight may take to finish once shutdown starts.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` fires, then gives the requests in flight
/// [`SHUTDOWN_GRACE`] to finish (a client holding a connection open cannot keep the server
/// up). Connections are capped and timed out by `limits`, and counted in `metrics`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let force = CancellationToken::new();
    let grace = {
        let (shutdown, force) = (shutdown.clone(), force.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            tracing::warn!(
                "connections still open {SHUTDOWN_GRACE:?} after shutdown began; closing them"
            );
            force.cancel();
        })
    };
    listener::serve(listener, app, limits, metrics, shutdown, force).await;
    grace.abort();
}
