//! `mcp-code-sandbox`: the E2B-backed MCP Code Sandbox server (seed
//! `002_f3a2251ae7be6053.txt`), whose sandboxes are named by the caller (`session_id`) and
//! which runs Python, installs packages and moves files. Usually served over stdio.
//!
//! Sessions map to runbox sandboxes per tenant in the server's shared state. Paths are
//! inside the sandbox: `/` is its home, `/workspace`; `/workspace/...`, `/tmp/...` and the
//! operator's read-only `/data/...` are taken as they are, any other absolute path is under
//! `/workspace`, and relative paths start there. Nothing ever names a host path. A path in
//! an answer is the sandbox's own, one code can open: `upload_file` of `data.csv` to `/`
//! answers `/workspace/data.csv`, and `list_files` of `/` answers for `/workspace`.
//!
//! As in the original, every failure is an answer in ordinary content (`{"error": ...}`, a
//! `Failed to ...` text), never `isError`.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use std::collections::HashSet;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use runbox_core::{
    Error, ExecContext, ExecOutcome, ExecRequest, FileKind, InstallRequest, Language,
    PackageManager, SandboxId, Work,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ErrorBody, Logs, Words, failure_summary, message, object_result, text_result};
use crate::render;
use crate::server::RunboxServer;

/// Instructions sent to clients at initialisation.
pub(super) const INSTRUCTIONS: &str = "This server runs Python code in isolated sandboxes that \
you name. Call create_sandbox with a session_id of your choice, then pass the same session_id \
to execute_code, install_package and the file tools (list_files, read_file, write_file, \
upload_file); variables, imports and files persist in that sandbox. Call close_sandbox when \
done. create_run_close runs one snippet in a sandbox made for it and closed after. Paths are \
inside the sandbox: / is its working directory (/workspace).";

/// The sandbox's home, which `/` means in this profile.
const HOME: &str = "/workspace";

/// What to tell a caller, in this profile's tools' names.
pub(super) const WORDS: Words = Words {
    not_found: "Create it again with create_sandbox.",
    close_one: "Close one you no longer need with close_sandbox.",
};

fn root() -> String {
    "/".to_owned()
}

/// Arguments naming a session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct SessionArgs {
    /// The unique identifier for the sandbox session, chosen by you at create_sandbox.
    pub session_id: String,
}

/// Arguments of `get_sandbox_status`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct StatusArgs {
    /// A session to get the status of; without it, every active session is listed.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// Arguments of `execute_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ExecuteCodeArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The Python code to execute.
    pub code: String,
}

/// Arguments of `install_package`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct InstallPackageArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The name of the Python package to install (a pip requirement such as `requests` or
    /// `requests==2.32.3`).
    pub package_name: String,
}

/// Arguments of `create_run_close`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct CreateRunCloseArgs {
    /// The Python code to execute.
    pub code: String,
}

/// Arguments of `list_files`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(crate) struct ListFilesArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The directory path to list files from (default: the root directory, /workspace).
    #[serde(default = "root")]
    pub path: String,
}

/// Arguments of `read_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ReadFileArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The path to the file to read.
    pub file_path: String,
}

/// Arguments of `write_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct WriteFileArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The path to the file to write; missing parent directories are created.
    pub file_path: String,
    /// The content to write to the file.
    pub content: String,
}

/// Arguments of `upload_file`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(crate) struct UploadFileArgs {
    /// The unique identifier for the sandbox session.
    pub session_id: String,
    /// The name of the file to create.
    pub file_name: String,
    /// The content of the file.
    pub file_content: String,
    /// The directory where the file should be created (default: the root directory,
    /// /workspace).
    #[serde(default = "root")]
    pub destination_path: String,
}

/// An answer that is only an error, as the seed's tools answer when they cannot do their job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ErrorAnswer {
    error: String,
}

fn error_answer(message: impl Into<String>) -> CallToolResult {
    object(&ErrorAnswer {
        error: message.into(),
    })
}

/// A JSON object answer; `structuredContent` carries it too, as the seed's dictionaries do.
fn object<T: Serialize>(body: &T) -> CallToolResult {
    object_result(body, true)
}

fn no_session(session: &str) -> String {
    format!("No sandbox found with session ID: {session}. Create a sandbox first.")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct SessionStatus {
    status: String,
    session_id: String,
    /// The original's `INTERPRETER_TYPE`; here the backend sandboxes run on (`local`, `e2b`).
    interpreter_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct AllStatus {
    active_sandbox_count: usize,
    active_sessions: Vec<String>,
    interpreter_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ExecuteAnswer {
    logs: Logs,
    error: Option<ErrorBody>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct InstallAnswer {
    package: String,
    output: Logs,
    /// Why the install failed, or null.
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CreateRunCloseAnswer {
    logs: Logs,
    error: Option<ErrorBody>,
    sandbox_status: String,
    sandbox_closed: bool,
    sandbox_removed: bool,
}

/// A directory entry, as the E2B SDK's `EntryInfo` names its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct EntryOut {
    name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: u64,
    modified_time: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ListAnswer {
    path: String,
    files: Vec<EntryOut>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ReadAnswer {
    path: String,
    content: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct WriteAnswer {
    path: String,
    message: String,
}

/// A path of this profile as the sandbox names it: `/` is `/workspace`.
fn sandbox_path(path: &str) -> String {
    let path = path.trim();
    if path.is_empty() || path.chars().all(|c| c == '/') {
        return HOME.to_owned();
    }
    let Some(rest) = path.strip_prefix('/') else {
        return format!("{HOME}/{path}");
    };
    for area in [HOME, "/tmp", "/data"] {
        if path == area || path.strip_prefix(area).is_some_and(|r| r.starts_with('/')) {
            return path.to_owned();
        }
    }
    format!("{HOME}/{rest}")
}

/// `destination_path` joined with `file_name`, absolute, as the seed joins them.
fn upload_path(destination: &str, file_name: &str) -> String {
    let joined = if file_name.starts_with('/') || destination.is_empty() {
        file_name.to_owned()
    } else {
        format!("{}/{file_name}", destination.trim_end_matches('/'))
    };
    if joined.starts_with('/') {
        joined
    } else {
        format!("/{joined}")
    }
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Directory => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// A package name pip takes as one requirement, never as an option.
fn check_package(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("package_name is empty; give the name of a Python package".into());
    }
    if name.starts_with('-') {
        return Err(format!(
            "package_name {name:?} looks like an option; give the name of a Python package"
        ));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "package_name {name:?} contains spaces or control characters; install one package per call"
        ));
    }
    Ok(())
}

impl RunboxServer {
    /// The sandbox of one of the caller's sessions.
    fn session_sandbox(&self, tenant: &str, session: &str) -> Result<SandboxId, String> {
        self.sessions()
            .get(tenant, session)
            .ok_or_else(|| no_session(session))
    }

    /// Forgets the session when `e` says its sandbox is gone (it expired), and words the
    /// error: `what` (the original's `Error reading file: ...`) and the message, or the
    /// original's answer for a session that does not exist.
    fn session_error(&self, tenant: &str, session: &str, what: &str, e: &Error) -> String {
        if matches!(e, Error::SandboxNotFound { .. }) {
            self.sessions().forget(tenant, session);
            return no_session(session);
        }
        format!("{what}: {}", message(e, &WORDS))
    }

    /// The original's `INTERPRETER_TYPE`: here, the backend's name.
    fn interpreter_type(&self) -> String {
        self.registry().backend().name().to_owned()
    }

    /// Forgets sessions whose sandbox expired or was closed.
    fn prune_sessions(&self, tenant: &str) {
        let live: HashSet<SandboxId> = self
            .registry()
            .list(tenant)
            .into_iter()
            .map(|v| v.id)
            .collect();
        self.sessions().prune(tenant, &live);
    }
}

#[tool_router(router = mcp_code_sandbox_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        name = "create_sandbox",
        description = "Create a new sandbox environment for code execution, named by session_id \
                       (a unique identifier you choose and pass to the other tools). Fails if \
                       that session exists."
    )]
    async fn mcs_create_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SessionArgs>,
    ) -> CallToolResult {
        let session = args.session_id;
        if session.is_empty() {
            return text_result(
                "Failed to create sandbox: session_id is empty; choose a name for the session.",
            );
        }
        self.prune_sessions(&caller.tenant);
        let Some(reservation) = self.sessions().reserve(&caller.tenant, &session) else {
            return text_result(format!("Sandbox with session ID {session} already exists."));
        };
        let request = self.package_sandbox_request(&caller).await;
        match self.registry().create(&caller.tenant, request).await {
            Ok((view, _)) => {
                reservation.fill(view.id);
                text_result(format!(
                    "Sandbox created successfully with session ID: {session}"
                ))
            }
            Err(e) => {
                drop(reservation);
                text_result(format!("Failed to create sandbox: {}", message(&e, &WORDS)))
            }
        }
    }

    #[tool(
        name = "close_sandbox",
        description = "Close and clean up a sandbox environment: every process in it is stopped \
                       and its files are deleted."
    )]
    async fn mcs_close_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SessionArgs>,
    ) -> CallToolResult {
        let session = args.session_id;
        let Some(id) = self.sessions().take(&caller.tenant, &session) else {
            // As the seed answers: not an error, so a client does not retry.
            return text_result(format!(
                "Sandbox with session ID {session} is not active or has already been closed."
            ));
        };
        match self.registry().close(&caller.tenant, &id).await {
            Ok(()) | Err(Error::SandboxNotFound { .. }) => text_result(format!(
                "Sandbox with session ID {session} has been successfully closed and all \
                 resources freed."
            )),
            Err(e) => text_result(format!(
                "Sandbox with session ID {session} has been removed from active sessions, but \
                 closing it failed: {}",
                message(&e, &WORDS)
            )),
        }
    }

    #[tool(
        name = "get_sandbox_status",
        description = "Get status information about sandboxes: one session's status with \
                       session_id, or the number and names of the active sessions without it."
    )]
    async fn mcs_get_sandbox_status(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<StatusArgs>,
    ) -> CallToolResult {
        self.prune_sessions(&caller.tenant);
        match args.session_id {
            Some(session) => {
                let id = match self.session_sandbox(&caller.tenant, &session) {
                    Ok(id) => id,
                    Err(_) => {
                        return error_answer(format!(
                            "No sandbox found with session ID: {session}"
                        ));
                    }
                };
                match self.registry().status(&caller.tenant, &id).await {
                    Ok((view, _)) => object(&SessionStatus {
                        status: match view.state {
                            runbox_core::SandboxState::Running => "active".into(),
                            s => render::state_name(s).into(),
                        },
                        session_id: session,
                        interpreter_type: self.interpreter_type(),
                    }),
                    Err(Error::SandboxNotFound { .. }) => {
                        self.sessions().forget(&caller.tenant, &session);
                        error_answer(format!("No sandbox found with session ID: {session}"))
                    }
                    Err(e) => error_answer(format!(
                        "Error getting sandbox status: {}",
                        message(&e, &WORDS)
                    )),
                }
            }
            None => {
                let active_sessions = self.sessions().names(&caller.tenant);
                object(&AllStatus {
                    active_sandbox_count: active_sessions.len(),
                    active_sessions,
                    interpreter_type: self.interpreter_type(),
                })
            }
        }
    }

    #[tool(
        name = "execute_code",
        description = "Execute Python code in the sandbox environment. Variables and imports \
                       persist between calls in the same session. Returns logs (stdout and \
                       stderr as lists of lines) and error (name, value and traceback of an \
                       uncaught exception, or null)."
    )]
    async fn mcs_execute_code(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ExecuteCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        let timeout = match self.run_timeout(None) {
            Ok(t) => t,
            Err(e) => {
                return error_answer(format!("Error executing code: {}", message(&e, &WORDS)));
            }
        };
        let req = ExecRequest::new(Language::Python, args.code, timeout);
        match self
            .run(&caller, Some(id.to_string()), Work::Code(req), &ctx)
            .await
        {
            Ok(ran) => object(&ExecuteAnswer {
                logs: Logs::of(&ran.outcome),
                error: ErrorBody::of(&ran.outcome),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error executing code",
                &e,
            )),
        }
    }

    #[tool(
        name = "install_package",
        description = "Install a Python package in the sandbox with pip. package_name is one \
                       requirement (a name, optionally with a version), passed to pip as an \
                       argument, never as shell text."
    )]
    async fn mcs_install_package(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<InstallPackageArgs>,
    ) -> CallToolResult {
        let package = args.package_name;
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        if let Err(m) = check_package(&package) {
            return error_answer(format!("Error installing package: {m}."));
        }
        let req = InstallRequest {
            manager: PackageManager::Pip,
            packages: vec![package.clone()],
            timeout: self.settings().max_run_timeout,
        };
        match self
            .registry()
            .install(&caller.tenant, &id, req, ExecContext::default())
            .await
        {
            Ok(outcome) => object(&InstallAnswer {
                package: package.clone(),
                output: Logs::of(&outcome),
                error: failure_summary(&outcome),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error installing package",
                &e,
            )),
        }
    }

    #[tool(
        name = "create_run_close",
        description = "Create a sandbox, run Python code, and close the sandbox in one operation: \
                       for one-off code executions. Returns logs, error, sandbox_status and \
                       sandbox_closed."
    )]
    async fn mcs_create_run_close(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<CreateRunCloseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let failed = |e: &Error| error_answer(format!("Operation failed: {}", message(e, &WORDS)));
        let timeout = match self.run_timeout(None) {
            Ok(t) => t,
            Err(e) => return failed(&e),
        };
        let req = ExecRequest::new(Language::Python, args.code, timeout);
        let sandbox = self.package_sandbox_request(&caller).await;
        match self
            .run_fresh(&caller, sandbox, Work::Code(req), &ctx)
            .await
        {
            Ok(ran) => {
                let outcome: &ExecOutcome = &ran.outcome;
                object(&CreateRunCloseAnswer {
                    logs: Logs::of(outcome),
                    error: ErrorBody::of(outcome),
                    sandbox_status: "created and will be closed automatically".into(),
                    sandbox_closed: ran.ephemeral,
                    sandbox_removed: ran.ephemeral,
                })
            }
            Err(e) => failed(&e),
        }
    }

    #[tool(
        name = "list_files",
        description = "List files in the sandbox at the specified path (default: the root \
                       directory, which is the sandbox's working directory /workspace)."
    )]
    async fn mcs_list_files(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> CallToolResult {
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        let path = sandbox_path(&args.path);
        match self
            .registry()
            .list_files(&caller.tenant, &id, &path, false)
            .await
        {
            Ok(listing) => object(&ListAnswer {
                path,
                files: listing
                    .entries
                    .into_iter()
                    .map(|e| EntryOut {
                        name: e.name,
                        kind: kind_name(e.kind),
                        path: e.path,
                        size: e.size,
                        modified_time: render::rfc3339(e.modified),
                    })
                    .collect(),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error listing files",
                &e,
            )),
        }
    }

    #[tool(
        name = "read_file",
        description = "Read the contents of a file in the sandbox, as text."
    )]
    async fn mcs_read_file(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> CallToolResult {
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        let most = self.read_budget();
        match self
            .registry()
            .read_file(
                &caller.tenant,
                &id,
                &sandbox_path(&args.file_path),
                0,
                Some(most),
            )
            .await
        {
            Ok(c) if c.more() => error_answer(format!(
                "Error reading file: {} is {} bytes, more than the {most} bytes this tool returns; \
                 process it with execute_code instead.",
                c.path, c.size
            )),
            Ok(c) => object(&ReadAnswer {
                path: c.path,
                content: String::from_utf8_lossy(&c.data).into_owned(),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error reading file",
                &e,
            )),
        }
    }

    #[tool(
        name = "write_file",
        description = "Write content to a file in the sandbox, replacing it if it exists and \
                       creating missing parent directories. Answers with the file's path in the \
                       sandbox, as code opens it."
    )]
    async fn mcs_write_file(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<WriteFileArgs>,
    ) -> CallToolResult {
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        match self
            .registry()
            .write_file(
                &caller.tenant,
                &id,
                &sandbox_path(&args.file_path),
                args.content.into_bytes(),
                false,
            )
            .await
        {
            Ok(w) => object(&WriteAnswer {
                path: w.path,
                message: "File written successfully".into(),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error writing file",
                &e,
            )),
        }
    }

    #[tool(
        name = "upload_file",
        description = "Upload a file to the sandbox: file_content is written to file_name in \
                       destination_path (default: the root directory, /workspace). Answers with \
                       the file's path in the sandbox, as code opens it."
    )]
    async fn mcs_upload_file(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<UploadFileArgs>,
    ) -> CallToolResult {
        let id = match self.session_sandbox(&caller.tenant, &args.session_id) {
            Ok(id) => id,
            Err(m) => return error_answer(m),
        };
        if args.file_name.trim().is_empty() {
            return error_answer("Error uploading file: file_name is empty.");
        }
        let path = sandbox_path(&upload_path(&args.destination_path, &args.file_name));
        match self
            .registry()
            .write_file(
                &caller.tenant,
                &id,
                &path,
                args.file_content.into_bytes(),
                false,
            )
            .await
        {
            Ok(w) => object(&WriteAnswer {
                path: w.path,
                message: "File uploaded successfully".into(),
            }),
            Err(e) => error_answer(self.session_error(
                &caller.tenant,
                &args.session_id,
                "Error uploading file",
                &e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_is_the_sandbox_home() {
        for (given, sandbox) in [
            ("/", "/workspace"),
            ("", "/workspace"),
            ("//", "/workspace"),
            ("/data.csv", "/workspace/data.csv"),
            ("out/a.txt", "/workspace/out/a.txt"),
            ("/workspace", "/workspace"),
            ("/workspace/a", "/workspace/a"),
            ("/workspaces/a", "/workspace/workspaces/a"),
            ("/tmp/x", "/tmp/x"),
            ("/data/sales.csv", "/data/sales.csv"),
            ("/etc/passwd", "/workspace/etc/passwd"),
        ] {
            assert_eq!(sandbox_path(given), sandbox, "{given}");
        }
    }

    #[test]
    fn uploads_join_the_destination_and_the_name() {
        assert_eq!(upload_path("/", "a.txt"), "/a.txt");
        assert_eq!(upload_path("/out/", "a.txt"), "/out/a.txt");
        assert_eq!(upload_path("out", "a.txt"), "/out/a.txt");
        assert_eq!(upload_path("", "a.txt"), "/a.txt");
        assert_eq!(upload_path("/out", "/b.txt"), "/b.txt");
    }

    #[test]
    fn package_names_are_never_options() {
        assert!(check_package("requests==2.32.3").is_ok());
        assert!(check_package("--index-url=http://evil").is_err());
        assert!(check_package("a b").is_err());
        assert!(check_package("").is_err());
    }
}
