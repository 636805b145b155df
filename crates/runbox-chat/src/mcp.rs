//! The MCP server side: connecting (a URL, or `runbox serve --stdio` started here), its
//! tools as the model's tool definitions, its instructions prompt, and tool calls.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    GetPromptRequestParams, Implementation, JsonObject, ResourceContents, Tool,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::error::{ChatError, root_cause};

/// Where the MCP server is.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// A streamable HTTP endpoint, with an optional bearer token.
    Url { url: String, token: Option<String> },
    /// `EXE serve --stdio ARGS...`, started and owned by the chat.
    Spawn { exe: PathBuf, args: Vec<String> },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url { url, .. } => f.write_str(url),
            Self::Spawn { exe, args } => {
                write!(f, "`{} serve --stdio", exe.display())?;
                for a in args {
                    write!(f, " {a}")?;
                }
                f.write_str("`")
            }
        }
    }
}

/// The tool that closes a sandbox, and the argument naming it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CloseTool {
    pub(crate) name: String,
    pub(crate) param: String,
}

pub(crate) struct Server {
    service: RunningService<RoleClient, ClientConfig>,
    target: String,
    pub(crate) tools: Vec<Tool>,
    pub(crate) close: Option<CloseTool>,
}

/// How long starting or reaching the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

impl Server {
    pub(crate) async fn connect(target: &Target) -> Result<Self, ChatError> {
        let name = target.to_string();
        let failed = |reason: String| ChatError::McpConnect {
            target: name.clone(),
            reason,
        };
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("runbox-chat", env!("CARGO_PKG_VERSION")),
        );
        let started = match target {
            Target::Url { url, token } => {
                let http = crate::http_client(url)
                    .connect_timeout(Duration::from_secs(15))
                    .build()
                    .map_err(|e| failed(root_cause(&e)))?;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                if let Some(token) = token {
                    config = config.auth_header(token.as_str());
                }
                let transport = StreamableHttpClientTransport::with_client(http, config);
                tokio::time::timeout(CONNECT_TIMEOUT, info.serve(transport)).await
            }
            Target::Spawn { exe, args } => {
                let mut command = tokio::process::Command::new(exe);
                command.arg("serve").arg("--stdio").args(args);
                // Its own process group: Ctrl-C in the terminal interrupts the chat's step,
                // not the server; the server ends when the chat closes its stdin.
                command.process_group(0);
                let (transport, _) = TokioChildProcess::builder(command)
                    .stderr(Stdio::inherit())
                    .spawn()
                    .map_err(|e| failed(e.to_string()))?;
                tokio::time::timeout(CONNECT_TIMEOUT, info.serve(transport)).await
            }
        };
        let service = match started {
            Err(_) => return Err(failed(format!("no answer within {CONNECT_TIMEOUT:?}"))),
            Ok(Err(e)) if e.is_authorization_required() => {
                return Err(ChatError::McpAuth { target: name });
            }
            Ok(Err(e)) => return Err(failed(root_cause(&e))),
            Ok(Ok(service)) => service,
        };
        let tools = service
            .list_all_tools()
            .await
            .map_err(|e| failed(format!("listing its tools failed: {}", root_cause(&e))))?;
        let close = close_tool(&tools);
        Ok(Self {
            service,
            target: name,
            tools,
            close,
        })
    }

    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// What the server says about using its tools: its instructions prompt
    /// (`sandbox_instructions`, the tutorial's `instructions_for_sandbox_use`, or another
    /// argument-free prompt named like instructions), else its `instructions`.
    pub(crate) async fn instructions(&self) -> Option<String> {
        let prompts = self.service.list_all_prompts().await.unwrap_or_default();
        let takes_no_arguments = |p: &&rmcp::model::Prompt| {
            p.arguments
                .iter()
                .flatten()
                .all(|a| a.required != Some(true))
        };
        let chosen = ["sandbox_instructions", "instructions_for_sandbox_use"]
            .iter()
            .find_map(|name| prompts.iter().find(|p| p.name == *name))
            .or_else(|| {
                prompts
                    .iter()
                    .filter(takes_no_arguments)
                    .find(|p| p.name.contains("instruction"))
            });
        if let Some(prompt) = chosen {
            match self
                .service
                .get_prompt(GetPromptRequestParams::new(prompt.name.clone()))
                .await
            {
                Ok(result) => {
                    let text: Vec<String> = result
                        .messages
                        .iter()
                        .filter_map(|m| match &m.content {
                            ContentBlock::Text(t) => Some(t.text.trim().to_owned()),
                            _ => None,
                        })
                        .collect();
                    if !text.is_empty() {
                        return Some(text.join("\n\n"));
                    }
                }
                Err(e) => tracing::warn!(prompt = %prompt.name, "cannot get the prompt: {e}"),
            }
        }
        self.service
            .peer_info()
            .and_then(|info| info.instructions.clone())
    }

    /// The tools as chat-completions tool definitions.
    pub(crate) fn openai_tools(&self) -> Vec<Value> {
        self.tools.iter().map(openai_tool).collect()
    }

    /// Calls a tool. An error of the protocol or the connection comes back as its message.
    pub(crate) async fn call(&self, name: &str, args: JsonObject) -> Result<ToolOutcome, String> {
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
        match self.service.call_tool(params).await {
            Ok(result) => Ok(ToolOutcome::from_result(result)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Ends the connection; a server started here sees its stdin close and shuts down.
    pub(crate) async fn shutdown(self) {
        if let Err(e) = self.service.cancel().await {
            tracing::warn!("closing the MCP connection: {e}");
        }
    }
}

fn openai_tool(tool: &Tool) -> Value {
    let mut parameters = (*tool.input_schema).clone();
    // Some APIs refuse keys they do not know at the top of a function's parameters.
    parameters.remove("$schema");
    if !parameters.contains_key("type") {
        parameters.insert("type".to_owned(), json!("object"));
    }
    let description = tool
        .description
        .as_deref()
        .map(str::to_owned)
        .or_else(|| tool.title.clone())
        .unwrap_or_default();
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": description,
            "parameters": parameters,
        }
    })
}

/// The close tool among `tools`: runbox's `close_sandbox`, the Novita tutorial's
/// `stop_sandbox_session`, or another `close…`/`stop…`/`kill…` tool about sandboxes; the
/// argument is `sandbox_id`, `session_id`, or its first required one.
pub(crate) fn close_tool(tools: &[Tool]) -> Option<CloseTool> {
    let named = |n: &str| tools.iter().find(|t| t.name == n);
    let tool = named("close_sandbox")
        .or_else(|| named("stop_sandbox_session"))
        .or_else(|| {
            tools.iter().find(|t| {
                t.name.contains("sandbox")
                    && ["close", "stop", "kill"]
                        .iter()
                        .any(|verb| t.name.starts_with(verb))
            })
        })?;
    let properties = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let has = |p: &str| properties.is_some_and(|props| props.contains_key(p));
    let param = if has("sandbox_id") {
        "sandbox_id".to_owned()
    } else if has("session_id") {
        "session_id".to_owned()
    } else {
        tool.input_schema
            .get("required")?
            .as_array()?
            .first()?
            .as_str()?
            .to_owned()
    };
    Some(CloseTool {
        name: tool.name.to_string(),
        param,
    })
}

/// A tool's answer, ready to show and to give back to the model.
#[derive(Debug, Default)]
pub(crate) struct ToolOutcome {
    /// The text of the answer (structured content when there is no text).
    pub(crate) text: String,
    pub(crate) is_error: bool,
    pub(crate) images: Vec<Image>,
    pub(crate) structured: Option<Value>,
}

#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) mime_type: String,
    pub(crate) data: Vec<u8>,
}

impl ToolOutcome {
    pub(crate) fn from_result(result: CallToolResult) -> Self {
        let mut parts = Vec::new();
        let mut images = Vec::new();
        for block in result.content {
            match block {
                ContentBlock::Text(t) => parts.push(t.text),
                ContentBlock::Image(i) => {
                    match base64::engine::general_purpose::STANDARD.decode(i.data.as_bytes()) {
                        Ok(data) => images.push(Image {
                            mime_type: i.mime_type,
                            data,
                        }),
                        Err(e) => parts.push(format!("[an image that does not decode: {e}]")),
                    }
                }
                ContentBlock::Audio(a) => parts.push(format!("[{} audio]", a.mime_type)),
                ContentBlock::ResourceLink(r) => parts.push(format!("[file: {}]", r.uri)),
                ContentBlock::Resource(r) => match r.resource {
                    ResourceContents::TextResourceContents { text, .. } => parts.push(text),
                    ResourceContents::BlobResourceContents { uri, .. } => {
                        parts.push(format!("[resource: {uri}]"));
                    }
                    _ => parts.push("[a resource]".to_owned()),
                },
                _ => parts.push("[content this client does not show]".to_owned()),
            }
        }
        let mut text = parts.join("\n");
        if text.trim().is_empty()
            && let Some(s) = &result.structured_content
        {
            text = s.to_string();
        }
        Self {
            text,
            is_error: result.is_error == Some(true),
            images,
            structured: result.structured_content,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;

    fn tool(name: &str, schema: Value) -> Tool {
        Tool::new(
            name.to_owned(),
            "d",
            Arc::new(schema.as_object().unwrap().clone()),
        )
    }

    #[test]
    fn the_close_tool_of_each_profile_is_found() {
        let id = json!({"type": "object", "properties": {"sandbox_id": {"type": "string"}}});
        let runbox = [
            tool("create_sandbox", json!({})),
            tool("close_sandbox", id.clone()),
        ];
        assert_eq!(
            close_tool(&runbox),
            Some(CloseTool {
                name: "close_sandbox".into(),
                param: "sandbox_id".into()
            })
        );
        let novita = [tool("stop_sandbox_session", id)];
        assert_eq!(close_tool(&novita).unwrap().name, "stop_sandbox_session");
        let sessions = [tool(
            "close_sandbox",
            json!({"type": "object", "properties": {"session_id": {"type": "string"}}}),
        )];
        assert_eq!(close_tool(&sessions).unwrap().param, "session_id");
        assert_eq!(close_tool(&[tool("run_python_code", json!({}))]), None);
    }

    #[test]
    fn tools_become_function_definitions() {
        let t = tool(
            "run_code",
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                   "properties": {"code": {"type": "string"}}, "required": ["code"]}),
        );
        let v = openai_tool(&t);
        assert_eq!(v["type"], "function");
        assert_eq!(v["function"]["name"], "run_code");
        assert_eq!(v["function"]["parameters"]["required"][0], "code");
        assert!(v["function"]["parameters"].get("$schema").is_none());
    }
}
