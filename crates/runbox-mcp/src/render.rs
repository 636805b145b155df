//! From outcomes and errors to tool results: readable text for the model, the same facts as
//! `structuredContent` for programs, and `isError` when the call did not do what was asked.
//! Every error a backend returns becomes a tool result here, in one place; none becomes a
//! protocol error.

use std::fmt::Write as _;
use std::time::SystemTime;

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use runbox_core::Error;
use serde::Serialize;

use base64::Engine as _;

use crate::budget::Stash;
use crate::types::{ChangedFileOut, ResultOut, RunCodeOutput, RunCommandOutput};

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

/// `message` as a sentence (a capital first letter, a full stop at the end), followed by
/// `advice`, the sentences that say what to do (none when empty).
pub(crate) fn sentences(message: &str, advice: &str) -> String {
    let message = message.trim();
    let mut out = String::with_capacity(message.len() + advice.len() + 2);
    let mut chars = message.chars();
    if let Some(first) = chars.next() {
        out.extend(first.to_uppercase());
        out.push_str(chars.as_str());
    }
    if !out.is_empty() && !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    let advice = advice.trim();
    if !advice.is_empty() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(advice);
    }
    out
}

/// What to do about a backend error, in the default profile's words; empty when the error
/// says it itself. Limits say what to do in their own message (delete files, read in parts,
/// close a sandbox), since only they know which limit was hit.
fn advice(e: &Error) -> &'static str {
    match e {
        Error::SandboxNotFound { .. } => {
            "Call create_sandbox for a new one (list_sandboxes shows yours), or call run_code \
             without sandbox_id to use a fresh sandbox once."
        }
        Error::Sandbox { .. } => "This is a failure of the sandbox, not of your code; try again.",
        _ => "",
    }
}

/// The tool result for a backend error: what went wrong and what to do about it, as
/// sentences.
pub(crate) fn error(e: &Error) -> CallToolResult {
    failure(sentences(&runbox_core::chain(e), advice(e)))
}

/// Result representations that are images: sent once, as MCP image content (so clients
/// show them) or as a link when too big, with a reference in `structuredContent`.
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// A value of a result bigger than this share of the message limit is kept as an output and
/// referred to, not sent inline.
const BIG_VALUE_SHARE: usize = 4;

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

/// A file name extension for a MIME type, for the names of kept outputs.
fn extension(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "text/html" => "html",
        "application/json" => "json",
        "text/markdown" => "md",
        "text/latex" => "tex",
        "application/javascript" => "js",
        _ => "txt",
    }
}

/// A result value sent elsewhere: an image (the bytes go once, in `block`, or as a link) or
/// a value too big to send inline.
struct Moved {
    kept: crate::outputs::Kept,
    name: String,
    mime: String,
    /// The image block, for an image that may travel inline.
    image: Option<ContentBlock>,
}

/// Takes the images and big values out of `results`, keeps each as an output, and puts a
/// reference `{"uri", "size"}` where each was.
fn move_out(results: &mut [ResultOut], stash: &Stash<'_>) -> Vec<Moved> {
    let big = stash.limit / BIG_VALUE_SHARE;
    let mut moved = Vec::new();
    for (i, r) in results.iter_mut().enumerate() {
        for (mime, value) in r.data.iter_mut() {
            let image = IMAGE_TYPES.contains(&mime.as_str());
            let (bytes, block) = match &mut *value {
                serde_json::Value::String(b64) if image => {
                    match base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()) {
                        Ok(bytes) => (bytes, Some(ContentBlock::image(b64.clone(), mime.clone()))),
                        Err(_) => continue,
                    }
                }
                serde_json::Value::String(text) if text.len() > big => {
                    (std::mem::take(text).into_bytes(), None)
                }
                serde_json::Value::String(_) => continue,
                other => {
                    let json = other.to_string();
                    if json.len() <= big {
                        continue;
                    }
                    (json.into_bytes(), None)
                }
            };
            let name = format!("result-{}.{}", i + 1, extension(mime));
            let kept = stash.put(&name, mime, bytes);
            *value = serde_json::json!({ "uri": kept.uri, "size": kept.size });
            moved.push(Moved {
                kept,
                name,
                mime: mime.clone(),
                image: block,
            });
        }
    }
    moved
}

/// How a result value shows in the text: itself, or where it is when it was kept.
fn shown_value(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) if o.contains_key("uri") => format!(
            "(too big to show here: {} bytes, kept as {})",
            o.get("size").and_then(|s| s.as_u64()).unwrap_or(0),
            o.get("uri").and_then(|u| u.as_str()).unwrap_or("")
        ),
        _ => String::new(),
    }
}

/// `run_code`'s result. `isError` when the code did not run to completion (an uncaught
/// error, a failing exit status, a timeout, a cancellation), with the output it produced.
/// Images travel once: as image content when they fit in the message, as a link to a kept
/// output otherwise, with a reference in `structuredContent` either way (see `budget`).
pub(crate) fn run_code(mut out: RunCodeOutput, stash: &Stash<'_>) -> CallToolResult {
    let moved = move_out(&mut out.results, stash);
    let mut text = String::new();
    for r in &out.results {
        let mut shown = shown_value(r.data.get("text/plain"));
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
    let room = stash.room();
    let structured = json_size(&out);
    let mut text = streams(
        &out.stdout,
        &out.stderr,
        room,
        structured + json_size(&text),
    ) + &text;
    // What is sent so far, and so the room left for images inline.
    let mut used = structured + json_size(&text) + links.len() * 512;
    let mut blocks = Vec::new();
    for m in moved {
        let inline = m.image.filter(|image| {
            let size = image.as_image().map_or(usize::MAX, |i| i.data.len() + 128);
            used.saturating_add(size) <= room
        });
        match inline {
            Some(image) => {
                used += image.as_image().map_or(0, |i| i.data.len() + 128);
                blocks.push(image);
            }
            None => {
                let what = if m.mime.starts_with("image/") {
                    "An image"
                } else {
                    "A result"
                };
                let (link, line) =
                    crate::budget::output_link(&m.kept, &m.name, &m.mime, what, stash.piece());
                used += 1024;
                let _ = writeln!(text, "{line}");
                blocks.push(link);
            }
        }
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
    content.extend(blocks);
    content.extend(links);
    with_structured(base(content), &out)
}

/// How many bytes `v` takes as JSON.
fn json_size<T: Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX, |j| j.len())
}

/// The `[stdout]` and `[stderr]` sections of a run's text. The text repeats what
/// `structuredContent` carries; when both would not fit in `room` with the `used` bytes
/// already taken, the text shows the head and tail of each stream and says where the rest
/// is (`structuredContent` keeps all of it).
fn streams(stdout: &str, stderr: &str, room: usize, used: usize) -> String {
    let mut text = String::new();
    let left = room.saturating_sub(used);
    if json_size(stdout) + json_size(stderr) + 64 <= left {
        section(&mut text, "stdout", stdout);
        section(&mut text, "stderr", stderr);
        return text;
    }
    let share = left / 2;
    section(&mut text, "stdout", &shorten(stdout, share));
    section(&mut text, "stderr", &shorten(stderr, share));
    text
}

/// `s`, or its head and tail when it takes more than `room` bytes as JSON.
fn shorten(s: &str, room: usize) -> String {
    if json_size(s) <= room {
        return s.to_owned();
    }
    let half = room.saturating_sub(256) / 2;
    let head = crate::files::fit_json(s, half);
    let mut taken = 0;
    let mut tail_at = s.len();
    for (i, c) in s.char_indices().rev() {
        taken += crate::files::json_len(c);
        if taken > half || i < head.len() {
            break;
        }
        tail_at = i;
    }
    let tail = &s[tail_at..];
    format!(
        "{head}\n[... {} bytes left out of this text to fit one message; structuredContent has \
         all of the output ...]\n{tail}",
        s.len() - head.len() - tail.len()
    )
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
pub(crate) fn run_command(out: &RunCommandOutput, stash: &Stash<'_>) -> CallToolResult {
    let mut text = String::new();
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
    let used = json_size(out) + json_size(&text) + links.len() * 512;
    let text = streams(&out.stdout, &out.stderr, stash.room(), used) + &text;
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

    /// Renders `o` with an output store of its own and the default message limit.
    fn render(o: &RunCodeOutput) -> CallToolResult {
        render_with(
            o,
            &crate::outputs::OutputStore::default(),
            crate::budget::DEFAULT_MESSAGE_LIMIT,
        )
    }

    fn render_with(
        o: &RunCodeOutput,
        store: &crate::outputs::OutputStore,
        limit: usize,
    ) -> CallToolResult {
        let stash = Stash {
            store,
            tenant: "t",
            limit,
        };
        run_code(o.clone(), &stash)
    }

    #[test]
    fn success_reads_well_and_carries_the_structure() {
        let r = render(&output());
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
        let r = render(&o);
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
    fn errors_read_as_sentences_with_the_advice_that_fits() {
        let t = text(&error(&Error::not_found("sbx_9")));
        assert!(
            t.starts_with("Sandbox sbx_9 not found: it never existed, was closed, or expired. Call create_sandbox"),
            "{t}"
        );
        // A full disk or a too-large file is not helped by closing sandboxes.
        for e in [
            Error::LimitReached("no space left for /workspace/a: the sandbox's disk is full; delete files you no longer need".into()),
            Error::LimitReached("length 9 exceeds the maximum of one read; read in parts with offset and length".into()),
        ] {
            let t = text(&error(&e));
            assert!(!t.contains("close_sandbox") && !t.contains("Close sandboxes"), "{t}");
            assert!(t.starts_with("Limit reached: ") && t.ends_with('.'), "{t}");
        }
        assert_eq!(sentences("a: b", ""), "A: b.");
        assert_eq!(sentences("done.", "Go on."), "Done. Go on.");
        assert_eq!(
            sentences("/workspace/x: no such file or directory", ""),
            "/workspace/x: no such file or directory."
        );
    }

    fn figure(b64: &str) -> ResultOut {
        ResultOut {
            data: [
                ("text/plain".to_owned(), serde_json::json!("<Figure>")),
                ("image/png".to_owned(), serde_json::json!(b64)),
            ]
            .into(),
            is_main_result: false,
        }
    }

    #[test]
    fn images_travel_once_as_image_content_with_a_reference() {
        let mut o = output();
        o.results.push(figure("iVBORw0KGgo="));
        let store = crate::outputs::OutputStore::default();
        let r = render_with(&o, &store, crate::budget::DEFAULT_MESSAGE_LIMIT);
        assert_eq!(r.content.len(), 2);
        let image = r.content[1].as_image().expect("an image block");
        assert_eq!(image.mime_type, "image/png");
        assert_eq!(image.data, "iVBORw0KGgo=");
        assert!(
            text(&r).contains("[display]\n<Figure>\n(also as image/png)"),
            "{}",
            text(&r)
        );
        // structuredContent names the image, not its bytes: they are not sent twice.
        let reference = &r.structured_content.as_ref().unwrap()["results"][1]["data"]["image/png"];
        assert_eq!(reference["size"], 8, "{reference}");
        let uri = reference["uri"].as_str().unwrap();
        let key =
            crate::outputs::key_of(uri.strip_prefix(crate::outputs::SCHEME).unwrap()).unwrap();
        assert_eq!(&*store.get("t", key).unwrap().data, b"\x89PNG\r\n\x1a\n");
        assert_eq!(
            serde_json::to_string(&r)
                .unwrap()
                .matches("iVBORw0KGgo=")
                .count(),
            1,
            "the base64 travels once"
        );
    }

    #[test]
    fn full_streams_show_their_head_and_tail_in_the_text_when_both_copies_would_not_fit() {
        let mut o = output();
        o.stdout = format!("first\n{}last\n", "x\n".repeat(60_000));
        o.stderr = "\u{1}".repeat(20_000);
        let limit = crate::budget::DEFAULT_MESSAGE_LIMIT;
        let r = render_with(&o, &crate::outputs::OutputStore::default(), limit);
        assert!(
            crate::budget::size_of(&r) < limit,
            "{}",
            crate::budget::size_of(&r)
        );
        let t = text(&r);
        assert!(
            t.starts_with("[stdout]\nfirst\n") && t.contains("last\n"),
            "{}",
            &t[..100]
        );
        assert!(t.contains("left out of this text"), "shortened");
        assert_eq!(
            r.structured_content.unwrap()["stdout"],
            o.stdout.as_str(),
            "all of it"
        );
        // Output that fits is shown whole.
        let r = render(&output());
        assert!(!text(&r).contains("left out"));
        assert_eq!(shorten("abc", 10), "abc");
        let short = shorten(&"é".repeat(1000), 600);
        assert!(
            short.starts_with('é') && short.ends_with('é') && short.len() < 700,
            "{short}"
        );
    }

    #[test]
    fn an_image_too_big_for_the_message_goes_as_a_link() {
        let mut o = output();
        let big = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 300_000]);
        o.results.push(figure(&big));
        o.results.push(figure("iVBORw0KGgo="));
        let store = crate::outputs::OutputStore::default();
        let limit = crate::budget::MIN_MESSAGE_LIMIT * 2;
        let r = render_with(&o, &store, limit);
        assert!(
            crate::budget::size_of(&r) < limit,
            "{}",
            crate::budget::size_of(&r)
        );
        let link = r.content[1]
            .as_resource_link()
            .expect("a link to the big image");
        assert_eq!(link.size, Some(300_000));
        assert!(link.uri.starts_with("output://"), "{}", link.uri);
        assert!(
            r.content[2].as_image().is_some(),
            "the small one still inline"
        );
        assert!(
            text(&r).contains(&format!("{}?offset=0&length=", link.uri)),
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
        let r = render(&o);
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
        assert_eq!(text(&render(&o)), "(no output)\n");
    }
}
