//! The code interpreter of the `code-interpreter` templates (port 49999): `POST /execute`
//! answers with NDJSON, one object per line, ending with `{"type": "end_of_execution"}`.
//! Each language has a default context (a Jupyter kernel) that keeps its state.

use std::collections::BTreeMap;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use runbox_core::{ExecError, Language, RichResult};
use serde_json::Value;

/// Longest line accepted (a result can carry a large image in base64).
const MAX_LINE: usize = 64 << 20;

/// The interpreter's name of a language.
pub(crate) fn language_name(l: Language) -> &'static str {
    match l {
        Language::Python => "python",
        Language::JavaScript => "javascript",
        Language::TypeScript => "typescript",
        Language::Bash => "bash",
    }
}

/// One line of an execution's stream.
#[derive(Debug, PartialEq)]
pub(crate) enum Line {
    Stdout(String),
    Stderr(String),
    Result(RichResult),
    Error(ExecError),
    End,
    /// A keepalive, the execution count, or a kind runbox does not know.
    Other,
}

/// The result fields of the interpreter and the MIME types they stand for.
const FORMATS: &[(&str, &str)] = &[
    ("text", "text/plain"),
    ("html", "text/html"),
    ("markdown", "text/markdown"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("jpeg", "image/jpeg"),
    ("pdf", "application/pdf"),
    ("latex", "text/latex"),
    ("json", "application/json"),
    ("javascript", "application/javascript"),
    ("data", "application/vnd.e2b.data+json"),
    ("chart", "application/vnd.e2b.chart+json"),
];

/// Reads one line of the stream.
pub(crate) fn parse_line(line: &[u8]) -> Result<Line, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("a malformed line: {e}"))?;
    let text = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Ok(match v.get("type").and_then(Value::as_str) {
        Some("stdout") => Line::Stdout(text("text")),
        Some("stderr") => Line::Stderr(text("text")),
        Some("error") => Line::Error(ExecError {
            name: text("name"),
            value: text("value"),
            traceback: strip_ansi(&text("traceback")),
        }),
        Some("end_of_execution") => Line::End,
        Some("result") => Line::Result(result(&v)),
        _ => Line::Other,
    })
}

fn result(v: &Value) -> RichResult {
    let mut data = BTreeMap::new();
    for (field, mime) in FORMATS {
        let Some(x) = v.get(*field).filter(|x| !x.is_null()) else {
            continue;
        };
        let x = match (*field, x) {
            // Jupyter's base64 may be wrapped; MCP image content wants it in one piece.
            ("png" | "jpeg", Value::String(s)) => Value::String(s.split_whitespace().collect()),
            _ => x.clone(),
        };
        data.insert((*mime).to_owned(), x);
    }
    if let Some(extra) = v.get("extra").and_then(Value::as_object) {
        for (k, x) in extra {
            data.entry(k.clone()).or_insert_with(|| x.clone());
        }
    }
    RichResult {
        data,
        is_main_result: v
            .get("is_main_result")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

/// `s` without terminal escape sequences (tracebacks come coloured).
pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters, then one final byte in @..~.
            Some('[') => {
                for n in chars.by_ref() {
                    if ('@'..='~').contains(&n) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ESC \.
            Some(']') => {
                while let Some(n) = chars.next() {
                    if n == '\u{7}' {
                        break;
                    }
                    if n == '\u{1b}' {
                        if chars.peek() == Some(&'\\') {
                            chars.next();
                        }
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Splits a response body into lines, whatever chunks it arrives in.
pub(crate) struct Lines {
    body: ByteStream,
    buf: BytesMut,
    done: bool,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

/// Why a stream of lines stopped early.
#[derive(Debug)]
pub(crate) enum LinesError {
    Transport(reqwest::Error),
    TooLong,
}

impl Lines {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            body: Box::pin(response.bytes_stream()),
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// The next non-empty line; `None` at the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, LinesError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(i + 1).freeze();
                let line = line.slice(..i);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.done {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                // A last line without its newline.
                return Ok(Some(std::mem::take(&mut self.buf).freeze()));
            }
            if self.buf.len() > MAX_LINE {
                return Err(LinesError::TooLong);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(LinesError::Transport(e)),
                None => self.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_type_is_read() {
        assert_eq!(
            parse_line(
                br#"{"type": "stdout", "text": "hi\n", "timestamp": "2025-01-01T00:00:00Z"}"#
            )
            .unwrap(),
            Line::Stdout("hi\n".into())
        );
        assert_eq!(
            parse_line(br#"{"type": "end_of_execution"}"#).unwrap(),
            Line::End
        );
        assert_eq!(
            parse_line(br#"{"type": "keepalive"}"#).unwrap(),
            Line::Other
        );
        assert_eq!(
            parse_line(br#"{"type": "number_of_executions", "execution_count": 2}"#).unwrap(),
            Line::Other
        );
        assert!(parse_line(b"{not json").is_err());
        let Line::Error(e) = parse_line(
            br#"{"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "\u001b[0;31mZeroDivisionError\u001b[0m: division by zero\u001b]8;;x\u0007"}"#,
        )
        .unwrap() else {
            panic!("not an error")
        };
        assert_eq!(e.name, "ZeroDivisionError");
        assert_eq!(e.traceback, "ZeroDivisionError: division by zero");
    }

    #[test]
    fn results_become_mime_bundles() {
        let Line::Result(r) = parse_line(
            br#"{"type": "result", "text": "<Figure>", "png": "iVBO\nRw0K", "chart": {"type": "line"},
                "extra": {"application/geo+json": {"x": 1}, "text/plain": "ignored"}, "is_main_result": false}"#,
        )
        .unwrap() else {
            panic!("not a result")
        };
        assert!(!r.is_main_result);
        assert_eq!(r.text(), Some("<Figure>"));
        assert_eq!(r.data["image/png"], "iVBORw0K");
        assert_eq!(r.data["application/vnd.e2b.chart+json"]["type"], "line");
        assert_eq!(r.data["application/geo+json"]["x"], 1);
        let Line::Result(main) =
            parse_line(br#"{"type": "result", "text": "2", "extra": {}, "is_main_result": true}"#)
                .unwrap()
        else {
            panic!("not a result")
        };
        assert!(main.is_main_result);
        assert_eq!(main.data.len(), 1);
    }
}
