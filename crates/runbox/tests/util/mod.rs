//! Shared helpers for runbox's integration tests: a local backend whose sandboxes re-execute
//! the `runbox` binary built for this test run, and short ways to run code.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runbox_core::{
    Backend, ExecContext, ExecOutcome, ExecRequest, Language, Limits, OutputChunk, SandboxId,
    SandboxSpec,
};
use runbox_local::{LocalBackend, LocalConfig};

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The runbox binary under test (`RUNBOX_TEST_EXE` overrides it, for the unprivileged run,
/// which copies the binaries somewhere its user can reach).
pub fn runbox_exe() -> PathBuf {
    std::env::var_os("RUNBOX_TEST_EXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_runbox")))
}

/// Whether the tests run in the mode without cgroups (`RUNBOX_NO_CGROUPS`, which the servers
/// the tests start read too).
pub fn no_cgroups() -> bool {
    std::env::var("RUNBOX_NO_CGROUPS").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// A config for tests: sandboxes run the binary under test; `RUNBOX_CGROUP_PARENT` (set by
/// the unprivileged CI run to a delegated subtree) is honoured; cgroups are required with
/// `RUNBOX_TEST_REQUIRE_CGROUPS`, never used with `RUNBOX_NO_CGROUPS`, used where available
/// otherwise.
pub fn config() -> LocalConfig {
    let mut c = LocalConfig::default();
    c.jail.init_exe = runbox_exe();
    c.jail.cgroup_parent = std::env::var_os("RUNBOX_CGROUP_PARENT").map(PathBuf::from);
    c.jail.cgroups = if no_cgroups() {
        runbox_jail::CgroupMode::Disabled
    } else if std::env::var_os("RUNBOX_TEST_REQUIRE_CGROUPS").is_some() {
        runbox_jail::CgroupMode::Required
    } else {
        runbox_jail::CgroupMode::IfAvailable
    };
    c.interrupt_grace = Duration::from_secs(1);
    c
}

pub async fn backend() -> Arc<LocalBackend> {
    backend_with(|_| {}).await
}

pub async fn backend_with(f: impl FnOnce(&mut LocalConfig)) -> Arc<LocalBackend> {
    let mut c = config();
    f(&mut c);
    Arc::new(LocalBackend::new(c).await.expect("local backend"))
}

pub async fn sandbox(b: &LocalBackend) -> SandboxId {
    b.create(SandboxSpec::default())
        .await
        .expect("create sandbox")
        .id
}

pub async fn sandbox_with(b: &LocalBackend, limits: Limits) -> SandboxId {
    b.create(SandboxSpec {
        limits: Some(limits),
        ..Default::default()
    })
    .await
    .expect("create sandbox")
    .id
}

pub async fn run(b: &LocalBackend, id: &SandboxId, language: Language, code: &str) -> ExecOutcome {
    run_for(b, id, language, code, TIMEOUT).await
}

pub async fn run_for(
    b: &LocalBackend,
    id: &SandboxId,
    language: Language,
    code: &str,
    timeout: Duration,
) -> ExecOutcome {
    b.exec(
        id,
        ExecRequest::new(language, code, timeout),
        ExecContext::default(),
    )
    .await
    .expect("exec")
}

pub async fn py(b: &LocalBackend, id: &SandboxId, code: &str) -> ExecOutcome {
    run(b, id, Language::Python, code).await
}

pub async fn sh(b: &LocalBackend, id: &SandboxId, code: &str) -> ExecOutcome {
    run(b, id, Language::Bash, code).await
}

/// The `text/plain` of a run's main result.
pub fn value(o: &ExecOutcome) -> Option<String> {
    o.results
        .iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.text().map(str::to_owned))
}

/// Output chunks seen by a recording context, with the instant each arrived.
pub type Recorded = Arc<Mutex<Vec<(std::time::Instant, OutputChunk)>>>;

/// A context whose output is collected, with the instant each chunk arrived.
pub fn recording_context() -> (ExecContext, Recorded) {
    let seen: Recorded = Arc::default();
    let s = Arc::clone(&seen);
    let ctx = ExecContext::streaming(Arc::new(move |c: OutputChunk| {
        s.lock().unwrap().push((std::time::Instant::now(), c));
    }));
    (ctx, seen)
}

/// Host pids whose command line contains `needle`.
pub fn host_processes_with(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// [`host_processes_with`], once at least `n` exist or 10 s have passed: a process started
/// in the background by a run that has returned may not have exec'd yet.
pub fn host_processes_at_least(needle: &str, n: usize) -> Vec<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found = host_processes_with(needle);
        if found.len() >= n || std::time::Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A token unlikely to appear anywhere by chance.
pub fn canary(tag: &str) -> String {
    let mut b = [0u8; 8];
    getrandom_fill(&mut b);
    format!(
        "runbox-canary-{tag}-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

fn getrandom_fill(b: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(b)
        .unwrap();
}

/// Whether the tests run as root (the root-mode layers) or as an ordinary user.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub mod mcp;

/// Python snippet defining `sc(nr, *args) -> (ret, errno)`, a raw syscall through ctypes.
pub const PY_SYSCALL: &str = r#"
import ctypes, os, errno
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"#;
