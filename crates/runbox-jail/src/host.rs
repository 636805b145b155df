//! The host side of a sandbox: start one (stage one and its init, placed in a cgroup, under
//! a leased uid), talk to its init, and end it leaving nothing behind. A host starting up
//! first removes what crashed servers left behind (see [`crate::recovery`]).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, MsgFlags, Shutdown, SockFlag, SockType, shutdown, socketpair,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::cgroup::{CgroupUnavailable, Cgroups, SandboxCgroup, Usage};
use crate::error::JailError;
use crate::init::INIT_ARG;
use crate::policy::{File, Identity, JailPolicy, JailSpec};
use crate::proto::{self, ExitStatus, FromInit, ProtoError, Reply, Request, SpawnRequest, ToInit};
use crate::recovery::{Owner, RECORDS, Recovered};
use crate::report::LayerReport;
use crate::uid::{DEFAULT_UID_BASE, DEFAULT_UID_COUNT, UidLease, UidPool};

/// The uid (and gid) sandbox processes have inside a user namespace (rootless mode).
pub const USERNS_UID: u32 = 1000;

/// Whether sandboxes get cgroups: without them nothing caps a sandbox's memory as a whole
/// (only each process's, with rlimits) nor its CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// Use cgroups; refuse to start without them ([`JailError::NoCgroups`]).
    #[default]
    Required,
    /// Use cgroups when this host offers them, rlimits alone otherwise (`runbox doctor`,
    /// tests on hosts without a delegated subtree).
    IfAvailable,
    /// Never use cgroups: the operator chose per-process limits (`--no-cgroups`).
    Disabled,
}

/// Host-wide settings of the jail.
#[derive(Debug, Clone)]
pub struct JailHostConfig {
    /// The runbox binary to re-execute as the sandbox's init. `/proc/self/exe` keeps it the
    /// very binary that is running, even if the file on disk is replaced.
    pub init_exe: PathBuf,
    /// Where runbox keeps its runtime state (uid leases, the root mount point, the records of
    /// live servers for crash recovery).
    pub state_dir: PathBuf,
    /// Parent cgroup, relative to each hierarchy's root, instead of the server's own group
    /// (for a subtree delegated to a non-root user).
    pub cgroup_parent: Option<PathBuf>,
    /// Whether sandboxes must, may or must not get cgroups.
    pub cgroups: CgroupMode,
    /// First host uid handed to sandboxes when running as root.
    pub uid_base: u32,
    /// How many uids from `uid_base` may be used.
    pub uid_count: u32,
    /// How long building a sandbox may take before it is abandoned.
    pub setup_timeout: Duration,
}

impl Default for JailHostConfig {
    fn default() -> Self {
        Self {
            init_exe: PathBuf::from("/proc/self/exe"),
            state_dir: Self::default_state_dir(),
            cgroup_parent: None,
            cgroups: CgroupMode::default(),
            uid_base: DEFAULT_UID_BASE,
            uid_count: DEFAULT_UID_COUNT,
            setup_timeout: Duration::from_secs(10),
        }
    }
}

impl JailHostConfig {
    /// `/run/runbox` for root; `$XDG_RUNTIME_DIR/runbox` or `/tmp/runbox-<uid>` otherwise.
    /// The last one is only used if it is a directory of this user's own (another user could
    /// make it first): [`JailHost::new`] refuses it otherwise, saying what to do.
    pub fn default_state_dir() -> PathBuf {
        let uid = nix::unistd::geteuid();
        if uid.is_root() {
            return PathBuf::from("/run/runbox");
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if Path::new(&d).is_dir() => Path::new(&d).join("runbox"),
            _ => PathBuf::from(format!("/tmp/runbox-{uid}")),
        }
    }
}

/// Starts sandboxes on this host.
#[derive(Debug)]
pub struct JailHost {
    config: JailHostConfig,
    cgroups: Result<Cgroups, CgroupUnavailable>,
    uids: Option<UidPool>,
    root_mountpoint: PathBuf,
    owner: Arc<Owner>,
    recovered: Recovered,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, as Go's runtime does:
/// every sandbox holds a few descriptors in the server (control socket, pipes, exported
/// directories), and the common soft default of 1024 runs out near a hundred sandboxes.
/// Sandboxes set their own limit, so nothing inside them changes.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(soft, hard, error = %e, "could not raise the open-file limit");
            } else {
                tracing::debug!(from = soft, to = hard, "raised the open-file limit");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

impl JailHost {
    /// Prepares the state directory, the uid pool (as root) and the cgroup parent, registers
    /// as the owner of the sandboxes it will start, and removes what servers that died
    /// without closing their sandboxes left behind (logged; see [`JailHost::recovered`]).
    /// Blocks while leftover processes die (at most a few seconds, usually nothing to do).
    pub fn new(config: JailHostConfig) -> Result<Self, JailError> {
        let state_err = |source| JailError::StateDir {
            path: config.state_dir.clone(),
            source,
        };
        crate::state::prepare(&config.state_dir)?;
        let root_mountpoint = config.state_dir.join("root");
        std::fs::create_dir_all(&root_mountpoint).map_err(state_err)?;
        let uids = if nix::unistd::geteuid().is_root() {
            Some(
                UidPool::new(
                    config.state_dir.join("uids"),
                    config.uid_base,
                    config.uid_count,
                )
                .map_err(state_err)?,
            )
        } else {
            None
        };
        let cgroups = match config.cgroups {
            CgroupMode::Disabled => Err(CgroupUnavailable("--no-cgroups was given".into())),
            CgroupMode::Required | CgroupMode::IfAvailable => {
                Cgroups::detect(config.cgroup_parent.as_deref())
            }
        };
        if let (CgroupMode::Required, Err(e)) = (config.cgroups, &cgroups) {
            return Err(JailError::NoCgroups(e.clone()));
        }
        // Registered before looking at others, so a server starting meanwhile sees this one
        // alive; and before the first sandbox, whose group carries the owner's token.
        let records = config.state_dir.join(RECORDS);
        let parents = cgroups
            .as_ref()
            .map(Cgroups::parent_dirs)
            .unwrap_or_default();
        let owner = Arc::new(Owner::register(&records, parents).map_err(state_err)?);
        let recovered = crate::recovery::recover(&records, &owner);
        // After recovery: a dead server's paused sandboxes ran as the uids of those files.
        if let Some(pool) = &uids {
            let removed = pool.sweep();
            if removed > 0 {
                tracing::debug!(removed, "deleted uid lease files no sandbox holds");
            }
        }
        raise_open_file_limit();
        Ok(Self {
            config,
            cgroups,
            uids,
            root_mountpoint,
            owner,
            recovered,
        })
    }

    /// What this host found at start of dead servers' leftovers and removed.
    pub fn recovered(&self) -> &Recovered {
        &self.recovered
    }

    /// The cgroup setup, or why there is none.
    pub fn cgroups(&self) -> Result<&Cgroups, &CgroupUnavailable> {
        self.cgroups.as_ref()
    }

    /// Whether sandboxes use a user namespace (the server is not root).
    pub fn rootless(&self) -> bool {
        self.uids.is_none()
    }

    /// The configuration.
    pub fn config(&self) -> &JailHostConfig {
        &self.config
    }

    /// Starts a sandbox named `name` (in logs; its cgroup is named by a random token, so no
    /// other user of the host learns the name) and returns once its init reports every layer
    /// applied.
    pub async fn start(&self, name: &str, mut spec: JailSpec) -> Result<Jail, JailError> {
        let lease = match &self.uids {
            Some(pool) => Some(pool.lease().map_err(JailError::Uid)?),
            None => None,
        };
        let identity = match &lease {
            Some(l) => Identity::HostUid {
                uid: l.uid(),
                gid: l.uid(),
            },
            None => Identity::UserNamespace {
                uid: USERNS_UID,
                gid: USERNS_UID,
            },
        };
        spec.files.extend(identity_files(&identity));
        // Named with a token of its own, never the sandbox's name: other users of the host
        // can list cgroup directories.
        let cgroup = match &self.cgroups {
            Ok(c) => Some(
                c.create(&self.owner.group_name(&opaque_token()?), spec.resources)
                    .map_err(JailError::Cgroup)?,
            ),
            Err(_) => None,
        };
        let policy = JailPolicy {
            identity: identity.clone(),
            root_mountpoint: self.root_mountpoint.clone(),
            spec,
        };
        let mut guard = StartGuard {
            cgroup,
            owner: Arc::clone(&self.owner),
        };
        let (child, shared, report, init_pid, exported) =
            self.launch(&policy, guard.cgroup.as_ref()).await?;
        let (mut dirs, mut listeners) = (Vec::new(), Vec::new());
        for e in exported {
            match e {
                Exported::Dir(d) => dirs.push(d),
                Exported::Listener(l) => listeners.push(l),
            }
        }
        let reader = tokio::spawn(read_loop(Arc::clone(&shared)));
        Ok(Jail {
            name: name.to_owned(),
            shared,
            reader,
            child: tokio::sync::Mutex::new(Some(child)),
            cgroup: guard.cgroup.take(),
            owner: Arc::clone(&self.owner),
            _uid: lease,
            identity,
            report,
            init_pid,
            dirs,
            listeners: Mutex::new(listeners),
        })
    }

    async fn launch(
        &self,
        policy: &JailPolicy,
        cgroup: Option<&SandboxCgroup>,
    ) -> Result<
        (
            tokio::process::Child,
            Arc<Shared>,
            LayerReport,
            u32,
            Vec<Exported>,
        ),
        JailError,
    > {
        let (host_end, init_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| JailError::Control(ProtoError::Io(e)))?;
        // The init's end must block: the init is a plain synchronous loop.
        set_blocking(init_end.as_fd()).map_err(|e| JailError::Control(ProtoError::Io(e)))?;

        let mut cmd = tokio::process::Command::new(&self.config.init_exe);
        // A neutral argv[0]: the sandbox can read its init's command line, and the host path
        // of the runbox binary is none of its business.
        cmd.arg0("runbox")
            .arg(INIT_ARG)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        crate::sys::stage1_pre_exec(&mut cmd, init_end.as_raw_fd());
        let mut child = cmd.spawn().map_err(|source| JailError::SpawnInit {
            exe: self.config.init_exe.clone(),
            source,
        })?;
        drop(init_end);
        let stage_one = child.id().ok_or(JailError::Ended)?;

        let fd = crate::sys::async_fd(host_end)
            .map_err(|e| JailError::Control(ProtoError::Io(io_to_nix(&e))))?;
        let shared = Arc::new(Shared::new(fd));
        shared
            .send(&ToInit::Policy(Box::new(policy.clone())), &[])
            .await?;
        let deadline = tokio::time::Instant::now() + self.config.setup_timeout;
        let mut init_pid = None;
        loop {
            let (msg, fds) = match tokio::time::timeout_at(deadline, shared.recv_with_fds()).await {
                Err(_) => return Err(JailError::SetupTimeout(self.config.setup_timeout)),
                Ok(Err(_)) => return Err(self.init_died(&mut child).await),
                Ok(Ok(msg)) => msg,
            };
            match msg {
                FromInit::Forked { pid: init } => {
                    init_pid = Some(init.unsigned_abs());
                    if let Some(cg) = cgroup {
                        // Off the async threads: a cgroup move may wait for an RCU grace period.
                        let cg = cg.clone();
                        let moved = tokio::task::spawn_blocking(move || {
                            cg.add(stage_one)?;
                            cg.add(init.unsigned_abs())
                        })
                        .await
                        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                        if let Err(e) = moved {
                            // A process that vanished may have said why first.
                            if let Ok(Ok(FromInit::SetupFailed { step, error })) =
                                tokio::time::timeout(Duration::from_millis(200), shared.recv_one())
                                    .await
                            {
                                return Err(JailError::Setup { step, error });
                            }
                            return Err(JailError::Cgroup(e));
                        }
                    }
                    shared.send(&ToInit::Go, &[]).await?;
                }
                FromInit::Ready(report) => {
                    let init = init_pid.ok_or_else(|| JailError::Setup {
                        step: "handshake".into(),
                        error: "ready before stage one reported the init".into(),
                    })?;
                    let wanted = policy.spec.export_dirs.len() + policy.spec.listen_tcp.len();
                    if fds.len() != wanted {
                        return Err(JailError::Setup {
                            step: "handshake".into(),
                            error: format!(
                                "{} descriptors exported, {wanted} asked for",
                                fds.len()
                            ),
                        });
                    }
                    let mut fds = fds.into_iter();
                    let mut exported: Vec<Exported> = Vec::with_capacity(wanted);
                    for dir in &policy.spec.export_dirs {
                        if let Some(fd) = fds.next() {
                            exported.push(Exported::Dir((dir.clone(), fd)));
                        }
                    }
                    for &port in &policy.spec.listen_tcp {
                        if let Some(fd) = fds.next() {
                            exported.push(Exported::Listener((port, fd)));
                        }
                    }
                    let dirs = exported;
                    return Ok((child, shared, report, init, dirs));
                }
                FromInit::SetupFailed { step, error } => {
                    let _ = child.wait().await;
                    return Err(JailError::Setup { step, error });
                }
                other => {
                    return Err(JailError::Setup {
                        step: "handshake".into(),
                        error: format!("unexpected message {other:?}"),
                    });
                }
            }
        }
    }

    async fn init_died(&self, child: &mut tokio::process::Child) -> JailError {
        let status = child
            .wait()
            .await
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        JailError::InitDied {
            exe: self.config.init_exe.clone(),
            status,
        }
    }
}

/// Removes a half-made sandbox's cgroup if starting fails.
struct StartGuard {
    cgroup: Option<SandboxCgroup>,
    owner: Arc<Owner>,
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(cg) = self.cgroup.take() {
            spawn_cleanup(cg, Arc::clone(&self.owner));
        }
    }
}

/// Removes a group in the background. The owner's record lives until then, so a crash
/// meanwhile leaves the group to the next start's recovery.
fn spawn_cleanup(cg: SandboxCgroup, owner: Arc<Owner>) {
    cg.thaw_now();
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            if let Err(e) = cg.remove(Duration::from_secs(5)).await {
                tracing::warn!("could not remove sandbox cgroup: {e}");
            }
            drop(owner);
        });
    }
}

/// 16 random hex digits.
fn opaque_token() -> Result<String, JailError> {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).map_err(|e| JailError::Cgroup(io::Error::other(e.to_string())))?;
    Ok(r.iter().map(|b| format!("{b:02x}")).collect())
}

fn set_blocking(fd: BorrowedFd<'_>) -> nix::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK)).map(drop)
}

fn io_to_nix(e: &io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn identity_files(identity: &Identity) -> Vec<File> {
    let (uid, gid) = (identity.uid(), identity.gid());
    vec![
        File {
            path: "/etc/passwd".into(),
            contents: format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 sandbox:x:{uid}:{gid}:runbox sandbox:/workspace:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            mode: 0o644,
        },
        File {
            path: "/etc/group".into(),
            contents: format!("root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n"),
            mode: 0o644,
        },
    ]
}

type ReplyResult = Result<(Reply, Option<oneshot::Receiver<ExitStatus>>), JailError>;

#[derive(Default)]
struct Waiters {
    ended: bool,
    replies: HashMap<u64, oneshot::Sender<ReplyResult>>,
    exits: HashMap<i32, oneshot::Sender<ExitStatus>>,
}

/// The host's end of a control socket, shared by callers and the reader task.
struct Shared {
    fd: AsyncFd<OwnedFd>,
    next_id: AtomicU64,
    waiters: Mutex<Waiters>,
    ended: watch::Sender<bool>,
}

fn proto_to_io(e: ProtoError) -> io::Error {
    match e {
        ProtoError::Io(errno) => io::Error::from(errno),
        ProtoError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, "closed"),
        ProtoError::Malformed(m) => io::Error::new(io::ErrorKind::InvalidData, m),
    }
}

impl Shared {
    fn new(fd: AsyncFd<OwnedFd>) -> Self {
        Self {
            fd,
            next_id: AtomicU64::new(1),
            waiters: Mutex::new(Waiters::default()),
            ended: watch::channel(false).0,
        }
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn send(&self, msg: &ToInit, fds: &[BorrowedFd<'_>]) -> Result<(), JailError> {
        self.fd
            .async_io(Interest::WRITABLE, |fd| {
                proto::send(fd.as_fd(), msg, fds, MsgFlags::MSG_DONTWAIT).map_err(proto_to_io)
            })
            .await
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN) => JailError::Ended,
                _ => JailError::Control(ProtoError::Io(io_to_nix(&e))),
            })
    }

    async fn recv_one(&self) -> io::Result<FromInit> {
        self.recv_with_fds().await.map(|(m, _)| m)
    }

    async fn recv_with_fds(&self) -> io::Result<(FromInit, Vec<OwnedFd>)> {
        let mut buf = Vec::new();
        self.fd
            .async_io(Interest::READABLE, |fd| {
                proto::recv::<FromInit>(fd.as_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
                    .map_err(proto_to_io)
            })
            .await
    }

    fn dispatch(&self, msg: FromInit) {
        let mut w = self.waiters();
        match msg {
            FromInit::Reply { id, result } => {
                let Some(tx) = w.replies.remove(&id) else {
                    return;
                };
                let answer = match result {
                    Ok(Reply::Spawned { pid }) => {
                        // Register before anything else is read, so the exit cannot be missed.
                        let (etx, erx) = oneshot::channel();
                        w.exits.insert(pid, etx);
                        Ok((Reply::Spawned { pid }, Some(erx)))
                    }
                    Ok(r) => Ok((r, None)),
                    Err(e) => Err(JailError::Refused(e)),
                };
                let _ = tx.send(answer);
            }
            FromInit::Exited { pid, status } => {
                if let Some(tx) = w.exits.remove(&pid) {
                    let _ = tx.send(status);
                }
            }
            FromInit::Forked { .. } | FromInit::Ready(_) | FromInit::SetupFailed { .. } => {}
        }
    }

    fn end(&self) {
        let mut w = self.waiters();
        w.ended = true;
        for (_, tx) in w.replies.drain() {
            let _ = tx.send(Err(JailError::Ended));
        }
        w.exits.clear();
        drop(w);
        self.ended.send_replace(true);
    }

    async fn request(&self, request: Request, fds: &[BorrowedFd<'_>]) -> ReplyResult {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiters();
            if w.ended {
                return Err(JailError::Ended);
            }
            w.replies.insert(id, tx);
        }
        if let Err(e) = self.send(&ToInit::Request { id, request }, fds).await {
            self.waiters().replies.remove(&id);
            return Err(e);
        }
        rx.await.unwrap_or(Err(JailError::Ended))
    }
}

async fn read_loop(shared: Arc<Shared>) {
    while let Ok(msg) = shared.recv_one().await {
        shared.dispatch(msg);
    }
    shared.end();
}

/// A process started in a sandbox.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid inside the sandbox.
    pub pid: i32,
    /// Resolves when it ends; fails if the sandbox ends first.
    pub exit: oneshot::Receiver<ExitStatus>,
}

/// A live sandbox.
#[derive(Debug)]
pub struct Jail {
    name: String,
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    child: tokio::sync::Mutex<Option<tokio::process::Child>>,
    cgroup: Option<SandboxCgroup>,
    /// Kept so the owner's record outlives the sandbox's group.
    owner: Arc<Owner>,
    _uid: Option<UidLease>,
    identity: Identity,
    report: LayerReport,
    init_pid: u32,
    dirs: Vec<(PathBuf, OwnedFd)>,
    listeners: Mutex<Vec<(u16, OwnedFd)>>,
}

/// A descriptor the init handed over with its ready report.
enum Exported {
    Dir((PathBuf, OwnedFd)),
    Listener((u16, OwnedFd)),
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("fd", &self.fd.get_ref())
            .finish_non_exhaustive()
    }
}

impl Jail {
    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The layers its init applied.
    pub fn report(&self) -> &LayerReport {
        &self.report
    }

    /// Who its processes are.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Starts a process; `fds` become its fds 0, 1, 2, ... (at least three).
    pub async fn spawn(
        &self,
        request: SpawnRequest,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Spawned, JailError> {
        match self.shared.request(Request::Spawn(request), fds).await? {
            (Reply::Spawned { pid }, Some(exit)) => Ok(Spawned { pid, exit }),
            (other, _) => Err(JailError::Refused(crate::proto::Refusal::new(format!(
                "unexpected reply {other:?}"
            )))),
        }
    }

    /// Sends `signal` to a process, or to its process group.
    pub async fn signal(&self, pid: i32, signal: i32, group: bool) -> Result<(), JailError> {
        self.shared
            .request(Request::Signal { pid, signal, group }, &[])
            .await
            .map(drop)
    }

    /// Checks that the init answers.
    pub async fn ping(&self) -> Result<(), JailError> {
        self.shared.request(Request::Ping, &[]).await.map(drop)
    }

    /// Whether the sandbox has ended (its init is gone).
    pub fn has_ended(&self) -> bool {
        *self.shared.ended.borrow()
    }

    /// Resolves when the sandbox ends.
    pub async fn ended(&self) {
        let mut rx = self.shared.ended.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// The sandbox's cgroup, if it has one.
    pub fn cgroup(&self) -> Option<&SandboxCgroup> {
        self.cgroup.as_ref()
    }

    /// Resource use, from the cgroup layer (empty without cgroups).
    pub fn usage(&self) -> Usage {
        self.cgroup
            .as_ref()
            .map(SandboxCgroup::usage)
            .unwrap_or_default()
    }

    /// Whether the sandbox can be paused (its cgroup can be frozen).
    pub fn can_pause(&self) -> bool {
        self.cgroup.as_ref().is_some_and(SandboxCgroup::can_freeze)
    }

    /// Freezes every process of the sandbox (`true`) or thaws them: frozen, they use no CPU
    /// and keep their memory, descriptors and state.
    pub async fn set_paused(&self, paused: bool) -> Result<(), JailError> {
        let cg = self.cgroup.as_ref().ok_or_else(|| {
            JailError::Cgroup(io::Error::new(
                io::ErrorKind::Unsupported,
                "the sandbox has no cgroup",
            ))
        })?;
        cg.set_frozen(paused, Duration::from_secs(5))
            .await
            .map_err(JailError::Cgroup)
    }

    /// The sandbox's cgroup directories (empty without cgroups).
    pub fn cgroup_paths(&self) -> Vec<PathBuf> {
        self.cgroup
            .as_ref()
            .map(|c| c.paths().into_iter().map(Path::to_path_buf).collect())
            .unwrap_or_default()
    }

    /// A directory of the sandbox the init exported at start ([`JailSpec::export_dirs`]), as
    /// an `O_PATH` descriptor of the sandbox's own tree. Resolve paths beneath it with
    /// `openat2` and `RESOLVE_BENEATH`; it never goes through `/proc`, so it works the same
    /// whether the server is root or not, and no pid is involved.
    pub fn exported_dir(&self, inside: &Path) -> Option<BorrowedFd<'_>> {
        self.dirs
            .iter()
            .find(|(p, _)| p == inside)
            .map(|(_, fd)| fd.as_fd())
    }

    /// The socket listening on the sandbox's `127.0.0.1:port` ([`JailSpec::listen_tcp`]),
    /// once: the caller accepts on it from then on.
    pub fn take_listener(&self, port: u16) -> Option<OwnedFd> {
        let mut listeners = self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let i = listeners.iter().position(|(p, _)| *p == port)?;
        Some(listeners.swap_remove(i).1)
    }

    /// Host pid of the sandbox's init (for diagnostics and tests).
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// Host pid of stage one, the init's parent (for diagnostics and tests).
    pub async fn stage_one_pid(&self) -> Option<u32> {
        self.child
            .lock()
            .await
            .as_ref()
            .and_then(tokio::process::Child::id)
    }

    /// Ends the sandbox: closes the control socket (the init exits and the kernel kills
    /// every process in its PID namespace), waits for stage one, removes the cgroup.
    pub async fn shutdown(&self) {
        // A paused sandbox's init could not see the socket close (nor, on v1, die).
        if let Some(cg) = &self.cgroup {
            cg.thaw_now();
        }
        let _ = shutdown(self.shared.fd.get_ref().as_raw_fd(), Shutdown::Both);
        let child = self.child.lock().await.take();
        if let Some(mut child) = child
            && tokio::time::timeout(Duration::from_secs(3), child.wait())
                .await
                .is_err()
        {
            tracing::warn!(sandbox = %self.name, "init did not exit; killing the sandbox");
            let _ = child.start_kill();
            if let Some(cg) = &self.cgroup {
                cg.kill_all();
            }
            let _ = child.wait().await;
        }
        if let Some(cg) = &self.cgroup
            && let Err(e) = cg.remove(Duration::from_secs(5)).await
        {
            tracing::warn!(sandbox = %self.name, "could not remove cgroup: {e}");
        }
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        self.reader.abort();
        // If `shutdown` was not awaited, stage one is killed by `kill_on_drop`, which takes
        // the init (parent-death signal) and the namespace with it; the cgroup goes once empty.
        let _ = shutdown(self.shared.fd.get_ref().as_raw_fd(), Shutdown::Both);
        if let Some(cg) = self.cgroup.take() {
            spawn_cleanup(cg, Arc::clone(&self.owner));
        }
    }
}
