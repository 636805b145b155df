//! [`E2bBackend`]: runbox's [`Backend`] over E2B-compatible cloud sandboxes.
//!
//! Code runs in the code interpreter's per-language contexts (state kept between runs);
//! commands, background processes and package installs run through envd; files move through
//! envd's `/files`. Each sandbox is remembered with the key that made it, and every control
//! plane call about it uses that key, so with `--auth passthrough` a caller's sandboxes
//! are only ever touched with the caller's own key.
//!
//! The provider's own timer is set past the sandbox's idle timeout and pushed on as the
//! sandbox is used: if this server dies, its sandboxes end by themselves soon after.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use runbox_core::capture::{Capture, Results};
use runbox_core::{
    Backend, CommandRequest, Error, ExecContext, ExecOutcome, ExecRequest, FileContent, FileEntry,
    FileKind, FileWritten, InstallRequest, Language, Limits, Listing, Network, OutputChunk,
    OutputStream, PackageManager, ProcessId, ProcessInfo, ProcessOutput, Result, SandboxId,
    SandboxInfo, SandboxSpec, SandboxState, SandboxStatus,
};
use tokio::sync::watch;

use crate::api::{Api, NewSandboxSpec, Remote};
use crate::config::E2bConfig;
use crate::envd::{ProcessStream, Sandboxes};
use crate::http::{Http, ProviderError, Retry, Surface};
use crate::interpreter::{Line, Lines, LinesError, language_name, parse_line};
use crate::proto::{EntryInfo, FileType, StartRequest};

/// Most bytes one read returns when the caller names no length.
const MAX_READ: u64 = 8 << 20;
/// Largest file `write_file` appends to (envd has no append: the file is rewritten).
const MAX_APPEND: u64 = 32 << 20;
/// Most entries one listing returns.
const MAX_LIST: usize = 10_000;
/// How deep a recursive listing goes.
const LIST_DEPTH: u32 = 64;
/// Unread output kept per background process (the oldest dropped beyond it).
const PROCESS_BUFFER: usize = 1 << 20;
/// How long past a command's timeout runbox waits for envd to end it before killing it.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// The longest life a provider is asked to give a sandbox.
const MAX_LIFETIME: Duration = Duration::from_secs(86_400);

/// The template user's home, where code runs and relative paths start.
const HOME: &str = "/home/user";
/// Where runbox's tools say files live, whatever the backend: made a link to [`HOME`].
const WORKSPACE: &str = "/workspace";
/// Links `/workspace` to the home, run as root when a sandbox is made.
const LINK_WORKSPACE: &str = "[ -e /workspace ] || ln -s /home/user /workspace";

/// What a run whose answer was cut off says.
const RUN_CUT: &str = "the code interpreter's answer ended before the run did: the sandbox may \
                       have run out of memory, been killed, or reached its time limit at the \
                       provider";

/// Languages the code interpreter runs.
const LANGUAGES: [Language; 4] = Language::ALL;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A background process and the output not read yet.
#[derive(Debug)]
struct Background {
    pid: u32,
    state: Mutex<BackgroundState>,
    /// Bumped whenever output arrives or the process ends.
    changed: watch::Sender<u64>,
    /// The task following its stream, set once it is spawned.
    reader: std::sync::OnceLock<tokio::task::AbortHandle>,
}

#[derive(Debug)]
struct BackgroundState {
    info: ProcessInfo,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped: u64,
}

impl BackgroundState {
    fn append(&mut self, stream: OutputStream, bytes: &[u8]) {
        let buf = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        buf.extend_from_slice(bytes);
        let total = self.stdout.len() + self.stderr.len();
        if total > PROCESS_BUFFER {
            let excess = total - PROCESS_BUFFER;
            let buf = if self.stdout.len() >= excess {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            let cut = excess.min(buf.len());
            buf.drain(..cut);
            self.dropped += cut as u64;
        }
    }
}

/// One of this backend's sandboxes.
#[derive(Debug)]
struct Live {
    remote: Mutex<Remote>,
    created_at: SystemTime,
    /// The output cap runbox applies, and the memory, CPUs and disk the provider reports.
    limits: Mutex<Limits>,
    /// How long the provider is asked to keep it, from each extension.
    lifetime: Mutex<Duration>,
    extended_at: Mutex<Instant>,
    paused: Mutex<bool>,
    kernels: Mutex<BTreeSet<Language>>,
    processes: Mutex<BTreeMap<ProcessId, Arc<Background>>>,
    next_process: Mutex<u64>,
}

impl Live {
    fn remote(&self) -> Remote {
        lock(&self.remote).clone()
    }

    fn process(&self, id: &ProcessId) -> Result<Arc<Background>> {
        lock(&self.processes)
            .get(id)
            .cloned()
            .ok_or_else(|| Error::ProcessNotFound { id: id.to_string() })
    }
}

/// The text of `buf`, emptied but for a character cut at its end while more may come.
fn take_text(buf: &mut Vec<u8>, more: bool) -> String {
    let keep = match std::str::from_utf8(buf) {
        Err(e) if more && e.error_len().is_none() => buf.len() - e.valid_up_to(),
        _ => 0,
    };
    let rest = buf.split_off(buf.len() - keep);
    let text = String::from_utf8_lossy(buf).into_owned();
    *buf = rest;
    text
}

/// E2B-compatible cloud sandboxes (E2B, Novita, self-hosted).
#[derive(Debug)]
pub struct E2bBackend {
    config: Arc<E2bConfig>,
    api: Api,
    sandboxes: Sandboxes,
    live: Mutex<HashMap<SandboxId, Arc<Live>>>,
}

/// Why the backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

impl E2bBackend {
    /// A backend for `config`; no request is made until the first sandbox is created.
    pub fn new(config: E2bConfig) -> std::result::Result<Self, SetupError> {
        config.validate().map_err(SetupError::Config)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("runbox/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let http = Http {
            client,
            provider: config.provider,
            max_retries: config.max_retries,
        };
        let config = Arc::new(config);
        Ok(Self {
            api: Api::new(http.clone(), &config),
            sandboxes: Sandboxes::new(http, Arc::clone(&config)),
            config,
            live: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &E2bConfig {
        &self.config
    }

    fn get(&self, id: &SandboxId) -> Result<Arc<Live>> {
        lock(&self.live)
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found(id))
    }

    /// The sandbox, refused while paused (its processes are stopped).
    fn running(&self, id: &SandboxId) -> Result<Arc<Live>> {
        let live = self.get(id)?;
        if *lock(&live.paused) {
            return Err(Error::InvalidRequest(format!(
                "sandbox {id} is paused; resume it first"
            )));
        }
        Ok(live)
    }

    /// Forgets a sandbox the provider says is gone, and passes the error on.
    fn gone(&self, id: &SandboxId, e: ProviderError) -> Error {
        let e = e.into_core(Some(id.as_str()));
        if matches!(e, Error::SandboxNotFound { .. }) {
            self.forget(id);
        }
        e
    }

    fn forget(&self, id: &SandboxId) -> Option<Arc<Live>> {
        let live = lock(&self.live).remove(id)?;
        for p in lock(&live.processes).values() {
            if let Some(r) = p.reader.get() {
                r.abort();
            }
        }
        Some(live)
    }

    /// Pushes the provider's timer on when a quarter of it has passed, so a sandbox in use
    /// is never ended by it: every use that keeps the registry from reaping it comes here.
    async fn extend(&self, id: &SandboxId, live: &Live) -> Result<()> {
        let lifetime = *lock(&live.lifetime);
        let due = lock(&live.extended_at).elapsed() > lifetime / 4;
        if !due {
            return Ok(());
        }
        *lock(&live.extended_at) = Instant::now();
        match self.api.set_timeout(&live.remote(), lifetime).await {
            Ok(()) => Ok(()),
            Err(e) if e.sandbox_gone() => Err(self.gone(id, e)),
            Err(e) => {
                tracing::warn!(sandbox = %id, "could not extend the sandbox's life at the provider: {e}");
                Ok(())
            }
        }
    }

    /// How long the provider is asked to keep a sandbox whose idle timeout is `idle`. Pushed
    /// on after a quarter of it (see `extend`), the provider's timer always runs at least
    /// 1.125 idle timeouts past the last use: the registry reaps first.
    fn lifetime(&self, idle: Duration) -> Duration {
        (idle + idle / 2 + self.config.lifetime_margin).min(MAX_LIFETIME)
    }

    /// Makes `/workspace` the home's other name, so that the paths runbox's tools and
    /// prompts speak of work in cloud sandboxes too. A template where that fails still
    /// works, with files in the home.
    async fn link_workspace(&self, id: &SandboxId, remote: &Remote) {
        let none = BTreeMap::new();
        let start = StartRequest::shell(LINK_WORKSPACE, &none, None);
        let linked = async {
            let mut stream = self
                .sandboxes
                .start(
                    remote,
                    &start,
                    Some(self.config.request_timeout),
                    Some("root"),
                )
                .await?;
            let mut code = None;
            while let Some(e) = stream.next().await? {
                if let Some(end) = e.end {
                    code = Some(end.exit_code);
                }
            }
            Ok::<_, ProviderError>(code)
        };
        let deadline = self.config.request_timeout + KILL_GRACE;
        match tokio::time::timeout(deadline, linked)
            .await
            .unwrap_or(Ok(None))
        {
            Ok(Some(0)) => {}
            Ok(code) => tracing::warn!(
                sandbox = %id,
                ?code,
                "could not link /workspace to {HOME}; files are in {HOME}"
            ),
            Err(e) => tracing::warn!(
                sandbox = %id,
                "could not link /workspace to {HOME} ({e}); files are in {HOME}"
            ),
        }
    }

    fn file_error(&self, id: &SandboxId, path: &str, e: ProviderError) -> Error {
        match e.code() {
            Some("not_found") if !e.sandbox_gone() => Error::FileNotFound {
                path: path.to_owned(),
            },
            Some("invalid_argument" | "already_exists" | "permission_denied") => {
                Error::InvalidRequest(format!("{path}: {e}"))
            }
            _ => self.gone(id, e),
        }
    }

    async fn stat(&self, id: &SandboxId, remote: &Remote, path: &str) -> Result<EntryInfo> {
        self.sandboxes
            .stat(remote, path)
            .await
            .map_err(|e| self.file_error(id, path, e))
    }

    /// Runs a command line to its end (or its timeout), as `command` and `install` do.
    async fn run_command(
        &self,
        id: &SandboxId,
        live: &Live,
        req: &CommandRequest,
        ctx: &ExecContext,
    ) -> Result<ExecOutcome> {
        self.extend(id, live).await?;
        let remote = live.remote();
        let started = Instant::now();
        let start = StartRequest::shell(&req.command, &req.env, req.cwd.as_deref());
        let mut outcome = ExecOutcome::default();
        let mut stdout = Capture::new(lock(&live.limits).output_bytes);
        let mut stderr = Capture::new(lock(&live.limits).output_bytes);
        let deadline = tokio::time::sleep(req.timeout + KILL_GRACE);
        tokio::pin!(deadline);
        let mut stream = tokio::select! {
            s = self.sandboxes.start(&remote, &start, Some(req.timeout), None) => {
                s.map_err(|e| self.gone(id, e))?
            }
            () = &mut deadline => return Ok(stopped(outcome, Stop::Timeout(req.timeout), started)),
            () = ctx.cancel.cancelled() => return Ok(stopped(outcome, Stop::Cancelled, started)),
        };
        let mut pid = None;
        let mut end = None;
        let stop = loop {
            let event = tokio::select! {
                e = stream.next() => e,
                () = &mut deadline => break Some(Stop::Timeout(req.timeout)),
                () = ctx.cancel.cancelled() => break Some(Stop::Cancelled),
            };
            match event {
                Ok(Some(e)) => {
                    if let Some(s) = e.start {
                        pid = Some(s.pid);
                    }
                    if let Some(d) = e.data {
                        capture(&mut stdout, OutputStream::Stdout, &d.stdout, ctx);
                        capture(&mut stderr, OutputStream::Stderr, &d.stderr, ctx);
                        capture(&mut stdout, OutputStream::Stdout, &d.pty, ctx);
                    }
                    if let Some(e) = e.end {
                        end = Some(e);
                    }
                }
                Ok(None) => break None,
                // envd ends the process when Connect-Timeout-Ms passes, and the call with it.
                Err(e) if e.code() == Some("deadline_exceeded") => {
                    break Some(Stop::Timeout(req.timeout));
                }
                Err(e) if end.is_some() => {
                    tracing::debug!(sandbox = %id, "command stream ended badly after the process: {e}");
                    break None;
                }
                Err(e) if e.sandbox_gone() => return Err(self.gone(id, e)),
                Err(e) => {
                    // The process may still run: end it, so that no command outlives its
                    // call unseen.
                    if let Some(pid) = pid {
                        let _ = self.sandboxes.signal(&remote, pid, true).await;
                    }
                    return Err(Error::sandbox_caused_by(
                        "the connection to the sandbox broke before the command ended (runbox \
                         stopped it, if it still ran)",
                        e,
                    ));
                }
            }
        };
        if stop.is_some()
            && end.is_none()
            && let Some(pid) = pid
            && let Err(e) = self.sandboxes.signal(&remote, pid, true).await
        {
            tracing::warn!(sandbox = %id, pid, "could not kill a command past its timeout: {e}");
        }
        drop(stream);
        finish_output(&mut outcome, stdout, stderr, ctx);
        outcome.exit_code = Some(match &end {
            Some(e) if e.exited => e.exit_code,
            Some(e) => signal_status(&e.status).unwrap_or(e.exit_code),
            None => 137,
        });
        Ok(match stop {
            Some(s) => stopped(outcome, s, started),
            None if end.is_none() => {
                return Err(Error::sandbox(
                    "the sandbox's daemon ended the command's stream without its exit status",
                ));
            }
            None => {
                outcome.duration = started.elapsed();
                outcome
            }
        })
    }
}

/// Why a run was stopped before its end.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Cancelled,
}

fn stopped(mut outcome: ExecOutcome, stop: Stop, started: Instant) -> ExecOutcome {
    match stop {
        Stop::Timeout(t) => {
            outcome.timed_out = true;
            outcome.notes.push(format!(
                "The run exceeded its timeout of {} s and was stopped.",
                t.as_secs_f64()
            ));
        }
        Stop::Cancelled => {
            outcome.cancelled = true;
            outcome
                .notes
                .push("The run was cancelled and was stopped.".into());
        }
    }
    outcome.duration = started.elapsed();
    outcome
}

/// 128 + the signal for Go's `signal: killed` and `signal: terminated`.
fn signal_status(status: &str) -> Option<i32> {
    match status.strip_prefix("signal: ")? {
        "killed" => Some(137),
        "terminated" => Some(143),
        "interrupt" => Some(130),
        _ => Some(128),
    }
}

/// Streams what the captures held back, and puts their text in `outcome`.
fn finish_output(
    outcome: &mut ExecOutcome,
    mut stdout: Capture,
    mut stderr: Capture,
    ctx: &ExecContext,
) {
    for (c, stream) in [
        (&mut stdout, OutputStream::Stdout),
        (&mut stderr, OutputStream::Stderr),
    ] {
        if let (Some(text), Some(sink)) = (c.flush_live(), &ctx.output) {
            sink(OutputChunk { stream, text });
        }
    }
    let (out, t1) = stdout.finish();
    let (err, t2) = stderr.finish();
    outcome.stdout = out;
    outcome.stderr = err;
    outcome.truncated = t1 || t2;
}

fn capture(c: &mut Capture, stream: OutputStream, bytes: &[u8], ctx: &ExecContext) {
    if bytes.is_empty() {
        return;
    }
    if let Some(text) = c.push(bytes)
        && let Some(sink) = &ctx.output
    {
        sink(OutputChunk { stream, text });
    }
}

fn capture_text(c: &mut Capture, stream: OutputStream, text: &str, ctx: &ExecContext) {
    capture(c, stream, text.as_bytes(), ctx);
}

/// `s` quoted for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A path as the tools show it: the home is `/workspace`, as on every backend.
fn shown(path: &str) -> String {
    match path.strip_prefix(HOME) {
        Some("") => WORKSPACE.to_owned(),
        Some(rest) if rest.starts_with('/') => format!("{WORKSPACE}{rest}"),
        _ => path.to_owned(),
    }
}

fn entry(e: EntryInfo) -> FileEntry {
    FileEntry {
        kind: match e.kind {
            FileType::File => FileKind::File,
            FileType::Directory => FileKind::Directory,
            FileType::Symlink => FileKind::Symlink,
            FileType::Unspecified if e.symlink_target.is_some() => FileKind::Symlink,
            FileType::Unspecified => FileKind::Other,
        },
        name: e.name,
        path: shown(&e.path),
        size: e.size,
        modified: e.modified_time.unwrap_or(SystemTime::UNIX_EPOCH),
    }
}

#[async_trait]
impl Backend for E2bBackend {
    fn name(&self) -> &'static str {
        "e2b"
    }

    async fn create(&self, spec: SandboxSpec) -> Result<SandboxInfo> {
        let key = spec
            .credential
            .clone()
            .or_else(|| self.config.api_key.clone())
            .ok_or_else(|| {
                Error::InvalidRequest(format!(
                    "no {} API key: the server has none of its own, and the request carried none",
                    self.config.provider.name()
                ))
            })?;
        let internet = match &spec.network {
            Network::None => false,
            Network::Allowlist(hosts) if hosts.is_empty() => true,
            Network::Allowlist(_) => {
                return Err(Error::Unsupported {
                    backend: self.name(),
                    operation: "limiting a sandbox's network to chosen hosts (ask for network \
                                \"allowlist\" with no hosts: the provider's sandbox then reaches \
                                the whole internet)",
                });
            }
        };
        let lifetime = self.lifetime(spec.idle_timeout.unwrap_or(self.config.default_lifetime));
        let remote = self
            .api
            .create(NewSandboxSpec {
                key,
                lifetime,
                metadata: &spec.metadata,
                env: &spec.env,
                internet,
            })
            .await
            .map_err(|e| e.into_core(None))?;
        let id = SandboxId::from(remote.id.clone());
        tracing::info!(sandbox = %id, template = %remote.template, "cloud sandbox created");
        let mut limits = spec.limits.unwrap_or_else(|| self.config.limits.clone());
        // Known at once, so that a shutdown ends it even if this call goes no further.
        let live = Arc::new(Live {
            remote: Mutex::new(remote.clone()),
            created_at: SystemTime::now(),
            limits: Mutex::new(limits.clone()),
            lifetime: Mutex::new(lifetime),
            extended_at: Mutex::new(Instant::now()),
            paused: Mutex::new(false),
            kernels: Mutex::new(BTreeSet::new()),
            processes: Mutex::new(BTreeMap::new()),
            next_process: Mutex::new(0),
        });
        lock(&self.live).insert(id.clone(), Arc::clone(&live));
        // The template decides memory, CPUs and disk: ask what they are while /workspace is
        // linked.
        let (detail, ()) = tokio::join!(self.api.get(&remote), self.link_workspace(&id, &remote));
        match detail {
            Ok(d) => {
                d.apply(&mut limits);
                *lock(&live.limits) = limits.clone();
            }
            Err(e) => tracing::debug!(sandbox = %id, "no details of the new sandbox: {e}"),
        }
        Ok(SandboxInfo {
            id,
            created_at: SystemTime::now(),
            limits,
            languages: LANGUAGES.to_vec(),
            allowed_hosts: if internet {
                vec!["*".to_owned()]
            } else {
                Vec::new()
            },
        })
    }

    async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome> {
        let live = self.running(id)?;
        self.extend(id, &live).await?;
        let remote = live.remote();
        let started = Instant::now();
        let body = serde_json::json!({
            "code": req.code,
            "context_id": null,
            "language": language_name(req.language),
            "env_vars": req.env,
        })
        .to_string();
        let mut outcome = ExecOutcome::default();
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        // Not retried once sent: the code may have started. Refusals before it (429, 503)
        // are.
        let send = self
            .sandboxes
            .http
            .send(Surface::Interpreter, Retry::Refused, || {
                self.sandboxes
                    .interpreter(&remote, Method::POST, "/execute")
                    .header("Content-Type", "application/json")
                    .body(body.clone())
            });
        let response = tokio::select! {
            r = send => r.map_err(|e| self.gone(id, e))?,
            () = &mut deadline => return Ok(stopped(outcome, Stop::Timeout(req.timeout), started)),
            () = ctx.cancel.cancelled() => return Ok(stopped(outcome, Stop::Cancelled, started)),
        };
        lock(&live.kernels).insert(req.language);
        let mut lines = Lines::new(response);
        let mut stdout = Capture::new(lock(&live.limits).output_bytes);
        let mut stderr = Capture::new(lock(&live.limits).output_bytes);
        let mut results = Results::new();
        let mut ended = false;
        // Dropping the stream closes the connection, which interrupts the execution.
        let stop = loop {
            let line = tokio::select! {
                l = lines.next() => l,
                () = &mut deadline => break Some(Stop::Timeout(req.timeout)),
                () = ctx.cancel.cancelled() => break Some(Stop::Cancelled),
            };
            let line = match line {
                Ok(Some(l)) => l,
                Ok(None) => break None,
                Err(LinesError::TooLong) => {
                    return Err(Error::sandbox(
                        "the code interpreter sent a line longer than runbox accepts (64 MiB)",
                    ));
                }
                Err(LinesError::Transport(e)) => {
                    return Err(Error::sandbox_caused_by(RUN_CUT, e));
                }
            };
            match parse_line(&line) {
                Ok(Line::Stdout(t)) => capture_text(&mut stdout, OutputStream::Stdout, &t, &ctx),
                Ok(Line::Stderr(t)) => capture_text(&mut stderr, OutputStream::Stderr, &t, &ctx),
                Ok(Line::Result(r)) => results.push(r),
                Ok(Line::Error(e)) => outcome.error = Some(e),
                Ok(Line::End) => {
                    ended = true;
                    break None;
                }
                Ok(Line::Other) => {}
                Err(m) => {
                    return Err(Error::sandbox(format!("the code interpreter sent {m}")));
                }
            }
        };
        drop(lines);
        let (kept, dropped) = results.finish();
        outcome.results = kept;
        outcome.notes.extend(dropped);
        finish_output(&mut outcome, stdout, stderr, &ctx);
        if let Some(stop) = stop {
            return Ok(stopped(outcome, stop, started));
        }
        if !ended {
            return Err(Error::sandbox(RUN_CUT));
        }
        outcome.duration = started.elapsed();
        Ok(outcome)
    }

    async fn command(
        &self,
        id: &SandboxId,
        req: CommandRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome> {
        let live = self.running(id)?;
        self.run_command(id, &live, &req, &ctx).await
    }

    async fn list_files(&self, id: &SandboxId, path: &str, recursive: bool) -> Result<Listing> {
        let live = self.running(id)?;
        self.extend(id, &live).await?;
        let remote = live.remote();
        let depth = if recursive { LIST_DEPTH } else { 1 };
        let entries = self
            .sandboxes
            .list_dir(&remote, path, depth)
            .await
            .map_err(|e| self.file_error(id, path, e))?;
        let mut entries: Vec<FileEntry> = entries.into_iter().map(entry).collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let truncated = entries.len() > MAX_LIST;
        entries.truncate(MAX_LIST);
        Ok(Listing { entries, truncated })
    }

    async fn read_file(
        &self,
        id: &SandboxId,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileContent> {
        let live = self.running(id)?;
        self.extend(id, &live).await?;
        let remote = live.remote();
        let info = self.stat(id, &remote, path).await?;
        if info.kind == FileType::Directory {
            return Err(Error::InvalidRequest(format!(
                "{path} is a directory; list_files lists it"
            )));
        }
        let want = length
            .unwrap_or(MAX_READ)
            .min(info.size.saturating_sub(offset));
        let mut data = Vec::with_capacity(usize::try_from(want).unwrap_or(0).min(1 << 20));
        if want > 0 {
            let response = self
                .sandboxes
                .download(&remote, path)
                .await
                .map_err(|e| self.file_error(id, path, e))?;
            let mut body = response.bytes_stream();
            let mut skip = offset;
            while let Some(chunk) = body.next().await {
                let chunk = chunk
                    .map_err(|e| self.gone(id, self.sandboxes.http.transport(Surface::Envd, e)))?;
                let mut chunk: &[u8] = &chunk;
                let s = usize::try_from(skip).unwrap_or(usize::MAX).min(chunk.len());
                chunk = &chunk[s..];
                skip -= s as u64;
                let room = usize::try_from(want - data.len() as u64).unwrap_or(usize::MAX);
                data.extend_from_slice(&chunk[..room.min(chunk.len())]);
                if data.len() as u64 >= want {
                    break;
                }
            }
        }
        Ok(FileContent {
            path: if info.path.is_empty() {
                path.to_owned()
            } else {
                shown(&info.path)
            },
            data,
            offset,
            size: info.size,
        })
    }

    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: Vec<u8>,
        append: bool,
    ) -> Result<FileWritten> {
        let live = self.running(id)?;
        self.extend(id, &live).await?;
        let remote = live.remote();
        let data = if append {
            // envd cannot append: the file comes down and goes up again whole, so only up
            // to a size.
            match self.sandboxes.stat(&remote, path).await {
                Ok(e) if e.size + data.len() as u64 > MAX_APPEND => {
                    return Err(Error::InvalidRequest(format!(
                        "{path} would grow past {} MiB, the most runbox appends to on this \
                         backend; append with run_command (cat >> FILE) instead",
                        MAX_APPEND >> 20
                    )));
                }
                _ => {}
            }
            let mut old = match self.sandboxes.download(&remote, path).await {
                Ok(r) => self
                    .sandboxes
                    .http
                    .body(Surface::Envd, r, MAX_APPEND as usize)
                    .await
                    .map_err(|e| self.gone(id, e))?
                    .to_vec(),
                Err(e) if e.code() == Some("not_found") && !e.sandbox_gone() => Vec::new(),
                Err(e) => return Err(self.file_error(id, path, e)),
            };
            old.extend_from_slice(&data);
            old
        } else {
            data
        };
        let size = data.len() as u64;
        self.sandboxes
            .upload(&remote, path, Bytes::from(data))
            .await
            .map_err(|e| self.file_error(id, path, e))?;
        // The daemon resolves a relative path against the user's home; ask it where.
        let written = if path.starts_with('/') {
            shown(path)
        } else {
            format!("{WORKSPACE}/{path}")
        };
        Ok(FileWritten {
            path: written,
            size,
        })
    }

    async fn workspace_snapshot(&self, _id: &SandboxId) -> Result<Listing> {
        // Two listings of a remote tree per run cost more than the list of changed files
        // is worth; the registry runs without it.
        Err(self.unsupported("workspace snapshots"))
    }

    async fn start_process(&self, id: &SandboxId, req: CommandRequest) -> Result<ProcessInfo> {
        let live = self.running(id)?;
        self.extend(id, &live).await?;
        let remote = live.remote();
        let start = StartRequest::shell(&req.command, &req.env, req.cwd.as_deref());
        let mut stream = self
            .sandboxes
            .start(&remote, &start, None, None)
            .await
            .map_err(|e| self.gone(id, e))?;
        let pid = loop {
            match stream.next().await {
                Ok(Some(e)) => {
                    if let Some(s) = e.start {
                        break s.pid;
                    }
                }
                Ok(None) => {
                    return Err(Error::sandbox(
                        "the sandbox's daemon ended the stream before the process started",
                    ));
                }
                Err(e) => return Err(self.gone(id, e)),
            }
        };
        let n = {
            let mut n = lock(&live.next_process);
            *n += 1;
            *n
        };
        let info = ProcessInfo {
            id: ProcessId::nth(n),
            command: req.command.clone(),
            started_at: SystemTime::now(),
            exit_code: None,
        };
        let (changed, _) = watch::channel(0u64);
        let state = BackgroundState {
            info: info.clone(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            dropped: 0,
        };
        let background = Arc::new(Background {
            pid,
            state: Mutex::new(state),
            changed,
            reader: std::sync::OnceLock::new(),
        });
        // The reader holds only a weak reference: a forgotten process's reader ends.
        let task = tokio::spawn(follow(
            stream,
            Arc::downgrade(&background),
            self.sandboxes.clone(),
            remote,
            pid,
        ));
        let _ = background.reader.set(task.abort_handle());
        lock(&live.processes).insert(info.id.clone(), background);
        Ok(info)
    }

    async fn read_process(
        &self,
        id: &SandboxId,
        process: &ProcessId,
        wait: Duration,
    ) -> Result<ProcessOutput> {
        let live = self.get(id)?;
        let p = live.process(process)?;
        let mut rx = p.changed.subscribe();
        let has_news = |p: &Background| {
            let s = lock(&p.state);
            !s.stdout.is_empty() || !s.stderr.is_empty() || !s.info.running()
        };
        if !has_news(&p) {
            let _ = tokio::time::timeout(wait, async {
                while rx.changed().await.is_ok() {
                    if has_news(&p) {
                        break;
                    }
                }
            })
            .await;
        }
        let mut s = lock(&p.state);
        let more = s.info.running();
        let out = ProcessOutput {
            info: s.info.clone(),
            stdout: take_text(&mut s.stdout, more),
            stderr: take_text(&mut s.stderr, more),
            dropped_bytes: std::mem::take(&mut s.dropped),
        };
        Ok(out)
    }

    async fn kill_process(&self, id: &SandboxId, process: &ProcessId) -> Result<ProcessInfo> {
        let live = self.get(id)?;
        let p = live.process(process)?;
        if !lock(&p.state).info.running() {
            return Ok(lock(&p.state).info.clone());
        }
        let mut rx = p.changed.subscribe();
        self.sandboxes
            .signal(&live.remote(), p.pid, true)
            .await
            .map_err(|e| self.gone(id, e))?;
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if !lock(&p.state).info.running() {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let mut s = lock(&p.state);
        if ended.is_err() || s.info.running() {
            // Killed, though its stream never said so.
            if let Some(r) = p.reader.get() {
                r.abort();
            }
            s.info.exit_code = Some(137);
        }
        Ok(s.info.clone())
    }

    async fn install(
        &self,
        id: &SandboxId,
        req: InstallRequest,
        ctx: ExecContext,
    ) -> Result<ExecOutcome> {
        let live = self.running(id)?;
        let packages: Vec<String> = req.packages.iter().map(|p| quote(p)).collect();
        let command = match req.manager {
            PackageManager::Pip => format!(
                "python3 -m pip install --disable-pip-version-check --no-input -- {}",
                packages.join(" ")
            ),
            PackageManager::Npm => format!(
                "npm install --no-audit --no-fund --no-progress -- {}",
                packages.join(" ")
            ),
        };
        self.run_command(id, &live, &CommandRequest::new(command, req.timeout), &ctx)
            .await
    }

    async fn idle_timeout_changed(&self, id: &SandboxId, idle: Duration) -> Result<()> {
        let live = self.get(id)?;
        let lifetime = self.lifetime(idle);
        *lock(&live.lifetime) = lifetime;
        if *lock(&live.paused) {
            // A paused sandbox has no timer at the provider; resuming sets it.
            return Ok(());
        }
        *lock(&live.extended_at) = Instant::now();
        match self.api.set_timeout(&live.remote(), lifetime).await {
            Ok(()) => Ok(()),
            Err(e) if e.sandbox_gone() => Err(self.gone(id, e)),
            Err(e) => {
                // Later uses push the timer on with the new life.
                tracing::warn!(sandbox = %id, "could not move the sandbox's timer at the provider: {e}");
                Ok(())
            }
        }
    }

    async fn set_paused(&self, id: &SandboxId, paused: bool) -> Result<()> {
        let live = self.get(id)?;
        let remote = live.remote();
        if paused {
            self.api
                .pause(&remote)
                .await
                .map_err(|e| self.gone(id, e))?;
        } else {
            let lifetime = *lock(&live.lifetime);
            let updated = self
                .api
                .connect(&remote, lifetime)
                .await
                .map_err(|e| self.gone(id, e))?;
            *lock(&live.remote) = updated;
            *lock(&live.extended_at) = Instant::now();
        }
        *lock(&live.paused) = paused;
        Ok(())
    }

    async fn status(&self, id: &SandboxId) -> Result<SandboxStatus> {
        let live = self.get(id)?;
        let detail = self
            .api
            .get(&live.remote())
            .await
            .map_err(|e| self.gone(id, e))?;
        let state = match detail.state.as_deref() {
            Some("paused") => SandboxState::Paused,
            _ => SandboxState::Running,
        };
        let mut limits = lock(&live.limits).clone();
        detail.apply(&mut limits);
        let processes = lock(&live.processes)
            .values()
            .map(|p| lock(&p.state).info.clone())
            .collect();
        Ok(SandboxStatus {
            id: id.clone(),
            state,
            created_at: live.created_at,
            limits,
            enforced: detail.enforced(),
            memory_bytes: None,
            cpu_seconds: None,
            pids: None,
            kernels: lock(&live.kernels).iter().copied().collect(),
            processes,
        })
    }

    async fn close(&self, id: &SandboxId) -> Result<()> {
        let live = self.forget(id).ok_or_else(|| Error::not_found(id))?;
        match self.api.kill(&live.remote()).await {
            Ok(true) => {
                tracing::info!(sandbox = %id, "cloud sandbox killed");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(e.into_core(Some(id.as_str()))),
        }
    }

    async fn shutdown(&self) {
        let all: Vec<SandboxId> = lock(&self.live).keys().cloned().collect();
        let closes = all.iter().map(|id| async move {
            if let Err(e) = self.close(id).await {
                tracing::warn!(sandbox = %id, "could not kill the cloud sandbox: {e}");
            }
        });
        futures_util::future::join_all(closes).await;
    }
}

/// Follows a background process's stream until it ends, re-attaching once if the stream
/// breaks while the process runs.
async fn follow(
    mut stream: ProcessStream,
    background: std::sync::Weak<Background>,
    sandboxes: Sandboxes,
    remote: Remote,
    pid: u32,
) {
    let mut reattached = false;
    loop {
        let event = stream.next().await;
        let Some(p) = background.upgrade() else {
            return;
        };
        match event {
            Ok(Some(e)) => {
                let mut s = lock(&p.state);
                if let Some(d) = e.data {
                    s.append(OutputStream::Stdout, &d.stdout);
                    s.append(OutputStream::Stdout, &d.pty);
                    s.append(OutputStream::Stderr, &d.stderr);
                }
                if let Some(end) = e.end {
                    s.info.exit_code = Some(if end.exited {
                        end.exit_code
                    } else {
                        signal_status(&end.status).unwrap_or(end.exit_code)
                    });
                }
                drop(s);
                p.changed.send_modify(|n| *n += 1);
            }
            Ok(None) => {
                let mut s = lock(&p.state);
                if s.info.running() {
                    s.info.exit_code = Some(-1);
                }
                drop(s);
                p.changed.send_modify(|n| *n += 1);
                return;
            }
            Err(e) => {
                if !reattached && lock(&p.state).info.running() {
                    reattached = true;
                    tracing::debug!(pid, "background process stream broke ({e}); re-attaching");
                    match sandboxes.attach(&remote, pid).await {
                        Ok(s) => {
                            stream = s;
                            continue;
                        }
                        Err(e) => tracing::debug!(pid, "re-attaching failed: {e}"),
                    }
                }
                let mut s = lock(&p.state);
                if s.info.running() {
                    s.info.exit_code = Some(-1);
                    let note = format!("\n[runbox lost this process's output stream: {e}]\n");
                    s.append(OutputStream::Stderr, note.as_bytes());
                }
                drop(s);
                p.changed.send_modify(|n| *n += 1);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_shown_as_the_workspace() {
        assert_eq!(shown("/home/user"), "/workspace");
        assert_eq!(shown("/home/user/a/b.txt"), "/workspace/a/b.txt");
        assert_eq!(shown("/home/username"), "/home/username");
        assert_eq!(shown("/tmp/x"), "/tmp/x");
    }

    #[test]
    fn a_character_cut_between_reads_waits_for_its_end() {
        let euro = "€".as_bytes();
        let mut buf = [b"a".as_slice(), &euro[..2]].concat();
        assert_eq!(take_text(&mut buf, true), "a");
        assert_eq!(buf, &euro[..2]);
        buf.extend_from_slice(&euro[2..]);
        assert_eq!(take_text(&mut buf, true), "€");
        assert!(buf.is_empty());
        // Once the process has ended nothing more comes: what is left is shown.
        let mut buf = euro[..1].to_vec();
        assert_eq!(take_text(&mut buf, false), "\u{FFFD}");
        let mut bad = b"x\xffy".to_vec();
        assert_eq!(take_text(&mut bad, true), "x\u{FFFD}y");
    }

    #[test]
    fn package_names_are_quoted_for_the_shell() {
        assert_eq!(quote("numpy"), "'numpy'");
        assert_eq!(quote("a'; rm -rf / #"), r"'a'\''; rm -rf / #'");
    }

    #[test]
    fn killed_processes_report_128_plus_the_signal() {
        assert_eq!(signal_status("signal: killed"), Some(137));
        assert_eq!(signal_status("signal: terminated"), Some(143));
        assert_eq!(signal_status("exit status 3"), None);
    }

    #[test]
    fn background_output_stays_within_its_buffer() {
        let mut s = BackgroundState {
            info: ProcessInfo {
                id: ProcessId::nth(1),
                command: "yes".into(),
                started_at: SystemTime::now(),
                exit_code: None,
            },
            stdout: Vec::new(),
            stderr: Vec::new(),
            dropped: 0,
        };
        let chunk = vec![b'y'; 64 << 10];
        for _ in 0..40 {
            s.append(OutputStream::Stdout, &chunk);
        }
        s.append(OutputStream::Stderr, b"err");
        assert!(s.stdout.len() + s.stderr.len() <= PROCESS_BUFFER);
        assert_eq!(s.stderr, b"err");
        assert_eq!(s.dropped, 40 * (64 << 10) + 3 - PROCESS_BUFFER as u64);
    }
}
