//! Compatibility profiles (`runbox serve --profile NAME`): tool sets that answer exactly like
//! servers that agents and prompts were already written for, so they work unchanged. Same
//! registry, isolation and limits underneath; only tool names, arguments and answer shapes
//! change. One module per profile:
//!
//! - `novita`: the Novita sandbox tutorial's server (`novita-tutorial`);
//! - `code_sandbox_mcp`: philschmid's `code-sandbox-mcp`, one fresh sandbox per call;
//! - `mcp_code_sandbox`: `mcp-code-sandbox`, sandboxes named by the caller (`session_id`).
//!
//! Every profile keeps runbox's improvements where they do not break the shape: timeouts,
//! output caps, and failures that say what went wrong. A failure comes back where the
//! original put it: the seeds' servers caught every exception and answered with it as
//! ordinary content (a `Failed to ...` text, an `{"error": ...}` object, an `{"exit_code",
//! "stderr"}` object), so the profiles never set `isError`, and a client written for the
//! seed (fastmcp raises `ToolError` on `isError`) reads the answer as it did there. JSON
//! answers are a text block holding the object (pretty printed, fields in the seed's
//! order); `structuredContent` and an `outputSchema` are there exactly where the seed's
//! framework produced them.

mod code_sandbox_mcp;
mod mcp_code_sandbox;
mod novita;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock};
use runbox_core::{CreateRequest, Error, ExecOutcome, Network, SandboxId};
use serde::Serialize;

use crate::server::RunboxServer;

/// Which tools the server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Profile {
    /// runbox's own tools (`run_code`, `create_sandbox`, ...).
    #[default]
    Default,
    /// The Novita sandbox tutorial's server: `create_sandbox_session`, `run_python_code`,
    /// `run_on_command_line`, `stop_sandbox_session`.
    NovitaTutorial,
    /// `code-sandbox-mcp`: `run_python_code` and `run_javascript_code`, each in a fresh
    /// sandbox.
    CodeSandboxMcp,
    /// `mcp-code-sandbox`: sandboxes named by the caller, code, packages and files.
    McpCodeSandbox,
}

impl Profile {
    /// The compatibility profiles, by the names `--profile` takes.
    pub const COMPATIBILITY: [Profile; 3] = [
        Profile::NovitaTutorial,
        Profile::CodeSandboxMcp,
        Profile::McpCodeSandbox,
    ];

    /// The profile's name, as `--profile` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::NovitaTutorial => "novita-tutorial",
            Profile::CodeSandboxMcp => "code-sandbox-mcp",
            Profile::McpCodeSandbox => "mcp-code-sandbox",
        }
    }

    /// The instructions sent to clients at initialisation.
    pub fn instructions(self) -> &'static str {
        match self {
            Profile::Default => crate::server::INSTRUCTIONS,
            Profile::NovitaTutorial => novita::INSTRUCTIONS,
            Profile::CodeSandboxMcp => code_sandbox_mcp::INSTRUCTIONS,
            Profile::McpCodeSandbox => mcp_code_sandbox::INSTRUCTIONS,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A profile name runbox does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown profile {0:?}: the profiles are novita-tutorial, code-sandbox-mcp and \
     mcp-code-sandbox (leave --profile out for runbox's own tools)"
)]
pub struct UnknownProfile(pub String);

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        if wanted == Profile::Default.name() {
            return Ok(Profile::Default);
        }
        Profile::COMPATIBILITY
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}

impl RunboxServer {
    /// The tools of a compatibility profile (the default profile's are assembled in
    /// `RunboxServer::new`).
    pub(crate) fn profile_tools(profile: Profile) -> ToolRouter<Self> {
        match profile {
            Profile::Default => ToolRouter::new(),
            Profile::NovitaTutorial => Self::novita_tools(),
            Profile::CodeSandboxMcp => Self::code_sandbox_mcp_tools(),
            Profile::McpCodeSandbox => Self::mcp_code_sandbox_tools(),
        }
    }

    /// What a profile whose seed could install packages (novita-tutorial, mcp-code-sandbox)
    /// asks for when creating a sandbox: network "allowlist" (the operator's egress hosts,
    /// the package indexes by default) when the server has any, none otherwise.
    pub(crate) async fn package_sandbox_request(&self, caller: &crate::Caller) -> CreateRequest {
        CreateRequest {
            credential: caller.credential.clone(),
            network: if self.settings().package_network.get().await {
                Network::Allowlist(Vec::new())
            } else {
                Network::None
            },
            ..Default::default()
        }
    }

    /// The resources of a compatibility profile (beside the data files every profile
    /// serves): only code-sandbox-mcp's original had one.
    pub(crate) fn profile_resources(&self) -> Vec<rmcp::model::Resource> {
        match self.settings().profile {
            Profile::CodeSandboxMcp => code_sandbox_mcp::resources(),
            _ => Vec::new(),
        }
    }

    /// Reads `uri` when it is one of the profile's own resources.
    pub(crate) async fn read_profile_resource(
        &self,
        caller: &crate::Caller,
        uri: &str,
    ) -> Option<rmcp::model::ReadResourceResult> {
        match self.settings().profile {
            Profile::CodeSandboxMcp if uri == code_sandbox_mcp::ENVIRONMENTS_URI => {
                Some(self.code_sandbox_mcp_environments(caller).await)
            }
            _ => None,
        }
    }

    /// The prompts of a compatibility profile. Only the Novita tutorial's server had one;
    /// the other seeds had none, and runbox's own `sandbox_instructions` names tools those
    /// profiles do not have, so they offer none.
    pub(crate) fn profile_prompts(profile: Profile) -> PromptRouter<Self> {
        match profile {
            Profile::NovitaTutorial => Self::novita_prompts(),
            _ => PromptRouter::new(),
        }
    }
}

/// A JSON answer as its text block shows it: pretty printed, fields in declaration order
/// (as the seeds' Python servers print their dictionaries).
fn json_text<T: Serialize>(body: &T) -> String {
    serde_json::to_string_pretty(body).unwrap_or_else(|e| {
        tracing::error!("a profile answer did not serialize: {e}");
        format!("{{\"error\": \"the answer could not be serialized: {e}\"}}")
    })
}

/// A result of one text block, as ordinary content (never `isError`: see the module docs).
fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text.into())])
}

/// A JSON object answer: the object as text, and as `structuredContent` when `structured`.
fn object_result<T: Serialize>(body: &T, structured: bool) -> CallToolResult {
    let mut result = text_result(json_text(body));
    if structured {
        result.structured_content = serde_json::to_value(body).ok();
    }
    result
}

/// The output schema the Python SDK's FastMCP gives a tool declared as returning `str`:
/// the text wrapped as `{"result": ...}`.
fn str_result_schema(tool: &str) -> std::sync::Arc<rmcp::model::JsonObject> {
    let schema = serde_json::json!({
        "properties": {"result": {"title": "Result", "type": "string"}},
        "required": ["result"],
        "title": format!("{tool}Output"),
        "type": "object",
    });
    match schema {
        serde_json::Value::Object(o) => std::sync::Arc::new(o),
        _ => std::sync::Arc::default(),
    }
}

/// A text answer of a tool FastMCP declared as returning `str`: the text, and the same as
/// `structuredContent` `{"result": text}`.
fn str_result(text: impl Into<String>) -> CallToolResult {
    let text = text.into();
    let mut result = text_result(text.clone());
    result.structured_content = Some(serde_json::json!({ "result": text }));
    result
}

/// Output split as the E2B SDK hands it over: one entry per line, each with its newline.
fn lines(s: &str) -> Vec<String> {
    s.split_inclusive('\n').map(str::to_owned).collect()
}

/// How runbox's remarks about a run (a timeout, a lost kernel, output cut to fit) show in
/// stderr, where the seeds have no place for them.
fn note_line(note: &str) -> String {
    format!("runbox: {note}\n")
}

/// `logs` of an E2B execution: stdout and stderr as lists of lines; runbox's notes are
/// appended to stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
struct Logs {
    stdout: Vec<String>,
    stderr: Vec<String>,
}

impl Logs {
    fn of(outcome: &ExecOutcome) -> Self {
        let mut stderr = lines(&outcome.stderr);
        stderr.extend(outcome.notes.iter().map(|n| note_line(n)));
        Self {
            stdout: lines(&outcome.stdout),
            stderr,
        }
    }
}

/// An E2B `ExecutionError`: an uncaught error of the code, or why the code could not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ErrorBody {
    name: String,
    value: String,
    traceback: String,
}

impl ErrorBody {
    fn of(outcome: &ExecOutcome) -> Option<Self> {
        outcome.error.as_ref().map(|e| Self {
            name: e.name.clone(),
            value: e.value.clone(),
            traceback: e.traceback.clone(),
        })
    }
}

/// What a profile tells a caller to do, in its own tools' names (runbox's own advice names
/// runbox's tools, which a profile does not have).
pub(crate) struct Words {
    /// For a sandbox id that names no sandbox.
    pub not_found: &'static str,
    /// For a caller holding as many sandboxes as it may.
    pub close_one: &'static str,
}

/// Words for profiles whose sandboxes the caller never names (one per call).
const ONE_SHOT: Words = Words {
    not_found: "",
    close_one: "Wait until one of your runs has ended.",
};

/// A runbox error as sentences, its causes included, with the profile's advice after it
/// when the error calls for some.
fn message(e: &Error, words: &Words) -> String {
    let (text, advice) = match e {
        Error::SandboxNotFound { .. } => (runbox_core::chain(e), words.not_found),
        Error::Sandbox { .. } => (
            runbox_core::chain(e),
            "This is a failure of the sandbox, not of your code; try again.",
        ),
        Error::Quota {
            limit: runbox_core::Limit::TenantSandboxes,
            ..
        } => (
            "limit reached: you hold as many sandboxes as one caller may hold at once".to_owned(),
            words.close_one,
        ),
        _ => (runbox_core::chain(e), ""),
    };
    crate::render::sentences(&text, advice)
}

/// What went wrong in a run that did not succeed, in one line: a timeout or cancellation
/// (runbox's note), the error, or the exit status. `None` when it succeeded.
fn failure_summary(outcome: &ExecOutcome) -> Option<String> {
    if outcome.succeeded() {
        return None;
    }
    if (outcome.timed_out || outcome.cancelled) && !outcome.notes.is_empty() {
        return Some(outcome.notes.join(" "));
    }
    if let Some(e) = &outcome.error {
        return Some(format!("{}: {}", e.name, e.value));
    }
    match outcome.exit_code {
        Some(c) if c != 0 => Some(format!("exit status {c}")),
        _ => Some(outcome.notes.join(" ")),
    }
}

/// A caller-named sandbox of `mcp-code-sandbox`: being created, or ready.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Creating,
    Ready(SandboxId),
}

/// Sandboxes named by their callers (`mcp-code-sandbox`'s `session_id`), per tenant. A
/// name is reserved while its sandbox is being created, so two calls cannot both create
/// it; a name whose sandbox expired or was closed is forgotten when next looked at.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<(String, String), Slot>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Slot>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(tenant: &str, session: &str) -> (String, String) {
        (tenant.to_owned(), session.to_owned())
    }

    /// Reserves `session` for a sandbox about to be created; `None` if it is taken. The
    /// reservation is released when dropped unfilled (the creation failed, or the request
    /// was cancelled meanwhile).
    fn reserve<'a>(&'a self, tenant: &str, session: &str) -> Option<Reservation<'a>> {
        let mut map = self.lock();
        let key = Self::key(tenant, session);
        if map.contains_key(&key) {
            return None;
        }
        map.insert(key.clone(), Slot::Creating);
        Some(Reservation {
            sessions: self,
            key,
            filled: false,
        })
    }

    /// Forgets a session (its sandbox could not be created, or is gone).
    fn forget(&self, tenant: &str, session: &str) {
        self.lock().remove(&Self::key(tenant, session));
    }

    /// The sandbox of a ready session.
    fn get(&self, tenant: &str, session: &str) -> Option<SandboxId> {
        match self.lock().get(&Self::key(tenant, session)) {
            Some(Slot::Ready(id)) => Some(id.clone()),
            _ => None,
        }
    }

    /// Takes a ready session's sandbox out, to close it.
    fn take(&self, tenant: &str, session: &str) -> Option<SandboxId> {
        let mut map = self.lock();
        let key = Self::key(tenant, session);
        match map.get(&key) {
            Some(Slot::Ready(_)) => match map.remove(&key) {
                Some(Slot::Ready(id)) => Some(id),
                _ => None,
            },
            _ => None,
        }
    }

    /// Forgets `tenant`'s ready sessions whose sandbox is not among `live` (it expired or
    /// was closed some other way).
    fn prune(&self, tenant: &str, live: &HashSet<SandboxId>) {
        self.lock().retain(|(t, _), slot| match slot {
            Slot::Ready(id) => t != tenant || live.contains(id),
            Slot::Creating => true,
        });
    }

    /// `tenant`'s ready sessions, by name.
    fn names(&self, tenant: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .lock()
            .iter()
            .filter(|((t, _), slot)| t == tenant && matches!(slot, Slot::Ready(_)))
            .map(|((_, s), _)| s.clone())
            .collect();
        names.sort();
        names
    }
}

/// A session name held while its sandbox is being created.
struct Reservation<'a> {
    sessions: &'a Sessions,
    key: (String, String),
    filled: bool,
}

impl Reservation<'_> {
    /// Names the sandbox created for the session.
    fn fill(mut self, id: SandboxId) {
        self.sessions
            .lock()
            .insert(self.key.clone(), Slot::Ready(id));
        self.filled = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.filled {
            let mut map = self.sessions.lock();
            if map.get(&self.key) == Some(&Slot::Creating) {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_by_name_and_unknown_ones_list_the_choices() {
        for p in Profile::COMPATIBILITY {
            assert_eq!(p.name().parse::<Profile>().unwrap(), p);
        }
        assert_eq!("default".parse::<Profile>().unwrap(), Profile::Default);
        let e = "e2b".parse::<Profile>().unwrap_err().to_string();
        for name in [
            "novita-tutorial",
            "code-sandbox-mcp",
            "mcp-code-sandbox",
            "e2b",
        ] {
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn logs_are_lines_with_notes_after_stderr() {
        let o = ExecOutcome {
            stdout: "a\nb".into(),
            stderr: "warn\n".into(),
            notes: vec!["The run exceeded its timeout.".into()],
            ..Default::default()
        };
        let logs = Logs::of(&o);
        assert_eq!(logs.stdout, ["a\n", "b"]);
        assert_eq!(
            logs.stderr,
            ["warn\n", "runbox: The run exceeded its timeout.\n"]
        );
        assert!(Logs::of(&ExecOutcome::default()).stdout.is_empty());
    }

    #[test]
    fn failures_are_summed_up_in_a_line() {
        assert_eq!(failure_summary(&ExecOutcome::default()), None);
        let exited = ExecOutcome {
            exit_code: Some(2),
            ..Default::default()
        };
        assert_eq!(failure_summary(&exited).as_deref(), Some("exit status 2"));
        let timed_out = ExecOutcome {
            timed_out: true,
            notes: vec!["The run exceeded its timeout of 1 s.".into()],
            error: Some(runbox_core::ExecError {
                name: "KeyboardInterrupt".into(),
                value: String::new(),
                traceback: String::new(),
            }),
            ..Default::default()
        };
        assert_eq!(
            failure_summary(&timed_out).as_deref(),
            Some("The run exceeded its timeout of 1 s.")
        );
    }

    #[test]
    fn sessions_are_reserved_once_and_pruned_when_their_sandbox_is_gone() {
        let s = Sessions::default();
        let t = s.reserve("t", "a").unwrap();
        assert!(s.reserve("t", "a").is_none(), "reserved twice");
        let u = s
            .reserve("u", "a")
            .expect("another tenant's name is its own");
        assert_eq!(s.get("t", "a"), None, "not ready yet");
        t.fill(SandboxId::from("sbx_1"));
        u.fill(SandboxId::from("sbx_2"));
        assert_eq!(s.get("t", "a"), Some(SandboxId::from("sbx_1")));
        assert_eq!(s.names("t"), ["a"]);
        // sbx_1 expired: t's session goes, u's stays.
        s.prune("t", &HashSet::new());
        assert!(s.names("t").is_empty());
        assert_eq!(s.names("u"), ["a"]);
        assert_eq!(s.take("u", "a"), Some(SandboxId::from("sbx_2")));
        assert_eq!(s.take("u", "a"), None);
        // A reservation dropped unfilled (a failed or cancelled creation) frees the name.
        drop(s.reserve("u", "a").unwrap());
        assert!(s.reserve("u", "a").is_some());
        s.reserve("u", "b").unwrap().fill(SandboxId::from("sbx_3"));
        s.forget("u", "b");
        assert!(s.names("u").is_empty());
    }
}
