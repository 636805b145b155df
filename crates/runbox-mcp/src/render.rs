//! From outcomes and errors to tool results: readable text for the model, the same facts as
//! `structuredContent` for programs, and `isError` when the call did not do what was asked.
//! Every error a backend returns becomes a tool result here, in one place; none becomes a
//! protocol error.

use std::fmt::Write as _;
use std::time::SystemTime;

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use runbox_core::Error;
use serde::Serialize;

use crate::types::{ChangedFileOut, RunCodeOutput, RunCommandOutput};

/// The latest time RFC 3339 can write: 9999-12-31T23:59:59.999Z.
const LATEST: std::time::Duration = std::time::Duration::from_millis(253_402_300_799_999);

/// RFC 3339 in UTC with milliseconds. Times it cannot write (a file's modification time is
/// whatever sandboxed code set: before 1970, or after the year 9999) are clamped to the
/// nearest it can, rather than failing the answer.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let since = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .min(LATEST);
    humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + since).to_string()
}

fn with_structured<T: Serialize>(mut result: CallToolResult, structured: &T) -> CallToolResult {
    match serde_json::to_value(structured) {
        Ok(v) => result.structured_content = Some(v),
        Err(e) => tracing::error!("structured result did not serialize: {e}"),
    }
    result
}

/// A successful result: `text` for people and models, `structured` for programs.
pub(crate) fn ok<T: Serialize>(text: String, structured: &T) -> CallToolResult {
    with_structured(
        CallToolResult::success(vec![ContentBlock::text(text)]),
        structured,
    )
}

/// A result whose call failed in a way the caller can act on, with only a message.
pub(crate) fn failure(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// The tool result for a backend error: what went wrong and what to do about it.
pub(crate) fn error(e: &Error) -> CallToolResult {
    let hint = match e {
        Error::SandboxNotFound { .. } => {
            " Call create_sandbox for a new one (list_sandboxes shows yours), or call run_code \
             without sandbox_id to use a fresh sandbox once."
        }
        Error::LimitReached(_) => " Close sandboxes you no longer need with close_sandbox.",
        Error::Sandbox { .. } => " This is a failure of the sandbox, not of your code; try again.",
        _ => "",
    };
    let mut message = runbox_core::chain(e);
    message.push_str(hint);
    failure(message)
}

/// Result representations that are also sent as MCP image content, so clients show them.
const IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];

pub(crate) fn section(text: &mut String, title: &str, body: &str) {
    if body.is_empty() {
        return;
    }
    let _ = writeln!(text, "[{title}]");
    text.push_str(body);
    if !body.ends_with('\n') {
        text.push('\n');
    }
}

/// Names the files a run created or changed in the text, and links each as a resource.
fn file_links(text: &mut String, files: &[ChangedFileOut]) -> Vec<ContentBlock> {
    if files.is_empty() {
        return Vec::new();
    }
    let _ = writeln!(text, "[files created or changed]");
    files
        .iter()
        .map(|f| {
            let _ = writeln!(text, "{} ({} bytes)", f.path, f.size);
            let name = f.path.rsplit('/').next().unwrap_or(&f.path).to_owned();
            let size = u64::try_from(f.size).unwrap_or(0);
            ContentBlock::resource_link(
                Resource::new(f.uri.clone(), name)
                    .with_title(f.path.clone())
                    .with_mime_type(f.mime_type.clone())
                    .with_size(size),
            )
        })
        .collect()
}

/// `run_code`'s result. `isError` when the code did not run to completion (an uncaught
/// error, a failing exit status, a timeout, a cancellation), with the output it produced.
pub(crate) fn run_code(out: &RunCodeOutput) -> CallToolResult {
    let mut text = String::new();
    section(&mut text, "stdout", &out.stdout);
    section(&mut text, "stderr", &out.stderr);
    let mut images = Vec::new();
    for r in &out.results {
        let mut shown = r
            .data
            .get("text/plain")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        let others: Vec<&str> = r
            .data
            .keys()
            .map(String::as_str)
            .filter(|m| *m != "text/plain")
            .collect();
        if !others.is_empty() {
            if !shown.is_empty() {
                shown.push('\n');
            }
            let _ = write!(shown, "(also as {})", others.join(", "));
        }
        for mime in IMAGE_TYPES {
            if let Some(data) = r.data.get(mime).and_then(|v| v.as_str()) {
                images.push(ContentBlock::image(data, mime));
            }
        }
        section(
            &mut text,
            if r.is_main_result {
                "result"
            } else {
                "display"
            },
            &shown,
        );
    }
    if let Some(e) = &out.error {
        let body = if e.traceback.is_empty() {
            format!("{}: {}", e.name, e.value)
        } else {
            e.traceback.clone()
        };
        section(&mut text, "error", &body);
    }
    if let Some(code) = out.exit_code.filter(|c| *c != 0) {
        let _ = writeln!(text, "[exit code {code}]");
    }
    let links = file_links(&mut text, &out.files);
    for note in &out.notes {
        let _ = writeln!(text, "[note] {note}");
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    let failed = out.error.is_some()
        || out.timed_out
        || out.cancelled
        || out.exit_code.is_some_and(|c| c != 0);
    let base = if failed {
        CallToolResult::error
    } else {
        CallToolResult::success
    };
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    content.extend(links);
    with_structured(base(content), out)
}

/// How a sandbox state reads in answers.
pub(crate) fn state_name(state: runbox_core::SandboxState) -> &'static str {
    match state {
        runbox_core::SandboxState::Running => "running",
        runbox_core::SandboxState::Paused => "paused",
        runbox_core::SandboxState::Closed => "closed",
    }
}

/// `run_command`'s result; `isError` for a non-zero status, a timeout or a cancellation.
pub(crate) fn run_command(out: &RunCommandOutput) -> CallToolResult {
    let mut text = String::new();
    section(&mut text, "stdout", &out.stdout);
    section(&mut text, "stderr", &out.stderr);
    match (out.exit_code, &out.process_id) {
        (Some(code), _) => {
            let _ = writeln!(text, "[exit code {code}]");
        }
        (None, Some(p)) => {
            let _ = writeln!(
                text,
                "[started in the background as process {p} in sandbox {}; read its output with \
                 read_process_output, stop it with kill_process]",
                out.sandbox_id
            );
        }
        (None, None) => {}
    }
    let links = file_links(&mut text, &out.files);
    for note in &out.notes {
        let _ = writeln!(text, "[note] {note}");
    }
    let failed = out.exit_code.is_some_and(|c| c != 0) || out.timed_out || out.cancelled;
    let base = if failed {
        CallToolResult::error
    } else {
        CallToolResult::success
    };
    let mut content = vec![ContentBlock::text(text)];
    content.extend(links);
    with_structured(base(content), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_of_rfc3339s_range_are_clamped_not_a_panic() {
        use std::time::Duration;
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(
            rfc3339(epoch + Duration::from_secs(86_400)),
            "1970-01-02T00:00:00.000Z"
        );
        // touch -d @253402300800 (year 10000) and touch -d 1960-01-01 in a sandbox.
        assert_eq!(
            rfc3339(epoch + Duration::from_secs(253_402_300_800)),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339(epoch - Duration::from_secs(315_619_200)),
            "1970-01-01T00:00:00.000Z"
        );
    }
    use crate::types::{ErrorOut, ResultOut};

    fn output() -> RunCodeOutput {
        RunCodeOutput {
            sandbox_id: "sbx_1".into(),
            ephemeral: false,
            stdout: "hi\n".into(),
            stderr: String::new(),
            results: vec![ResultOut {
                data: [("text/plain".to_owned(), serde_json::json!("42"))].into(),
                is_main_result: true,
            }],
            error: None,
            exit_code: None,
            duration_ms: 3,
            truncated: false,
            timed_out: false,
            cancelled: false,
            kernel_restarted: false,
            files: vec![],
            notes: vec![],
        }
    }

    fn text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text())
            .map(|t| t.text.clone())
            .collect()
    }

    #[test]
    fn success_reads_well_and_carries_the_structure() {
        let r = run_code(&output());
        assert_eq!(r.is_error, Some(false));
        assert_eq!(text(&r), "[stdout]\nhi\n[result]\n42\n");
        assert_eq!(
            r.structured_content.unwrap()["results"][0]["data"]["text/plain"],
            "42"
        );
    }

    #[test]
    fn a_failed_run_is_an_error_result_with_its_output() {
        let mut o = output();
        o.error = Some(ErrorOut {
            name: "ValueError".into(),
            value: "bad".into(),
            traceback: String::new(),
        });
        o.timed_out = true;
        o.notes.push("interrupted".into());
        let r = run_code(&o);
        assert_eq!(r.is_error, Some(true));
        let t = text(&r);
        assert!(t.contains("[stdout]\nhi\n"), "{t}");
        assert!(t.contains("[error]\nValueError: bad"), "{t}");
        assert!(t.contains("[note] interrupted"), "{t}");
        assert!(r.structured_content.is_some());
    }

    #[test]
    fn errors_say_what_to_do() {
        let r = error(&Error::not_found("sbx_9"));
        assert_eq!(r.is_error, Some(true));
        let t = text(&r);
        assert!(t.contains("sbx_9") && t.contains("create_sandbox"), "{t}");
        let r = error(&Error::sandbox_caused_by(
            "could not create a sandbox",
            std::io::Error::other("disk full"),
        ));
        assert!(text(&r).contains("disk full"));
    }

    #[test]
    fn images_become_image_content_too() {
        let mut o = output();
        o.results.push(ResultOut {
            data: [
                ("text/plain".to_owned(), serde_json::json!("<Figure>")),
                ("image/png".to_owned(), serde_json::json!("iVBORw0KGgo=")),
            ]
            .into(),
            is_main_result: false,
        });
        let r = run_code(&o);
        assert_eq!(r.content.len(), 2);
        let image = r.content[1].as_image().expect("an image block");
        assert_eq!(image.mime_type, "image/png");
        assert_eq!(image.data, "iVBORw0KGgo=");
        assert!(
            text(&r).contains("[display]\n<Figure>\n(also as image/png)"),
            "{}",
            text(&r)
        );
    }

    #[test]
    fn changed_files_are_named_and_linked() {
        let mut o = output();
        o.files.push(ChangedFileOut {
            path: "/workspace/out.csv".into(),
            size: 12,
            uri: "sandbox://sbx_1/files/workspace/out.csv".into(),
            mime_type: "text/csv".into(),
        });
        let r = run_code(&o);
        assert!(
            text(&r).contains("[files created or changed]\n/workspace/out.csv (12 bytes)\n"),
            "{}",
            text(&r)
        );
        let link = r.content[1].as_resource_link().expect("a resource link");
        assert_eq!(link.uri, "sandbox://sbx_1/files/workspace/out.csv");
        assert_eq!(link.name, "out.csv");
        assert_eq!(link.mime_type.as_deref(), Some("text/csv"));
    }

    #[test]
    fn empty_output_says_so() {
        let mut o = output();
        o.stdout.clear();
        o.results.clear();
        assert_eq!(text(&run_code(&o)), "(no output)\n");
    }
}
