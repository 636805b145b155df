//! The agent loop: the conversation, one model response per step up to the step limit,
//! the tool calls it asks for, and the sandboxes it opened, closed at the end whether or
//! not the model remembered to.

use serde_json::{Map, Value, json};

use crate::error::ChatError;
use crate::mcp::{Server, ToolOutcome};
use crate::model::{Message, ModelClient, ToolCall};
use crate::render::Renderer;

/// How a turn ended.
#[derive(Debug, PartialEq)]
pub(crate) enum TurnEnd {
    /// The model answered (a response without tool calls).
    Answer(String),
    /// The step limit was reached before an answer.
    StepLimit,
}

pub(crate) struct Agent {
    model: ModelClient,
    server: Server,
    pub(crate) render: Renderer,
    tools: Vec<Value>,
    history: Vec<Message>,
    max_steps: u32,
    /// Sandboxes the conversation opened and has not closed, oldest first.
    open_sandboxes: Vec<String>,
}

impl Agent {
    pub(crate) async fn new(
        model: ModelClient,
        server: Server,
        render: Renderer,
        max_steps: u32,
    ) -> Self {
        let instructions = server.instructions().await;
        let system = system_prompt(
            &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            instructions.as_deref(),
            server.close.as_ref().map(|c| c.name.as_str()),
        );
        let tools = server.openai_tools();
        Self {
            model,
            server,
            render,
            tools,
            history: vec![Message::System { content: system }],
            max_steps,
            open_sandboxes: Vec::new(),
        }
    }

    pub(crate) fn describe(&self) -> String {
        let s = self.model.settings();
        format!(
            "runbox chat: model {} at {}; MCP server {} with {} tools",
            s.model,
            s.base_url,
            self.server.target(),
            self.tools.len()
        )
    }

    /// Answers one user message, in as many steps as the model needs up to the limit.
    /// The conversation only ever holds complete steps (a response and the results of all
    /// its calls), so a turn interrupted by dropping this future leaves it usable.
    pub(crate) async fn turn(&mut self, text: &str) -> Result<TurnEnd, ChatError> {
        self.history.push(Message::User {
            content: text.to_owned(),
        });
        for step in 1..=self.max_steps {
            let render = &self.render;
            let reply = self
                .model
                .complete(&self.history, &self.tools, |t| render.text_delta(t))
                .await?;
            self.render
                .response_done(&reply.content, !reply.tool_calls.is_empty());
            let content = (!reply.content.is_empty()).then(|| reply.content.clone());
            if reply.tool_calls.is_empty() {
                self.history.push(Message::Assistant {
                    content: Some(reply.content.clone()),
                    tool_calls: Vec::new(),
                });
                return Ok(TurnEnd::Answer(reply.content));
            }
            let mut results = Vec::new();
            for call in &reply.tool_calls {
                let content = if step == self.max_steps {
                    format!("Not run: the step limit ({}) was reached.", self.max_steps)
                } else {
                    self.run_tool(call).await
                };
                results.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                });
            }
            self.history.push(Message::Assistant {
                content,
                tool_calls: reply.tool_calls,
            });
            self.history.extend(results);
        }
        self.render.notice(&format!(
            "step limit reached: {} model responses without a final answer; stopping this \
             turn (raise it with --max-steps)",
            self.max_steps
        ));
        Ok(TurnEnd::StepLimit)
    }

    /// Runs one call; returns what the model is told. Failures are told, never fatal.
    async fn run_tool(&mut self, call: &ToolCall) -> String {
        let name = &call.function.name;
        let raw = call.function.arguments.trim();
        let args = match serde_json::from_str::<Value>(if raw.is_empty() { "{}" } else { raw }) {
            Ok(Value::Object(args)) => args,
            Ok(Value::Null) => Map::new(),
            Ok(_) => {
                let problem = "the arguments are not a JSON object";
                self.render.bad_arguments(name, raw, problem);
                return format!("Not run: {problem}. Send the arguments as one JSON object.");
            }
            Err(e) => {
                let problem = format!("the arguments are not valid JSON ({e})");
                self.render.bad_arguments(name, raw, &problem);
                return format!("Not run: {problem}. Send the arguments as one JSON object.");
            }
        };
        self.render.tool_call(name, &args);
        match self.server.call(name, args.clone()).await {
            Ok(outcome) => {
                let images = self.render.save_images(&outcome.images);
                self.render.tool_result(&outcome, &images);
                self.track(name, &args, &outcome);
                let mut text = if outcome.is_error {
                    format!("The tool reported an error:\n{}", outcome.text)
                } else {
                    outcome.text
                };
                for image in images {
                    text.push_str(&match image {
                        Ok(path) => {
                            format!("\n[image shown to the user, saved as {}]", path.display())
                        }
                        Err(_) => "\n[an image the user could not be shown]".to_owned(),
                    });
                }
                text
            }
            Err(e) => {
                self.render.tool_failure(&e);
                format!("The tool call failed: {e}")
            }
        }
    }

    /// Notes the sandbox a call opened or closed.
    fn track(&mut self, tool: &str, args: &Map<String, Value>, outcome: &ToolOutcome) {
        if outcome.is_error {
            return;
        }
        if let Some(close) = &self.server.close
            && close.name == tool
        {
            if let Some(id) = args.get(&close.param).and_then(Value::as_str) {
                self.open_sandboxes.retain(|s| s != id);
            }
            return;
        }
        if let Some(id) = opened_sandbox(tool, args, outcome)
            && !self.open_sandboxes.contains(&id)
        {
            self.open_sandboxes.push(id);
        }
    }

    /// Closes every sandbox the conversation opened and left open.
    pub(crate) async fn close_sandboxes(&mut self) {
        if self.open_sandboxes.is_empty() {
            return;
        }
        let Some(close) = self.server.close.clone() else {
            self.render.notice(&format!(
                "left open (the server has no close tool): {}",
                self.open_sandboxes.join(", ")
            ));
            return;
        };
        for id in std::mem::take(&mut self.open_sandboxes) {
            let mut args = Map::new();
            args.insert(close.param.clone(), json!(id));
            let call = self.server.call(&close.name, args);
            let said = match tokio::time::timeout(std::time::Duration::from_secs(30), call).await {
                Ok(Ok(outcome)) if !outcome.is_error => format!("closed sandbox {id}"),
                Ok(Ok(outcome)) => format!("closing sandbox {id}: {}", outcome.text.trim()),
                Ok(Err(e)) => format!("closing sandbox {id} failed: {e}"),
                Err(_) => format!("closing sandbox {id}: no answer within 30 s"),
            };
            self.render.notice(&said);
        }
    }

    pub(crate) async fn shutdown(mut self) {
        self.close_sandboxes().await;
        self.server.shutdown().await;
    }
}

/// The id of the sandbox a successful call made or used: a `sandbox_id` in its structured
/// answer (not a one-shot sandbox, already gone), or for a `create…` tool a `session_id`,
/// the id the caller chose, or the tutorial's "Sandbox ID: ..." text.
fn opened_sandbox(tool: &str, args: &Map<String, Value>, outcome: &ToolOutcome) -> Option<String> {
    let structured = outcome.structured.as_ref();
    let field = |v: Option<&Value>, k: &str| v?.get(k)?.as_str().map(str::to_owned);
    let ephemeral = structured
        .and_then(|s| s.get("ephemeral"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(id) = field(structured, "sandbox_id") {
        return (!ephemeral).then_some(id);
    }
    if !tool.starts_with("create") {
        return None;
    }
    let args = Value::Object(args.clone());
    field(structured, "session_id")
        .or_else(|| field(Some(&args), "session_id"))
        .or_else(|| field(Some(&args), "sandbox_id"))
        .or_else(|| {
            let (_, rest) = outcome.text.split_once("Sandbox ID:")?;
            rest.split_whitespace().next().map(str::to_owned)
        })
}

fn system_prompt(now: &str, instructions: Option<&str>, close_tool: Option<&str>) -> String {
    let mut s = format!(
        "You are a helpful assistant that can run code in sandboxes through your tools. \
         The current date and time is {now} (UTC).\n"
    );
    if let Some(instructions) = instructions {
        s.push_str("\nHow to use the sandbox tools:\n");
        s.push_str(instructions.trim());
        s.push('\n');
    }
    if let Some(close) = close_tool {
        s.push_str(&format!(
            "\nMust remember: reuse one sandbox for related steps, and call {close} on every \
             sandbox you created before you give your final answer.\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn outcome(text: &str, structured: Option<Value>) -> ToolOutcome {
        ToolOutcome {
            text: text.to_owned(),
            structured,
            ..Default::default()
        }
    }

    #[test]
    fn opened_sandboxes_are_recognised_in_each_profile() {
        let none = Map::new();
        let created = outcome("", Some(json!({"sandbox_id": "sbx_1", "created_at": "x"})));
        assert_eq!(
            opened_sandbox("create_sandbox", &none, &created).as_deref(),
            Some("sbx_1")
        );
        let used = outcome("", Some(json!({"sandbox_id": "sbx_2", "ephemeral": false})));
        assert_eq!(
            opened_sandbox("run_code", &none, &used).as_deref(),
            Some("sbx_2")
        );
        let one_shot = outcome("", Some(json!({"sandbox_id": "sbx_3", "ephemeral": true})));
        assert_eq!(opened_sandbox("run_code", &none, &one_shot), None);
        let novita = outcome("Successfully created sandbox. Sandbox ID: sbx_4", None);
        assert_eq!(
            opened_sandbox("create_sandbox_session", &none, &novita).as_deref(),
            Some("sbx_4")
        );
        let mut named = Map::new();
        named.insert("session_id".into(), json!("mine"));
        let text = outcome("Sandbox created", None);
        assert_eq!(
            opened_sandbox("create_sandbox", &named, &text).as_deref(),
            Some("mine")
        );
        assert_eq!(opened_sandbox("list_files", &named, &text), None);
    }

    #[test]
    fn the_system_prompt_has_the_date_the_instructions_and_the_close_tool() {
        let s = system_prompt(
            "2026-01-02T03:04:05Z",
            Some("Create a sandbox."),
            Some("close_sandbox"),
        );
        assert!(s.contains("2026-01-02T03:04:05Z"));
        assert!(s.contains("Create a sandbox."));
        assert!(s.contains("call close_sandbox"));
    }
}
