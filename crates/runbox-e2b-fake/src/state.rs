//! The fake's shared state: sandboxes, scripts, faults, the request log.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fs::Fs;
use crate::golden::{self, Golden};
use crate::{CommandReply, ExecReply, FakeConfig, Fault, Provider, Recorded};

pub(crate) struct Inner {
    pub config: FakeConfig,
    pub state: Mutex<State>,
    pub cancel: CancellationToken,
    pub golden: Vec<Golden>,
}

impl Inner {
    pub fn new(config: FakeConfig) -> Inner {
        let golden = golden::goldens(config.provider);
        Inner {
            config,
            state: Mutex::new(State::default()),
            cancel: CancellationToken::new(),
            golden,
        }
    }

    /// The state lock; a panic elsewhere while holding it does not poison the fake.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn provider(&self) -> Provider {
        self.config.provider
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub next_sandbox: u32,
    /// Every sandbox ever created (gone ones too: their ids stay known).
    pub sandboxes: Vec<Sandbox>,
    pub requests: Vec<Recorded>,
    pub violations: Vec<String>,
    pub faults: Vec<Fault>,
    pub exec_scripts: HashMap<String, ExecReply>,
    pub cmd_scripts: HashMap<String, CommandReply>,
    pub executions: Vec<(String, String, String, u32)>,
}

/// How a sandbox id from a path relates to the sandboxes the fake created.
pub(crate) enum Lookup {
    /// Index into `State::sandboxes`.
    Found(usize),
    /// Names a sandbox, but not in the form the provider's clients use.
    WrongForm {
        expected: String,
    },
    Unknown,
}

impl State {
    pub fn lookup(&self, id: &str) -> Lookup {
        if let Some(i) = self.sandboxes.iter().position(|s| s.id == id) {
            return Lookup::Found(i);
        }
        match self
            .sandboxes
            .iter()
            .find(|s| s.base_id == id || format!("{}-{}", s.base_id, s.client_id) == id)
        {
            Some(s) => Lookup::WrongForm {
                expected: s.id.clone(),
            },
            None => Lookup::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    Running,
    Paused,
    /// Killed or expired.
    Gone,
}

impl Life {
    pub fn as_str(self) -> &'static str {
        match self {
            Life::Running => "running",
            Life::Paused => "paused",
            Life::Gone => "killed",
        }
    }
}

pub(crate) struct Sandbox {
    /// The id as the client uses it (composite for legacy Novita).
    pub id: String,
    /// `sandboxID` in JSON.
    pub base_id: String,
    pub client_id: String,
    pub api_key: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub life: Life,
    pub timeout: u64,
    pub started_at: SystemTime,
    pub end_at: SystemTime,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub token: Option<String>,
    pub auto_pause: bool,
    pub fs: Fs,
    pub next_pid: u32,
    pub processes: BTreeMap<u32, Proc>,
    pub contexts: Vec<Context>,
    pub next_ctx: u32,
}

impl Sandbox {
    pub fn set_timeout(&mut self, secs: u64) {
        self.timeout = secs;
        self.end_at = SystemTime::now() + Duration::from_secs(secs);
    }

    /// Killed or expired: its processes' streams are cut.
    pub fn vanish(&mut self) {
        self.life = Life::Gone;
        for (_, p) in std::mem::take(&mut self.processes) {
            p.end.send_replace(Some(EndKind::Vanished));
        }
    }

    pub fn find_process(&self, selector: &Value) -> Option<u32> {
        if let Some(pid) = selector.get("pid").and_then(Value::as_u64) {
            let pid = u32::try_from(pid).ok()?;
            return self.processes.contains_key(&pid).then_some(pid);
        }
        let tag = selector.get("tag").and_then(Value::as_str)?;
        self.processes
            .iter()
            .find(|(_, p)| p.tag.as_deref() == Some(tag))
            .map(|(pid, _)| *pid)
    }
}

/// A running (hanging) process.
pub(crate) struct Proc {
    /// The `ProcessConfig` it was started with (for `List`).
    pub config: Value,
    pub tag: Option<String>,
    /// `None` while running; set once when it ends.
    pub end: watch::Sender<Option<EndKind>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndKind {
    /// SendSignal SIGKILL/SIGTERM.
    Killed,
    /// The Start request's Connect-Timeout-Ms elapsed.
    Deadline,
    /// The sandbox was killed or expired: streams are cut.
    Vanished,
}

/// A code interpreter context (a kernel).
pub(crate) struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    pub count: u32,
    /// The language's default context (used when `/execute` names no context).
    pub default: bool,
}
