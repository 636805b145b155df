//! An rmcp client against `runbox serve`, over stdio or streamable HTTP, for the MCP tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use super::runbox_exe;

/// A client that records the progress notifications it receives (and the log messages
/// and resource updates).
#[derive(Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<(Instant, ProgressNotificationParam)>>>,
    /// `notifications/message` params, as JSON.
    pub logs: Arc<Mutex<Vec<Value>>>,
    /// URIs of `notifications/resources/updated`.
    pub updates: Arc<Mutex<Vec<String>>>,
    /// Wakes [`Recorder::wait_for`] when a notification arrives.
    pub arrived: Arc<tokio::sync::Notify>,
    /// Whether the client declares the tasks extension.
    pub tasks: bool,
}

impl Recorder {
    /// A recorder whose client declares the tasks extension (`io.modelcontextprotocol/tasks`).
    pub fn with_tasks() -> Self {
        Self {
            tasks: true,
            ..Self::default()
        }
    }

    /// Waits (up to `secs`) until `cond` holds of the recorder; panics saying `what` if not.
    pub async fn wait_for(&self, secs: u64, what: &str, cond: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let arrived = self.arrived.notified();
            if cond(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                assert!(
                    cond(self),
                    "{what}: not seen within {secs} s; logs {:?}, updates {:?}",
                    self.logs.lock().unwrap(),
                    self.updates.lock().unwrap()
                );
                return;
            }
        }
    }

    /// The log messages of event `event` (`sandbox_created`, ...) about `sandbox`.
    pub fn events(&self, event: &str, sandbox: &str) -> usize {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m["data"]["event"] == event && m["data"]["sandbox_id"] == sandbox)
            .count()
    }
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push((Instant::now(), params));
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        self.logs
            .lock()
            .unwrap()
            .push(serde_json::to_value(&params).unwrap());
        self.arrived.notify_waiters();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        self.updates.lock().unwrap().push(params.uri);
        self.arrived.notify_waiters();
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        if self.tasks {
            config.capabilities = rmcp::model::ClientCapabilities::builder()
                .enable_tasks()
                .build();
        }
        config
    }
}

pub type Client = RunningService<RoleClient, Recorder>;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Revision {
    Legacy,
    Stateless,
}

pub fn lifecycle(r: Revision) -> ClientLifecycleMode {
    match r {
        Revision::Legacy => ClientLifecycleMode::Initialize,
        Revision::Stateless => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    }
}

pub fn serve_command(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(runbox_exe());
    c.arg("serve")
        .args(args)
        .env("RUNBOX_INIT_EXE", runbox_exe())
        .env("RUNBOX_LOG", "warn");
    if let Some(p) = std::env::var_os("RUNBOX_CGROUP_PARENT") {
        c.env("RUNBOX_CGROUP_PARENT", p);
    }
    c
}

pub async fn stdio_client(args: &[&str], revision: Revision) -> (Client, Recorder) {
    stdio_client_with(args, revision, Recorder::default()).await
}

/// [`stdio_client`] with a recorder of the caller's (e.g. [`Recorder::with_tasks`]).
pub async fn stdio_client_with(
    args: &[&str],
    revision: Revision,
    recorder: Recorder,
) -> (Client, Recorder) {
    let mut all = vec!["--stdio"];
    all.extend_from_slice(args);
    let transport = TokioChildProcess::builder(serve_command(&all))
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
        .0;
    let client = recorder
        .clone()
        .serve_with_lifecycle(transport, lifecycle(revision))
        .await
        .unwrap();
    (client, recorder)
}

/// A running `runbox serve --http` on a free loopback port, its log kept (and echoed).
pub struct HttpServer {
    pub child: tokio::process::Child,
    pub url: String,
    pub base: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl HttpServer {
    pub async fn start(args: &[&str]) -> Self {
        let mut all = vec!["--http", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Self::spawn(serve_command(&all)).await
    }

    /// Starts `command`, a `runbox serve --http 127.0.0.1:0 ...`, and waits until it serves.
    pub async fn spawn(mut command: tokio::process::Command) -> Self {
        let mut child = command
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let id = child.id();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("server did not start")
                .unwrap()
                .expect("server exited");
            eprintln!("server {id:?}: {line}");
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.strip_prefix("runbox: serving MCP on ") {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        let kept = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("server {id:?}: {line}");
                kept.lock().unwrap().push(line);
            }
        });
        let base = url.trim_end_matches("/mcp").to_owned();
        Self {
            child,
            url,
            base,
            log,
        }
    }

    /// Everything the server wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub async fn client(&self, revision: Revision) -> (Client, Recorder) {
        self.client_with(revision, Recorder::default()).await
    }

    /// [`HttpServer::client`] with a recorder of the caller's (e.g. [`Recorder::with_tasks`]).
    pub async fn client_with(&self, revision: Revision, recorder: Recorder) -> (Client, Recorder) {
        let transport = StreamableHttpClientTransport::from_uri(self.url.clone());
        let client = recorder
            .clone()
            .serve_with_lifecycle(transport, lifecycle(revision))
            .await
            .unwrap();
        (client, recorder)
    }

    pub async fn stop(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap()
            .unwrap()
    }
}

impl HttpServer {
    /// `GET` of a path beside `/mcp` (`/healthz`, `/metrics`, ...), with no token.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        http()
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// `/healthz`, as JSON.
    pub async fn health(&self) -> Value {
        self.get("/healthz").await.json().await.unwrap()
    }

    /// `/metrics`, as text.
    pub async fn metrics(&self) -> String {
        let r = self.get("/metrics").await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }
}

/// An HTTP client for the server under test: loopback, never through the host's proxy.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `runbox token ARGS`: its stdout, after checking it succeeded.
pub fn token_cmd(args: &[&str]) -> String {
    let out = std::process::Command::new(runbox_exe())
        .arg("token")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "runbox token {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `runbox token add NAME --file FILE EXTRA...`: the new token, the last word of its output.
pub fn add_token(file: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["add", name, "--file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let stdout = token_cmd(&args);
    let token = stdout.split_whitespace().last().unwrap().to_owned();
    assert!(token.starts_with("rbx_"), "{stdout}");
    token
}

/// An MCP client over HTTP that sends `token` as its bearer token.
pub async fn client_with_token(url: &str, token: &str, revision: Revision) -> Client {
    recording_client_with_token(url, token, revision, Recorder::default()).await
}

/// [`client_with_token`] with a recorder of the caller's.
pub async fn recording_client_with_token(
    url: &str,
    token: &str,
    revision: Revision,
    recorder: Recorder,
) -> Client {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        )
        .auth_header(token);
    recorder
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(config),
            lifecycle(revision),
        )
        .await
        .unwrap()
}

/// Calls `tool` as a request the client could cancel (so that the server sends progress
/// for it); the answer, and when it came.
pub async fn call_with_progress(
    client: &Client,
    tool: &str,
    args: Value,
) -> (CallToolResult, Instant) {
    use rmcp::model::{CallToolRequest, ClientRequest, ServerResult};
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().unwrap().clone());
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            rmcp::service::PeerRequestOptions::default(),
        )
        .await
        .unwrap();
    let result = handle.await_response().await.unwrap();
    let done = Instant::now();
    let ServerResult::CallToolResult(result) = result else {
        panic!("unexpected {result:?}")
    };
    (result, done)
}

pub async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().unwrap().clone());
    client.call_tool(params).await.unwrap()
}

pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.clone())
        .collect()
}

pub fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

pub fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}
