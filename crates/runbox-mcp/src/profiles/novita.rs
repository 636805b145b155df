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
    CommandRequest, ExecOutcome, ExecRequest, Language, RichResult, SandboxId, Work,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    ErrorBody, Logs, Words, message, note_line, object_result, str_result, str_result_schema,
};
use crate::server::RunboxServer;

/// Instructions sent to clients at initialisation.
pub(super) const INSTRUCTIONS: &str = "This server runs Python code and shell commands in \
isolated sandboxes. Read the prompt instructions_for_sandbox_use first. Call \
create_sandbox_session, then pass the sandbox ID it returns to run_python_code and \
run_on_command_line: variables, imports and files persist in that sandbox between calls. \
Call stop_sandbox_session with the ID when you are done.";

/// What to tell a caller, in this profile's tools' names.
pub(super) const WORDS: Words = Words {
    not_found: "Call create_sandbox_session for a new sandbox and use its ID.",
    close_one: "Stop one you no longer need with stop_sandbox_session.",
};

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

/// The answer of `run_python_code` when the code could not be run at all (the tutorial's
/// `except Exception as e: return {"error": str(e)}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct PythonFailure {
    error: String,
}

/// `output` of `run_on_command_line`'s answer: the E2B SDK's `CommandResult`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CommandOut {
    stdout: String,
    stderr: String,
    exit_code: Option<i64>,
    /// The SDK's error of a command that ran: always null here, since a command that did
    /// not succeed answers with `"execution error"` instead.
    error: Option<String>,
}

/// The answer of `run_on_command_line`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CommandAnswer {
    output: Option<CommandOut>,
    /// Why the command failed or could not be run at all, or null.
    #[serde(rename = "execution error")]
    execution_error: Option<String>,
}

impl CommandAnswer {
    /// The tutorial's answer for a command that ran. The SDK's `commands.run` raises for a
    /// command that exits non-zero, and the tutorial answers with the exception's text:
    /// `{"output": null, "execution error": "Command exited with code N and error:\n<stderr>"}`.
    /// A command stopped by its timeout or a cancellation answers the same way, with
    /// runbox's note as the text.
    fn of(outcome: &ExecOutcome) -> Self {
        let mut stderr = outcome.stderr.clone();
        if outcome.timed_out || outcome.cancelled {
            return Self::failed(outcome.notes.join(" "));
        }
        if let Some(code) = outcome.exit_code.filter(|c| *c != 0) {
            for n in &outcome.notes {
                stderr.push_str(&note_line(n));
            }
            return Self::failed(format!(
                "Command exited with code {code} and error:\n{stderr}"
            ));
        }
        // Notes (output cut to fit) go after stderr.
        for n in &outcome.notes {
            stderr.push_str(&note_line(n));
        }
        Self {
            output: Some(CommandOut {
                stdout: outcome.stdout.clone(),
                stderr,
                exit_code: Some(i64::from(outcome.exit_code.unwrap_or(0))),
                error: None,
            }),
            execution_error: None,
        }
    }

    fn failed(why: String) -> Self {
        Self {
            output: None,
            execution_error: Some(why),
        }
    }
}

#[tool_router(router = novita_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        name = "create_sandbox_session",
        output_schema = str_result_schema("create_sandbox_session"),
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
            Ok((view, _)) => str_result(format!(
                "Successfully created sandbox. Sandbox ID: {}",
                view.id
            )),
            Err(e) => str_result(format!(
                "Failed to create new sandbox: {}",
                message(&e, &WORDS)
            )),
        }
    }

    #[tool(
        name = "stop_sandbox_session",
        output_schema = str_result_schema("stop_sandbox_session"),
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
            Ok(()) => str_result(format!("Successfully killed Sandbox ID: {id}")),
            Err(e) => str_result(format!(
                "Failed to kill Sandbox ID: {id}\n {}",
                message(&e, &WORDS)
            )),
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
            Ok(outcome) => object_result(&PythonAnswer::of(&outcome), false),
            Err(e) => object_result(
                &PythonFailure {
                    error: message(&e, &WORDS),
                },
                false,
            ),
        }
    }

    #[tool(
        name = "run_on_command_line",
        description = "Runs the command on the sandbox (bash, in /workspace). Returns a JSON \
                       object with output (stdout, stderr, exit_code and error) and \"execution \
                       error\": null when the command succeeded; when it exited non-zero or could \
                       not run, output is null and \"execution error\" says why (\"Command exited \
                       with code N and error:\" and its stderr)."
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
            Ok(outcome) => object_result(&CommandAnswer::of(&outcome), false),
            Err(e) => object_result(&CommandAnswer::failed(message(&e, &WORDS)), false),
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
        // The SDK raises for a non-zero exit; the tutorial answers with the exception's text.
        let failed = CommandAnswer::of(&ExecOutcome {
            stdout: "lost\n".into(),
            stderr: "no\n".into(),
            exit_code: Some(3),
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_value(failed).unwrap(),
            json!({
                "output": null,
                "execution error": "Command exited with code 3 and error:\nno\n",
            })
        );
        let timed_out = CommandAnswer::of(&ExecOutcome {
            exit_code: Some(124),
            timed_out: true,
            notes: vec!["The command exceeded its timeout of 1 s and was stopped.".into()],
            ..Default::default()
        });
        let v = serde_json::to_value(timed_out).unwrap();
        assert!(v["output"].is_null(), "{v}");
        assert!(
            v["execution error"].as_str().unwrap().contains("timeout"),
            "{v}"
        );
    }
}
