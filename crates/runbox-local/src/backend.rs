//! The local backend: sandboxes on this machine, through [`runbox_jail`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use runbox_core::{
    Backend, BackgroundActivity, CommandRequest, Error, ExecContext, ExecOutcome, ExecRequest,
    FileContent, FileWritten, InstallRequest, Language, Limits, Listing, Network, ProcessId,
    ProcessInfo, ProcessOutput, SandboxId, SandboxInfo, SandboxSpec, SandboxState, SandboxStatus,
    Work,
};
use runbox_jail::{JailHost, JailHostConfig, LayerReport};

use crate::files::FileAreas;
use crate::layout::Layout;
use crate::layout::{EGRESS_PORT, PYTHON_PACKAGES, egress_env};
use crate::runtime::{InterpreterPaths, Runtime};
use crate::sandbox::{LocalSandbox, RunSettings};

/// Settings of the local backend.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Host-side jail settings (init binary, state directory, cgroup parent, uid range).
    pub jail: JailHostConfig,
    /// Interpreters to use instead of those on `PATH`.
    pub interpreters: InterpreterPaths,
    /// Limits of a sandbox whose creator asks for none.
    pub default_limits: Limits,
    /// Most sandboxes alive at once.
    pub max_sandboxes: usize,
    /// How long a kernel may take to start.
    pub kernel_start_timeout: Duration,
    /// How long interrupted code has to stop before it is killed.
    pub interrupt_grace: Duration,
    /// TCP ports sandboxed code may bind and connect to on its own loopback (none by
    /// default: Landlock refuses all TCP).
    pub sandbox_tcp_ports: Vec<u16>,
    /// The operator's data files, mounted read-only at `/data` in every sandbox.
    pub data_dir: Option<PathBuf>,
    /// Network access for sandboxes that ask for it; `None`: no sandbox gets any.
    pub egress: Option<Egress>,
}

/// How sandboxes with network access reach out: through a proxy of the server's, per
/// sandbox, that lets through only the hosts of `policy` (narrowed by the sandbox's request).
#[derive(Clone)]
pub struct EgressConfig {
    /// The operator's hosts, address exceptions and proxy limits.
    pub policy: runbox_egress::Policy,
    /// Package-index variables passed to sandboxes (see
    /// [`runbox_egress::IndexHosts::env`]).
    pub index_env: Vec<(String, String)>,
    /// Where every proxy decision goes, besides the log, with the sandbox it was made for.
    pub events: Option<EgressEventSink>,
}

/// Receives every egress decision with the sandbox whose proxy made it. Called on the
/// proxies' tasks: it must return quickly and never block.
pub type EgressEventSink = Arc<dyn Fn(&SandboxId, &runbox_egress::Decision) + Send + Sync>;
/// [`EgressConfig`], ready or worked out on first use: finding the host's package indexes
/// runs pip and npm and resolves names, which a server should not wait for before it answers
/// its first request (most sessions never ask for a network). The first sandbox that asks
/// for one starts the work and waits for it; later ones get the result.
#[derive(Clone)]
pub struct Egress(Arc<EgressInner>);

struct EgressInner {
    /// The work, until someone needs its result.
    start: Mutex<Option<std::pin::Pin<Box<dyn Future<Output = EgressConfig> + Send>>>>,
    result: tokio::sync::watch::Sender<Option<Arc<EgressConfig>>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Egress")
            .field(&*self.0.result.borrow())
            .finish()
    }
}

impl Egress {
    /// Settings known now.
    pub fn ready(config: EgressConfig) -> Self {
        Self(Arc::new(EgressInner {
            start: Mutex::new(None),
            result: tokio::sync::watch::Sender::new(Some(Arc::new(config))),
        }))
    }

    /// Settings `work` finds, once something needs them.
    pub fn later(work: impl Future<Output = EgressConfig> + Send + 'static) -> Self {
        Self(Arc::new(EgressInner {
            start: Mutex::new(Some(Box::pin(work))),
            result: tokio::sync::watch::Sender::new(None),
        }))
    }

    /// The settings: started now if nothing asked before, and waited for.
    pub async fn get(&self) -> Arc<EgressConfig> {
        let mut result = self.0.result.subscribe();
        let work = self
            .0
            .start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(work) = work {
            // In a task of its own, so that a caller that gives up does not stop it.
            let sender = self.0.result.clone();
            let task = tokio::spawn(work);
            tokio::spawn(async move {
                let config = match task.await {
                    Ok(config) => Arc::new(config),
                    Err(e) => {
                        tracing::error!("finding the egress settings failed: {e}");
                        no_hosts()
                    }
                };
                sender.send_replace(Some(config));
            });
        }
        match result.wait_for(Option::is_some).await {
            Ok(config) => config.clone().unwrap_or_else(no_hosts),
            // Unreachable: the sender lives as long as `self`.
            Err(_) => no_hosts(),
        }
    }
}

/// Settings with no hosts: what is left when finding them failed.
fn no_hosts() -> Arc<EgressConfig> {
    Arc::new(EgressConfig {
        policy: runbox_egress::Policy::new(runbox_egress::Allowlist::default()),
        index_env: Vec::new(),
        events: None,
    })
}

impl std::fmt::Debug for EgressConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressConfig")
            .field("policy", &self.policy)
            .field("index_env", &self.index_env)
            .finish_non_exhaustive()
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            jail: JailHostConfig::default(),
            interpreters: InterpreterPaths::default(),
            default_limits: Limits::default(),
            max_sandboxes: 100,
            kernel_start_timeout: Duration::from_secs(30),
            interrupt_grace: Duration::from_secs(2),
            sandbox_tcp_ports: Vec::new(),
            data_dir: None,
            egress: None,
        }
    }
}

/// Facts about a live sandbox for diagnostics and tests: where it lives on the host.
#[derive(Debug, Clone)]
pub struct Diagnostics {
    /// Host pid of the sandbox's stage-one process (the init's parent).
    pub stage_one_pid: Option<u32>,
    /// Its cgroup directories.
    pub cgroup_paths: Vec<PathBuf>,
    /// The uid its processes run as, as the host sees it (`None` in a user namespace,
    /// where it is the server's own).
    pub host_uid: Option<u32>,
    /// The layers its init applied.
    pub layers: LayerReport,
}

/// Sandboxes on this machine.
pub struct LocalBackend {
    host: JailHost,
    runtime: Runtime,
    layout: Layout,
    base_env: Vec<(String, String)>,
    config: LocalConfig,
    sandboxes: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    live: HashMap<SandboxId, Arc<LocalSandbox>>,
    /// Creations in progress, counted against `max_sandboxes`.
    starting: usize,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("runtime", &self.runtime)
            .field("sandboxes", &self.registry().live.len())
            .finish_non_exhaustive()
    }
}

impl LocalBackend {
    /// Prepares the host (state directory, cgroups) and finds the interpreters.
    pub async fn new(config: LocalConfig) -> Result<Self, Error> {
        config
            .default_limits
            .validate()
            .map_err(|e| Error::InvalidRequest(format!("default limits: {e}")))?;
        let data_dir = match &config.data_dir {
            Some(d) => Some(check_data_dir(d)?),
            None => None,
        };
        // Off the async threads: recovering from a crashed server may wait for its leftover
        // processes to die.
        let jail = config.jail.clone();
        let host = tokio::task::spawn_blocking(move || JailHost::new(jail))
            .await
            .map_err(|e| Error::sandbox_caused_by("cannot prepare the local sandbox host", e))?
            .map_err(|e| Error::sandbox_caused_by("cannot prepare the local sandbox host", e))?;
        let runtime = Runtime::discover(&config.interpreters).await;
        crate::layout::check_binds(&runtime, data_dir.is_some()).map_err(Error::sandbox)?;
        let layout = Layout::plan(
            &runtime,
            config.sandbox_tcp_ports.clone(),
            data_dir.as_deref(),
        );
        let base_env = Layout::base_env(&runtime);
        match host.cgroups() {
            Ok(c) => {
                tracing::debug!(version = ?c.version(), controllers = ?c.controllers(), "cgroups")
            }
            // The operator's choice is said once; a fallback (doctor, tests) is a warning.
            Err(e) if config.jail.cgroups == runbox_jail::CgroupMode::Disabled => tracing::info!(
                "no cgroups ({e}): each sandbox process's memory is capped by RLIMIT_DATA, a \
                 sandbox's processes by RLIMIT_NPROC, and CPU not at all"
            ),
            Err(e) => tracing::warn!(
                "no cgroups ({e}): each sandbox process's memory is capped by RLIMIT_DATA, a \
                 sandbox's processes by RLIMIT_NPROC, and CPU not at all"
            ),
        }
        Ok(Self {
            host,
            runtime,
            layout,
            base_env,
            config,
            sandboxes: Mutex::new(Registry::default()),
        })
    }

    /// The interpreters found.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The jail host (for `runbox doctor`).
    pub fn host(&self) -> &JailHost {
        &self.host
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, id: &SandboxId) -> Result<Arc<LocalSandbox>, Error> {
        self.registry()
            .live
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found(id))
    }

    fn settings(&self) -> RunSettings {
        RunSettings {
            kernel_start_timeout: self.config.kernel_start_timeout,
            interrupt_grace: self.config.interrupt_grace,
        }
    }

    /// Starts `language`'s kernel in a sandbox now rather than on first use (a warm pool
    /// does this); returns the interpreter's version.
    pub async fn warm_kernel(&self, id: &SandboxId, language: Language) -> Result<String, Error> {
        self.get(id)?
            .ensure_kernel(&self.runtime, language, self.settings())
            .await
    }

    /// Proves that sandboxes can be made here and that every interpreter found runs in
    /// one: a sandbox is made, each interpreter started in it, and the sandbox closed.
    /// `serve` calls it at start, so that a machine where sandboxes cannot run refuses to
    /// serve, saying why, rather than answering every call with an error.
    pub async fn self_test(&self) -> Result<(), Error> {
        let id = self
            .create(SandboxSpec::default())
            .await
            .map_err(|e| {
                Error::sandbox(format!(
                    "no sandbox can be made on this machine ({}); runbox doctor tells which \
                     layer is missing",
                    runbox_core::chain(&e)
                ))
            })?
            .id;
        let sandbox = self.get(&id)?;
        let grace = self.config.interrupt_grace;
        let check = |language| sandbox.check_interpreter(&self.runtime, language, grace);
        let (python, node, bash) = tokio::join!(
            check(Language::Python),
            check(Language::JavaScript),
            check(Language::Bash)
        );
        drop(sandbox);
        let _ = self.close(&id).await;
        let failures: Vec<String> = [python, node, bash]
            .into_iter()
            .filter_map(Result::err)
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::sandbox(failures.join("; ")))
        }
    }

    /// Where a sandbox lives on the host.
    pub async fn diagnostics(&self, id: &SandboxId) -> Result<Diagnostics, Error> {
        let sb = self.get(id)?;
        Ok(Diagnostics {
            stage_one_pid: sb.jail.stage_one_pid().await,
            cgroup_paths: sb.jail.cgroup_paths(),
            host_uid: match sb.jail.identity() {
                runbox_jail::policy::Identity::HostUid { uid, .. } => Some(*uid),
                runbox_jail::policy::Identity::UserNamespace { .. } => None,
            },
            layers: sb.jail.report().clone(),
        })
    }

    /// Runs code or a command, forgetting the sandbox if it ended under the run (closed
    /// meanwhile, or its init was killed).
    async fn run(
        &self,
        id: &SandboxId,
        work: Work,
        ctx: ExecContext,
    ) -> Result<ExecOutcome, Error> {
        let sandbox = self.get(id)?;
        let settings = self.settings();
        let result = match &work {
            Work::Code(req) => {
                Self::check_env(&req.env)?;
                sandbox.exec(&self.runtime, req, &ctx, settings).await
            }
            Work::Command(req) => {
                Self::check_env(&req.env)?;
                sandbox.command(&self.runtime, req, &ctx, settings).await
            }
        };
        if sandbox.jail.has_ended() {
            self.registry().live.remove(id);
        }
        result
    }

    /// Runs a file operation of a sandbox on a blocking thread.
    async fn with_files<T: Send + 'static>(
        &self,
        id: &SandboxId,
        op: impl FnOnce(&FileAreas) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let sandbox = self.get(id)?;
        if sandbox.jail.has_ended() {
            return Err(Error::not_found(id));
        }
        let files = Arc::clone(&sandbox.files);
        tokio::task::spawn_blocking(move || op(&files))
            .await
            .unwrap_or_else(|e| Err(Error::sandbox_caused_by("a file operation failed", e)))
    }

    fn check_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
        for (k, v) in env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(Error::InvalidRequest(format!(
                    "environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
                )));
            }
        }
        Ok(())
    }
}

/// The operator's data directory, made absolute, once checked to be a directory. As root,
/// sandboxes run as unprivileged uids: files they could not read are named in a warning.
fn check_data_dir(dir: &Path) -> Result<PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt;
    let bad =
        |what: String| Error::InvalidRequest(format!("data directory {}: {what}", dir.display()));
    let dir = std::fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?;
    let meta = std::fs::metadata(&dir).map_err(|e| bad(e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    if nix::unistd::geteuid().is_root() {
        let unreadable: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| bad(e.to_string()))?
            .flatten()
            .filter(|e| {
                e.metadata()
                    .is_ok_and(|m| m.permissions().mode() & 0o004 == 0)
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if meta.permissions().mode() & 0o005 != 0o005 {
            tracing::warn!(
                dir = %dir.display(),
                "the data directory is not readable and searchable by others: sandboxes, which \
                 run as unprivileged users, will not see its files (chmod o+rx)"
            );
        } else if !unreadable.is_empty() {
            tracing::warn!(
                dir = %dir.display(),
                files = %unreadable.join(", "),
                "data files not readable by others: sandboxes, which run as unprivileged users, \
                 cannot read them (chmod o+r)"
            );
        }
    }
    Ok(dir)
}

/// Starts the egress proxy of a new sandbox on the socket its init listens on.
fn start_proxy(
    id: &SandboxId,
    jail: &runbox_jail::Jail,
    policy: runbox_egress::Policy,
    events: Option<EgressEventSink>,
) -> Result<runbox_egress::EgressHandle, Error> {
    let events = events.map(|sink| {
        let id = id.clone();
        Arc::new(move |d: &runbox_egress::Decision| sink(&id, d)) as runbox_egress::EventSink
    });
    let fd = jail
        .take_listener(EGRESS_PORT)
        .ok_or_else(|| Error::sandbox("the sandbox's init did not listen for the egress proxy"))?;
    let listener = std::net::TcpListener::from(fd);
    listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
        .map(|l| runbox_egress::spawn(l, Arc::new(policy), events))
        .map_err(|e| Error::sandbox_caused_by("could not start the egress proxy", e))
}

/// Releases a reserved creation slot if creation fails or is abandoned.
struct Reservation<'a> {
    backend: &'a LocalBackend,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.backend.registry().starting -= 1;
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn create(&self, spec: SandboxSpec) -> Result<SandboxInfo, Error> {
        let limits = spec
            .limits
            .unwrap_or_else(|| self.config.default_limits.clone());
        limits
            .validate()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        Self::check_env(&spec.env)?;
        let egress = match &spec.network {
            Network::None => None,
            Network::Allowlist(hosts) => {
                let none = || {
                    Error::InvalidRequest(
                        "network \"allowlist\" is not available: this server allows no hosts \
                         (its operator lists them with --allow-host)"
                            .into(),
                    )
                };
                let config = self.config.egress.as_ref().ok_or_else(none)?.get().await;
                if config.policy.allowlist.is_empty() {
                    return Err(none());
                }
                let policy = if hosts.is_empty() {
                    config.policy.clone()
                } else {
                    config
                        .policy
                        .narrow(hosts)
                        .map_err(|e| Error::InvalidRequest(e.to_string()))?
                };
                Some((config, policy))
            }
        };
        let reservation = {
            let mut reg = self.registry();
            if reg.live.len() + reg.starting >= self.config.max_sandboxes {
                return Err(Error::LimitReached(format!(
                    "this server already runs its maximum of {} sandboxes; close one you no longer need",
                    self.config.max_sandboxes
                )));
            }
            reg.starting += 1;
            Reservation { backend: self }
        };
        let id = SandboxId::random();
        let jail = self
            .host
            .start(
                id.as_str(),
                self.layout
                    .spec(&limits, egress.is_some(), self.host.cgroups().is_ok()),
            )
            .await
            .map_err(|e| Error::sandbox_caused_by("could not create a sandbox", e))?;
        tracing::debug!(sandbox = %id, layers = ?jail.report(), "sandbox created");
        let mut env: BTreeMap<String, String> = self.base_env.iter().cloned().collect();
        if let Some((config, _)) = &egress {
            env.extend(egress_env(&config.index_env));
        }
        env.extend(spec.env);
        let files = match FileAreas::open(&jail, &self.layout.export_dirs) {
            Ok(f) => f,
            Err(e) => {
                jail.shutdown().await;
                return Err(e);
            }
        };
        let mut allowed_hosts = Vec::new();
        let proxy = match egress {
            None => None,
            Some((config, policy)) => {
                allowed_hosts = policy
                    .allowlist
                    .patterns()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                // The folder install_packages fills for Python, on PYTHONPATH: made before
                // any kernel starts, so a running kernel sees what is installed into it.
                let started = files
                    .create_dir_all(PYTHON_PACKAGES)
                    .and_then(|()| start_proxy(&id, &jail, policy, config.events.clone()));
                match started {
                    Ok(p) => Some(p),
                    Err(e) => {
                        jail.shutdown().await;
                        return Err(e);
                    }
                }
            }
        };
        let sandbox = Arc::new(LocalSandbox::new(
            id.clone(),
            jail,
            files,
            limits.clone(),
            env,
            proxy,
        ));
        let info = SandboxInfo {
            id: id.clone(),
            created_at: sandbox.created_at,
            limits,
            languages: self.runtime.languages(),
            allowed_hosts,
        };
        self.registry().live.insert(id, sandbox);
        drop(reservation);
        Ok(info)
    }

    async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome, Error> {
        self.run(id, Work::Code(req), ctx).await
    }

    async fn command(
        &self,
        id: &SandboxId,
        req: CommandRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome, Error> {
        self.run(id, Work::Command(req), ctx).await
    }

    async fn list_files(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<Listing, Error> {
        let path = path.to_owned();
        self.with_files(id, move |f| f.list(&path, recursive)).await
    }

    async fn read_file(
        &self,
        id: &SandboxId,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileContent, Error> {
        let path = path.to_owned();
        self.with_files(id, move |f| f.read(&path, offset, length))
            .await
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Vec<u8>,
        append: bool,
    ) -> Result<FileWritten, Error> {
        let path = path.to_owned();
        self.with_files(id, move |f| f.write(&path, &data, append))
            .await
    }

    async fn workspace_snapshot(&self, id: &SandboxId) -> Result<Listing, Error> {
        self.with_files(id, FileAreas::snapshot).await
    }

    async fn status(&self, id: &SandboxId) -> Result<SandboxStatus, Error> {
        let sb = self.get(id)?;
        let usage = sb.jail.usage();
        Ok(SandboxStatus {
            id: sb.id.clone(),
            state: if sb.jail.has_ended() {
                SandboxState::Closed
            } else {
                SandboxState::Running
            },
            created_at: sb.created_at,
            limits: sb.limits.clone(),
            enforced: crate::layout::enforced(&sb.limits, &sb.jail),
            memory_bytes: usage.memory_bytes,
            cpu_seconds: usage.cpu_seconds,
            pids: usage.pids,
            kernels: sb.kernels(),
            processes: sb.processes.list(),
        })
    }

    async fn start_process(
        &self,
        id: &SandboxId,
        req: CommandRequest,
    ) -> Result<ProcessInfo, Error> {
        Self::check_env(&req.env)?;
        let sb = self.get(id)?;
        sb.start_process(&self.runtime, &req).await
    }

    async fn background_activity(&self, id: &SandboxId) -> Result<BackgroundActivity, Error> {
        Ok(self.get(id)?.processes.activity())
    }

    async fn read_process(
        &self,
        id: &SandboxId,
        process: &ProcessId,
        wait: Duration,
    ) -> Result<ProcessOutput, Error> {
        let sb = self.get(id)?;
        sb.processes.read(process, wait).await
    }

    async fn kill_process(
        &self,
        id: &SandboxId,
        process: &ProcessId,
    ) -> Result<ProcessInfo, Error> {
        let sb = self.get(id)?;
        sb.processes.kill(&sb.jail, process).await
    }

    async fn install(
        &self,
        id: &SandboxId,
        req: InstallRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome, Error> {
        let sb = self.get(id)?;
        sb.install(&self.runtime, &req, &ctx, self.settings()).await
    }

    async fn set_paused(&self, id: &SandboxId, paused: bool) -> Result<(), Error> {
        let sb = self.get(id)?;
        if !sb.jail.can_pause() {
            return Err(Error::Unsupported {
                backend: "local",
                operation: "pause and resume on this host: the sandbox has no cgroup freezer \
                            (runbox doctor tells why)",
            });
        }
        sb.jail.set_paused(paused).await.map_err(|e| {
            Error::sandbox_caused_by(format!("sandbox {id}: could not pause or resume"), e)
        })
    }

    async fn close(&self, id: &SandboxId) -> Result<(), Error> {
        let sandbox = self
            .registry()
            .live
            .remove(id)
            .ok_or_else(|| Error::not_found(id))?;
        sandbox.jail.shutdown().await;
        tracing::debug!(sandbox = %id, "sandbox closed");
        Ok(())
    }

    async fn shutdown(&self) {
        let all: Vec<Arc<LocalSandbox>> = self.registry().live.drain().map(|(_, s)| s).collect();
        let mut closing = tokio::task::JoinSet::new();
        for sandbox in all {
            closing.spawn(async move { sandbox.jail.shutdown().await });
        }
        while closing.join_next().await.is_some() {}
    }
}
