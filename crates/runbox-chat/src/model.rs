//! A client of an OpenAI-compatible chat completions API (OpenAI, Novita, llama.cpp, vLLM,
//! ...), streaming: the answer arrives as server-sent events whose `data:` lines carry
//! deltas of the text and of each tool call, which are put together here.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{ChatError, root_cause};

/// OpenAI's API, the default.
pub(crate) const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Novita's OpenAI-compatible API, the default when only `NOVITA_API_KEY` is set.
pub(crate) const NOVITA_BASE_URL: &str = "https://api.novita.ai/v3/openai";
pub(crate) const OPENAI_DEFAULT_MODEL: &str = "gpt-4.1-mini";
/// The model the Novita tutorial's agent uses.
pub(crate) const NOVITA_DEFAULT_MODEL: &str = "qwen/qwen3-coder-480b-a35b-instruct";

/// Which model, where, with which key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelSettings {
    pub(crate) base_url: String,
    pub(crate) api_key: Option<String>,
    pub(crate) model: String,
}

impl ModelSettings {
    /// The settings from the flags and the keys in the environment: an explicit base URL
    /// wins; without one, OpenAI's, or Novita's when only `NOVITA_API_KEY` is set. The key
    /// is `--api-key`, else the variable of that provider (Novita's for a Novita URL,
    /// OpenAI's for any other). A hosted API without a key is refused here; a server given
    /// with `--base-url` may need none.
    pub(crate) fn resolve(
        base_url: Option<String>,
        api_key: Option<String>,
        model: Option<String>,
        openai_key: Option<String>,
        novita_key: Option<String>,
    ) -> Result<Self, ChatError> {
        let novita = match &base_url {
            Some(url) => url.contains("novita.ai"),
            None => openai_key.is_none() && novita_key.is_some(),
        };
        let explicit = base_url.is_some();
        let base_url = base_url
            .unwrap_or_else(|| {
                if novita {
                    NOVITA_BASE_URL
                } else {
                    OPENAI_BASE_URL
                }
                .to_owned()
            })
            .trim_end_matches('/')
            .to_owned();
        let api_key = api_key
            .or(if novita { novita_key } else { openai_key })
            .filter(|k| !k.is_empty());
        if api_key.is_none() && !explicit {
            return Err(ChatError::NoApiKey { base_url });
        }
        let model = model.unwrap_or_else(|| {
            if novita {
                NOVITA_DEFAULT_MODEL
            } else {
                OPENAI_DEFAULT_MODEL
            }
            .to_owned()
        });
        Ok(Self {
            base_url,
            api_key,
            model,
        })
    }
}

/// One message of the conversation, as the API takes it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(crate) enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

/// A call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ToolCall {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FunctionCall {
    pub(crate) name: String,
    /// The arguments as the model wrote them: JSON text, not checked yet.
    pub(crate) arguments: String,
}

/// One complete model response.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Reply {
    pub(crate) content: String,
    pub(crate) tool_calls: Vec<ToolCall>,
}

#[derive(Debug)]
pub(crate) struct ModelClient {
    http: reqwest::Client,
    settings: ModelSettings,
}

impl ModelClient {
    pub(crate) fn new(settings: ModelSettings) -> Result<Self, ChatError> {
        let http = crate::http_client(&settings.base_url)
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| ChatError::ModelUnreachable {
                base_url: settings.base_url.clone(),
                reason: root_cause(&e),
            })?;
        Ok(Self { http, settings })
    }

    pub(crate) fn settings(&self) -> &ModelSettings {
        &self.settings
    }

    /// Asks for the next response to `messages`, streaming: `on_text` gets each piece of
    /// text as it arrives; the response comes back whole, its tool calls put together.
    pub(crate) async fn complete(
        &self,
        messages: &[Message],
        tools: &[Value],
        mut on_text: impl FnMut(&str),
    ) -> Result<Reply, ChatError> {
        let base_url = &self.settings.base_url;
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages,
            "stream": true,
        });
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools.to_vec());
        }
        let mut request = self
            .http
            .post(format!("{base_url}/chat/completions"))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key);
        }
        let unreachable = |e: reqwest::Error| ChatError::ModelUnreachable {
            base_url: base_url.clone(),
            reason: root_cause(&e),
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(status_error(base_url, status.as_u16(), &text));
        }
        let is_json = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/json"));
        let protocol = |reason: String| ChatError::ModelProtocol {
            base_url: base_url.clone(),
            reason,
        };
        if is_json {
            // A server that ignores `stream: true` answers with one completion.
            let text = response.text().await.map_err(unreachable)?;
            let value: Value = serde_json::from_str(&text)
                .map_err(|e| protocol(format!("sent JSON that does not parse: {e}")))?;
            let reply = whole_reply(&value).map_err(protocol)?;
            on_text(&reply.content);
            return Ok(reply);
        }
        let mut decoder = SseDecoder::default();
        let mut acc = Accumulator::default();
        let mut done = false;
        while !done {
            let Some(bytes) = response
                .chunk()
                .await
                .map_err(|e| protocol(format!("broke off its answer: {}", root_cause(&e))))?
            else {
                break;
            };
            for data in decoder.feed(&bytes) {
                if data == "[DONE]" {
                    done = true;
                    break;
                }
                let chunk: Value = serde_json::from_str(&data)
                    .map_err(|e| protocol(format!("sent an event that does not parse: {e}")))?;
                if let Some(text) = acc.chunk(&chunk).map_err(protocol)? {
                    on_text(&text);
                }
            }
        }
        Ok(acc.finish())
    }
}

/// The error for a non-success status, with the API's own message.
fn status_error(base_url: &str, status: u16, body: &str) -> ChatError {
    let message = error_message(body);
    if status == 401 || status == 403 {
        return ChatError::KeyRefused {
            base_url: base_url.to_owned(),
            status,
            message,
        };
    }
    let lower = message.to_lowercase();
    let hint = if lower.contains("tool") || lower.contains("function") {
        "\nthis model (or server) does not seem to take tool calls: choose a model that \
         supports them (a llama.cpp server needs --jinja)"
    } else if status == 404 {
        "\ncheck --base-url (the API's root, e.g. ending in /v1) and --model"
    } else {
        ""
    };
    ChatError::ModelRejected {
        base_url: base_url.to_owned(),
        status,
        message,
        hint,
    }
}

/// The message of an error body: `{"error": {"message": ...}}`, `{"error": "..."}`,
/// `{"message": ...}`, or the text itself (shortened).
fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let e = v.get("error").unwrap_or(&v);
        e.get("message")
            .and_then(Value::as_str)
            .or_else(|| e.as_str())
            .map(str::to_owned)
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_owned());
    if text.is_empty() {
        return "(no message)".to_owned();
    }
    shorten(&text, 600)
}

pub(crate) fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A reply from a non-streamed completion.
fn whole_reply(v: &Value) -> Result<Reply, String> {
    if let Some(e) = v.get("error") {
        return Err(format!(
            "reported an error: {}",
            error_message(&e.to_string())
        ));
    }
    let message = &v["choices"][0]["message"];
    if message.is_null() {
        return Err("sent a completion without a message".to_owned());
    }
    let tool_calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let arguments = match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    tool_call(
                        i,
                        c["id"].as_str().unwrap_or_default(),
                        c["function"]["name"].as_str().unwrap_or_default(),
                        arguments,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Reply {
        content: message["content"].as_str().unwrap_or_default().to_owned(),
        tool_calls,
    })
}

fn tool_call(index: usize, id: &str, name: &str, arguments: String) -> ToolCall {
    ToolCall {
        // Some local servers send no ids; the API needs one to pair results with calls.
        id: if id.is_empty() {
            format!("call_{index}")
        } else {
            id.to_owned()
        },
        kind: "function",
        function: FunctionCall {
            name: name.to_owned(),
            arguments,
        },
    }
}

/// Splits a byte stream into the data of server-sent events. Each `data:` line is one
/// event (the chat completions APIs never spread one over several lines, and some servers
/// leave out the blank line between events); bytes may arrive split anywhere.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    buf: Vec<u8>,
}

impl SseDecoder {
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(data) = line.strip_prefix("data:") {
                events.push(data.strip_prefix(' ').unwrap_or(data).to_owned());
            }
        }
        events
    }
}

/// Puts a streamed response together from its chunks.
#[derive(Debug, Default)]
pub(crate) struct Accumulator {
    content: String,
    calls: Vec<PartialCall>,
}

#[derive(Debug, Default)]
struct PartialCall {
    index: u64,
    id: String,
    name: String,
    arguments: String,
}

impl Accumulator {
    /// Takes one chunk; returns its text, if any. A chunk carrying an error (some APIs
    /// report failures inside the stream) is an error.
    pub(crate) fn chunk(&mut self, chunk: &Value) -> Result<Option<String>, String> {
        if let Some(e) = chunk.get("error") {
            return Err(format!(
                "reported an error: {}",
                error_message(&e.to_string())
            ));
        }
        let delta = &chunk["choices"][0]["delta"];
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let id = tc["id"].as_str().unwrap_or_default();
            let index = match tc["index"].as_u64() {
                Some(i) => i,
                // Without an index: a new call when it has a new id, else the last one.
                None => match self.calls.last() {
                    Some(last) if id.is_empty() || id == last.id => last.index,
                    Some(last) => last.index + 1,
                    None => 0,
                },
            };
            let call = match self.calls.iter().position(|c| c.index == index) {
                Some(i) => &mut self.calls[i],
                None => {
                    self.calls.push(PartialCall {
                        index,
                        ..Default::default()
                    });
                    let last = self.calls.len() - 1;
                    &mut self.calls[last]
                }
            };
            if call.id.is_empty() {
                call.id = id.to_owned();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                // Fragments are appended; a server that repeats the whole name in every
                // delta must not double it.
                if call.name != name {
                    call.name.push_str(name);
                }
            }
            if let Some(args) = tc["function"]["arguments"].as_str() {
                call.arguments.push_str(args);
            }
        }
        match delta["content"].as_str() {
            Some(text) if !text.is_empty() => {
                self.content.push_str(text);
                Ok(Some(text.to_owned()))
            }
            _ => Ok(None),
        }
    }

    pub(crate) fn finish(mut self) -> Reply {
        self.calls.sort_by_key(|c| c.index);
        let tool_calls = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| tool_call(i, &c.id, &c.name, c.arguments))
            .collect();
        Reply {
            content: self.content,
            tool_calls,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sse(events: &[Value]) -> String {
        let mut s: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        s.push_str("data: [DONE]\n\n");
        s
    }

    /// Feeds `text` in pieces of `size` bytes and puts the reply together.
    fn decode(text: &str, size: usize) -> Reply {
        let mut decoder = SseDecoder::default();
        let mut acc = Accumulator::default();
        for piece in text.as_bytes().chunks(size) {
            for data in decoder.feed(piece) {
                if data == "[DONE]" {
                    return acc.finish();
                }
                acc.chunk(&serde_json::from_str(&data).unwrap()).unwrap();
            }
        }
        panic!("no [DONE]");
    }

    #[test]
    fn tool_calls_and_text_come_together_from_fragments_split_anywhere() {
        let d = |delta: Value| json!({"choices": [{"index": 0, "delta": delta}]});
        let text = sse(&[
            d(json!({"role": "assistant", "content": "Let me ché"})),
            d(json!({"content": "ck."})),
            d(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "run_", "arguments": ""}}]}),
            ),
            d(
                json!({"tool_calls": [{"index": 0, "function": {"name": "code", "arguments": "{\"co"}}]}),
            ),
            d(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "list_sandboxes", "arguments": "{}"}}]}),
            ),
            d(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "de\": \"x = 21\"}"}}]}),
            ),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        for size in [1, 2, 3, 7, 64, text.len()] {
            let reply = decode(&text, size);
            assert_eq!(reply.content, "Let me chéck.", "size {size}");
            assert_eq!(reply.tool_calls.len(), 2);
            assert_eq!(reply.tool_calls[0].id, "call_a");
            assert_eq!(reply.tool_calls[0].function.name, "run_code");
            assert_eq!(
                reply.tool_calls[0].function.arguments,
                r#"{"code": "x = 21"}"#
            );
            assert_eq!(reply.tool_calls[1].function.name, "list_sandboxes");
        }
    }

    #[test]
    fn crlf_lines_comments_and_missing_ids_are_handled() {
        let text = ": keep-alive\r\n\r\ndata:{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"create_sandbox\",\"arguments\":\"{}\"}}]}}]}\r\n\r\ndata: [DONE]\r\n";
        let reply = decode(text, 5);
        assert_eq!(reply.tool_calls[0].id, "call_0");
        assert_eq!(reply.tool_calls[0].function.name, "create_sandbox");
    }

    #[test]
    fn an_error_inside_the_stream_is_an_error() {
        let mut acc = Accumulator::default();
        let e = acc
            .chunk(&json!({"error": {"message": "overloaded"}}))
            .unwrap_err();
        assert!(e.contains("overloaded"), "{e}");
    }

    #[test]
    fn status_errors_say_what_happened() {
        let e = status_error(
            "http://h/v1",
            401,
            r#"{"error":{"message":"Incorrect API key"}}"#,
        );
        assert!(matches!(e, ChatError::KeyRefused { status: 401, .. }));
        assert!(e.to_string().contains("refused the API key"), "{e}");
        let e = status_error(
            "http://h/v1",
            400,
            r#"{"error":{"message":"this model does not support tools"}}"#,
        );
        let s = e.to_string();
        assert!(
            s.contains("HTTP 400: this model does not support tools"),
            "{s}"
        );
        assert!(s.contains("tool calls"), "{s}");
        let e = status_error("http://h/v1", 404, "Not Found");
        assert!(e.to_string().contains("check --base-url"), "{e}");
    }

    #[test]
    fn defaults_follow_the_keys_in_the_environment() {
        let s = |b: Option<&str>, k: Option<&str>, o: Option<&str>, n: Option<&str>| {
            ModelSettings::resolve(
                b.map(str::to_owned),
                k.map(str::to_owned),
                None,
                o.map(str::to_owned),
                n.map(str::to_owned),
            )
        };
        let openai = s(None, None, Some("sk-o"), Some("sk-n")).unwrap();
        assert_eq!(openai.base_url, OPENAI_BASE_URL);
        assert_eq!(openai.api_key.as_deref(), Some("sk-o"));
        assert_eq!(openai.model, OPENAI_DEFAULT_MODEL);
        let novita = s(None, None, None, Some("sk-n")).unwrap();
        assert_eq!(novita.base_url, NOVITA_BASE_URL);
        assert_eq!(novita.api_key.as_deref(), Some("sk-n"));
        assert_eq!(novita.model, NOVITA_DEFAULT_MODEL);
        assert!(matches!(
            s(None, None, None, None),
            Err(ChatError::NoApiKey { .. })
        ));
        let local = s(Some("http://127.0.0.1:8080/v1/"), None, None, Some("sk-n")).unwrap();
        assert_eq!(local.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(local.api_key, None);
        let explicit = s(Some("http://x/v1"), Some("k"), Some("sk-o"), None).unwrap();
        assert_eq!(explicit.api_key.as_deref(), Some("k"));
    }

    #[test]
    fn a_non_streamed_completion_is_understood() {
        let v = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_code", "arguments": {"code": "1"}}}
        ]}}]});
        let reply = whole_reply(&v).unwrap();
        assert_eq!(reply.tool_calls[0].function.arguments, r#"{"code":"1"}"#);
    }
}
