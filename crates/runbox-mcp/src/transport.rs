//! The two transports: stdio (what desktop clients spawn) and streamable HTTP (`/mcp`,
//! plus `/healthz`). Both revisions in use are answered on each: 2025-11-25 with
//! `initialize` and sessions, 2026-07-28 stateless with `server/discover`; rmcp negotiates.
//! Sandbox ids are tool arguments, never tied to an HTTP session. Over HTTP, `/mcp` can
//! require a bearer token and limit each tenant's request rate (see [`crate::auth`]);
//! `/metrics` serves Prometheus metrics.
//!
//! Around rmcp: the stdio transport answers every request, even one it cannot read
//! ([`stdio`]); over HTTP, the server's own accept loop caps and times out connections
//! ([`listener`]), a request gate answers bodies rmcp cannot take with JSON-RPC errors
//! ([`gate`]), and sessions belong to their tenant, are capped, expire when idle, and cancel
//! a request whose client went away ([`sessions`]).

mod gate;
mod listener;
mod sessions;
mod stdio;

pub use listener::ConnectionLimits;
pub use sessions::SessionLimits;

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::get;
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::auth::{
    AuthState, HttpAuth, RESOURCE_METADATA_PATH, RateLimiter, authenticate, rate_limit,
};
use crate::server::RunboxServer;

/// Why a transport stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The MCP session could not start.
    #[error("MCP over stdio: {0}")]
    Stdio(String),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
}

/// Largest request, in bytes, on either transport: room for the largest `write_file`
/// (16 MiB, as base64) with its envelope. A larger request is answered with a JSON-RPC
/// error (`413` over HTTP, refused by its `Content-Length` before the body is read); the
/// tools refuse with a message anything between their own limits and this one.
pub const MAX_REQUEST_BYTES: usize = 24 << 20;

/// Serves MCP on stdin and stdout until the client closes stdin or `shutdown` fires.
pub async fn serve_stdio(
    server: RunboxServer,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
    let transport = stdio::LineTransport::new(
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
        MAX_REQUEST_BYTES,
    );
    let running = server
        .serve(transport)
        .await
        .map_err(|e| TransportError::Stdio(e.to_string()))?;
    let cancel = running.cancellation_token();
    tokio::select! {
        r = running.waiting() => {
            r.map_err(|e| TransportError::Stdio(e.to_string()))?;
        }
        () = shutdown.cancelled() => cancel.cancel(),
    }
    Ok(())
}

/// Settings of the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` header values accepted (DNS-rebinding protection); loopback names by default.
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted (`scheme://host:port`, `:*` for any port); empty: those of
    /// the allowed hosts, on any port. A request without an `Origin` is not a browser's and
    /// passes; one with any other gets `403`.
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes (code travels in requests).
    pub max_request_bytes: usize,
    /// Who may use `/mcp`; `None`: anyone who can connect (the server's one local tenant).
    pub auth: Option<HttpAuth>,
    /// Requests a minute each tenant may send to `/mcp` unless its token says otherwise;
    /// `None`: no limit.
    pub rate_limit: Option<u32>,
    /// Caps and timeouts of connections.
    pub connections: ConnectionLimits,
    /// Caps and expiry of MCP sessions.
    pub sessions: SessionLimits,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            max_request_bytes: MAX_REQUEST_BYTES,
            auth: None,
            rate_limit: None,
            connections: ConnectionLimits::default(),
            sessions: SessionLimits::default(),
        }
    }
}

impl HttpOptions {
    /// The `Origin`s accepted: the operator's, or else those of the allowed hosts (http and
    /// https, any port unless the host names one).
    fn origins(&self) -> Vec<String> {
        if !self.allowed_origins.is_empty() {
            return self.allowed_origins.clone();
        }
        self.allowed_hosts
            .iter()
            .flat_map(|host| {
                let (name, port) = match host.parse::<axum::http::uri::Authority>() {
                    Ok(a) => (a.host().to_owned(), a.port_u16()),
                    // A bare IPv6 address (`::1`) is no authority.
                    Err(_) => (host.clone(), None),
                };
                let name = if name.contains(':') && !name.starts_with('[') {
                    format!("[{name}]")
                } else {
                    name
                };
                let port = port.map_or_else(|| "*".to_owned(), |p| p.to_string());
                [
                    format!("http://{name}:{port}"),
                    format!("https://{name}:{port}"),
                ]
            })
            .collect()
    }
}

/// A response body that keeps `T` alive until it is done or dropped: how a request's
/// activity (on its connection, in its session) lasts as long as its answer streams.
pub(crate) struct HeldBody<T> {
    body: axum::body::Body,
    _held: T,
}

impl<T> HeldBody<T> {
    pub(crate) fn new(body: axum::body::Body, held: T) -> Self {
        Self { body, _held: held }
    }
}

impl<T: Unpin> http_body::Body for HeldBody<T> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn healthz(State(server): State<RunboxServer>) -> Json<serde_json::Value> {
    let r = server.registry();
    Json(serde_json::json!({
        "status": "ok",
        "backend": r.backend().name(),
        "sandboxes": r.count(),
        "pooled": r.pooled(),
    }))
}

/// Ending a session (`DELETE /mcp`) answers `204 No Content` rather than rmcp's `202`:
/// nothing is pending after a deletion, and the Python SDK reports 202 as a failed
/// termination.
async fn session_end_is_no_content(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let deleting = req.method() == axum::http::Method::DELETE;
    let mut response = next.run(req).await;
    if deleting && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}

async fn metrics(State(server): State<RunboxServer>) -> impl IntoResponse {
    let text = server.metrics().render(server.registry().census());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

async fn resource_metadata(State(auth): State<HttpAuth>, headers: HeaderMap) -> impl IntoResponse {
    Json(auth.resource_metadata(&headers))
}

/// The HTTP application: `/mcp` (behind authentication and rate limits when configured),
/// `/healthz`, `/metrics`, and with OAuth the protected-resource metadata.
pub fn http_app(
    server: RunboxServer,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> axum::Router {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(options.allowed_hosts.clone())
        .with_allowed_origins(options.origins())
        .enforce_origin_validation()
        .with_max_request_body_bytes(options.max_request_bytes)
        .with_cancellation_token(shutdown.clone());
    let book = Arc::new(sessions::SessionBook::new(
        options.sessions.clone(),
        Arc::clone(server.metrics()),
    ));
    let manager = Arc::new(sessions::TenantSessions::new(Arc::clone(&book)));
    sessions::spawn_reaper(Arc::clone(&manager), shutdown);
    let factory_server = server.clone();
    let mcp = StreamableHttpService::new(move || Ok(factory_server.for_session()), manager, config);
    let limiter = Arc::new(RateLimiter::new(
        options.rate_limit,
        server.default_tenant().to_owned(),
        Arc::clone(server.metrics()),
    ));
    let tenant = server.default_tenant().to_owned();
    // Layers run outside in: authentication first, then the rate of the tenant it found, the
    // request gate, and the session guard.
    let mut mcp = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(from_fn_with_state(
            sessions::GuardState {
                book: Arc::clone(&book),
                default_tenant: tenant.clone(),
            },
            sessions::guard,
        ))
        .layer(from_fn_with_state(
            gate::GateState {
                max_bytes: options.max_request_bytes,
                book,
                default_tenant: tenant,
                metrics: Arc::clone(server.metrics()),
            },
            gate::gate,
        ))
        .layer(from_fn_with_state(limiter, rate_limit));
    let mut app = axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(server.clone());
    if let Some(auth) = &options.auth {
        mcp = mcp.layer(from_fn_with_state(
            AuthState {
                auth: auth.clone(),
                metrics: Arc::clone(server.metrics()),
            },
            authenticate,
        ));
        if !auth.authorization_servers.is_empty() {
            app = app.merge(
                axum::Router::new()
                    .route(RESOURCE_METADATA_PATH, get(resource_metadata))
                    .route(
                        "/.well-known/oauth-protected-resource",
                        get(resource_metadata),
                    )
                    .with_state(auth.clone()),
            );
        }
    }
    app.merge(mcp)
        .layer(axum::middleware::from_fn(session_end_is_no_content))
}

/// How long requests in flight may take to finish once shutdown starts.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` fires, then gives the requests in flight
/// [`SHUTDOWN_GRACE`] to finish (a client holding a connection open cannot keep the server
/// up). Connections are capped and timed out by `options.connections`.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    options: &HttpOptions,
    metrics: Arc<crate::Metrics>,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
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
    listener::serve(
        listener,
        app,
        options.connections.clone(),
        metrics,
        shutdown,
        force,
    )
    .await;
    grace.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_hosts_give_the_default_origins() {
        let options = HttpOptions {
            allowed_hosts: vec![
                "localhost".into(),
                "::1".into(),
                "runbox.example:8443".into(),
            ],
            ..HttpOptions::default()
        };
        assert_eq!(
            options.origins(),
            [
                "http://localhost:*",
                "https://localhost:*",
                "http://[::1]:*",
                "https://[::1]:*",
                "http://runbox.example:8443",
                "https://runbox.example:8443",
            ]
        );
        let options = HttpOptions {
            allowed_origins: vec!["https://app.example".into()],
            ..options
        };
        assert_eq!(options.origins(), ["https://app.example"]);
    }
}
