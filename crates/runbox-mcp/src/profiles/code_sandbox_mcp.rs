//! `code-sandbox-mcp`: philschmid's code-sandbox-mcp (seed `001_54c0b058fd5d43b8.txt`), a
//! stdio server whose two tools run a snippet in a fresh sandbox each and answer with its
//! output. Every call here takes a fresh sandbox (from the warm pool when there is one) that
//! is closed after it.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use runbox_core::{ExecOutcome, ExecRequest, Language, Work};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{message, note_line, text_result};
use crate::server::RunboxServer;

/// Instructions sent to clients at initialisation.
pub(super) const INSTRUCTIONS: &str = "This MCP server allows you to execute code in a secure \
sandbox environment. run_python_code and run_javascript_code each run in a fresh sandbox that \
is closed afterwards, so nothing carries over between calls; print what you want to see.";

/// Exit status reported for a run stopped by its timeout (as `timeout(1)` and `runbox run`
/// report it); any other failure of the code is 1, as a failing script's.
const EXIT_TIMEOUT: i64 = 124;

/// Arguments of `run_python_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct PythonCodeArgs {
    /// The Python code to execute, with the Python packages installed on this server.
    pub code: String,
}

/// Arguments of `run_javascript_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct JavaScriptCodeArgs {
    /// The JavaScript code to execute (Node.js; top-level await works).
    pub code: String,
}

/// The answer when the code failed: its exit status and what it wrote to stderr.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Failure {
    exit_code: i64,
    stderr: String,
}

impl Failure {
    fn of(outcome: &ExecOutcome) -> Self {
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
        let exit_code = if outcome.timed_out {
            EXIT_TIMEOUT
        } else {
            match outcome.exit_code {
                Some(c) if c != 0 => i64::from(c),
                _ => 1,
            }
        };
        Self {
            exit_code,
            stderr: stderr.trim().to_owned(),
        }
    }

    fn result(&self) -> CallToolResult {
        let text = serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"exit_code\": 1, \"stderr\": \"the answer did not serialize: {e}\"}}")
        });
        text_result(text, true)
    }
}

/// The answer of a run: its trimmed stdout, `nothing` when there is none, or the failure.
fn answer(outcome: &ExecOutcome, nothing: &str) -> CallToolResult {
    if !outcome.succeeded() {
        return Failure::of(outcome).result();
    }
    let out = outcome.stdout.trim();
    if out.is_empty() {
        text_result(nothing, false)
    } else {
        text_result(out, false)
    }
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
                self.run(caller, None, Work::Code(req), ctx).await
            }
            Err(e) => Err(e),
        };
        match ran {
            Ok(ran) => answer(&ran.outcome, nothing),
            Err(e) => Failure {
                exit_code: 1,
                stderr: message(&e, ""),
            }
            .result(),
        }
    }
}

#[tool_router(router = code_sandbox_mcp_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        name = "run_python_code",
        description = "Execute Python code in the sandbox environment and captures the standard \
                       output and error. Each call runs in a fresh sandbox: print() what you want \
                       to see. Answers with the output, or on failure with a JSON object \
                       {\"exit_code\", \"stderr\"}."
    )]
    async fn code_sandbox_mcp_run_python_code(
        &self,
        Parameters(args): Parameters<PythonCodeArgs>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.code_sandbox_mcp_run(
            &caller,
            Language::Python,
            args.code,
            "No output, forgot print()?",
            &ctx,
        )
        .await
    }

    #[tool(
        name = "run_javascript_code",
        description = "Execute JavaScript code in the sandbox environment and captures the \
                       standard output and error. Each call runs in a fresh sandbox: \
                       console.log() what you want to see. Answers with the output, or on \
                       failure with a JSON object {\"exit_code\", \"stderr\"}."
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
            "No output, forgot console.log()?",
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
        r.content[0].as_text().unwrap().text.clone()
    }

    #[test]
    fn success_is_the_trimmed_output_or_a_reminder() {
        let o = ExecOutcome {
            stdout: "\n 42 \n\n".into(),
            stderr: "a warning\n".into(),
            ..Default::default()
        };
        let r = answer(&o, "No output, forgot print()?");
        assert_eq!((only_text(&r).as_str(), r.is_error), ("42", Some(false)));
        assert!(r.structured_content.is_none());
        let r = answer(&ExecOutcome::default(), "No output, forgot print()?");
        assert_eq!(only_text(&r), "No output, forgot print()?");
        assert_eq!(r.is_error, Some(false));
    }

    #[test]
    fn failure_is_exit_code_and_stderr() {
        let o = ExecOutcome {
            stdout: "lost\n".into(),
            stderr: "before\n".into(),
            error: Some(ExecError {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback:
                    "Traceback (most recent call last):\nZeroDivisionError: division by zero".into(),
            }),
            ..Default::default()
        };
        let r = answer(&o, "");
        assert_eq!(r.is_error, Some(true));
        let v: serde_json::Value = serde_json::from_str(&only_text(&r)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "exit_code": 1,
                "stderr": "before\nTraceback (most recent call last):\nZeroDivisionError: division by zero",
            })
        );
        let timed_out = ExecOutcome {
            timed_out: true,
            notes: vec!["The run exceeded its timeout of 1 s and was interrupted.".into()],
            ..Default::default()
        };
        let f = Failure::of(&timed_out);
        assert_eq!(f.exit_code, EXIT_TIMEOUT);
        assert!(f.stderr.contains("timeout of 1 s"), "{}", f.stderr);
    }
}
