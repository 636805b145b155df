//! `code-sandbox-mcp`: philschmid's code-sandbox-mcp (seed `001_54c0b058fd5d43b8.txt`), a
//! stdio server (the Python SDK's FastMCP) whose two tools run a snippet in a fresh sandbox
//! each and answer with its output, and whose resource `sandbox://environments` describes
//! the languages. Every call here takes a fresh sandbox that is closed after it; like the
//! original's containers, it has a network (the operator's allowlist) unless the server
//! has no allowed hosts.
//!
//! The original's answers, which this profile keeps: the trimmed stdout as text; when there
//! is none, or the code failed, llm-sandbox's `ExecutionResult` as JSON text
//! (`{"exit_code": 1, "stderr": ..., "stdout": ""}`, indented by two), never `isError`. The
//! tools declare FastMCP's output schema of an MCP `TextContent` and send the text block as
//! `structuredContent` too, as FastMCP does for a tool returning `TextContent`.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ReadResourceResult, Resource, ResourceContents,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use runbox_core::{ExecContext, ExecOutcome, ExecRequest, Language, Work};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ONE_SHOT, message, note_line};
use crate::server::RunboxServer;

/// Instructions sent to clients at initialisation.
pub(super) const INSTRUCTIONS: &str = "This MCP server allows you to execute code in a secure \
sandbox environment. run_python_code and run_javascript_code each run in a fresh sandbox that \
is closed afterwards, so nothing carries over between calls; print what you want to see. The \
resource sandbox://environments describes the languages and their libraries.";

/// The original's resource describing the languages.
pub(crate) const ENVIRONMENTS_URI: &str = "sandbox://environments";

/// The answer when a Python snippet printed nothing.
const NO_PYTHON_OUTPUT: &str = "No output, forgot print()?";
/// The answer when a JavaScript snippet printed nothing (the original's words).
const NO_JAVASCRIPT_OUTPUT: &str = "No output, forgot console.logs?";

/// Arguments of `run_python_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct PythonCodeArgs {
    /// The Python code to execute, with the Python packages installed on this server (the
    /// resource sandbox://environments lists them).
    pub code: String,
}

/// Arguments of `run_javascript_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct JavaScriptCodeArgs {
    /// The JavaScript code to execute (Node.js; top-level await works).
    pub code: String,
}

/// llm-sandbox's `ExecutionResult` as the original sends it: its fields in their order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ExecutionResult {
    exit_code: i64,
    stderr: String,
    stdout: String,
}

impl ExecutionResult {
    /// The answer for code that failed: the original raised the failure's stderr and
    /// answered `ExecutionResult(exit_code=1, stderr=...)`. runbox adds the traceback and
    /// its own notes (a timeout, output cut to fit) to stderr, and keeps the stdout.
    fn failure(outcome: &ExecOutcome) -> Self {
        let mut stderr = outcome.stderr.clone();
        if let Some(e) = &outcome.error {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            if e.traceback.is_empty() {
                stderr.push_str(&format!("{}: {}\n", e.name, e.value));
            } else {
                stderr.push_str(&e.traceback);
                if !e.traceback.ends_with('\n') {
                    stderr.push('\n');
                }
            }
        }
        for n in &outcome.notes {
            stderr.push_str(&note_line(n));
        }
        Self {
            exit_code: 1,
            stderr: stderr.trim().to_owned(),
            stdout: outcome.stdout.trim().to_owned(),
        }
    }

    /// The answer for a call that did not run, or printed nothing.
    fn message(stderr: impl Into<String>) -> Self {
        Self {
            exit_code: 1,
            stderr: stderr.into(),
            stdout: String::new(),
        }
    }

    /// As `json.dumps(..., indent=2)` writes it.
    fn text(&self) -> String {
        super::json_text(self)
    }
}

/// FastMCP's output schema for a tool declared as returning an MCP `TextContent`.
pub(crate) fn text_content_schema() -> std::sync::Arc<JsonObject> {
    let schema = serde_json::json!({
        "$defs": {
            "Annotations": {
                "additionalProperties": true,
                "properties": {
                    "audience": {
                        "anyOf": [
                            {"items": {"enum": ["user", "assistant"], "type": "string"}, "type": "array"},
                            {"type": "null"}
                        ],
                        "default": null,
                        "title": "Audience"
                    },
                    "priority": {
                        "anyOf": [{"maximum": 1.0, "minimum": 0.0, "type": "number"}, {"type": "null"}],
                        "default": null,
                        "title": "Priority"
                    }
                },
                "title": "Annotations",
                "type": "object"
            }
        },
        "additionalProperties": true,
        "description": "Text content for a message.",
        "properties": {
            "type": {"const": "text", "title": "Type", "type": "string"},
            "text": {"title": "Text", "type": "string"},
            "annotations": {"anyOf": [{"$ref": "#/$defs/Annotations"}, {"type": "null"}], "default": null},
            "_meta": {"anyOf": [{"additionalProperties": true, "type": "object"}, {"type": "null"}], "default": null, "title": "Meta"}
        },
        "required": ["type", "text"],
        "title": "TextContent",
        "type": "object"
    });
    match schema {
        serde_json::Value::Object(o) => std::sync::Arc::new(o),
        _ => std::sync::Arc::default(),
    }
}

/// A `TextContent` answer: the text block, and the block itself as `structuredContent`.
fn text_content(text: String) -> CallToolResult {
    let structured = serde_json::json!({
        "type": "text",
        "text": text,
        "annotations": null,
        "_meta": null,
    });
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

/// The answer of a run: its trimmed stdout, `nothing` when there is none, or the failure.
fn answer(outcome: &ExecOutcome, nothing: &str) -> CallToolResult {
    if !outcome.succeeded() {
        return text_content(ExecutionResult::failure(outcome).text());
    }
    let out = outcome.stdout.trim();
    if out.is_empty() {
        text_content(ExecutionResult::message(nothing).text())
    } else {
        text_content(out.to_owned())
    }
}

/// Code that describes a language's environment as JSON `{"version", "libraries"}`.
fn describe(language: Language) -> &'static str {
    match language {
        Language::Python => {
            "import importlib.metadata as m, json, platform\n\
             names = {(d.metadata['Name'] or '') for d in m.distributions()} - {''}\n\
             print(json.dumps({'version': 'Python ' + platform.python_version(), \
             'libraries': sorted(names, key=str.lower)}))"
        }
        _ => "console.log(JSON.stringify({version: 'Node.js ' + process.version, libraries: []}))",
    }
}

/// One language's entry of `sandbox://environments`, as the original's map has them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Environment {
    image: String,
    installed_libraries: String,
}

/// `sandbox://environments`, the languages in the original's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Environments {
    python: Environment,
    javascript: Environment,
}

impl RunboxServer {
    async fn code_sandbox_mcp_run(
        &self,
        caller: &Caller,
        language: Language,
        code: String,
        nothing: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ran = match self.run_timeout(None) {
            Ok(timeout) => {
                let req = ExecRequest::new(language, code, timeout);
                let sandbox = self.package_sandbox_request(caller).await;
                self.run_fresh(caller, sandbox, Work::Code(req), ctx).await
            }
            Err(e) => Err(e),
        };
        match ran {
            Ok(ran) => answer(&ran.outcome, nothing),
            Err(e) => text_content(ExecutionResult::message(message(&e, &ONE_SHOT)).text()),
        }
    }

    /// What a fresh sandbox has for `language`: its version and libraries, found by running
    /// code in one.
    async fn environment(&self, caller: &Caller, language: Language) -> Environment {
        let found = match self.run_timeout(None) {
            Ok(timeout) => {
                let req = ExecRequest::new(language, describe(language).to_owned(), timeout);
                let ctx = ExecContext {
                    credential: caller.credential.clone(),
                    ..ExecContext::default()
                };
                self.registry()
                    .run(&caller.tenant, None, Work::Code(req), ctx)
                    .await
                    .map_err(|e| runbox_core::chain(&e))
                    .and_then(|ran| {
                        serde_json::from_str::<serde_json::Value>(ran.outcome.stdout.trim())
                            .map_err(|_| {
                                let o = &ran.outcome;
                                o.error
                                    .as_ref()
                                    .map_or_else(|| o.stderr.clone(), |e| e.value.clone())
                            })
                    })
            }
            Err(e) => Err(runbox_core::chain(&e)),
        };
        match found {
            Ok(v) => {
                let libraries: Vec<&str> = v["libraries"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|l| l.as_str()).collect())
                    .unwrap_or_default();
                Environment {
                    image: format!(
                        "runbox sandbox, {}",
                        v["version"].as_str().unwrap_or(language.as_str())
                    ),
                    installed_libraries: libraries.join(", "),
                }
            }
            Err(why) => Environment {
                image: format!("runbox sandbox ({language} is not available here: {why})"),
                installed_libraries: String::new(),
            },
        }
    }

    /// The resource `sandbox://environments`: each language's image (here: runbox's
    /// sandbox and the interpreter's version) and installed libraries, as the original's
    /// JSON map, indented by two.
    pub(crate) async fn code_sandbox_mcp_environments(
        &self,
        caller: &Caller,
    ) -> ReadResourceResult {
        let (python, javascript) = tokio::join!(
            self.environment(caller, Language::Python),
            self.environment(caller, Language::JavaScript)
        );
        let map = Environments { python, javascript };
        ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
            uri: ENVIRONMENTS_URI.to_owned(),
            mime_type: Some("text/plain".into()),
            text: super::json_text(&map),
            meta: None,
        }])
    }
}

/// The resources of this profile, as the original lists them.
pub(crate) fn resources() -> Vec<Resource> {
    vec![
        Resource::new(ENVIRONMENTS_URI, "environment_details")
            .with_description(
                "Resource containing detailed information about the environments: each \
                 language's image and installed libraries.",
            )
            .with_mime_type("text/plain"),
    ]
}

#[tool_router(router = code_sandbox_mcp_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        name = "run_python_code",
        output_schema = text_content_schema(),
        description = "Execute Python code in the sandbox environment and captures the standard \
                       output and error. Each call runs in a fresh sandbox: print() what you want \
                       to see. Answers with the output, or with a JSON object {\"exit_code\", \
                       \"stderr\", \"stdout\"} when the code failed or printed nothing."
    )]
    async fn code_sandbox_mcp_run_python_code(
        &self,
        Parameters(args): Parameters<PythonCodeArgs>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.code_sandbox_mcp_run(&caller, Language::Python, args.code, NO_PYTHON_OUTPUT, &ctx)
            .await
    }

    #[tool(
        name = "run_javascript_code",
        output_schema = text_content_schema(),
        description = "Execute JavaScript code in the sandbox environment and captures the \
                       standard output and error. Each call runs in a fresh sandbox: \
                       console.log() what you want to see. Answers with the output, or with a \
                       JSON object {\"exit_code\", \"stderr\", \"stdout\"} when the code failed or \
                       printed nothing."
    )]
    async fn code_sandbox_mcp_run_javascript_code(
        &self,
        Parameters(args): Parameters<JavaScriptCodeArgs>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.code_sandbox_mcp_run(
            &caller,
            Language::JavaScript,
            args.code,
            NO_JAVASCRIPT_OUTPUT,
            &ctx,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbox_core::ExecError;

    fn only_text(r: &CallToolResult) -> String {
        assert_eq!(r.content.len(), 1);
        let text = r.content[0].as_text().unwrap().text.clone();
        // FastMCP sends the TextContent block as structuredContent too.
        assert_eq!(
            r.structured_content,
            Some(
                serde_json::json!({"type": "text", "text": text, "annotations": null, "_meta": null})
            )
        );
        text
    }

    #[test]
    fn success_is_the_trimmed_output() {
        let o = ExecOutcome {
            stdout: "\n 42 \n\n".into(),
            stderr: "a warning\n".into(),
            ..Default::default()
        };
        let r = answer(&o, NO_PYTHON_OUTPUT);
        assert_eq!((only_text(&r).as_str(), r.is_error), ("42", Some(false)));
    }

    #[test]
    fn no_output_is_the_originals_execution_result() {
        let r = answer(&ExecOutcome::default(), NO_PYTHON_OUTPUT);
        assert_eq!(
            only_text(&r),
            "{\n  \"exit_code\": 1,\n  \"stderr\": \"No output, forgot print()?\",\n  \"stdout\": \"\"\n}"
        );
        assert_eq!(r.is_error, Some(false));
        let r = answer(&ExecOutcome::default(), NO_JAVASCRIPT_OUTPUT);
        assert!(only_text(&r).contains("\"No output, forgot console.logs?\""));
    }

    #[test]
    fn failure_is_exit_code_stderr_and_stdout_as_ordinary_content() {
        let o = ExecOutcome {
            stdout: "before\n".into(),
            stderr: "warned\n".into(),
            error: Some(ExecError {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback:
                    "Traceback (most recent call last):\nZeroDivisionError: division by zero".into(),
            }),
            ..Default::default()
        };
        let r = answer(&o, "");
        assert_eq!(r.is_error, Some(false));
        let v: serde_json::Value = serde_json::from_str(&only_text(&r)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "exit_code": 1,
                "stderr": "warned\nTraceback (most recent call last):\nZeroDivisionError: division by zero",
                "stdout": "before",
            })
        );
        let timed_out = ExecOutcome {
            timed_out: true,
            notes: vec!["The run exceeded its timeout of 1 s and was interrupted.".into()],
            ..Default::default()
        };
        let f = ExecutionResult::failure(&timed_out);
        assert_eq!(f.exit_code, 1);
        assert!(f.stderr.contains("timeout of 1 s"), "{}", f.stderr);
    }
}
