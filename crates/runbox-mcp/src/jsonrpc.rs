//! Answers for messages that never reach a handler, the same on both transports: a message
//! that is not JSON gets `-32700`; a batch, a non-object or an object that is not a JSON-RPC
//! 2.0 message gets `-32600`; a message larger than the server reads gets `-32600` with the
//! `id` recovered from its bytes; params of a known method that do not fit it get `-32602`
//! naming the field. Notifications are never answered (JSON-RPC forbids it): they are logged.

use rmcp::model::{ErrorCode, ErrorData, RequestId};
use serde_json::Value;

/// What to answer a message rmcp could not decode: the request's id when it has a readable
/// one, and the error. `None`: a notification (or something shaped like one), which gets no
/// answer.
pub(crate) fn diagnose(bytes: &[u8]) -> Option<(Option<RequestId>, ErrorData)> {
    let value = match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => value,
        Err(e) => {
            return Some((
                None,
                ErrorData::parse_error(
                    format!(
                        "the message is not valid JSON ({e}); send one JSON-RPC 2.0 object per \
                         message"
                    ),
                    None,
                ),
            ));
        }
    };
    let object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Some((
                None,
                ErrorData::invalid_request(
                    "JSON-RPC batches are not supported (MCP removed them in 2025-06-18); send \
                     each request as a message of its own",
                    None,
                ),
            ));
        }
        _ => {
            return Some((
                None,
                ErrorData::invalid_request(
                    "a JSON-RPC message must be a JSON object with \"jsonrpc\": \"2.0\"",
                    None,
                ),
            ));
        }
    };
    let id = object.get("id").and_then(request_id);
    if object.contains_key("method") && !object.contains_key("id") {
        return None;
    }
    let why = if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        "it needs \"jsonrpc\": \"2.0\"".to_owned()
    } else if object.contains_key("id") && id.is_none() {
        "its \"id\" must be a string or an integer".to_owned()
    } else if let Some(method) = object.get("method") {
        match method.as_str() {
            Some(_) => "its \"params\" must be an object".to_owned(),
            None => "its \"method\" must be a string".to_owned(),
        }
    } else {
        "a request needs a \"method\" and an \"id\" (a response, \"result\" or \"error\" and the \
         \"id\" it answers)"
            .to_owned()
    };
    Some((
        id,
        ErrorData::invalid_request(
            format!("this is not a JSON-RPC 2.0 message: {why}; fix it and send it again"),
            None,
        ),
    ))
}

/// A JSON value as a request id: a string or an integer.
fn request_id(value: &Value) -> Option<RequestId> {
    match value {
        Value::String(_) | Value::Number(_) => serde_json::from_value(value.clone()).ok(),
        _ => None,
    }
}

/// The answer to a message of `size` bytes or more when the most one may have is `limit`.
pub(crate) fn too_large(size: usize, limit: usize) -> ErrorData {
    ErrorData::invalid_request(
        format!(
            "this message is {} or more, larger than the {} one message may be; send large \
             files in parts (write_file with append, read_file with offset and length)",
            mib(size),
            mib(limit)
        ),
        None,
    )
}

fn mib(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{bytes} bytes")
    }
}

/// For a request rmcp could not decode as the MCP request its method names (it then arrives
/// as a custom request): the `-32602` that says which field of its params is wrong. `None`
/// when its params do fit, or the method is not one the request's revision has (`stateless`:
/// 2026-07-28 or later, which removed `initialize`, `resources/subscribe`, ...): "method not
/// found".
pub(crate) fn invalid_params(
    method: &str,
    params: Option<&Value>,
    stateless: bool,
) -> Option<ErrorData> {
    use rmcp::model::{
        CallToolRequestParams, CompleteRequestParams, GetPromptRequestParams,
        InitializeRequestParams, ReadResourceRequestParams, SubscribeRequestParams,
        UnsubscribeRequestParams,
    };
    let params = params.cloned().unwrap_or(Value::Null);
    let removed = ["initialize", "resources/subscribe", "resources/unsubscribe"];
    if stateless && removed.contains(&method) {
        return None;
    }
    let (path, e) = match method {
        "tools/call" => field_error::<CallToolRequestParams>(params),
        "resources/read" => field_error::<ReadResourceRequestParams>(params),
        "prompts/get" => field_error::<GetPromptRequestParams>(params),
        "initialize" => field_error::<InitializeRequestParams>(params),
        "completion/complete" => field_error::<CompleteRequestParams>(params),
        "resources/subscribe" => field_error::<SubscribeRequestParams>(params),
        "resources/unsubscribe" => field_error::<UnsubscribeRequestParams>(params),
        _ => None,
    }?;
    let message = if path == "." {
        format!("the params of {method} do not fit it: {e}; fix them and send it again")
    } else {
        format!(
            "the params of {method} do not fit it: `{path}`: {e}; fix that field and send it \
             again"
        )
    };
    Some(ErrorData::new(ErrorCode::INVALID_PARAMS, message, None))
}

/// Where `params` fails to decode as `T`, and why.
fn field_error<T: serde::de::DeserializeOwned>(params: Value) -> Option<(String, String)> {
    match serde_path_to_error::deserialize::<_, T>(params) {
        Ok(_) => None,
        Err(e) => Some((e.path().to_string(), e.inner().to_string())),
    }
}

/// Reads the top-level `"id"` of a JSON object as its bytes go by, in constant memory: the
/// id of a message too large to keep, wherever in it the id is.
#[derive(Debug, Default)]
pub(crate) struct IdScanner {
    /// Nesting depth: 1 inside the top-level object.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1: the next string is a key (not a value).
    expect_key: bool,
    /// The key being read, while it could still be `id`; `None` when it cannot.
    key: Option<Vec<u8>>,
    /// The last key read at depth 1 was `id` and its value has not started.
    id_key: bool,
    /// The id's value, while it is read.
    value: Option<Vec<u8>>,
    /// Whether the first byte has been seen (a message that does not open with `{` has no
    /// id to find).
    started: bool,
    /// The answer, once known.
    found: Option<Option<RequestId>>,
}

/// Longest id value read.
const MAX_ID_BYTES: usize = 256;

impl IdScanner {
    /// Feeds the next bytes of the message.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.found.is_some() {
                return;
            }
            self.step(b);
        }
    }

    /// The id, if one was read.
    pub(crate) fn id(&self) -> Option<RequestId> {
        self.found.clone().flatten()
    }

    fn step(&mut self, b: u8) {
        if !self.started {
            if b.is_ascii_whitespace() || b == 0xEF || b == 0xBB || b == 0xBF {
                return;
            }
            self.started = true;
            if b != b'{' {
                self.found = Some(None);
                return;
            }
            self.depth = 1;
            self.expect_key = true;
            return;
        }
        if let Some(value) = &mut self.value {
            if self.in_string {
                value.push(b);
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.finish();
                    return;
                }
            } else if value.is_empty() && b.is_ascii_whitespace() {
                return;
            } else if value.is_empty() && b == b'"' {
                self.in_string = true;
                value.push(b);
            } else if matches!(b, b',' | b'}') || b.is_ascii_whitespace() {
                self.finish();
                return;
            } else if matches!(b, b'{' | b'[') {
                self.found = Some(None);
                return;
            } else {
                value.push(b);
            }
            if self.value.as_ref().is_some_and(|v| v.len() > MAX_ID_BYTES) {
                self.found = Some(None);
            }
            return;
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
                self.key = None;
            } else if b == b'\\' {
                self.escaped = true;
                self.key = None;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    self.id_key = key == b"id";
                }
            } else if let Some(key) = &mut self.key {
                key.push(b);
                if key.len() > 2 {
                    self.key = None;
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key = Some(Vec::new());
                    self.expect_key = false;
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.found = Some(None);
                }
            }
            b':' if self.depth == 1 && self.id_key => {
                self.id_key = false;
                self.value = Some(Vec::new());
            }
            b',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
    }

    fn finish(&mut self) {
        let id = self
            .value
            .take()
            .and_then(|v| serde_json::from_slice::<Value>(&v).ok())
            .as_ref()
            .and_then(request_id);
        self.found = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Option<RequestId> {
        let mut whole = IdScanner::default();
        whole.feed(text.as_bytes());
        // Byte by byte gives the same answer.
        let mut bytewise = IdScanner::default();
        for b in text.as_bytes() {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(whole.id(), bytewise.id(), "{text}");
        whole.id()
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        let n = |i| Some(RequestId::Number(i));
        let s = |t: &str| Some(RequestId::String(t.into()));
        assert_eq!(scan(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#), n(7));
        assert_eq!(
            scan(r#"{"method":"tools/call","params":{"id":1,"a":[{"id":2}]},"id": "abc" }"#),
            s("abc")
        );
        assert_eq!(scan(r#"{"params":{"code":"\"id\": 3"},"id":-12}"#), n(-12));
        assert_eq!(scan(r#" {"id" : "a\"b"}"#), s("a\"b"));
        assert_eq!(scan(r#"{"idx":1,"xid":2,"id":3}"#), n(3));
    }

    #[test]
    fn no_id_no_answer() {
        assert_eq!(
            scan(r#"{"method":"notifications/x","params":{"id":1}}"#),
            None
        );
        assert_eq!(scan(r#"[{"id":1}]"#), None);
        assert_eq!(scan(r#"{"id":{"a":1}}"#), None);
        assert_eq!(scan(r#"{"id":null}"#), None);
        assert_eq!(scan(r#"{"id":1.5}"#), None);
        // Cut short before the id ends: nothing certain.
        assert_eq!(scan(r#"{"method":"x","id":12"#), None);
    }

    #[test]
    fn undecodable_messages_get_the_spec_codes() {
        let code = |text: &str| diagnose(text.as_bytes()).map(|(id, e)| (id, e.code.0));
        assert_eq!(code("{not json"), Some((None, -32700)));
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Some((None, -32600))
        );
        assert_eq!(code("42"), Some((None, -32600)));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#),
            Some((Some(RequestId::Number(3)), -32600))
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":5}"#), None);
    }

    #[test]
    fn wrong_params_of_known_methods_name_the_field() {
        let e = invalid_params(
            "tools/call",
            Some(&serde_json::json!({"name": "run_code", "arguments": "print(1)"})),
            true,
        )
        .unwrap();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert!(e.message.contains("`arguments`"), "{}", e.message);
        assert!(invalid_params("my/method", None, false).is_none());
        // Params that fit: the method itself was not taken (a removed one), not its params.
        let fits = serde_json::json!({"uri": "data://x"});
        assert!(invalid_params("resources/subscribe", Some(&fits), false).is_none());
        let wrong = serde_json::json!({"uri": 3});
        assert!(invalid_params("resources/subscribe", Some(&wrong), false).is_some());
        // A method the stateless revision removed is not found, whatever its params.
        assert!(invalid_params("resources/subscribe", Some(&wrong), true).is_none());
    }
}
