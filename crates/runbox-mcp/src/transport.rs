//! The two transports: stdio (what desktop clients spawn) and streamable HTTP (`/mcp`).
//! Both revisions in use are answered on each: 2025-11-25 with `initialize` and sessions,
//! 2026-07-28 stateless with `server/discover`; rmcp negotiates. Sandbox ids are tool
//! arguments, never tied to an HTTP session.
//!
//! Over HTTP, `/mcp` is a front of the shared HTTP layer (`runbox-http`), which serves the
//! connections, authenticates callers, limits their rate, and serves `/healthz` and
//! `/metrics` beside it. What is MCP's own stays here, around rmcp: the stdio transport
//! answers every request, even one it cannot read ([`stdio`]); over HTTP, a request gate
//! answers bodies rmcp cannot take with JSON-RPC errors ([`gate`]), sessions belong to their
//! tenant, are capped, expire when idle, and cancel a request whose client went away
//! ([`sessions`]), and rmcp checks `Host` and `Origin`.

mod gate;
mod sessions;
mod stdio;

pub use sessions::SessionLimits;

use std::sync::Arc;

use axum::middleware::from_fn_with_state;
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::server::RunboxServer;

/// Why a transport stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The MCP session could not start.
    #[error("MCP over stdio: {0}")]
    Stdio(String),
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

/// Settings of the MCP front over HTTP (authentication, rates and connections are the shared
/// layer's).
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
    /// Caps and expiry of MCP sessions.
    pub sessions: SessionLimits,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            max_request_bytes: MAX_REQUEST_BYTES,
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

/// The MCP front: `/mcp`, through the request gate and the session guard to rmcp's service.
/// The shared layer puts authentication and rate limits (POSTs: one message each) in front
/// of it, and names it the OAuth protected resource `/mcp`.
pub fn http_front(
    server: RunboxServer,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> runbox_http::Front {
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
    let tenant = server.default_tenant().to_owned();
    // Layers run outside in: the request gate, then the session guard.
    let router = axum::Router::new()
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
        .layer(axum::middleware::from_fn(session_end_is_no_content));
    runbox_http::Front::new(router)
        .rate_counts(|method| method == axum::http::Method::POST)
        .oauth_resource("/mcp")
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
