//! # runbox-e2b-fake
//!
//! Test support (never shipped): an in-process fake of an E2B-compatible sandbox cloud
//! (E2B, Novita, legacy Novita) that `runbox-e2b`'s contract and end-to-end tests run
//! against. The protocol it implements and checks is `shared/docs/E2B_PROTOCOL.md`
//! (section numbers below refer to it).
//!
//! ## One listener, path routing
//! [`Fake::start`] binds `127.0.0.1:0` and serves all three surfaces there; the client
//! is pointed at it with an API base override ([`Fake::api_url`]) and a sandbox URL
//! template ([`Fake::sandbox_url`]):
//!
//! | surface | path prefix | what it fakes |
//! |---|---|---|
//! | [`Surface::Api`] | `/api` | the control plane REST API (§1): create, get, list (v2 paging and legacy), kill, timeout, refreshes, pause, connect/resume |
//! | [`Surface::Envd`] | `/49983/{sandbox_id}` | envd (§2): Connect RPC (`process.Process/*`, `filesystem.Filesystem/*`) over an in-memory filesystem, scripted processes, and `/files` |
//! | [`Surface::Interpreter`] | `/49999/{sandbox_id}` | the code interpreter (§3): `/execute` (NDJSON) and `/contexts` |
//!
//! `{sandbox_id}` is the id the client uses: `sbx{n}` for E2B and Novita, the composite
//! `sbx{n}-{clientID}` for legacy Novita (§4), in sandbox paths and control-plane paths
//! alike.
//!
//! ## What is checked
//! Every request is recorded ([`Fake::requests`]) and checked; each breach is a
//! *violation* ([`Fake::violations`], [`Fake::assert_clean`]). A breach the fake cannot
//! answer sensibly (unknown route or sandbox, wrong id form, a malformed body: bad
//! envelope, invalid JSON, wrong JSON types, missing required fields) is *gross* and is
//! answered with HTTP 599 carrying the violation text, so the failure is obvious.
//! Other breaches get the normal answer (or the real server's error, e.g. 401 for a
//! wrong `X-Access-Token`). The checks:
//!
//! * **control plane**: `X-API-KEY` present (an unknown key is a plain 401, not a
//!   violation); no `Authorization`; `Content-Type: application/json` with a body;
//!   method/path in the route table (v2 create/connect only for E2B); bodies validated
//!   per endpoint and provider: create needs `templateID` and an integer `timeout`
//!   (absent is a violation: the v1 default is 15 s), `metadata`/`envVars` string maps,
//!   only the provider's known keys (camelCase except `allow_internet_access`; legacy
//!   Novita `allowInternetAccess` and `secure` false or absent; no `secure` on E2B v2);
//!   integer `timeout` on `/timeout`; list query parameters.
//! * **sandbox surfaces**: the port segment is 49983 or 49999; the id names a sandbox
//!   the fake created, in the provider's form (bare for E2B/Novita, composite for legacy
//!   Novita); routing headers (E2B: `E2b-Sandbox-Id`/`E2b-Sandbox-Port` on envd and
//!   interpreter requests; Novita: `Novita-Sandbox-Id`/`Novita-Sandbox-Port` on envd
//!   requests; legacy Novita: none) are required where the provider's SDK sends them
//!   and must be correct whenever present; `X-Access-Token` equals the issued token
//!   (and is absent when none was issued); `Authorization: Basic`, if present, decodes
//!   to `root:` or `user:`; `Connect-Timeout-Ms`, if present, is a non-negative integer;
//!   no `E2B-Traffic-Access-Token` (none is ever issued).
//! * **envd Connect RPC**: POST, known method, `Connect-Protocol-Version: 1`; unary:
//!   `Content-Type: application/json` and a bare JSON body; streaming (`Start`,
//!   `Connect`): `application/connect+json`, exactly one envelope, flags 0, length equal
//!   to the remaining bytes; the message is valid proto3-JSON for the request type
//!   (lowerCamel names, no unknown fields, strings/bools/u32 numbers/base64 bytes/enum
//!   names, string lists and maps, oneofs with one member).
//! * **`/files`**: `path` query on downloads and raw uploads; multipart parts named
//!   `file` whose filename is the destination path; `username` ∈ {root, user}.
//! * **interpreter**: `/execute` body keys ⊆ {code, context_id, language, env_vars},
//!   `code` a string, not both `context_id` and `language`; `/contexts` keys ⊆
//!   {language, cwd}.
//! * **recorded SDK traffic** (`fixtures/*.jsonl`, E2B ↔ e2b 2.63.0, Novita and legacy
//!   ↔ novita-sandbox 2.1.1): for each recorded request kind (create, process Start,
//!   ListDir, SendSignal, files upload/download, execute, contexts, timeout, delete,
//!   connect) every non-volatile header the SDK sent must be on the client's request of
//!   that kind with the same value (content type compared without parameters; a raw
//!   `application/octet-stream` upload is accepted for a multipart one; keys, tokens,
//!   routing, `Authorization` and `Connect-Timeout-Ms` are checked by the rules above
//!   instead of against the recorded literals).
//!
//! ## Scripting and faults
//! Commands and code have no real effect: [`Fake::on_command`] and [`Fake::on_execute`]
//! script what they print; [`Fake::fail`] queues failures (an error status, or a body
//! cut half-way). [`FakeConfig::chunking`] splits every response body into HTTP chunks
//! (whole, byte by byte, or every N bytes) to exercise the client's reassembly.

mod body;
mod control;
mod envd;
mod fs;
mod golden;
mod interp;
mod proto;
mod server;
mod state;
mod time;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use golden::{RECORDED_E2B, RECORDED_NOVITA, SdkRequest, sdk_requests};

use state::Inner;

/// Which cloud the fake impersonates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// E2B: envd token always issued, `E2b-Sandbox-*` routing headers, v1 and v2 paths.
    E2b,
    /// Novita on a modern domain: token when the create body has `"secure": true`,
    /// `Novita-Sandbox-*` routing headers on envd, v1 paths (plus `GET /v2/sandboxes`).
    Novita,
    /// Novita on a legacy domain: composite `{sandboxID}-{clientID}` ids, token only when
    /// `"secure": true` (default false), camelCase `allowInternetAccess`, no routing
    /// headers required.
    NovitaLegacy,
}

/// How every response body is split into HTTP chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    /// Plain bodies are sent whole (with a `Content-Length`); streamed bodies one chunk
    /// per message.
    Whole,
    /// One byte per HTTP chunk, for plain and streamed bodies.
    Bytewise,
    /// Chunks of this many bytes, counted across the whole body (a streamed message is
    /// also never held back: a chunk ends where a message ends).
    Every(usize),
}

/// How to start a [`Fake`].
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub provider: Provider,
    /// API keys the control plane accepts (X-API-KEY). Each key is its own team: a
    /// sandbox is visible only to the key that created it (another key gets 404 for it
    /// and does not see it in lists).
    pub api_keys: Vec<String>,
    pub chunking: Chunking,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            provider: Provider::E2b,
            api_keys: vec!["e2b_test_key".to_owned()],
            chunking: Chunking::Whole,
        }
    }
}

/// The three HTTP surfaces of the fake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Surface {
    /// The control plane, under `/api`.
    Api,
    /// envd, under `/49983/{sandbox_id}`.
    Envd,
    /// The code interpreter, under `/49999/{sandbox_id}`.
    Interpreter,
}

/// A queued failure: the next `times` requests matching (surface, method, path suffix)
/// get `kind` instead of the normal answer.
///
/// `path_suffix` is matched against the request path without its `/api` or
/// `/{port}/{id}` prefix, without and with the query string (e.g. `"/sandboxes"`,
/// `"/timeout"`, `"/process.Process/Start"`, `"/files"`, `"/execute"`); `method: None`
/// matches any method. A request that is a gross violation does not consume a fault.
#[derive(Debug, Clone)]
pub struct Fault {
    pub surface: Surface,
    pub method: Option<http::Method>,
    pub path_suffix: String,
    pub times: usize,
    pub kind: FaultKind,
}

/// What a [`Fault`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Answer with this status and body (JSON or text as given: `application/json` when
    /// it parses as JSON, else `text/plain`), optional Retry-After seconds header. The
    /// request has no other effect.
    Status {
        status: u16,
        body: String,
        retry_after: Option<u64>,
    },
    /// Serve the normal response (with its effects) but stop the body half-way (after
    /// the first half of the bytes, or for streams after the first message) and close
    /// the connection without the end-stream envelope / `end_of_execution`.
    Cut,
}

impl Fault {
    /// A [`FaultKind::Status`] fault for `times` requests.
    pub fn status(
        surface: Surface,
        method: Option<http::Method>,
        path_suffix: &str,
        times: usize,
        status: u16,
        body: &str,
    ) -> Fault {
        Fault {
            surface,
            method,
            path_suffix: path_suffix.to_owned(),
            times,
            kind: FaultKind::Status {
                status,
                body: body.to_owned(),
                retry_after: None,
            },
        }
    }

    /// A [`FaultKind::Cut`] fault for `times` requests.
    pub fn cut(
        surface: Surface,
        method: Option<http::Method>,
        path_suffix: &str,
        times: usize,
    ) -> Fault {
        Fault {
            surface,
            method,
            path_suffix: path_suffix.to_owned(),
            times,
            kind: FaultKind::Cut,
        }
    }
}

/// What `/execute` streams for a piece of code (see [`Fake::on_execute`]).
///
/// The stream is: `{"type": "number_of_executions", "execution_count": N}` (automatic),
/// then `lines` (each serialised as one NDJSON line, Python `json.dumps` spacing) with
/// `keepalives` `{"type": "keepalive"}` lines interleaved (one before each of the first
/// lines, the rest after the last), then a wait of `delay`, then the literal
/// `{"type": "end_of_execution"}` unless `end` is false (the stream then just ends).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecReply {
    pub lines: Vec<serde_json::Value>,
    pub end: bool,
    pub keepalives: usize,
    pub delay: Duration,
}

impl ExecReply {
    /// These lines, then `end_of_execution`; no keepalives, no delay.
    pub fn lines(lines: Vec<serde_json::Value>) -> ExecReply {
        ExecReply {
            lines,
            end: true,
            keepalives: 0,
            delay: Duration::ZERO,
        }
    }

    /// A main result whose `text` is `text` (what `1+1` gives with `"2"`).
    pub fn result(text: &str) -> ExecReply {
        ExecReply::lines(vec![serde_json::json!({
            "type": "result", "text": text, "extra": {}, "is_main_result": true
        })])
    }

    /// One `stdout` chunk.
    pub fn stdout(text: &str) -> ExecReply {
        ExecReply::lines(vec![serde_json::json!({
            "type": "stdout", "text": text, "timestamp": "2025-01-01T00:00:00.000000+00:00"
        })])
    }

    /// Builder: no `end_of_execution` line.
    pub fn without_end(mut self) -> ExecReply {
        self.end = false;
        self
    }

    /// Builder: this many keepalive lines.
    pub fn with_keepalives(mut self, n: usize) -> ExecReply {
        self.keepalives = n;
        self
    }

    /// Builder: wait this long before finishing.
    pub fn with_delay(mut self, delay: Duration) -> ExecReply {
        self.delay = delay;
        self
    }
}

/// What `process.Process/Start` does for a command (see [`Fake::on_command`]).
///
/// The stream is `start{pid}`, a `stdout` data event (if any), a `stderr` data event
/// (if any), with `keepalives` keepalive events interleaved, then — unless `hang` —
/// `end` (`exitCode` omitted when 0, `exited: true`, `status: "exit status N"`, `error`
/// when non-zero) and the end-stream envelope: `{}`, or `{"error":{"code","message"}}`
/// when `end_error` is set.
///
/// `hang`: after start and output the process keeps running (it shows in `List`, a
/// keepalive event every 200 ms on the stream, which may be dropped and re-attached
/// with `Connect`) until `SendSignal` SIGKILL/SIGTERM for its pid (then `end
/// {exitCode:-1, status:"signal: killed"}` without `exited`, and `{}`), or until the
/// Start request's `Connect-Timeout-Ms` elapses (the same end event, then an end-stream
/// `{"error":{"code":"deadline_exceeded",...}}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandReply {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub hang: bool,
    pub keepalives: usize,
    pub end_error: Option<(String, String)>,
}

impl CommandReply {
    /// Print `stdout` and `stderr`, exit with `code`.
    pub fn exit(code: i32, stdout: impl Into<Vec<u8>>, stderr: impl Into<Vec<u8>>) -> Self {
        CommandReply {
            stdout: stdout.into(),
            stderr: stderr.into(),
            exit_code: code,
            hang: false,
            keepalives: 0,
            end_error: None,
        }
    }

    /// Print `stdout`, exit 0.
    pub fn ok(stdout: impl Into<Vec<u8>>) -> Self {
        CommandReply::exit(0, stdout, Vec::new())
    }

    /// Print `stdout`, then keep running until killed or the deadline.
    pub fn hang(stdout: impl Into<Vec<u8>>) -> Self {
        CommandReply {
            hang: true,
            ..CommandReply::ok(stdout)
        }
    }

    /// Builder: this many keepalive events.
    pub fn with_keepalives(mut self, n: usize) -> Self {
        self.keepalives = n;
        self
    }

    /// Builder: finish with an end-stream error (`code`, `message`) instead of `{}`.
    pub fn with_end_error(mut self, code: &str, message: &str) -> Self {
        self.end_error = Some((code.to_owned(), message.to_owned()));
        self
    }
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub surface: Surface,
    pub method: String,
    /// Without the `/api` or `/{port}/{id}` prefix, with the query string.
    pub path: String,
    /// The sandbox id from the path (sandbox surfaces only), as the client sent it.
    pub sandbox_id: Option<String>,
    /// Lower-case names, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    /// The first value of a header (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// An alive (running or paused) sandbox, as [`Fake::sandboxes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxState {
    /// The id as the client sees it (composite for legacy Novita).
    pub id: String,
    pub api_key: String,
    pub template_id: String,
    /// `"running"` or `"paused"`.
    pub state: String,
    /// The timeout (seconds) last set by create, `/timeout` or connect.
    pub timeout_secs: u64,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub envd_access_token: Option<String>,
}

/// The fake cloud. Starting it spawns the server; dropping it stops the server and
/// every stream it is serving.
pub struct Fake {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fake")
            .field("addr", &self.addr)
            .field("provider", &self.inner.config.provider)
            .finish_non_exhaustive()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.inner.cancel.cancel();
    }
}

impl Fake {
    /// Bind `127.0.0.1:0` and serve. Panics if the listener cannot be bound.
    pub async fn start(config: FakeConfig) -> Fake {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("runbox-e2b-fake: cannot bind 127.0.0.1:0: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("runbox-e2b-fake: no local address: {e}"),
        };
        let inner = Arc::new(Inner::new(config));
        server::spawn(listener, inner.clone());
        Fake { inner, addr }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/api`: the control-plane base URL.
    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// `http://127.0.0.1:PORT/{port}/{sandbox_id}` (literal braces): the sandbox URL
    /// template.
    pub fn sandbox_url(&self) -> String {
        format!("http://{}/{{port}}/{{sandbox_id}}", self.addr)
    }

    /// What `/execute` streams for exactly this code (any sandbox, any context).
    /// Unscripted code streams an `error` line (`FakeError: no script for this code`).
    pub fn on_execute(&self, code: &str, reply: ExecReply) {
        self.inner
            .lock()
            .exec_scripts
            .insert(code.to_owned(), reply);
    }

    /// What `process.Process/Start` does for a command: matched on the last element of
    /// `args` when `cmd` is `/bin/bash` with args `["-l","-c",CMD]` (otherwise on `cmd`
    /// and `args` joined by spaces). Unscripted commands print
    /// `fake: no script for <cmd>` on stderr and exit 127.
    pub fn on_command(&self, command: &str, reply: CommandReply) {
        self.inner
            .lock()
            .cmd_scripts
            .insert(command.to_owned(), reply);
    }

    /// Queue a failure (see [`Fault`]).
    pub fn fail(&self, fault: Fault) {
        if fault.times > 0 {
            self.inner.lock().faults.push(fault);
        }
    }

    /// Every request, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().requests.clone()
    }

    /// Every protocol violation seen, each prefixed with its request line.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }

    /// Faults queued with [`Fake::fail`] that have not been used up.
    pub fn pending_faults(&self) -> Vec<Fault> {
        self.inner.lock().faults.clone()
    }

    /// Panics listing every violation and every fault not yet consumed.
    pub fn assert_clean(&self) {
        let st = self.inner.lock();
        if st.violations.is_empty() && st.faults.is_empty() {
            return;
        }
        let mut msg = String::from("runbox-e2b-fake is not clean:\n");
        for v in &st.violations {
            msg.push_str("  violation: ");
            msg.push_str(v);
            msg.push('\n');
        }
        for f in &st.faults {
            msg.push_str(&format!(
                "  unconsumed fault ({} left): {:?} {} *{} → {:?}\n",
                f.times,
                f.surface,
                f.method.as_ref().map(|m| m.as_str()).unwrap_or("ANY"),
                f.path_suffix,
                f.kind
            ));
        }
        drop(st);
        panic!("{msg}");
    }

    /// Alive (running or paused) sandboxes, in creation order.
    pub fn sandboxes(&self) -> Vec<SandboxState> {
        self.inner
            .lock()
            .sandboxes
            .iter()
            .filter(|s| s.life != state::Life::Gone)
            .map(|s| SandboxState {
                id: s.id.clone(),
                api_key: s.api_key.clone(),
                template_id: s.template_id.clone(),
                state: s.life.as_str().to_owned(),
                timeout_secs: s.timeout,
                metadata: s.metadata.clone(),
                env_vars: s.env_vars.clone(),
                envd_access_token: s.token.clone(),
            })
            .collect()
    }

    /// Every `/execute` that ran: (sandbox id as the client sees it, context id,
    /// language, execution count in that context).
    pub fn executions(&self) -> Vec<(String, String, String, u32)> {
        self.inner.lock().executions.clone()
    }

    /// A file's bytes in a sandbox's filesystem (relative paths resolve against
    /// `/home/user`). `None` when the sandbox or file is unknown, or it is a directory.
    pub fn file(&self, sandbox_id: &str, path: &str) -> Option<Vec<u8>> {
        let st = self.inner.lock();
        let sb = st.sandboxes.iter().find(|s| s.id == sandbox_id)?;
        let path = fs::resolve(path).ok()?;
        sb.fs.read(&path).ok().map(<[u8]>::to_vec)
    }

    /// Write a file into a sandbox's filesystem, creating parent directories. Panics if
    /// the sandbox is unknown or the path cannot hold a file.
    pub fn put_file(&self, sandbox_id: &str, path: &str, data: &[u8]) {
        let mut st = self.inner.lock();
        let Some(sb) = st.sandboxes.iter_mut().find(|s| s.id == sandbox_id) else {
            panic!("runbox-e2b-fake: put_file: no sandbox {sandbox_id:?}");
        };
        let result = fs::resolve(path).and_then(|p| sb.fs.write(&p, data.to_vec()).map(|_| ()));
        if let Err(e) = result {
            panic!("runbox-e2b-fake: put_file {path:?}: {}", e.message);
        }
    }

    /// Make the sandbox vanish as if it expired: later requests to it get 404 (control
    /// plane) or a proxy 502 whose text contains "was not found" (envd/interpreter);
    /// streams of its hanging processes are cut.
    pub fn expire(&self, sandbox_id: &str) {
        let mut st = self.inner.lock();
        if let Some(sb) = st.sandboxes.iter_mut().find(|s| s.id == sandbox_id) {
            sb.vanish();
        }
    }
}
