//! The sandbox registry: which tenant owns which sandbox, when each expires, and a warm pool
//! of fresh sandboxes, in front of any [`Backend`].
//!
//! Front ends talk to the registry, never to a backend directly, so ownership and expiry are
//! enforced in one place whatever the backend. A sandbox belongs to the tenant that created
//! it; asking for another tenant's sandbox fails exactly as asking for one that never
//! existed. A sandbox expires when it has been idle (no run in progress) for its timeout; the
//! reaper closes it. The pool keeps fresh sandboxes with a warm Python kernel; one taken from
//! the pool serves one owner and is closed, never returned, when that owner is done.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::exec::{CommandRequest, ExecContext, ExecOutcome, ExecRequest, Language};
use crate::files::{Changes, FileContent, FileWritten, Listing, changes};
use crate::limits::Limits;
use crate::sandbox::{SandboxId, SandboxInfo, SandboxSpec, SandboxState, SandboxStatus};

/// Settings of the registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Idle life of a sandbox whose creator gives none.
    pub default_idle_timeout: Duration,
    /// Longest idle life a creator may ask for.
    pub max_idle_timeout: Duration,
    /// Fresh sandboxes kept ready (0: no pool).
    pub pool_size: usize,
    /// How often expired sandboxes are looked for.
    pub reap_interval: Duration,
    /// Whether a run in a named sandbox reports the files it created or changed under
    /// `/workspace` ([`Ran::changes`]); it costs a snapshot before and after the run.
    pub track_changes: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            default_idle_timeout: Duration::from_secs(900),
            max_idle_timeout: Duration::from_secs(24 * 3600),
            pool_size: 0,
            reap_interval: Duration::from_secs(1),
            track_changes: true,
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

/// A sandbox as its owner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxView {
    /// Its id.
    pub id: SandboxId,
    /// Lifecycle state.
    pub state: SandboxState,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it will expire if it stays idle (a run in progress keeps it alive).
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
}

impl Entry {
    fn view(&self, id: &SandboxId) -> SandboxView {
        let left = if self.busy > 0 {
            self.idle_timeout
        } else {
            self.idle_timeout.saturating_sub(self.last_used.elapsed())
        };
        SandboxView {
            id: id.clone(),
            state: SandboxState::Running,
            created_at: self.created_at,
            expires_at: SystemTime::now() + left,
            idle_timeout: self.idle_timeout,
            busy: self.busy,
            metadata: self.metadata.clone(),
        }
    }

    fn expired(&self) -> bool {
        self.busy == 0 && self.last_used.elapsed() >= self.idle_timeout
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<SandboxId, Entry>,
    pool: VecDeque<SandboxInfo>,
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
        })
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

    /// Creates a sandbox for `owner` (from the pool when the request allows).
    pub async fn create(
        &self,
        owner: &str,
        req: CreateRequest,
    ) -> Result<(SandboxView, SandboxInfo)> {
        let idle_timeout = self.idle_timeout(req.idle_timeout)?;
        let pooled = if req.env.is_empty() && req.limits.is_none() {
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
                self.backend
                    .create(SandboxSpec {
                        limits: req.limits,
                        env: req.env,
                        metadata: req.metadata.clone(),
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
        };
        let view = entry.view(&info.id);
        self.lock().entries.insert(info.id.clone(), entry);
        Ok((view, info))
    }

    /// Marks `id` busy if `owner` owns it; the same error as for an unknown id otherwise.
    fn acquire(&self, owner: &str, id: &SandboxId) -> Result<Busy<'_>> {
        let mut inner = self.lock();
        match inner.entries.get_mut(id) {
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
                let (view, _) = self.create(owner, CreateRequest::default()).await?;
                let r = self.run_in(owner, &view.id, work, ctx, false).await;
                self.close_later(&view.id).await;
                Ok(Ran {
                    sandbox_id: view.id,
                    ephemeral: true,
                    outcome: r?.0,
                    changes: None,
                })
            }
        }
    }

    async fn run_in(
        &self,
        owner: &str,
        id: &SandboxId,
        work: Work,
        ctx: ExecContext,
        track: bool,
    ) -> Result<(ExecOutcome, Option<Changes>)> {
        let _busy = self.acquire(owner, id)?;
        let before = if track { self.snapshot(id).await } else { None };
        let r = match work {
            Work::Code(req) => self.backend.exec(id, req, ctx).await,
            Work::Command(req) => self.backend.command(id, req, ctx).await,
        };
        self.forget_if_gone(id, &r);
        let outcome = r?;
        let changes = match before {
            Some(before) => self
                .snapshot(id)
                .await
                .and_then(|after| changes(&before, &after, MAX_CHANGES)),
            None => None,
        };
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
        let r = self.backend.write_file(id, path, data, append).await;
        self.forget_if_gone(id, &r);
        r
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
        Ok((view, r?))
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

    /// Closes every expired sandbox; returns how many.
    pub async fn reap(&self) -> usize {
        let expired: Vec<SandboxId> = {
            let mut inner = self.lock();
            let ids: Vec<SandboxId> = inner
                .entries
                .iter()
                .filter(|(_, e)| e.expired())
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                inner.entries.remove(id);
            }
            ids
        };
        for id in &expired {
            tracing::info!(sandbox = %id, "sandbox expired after its idle timeout; closing it");
            if let Err(e) = self.backend.close(id).await {
                tracing::debug!(sandbox = %id, "closing an expired sandbox: {e}");
            }
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
        let info = self.backend.create(SandboxSpec::default()).await?;
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
    }

    #[async_trait]
    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn create(&self, _spec: SandboxSpec) -> Result<SandboxInfo> {
            self.created.fetch_add(1, Ordering::SeqCst);
            let id = SandboxId::random();
            self.live.lock().unwrap().push(id.clone());
            Ok(SandboxInfo {
                id,
                created_at: SystemTime::now(),
                limits: Limits::default(),
                languages: vec![Language::Python],
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
            tokio::time::sleep(req.timeout.min(Duration::from_millis(50))).await;
            Ok(ExecOutcome {
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
            _: &str,
            _: Vec<u8>,
            _: bool,
        ) -> Result<FileWritten> {
            Err(Error::Unsupported {
                backend: "fake",
                operation: "files",
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
                memory_bytes: None,
                cpu_seconds: None,
                pids: None,
                kernels: vec![],
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
}
