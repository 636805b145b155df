//! The sandbox registry: which tenant owns which sandbox, when each expires, and a warm pool
//! of fresh sandboxes, in front of any [`Backend`].
//!
//! Front ends talk to the registry, never to a backend directly, so ownership and expiry are
//! enforced in one place whatever the backend. A sandbox belongs to the tenant that created
//! it; asking for another tenant's sandbox fails exactly as asking for one that never
//! existed. A sandbox expires when it has been idle (no call in progress, no background
//! process running) for its timeout, or paused for longer than the server's pause timeout;
//! the reaper closes it. Background processes keep a sandbox alive only up to the longest
//! idle life the server allows ([`RegistryConfig::max_idle_timeout`]) since its last call.
//! The pool keeps fresh sandboxes with a warm Python kernel; one taken from the pool serves
//! one owner and is closed, never returned, when that owner is done.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::events::{EVENT_BUFFER, EventKind, SandboxEvent};
use crate::exec::{
    CommandRequest, ExecContext, ExecOutcome, ExecRequest, InstallRequest, Language,
};
use crate::files::{Changes, FileContent, FileWritten, Listing, changes};
use crate::limits::Limits;
use crate::process::{BackgroundActivity, ProcessId, ProcessInfo, ProcessOutput};
use crate::quota::{Limit, Quotas};
use crate::sandbox::{Network, SandboxId, SandboxInfo, SandboxSpec, SandboxState, SandboxStatus};

/// Settings of the registry.
#[derive(Clone)]
pub struct RegistryConfig {
    /// Idle life of a sandbox whose creator gives none.
    pub default_idle_timeout: Duration,
    /// Longest idle life a creator may ask for; also the longest a sandbox lives after its
    /// last call while background processes keep it from being idle.
    pub max_idle_timeout: Duration,
    /// Longest a sandbox may stay paused: then it is closed, as an idle one is. A paused
    /// sandbox holds its memory while its idle clock stands still, so without this a tenant
    /// could pause sandboxes and keep them (and their places in every quota) for ever.
    pub pause_timeout: Duration,
    /// Fresh sandboxes kept ready (0: no pool).
    pub pool_size: usize,
    /// How often expired sandboxes are looked for.
    pub reap_interval: Duration,
    /// Whether a run in a named sandbox reports the files it created or changed under
    /// `/workspace` ([`Ran::changes`]); it costs a snapshot before and after the run.
    pub track_changes: bool,
    /// Environment every sandbox the registry creates starts with, pooled and one-shot ones
    /// included (the operator's `--pass-through-env`); a creator's own variables win over
    /// it. Its values are never printed: `Debug` shows the names only.
    pub base_env: BTreeMap<String, String>,
    /// Sandboxes and runs tenants may hold at once.
    pub quotas: Quotas,
    /// Told of every request a quota refuses (for metrics); must return quickly.
    pub on_refusal: Option<Arc<dyn Fn(Limit) + Send + Sync>>,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("default_idle_timeout", &self.default_idle_timeout)
            .field("max_idle_timeout", &self.max_idle_timeout)
            .field("pause_timeout", &self.pause_timeout)
            .field("pool_size", &self.pool_size)
            .field("reap_interval", &self.reap_interval)
            .field("track_changes", &self.track_changes)
            .field("base_env", &self.base_env.keys().collect::<Vec<_>>())
            .field("quotas", &self.quotas)
            .field("on_refusal", &self.on_refusal.is_some())
            .finish()
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            default_idle_timeout: Duration::from_secs(900),
            max_idle_timeout: Duration::from_secs(24 * 3600),
            pause_timeout: Duration::from_secs(3600),
            pool_size: 0,
            reap_interval: Duration::from_secs(1),
            track_changes: true,
            base_env: BTreeMap::new(),
            quotas: Quotas::default(),
            on_refusal: None,
        }
    }
}

/// What a tenant asks for when creating a sandbox.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Idle life; `None` takes the default.
    pub idle_timeout: Option<Duration>,
    /// Environment every process of the sandbox starts with.
    pub env: BTreeMap<String, String>,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// Limits; `None` takes the backend's defaults.
    pub limits: Option<Limits>,
    /// Network access.
    pub network: Network,
    /// The caller's own key for the backend's provider; `None`: the backend's own. A
    /// sandbox made with one never comes from the pool (whose sandboxes the backend's own
    /// key made).
    pub credential: Option<crate::Credential>,
}

/// Work to do in a sandbox.
#[derive(Debug, Clone)]
pub enum Work {
    /// Code in a language's kernel (or a bash cell).
    Code(ExecRequest),
    /// A command line in a fresh shell.
    Command(CommandRequest),
}

/// What [`Registry::run`] did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// The sandbox the work ran in.
    pub sandbox_id: SandboxId,
    /// Whether that sandbox was made for this work and is now closed.
    pub ephemeral: bool,
    /// What the work produced.
    pub outcome: ExecOutcome,
    /// Files under `/workspace` it created or changed, when tracked (never for a one-shot
    /// sandbox, which is gone by the time anyone could read them).
    pub changes: Option<Changes>,
}

/// Most changed files a run reports.
pub const MAX_CHANGES: usize = 20;

/// Sandboxes by state, all tenants together ([`Registry::census`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Running, with nothing in progress.
    pub idle: usize,
    /// Running, with a run or another operation in progress.
    pub busy: usize,
    /// Paused (frozen).
    pub paused: usize,
    /// Ready in the warm pool, owned by no one yet.
    pub pooled: usize,
    /// Being created.
    pub creating: usize,
    /// Runs in progress.
    pub runs: usize,
}

/// A sandbox as its owner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxView {
    /// Its id.
    pub id: SandboxId,
    /// Lifecycle state.
    pub state: SandboxState,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it will expire if it stays idle (a run in progress keeps it alive), or, paused,
    /// when it is closed unless resumed first.
    pub expires_at: SystemTime,
    /// Its idle life.
    pub idle_timeout: Duration,
    /// Runs in progress.
    pub busy: usize,
    /// Labels given at creation.
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Entry {
    owner: String,
    created_at: SystemTime,
    idle_timeout: Duration,
    last_used: Instant,
    busy: usize,
    metadata: BTreeMap<String, String>,
    limits: Limits,
    languages: Vec<Language>,
    /// Since when it is paused: its idle clock stands still meanwhile.
    paused_at: Option<Instant>,
    /// While paused: when it is closed unless resumed first (a new idle timeout does not
    /// move it).
    pause_deadline: Option<Instant>,
    /// /workspace as the last run left it: the next run's "before" when nothing wrote in
    /// between through the registry (write_file clears it), saving a snapshot per run.
    workspace: Option<Listing>,
    /// Made for one run without a sandbox id and closed after it: not held against its
    /// tenant's sandbox quota (the run counts against the run quotas).
    one_shot: bool,
    /// Whether background processes were started since the reaper last found none
    /// running: it asks the backend before closing the sandbox.
    background: bool,
    /// When a background process was last seen running, or ended: the idle clock counts
    /// from here when it is later than the last call.
    active_at: Option<Instant>,
}

impl Entry {
    /// Since when the sandbox has been idle, if nothing is in progress now.
    fn idle_since(&self) -> Instant {
        self.active_at
            .map_or(self.last_used, |at| at.max(self.last_used))
    }

    fn view(&self, id: &SandboxId) -> SandboxView {
        let idle = match self.paused_at {
            Some(at) => at.saturating_duration_since(self.idle_since()),
            None => self.idle_since().elapsed(),
        };
        let left = match self.pause_deadline {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()),
            None if self.busy > 0 => self.idle_timeout,
            None => self.idle_timeout.saturating_sub(idle),
        };
        SandboxView {
            id: id.clone(),
            state: if self.paused_at.is_some() {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            created_at: self.created_at,
            expires_at: SystemTime::now() + left,
            idle_timeout: self.idle_timeout,
            busy: self.busy,
            metadata: self.metadata.clone(),
        }
    }

    /// Whether it is to be closed now, and why, as far as the registry knows (a background
    /// process may still run: see [`Entry::background`]).
    fn expired(&self) -> Option<&'static str> {
        if self.busy > 0 {
            return None;
        }
        match (self.paused_at, self.pause_deadline) {
            (Some(_), Some(deadline)) => {
                (Instant::now() >= deadline).then_some("paused past the pause timeout")
            }
            (Some(_), None) => None,
            (None, _) => (self.idle_since().elapsed() >= self.idle_timeout)
                .then_some("idle past its timeout"),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<SandboxId, Entry>,
    pool: VecDeque<SandboxInfo>,
    /// Sandboxes being created, by tenant: they count against the quotas already.
    creating: HashMap<String, usize>,
    /// One-shot sandboxes being created: they count against the server's total only.
    creating_one_shot: usize,
    /// Runs in progress, by tenant, and for all tenants together.
    runs: HashMap<String, usize>,
    runs_total: usize,
}

impl Inner {
    fn held_by(&self, owner: &str) -> usize {
        self.entries
            .values()
            .filter(|e| e.owner == owner && !e.one_shot)
            .count()
            + self.creating.get(owner).copied().unwrap_or(0)
    }

    fn creating_total(&self) -> usize {
        self.creating.values().sum::<usize>() + self.creating_one_shot
    }

    /// Ends the count of a creation, done or failed.
    fn end_creation(&mut self, owner: &str, one_shot: bool) {
        if one_shot {
            self.creating_one_shot = self.creating_one_shot.saturating_sub(1);
        } else {
            release(&mut self.creating, owner);
        }
    }
}

/// Subtracts one from `owner`'s count in `map`, dropping the entry at zero.
fn release(map: &mut HashMap<String, usize>, owner: &str) {
    if let Some(n) = map.get_mut(owner) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(owner);
        }
    }
}

/// Sandboxes by owner, with expiry and a warm pool.
pub struct Registry {
    backend: Arc<dyn Backend>,
    config: RegistryConfig,
    inner: Mutex<Inner>,
    pool_wanted: Notify,
    closing: tokio::sync::Mutex<JoinSet<()>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    stop: CancellationToken,
    /// Lifecycle events of owned sandboxes, for front ends ([`Registry::subscribe_events`]).
    events: tokio::sync::broadcast::Sender<SandboxEvent>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("backend", &self.backend.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Marks a sandbox busy for the life of a run, so it cannot expire under it.
struct Busy<'a> {
    registry: &'a Registry,
    id: SandboxId,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.registry.lock().entries.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }
}

/// A sandbox being created for a tenant: it counts against the quotas until it is
/// registered ([`Creating::register`]) or its creation fails (dropped).
struct Creating<'a> {
    registry: &'a Registry,
    owner: String,
    one_shot: bool,
    done: bool,
}

impl Creating<'_> {
    /// Registers the new sandbox and ends the reservation under one lock, so that no other
    /// request sees it counted twice or not at all.
    fn register(mut self, id: SandboxId, entry: Entry) {
        let mut inner = self.registry.lock();
        inner.entries.insert(id, entry);
        inner.end_creation(&self.owner, self.one_shot);
        self.done = true;
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.registry
                .lock()
                .end_creation(&self.owner, self.one_shot);
        }
    }
}

/// A run in progress, counted against its tenant's and the server's limits until dropped.
struct RunSlot<'a> {
    registry: &'a Registry,
    owner: String,
}

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        release(&mut inner.runs, &self.owner);
        inner.runs_total = inner.runs_total.saturating_sub(1);
    }
}

impl Registry {
    /// A registry in front of `backend`. Call [`Registry::start`] to run the reaper and
    /// the pool.
    pub fn new(backend: Arc<dyn Backend>, config: RegistryConfig) -> Arc<Self> {
        Arc::new(Self {
            backend,
            config,
            inner: Mutex::new(Inner::default()),
            pool_wanted: Notify::new(),
            closing: tokio::sync::Mutex::new(JoinSet::new()),
            tasks: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
            events: tokio::sync::broadcast::channel(EVENT_BUFFER).0,
        })
    }

    /// Every [`SandboxEvent`] from now on: created, expired, kernel restarted, egress
    /// refused, each naming the tenant that owns the sandbox.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<SandboxEvent> {
        self.events.subscribe()
    }

    fn publish(&self, tenant: &str, id: &SandboxId, kind: EventKind) {
        // No subscriber is no error: events are a courtesy.
        let _ = self.events.send(SandboxEvent {
            tenant: tenant.to_owned(),
            sandbox_id: id.clone(),
            at: SystemTime::now(),
            kind,
        });
    }

    /// Publishes an event the registry cannot see for itself (the egress proxy's refusals)
    /// to the tenant that owns `id`; dropped when no tenant does (a pooled or closed
    /// sandbox).
    pub fn report(&self, id: &SandboxId, kind: EventKind) {
        let owner = self.lock().entries.get(id).map(|e| e.owner.clone());
        if let Some(owner) = owner {
            self.publish(&owner, id, kind);
        }
    }

    /// The backend behind the registry.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the reaper and, with a pool size above zero, the pool filler.
    pub fn start(self: &Arc<Self>) {
        let me = Arc::clone(self);
        let mut tasks = vec![tokio::spawn(async move { me.reap_loop().await })];
        if self.config.pool_size > 0 {
            let me = Arc::clone(self);
            tasks.push(tokio::spawn(async move { me.pool_loop().await }));
        }
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(tasks);
    }

    /// Checks a requested idle timeout against the maximum.
    pub fn idle_timeout(&self, asked: Option<Duration>) -> Result<Duration> {
        match asked {
            None => Ok(self.config.default_idle_timeout),
            Some(t) if t.is_zero() => Err(Error::InvalidRequest(
                "timeout_seconds must be more than 0".into(),
            )),
            Some(t) if t > self.config.max_idle_timeout => Err(Error::InvalidRequest(format!(
                "timeout_seconds {} exceeds this server's maximum of {}",
                t.as_secs(),
                self.config.max_idle_timeout.as_secs()
            ))),
            Some(t) => Ok(t),
        }
    }

    /// Counts a sandbox about to be created for `owner`, or refuses it with the limit it
    /// would break. A one-shot sandbox counts against the server's total only.
    fn reserve_sandbox(&self, owner: &str, one_shot: bool) -> Result<Creating<'_>> {
        self.reserve_sandbox_as(owner, one_shot)
            .inspect_err(|e| self.refused(e))
    }

    /// Tells [`RegistryConfig::on_refusal`] of a quota's refusal.
    fn refused(&self, e: &Error) {
        if let (Error::Quota { limit, .. }, Some(notify)) = (e, &self.config.on_refusal) {
            notify(*limit);
        }
    }

    fn reserve_sandbox_as(&self, owner: &str, one_shot: bool) -> Result<Creating<'_>> {
        // Looked up before locking: the lookup may take locks of its own.
        let quota = self.config.quotas.of(owner);
        let mut inner = self.lock();
        if let Some(max) = self.config.quotas.max_sandboxes {
            let total = inner.entries.len() + inner.creating_total();
            if total >= max {
                return Err(Error::Quota {
                    limit: Limit::Sandboxes,
                    message: format!(
                        "this server holds its maximum of {max} sandboxes, all tenants together; \
                         try again once some have closed or expired"
                    ),
                });
            }
        }
        if let Some(max) = quota.max_sandboxes.filter(|_| !one_shot) {
            let held = inner.held_by(owner);
            if held >= max {
                return Err(Error::Quota {
                    limit: Limit::TenantSandboxes,
                    message: format!(
                        "you hold {held} {}, the most one tenant may hold at once ({max}); \
                         close one you no longer need with close_sandbox (list_sandboxes shows \
                         them); runs without a sandbox_id need no sandbox of yours",
                        if held == 1 { "sandbox" } else { "sandboxes" }
                    ),
                });
            }
        }
        if one_shot {
            inner.creating_one_shot += 1;
        } else {
            *inner.creating.entry(owner.to_owned()).or_default() += 1;
        }
        Ok(Creating {
            registry: self,
            owner: owner.to_owned(),
            one_shot,
            done: false,
        })
    }

    /// Counts a run about to start for `owner`, or refuses it with the limit it would break.
    fn start_run(&self, owner: &str) -> Result<RunSlot<'_>> {
        self.start_run_as(owner).inspect_err(|e| self.refused(e))
    }

    fn start_run_as(&self, owner: &str) -> Result<RunSlot<'_>> {
        let quota = self.config.quotas.of(owner);
        let mut inner = self.lock();
        if let Some(max) = self.config.quotas.max_concurrent_runs
            && inner.runs_total >= max
        {
            return Err(Error::Quota {
                limit: Limit::Runs,
                message: format!(
                    "this server is running its maximum of {max} runs at once, all tenants \
                     together; retry in a few seconds"
                ),
            });
        }
        let running = inner.runs.get(owner).copied().unwrap_or(0);
        if let Some(max) = quota.max_concurrent_runs
            && running >= max
        {
            return Err(Error::Quota {
                limit: Limit::TenantRuns,
                message: format!(
                    "you have {running} runs in progress, the most one tenant may have at once \
                     ({max}); retry when one has finished"
                ),
            });
        }
        *inner.runs.entry(owner.to_owned()).or_default() += 1;
        inner.runs_total += 1;
        Ok(RunSlot {
            registry: self,
            owner: owner.to_owned(),
        })
    }

    /// Runs in progress now, all tenants together.
    pub fn runs_in_progress(&self) -> usize {
        self.lock().runs_total
    }

    /// Creates a sandbox for `owner` (from the pool when the request allows), and tells
    /// the owner's subscribers ([`EventKind::Created`]).
    pub async fn create(
        &self,
        owner: &str,
        req: CreateRequest,
    ) -> Result<(SandboxView, SandboxInfo)> {
        let created = self.create_as(owner, req, false).await?;
        self.publish(owner, &created.0.id, EventKind::Created);
        Ok(created)
    }

    /// Creates a sandbox for `owner`, without the event. A one-shot run's sandbox is no
    /// news, and is not held against the tenant's sandbox quota (only the server's).
    async fn create_as(
        &self,
        owner: &str,
        req: CreateRequest,
        one_shot: bool,
    ) -> Result<(SandboxView, SandboxInfo)> {
        let idle_timeout = self.idle_timeout(req.idle_timeout)?;
        let reservation = self.reserve_sandbox(owner, one_shot)?;
        let pooled = if req.env.is_empty()
            && req.limits.is_none()
            && req.network == Network::None
            && req.credential.is_none()
        {
            self.lock().pool.pop_front()
        } else {
            None
        };
        let info = match pooled {
            Some(info) => {
                self.pool_wanted.notify_one();
                info
            }
            None => {
                let mut env = self.config.base_env.clone();
                env.extend(req.env);
                self.backend
                    .create(SandboxSpec {
                        limits: req.limits,
                        env,
                        metadata: req.metadata.clone(),
                        network: req.network,
                        idle_timeout: Some(idle_timeout),
                        credential: req.credential,
                    })
                    .await?
            }
        };
        let entry = Entry {
            owner: owner.to_owned(),
            created_at: SystemTime::now(),
            idle_timeout,
            last_used: Instant::now(),
            busy: 0,
            metadata: req.metadata,
            limits: info.limits.clone(),
            languages: info.languages.clone(),
            paused_at: None,
            pause_deadline: None,
            workspace: None,
            one_shot,
            background: false,
            active_at: None,
        };
        let view = entry.view(&info.id);
        reservation.register(info.id.clone(), entry);
        Ok((view, info))
    }

    /// Marks `id` busy if `owner` owns it; the same error as for an unknown id otherwise.
    fn acquire(&self, owner: &str, id: &SandboxId) -> Result<Busy<'_>> {
        self.acquire_as(owner, id, false)
    }

    /// [`Registry::acquire`] for work that needs the sandbox's processes to run: refused
    /// while it is paused.
    fn acquire_running(&self, owner: &str, id: &SandboxId) -> Result<Busy<'_>> {
        self.acquire_as(owner, id, true)
    }

    fn acquire_as(&self, owner: &str, id: &SandboxId, running: bool) -> Result<Busy<'_>> {
        let mut inner = self.lock();
        match inner.entries.get_mut(id) {
            Some(e) if e.owner == owner && running && e.paused_at.is_some() => {
                Err(Error::InvalidRequest(format!(
                    "sandbox {id} is paused; resume it with resume_sandbox first"
                )))
            }
            Some(e) if e.owner == owner => {
                e.busy += 1;
                Ok(Busy {
                    registry: self,
                    id: id.clone(),
                })
            }
            _ => Err(Error::not_found(id)),
        }
    }

    fn forget_if_gone<T>(&self, id: &SandboxId, r: &Result<T>) {
        if matches!(r, Err(Error::SandboxNotFound { .. })) {
            self.lock().entries.remove(id);
        }
    }

    /// Runs `work` in one of `owner`'s sandboxes, or, without an id, in a sandbox made for
    /// it and closed after it (in the background: the answer need not wait for the
    /// teardown).
    pub async fn run(
        &self,
        owner: &str,
        sandbox: Option<&SandboxId>,
        work: Work,
        ctx: ExecContext,
    ) -> Result<Ran> {
        let _slot = self.start_run(owner)?;
        match sandbox {
            Some(id) => {
                let (outcome, changes) = self
                    .run_in(owner, id, work, ctx, self.config.track_changes)
                    .await?;
                Ok(Ran {
                    sandbox_id: id.clone(),
                    ephemeral: false,
                    outcome,
                    changes,
                })
            }
            None => {
                let one_shot = CreateRequest {
                    credential: ctx.credential.clone(),
                    ..CreateRequest::default()
                };
                self.one_shot(owner, one_shot, work, ctx).await
            }
        }
    }

    /// Runs `work` for `owner` once, in a fresh sandbox made as `req` asks (with a network,
    /// say) and closed after: what [`Registry::run`] does without a sandbox id.
    pub async fn run_once(
        &self,
        owner: &str,
        req: CreateRequest,
        work: Work,
        ctx: ExecContext,
    ) -> Result<Ran> {
        let _slot = self.start_run(owner)?;
        self.one_shot(owner, req, work, ctx).await
    }

    async fn one_shot(
        &self,
        owner: &str,
        req: CreateRequest,
        work: Work,
        ctx: ExecContext,
    ) -> Result<Ran> {
        let (view, _) = self.create_as(owner, req, true).await?;
        let r = self.run_in(owner, &view.id, work, ctx, false).await;
        self.close_later(&view.id).await;
        Ok(Ran {
            sandbox_id: view.id,
            ephemeral: true,
            outcome: r?.0,
            changes: None,
        })
    }

    async fn run_in(
        &self,
        owner: &str,
        id: &SandboxId,
        work: Work,
        ctx: ExecContext,
        track: bool,
    ) -> Result<(ExecOutcome, Option<Changes>)> {
        let _busy = self.acquire_running(owner, id)?;
        let language = match &work {
            Work::Code(req) => req.language,
            Work::Command(_) => Language::Bash,
        };
        let before = if track {
            // Taken, not copied: a run beside this one takes a snapshot of its own.
            let cached = self
                .lock()
                .entries
                .get_mut(id)
                .and_then(|e| e.workspace.take());
            match cached {
                Some(l) => Some(l),
                None => self.snapshot(id).await,
            }
        } else {
            None
        };
        let r = match work {
            Work::Code(req) => self.backend.exec(id, req, ctx).await,
            Work::Command(req) => self.backend.command(id, req, ctx).await,
        };
        self.forget_if_gone(id, &r);
        let outcome = r?;
        if outcome.kernel_restarted {
            self.publish(owner, id, EventKind::KernelRestarted { language });
        }
        let Some(before) = before else {
            return Ok((outcome, None));
        };
        let Some(after) = self.snapshot(id).await else {
            return Ok((outcome, None));
        };
        let changes = changes(&before, &after, MAX_CHANGES);
        // Kept only when nothing else is using the sandbox, whose changes could land between
        // this snapshot and the next run.
        if let Some(e) = self.lock().entries.get_mut(id).filter(|e| e.busy == 1) {
            e.workspace = Some(after);
        }
        Ok((outcome, changes))
    }

    /// A snapshot of a sandbox's /workspace, or `None` (logged) when it cannot be taken:
    /// change tracking is a convenience and never fails a run.
    async fn snapshot(&self, id: &SandboxId) -> Option<Listing> {
        match self.backend.workspace_snapshot(id).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(sandbox = %id, "no workspace snapshot: {e}");
                None
            }
        }
    }

    /// Closes a sandbox in the background: the answer need not wait for the teardown, and
    /// [`Registry::shutdown`] waits for every such close.
    async fn close_later(&self, id: &SandboxId) {
        if self.lock().entries.remove(id).is_none() {
            return;
        }
        let backend = Arc::clone(&self.backend);
        let id = id.clone();
        self.closing.lock().await.spawn(async move {
            if let Err(e) = backend.close(&id).await {
                tracing::debug!(sandbox = %id, "close after a one-shot run: {e}");
            }
        });
    }

    /// Lists a directory of one of `owner`'s sandboxes.
    pub async fn list_files(
        &self,
        owner: &str,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<Listing> {
        let _busy = self.acquire(owner, id)?;
        let r = self.backend.list_files(id, path, recursive).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Reads a file of one of `owner`'s sandboxes.
    pub async fn read_file(
        &self,
        owner: &str,
        id: &SandboxId,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileContent> {
        let _busy = self.acquire(owner, id)?;
        let r = self.backend.read_file(id, path, offset, length).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Writes a file in one of `owner`'s sandboxes.
    pub async fn write_file(
        &self,
        owner: &str,
        id: &SandboxId,
        path: &str,
        data: Vec<u8>,
        append: bool,
    ) -> Result<FileWritten> {
        let _busy = self.acquire(owner, id)?;
        if let Some(e) = self.lock().entries.get_mut(id) {
            e.workspace = None;
        }
        let r = self.backend.write_file(id, path, data, append).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Installs packages in one of `owner`'s sandboxes.
    pub async fn install(
        &self,
        owner: &str,
        id: &SandboxId,
        req: InstallRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome> {
        let _busy = self.acquire_running(owner, id)?;
        let _slot = self.start_run(owner)?;
        if let Some(e) = self.lock().entries.get_mut(id) {
            e.workspace = None;
        }
        let r = self.backend.install(id, req, ctx).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Starts a command in the background in one of `owner`'s sandboxes.
    pub async fn start_process(
        &self,
        owner: &str,
        id: &SandboxId,
        req: CommandRequest,
    ) -> Result<ProcessInfo> {
        let _busy = self.acquire_running(owner, id)?;
        if let Some(e) = self.lock().entries.get_mut(id) {
            e.workspace = None;
        }
        let r = self.backend.start_process(id, req).await;
        self.forget_if_gone(id, &r);
        if r.is_ok()
            && let Some(e) = self.lock().entries.get_mut(id)
        {
            e.background = true;
        }
        r
    }

    /// New output of a background process (waiting up to `wait` for some).
    pub async fn read_process(
        &self,
        owner: &str,
        id: &SandboxId,
        process: &ProcessId,
        wait: Duration,
    ) -> Result<ProcessOutput> {
        let _busy = self.acquire(owner, id)?;
        let r = self.backend.read_process(id, process, wait).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Kills a background process.
    pub async fn kill_process(
        &self,
        owner: &str,
        id: &SandboxId,
        process: &ProcessId,
    ) -> Result<ProcessInfo> {
        let _busy = self.acquire_running(owner, id)?;
        let r = self.backend.kill_process(id, process).await;
        self.forget_if_gone(id, &r);
        r
    }

    /// Freezes every process of one of `owner`'s sandboxes. Its idle clock stops until it
    /// is resumed; runs are refused meanwhile. Refused while a call is using it.
    pub async fn pause(&self, owner: &str, id: &SandboxId) -> Result<SandboxView> {
        {
            let mut inner = self.lock();
            match inner.entries.get_mut(id) {
                Some(e) if e.owner == owner => {
                    if e.paused_at.is_some() {
                        return Ok(e.view(id));
                    }
                    if e.busy > 0 {
                        return Err(Error::InvalidRequest(format!(
                            "sandbox {id} is running code; pause it once the run has ended (or \
                             cancel the run)"
                        )));
                    }
                    // Marked first, so no run starts while the backend freezes it.
                    let now = Instant::now();
                    e.paused_at = Some(now);
                    e.pause_deadline = Some(now + self.config.pause_timeout);
                }
                _ => return Err(Error::not_found(id)),
            }
        }
        let r = self.backend.set_paused(id, true).await;
        self.forget_if_gone(id, &r);
        let mut inner = self.lock();
        let e = inner
            .entries
            .get_mut(id)
            .ok_or_else(|| Error::not_found(id))?;
        if let Err(err) = r {
            e.paused_at = None;
            e.pause_deadline = None;
            return Err(err);
        }
        Ok(e.view(id))
    }

    /// Thaws one of `owner`'s paused sandboxes; its idle clock goes on where it stopped.
    pub async fn resume(&self, owner: &str, id: &SandboxId) -> Result<SandboxView> {
        match self.lock().entries.get(id) {
            Some(e) if e.owner == owner && e.paused_at.is_none() => return Ok(e.view(id)),
            Some(e) if e.owner == owner => {}
            _ => return Err(Error::not_found(id)),
        }
        let r = self.backend.set_paused(id, false).await;
        self.forget_if_gone(id, &r);
        r?;
        let mut inner = self.lock();
        let e = inner
            .entries
            .get_mut(id)
            .ok_or_else(|| Error::not_found(id))?;
        if let Some(at) = e.paused_at.take() {
            e.last_used += at.elapsed();
        }
        e.pause_deadline = None;
        Ok(e.view(id))
    }

    /// Sets the idle timeout of one of `owner`'s sandboxes, counted from now, and tells the
    /// backend.
    pub async fn set_timeout(
        &self,
        owner: &str,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<SandboxView> {
        let timeout = self.idle_timeout(Some(timeout))?;
        let view = {
            let mut inner = self.lock();
            match inner.entries.get_mut(id) {
                Some(e) if e.owner == owner => {
                    e.idle_timeout = timeout;
                    e.last_used = Instant::now();
                    if e.paused_at.is_some() {
                        e.paused_at = Some(e.last_used);
                    }
                    e.view(id)
                }
                _ => return Err(Error::not_found(id)),
            }
        };
        let r = self.backend.idle_timeout_changed(id, timeout).await;
        self.forget_if_gone(id, &r);
        r.map(|()| view)
    }

    /// One of `owner`'s sandboxes, with its state and resource use.
    pub async fn status(
        &self,
        owner: &str,
        id: &SandboxId,
    ) -> Result<(SandboxView, SandboxStatus)> {
        let view = {
            let inner = self.lock();
            match inner.entries.get(id) {
                Some(e) if e.owner == owner => e.view(id),
                _ => return Err(Error::not_found(id)),
            }
        };
        let r = self.backend.status(id).await;
        self.forget_if_gone(id, &r);
        let mut status = r?;
        status.state = view.state;
        Ok((view, status))
    }

    /// The limits and languages of one of `owner`'s sandboxes.
    pub fn describe(&self, owner: &str, id: &SandboxId) -> Result<(Limits, Vec<Language>)> {
        match self.lock().entries.get(id) {
            Some(e) if e.owner == owner => Ok((e.limits.clone(), e.languages.clone())),
            _ => Err(Error::not_found(id)),
        }
    }

    /// `owner`'s sandboxes, oldest first.
    pub fn list(&self, owner: &str) -> Vec<SandboxView> {
        let mut v: Vec<SandboxView> = self
            .lock()
            .entries
            .iter()
            .filter(|(_, e)| e.owner == owner)
            .map(|(id, e)| e.view(id))
            .collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// Closes one of `owner`'s sandboxes and everything running in it.
    pub async fn close(&self, owner: &str, id: &SandboxId) -> Result<()> {
        {
            let mut inner = self.lock();
            match inner.entries.get(id) {
                Some(e) if e.owner == owner => {
                    inner.entries.remove(id);
                }
                _ => return Err(Error::not_found(id)),
            }
        }
        match self.backend.close(id).await {
            // It died on its own meanwhile: closed either way.
            Ok(()) | Err(Error::SandboxNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sandboxes alive now (every owner, pool excluded).
    pub fn count(&self) -> usize {
        self.lock().entries.len()
    }

    /// Sandboxes waiting in the pool.
    pub fn pooled(&self) -> usize {
        self.lock().pool.len()
    }

    /// How many sandboxes are in each state now, for metrics.
    pub fn census(&self) -> Census {
        let inner = self.lock();
        let mut c = Census {
            pooled: inner.pool.len(),
            creating: inner.creating_total(),
            runs: inner.runs_total,
            ..Census::default()
        };
        for e in inner.entries.values() {
            if e.paused_at.is_some() {
                c.paused += 1;
            } else if e.busy > 0 {
                c.busy += 1;
            } else {
                c.idle += 1;
            }
        }
        c
    }

    /// Closes every expired sandbox (idle past its timeout, or paused past the pause
    /// timeout); returns how many.
    ///
    /// A sandbox whose idle time ran out but which had background processes is closed
    /// only once the backend says none runs (its idle clock then counts from the end of
    /// the last one), or once it has had no call for [`RegistryConfig::max_idle_timeout`].
    pub async fn reap(&self) -> usize {
        let (mut expired, to_ask) = {
            let mut inner = self.lock();
            let max_life = self.config.max_idle_timeout;
            let mut now = Vec::new();
            let mut ask = Vec::new();
            for (id, e) in &inner.entries {
                let Some(why) = e.expired() else {
                    continue;
                };
                if e.background && e.paused_at.is_none() && e.last_used.elapsed() < max_life {
                    ask.push(id.clone());
                } else {
                    now.push((id.clone(), why));
                }
            }
            let now: Vec<(SandboxId, Entry, &'static str)> = now
                .into_iter()
                .filter_map(|(id, why)| inner.entries.remove(&id).map(|e| (id, e, why)))
                .collect();
            (now, ask)
        };
        for id in to_ask {
            let activity = self.backend.background_activity(&id).await;
            let mut inner = self.lock();
            let Some(e) = inner.entries.get_mut(&id) else {
                continue;
            };
            match activity {
                Ok(BackgroundActivity::Running) => e.active_at = Some(Instant::now()),
                Ok(BackgroundActivity::Ended(at)) => {
                    e.background = false;
                    e.active_at = at.max(e.active_at);
                }
                Err(ref err) => {
                    tracing::debug!(sandbox = %id, "background processes unknown: {err}");
                    e.background = false;
                }
            }
            // Checked again: a call may have begun meanwhile.
            let why = if e.background { None } else { e.expired() };
            if let Some(why) = why
                && let Some(entry) = inner.entries.remove(&id)
            {
                expired.push((id, entry, why));
            }
        }
        for (id, entry, why) in &expired {
            tracing::info!(sandbox = %id, "sandbox expired ({why}); closing it");
            if let Err(e) = self.backend.close(id).await {
                tracing::debug!(sandbox = %id, "closing an expired sandbox: {e}");
            }
            let paused = entry.paused_at.is_some();
            let after = if paused {
                self.config.pause_timeout
            } else {
                entry.idle_timeout
            };
            self.publish(&entry.owner, id, EventKind::Expired { after, paused });
        }
        expired.len()
    }

    async fn reap_loop(&self) {
        let mut tick = tokio::time::interval(self.config.reap_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = tick.tick() => { self.reap().await; }
            }
        }
    }

    async fn pool_loop(&self) {
        loop {
            while self.lock().pool.len() < self.config.pool_size && !self.stop.is_cancelled() {
                match self.fresh_sandbox().await {
                    Ok(info) => {
                        if self.stop.is_cancelled() {
                            let _ = self.backend.close(&info.id).await;
                            return;
                        }
                        self.lock().pool.push_back(info);
                    }
                    Err(_) if self.stop.is_cancelled() => return,
                    Err(e) => {
                        tracing::warn!(
                            "could not fill the warm pool: {}; retrying in 5 s",
                            crate::error::chain(&e)
                        );
                        tokio::select! {
                            () = self.stop.cancelled() => return,
                            () = tokio::time::sleep(Duration::from_secs(5)) => {}
                        }
                    }
                }
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = self.pool_wanted.notified() => {}
            }
        }
    }

    /// A sandbox with default settings and a warm Python kernel (when Python is available).
    async fn fresh_sandbox(&self) -> Result<SandboxInfo> {
        let info = self
            .backend
            .create(SandboxSpec {
                env: self.config.base_env.clone(),
                ..SandboxSpec::default()
            })
            .await?;
        if info.languages.contains(&Language::Python) {
            let warm = ExecRequest::new(Language::Python, "None", Duration::from_secs(30));
            if let Err(e) = self
                .backend
                .exec(&info.id, warm, ExecContext::default())
                .await
            {
                let _ = self.backend.close(&info.id).await;
                return Err(e);
            }
        }
        Ok(info)
    }

    /// Stops the reaper and the pool and closes every sandbox, pooled ones included.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        // The pool filler may be creating a sandbox: let it finish (it closes what it made
        // once it sees the stop), so nothing escapes the closing below.
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            let _ = task.await;
        }
        let ids: Vec<SandboxId> = {
            let mut inner = self.lock();
            let mut ids: Vec<SandboxId> = inner.entries.drain().map(|(id, _)| id).collect();
            ids.extend(inner.pool.drain(..).map(|i| i.id));
            ids
        };
        let mut closing = std::mem::take(&mut *self.closing.lock().await);
        for id in ids {
            let backend = Arc::clone(&self.backend);
            closing.spawn(async move {
                let _ = backend.close(&id).await;
            });
        }
        while closing.join_next().await.is_some() {}
        self.backend.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A backend that only counts: enough to test the registry's own rules.
    #[derive(Default)]
    struct Fake {
        live: Mutex<Vec<SandboxId>>,
        created: AtomicUsize,
        execs: AtomicUsize,
        /// The one /workspace all fake sandboxes share: a run of `touch NAME` adds NAME.
        workspace: Mutex<Vec<String>>,
        snapshots: AtomicUsize,
        paused: std::sync::atomic::AtomicBool,
        /// The environment each sandbox was created with, in order.
        envs: Mutex<Vec<BTreeMap<String, String>>>,
        /// What every sandbox's background processes are doing (`None`: none ran).
        background: Mutex<Option<BackgroundActivity>>,
    }

    impl Fake {
        fn add_file(&self, name: &str) {
            self.workspace.lock().unwrap().push(name.to_owned());
        }
    }

    #[async_trait]
    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn create(&self, spec: SandboxSpec) -> Result<SandboxInfo> {
            self.created.fetch_add(1, Ordering::SeqCst);
            self.envs.lock().unwrap().push(spec.env);
            let id = SandboxId::random();
            self.live.lock().unwrap().push(id.clone());
            Ok(SandboxInfo {
                id,
                created_at: SystemTime::now(),
                limits: Limits::default(),
                languages: vec![Language::Python],
                allowed_hosts: Vec::new(),
            })
        }
        async fn exec(
            &self,
            id: &SandboxId,
            req: ExecRequest,
            _ctx: ExecContext,
        ) -> Result<ExecOutcome> {
            if !self.live.lock().unwrap().contains(id) {
                return Err(Error::not_found(id));
            }
            self.execs.fetch_add(1, Ordering::SeqCst);
            if let Some(name) = req.code.strip_prefix("touch ") {
                self.add_file(name);
            }
            tokio::time::sleep(req.timeout.min(Duration::from_millis(50))).await;
            Ok(ExecOutcome {
                kernel_restarted: req.code == "restart",
                stdout: req.code,
                ..Default::default()
            })
        }
        async fn command(
            &self,
            id: &SandboxId,
            req: CommandRequest,
            ctx: ExecContext,
        ) -> Result<ExecOutcome> {
            self.exec(
                id,
                ExecRequest::new(Language::Bash, req.command, req.timeout),
                ctx,
            )
            .await
        }
        async fn list_files(&self, _: &SandboxId, _: &str, _: bool) -> Result<Listing> {
            Err(Error::Unsupported {
                backend: "fake",
                operation: "files",
            })
        }
        async fn read_file(
            &self,
            _: &SandboxId,
            _: &str,
            _: u64,
            _: Option<u64>,
        ) -> Result<FileContent> {
            Err(Error::Unsupported {
                backend: "fake",
                operation: "files",
            })
        }
        async fn write_file(
            &self,
            _: &SandboxId,
            path: &str,
            data: Vec<u8>,
            _: bool,
        ) -> Result<FileWritten> {
            self.add_file(path);
            Ok(FileWritten {
                path: path.to_owned(),
                size: data.len() as u64,
            })
        }
        async fn start_process(&self, _: &SandboxId, req: CommandRequest) -> Result<ProcessInfo> {
            Ok(ProcessInfo {
                id: ProcessId::nth(1),
                command: req.command,
                started_at: SystemTime::now(),
                exit_code: None,
            })
        }
        async fn background_activity(&self, _: &SandboxId) -> Result<BackgroundActivity> {
            Ok(self
                .background
                .lock()
                .unwrap()
                .unwrap_or(BackgroundActivity::Ended(None)))
        }
        async fn set_paused(&self, _: &SandboxId, paused: bool) -> Result<()> {
            self.paused.store(paused, Ordering::SeqCst);
            Ok(())
        }
        async fn workspace_snapshot(&self, _: &SandboxId) -> Result<Listing> {
            self.snapshots.fetch_add(1, Ordering::SeqCst);
            let entries = self
                .workspace
                .lock()
                .unwrap()
                .iter()
                .map(|name| crate::FileEntry {
                    name: name.clone(),
                    path: format!("/workspace/{name}"),
                    kind: crate::FileKind::File,
                    size: 1,
                    modified: SystemTime::UNIX_EPOCH,
                })
                .collect();
            Ok(Listing {
                entries,
                truncated: false,
            })
        }
        async fn status(&self, id: &SandboxId) -> Result<SandboxStatus> {
            if !self.live.lock().unwrap().contains(id) {
                return Err(Error::not_found(id));
            }
            Ok(SandboxStatus {
                id: id.clone(),
                state: SandboxState::Running,
                created_at: SystemTime::now(),
                limits: Limits::default(),
                enforced: crate::EnforcedLimits::default(),
                memory_bytes: None,
                cpu_seconds: None,
                pids: None,
                kernels: vec![],
                processes: vec![],
            })
        }
        async fn close(&self, id: &SandboxId) -> Result<()> {
            let mut live = self.live.lock().unwrap();
            let before = live.len();
            live.retain(|x| x != id);
            if live.len() == before {
                Err(Error::not_found(id))
            } else {
                Ok(())
            }
        }
        async fn shutdown(&self) {
            self.live.lock().unwrap().clear();
        }
    }

    fn registry(config: RegistryConfig) -> (Arc<Fake>, Arc<Registry>) {
        let fake = Arc::new(Fake::default());
        let r = Registry::new(fake.clone(), config);
        (fake, r)
    }

    fn run(code: &str) -> Work {
        Work::Code(ExecRequest::new(
            Language::Python,
            code,
            Duration::from_millis(1),
        ))
    }

    fn changed(ran: &Ran) -> Vec<String> {
        ran.changes
            .iter()
            .flat_map(|c| c.files.iter().map(|f| f.path.clone()))
            .collect()
    }

    #[tokio::test]
    async fn runs_report_the_files_they_changed_with_one_snapshot_each() {
        let (fake, r) = registry(RegistryConfig::default());
        let (view, _) = r.create("a", CreateRequest::default()).await.unwrap();
        let id = Some(&view.id);
        let ran = r
            .run("a", id, run("touch one"), ExecContext::default())
            .await;
        assert_eq!(changed(&ran.unwrap()), ["/workspace/one"]);
        assert_eq!(fake.snapshots.load(Ordering::SeqCst), 2);
        // The next run starts from the last one's snapshot.
        let ran = r
            .run("a", id, run("touch two"), ExecContext::default())
            .await;
        assert_eq!(changed(&ran.unwrap()), ["/workspace/two"]);
        assert_eq!(fake.snapshots.load(Ordering::SeqCst), 3);
        // A file written through the registry is not the next run's doing.
        r.write_file("a", &view.id, "three", b"x".to_vec(), false)
            .await
            .unwrap();
        let ran = r.run("a", id, run("print"), ExecContext::default()).await;
        assert!(changed(&ran.unwrap()).is_empty());
        assert_eq!(fake.snapshots.load(Ordering::SeqCst), 5);
        // A file changed between runs some other way (a background process) is reported
        // by the next run.
        fake.add_file("four");
        let ran = r.run("a", id, run("print"), ExecContext::default()).await;
        assert_eq!(changed(&ran.unwrap()), ["/workspace/four"]);
        // One-shot runs neither snapshot nor report.
        let ran = r
            .run("a", None, run("touch five"), ExecContext::default())
            .await;
        assert!(ran.unwrap().changes.is_none());
        assert_eq!(fake.snapshots.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn paused_sandboxes_refuse_runs_and_do_not_expire() {
        let (fake, r) = registry(RegistryConfig::default());
        let (view, _) = r.create("a", CreateRequest::default()).await.unwrap();
        let id = view.id.clone();
        r.set_timeout("a", &id, Duration::from_millis(50))
            .await
            .unwrap();
        assert!(r.pause("b", &id).await.unwrap_err().is_caller_error());
        let v = r.pause("a", &id).await.unwrap();
        assert_eq!(v.state, SandboxState::Paused);
        assert!(fake.paused.load(Ordering::SeqCst));
        let e = r
            .run("a", Some(&id), run("1"), ExecContext::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("resume_sandbox"), "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.reap().await, 0, "a paused sandbox expired");
        let v = r.resume("a", &id).await.unwrap();
        assert_eq!(v.state, SandboxState::Running);
        assert!(!fake.paused.load(Ordering::SeqCst));
        r.run("a", Some(&id), run("1"), ExecContext::default())
            .await
            .unwrap();
        // A sandbox running code cannot be paused.
        let busy = {
            let r = Arc::clone(&r);
            let id = id.clone();
            tokio::spawn(async move {
                let slow = Work::Code(ExecRequest::new(
                    Language::Python,
                    "x",
                    Duration::from_secs(1),
                ));
                r.run("a", Some(&id), slow, ExecContext::default()).await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let e = r.pause("a", &id).await.unwrap_err();
        assert!(e.to_string().contains("running code"), "{e}");
        busy.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.reap().await, 1, "the resumed sandbox did not expire");
    }

    #[tokio::test(start_paused = true)]
    async fn paused_sandboxes_count_in_every_quota_and_close_after_the_pause_timeout() {
        let (fake, r) = registry(RegistryConfig {
            pause_timeout: Duration::from_secs(600),
            quotas: Quotas {
                max_sandboxes: Some(3),
                per_tenant: crate::TenantQuota {
                    max_sandboxes: Some(2),
                    max_concurrent_runs: None,
                },
                ..Quotas::default()
            },
            ..Default::default()
        });
        let (a1, _) = r.create("a", CreateRequest::default()).await.unwrap();
        let (a2, _) = r.create("a", CreateRequest::default()).await.unwrap();
        let paused = r.pause("a", &a1.id).await.unwrap();
        r.pause("a", &a2.id).await.unwrap();
        let left = paused
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        assert!(
            left > Duration::from_secs(590) && left <= Duration::from_secs(600),
            "a paused sandbox closes at the pause timeout: {left:?} left"
        );
        // Paused, they still hold their places: in their tenant's quota ...
        let e = r.create("a", CreateRequest::default()).await.unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::TenantSandboxes), "{e}");
        // ... and in the server's.
        let (b, _) = r.create("b", CreateRequest::default()).await.unwrap();
        let e = r.create("b", CreateRequest::default()).await.unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::Sandboxes), "{e}");
        // A longer idle timeout, or pausing again, does not move the pause deadline.
        r.set_timeout("a", &a1.id, Duration::from_secs(24 * 3600))
            .await
            .unwrap();
        r.pause("a", &a1.id).await.unwrap();
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(r.reap().await, 0, "closed before the pause timeout");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(r.reap().await, 2, "paused past the pause timeout, yet kept");
        let live = fake.live.lock().unwrap().clone();
        assert!(!live.contains(&a1.id) && !live.contains(&a2.id), "{live:?}");
        assert!(live.contains(&b.id), "the idle one (900 s) went too");
        // Their places are free again. Resumed before the reaper came by, a sandbox paused
        // past the timeout runs on, with its idle clock where it stopped.
        let (d, _) = r.create("a", CreateRequest::default()).await.unwrap();
        r.pause("a", &d.id).await.unwrap();
        tokio::time::advance(Duration::from_secs(700)).await;
        let resumed = r.resume("a", &d.id).await.unwrap();
        assert_eq!(resumed.state, SandboxState::Running);
        assert_eq!(r.reap().await, 1, "only b, idle for 1301 s, expires");
        let live = fake.live.lock().unwrap().clone();
        assert!(live.contains(&d.id) && !live.contains(&b.id), "{live:?}");
    }

    #[tokio::test]
    async fn another_tenants_sandbox_is_not_found() {
        let (_, r) = registry(RegistryConfig::default());
        let (view, _) = r.create("alice", CreateRequest::default()).await.unwrap();
        let id = view.id;
        let not_found = |e: Error| matches!(e, Error::SandboxNotFound { .. });
        assert!(not_found(
            r.run("bob", Some(&id), run("x"), ExecContext::default())
                .await
                .unwrap_err()
        ));
        assert!(not_found(r.status("bob", &id).await.unwrap_err()));
        assert!(not_found(r.close("bob", &id).await.unwrap_err()));
        assert!(r.list("bob").is_empty());
        assert_eq!(r.list("alice").len(), 1);
        // Exactly the error of an id that never existed.
        let never = SandboxId::random();
        let a = r
            .run("bob", Some(&id), run("x"), ExecContext::default())
            .await
            .unwrap_err()
            .to_string();
        let b = r
            .run("bob", Some(&never), run("x"), ExecContext::default())
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            a.replace(id.as_str(), "ID"),
            b.replace(never.as_str(), "ID")
        );
        r.close("alice", &id).await.unwrap();
        assert!(not_found(r.close("alice", &id).await.unwrap_err()));
    }

    #[tokio::test]
    async fn idle_sandboxes_expire_but_busy_ones_do_not() {
        let (fake, r) = registry(RegistryConfig::default());
        let short = CreateRequest {
            idle_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        };
        let (idle, _) = r.create("t", short.clone()).await.unwrap();
        let (busy, _) = r.create("t", short).await.unwrap();
        let r2 = Arc::clone(&r);
        let busy_id = busy.id.clone();
        let running = tokio::spawn(async move {
            let req = ExecRequest::new(Language::Python, "slow", Duration::from_millis(200));
            r2.run("t", Some(&busy_id), Work::Code(req), ExecContext::default())
                .await
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.reap().await, 1, "only the idle sandbox expires");
        assert!(r.status("t", &idle.id).await.is_err());
        assert!(r.status("t", &busy.id).await.is_ok());
        running.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.reap().await, 1);
        assert!(fake.live.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn background_processes_keep_a_sandbox_alive_up_to_the_longest_idle_life() {
        let (fake, r) = registry(RegistryConfig {
            max_idle_timeout: Duration::from_millis(600),
            ..Default::default()
        });
        let short = CreateRequest {
            idle_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        };
        let set = |a: BackgroundActivity| *fake.background.lock().unwrap() = Some(a);
        let (with, _) = r.create("t", short.clone()).await.unwrap();
        let (without, _) = r.create("t", short.clone()).await.unwrap();
        let job = CommandRequest::new("serve", Duration::from_secs(1));
        r.start_process("t", &with.id, job.clone()).await.unwrap();
        set(BackgroundActivity::Running);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            r.reap().await,
            1,
            "only the sandbox running nothing expires"
        );
        assert!(r.status("t", &without.id).await.is_err());
        assert!(r.status("t", &with.id).await.is_ok());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.reap().await, 0, "it still runs");
        // Once the process has ended, the idle clock counts from its end.
        set(BackgroundActivity::Ended(Some(Instant::now())));
        assert_eq!(r.reap().await, 0, "idle for less than its timeout");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.reap().await, 1);
        assert!(r.status("t", &with.id).await.is_err());
        // A process that never ends keeps its sandbox only up to the longest idle life
        // since the last call.
        let (forever, _) = r.create("t", short).await.unwrap();
        r.start_process("t", &forever.id, job).await.unwrap();
        set(BackgroundActivity::Running);
        let started = Instant::now();
        let mut closed_after = None;
        while started.elapsed() < Duration::from_secs(5) {
            if r.reap().await == 1 {
                closed_after = Some(started.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let closed_after = closed_after.expect("a sandbox outlived the longest idle life");
        assert!(
            closed_after >= Duration::from_millis(600),
            "{closed_after:?}"
        );
    }

    fn quota_of(e: &Error) -> Option<Limit> {
        match e {
            Error::Quota { limit, .. } => Some(*limit),
            _ => None,
        }
    }

    #[tokio::test]
    async fn tenants_hold_at_most_their_quota_of_sandboxes_and_the_server_its_own() {
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&refusals);
        let (fake, r) = registry(RegistryConfig {
            on_refusal: Some(Arc::new(move |l| seen.lock().unwrap().push(l))),
            quotas: Quotas {
                max_sandboxes: Some(3),
                per_tenant: crate::TenantQuota {
                    max_sandboxes: Some(2),
                    max_concurrent_runs: None,
                },
                ..Quotas::default()
            },
            ..Default::default()
        });
        let (a1, _) = r.create("a", CreateRequest::default()).await.unwrap();
        r.create("a", CreateRequest::default()).await.unwrap();
        let e = r.create("a", CreateRequest::default()).await.unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::TenantSandboxes), "{e}");
        assert!(e.to_string().contains("close_sandbox"), "{e}");
        // A one-shot run is not held against the tenant's sandbox quota (it counts as a
        // run), only against the server's total.
        let work = Work::Code(ExecRequest::new(
            Language::Python,
            "1",
            Duration::from_secs(1),
        ));
        let ran = r
            .run("a", None, work.clone(), ExecContext::default())
            .await
            .unwrap();
        assert!(ran.ephemeral);
        // Another tenant has a quota of its own, until the server's total is reached.
        r.create("b", CreateRequest::default()).await.unwrap();
        let e = r.create("b", CreateRequest::default()).await.unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::Sandboxes), "{e}");
        let e = r
            .run("a", None, work.clone(), ExecContext::default())
            .await
            .unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::Sandboxes), "{e}");
        assert_eq!(
            fake.created.load(Ordering::SeqCst),
            4,
            "nothing made for a refusal"
        );
        assert_eq!(
            *refusals.lock().unwrap(),
            [Limit::TenantSandboxes, Limit::Sandboxes, Limit::Sandboxes]
        );
        // Closing one makes room again.
        r.close("a", &a1.id).await.unwrap();
        r.create("a", CreateRequest::default()).await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_creation_gives_its_place_back() {
        let (_, r) = registry(RegistryConfig {
            quotas: Quotas {
                per_tenant: crate::TenantQuota {
                    max_sandboxes: Some(1),
                    max_concurrent_runs: None,
                },
                ..Quotas::default()
            },
            ..Default::default()
        });
        let bad = CreateRequest {
            idle_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(r.create("a", bad).await.is_err());
        r.create("a", CreateRequest::default()).await.unwrap();
    }

    #[tokio::test]
    async fn concurrent_runs_are_capped_per_tenant_and_for_the_server() {
        let (_, r) = registry(RegistryConfig {
            quotas: Quotas {
                max_concurrent_runs: Some(3),
                per_tenant: crate::TenantQuota {
                    max_sandboxes: None,
                    max_concurrent_runs: Some(2),
                },
                lookup: Some(Arc::new(|t: &str| {
                    (t == "big").then_some(crate::TenantQuota {
                        max_sandboxes: None,
                        max_concurrent_runs: Some(10),
                    })
                })),
                ..Quotas::default()
            },
            ..Default::default()
        });
        let (s, _) = r.create("a", CreateRequest::default()).await.unwrap();
        let (big, _) = r.create("big", CreateRequest::default()).await.unwrap();
        // The fake backend's runs last 50 ms: start two and try a third meanwhile.
        let slow = || {
            Work::Code(ExecRequest::new(
                Language::Python,
                "x",
                Duration::from_secs(1),
            ))
        };
        let (r1, r2) = (Arc::clone(&r), Arc::clone(&r));
        let (s1, s2) = (s.id.clone(), s.id.clone());
        let w1 = slow();
        let w2 = slow();
        let first =
            tokio::spawn(async move { r1.run("a", Some(&s1), w1, ExecContext::default()).await });
        let second =
            tokio::spawn(async move { r2.run("a", Some(&s2), w2, ExecContext::default()).await });
        while r.runs_in_progress() < 2 {
            tokio::task::yield_now().await;
        }
        let e = r
            .run("a", Some(&s.id), slow(), ExecContext::default())
            .await
            .unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::TenantRuns), "{e}");
        // A tenant with a larger quota of its own still meets the server's cap.
        let r3 = Arc::clone(&r);
        let big_id = big.id.clone();
        let w3 = slow();
        let third = tokio::spawn(async move {
            r3.run("big", Some(&big_id), w3, ExecContext::default())
                .await
        });
        while r.runs_in_progress() < 3 {
            tokio::task::yield_now().await;
        }
        let e = r
            .run("big", Some(&big.id), slow(), ExecContext::default())
            .await
            .unwrap_err();
        assert_eq!(quota_of(&e), Some(Limit::Runs), "{e}");
        for t in [first, second, third] {
            t.await.unwrap().unwrap();
        }
        assert_eq!(r.runs_in_progress(), 0);
        r.run("a", Some(&s.id), slow(), ExecContext::default())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn timeouts_are_checked_against_the_maximum() {
        let (_, r) = registry(RegistryConfig {
            max_idle_timeout: Duration::from_secs(60),
            ..Default::default()
        });
        let too_long = CreateRequest {
            idle_timeout: Some(Duration::from_secs(61)),
            ..Default::default()
        };
        let e = r.create("t", too_long).await.unwrap_err();
        assert!(e.to_string().contains("maximum of 60"), "{e}");
        let zero = CreateRequest {
            idle_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(r.create("t", zero).await.is_err());
        let (view, _) = r.create("t", CreateRequest::default()).await.unwrap();
        assert_eq!(view.idle_timeout, Duration::from_secs(900));
    }

    #[tokio::test]
    async fn the_pool_hands_out_warm_sandboxes_once() {
        let (fake, r) = registry(RegistryConfig {
            pool_size: 2,
            ..Default::default()
        });
        r.start();
        for _ in 0..100 {
            if r.pooled() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(r.pooled(), 2);
        // Each pooled sandbox had its Python kernel warmed.
        assert_eq!(fake.execs.load(Ordering::SeqCst), 2);
        let (a, _) = r.create("alice", CreateRequest::default()).await.unwrap();
        assert_eq!(
            fake.created.load(Ordering::SeqCst),
            2,
            "taken from the pool, not created"
        );
        // A request with its own environment cannot use a pooled sandbox.
        let env = CreateRequest {
            env: [("K".into(), "V".into())].into(),
            ..Default::default()
        };
        r.create("alice", env).await.unwrap();
        assert!(fake.created.load(Ordering::SeqCst) >= 3);
        // Closed, it is gone for good; the pool refills with fresh ones.
        r.close("alice", &a.id).await.unwrap();
        for _ in 0..100 {
            if r.pooled() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!fake.live.lock().unwrap().contains(&a.id));
        r.shutdown().await;
        assert!(fake.live.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn every_sandbox_starts_with_the_base_environment() {
        let base: BTreeMap<String, String> = [("TOKEN".into(), "s3cret".into())].into();
        let (fake, r) = registry(RegistryConfig {
            base_env: base.clone(),
            pool_size: 1,
            ..Default::default()
        });
        // Its values never show in the configuration's Debug output.
        let shown = format!("{:?}", r.config());
        assert!(
            shown.contains("TOKEN") && !shown.contains("s3cret"),
            "{shown}"
        );
        r.start();
        for _ in 0..100 {
            if r.pooled() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(r.pooled(), 1);
        assert_eq!(fake.envs.lock().unwrap()[0], base, "the pooled sandbox");
        // A one-shot run takes the pooled sandbox, which has it.
        r.run("t", None, run("x"), ExecContext::default())
            .await
            .unwrap();
        // A creator's own variables are added, and win over the base.
        let own = CreateRequest {
            env: [("TOKEN".into(), "mine".into()), ("X".into(), "1".into())].into(),
            ..Default::default()
        };
        r.create("t", own).await.unwrap();
        let envs = fake.envs.lock().unwrap().clone();
        let last = envs.last().unwrap();
        assert_eq!(last["TOKEN"], "mine");
        assert_eq!(last["X"], "1");
        // Every sandbox made, refills of the pool included, had the base variables.
        assert!(envs.iter().all(|e| e.contains_key("TOKEN")), "{envs:?}");
        r.shutdown().await;
    }

    #[tokio::test]
    async fn one_shot_runs_close_their_sandbox() {
        let (fake, r) = registry(RegistryConfig::default());
        let ran = r
            .run("t", None, run("hello"), ExecContext::default())
            .await
            .unwrap();
        let id = ran.sandbox_id;
        assert!(ran.ephemeral);
        assert_eq!(ran.outcome.stdout, "hello");
        assert!(r.list("t").is_empty());
        r.shutdown().await;
        assert!(!fake.live.lock().unwrap().contains(&id));
    }

    #[tokio::test]
    async fn lifecycle_events_name_the_owner_and_only_owned_sandboxes() {
        let (_fake, r) = registry(RegistryConfig::default());
        let mut events = r.subscribe_events();
        let short = CreateRequest {
            idle_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        };
        let (a, _) = r.create("alice", short).await.unwrap();
        let (b, _) = r.create("bob", CreateRequest::default()).await.unwrap();
        // A one-shot run's sandbox is not announced.
        r.run("bob", None, run("x"), ExecContext::default())
            .await
            .unwrap();
        r.run("bob", Some(&b.id), run("restart"), ExecContext::default())
            .await
            .unwrap();
        let refused = EventKind::EgressRefused {
            host: Some("evil.example".into()),
            port: Some(443),
            reason: "host_not_allowed".into(),
            detail: String::new(),
        };
        r.report(&b.id, refused.clone());
        // Nobody owns an unknown sandbox: nothing is published for it.
        r.report(&SandboxId::from("sbx_nobody"), refused.clone());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(r.reap().await, 1);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push((e.tenant, e.sandbox_id, e.kind));
        }
        assert_eq!(
            seen,
            vec![
                ("alice".into(), a.id.clone(), EventKind::Created),
                ("bob".into(), b.id.clone(), EventKind::Created),
                (
                    "bob".into(),
                    b.id.clone(),
                    EventKind::KernelRestarted {
                        language: Language::Python
                    }
                ),
                ("bob".into(), b.id.clone(), refused),
                (
                    "alice".into(),
                    a.id.clone(),
                    EventKind::Expired {
                        after: Duration::from_millis(30),
                        paused: false,
                    }
                ),
            ]
        );
        r.shutdown().await;
    }
}
