//! `runbox serve`: the MCP server on the local engine, over stdio or streamable HTTP.
//!
//! SIGINT, SIGTERM and (with stdio) the end of stdin shut it down cleanly: the transport
//! stops, every sandbox (pooled ones included) is closed, and nothing is left running.

use std::sync::Arc;

use anyhow::Context;
use runbox_core::{Backend, Registry, RegistryConfig};
use runbox_local::LocalBackend;
use runbox_mcp::{HttpOptions, RunboxServer, ServerSettings};
use tokio_util::sync::CancellationToken;

use crate::config::{ServeArgs, ServeConfig, Transport};

/// Exit status for a configuration the server refuses to start with.
const EXIT_CONFIG: u8 = 2;
/// Exit status when the server failed while running.
const EXIT_FAILED: u8 = 1;

pub(crate) async fn main(args: ServeArgs) -> u8 {
    let config = match ServeConfig::resolve(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("runbox serve: {e:#}");
            return EXIT_CONFIG;
        }
    };
    match serve(config).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("runbox serve: {e:#}");
            EXIT_FAILED
        }
    }
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let mut local = config.engine.local_config(config.limits.clone());
    // The pool's sandboxes must not take the room of callers' sandboxes.
    local.max_sandboxes = config.max_sandboxes + config.pool;
    local.data_dir = config.data_dir.clone();
    let backend: Arc<dyn Backend> = Arc::new(
        LocalBackend::new(local)
            .await
            .context("starting the local sandbox engine")?,
    );
    let registry = Registry::new(
        backend,
        RegistryConfig {
            default_idle_timeout: config.sandbox_timeout,
            max_idle_timeout: config.max_sandbox_timeout,
            pool_size: config.pool,
            ..Default::default()
        },
    );
    registry.start();
    let server = RunboxServer::new(
        Arc::clone(&registry),
        ServerSettings {
            default_run_timeout: config.run_timeout,
            max_run_timeout: config.max_run_timeout,
            data_dir: config.data_dir.clone(),
            ..Default::default()
        },
    );

    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    let result = match config.transport {
        Transport::Stdio => runbox_mcp::serve_stdio(server, shutdown.clone())
            .await
            .map_err(anyhow::Error::from),
        Transport::Http(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let bound = listener.local_addr()?;
            // Said on stderr whatever the log level: with port 0 it is the only way to know.
            eprintln!("runbox: serving MCP on http://{bound}/mcp (health: http://{bound}/healthz)");
            let options = HttpOptions {
                allowed_hosts: config.allowed_hosts.clone(),
                allowed_origins: config.allowed_origins.clone(),
                ..Default::default()
            };
            let app = runbox_mcp::http_app(server, &options, shutdown.child_token());
            runbox_mcp::serve_http(listener, app, shutdown.clone())
                .await
                .map_err(anyhow::Error::from)
        }
    };
    tracing::info!("shutting down: closing every sandbox");
    registry.shutdown().await;
    result
}

async fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot watch SIGINT and SIGTERM");
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received");
    shutdown.cancel();
}
