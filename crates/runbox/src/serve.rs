//! `runbox serve`: the MCP server on the local engine, over stdio or streamable HTTP.
//!
//! SIGINT, SIGTERM and (with stdio) the end of stdin shut it down cleanly: the transport
//! stops, every sandbox (pooled ones included) is closed, and nothing is left running.

use std::sync::Arc;

use anyhow::Context;
use runbox_core::{Backend, EventKind, Registry, RegistryConfig, SandboxId};
use runbox_http::{Metrics, Rejection};
use runbox_local::{Egress, EgressConfig, LocalBackend};
use runbox_mcp::{AuditLog, HttpOptions, PackageNetwork, RunboxServer, ServerSettings};
use tokio_util::sync::CancellationToken;

use crate::config::{ServeConfig, Transport};

/// Exit status for a configuration the server refuses to start with.
pub(crate) const EXIT_CONFIG: u8 = 2;
/// Exit status when the server failed while running.
const EXIT_FAILED: u8 = 1;

/// `runbox serve` with its flags and variables as parsed (`given`).
pub(crate) async fn main(given: &clap::ArgMatches) -> u8 {
    let config = match ServeConfig::load(given) {
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

/// Egress refusals on their way from the proxies to the registry, which tells each
/// sandbox's owner ([`forward_refusals`]). Bounded: the proxies never wait for it, and a
/// flood of refusals loses the newest.
type Refusals = tokio::sync::mpsc::Sender<(SandboxId, EventKind)>;

/// Refusals buffered before the registry reads them.
const REFUSALS_BUFFER: usize = 256;

/// Hands every egress refusal to the registry, which publishes it to the sandbox's owner.
async fn forward_refusals(
    registry: Arc<Registry>,
    mut refusals: tokio::sync::mpsc::Receiver<(SandboxId, EventKind)>,
) {
    while let Some((id, kind)) = refusals.recv().await {
        registry.report(&id, kind);
    }
}

/// What the egress proxy's policy is made from: the operator's settings, and where its
/// decisions go.
#[derive(Clone)]
struct EgressSettings {
    python: std::path::PathBuf,
    hosts: Option<runbox_egress::Allowlist>,
    addresses: Vec<runbox_egress::IpNet>,
    metrics: Arc<Metrics>,
    refusals: Refusals,
}

/// The egress proxy's policy: the operator's hosts, or those of this machine's pip and npm,
/// with the package-index settings sandboxes need to use them. Runs pip and npm and resolves
/// names, so it is worked out on first use, never before the server answers.
async fn egress_config(settings: EgressSettings) -> EgressConfig {
    let commands = runbox_egress::IndexCommands {
        python: settings.python,
        npm: "npm".into(),
        ..Default::default()
    };
    // `--allow-host none`: no sandbox gets a network, so there is nothing to discover.
    let found = match &settings.hosts {
        Some(list) if list.is_empty() => runbox_egress::IndexHosts::default(),
        _ => runbox_egress::discover_index_hosts(&commands).await,
    };
    let allowlist = match &settings.hosts {
        Some(list) => list.clone(),
        None => runbox_egress::Allowlist::parse(found.all()).unwrap_or_default(),
    };
    let mut allow_addresses = settings.addresses;
    allow_addresses.extend(index_addresses(&found, &allowlist).await);
    if allowlist.is_empty() {
        tracing::info!("no egress hosts: sandboxes cannot have network access");
    } else {
        tracing::info!(hosts = %allowlist, "sandboxes created with network \"allowlist\" may reach these hosts");
    }
    EgressConfig {
        policy: runbox_egress::Policy::new(allowlist).with_allow_addresses(allow_addresses),
        index_env: found.env,
        events: Some({
            let metrics = settings.metrics;
            let refusals = settings.refusals;
            Arc::new(move |id: &SandboxId, d: &runbox_egress::Decision| {
                metrics.egress(d.reason.as_str());
                if !d.allowed() {
                    let kind = EventKind::EgressRefused {
                        host: d.host.clone(),
                        port: d.port,
                        reason: d.reason.as_str().to_owned(),
                        detail: d.detail.clone(),
                    };
                    let _ = refusals.try_send((id.clone(), kind));
                }
            })
        }),
    }
}

/// The addresses of this machine's own package indexes (those allowed) that the proxy would
/// otherwise refuse as not public: a mirror on the local network, or a lab network that maps
/// the registries to a reserved range. The host's pip and npm already trust them, so the
/// proxy may connect there, but never to loopback, link-local, multicast or unspecified
/// addresses. Resolved once, at start-up: a later answer cannot add one.
async fn index_addresses(
    found: &runbox_egress::IndexHosts,
    allowlist: &runbox_egress::Allowlist,
) -> Vec<runbox_egress::IpNet> {
    use runbox_egress::{AddressClass, Host, IpNet, classify};
    let mut nets = Vec::new();
    for entry in found.all() {
        let Ok(pattern) = runbox_egress::HostPattern::parse(&entry) else {
            continue;
        };
        let name = entry.rsplit_once(':').map_or(entry.as_str(), |(h, _)| h);
        let Ok(host) = Host::parse(name) else {
            continue;
        };
        let port = pattern.port().unwrap_or(443);
        if !allowlist.permits(&host, port) {
            continue;
        }
        let Ok(addrs) = tokio::net::lookup_host((name, port)).await else {
            continue;
        };
        for addr in addrs {
            let ip = addr.ip();
            match classify(ip) {
                None
                | Some(
                    AddressClass::Loopback
                    | AddressClass::LinkLocal
                    | AddressClass::Unspecified
                    | AddressClass::Multicast
                    | AddressClass::Broadcast,
                ) => {}
                Some(class) => {
                    tracing::info!(
                        host = name,
                        address = %ip,
                        "the package index resolves to a {class} address; the egress proxy may connect to it"
                    );
                    nets.push(IpNet::from(ip));
                }
            }
        }
    }
    nets.dedup();
    nets
}

/// The embedded local backend, and whether its sandboxes can reach package indexes.
async fn local_backend(
    config: &ServeConfig,
    metrics: &Arc<Metrics>,
    refusals: Refusals,
) -> anyhow::Result<(Arc<dyn Backend>, PackageNetwork)> {
    let mut local = config.engine.local_config(config.limits.clone());
    // The pool's sandboxes must not take the room of callers' sandboxes.
    local.max_sandboxes = config.max_sandboxes + config.pool;
    local.data_dir = config.data_dir.clone();
    let egress = Egress::later(egress_config(EgressSettings {
        python: config
            .engine
            .python
            .clone()
            .unwrap_or_else(|| "python3".into()),
        hosts: config.egress_hosts.clone(),
        addresses: config.egress_addresses.clone(),
        metrics: Arc::clone(metrics),
        refusals,
    }));
    local.egress = Some(egress.clone());
    let package_network = match &config.egress_hosts {
        Some(list) => PackageNetwork::from(!list.is_empty()),
        None => PackageNetwork::later(move || {
            let egress = egress.clone();
            async move { !egress.get().await.policy.allowlist.is_empty() }
        }),
    };
    let backend = LocalBackend::new(local)
        .await
        .context("starting the local sandbox engine")?;
    // Refused now, saying why, rather than answering every call with an error.
    backend
        .self_test()
        .await
        .context("sandboxes cannot run here, so the server does not start")?;
    Ok((Arc::new(backend), package_network))
}

/// The cloud backend (E2B, Novita). Its sandboxes reach the internet through their provider
/// when created with network "allowlist", so packages can be installed.
fn e2b_backend(
    config: &ServeConfig,
    settings: &crate::config::E2bSettings,
) -> anyhow::Result<Arc<dyn Backend>> {
    let mut c = settings.config();
    c.default_lifetime = config.sandbox_timeout;
    c.limits = config.limits.clone();
    tracing::info!(
        provider = c.provider.name(),
        domain = %c.domain,
        template = %c.template,
        "running sandboxes in the cloud (--backend e2b)"
    );
    let backend = runbox_e2b::E2bBackend::new(c).context("the e2b backend")?;
    Ok(Arc::new(backend))
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let auth = crate::auth::setup(&config.auth).await?;
    let audit = match &config.audit_log {
        Some(path) => Some(Arc::new(
            AuditLog::open(path, config.audit_code)
                .with_context(|| format!("opening the audit log {}", path.display()))?,
        )),
        None => None,
    };
    let (refusals, refused) = tokio::sync::mpsc::channel(REFUSALS_BUFFER);
    let (backend, package_network) = match &config.e2b {
        Some(settings) => (e2b_backend(&config, settings)?, PackageNetwork::from(true)),
        None => local_backend(&config, &metrics, refusals).await?,
    };
    let registry = Registry::new(
        backend,
        RegistryConfig {
            default_idle_timeout: config.sandbox_timeout,
            max_idle_timeout: config.max_sandbox_timeout,
            pause_timeout: config.pause_timeout,
            pool_size: config.pool,
            base_env: config.pass_through_env.0.clone(),
            quotas: runbox_core::Quotas {
                lookup: auth.as_ref().and_then(|(_, lookup)| lookup.clone()),
                ..config.quotas.clone()
            },
            on_refusal: Some({
                let metrics = Arc::clone(&metrics);
                Arc::new(move |limit| metrics.rejected(Rejection::Quota(limit)))
            }),
            // Two listings of a remote tree per run cost more than the list of changed
            // files is worth.
            track_changes: config.e2b.is_none(),
            ..Default::default()
        },
    );
    registry.start();
    tokio::spawn(forward_refusals(Arc::clone(&registry), refused));
    let server = RunboxServer::new(
        Arc::clone(&registry),
        ServerSettings {
            default_run_timeout: config.run_timeout,
            max_run_timeout: config.max_run_timeout,
            data_dir: config.data_dir.clone(),
            profile: config.profile,
            package_network,
            audit,
            metrics: Arc::clone(&metrics),
            tasks: config.tasks.clone(),
            message_limit: config.message_limit,
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
            let connections = connection_limits(&config);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let bound = listener.local_addr()?;
            // Said on stderr whatever the log level: with port 0 it is the only way to know.
            eprintln!(
                "runbox: serving MCP on http://{bound}/mcp (health: http://{bound}/healthz, \
                 metrics: http://{bound}/metrics)"
            );
            // The shared layer (authentication, rates, connections, /healthz, /metrics)
            // with each front's routes in it: MCP's today.
            let shared = runbox_http::Shared {
                auth: auth.map(|(auth, _)| auth),
                rate_limit: config.rate_limit,
                default_tenant: server.default_tenant().to_owned(),
                metrics: Arc::clone(&metrics),
                status: Arc::new(RegistryStatus(Arc::clone(&registry))),
            };
            let mcp = runbox_mcp::http_front(
                server,
                &HttpOptions {
                    allowed_hosts: config.allowed_hosts.clone(),
                    allowed_origins: config.allowed_origins.clone(),
                    sessions: config.sessions.clone(),
                    ..Default::default()
                },
                shutdown.child_token(),
            );
            let app = runbox_http::app(&shared, vec![mcp]);
            runbox_http::serve(listener, app, connections, metrics, shutdown.clone()).await;
            Ok(())
        }
    };
    tracing::info!("shutting down: closing every sandbox");
    registry.shutdown().await;
    result
}

/// Descriptors the server keeps for each local sandbox it may hold: its control socket, a
/// kernel's pipes and control socket per language, background processes' pipes, exported
/// directories, and its egress proxy's tunnels (two sockets each).
const FDS_PER_SANDBOX: u64 = 32 + 2 * runbox_egress::DEFAULT_MAX_TUNNELS as u64;
/// Descriptors for each cloud sandbox: the connections of the calls in progress to it.
const FDS_PER_CLOUD_SANDBOX: u64 = 8;
/// Descriptors for everything else: the listener, logs, the tokens file, the runtime.
const FDS_BASE: u64 = 256;
/// Fewest connections served, whatever the descriptor budget.
const MIN_CONNECTIONS: usize = 16;

/// Raises the soft limit on open files to the hard one: each HTTP connection and each
/// sandbox holds descriptors. The limit in force after.
fn raise_open_files() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise the open-files limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!("cannot read the open-files limit: {e}");
            1024
        }
    }
}

/// The connection limits, with the cap on connections lowered so that, with every
/// connection open, the descriptors every sandbox needs are still free.
fn connection_limits(config: &ServeConfig) -> runbox_http::ConnectionLimits {
    let mut limits = config.connections.clone();
    let files = raise_open_files();
    let sandboxes = (config.max_sandboxes + config.pool) as u64;
    let per_sandbox = if config.e2b.is_some() {
        FDS_PER_CLOUD_SANDBOX
    } else {
        FDS_PER_SANDBOX
    };
    let reserved = FDS_BASE + per_sandbox * sandboxes;
    let budget = usize::try_from(files.saturating_sub(reserved)).unwrap_or(usize::MAX);
    if limits.max_connections > budget {
        let cap = budget.max(MIN_CONNECTIONS);
        tracing::warn!(
            open_files = files,
            reserved,
            "the open-files limit leaves room for {cap} HTTP connections beside {sandboxes} \
             sandboxes, fewer than the {} asked for; raise the limit (ulimit -n) to serve more",
            limits.max_connections
        );
        limits.max_connections = cap;
    }
    limits.max_connections_per_address = limits
        .max_connections_per_address
        .min(limits.max_connections);
    limits
}

/// The registry, as `/healthz` and `/metrics` tell it.
struct RegistryStatus(Arc<Registry>);

impl runbox_http::Status for RegistryStatus {
    fn health(&self) -> serde_json::Map<String, serde_json::Value> {
        let r = &self.0;
        let mut m = serde_json::Map::new();
        m.insert("backend".into(), r.backend().name().into());
        m.insert("sandboxes".into(), r.count().into());
        m.insert("pooled".into(), r.pooled().into());
        m
    }

    fn census(&self) -> runbox_core::Census {
        self.0.census()
    }
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
