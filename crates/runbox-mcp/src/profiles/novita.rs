//! `novita-tutorial`: the tools of the Novita sandbox tutorial's MCP server (seed
//! `000_b3755aa2b5a95fa0.txt`), whose agent runs data analysis in a sandbox it creates,
//! uses over several calls and stops. Usually served over streamable HTTP.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, GetPromptResult, PromptMessage, Role};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, prompt, prompt_router, tool, tool_router};
use runbox_core::{
    CommandRequest, Error, ExecOutcome, ExecRequest, Language, RichResult, SandboxId, Work,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ErrorBody, Logs, failure_summary, message, note_line, object_result, text_result};
use crate::server::RunboxServer;

/// Instructions sent to clients at initialisation.
pub(super) const INSTRUCTIONS: &str = "This server runs Python code and shell commands in \
isolated sandboxes. Read the prompt instructions_for_sandbox_use first. Call \
create_sandbox_session, then pass the sandbox ID it returns to run_python_code and \
run_on_command_line: variables, imports and files persist in that sandbox between calls. \
Call stop_sandbox_session with the ID when you are done.";

/// What to do about a sandbox id that names no sandbox, in this profile's words.
const NOT_FOUND_HINT: &str = "Call create_sandbox_session for a new sandbox and use its ID.";

/// Arguments of `stop_sandbox_session`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct SandboxIdArgs {
    /// The ID of the sandbox, from create_sandbox_session.
    pub sandbox_id: String,
}

/// Arguments of `run_python_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct RunPythonCodeArgs {
    /// The python code to run.
    pub python_code: String,
    /// The ID of the sandbox, from create_sandbox_session.
    pub sandbox_id: String,
}

/// Arguments of `run_on_command_line`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct RunOnCommandLineArgs {
    /// The command to run.
    pub command_line: String,
    /// The ID of the sandbox, from create_sandbox_session.
    pub sandbox_id: String,
}

/// One of a cell's results, as the E2B SDK's `Result` names its formats. Results with an
/// image are left out, as the tutorial's server leaves them out.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
struct OutputOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    markdown: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    svg: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latex: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    json: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    javascript: Option<Value>,
    /// Other representations, by MIME type.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    extra: BTreeMap<String, Value>,
    is_main_result: bool,
}

/// Image representations: a result carrying one is left out of `outputs`.
const IMAGES: [&str; 2] = ["image/png", "image/jpeg"];

impl OutputOut {
    fn of(r: &RichResult) -> Option<Self> {
        if IMAGES.iter().any(|m| r.data.contains_key(*m)) {
            return None;
        }
        let mut out = Self {
            is_main_result: r.is_main_result,
            ..Default::default()
        };
        for (mime, v) in &r.data {
            let slot = match mime.as_str() {
                "text/plain" => &mut out.text,
                "text/html" => &mut out.html,
                "text/markdown" => &mut out.markdown,
                "image/svg+xml" => &mut out.svg,
                "text/latex" => &mut out.latex,
                "application/json" => &mut out.json,
                "application/javascript" => &mut out.javascript,
                _ => {
                    out.extra.insert(mime.clone(), v.clone());
                    continue;
                }
            };
            *slot = Some(v.clone());
        }
        Some(out)
    }
}

/// The answer of `run_python_code`.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct PythonAnswer {
    outputs: Vec<OutputOut>,
    logs: Logs,
    error: Option<ErrorBody>,
}

impl PythonAnswer {
    fn of(outcome: &ExecOutcome) -> Self {
        Self {
            outputs: outcome.results.iter().filter_map(OutputOut::of).collect(),
            logs: Logs::of(outcome),
            error: ErrorBody::of(outcome),
        }
    }
}

/// `output` of `run_on_command_line`'s answer: the E2B SDK's `CommandResult`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CommandOut {
    stdout: String,
    stderr: String,
    exit_code: Option<i64>,
    /// Why the command did not succeed (`exit status N`, a timeout), or null.
    error: Option<String>,
}

/// The answer of `run_on_command_line`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CommandAnswer {
    output: Option<CommandOut>,
    /// Why the command could not be run at all, or null.
    #[serde(rename = "execution error")]
    execution_error: Option<String>,
}

impl CommandAnswer {
    fn of(outcome: &ExecOutcome) -> Self {
        let error = failure_summary(outcome);
        let mut stderr = outcome.stderr.clone();
        // Notes that are not already the error (output cut to fit) go after stderr.
        if !(outcome.timed_out || outcome.cancelled) {
            for n in &outcome.notes {
                stderr.push_str(&note_line(n));
            }
        }
        Self {
            output: Some(CommandOut {
                stdout: outcome.stdout.clone(),
                stderr,
                exit_code: outcome.exit_code.map(i64::from),
                error,
            }),
            execution_error: None,
        }
    }
}

#[tool_router(router = novita_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        name = "create_sandbox_session",
        description = "This will create a sandbox instance and return a success message with the \
                       sandbox id, or an error message. Pass the id to run_python_code and \
                       run_on_command_line, and stop the sandbox with stop_sandbox_session when \
                       done."
    )]
    async fn novita_create_sandbox_session(
        &self,
        Extension(caller): Extension<Caller>,
    ) -> CallToolResult {
        let request = self.package_sandbox_request(&caller).await;
        match self.registry().create(&caller.tenant, request).await {
            Ok((view, _)) => text_result(
                format!("Successfully created sandbox. Sandbox ID: {}", view.id),
                false,
            ),
            Err(e) => {
                let hint = match e {
                    Error::LimitReached(_) => {
                        " Stop sandboxes you no longer need with stop_sandbox_session."
                    }
                    _ => "",
                };
                text_result(
                    format!(
                        "Failed to create new sandbox: {}{hint}",
                        runbox_core::chain(&e)
                    ),
                    true,
                )
            }
        }
    }

    #[tool(
        name = "stop_sandbox_session",
        description = "This will kill a sandbox instance if it exists: every process in it is \
                       stopped and its files are deleted."
    )]
    async fn novita_stop_sandbox_session(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SandboxIdArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        match self.registry().close(&caller.tenant, &id).await {
            Ok(()) => text_result(format!("Successfully killed Sandbox ID: {id}"), false),
            Err(e) => text_result(
                format!(
                    "Failed to kill Sandbox ID: {id}\n {}",
                    runbox_core::chain(&e)
                ),
                true,
            ),
        }
    }

    #[tool(
        name = "run_python_code",
        description = "Runs the python code on the sandbox, and if there are any image outputs \
                       they are skipped. Variables and imports persist between calls in the same \
                       sandbox. Returns a JSON object with outputs (the cell's results: the value \
                       of the last expression and display() calls), logs (stdout and stderr) and \
                       error (name, value and traceback of an uncaught exception, or null)."
    )]
    async fn novita_run_python_code(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<RunPythonCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let answer = match self.run_timeout(None) {
            Ok(timeout) => {
                let req = ExecRequest::new(Language::Python, args.python_code, timeout);
                self.run(&caller, Some(args.sandbox_id), Work::Code(req), &ctx)
                    .await
                    .map(|ran| ran.outcome)
            }
            Err(e) => Err(e),
        };
        match answer {
            Ok(outcome) => object_result(&PythonAnswer::of(&outcome), !outcome.succeeded(), true),
            Err(e) => {
                let answer = PythonAnswer {
                    outputs: Vec::new(),
                    logs: Logs::default(),
                    error: Some(ErrorBody::failure(&e, NOT_FOUND_HINT)),
                };
                object_result(&answer, true, true)
            }
        }
    }

    #[tool(
        name = "run_on_command_line",
        description = "Runs the command on the sandbox (bash, in /workspace). Returns a JSON \
                       object with output (stdout, stderr, exit_code, and error: why the command \
                       failed, or null) and \"execution error\" (why the command could not be run \
                       at all, or null)."
    )]
    async fn novita_run_on_command_line(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<RunOnCommandLineArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let answer = match self.run_timeout(None) {
            Ok(timeout) => {
                let req = CommandRequest::new(args.command_line, timeout);
                self.run(&caller, Some(args.sandbox_id), Work::Command(req), &ctx)
                    .await
                    .map(|ran| ran.outcome)
            }
            Err(e) => Err(e),
        };
        match answer {
            Ok(outcome) => object_result(&CommandAnswer::of(&outcome), !outcome.succeeded(), true),
            Err(e) => object_result(
                &CommandAnswer {
                    output: None,
                    execution_error: Some(message(&e, NOT_FOUND_HINT)),
                },
                true,
                true,
            ),
        }
    }
}

#[prompt_router(router = "novita_prompts", vis = "pub(crate)")]
impl RunboxServer {
    #[prompt(
        name = "instructions_for_sandbox_use",
        description = "RETURNS MUST READ INSTRUCTIONS FOR SANDBOX USE."
    )]
    async fn novita_instructions_for_sandbox_use(&self) -> GetPromptResult {
        let idle = self.registry().config().default_idle_timeout.as_secs();
        let install = if self.settings().package_network.get().await {
            " (the sandbox reaches the package indexes this server allows, nothing else)"
        } else {
            " (this server gives sandboxes no network access, so an install fails: use what is \
             installed)"
        };
        let mut text = format!(
            "When you want to use the sandbox, you must first create a new sandbox session by \
             calling the create_sandbox_session() function; it answers with the sandbox ID.\n\
             Then you can use the run_python_code() or run_on_command_line() function, with that \
             sandbox ID, to run on the sandbox. Variables, imports and files persist between \
             calls in the same sandbox, so build on earlier steps instead of repeating them.\n\
             When you are done, you must kill the sandbox session by calling the \
             stop_sandbox_session() function with the sandbox ID. A sandbox left idle for {idle} \
             seconds is killed automatically.\n\n\
             Note:\n\
             - The sandbox comes with the Python packages installed on this server. If you are \
             not sure a package exists, or your code had an import error due to a missing \
             package, check whether it is installed with run_on_command_line(\"pip show NAME\"), \
             and if not install it with run_on_command_line(\"pip install NAME\"){install}.\n\
             - The working directory is /workspace; files written there stay until the sandbox \
             is killed."
        );
        if let Some(data) = self.data_catalog() {
            let files = data.files();
            text.push_str(
                "\n- The user's data files are in /data (read-only) in every sandbox, and are \
                 also resources data://NAME (the file name without its extension)",
            );
            if files.is_empty() {
                text.push_str("; there are none now.");
            } else {
                text.push_str(":\n");
                for f in files.iter().take(50) {
                    let _ = writeln!(text, "  - /data/{} ({})", f.relative, f.uri());
                }
                if files.len() > 50 {
                    let _ = writeln!(text, "  - and {} more", files.len() - 50);
                }
            }
        }
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description("Must-read instructions for sandbox use")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_answers_have_the_tutorials_shape() {
        let outcome = ExecOutcome {
            stdout: "hello\n".into(),
            results: vec![
                RichResult {
                    data: [
                        ("text/plain".to_owned(), json!("<Figure>")),
                        ("image/png".to_owned(), json!("iVBOR")),
                    ]
                    .into(),
                    is_main_result: false,
                },
                RichResult {
                    data: [
                        ("text/plain".to_owned(), json!("   a\n0  1")),
                        ("text/html".to_owned(), json!("<table/>")),
                        ("application/vnd.custom".to_owned(), json!("x")),
                    ]
                    .into(),
                    is_main_result: true,
                },
            ],
            ..Default::default()
        };
        let v = serde_json::to_value(PythonAnswer::of(&outcome)).unwrap();
        assert_eq!(
            v,
            json!({
                "outputs": [{
                    "text": "   a\n0  1",
                    "html": "<table/>",
                    "extra": {"application/vnd.custom": "x"},
                    "is_main_result": true,
                }],
                "logs": {"stdout": ["hello\n"], "stderr": []},
                "error": null,
            })
        );
        // The text block keeps the tutorial's order of fields.
        let text = super::super::json_text(&PythonAnswer::of(&outcome));
        let at = |k: &str| text.find(k).unwrap();
        assert!(at("\"outputs\"") < at("\"logs\"") && at("\"logs\"") < at("\"error\""));
    }

    #[test]
    fn command_answers_have_the_tutorials_shape() {
        let ok = CommandAnswer::of(&ExecOutcome {
            stdout: "hi\n".into(),
            exit_code: Some(0),
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_value(ok).unwrap(),
            json!({
                "output": {"stdout": "hi\n", "stderr": "", "exit_code": 0, "error": null},
                "execution error": null,
            })
        );
        let failed = CommandAnswer::of(&ExecOutcome {
            stderr: "no\n".into(),
            exit_code: Some(3),
            ..Default::default()
        });
        let v = serde_json::to_value(failed).unwrap();
        assert_eq!(v["output"]["error"], "exit status 3");
        assert_eq!(v["output"]["exit_code"], 3);
    }
}
