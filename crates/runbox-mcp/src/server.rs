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
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CompleteRequestParams, CompleteResult, CreateTaskResult, GetTaskParams, GetTaskResult,
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ResourceTemplate, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    SubscriptionFilter, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, prompt_handler, tool, tool_handler, tool_router};
use runbox_core::{
    CommandRequest, CreateRequest, Error, ExecContext, ExecRequest, Network, OutputChunk,
    OutputStream, Ran, Registry, SandboxId, Work,
};
use tokio::sync::mpsc;

use crate::audit::{self, AuditLog};
use crate::caller::{Caller, caller_of};
use crate::completions;
use crate::logging::{self, Logs};
use crate::outputs::OutputStore;
use crate::profiles::{Profile, Sessions};
use crate::render;
use crate::resources::{self, DataCatalog, SANDBOX_FILE_TEMPLATE, Target};
use crate::subscriptions::{Refused, Subscriptions};
use crate::tasks::{Started, TASK_TOOLS, TaskSettings, Tasks};
use crate::types::{
    CloseSandboxOutput, CreateSandboxArgs, CreateSandboxOutput, EnforcedLimitsOut, LimitsOut,
    ListSandboxesOutput, NetworkArg, ProcessOut, RunCodeArgs, RunCodeOutput, RunCommandArgs,
    RunCommandOutput, SandboxArgs, SandboxStatusOutput, SandboxSummary, language_arg,
    run_code_output, run_command_output,
};
use runbox_http::{Metrics, RunOutcome};

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
    /// Limits on task-augmented calls (the tasks extension).
    pub tasks: TaskSettings,
    /// The most bytes one answer may take (see `budget`).
    pub message_limit: usize,
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
            tasks: TaskSettings::default(),
            message_limit: crate::budget::DEFAULT_MESSAGE_LIMIT,
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
    /// Who hears which sandbox's lifecycle events (logging).
    logs: Arc<Logs>,
    /// Who is told when a sandbox file changes (resource subscriptions).
    subscriptions: Arc<Subscriptions>,
    /// Task-augmented calls (the tasks extension).
    tasks: Arc<Tasks>,
    /// The next MCP session's key.
    next_session: std::sync::atomic::AtomicU64,
    /// Outputs too big to send inline, or referred to by URI.
    outputs: OutputStore,
    /// Background processes' output read but not yet sent.
    backlogs: crate::lifecycle::Backlogs,
}

/// runbox's MCP server. Cheap to clone: every session shares one registry.
#[derive(Clone)]
pub struct RunboxServer {
    state: Arc<State>,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
    /// Which MCP session this instance serves (each HTTP session gets its own instance,
    /// [`RunboxServer::for_session`]): its log level and subscriptions are kept under it.
    session: u64,
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

/// Where a run happens: in a sandbox (or, without an id, a fresh one from the pool), or in
/// a fresh sandbox made for it as a request asks.
enum RunIn {
    Sandbox(Option<SandboxId>),
    Fresh(CreateRequest),
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
        let logs = Logs::start(&registry);
        let tasks = Tasks::new(settings.tasks.clone());
        Self {
            state: Arc::new(State {
                registry,
                settings,
                data,
                sessions: Sessions::default(),
                logs,
                subscriptions: Arc::default(),
                tasks,
                next_session: std::sync::atomic::AtomicU64::new(1),
                outputs: OutputStore::default(),
                backlogs: Default::default(),
            }),
            session: 0,
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

    /// The same server for a new MCP session: shared state, its own session key.
    pub fn for_session(&self) -> Self {
        let mut s = self.clone();
        s.session = self
            .state
            .next_session
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s
    }

    pub(crate) fn settings(&self) -> &ServerSettings {
        &self.state.settings
    }

    pub(crate) fn sessions(&self) -> &Sessions {
        &self.state.sessions
    }

    pub(crate) fn outputs(&self) -> &OutputStore {
        &self.state.outputs
    }

    pub(crate) fn backlogs(&self) -> &crate::lifecycle::Backlogs {
        &self.state.backlogs
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
        let id = sandbox_id.map(SandboxId::from);
        self.run_where(caller, RunIn::Sandbox(id), work, ctx).await
    }

    /// Runs `work` once in a fresh sandbox made as `req` asks, closed after; otherwise as
    /// [`RunboxServer::run`] without a sandbox id.
    pub(crate) async fn run_fresh(
        &self,
        caller: &Caller,
        req: CreateRequest,
        work: Work,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Ran, Error> {
        self.run_where(caller, RunIn::Fresh(req), work, ctx).await
    }

    async fn run_where(
        &self,
        caller: &Caller,
        place: RunIn,
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
        let language = match &work {
            Work::Code(req) => req.language.as_str(),
            Work::Command(_) => "command",
        };
        let started = Instant::now();
        let registry = &self.state.registry;
        let r = match place {
            RunIn::Sandbox(id) => registry.run(tenant, id.as_ref(), work, exec_ctx).await,
            RunIn::Fresh(req) => registry.run_once(tenant, req, work, exec_ctx).await,
        };
        self.metrics()
            .run(language, run_outcome(&r), started.elapsed());
        progress.finish().await;
        if let Ok(ran) = &r
            && !ran.ephemeral
        {
            self.files_changed(tenant, ran);
        }
        r
    }

    /// Tells the subscribers of a sandbox's files what a run changed.
    fn files_changed(&self, tenant: &str, ran: &Ran) {
        let paths: Option<Vec<String>> = ran
            .changes
            .as_ref()
            .filter(|c| c.omitted == 0)
            .map(|c| c.files.iter().map(|f| f.path.clone()).collect());
        self.state
            .subscriptions
            .changed(tenant, &ran.sandbox_id, paths.as_deref());
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
            Ok(info) => render::run_command(
                &RunCommandOutput {
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
                },
                &crate::budget::Stash {
                    store: self.outputs(),
                    tenant,
                    limit: self.message_limit(),
                },
            ),
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
            Ok(ran) => render::run_code(run_code_output(ran), &self.stash(&caller)),
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
            Ok(ran) => render::run_command(&run_command_output(ran), &self.stash(&caller)),
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
                       processes, running kernels, and which limits actually hold \
                       (enforced_limits).",
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
                    memory_limit_bytes: status.enforced.sandbox_memory_bytes().map(i),
                    cpu_seconds: status.cpu_seconds,
                    processes: status.pids.map(i),
                    kernels: status.kernels.iter().map(|l| language_arg(*l)).collect(),
                    background_processes: status.processes.iter().map(ProcessOut::from).collect(),
                    limits: LimitsOut::from(&status.limits),
                    enforced_limits: EnforcedLimitsOut::from(&status.enforced),
                };
                let mib = |b: i64| b as f64 / 1048576.0;
                let text = format!(
                    "Sandbox {}: {}{}, created {}, expires {}; memory {}{}; CPU {}; processes {}; kernels: {}; limits in force: {}",
                    out.sandbox_id,
                    out.state,
                    if out.busy { " (busy)" } else { "" },
                    out.created_at,
                    out.expires_at,
                    out.memory_bytes
                        .map_or("unknown".into(), |b| format!("{:.1} MiB", mib(b))),
                    out.memory_limit_bytes
                        .map_or(String::new(), |l| format!(" of {:.0} MiB", mib(l))),
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
                    status.enforced,
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
    /// Reads a resource: a file of one of the caller's sandboxes, a data file, or one of the
    /// profile's own.
    async fn read(&self, caller: &Caller, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        if let Some(r) = self.read_profile_resource(caller, uri).await {
            return Ok(r);
        }
        let tenant = caller.tenant.as_str();
        let not_found = |message: String| {
            ErrorData::resource_not_found(message, Some(serde_json::json!({ "uri": uri })))
        };
        let invalid = |message: String| ErrorData::invalid_params(message, None);
        // A URI of no scheme or shape this server serves names no resource (SEP-2164).
        let (target, piece) = resources::parse_piece(uri).map_err(not_found)?;
        // A piece: as asked, at most what one message carries. Whole: a byte more than
        // that, to tell whether it fits.
        let most = self.piece_budget();
        let (offset, length) = match piece {
            Some(p) => (p.offset, p.length.unwrap_or(most).min(most)),
            None => (0, most + 1),
        };
        let (mime, data, size) = match target {
            Target::SandboxFile(id, path) => {
                let content = self
                    .registry()
                    .read_file(tenant, &id, &path, offset, Some(length))
                    .await
                    .map_err(|e| match e {
                        Error::SandboxNotFound { .. } | Error::FileNotFound { .. } => {
                            not_found(e.to_string())
                        }
                        e => invalid(runbox_core::chain(&e)),
                    })?;
                (
                    resources::mime_type(&content.path),
                    content.data,
                    content.size,
                )
            }
            Target::Data(name) => {
                let Some(catalog) = self.data_catalog() else {
                    return Err(not_found(format!(
                        "{uri}: this server has no data directory"
                    )));
                };
                match catalog.read(&name, offset, length) {
                    Ok(Some((file, data))) => {
                        (resources::mime_type(&file.relative), data, file.size)
                    }
                    Ok(None) => {
                        return Err(not_found(format!(
                            "{uri}: no such data file (resources/list shows them)"
                        )));
                    }
                    Err(e) => return Err(invalid(runbox_core::chain(&e))),
                }
            }
            Target::Output(key) => {
                let Some(output) = self.outputs().get(tenant, &key) else {
                    return Err(not_found(format!(
                        "{uri}: no such output; outputs are kept for a while, the oldest dropped \
                         first to make room, so run the code again to make it anew"
                    )));
                };
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(output.data.len());
                let end = start
                    .saturating_add(usize::try_from(length).unwrap_or(usize::MAX))
                    .min(output.data.len());
                (
                    output.mime,
                    output.data[start..end].to_vec(),
                    output.data.len() as u64,
                )
            }
        };
        let contents = match piece {
            Some(_) => resources::blob(uri, mime, &data),
            None if data.len() as u64 > most => {
                return Err(invalid(format!(
                    "{uri} is {size} bytes, more than one message carries ({most} bytes). Read \
                     it in pieces: {uri}?offset=0&length={most}, then on from offset {most}."
                )));
            }
            None => resources::contents(uri, mime, data, self.read_budget() as usize * 2),
        };
        Ok(ReadResourceResult::new(vec![contents]))
    }
}

/// A string argument of a tool call.
fn argument<'a>(request: &'a CallToolRequestParams, name: &str) -> Option<&'a str> {
    request
        .arguments
        .as_ref()
        .and_then(|a| a.get(name))
        .and_then(serde_json::Value::as_str)
}

/// The sandbox a tool's answer names (the one it created or ran in).
fn answered_sandbox(result: &Result<CallToolResponse, ErrorData>) -> Option<SandboxId> {
    match result {
        Ok(CallToolResponse::Complete(r)) => r
            .structured_content
            .as_ref()
            .and_then(|v| v.get("sandbox_id"))
            .and_then(serde_json::Value::as_str)
            .map(SandboxId::from),
        _ => None,
    }
}

impl RunboxServer {
    /// Whether task-augmented calls are offered: for runbox's own tools (a profile's tools
    /// answer as their original did).
    fn tasks_enabled(&self) -> bool {
        self.state.settings.profile == Profile::Default
    }

    /// Whether a call runs as a task: one of the run tools, from a client that declared the
    /// tasks extension (in this request or its session), and not a background command
    /// (which answers at once anyway).
    fn wants_task(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> bool {
        self.tasks_enabled()
            && TASK_TOOLS.contains(&request.name.as_ref())
            && ctx
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks())
            && !request
                .arguments
                .as_ref()
                .and_then(|a| a.get("background"))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false)
    }

    /// The longest a task's run may take: its `timeout_seconds`, or the tool's default.
    fn task_timeout(&self, request: &CallToolRequestParams) -> Duration {
        let s = &self.state.settings;
        let default = if request.name == "install_packages" {
            crate::packages::DEFAULT_TIMEOUT
        } else {
            s.default_run_timeout
        };
        request
            .arguments
            .as_ref()
            .and_then(|a| a.get("timeout_seconds"))
            .and_then(serde_json::Value::as_f64)
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
            .unwrap_or(default)
            .min(s.max_run_timeout)
    }

    /// Runs a tool call as a task: its result if the run ends within [`TaskSettings::inline_wait`], else
    /// the task to poll. The run no longer belongs to the request once the task is
    /// answered: it sends no progress, and only `tasks/cancel` interrupts it.
    async fn call_as_task(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        caller: &Caller,
        audited: Audited,
        started: Instant,
    ) -> Result<CallToolResponse, ErrorData> {
        let timeout = self.task_timeout(&request);
        let name = request.name.clone();
        let refused_audit = audited.clone();
        let server = self.clone();
        let owner = caller.clone();
        let mut detached = context.clone();
        detached.meta.0.0.remove("progressToken");
        detached.meta.0.0.remove("io.modelcontextprotocol/logLevel");
        let tool = name.clone();
        let start = self
            .state
            .tasks
            .start(&caller.tenant, timeout, move |cancel| {
                detached.ct = cancel;
                async move {
                    let tcc = ToolCallContext::new(&server, request, detached);
                    let result = server.tool_router.call(tcc).await;
                    let result = server.fit_answer(&owner, &tool, result);
                    server.record_call(&owner, &tool, audited, &result, started.elapsed());
                    result
                }
            });
        let Started {
            task,
            mut result,
            cancel,
        } = match start {
            Ok(s) => s,
            Err(message) => {
                let refused = Ok(render::failure(message).into());
                self.record_call(caller, &name, refused_audit, &refused, started.elapsed());
                return refused;
            }
        };
        let gone = || ErrorData::internal_error("the run's task ended without an answer", None);
        tokio::select! {
            r = &mut result => {
                self.state.tasks.forget(&task.task_id);
                r.unwrap_or_else(|_| Err(gone()))
            }
            () = tokio::time::sleep(self.state.settings.tasks.inline_wait) => {
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            () = context.ct.cancelled() => {
                cancel.cancel();
                let r = result.await.unwrap_or_else(|_| Err(gone()));
                self.state.tasks.forget(&task.task_id);
                r
            }
        }
    }

    /// Tells the subscribers of a file that `write_file` wrote it.
    fn file_written(&self, tenant: &str, result: &Result<CallToolResponse, ErrorData>) {
        let Ok(CallToolResponse::Complete(r)) = result else {
            return;
        };
        if r.is_error == Some(true) {
            return;
        }
        let uri = r
            .structured_content
            .as_ref()
            .and_then(|v| v.get("uri"))
            .and_then(serde_json::Value::as_str);
        if let Some(Ok(Target::SandboxFile(id, path))) = uri.map(resources::parse) {
            self.state
                .subscriptions
                .changed(tenant, &id, Some(std::slice::from_ref(&path)));
        }
    }

    /// The error for a call of a tool this server does not have: it names the tool and
    /// lists those there are (the protocol's invalid-params error, as for any unknown tool).
    fn unknown_tool(&self, name: &str) -> ErrorData {
        let tools: Vec<String> = self
            .tool_router
            .list_all()
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect();
        ErrorData::invalid_params(
            format!(
                "Unknown tool {name:?}. This server's tools are {}.",
                tools.join(", ")
            ),
            Some(serde_json::json!({ "tool": name, "tools": tools })),
        )
    }

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
#[derive(Default, Clone)]
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
        let named = argument(&request, "sandbox_id").map(SandboxId::from);
        let log = self
            .state
            .logs
            .follow(&self.state.registry, &context, &caller.tenant, named)
            .await;
        let result = if self.tool_router.get(&name).is_none() {
            let unknown = Err(self.unknown_tool(&name));
            self.record_call(&caller, &name, audited, &unknown, started.elapsed());
            unknown
        } else if self.wants_task(&request, &context) {
            self.call_as_task(request, context, &caller, audited, started)
                .await
        } else {
            let tcc = ToolCallContext::new(self, request, context);
            let result = self.tool_router.call(tcc).await;
            let result = self.fit_answer(&caller, &name, result);
            self.record_call(&caller, &name, audited, &result, started.elapsed());
            result
        };
        if name == "write_file" {
            self.file_written(&caller.tenant, &result);
        }
        if let Some(log) = log {
            log.finish(answered_sandbox(&result)).await;
        }
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
        #[allow(deprecated)] // logging: deprecated in 2026-07-28, still served
        let builder = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .enable_completions()
            .enable_logging();
        let capabilities = if self.tasks_enabled() {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("runbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.state.settings.profile.instructions())
    }

    /// `logging/setLevel` (2025-11-25): the session hears its tenant's sandbox events at
    /// or above the level. Removed in 2026-07-28, where the level is per request.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if logging::is_modern(&ctx) {
            return Err(ErrorData::method_not_found::<
                rmcp::model::SetLevelRequestMethod,
            >());
        }
        let caller = caller_of(&ctx, self.default_tenant());
        self.state
            .logs
            .set_level(self.session, caller.tenant, request.level, ctx.peer.clone());
        Ok(())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let caller = caller_of(&ctx, self.default_tenant());
        completions::complete(
            &self.state.registry,
            &caller.tenant,
            self.data_catalog().is_some(),
            &self.prompt_router.list_all(),
            &request,
        )
        .await
    }

    /// `resources/subscribe` (2025-11-25): a file of one of the caller's sandboxes.
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = caller_of(&ctx, self.default_tenant());
        let uri = request.uri.as_str();
        let not_found = |message: String| {
            ErrorData::resource_not_found(message, Some(serde_json::json!({ "uri": uri })))
        };
        let Some(id) = Subscriptions::sandbox_of(uri) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "{uri}: only files of your sandboxes can be subscribed to \
                     ({SANDBOX_FILE_TEMPLATE}); data files never change"
                ),
                Some(serde_json::json!({ "uri": uri })),
            ));
        };
        // Another tenant's sandbox is as unknown as one that never existed.
        if let Err(e) = self.state.registry.describe(&caller.tenant, &id) {
            return Err(not_found(format!("{uri}: {e}")));
        }
        self.state
            .subscriptions
            .subscribe(self.session, &caller.tenant, ctx.peer.clone(), uri)
            .map_err(|r| match r {
                Refused::NotAFile => not_found(format!("{uri}: not a sandbox file")),
                Refused::TooMany => ErrorData::invalid_params(
                    format!(
                        "this session already subscribes to {} files, the most it may; \
                         unsubscribe from some first",
                        crate::subscriptions::MAX_SUBSCRIPTIONS
                    ),
                    None,
                ),
            })
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.state
            .subscriptions
            .unsubscribe(self.session, &request.uri);
        Ok(())
    }

    /// `subscriptions/listen` (2026-07-28): sandbox file URIs are accepted.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(Subscriptions::accepted(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let caller = caller_of(context.request_context(), self.default_tenant());
        let _listening = self.state.subscriptions.listen(
            &caller.tenant,
            context.sink().clone(),
            context.accepted(),
        );
        context.cancelled().await;
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let caller = caller_of(&ctx, self.default_tenant());
        self.state
            .tasks
            .get(&caller.tenant, &request.task_id)
            .map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = caller_of(&ctx, self.default_tenant());
        self.state.tasks.cancel(&caller.tenant, &request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = caller_of(&ctx, self.default_tenant());
        self.state.tasks.update(&caller.tenant, &request.task_id)
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
        let files = [self.profile_resources(), files].concat();
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
            .read(&caller_of(&ctx, self.default_tenant()), &request.uri)
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
