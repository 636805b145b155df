//! The MCP server: the tools of the default profile, on top of the sandbox registry.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{Extension, ToolCallContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, prompt_handler, tool, tool_handler, tool_router};
use runbox_core::{
    CommandRequest, CreateRequest, Error, ExecContext, ExecRequest, Network, OutputChunk,
    OutputStream, Ran, Registry, SandboxId, Work,
};
use tokio::sync::mpsc;

use crate::audit::{self, AuditLog};
use crate::caller::{Caller, caller_of};
use crate::metrics::{Metrics, RunOutcome};
use crate::profiles::{Profile, Sessions};
use crate::render;
use crate::resources::{self, DataCatalog, SANDBOX_FILE_TEMPLATE, Target};
use crate::types::{
    CloseSandboxOutput, CreateSandboxArgs, CreateSandboxOutput, LimitsOut, ListSandboxesOutput,
    NetworkArg, ProcessOut, RunCodeArgs, RunCodeOutput, RunCommandArgs, RunCommandOutput,
    SandboxArgs, SandboxStatusOutput, SandboxSummary, language_arg, run_code_output,
    run_command_output,
};

/// What the server needs beyond the registry.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// A run's timeout when the caller gives none.
    pub default_run_timeout: Duration,
    /// The longest timeout a caller may ask for.
    pub max_run_timeout: Duration,
    /// The tenant of requests that carry no [`Caller`] (stdio, and HTTP without
    /// authentication): one local tenant.
    pub tenant: String,
    /// The operator's data files, listed as `data://` resources (the backend mounts the same
    /// directory at /data in every sandbox).
    pub data_dir: Option<PathBuf>,
    /// The tools offered: runbox's own, or a compatibility profile's.
    pub profile: Profile,
    /// Whether sandboxes that compatibility profiles create for packages to be installed in
    /// (novita-tutorial's and mcp-code-sandbox's, as their seeds' sandboxes had a network) get
    /// network "allowlist": the operator's egress hosts. False when there are none.
    pub package_network: PackageNetwork,
    /// Where every tool call is recorded, when the operator asked for an audit log.
    pub audit: Option<Arc<AuditLog>>,
    /// The server's metrics (shared with the transport, which serves and feeds them too).
    pub metrics: Arc<Metrics>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            default_run_timeout: Duration::from_secs(60),
            max_run_timeout: Duration::from_secs(600),
            tenant: "local".into(),
            data_dir: None,
            profile: Profile::Default,
            package_network: PackageNetwork::from(false),
            audit: None,
            metrics: Arc::new(Metrics::new()),
        }
    }
}

/// Whether the server has egress hosts for packages: known at start, or found on first use
/// (the host's package indexes are discovered only when something needs them, so that the
/// server answers its first request at once).
#[derive(Clone)]
pub struct PackageNetwork(
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>,
);

impl PackageNetwork {
    /// The answer `find` gives, asked each time it is needed (`find` caches what it finds).
    pub fn later<F, Fut>(find: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        Self(Arc::new(move || Box::pin(find())))
    }

    /// Whether there is a network for packages.
    pub async fn get(&self) -> bool {
        (self.0)().await
    }
}

impl From<bool> for PackageNetwork {
    fn from(known: bool) -> Self {
        Self::later(move || std::future::ready(known))
    }
}

impl std::fmt::Debug for PackageNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PackageNetwork")
    }
}

/// Instructions sent to clients at initialisation.
pub const INSTRUCTIONS: &str = "runbox runs code in isolated sandboxes. Use run_code without a \
sandbox_id for one-off snippets. For related steps, call create_sandbox once and pass its \
sandbox_id to run_code and run_command: variables, imports, functions and files in /workspace \
persist there. Python and JavaScript return the value of the last expression, like a notebook \
cell; charts come back as images. Move files with write_file, read_file and list_files. \
Sandboxes have no network access unless created with network \"allowlist\", which lets them \
reach the server's allowed hosts (package indexes) and use install_packages. run_command with \
background: true starts a long job; read_process_output follows it. Close sandboxes with \
close_sandbox when done, or pause_sandbox to keep one for later; idle ones expire on their \
own. The prompt sandbox_instructions explains more.";

struct State {
    registry: Arc<Registry>,
    settings: ServerSettings,
    data: Option<DataCatalog>,
    /// Sandboxes named by callers (the mcp-code-sandbox profile's sessions).
    sessions: Sessions,
}

/// runbox's MCP server. Cheap to clone: every session shares one registry.
#[derive(Clone)]
pub struct RunboxServer {
    state: Arc<State>,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
}

impl std::fmt::Debug for RunboxServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunboxServer")
            .field("settings", &self.state.settings)
            .finish_non_exhaustive()
    }
}

/// How often live output is sent as a progress notification, at most: output arriving in
/// between is gathered into one message. A run that ends sooner sends none (its result
/// carries the output), and a tight print loop cannot flood the client with messages.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// Forwards live output to the client as progress notifications, when it asked for them.
struct Progress {
    sink: Option<runbox_core::OutputSink>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
}

/// Output gathered between two notifications; stderr is marked where it starts.
#[derive(Default)]
struct Gathered {
    text: String,
    last: Option<OutputStream>,
}

impl Gathered {
    fn push(&mut self, chunk: OutputChunk) {
        if chunk.stream == OutputStream::Stderr && self.last != Some(OutputStream::Stderr) {
            if !self.text.is_empty() && !self.text.ends_with('\n') {
                self.text.push('\n');
            }
            self.text.push_str("[stderr] ");
        } else if chunk.stream == OutputStream::Stdout && self.last == Some(OutputStream::Stderr) {
            if !self.text.ends_with('\n') {
                self.text.push('\n');
            }
            self.text.push_str("[stdout] ");
        }
        self.text.push_str(&chunk.text);
        self.last = Some(chunk.stream);
    }
}

impl Progress {
    fn new(ctx: &RequestContext<RoleServer>) -> Self {
        let Some(token) = ctx.meta.get_progress_token() else {
            return Self {
                sink: None,
                forwarder: None,
            };
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<OutputChunk>();
        let peer = ctx.peer.clone();
        let forwarder = tokio::spawn(async move {
            let mut sent = 0.0;
            let mut gathered = Gathered::default();
            let mut next = tokio::time::Instant::now() + PROGRESS_INTERVAL;
            loop {
                let open = tokio::select! {
                    chunk = rx.recv() => match chunk {
                        Some(c) => { gathered.push(c); continue; }
                        None => false,
                    },
                    () = tokio::time::sleep_until(next), if !gathered.text.is_empty() => true,
                };
                // At the end, send what is left only if the client has been seeing output live.
                if !gathered.text.is_empty() && (open || sent > 0.0) {
                    sent += 1.0;
                    let message = std::mem::take(&mut gathered.text);
                    gathered.last = None;
                    let param =
                        ProgressNotificationParam::new(token.clone(), sent).with_message(message);
                    if peer.notify_progress(param).await.is_err() {
                        return;
                    }
                }
                if !open {
                    return;
                }
                next = tokio::time::Instant::now() + PROGRESS_INTERVAL;
            }
        });
        let sink: runbox_core::OutputSink = Arc::new(move |chunk| {
            let _ = tx.send(chunk);
        });
        Self {
            sink: Some(sink),
            forwarder: Some(forwarder),
        }
    }

    /// Waits until every notification is sent, so they all precede the result.
    async fn finish(self) {
        drop(self.sink);
        if let Some(f) = self.forwarder {
            let _ = f.await;
        }
    }
}

/// How a run ended, for the metrics.
fn run_outcome(r: &Result<Ran, Error>) -> RunOutcome {
    match r {
        Ok(ran) => {
            let o = &ran.outcome;
            if o.timed_out {
                RunOutcome::Timeout
            } else if o.cancelled {
                RunOutcome::Cancelled
            } else if o.error.is_some() || o.exit_code.is_some_and(|c| c != 0) {
                RunOutcome::Error
            } else {
                RunOutcome::Ok
            }
        }
        Err(Error::Quota { .. }) => RunOutcome::Refused,
        Err(_) => RunOutcome::Failed,
    }
}

pub(crate) fn seconds(s: f64, what: &str) -> Result<Duration, Error> {
    if !s.is_finite() || s <= 0.0 {
        return Err(Error::InvalidRequest(format!(
            "{what} must be a positive number of seconds, got {s}"
        )));
    }
    Duration::try_from_secs_f64(s).map_err(|e| Error::InvalidRequest(format!("{what}: {e}")))
}

#[tool_router]
impl RunboxServer {
    /// A server over `registry`.
    pub fn new(registry: Arc<Registry>, settings: ServerSettings) -> Self {
        let data = settings.data_dir.clone().map(DataCatalog::new);
        let profile = settings.profile;
        Self {
            state: Arc::new(State {
                registry,
                settings,
                data,
                sessions: Sessions::default(),
            }),
            tool_router: match profile {
                Profile::Default => {
                    Self::tool_router()
                        + Self::file_tools()
                        + Self::lifecycle_tools()
                        + Self::package_tools()
                }
                profile => Self::profile_tools(profile),
            },
            prompt_router: match profile {
                Profile::Default => Self::prompt_router(),
                profile => Self::profile_prompts(profile),
            },
        }
    }

    /// The registry behind the server.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.state.registry
    }

    pub(crate) fn settings(&self) -> &ServerSettings {
        &self.state.settings
    }

    pub(crate) fn sessions(&self) -> &Sessions {
        &self.state.sessions
    }

    /// The tenant of requests that carry no [`Caller`].
    pub fn default_tenant(&self) -> &str {
        &self.state.settings.tenant
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.settings.metrics
    }

    pub(crate) fn data_catalog(&self) -> Option<&DataCatalog> {
        self.state.data.as_ref()
    }

    /// Runs `work` through the registry, with live output as progress notifications when the
    /// client asked for them and the request's cancellation wired to the run.
    pub(crate) async fn run(
        &self,
        caller: &Caller,
        sandbox_id: Option<String>,
        work: Work,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Ran, Error> {
        let tenant = caller.tenant.as_str();
        let progress = Progress::new(ctx);
        let exec_ctx = ExecContext {
            output: progress.sink.clone(),
            cancel: ctx.ct.clone(),
            credential: caller.credential.clone(),
        };
        let id = sandbox_id.map(SandboxId::from);
        let language = match &work {
            Work::Code(req) => req.language.as_str(),
            Work::Command(_) => "command",
        };
        let started = Instant::now();
        let r = self
            .state
            .registry
            .run(tenant, id.as_ref(), work, exec_ctx)
            .await;
        self.metrics()
            .run(language, run_outcome(&r), started.elapsed());
        progress.finish().await;
        r
    }

    /// `run_command` with `background: true`: starts the command and answers at once.
    async fn start_background(
        &self,
        tenant: &str,
        sandbox_id: Option<String>,
        req: CommandRequest,
    ) -> CallToolResult {
        let Some(id) = sandbox_id.map(SandboxId::from) else {
            return render::error(&Error::InvalidRequest(
                "background: true needs a sandbox_id (from create_sandbox): a background process \
                 lives in a sandbox that outlasts the call"
                    .into(),
            ));
        };
        let started = std::time::Instant::now();
        match self.state.registry.start_process(tenant, &id, req).await {
            Ok(info) => render::run_command(&RunCommandOutput {
                sandbox_id: id.to_string(),
                ephemeral: false,
                stdout: String::new(),
                stderr: String::new(),
                exit_code: None,
                process_id: Some(info.id.to_string()),
                duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                truncated: false,
                timed_out: false,
                cancelled: false,
                files: Vec::new(),
                notes: Vec::new(),
            }),
            Err(e) => render::error(&e),
        }
    }

    pub(crate) fn run_timeout(&self, asked: Option<f64>) -> Result<Duration, Error> {
        let s = &self.state.settings;
        match asked {
            None => Ok(s.default_run_timeout),
            Some(t) => {
                let t = seconds(t, "timeout_seconds")?;
                if t > s.max_run_timeout {
                    return Err(Error::InvalidRequest(format!(
                        "timeout_seconds {} exceeds this server's maximum of {} s; for longer work \
                         split it into steps",
                        t.as_secs_f64(),
                        s.max_run_timeout.as_secs_f64()
                    )));
                }
                Ok(t)
            }
        }
    }

    #[tool(
        description = "Run code in a sandbox and return its output, the value of its last expression \
                       (python, javascript), any error with its traceback, and the exit code (bash). \
                       With sandbox_id the code runs in that sandbox and its state persists for the \
                       next call; without it a fresh sandbox is used once and closed.",
        output_schema = schema_for_output::<RunCodeOutput>(),
        annotations(title = "Run code", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn run_code(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let timeout = match self.run_timeout(args.timeout_seconds) {
            Ok(t) => t,
            Err(e) => return render::error(&e),
        };
        let mut req = ExecRequest::new(args.language.into(), args.code, timeout);
        req.env = args.env;
        match self
            .run(&caller, args.sandbox_id, Work::Code(req), &ctx)
            .await
        {
            Ok(ran) => render::run_code(&run_code_output(ran)),
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Run a shell command line (bash -c) in a fresh shell in a sandbox and return its \
                       output and exit code. Use it for tools and scripts (ls, pip list, git, make, \
                       python script.py). Without sandbox_id a fresh sandbox is used once and closed.",
        output_schema = schema_for_output::<RunCommandOutput>(),
        annotations(title = "Run a command", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn run_command(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<RunCommandArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let timeout = match self.run_timeout(args.timeout_seconds) {
            Ok(t) => t,
            Err(e) => return render::error(&e),
        };
        let mut req = CommandRequest::new(args.command, timeout);
        req.cwd = args.cwd;
        req.env = args.env;
        if args.background {
            return self
                .start_background(&caller.tenant, args.sandbox_id, req)
                .await;
        }
        match self
            .run(&caller, args.sandbox_id, Work::Command(req), &ctx)
            .await
        {
            Ok(ran) => render::run_command(&run_command_output(ran)),
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Create a sandbox whose state (variables, imports, files in /workspace) persists \
                       across run_code and run_command calls. Returns its sandbox_id. It closes by \
                       itself after timeout_seconds idle (default 900); close it with close_sandbox \
                       when done.",
        output_schema = schema_for_output::<CreateSandboxOutput>(),
        annotations(title = "Create a sandbox", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn create_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<CreateSandboxArgs>,
    ) -> CallToolResult {
        let idle_timeout = match args
            .timeout_seconds
            .map(|t| seconds(t, "timeout_seconds"))
            .transpose()
        {
            Ok(t) => t,
            Err(e) => return render::error(&e),
        };
        let network = match args.network {
            NetworkArg::None if !args.allow_hosts.is_empty() => {
                return render::error(&Error::InvalidRequest(
                    "allow_hosts needs network: \"allowlist\"".into(),
                ));
            }
            NetworkArg::None => Network::None,
            NetworkArg::Allowlist => Network::Allowlist(args.allow_hosts),
        };
        let req = CreateRequest {
            idle_timeout,
            env: args.env,
            metadata: args.metadata,
            limits: None,
            network,
            credential: caller.credential.clone(),
        };
        match self.state.registry.create(&caller.tenant, req).await {
            Ok((view, info)) => {
                let out = CreateSandboxOutput {
                    sandbox_id: view.id.to_string(),
                    created_at: render::rfc3339(view.created_at),
                    expires_at: render::rfc3339(view.expires_at),
                    timeout_seconds: view.idle_timeout.as_secs_f64(),
                    limits: LimitsOut::from(&info.limits),
                    languages: info.languages.iter().map(|l| language_arg(*l)).collect(),
                    network: if info.allowed_hosts.is_empty() {
                        "none"
                    } else {
                        "allowlist"
                    }
                    .into(),
                    allowed_hosts: info.allowed_hosts,
                    metadata: view.metadata,
                };
                let mut text = format!(
                    "Created sandbox {} (idle timeout {} s, expires {} if unused). Pass this sandbox_id \
                     to run_code and run_command.",
                    out.sandbox_id, out.timeout_seconds, out.expires_at
                );
                if out.allowed_hosts == ["*"] {
                    text.push_str(
                        " It has internet access; install_packages installs pip and npm packages.",
                    );
                } else if !out.allowed_hosts.is_empty() {
                    let _ = write!(
                        text,
                        " It may reach {} over HTTP(S) through a proxy (already set in its \
                         environment); install_packages installs pip and npm packages.",
                        out.allowed_hosts.join(", ")
                    );
                }
                render::ok(text, &out)
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "List your sandboxes with their state and expiry.",
        output_schema = schema_for_output::<ListSandboxesOutput>(),
        annotations(title = "List sandboxes", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_sandboxes(&self, Extension(caller): Extension<Caller>) -> CallToolResult {
        let sandboxes: Vec<SandboxSummary> = self
            .state
            .registry
            .list(&caller.tenant)
            .into_iter()
            .map(|v| SandboxSummary {
                sandbox_id: v.id.to_string(),
                state: render::state_name(v.state).into(),
                created_at: render::rfc3339(v.created_at),
                expires_at: render::rfc3339(v.expires_at),
                timeout_seconds: v.idle_timeout.as_secs_f64(),
                busy: v.busy > 0,
                metadata: v.metadata,
            })
            .collect();
        let text = if sandboxes.is_empty() {
            "No sandboxes. Create one with create_sandbox.".to_owned()
        } else {
            sandboxes
                .iter()
                .map(|s| {
                    format!(
                        "{} {}{} expires {}",
                        s.sandbox_id,
                        s.state,
                        if s.busy { " (busy)" } else { "" },
                        s.expires_at
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        render::ok(text, &ListSandboxesOutput { sandboxes })
    }

    #[tool(
        description = "Get a sandbox's state, creation and expiry times, memory and CPU used, \
                       processes and running kernels.",
        output_schema = schema_for_output::<SandboxStatusOutput>(),
        annotations(title = "Sandbox status", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn get_sandbox_status(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        match self.state.registry.status(&caller.tenant, &id).await {
            Ok((view, status)) => {
                let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                let out = SandboxStatusOutput {
                    sandbox_id: id.to_string(),
                    state: render::state_name(view.state).into(),
                    created_at: render::rfc3339(view.created_at),
                    expires_at: render::rfc3339(view.expires_at),
                    timeout_seconds: view.idle_timeout.as_secs_f64(),
                    busy: view.busy > 0,
                    memory_bytes: status.memory_bytes.map(i),
                    memory_limit_bytes: i(status.limits.memory_bytes()),
                    cpu_seconds: status.cpu_seconds,
                    processes: status.pids.map(i),
                    kernels: status.kernels.iter().map(|l| language_arg(*l)).collect(),
                    background_processes: status.processes.iter().map(ProcessOut::from).collect(),
                    limits: LimitsOut::from(&status.limits),
                };
                let mib = |b: i64| b as f64 / 1048576.0;
                let text = format!(
                    "Sandbox {}: {}{}, created {}, expires {}; memory {} of {:.0} MiB; CPU {}; processes {}; kernels: {}",
                    out.sandbox_id,
                    out.state,
                    if out.busy { " (busy)" } else { "" },
                    out.created_at,
                    out.expires_at,
                    out.memory_bytes
                        .map_or("unknown".into(), |b| format!("{:.1} MiB", mib(b))),
                    mib(out.memory_limit_bytes),
                    out.cpu_seconds
                        .map_or("unknown".into(), |c| format!("{c:.2} s")),
                    out.processes.map_or("unknown".into(), |p| p.to_string()),
                    if out.kernels.is_empty() {
                        "none".to_owned()
                    } else {
                        status
                            .kernels
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                );
                let mut text = text;
                for p in &out.background_processes {
                    let _ = write!(
                        text,
                        "\nprocess {}: {} ({})",
                        p.process_id,
                        p.exit_code
                            .map_or("running".to_owned(), |c| format!("exited with {c}")),
                        p.command
                    );
                }
                render::ok(text, &out)
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Close a sandbox: every process in it is stopped and its files are deleted.",
        output_schema = schema_for_output::<CloseSandboxOutput>(),
        annotations(title = "Close a sandbox", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn close_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        match self.state.registry.close(&caller.tenant, &id).await {
            Ok(()) => render::ok(
                format!("Closed sandbox {id}."),
                &CloseSandboxOutput {
                    sandbox_id: id.to_string(),
                    closed: true,
                },
            ),
            Err(e) => render::error(&e),
        }
    }
}

/// Caching hints (SEP-2549) for peers of protocol 2026-07-28 and later: nothing here may be
/// cached, since sandbox files change with every run; older peers get no hints.
fn no_caching(ctx: &RequestContext<RoleServer>) -> Option<(u64, CacheScope)> {
    ctx.protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
        .then_some((0, CacheScope::Private))
}

impl RunboxServer {
    /// Reads a resource: a file of one of the caller's sandboxes, or a data file.
    async fn read(&self, tenant: &str, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        let not_found = |message: String| {
            ErrorData::resource_not_found(message, Some(serde_json::json!({ "uri": uri })))
        };
        let invalid = |message: String| ErrorData::invalid_params(message, None);
        // A URI of no scheme or shape this server serves names no resource (SEP-2164).
        match resources::parse(uri).map_err(not_found)? {
            Target::SandboxFile(id, path) => {
                let content = self
                    .registry()
                    .read_file(tenant, &id, &path, 0, Some(resources::MAX_RESOURCE))
                    .await
                    .map_err(|e| match e {
                        Error::SandboxNotFound { .. } | Error::FileNotFound { .. } => {
                            not_found(e.to_string())
                        }
                        e => invalid(runbox_core::chain(&e)),
                    })?;
                if content.more() {
                    return Err(invalid(format!(
                        "{path} is {} bytes, over the {}-byte maximum of a resource read; read it \
                         in parts with the read_file tool (offset and length)",
                        content.size,
                        resources::MAX_RESOURCE
                    )));
                }
                let mime = resources::mime_type(&content.path);
                Ok(ReadResourceResult::new(vec![resources::contents(
                    uri,
                    mime,
                    content.data,
                )]))
            }
            Target::Data(name) => {
                let Some(catalog) = self.data_catalog() else {
                    return Err(not_found(format!(
                        "{uri}: this server has no data directory"
                    )));
                };
                match catalog.read(&name) {
                    Ok(Some((file, data))) => {
                        Ok(ReadResourceResult::new(vec![resources::contents(
                            uri,
                            resources::mime_type(&file.relative),
                            data,
                        )]))
                    }
                    Ok(None) => Err(not_found(format!(
                        "{uri}: no such data file (resources/list shows them)"
                    ))),
                    Err(e) => Err(invalid(runbox_core::chain(&e))),
                }
            }
        }
    }
}

impl RunboxServer {
    /// Records a finished tool call in the metrics and, when there is one, the audit log.
    fn record_call(
        &self,
        caller: &Caller,
        tool: &str,
        audited: Audited,
        result: &Result<CallToolResponse, ErrorData>,
        elapsed: Duration,
    ) {
        let outcome = match result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => "error",
            Ok(_) => "ok",
            Err(_) => "invalid",
        };
        self.metrics().tool_call(tool, outcome);
        let Some(audit) = &self.state.settings.audit else {
            return;
        };
        // A new sandbox's id is in the answer.
        let created = match result {
            Ok(CallToolResponse::Complete(r)) => r
                .structured_content
                .as_ref()
                .and_then(|v| v.get("sandbox_id"))
                .and_then(serde_json::Value::as_str),
            _ => None,
        };
        audit.record(&audit::Entry {
            time: audit::now(),
            tenant: &caller.tenant,
            tool,
            sandbox_id: audited.sandbox_id.as_deref().or(created),
            outcome,
            duration_ms: audit::millis(elapsed),
            code: audited.code.as_deref(),
        });
    }
}

/// What the audit log keeps of a call's arguments, taken before the tool consumes them
/// (only these strings: arguments can be megabytes of file content).
#[derive(Default)]
struct Audited {
    sandbox_id: Option<String>,
    code: Option<String>,
}

impl Audited {
    fn of(audit: Option<&AuditLog>, arguments: Option<&rmcp::model::JsonObject>) -> Self {
        let (Some(audit), Some(args)) = (audit, arguments) else {
            return Self::default();
        };
        let arg = |name: &str| args.get(name).and_then(serde_json::Value::as_str);
        Self {
            sandbox_id: arg("sandbox_id").map(str::to_owned),
            code: audit
                .include_code()
                .then(|| arg("code").or_else(|| arg("command")))
                .flatten()
                .map(str::to_owned),
        }
    }
}

#[tool_handler(router = self.tool_router)]
#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for RunboxServer {
    /// Every tool call goes through here: the caller is put where tools find it
    /// (`Extension<Caller>`), and the call is counted and audited.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = caller_of(&context, self.default_tenant());
        context.extensions.insert(caller.clone());
        let started = Instant::now();
        let name = request.name.clone();
        let audited = Audited::of(
            self.state.settings.audit.as_deref(),
            request.arguments.as_ref(),
        );
        let tcc = ToolCallContext::new(self, request, context);
        let result = self.tool_router.call(tcc).await;
        self.record_call(&caller, &name, audited, &result, started.elapsed());
        result
    }

    /// A request rmcp could not decode as the MCP request its method names arrives here:
    /// its params do not fit, which is `-32602` naming the field (not "method not found").
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let stateless = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        Err(
            crate::jsonrpc::invalid_params(&request.method, request.params.as_ref(), stateless)
                .unwrap_or_else(|| {
                    ErrorData::new(
                        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                        request.method.clone(),
                        None,
                    )
                }),
        )
    }

    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_prompts()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("runbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.state.settings.profile.instructions())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let files = self
            .data_catalog()
            .map(|c| {
                c.files()
                    .iter()
                    .map(resources::DataFile::resource)
                    .collect()
            })
            .unwrap_or_default();
        let mut result = ListResourcesResult::with_all_items(files);
        if let Some((ttl, scope)) = no_caching(&ctx) {
            result = result.with_ttl_ms(ttl).with_cache_scope(scope);
        }
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let template = ResourceTemplate::new(SANDBOX_FILE_TEMPLATE, "sandbox_file")
            .with_title("A file in one of your sandboxes")
            .with_description(
                "A file of a sandbox from create_sandbox, by its absolute path without the \
                 leading slash, e.g. sandbox://sbx_1a2b/files/workspace/out.csv. Text comes back \
                 as text, other files as base64 blobs (at most 8 MiB; read_file reads bigger \
                 files in parts).",
            );
        let mut result = ListResourceTemplatesResult::with_all_items(vec![template]);
        if let Some((ttl, scope)) = no_caching(&ctx) {
            result = result.with_ttl_ms(ttl).with_cache_scope(scope);
        }
        Ok(result)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let mut result = self
            .read(&caller_of(&ctx, self.default_tenant()).tenant, &request.uri)
            .await?;
        if let Some((ttl, scope)) = no_caching(&ctx) {
            result = result.with_ttl_ms(ttl).with_cache_scope(scope);
        }
        Ok(result.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(stream: OutputStream, text: &str) -> OutputChunk {
        OutputChunk {
            stream,
            text: text.to_owned(),
        }
    }

    #[test]
    fn gathered_output_marks_where_stderr_starts_and_stops() {
        let mut g = Gathered::default();
        g.push(chunk(OutputStream::Stdout, "a\n"));
        g.push(chunk(OutputStream::Stdout, "b"));
        g.push(chunk(OutputStream::Stderr, "oops\n"));
        g.push(chunk(OutputStream::Stderr, "again\n"));
        g.push(chunk(OutputStream::Stdout, "c\n"));
        assert_eq!(g.text, "a\nb\n[stderr] oops\nagain\n[stdout] c\n");
    }

    #[test]
    fn timeouts_are_checked_against_the_maximum() {
        assert!(seconds(0.0, "t").is_err());
        assert!(seconds(f64::NAN, "t").is_err());
        assert!(seconds(-1.0, "t").is_err());
        assert_eq!(seconds(1.5, "t").unwrap(), Duration::from_millis(1500));
    }
}
