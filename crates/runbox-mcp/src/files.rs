//! The file tools: list, read and write files of a sandbox. Paths are checked by the
//! backend (the local one resolves them beneath the sandbox's own directories); this layer
//! turns arguments into requests and bytes into text, base64 or image content.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};
use runbox_core::{Error, FileContent, SandboxId};

use crate::render;
use crate::resources::{is_image, mime_type, sandbox_file_uri};
use crate::server::RunboxServer;
use crate::types::{
    Encoding, FileEntryOut, FileTypeOut, ListFilesArgs, ListFilesOutput, ReadFileArgs,
    ReadFileOutput, WriteFileArgs, WriteFileOutput,
};

/// Standard base64, padded or not, as callers send it.
const BASE64_IN: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const BASE64_OUT: GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Most bytes one read of a file takes, whatever the message limit (the local backend's
/// own maximum). With the default limit a `read_file` returns far fewer: see
/// [`RunboxServer::read_budget`].
pub(crate) const MAX_READ: u64 = 4 << 20;

/// How many bytes `c` takes in a JSON string (as serde_json writes it).
pub(crate) fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The longest start of `text` that takes at most `budget` bytes as a JSON string.
pub(crate) fn fit_json(text: &str, budget: usize) -> &str {
    let mut used = 0;
    for (i, c) in text.char_indices() {
        used += json_len(c);
        if used > budget {
            return &text[..i];
        }
    }
    text
}

fn offset_arg(v: Option<i64>, what: &str) -> Result<Option<u64>, Error> {
    v.map(|v| {
        u64::try_from(v)
            .map_err(|_| Error::InvalidRequest(format!("{what} must be zero or more, got {v}")))
    })
    .transpose()
}

/// The text of `bytes` read from `read` (a part of a file when `partial`), or `None` when
/// they are not UTF-8. A character cut by the end of a part is left for the next part.
fn utf8_prefix(bytes: &[u8], partial: bool) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s),
        Err(e) if partial && e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

/// The answer to `read_file`: the text itself (as text content and in
/// `structuredContent`), other bytes once as base64 in `structuredContent`, a whole image
/// once as image content (`content` is then empty and `uri` names the file), and where to
/// go on when bytes remain. Text takes at most `text_room` bytes as JSON per copy: text
/// full of control characters escapes to six times its size, so it comes in shorter parts.
fn read_result(
    content: FileContent,
    asked: Option<Encoding>,
    uri: String,
    text_room: usize,
) -> Result<CallToolResult, Error> {
    let mime = mime_type(&content.path);
    let partial = content.more();
    let (encoding, text, used) = match asked {
        Some(Encoding::Base64) => (Encoding::Base64, None, content.data.len()),
        _ => match utf8_prefix(&content.data, partial) {
            Some(t) => {
                let t = fit_json(t, text_room);
                (Encoding::Utf8, Some(t.to_owned()), t.len())
            }
            None if asked == Some(Encoding::Utf8) => {
                return Err(Error::InvalidRequest(format!(
                    "{} is not UTF-8 text ({mime}); read it with encoding \"base64\"",
                    content.path
                )));
            }
            None => (Encoding::Base64, None, content.data.len()),
        },
    };
    let data = &content.data[..used];
    let end = content.offset + used as u64;
    let more = end < content.size;
    let whole_image = is_image(&mime) && content.offset == 0 && !more;
    let b64 = (encoding == Encoding::Base64).then(|| BASE64_OUT.encode(data));
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut out = ReadFileOutput {
        path: content.path.clone(),
        content: String::new(),
        encoding,
        offset: i(content.offset),
        length: i(used as u64),
        size: i(content.size),
        more,
        mime_type: mime.clone(),
        uri,
    };
    let mut blocks = Vec::new();
    match (text, b64) {
        (Some(t), _) => {
            blocks.push(ContentBlock::text(t.clone()));
            out.content = t;
        }
        (None, Some(b)) if whole_image => {
            blocks.push(ContentBlock::text(format!(
                "{}: {mime}, {} bytes, shown as an image (its bytes are in the image content only; \
                 the resource {} reads them too)",
                content.path, content.size, out.uri
            )));
            blocks.push(ContentBlock::image(b, mime.clone()));
        }
        (None, Some(b)) => {
            blocks.push(ContentBlock::text(format!(
                "{} ({mime}, not text): {used} bytes, as base64 in structuredContent.content",
                content.path
            )));
            out.content = b;
        }
        (None, None) => {}
    }
    if more || content.offset > 0 {
        blocks.push(ContentBlock::text(format!(
            "[bytes {}..{end} of {}{}]",
            content.offset,
            content.size,
            if more {
                format!("; read on with offset {end}")
            } else {
                String::new()
            }
        )));
    }
    let mut result = CallToolResult::success(blocks);
    result.structured_content = serde_json::to_value(&out).ok();
    Ok(result)
}

#[tool_router(router = file_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        description = "List a directory of a sandbox: name, path, type (file, directory, symlink), \
                       size and modification time of each entry. path defaults to /workspace; \
                       recursive lists everything below it. The file tools reach /workspace, /tmp \
                       and, when the server has one, the read-only /data.",
        output_schema = schema_for_output::<ListFilesOutput>(),
        annotations(title = "List files", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        let path = args.path.unwrap_or_else(|| "/workspace".into());
        let listing = match self
            .registry()
            .list_files(&caller.tenant, &id, &path, args.recursive)
            .await
        {
            Ok(l) => l,
            Err(e) => return render::error(&e),
        };
        let mut text = String::new();
        if listing.entries.is_empty() {
            let _ = writeln!(text, "{path} is empty.");
        }
        // Each entry shows twice (a line of text, and in structuredContent): as many as fit
        // in one answer.
        let room = self.read_budget() as usize * 2;
        let mut used = 0;
        let mut entries = Vec::with_capacity(listing.entries.len());
        let mut cut = false;
        for e in listing.entries {
            let e = FileEntryOut {
                name: e.name,
                path: e.path,
                kind: e.kind.into(),
                size: i64::try_from(e.size).unwrap_or(i64::MAX),
                modified: render::rfc3339(e.modified),
            };
            let (tag, suffix) = match e.kind {
                FileTypeOut::Directory => ("dir ", "/"),
                FileTypeOut::Symlink => ("link", ""),
                FileTypeOut::File => ("file", ""),
                FileTypeOut::Other => ("othr", ""),
            };
            let line = format!("{tag} {:>10}  {}  {}{suffix}\n", e.size, e.modified, e.path);
            used += serde_json::to_string(&line).map_or(line.len(), |l| l.len())
                + serde_json::to_string(&e).map_or(0, |j| j.len() + 1);
            if used > room {
                cut = true;
                break;
            }
            text.push_str(&line);
            entries.push(e);
        }
        if cut {
            let _ = writeln!(
                text,
                "[listing cut at {} entries to fit in one answer; list a subdirectory, or without \
                 recursive, for the rest]",
                entries.len()
            );
        } else if listing.truncated {
            let _ = writeln!(
                text,
                "[listing cut at {} entries; list a subdirectory for the rest]",
                entries.len()
            );
        }
        let shown = if path.starts_with('/') {
            path
        } else {
            format!("/workspace/{path}")
        };
        render::ok(
            text,
            &ListFilesOutput {
                path: shown,
                entries,
                truncated: listing.truncated || cut,
            },
        )
    }

    #[tool(
        description = "Read a file of a sandbox. Text comes back as utf-8 and other files as base64 \
                       (or ask with encoding); a whole image comes as image content. Big files \
                       come in parts, so that no answer is too big for a client: a call returns \
                       at most 256 KiB (with the default message limit); `more` says whether \
                       bytes remain, and the next call reads on with offset.",
        output_schema = schema_for_output::<ReadFileOutput>(),
        annotations(title = "Read a file", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        let most = self.read_budget();
        let (offset, length) = match (
            offset_arg(args.offset, "offset"),
            offset_arg(args.length, "length"),
        ) {
            (Ok(o), Ok(l)) => (o.unwrap_or(0), Some(l.unwrap_or(most).min(most))),
            (Err(e), _) | (_, Err(e)) => return render::error(&e),
        };
        match self
            .registry()
            .read_file(&caller.tenant, &id, &args.path, offset, length)
            .await
            .and_then(|c| {
                let uri = sandbox_file_uri(&id, &c.path);
                read_result(c, args.encoding, uri, most as usize)
            }) {
            Ok(r) => r,
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Write a file in a sandbox's /workspace or /tmp, creating missing parent \
                       directories. content is utf-8 text, or base64 with encoding \"base64\" for \
                       binary files; append adds to the end instead of replacing the file (write \
                       files over 16 MiB in parts that way).",
        output_schema = schema_for_output::<WriteFileOutput>(),
        annotations(title = "Write a file", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn write_file(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<WriteFileArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        let data = match args.encoding.unwrap_or(Encoding::Utf8) {
            Encoding::Utf8 => args.content.into_bytes(),
            Encoding::Base64 => {
                let compact: Vec<u8> = args
                    .content
                    .bytes()
                    .filter(|b| !b.is_ascii_whitespace())
                    .collect();
                match BASE64_IN.decode(compact) {
                    Ok(d) => d,
                    Err(e) => {
                        return render::error(&Error::InvalidRequest(format!(
                            "content is not valid base64 ({e}); send standard base64, or text with encoding \"utf-8\""
                        )));
                    }
                }
            }
        };
        let written = data.len();
        match self
            .registry()
            .write_file(&caller.tenant, &id, &args.path, data, args.append)
            .await
        {
            Ok(w) => {
                let out = WriteFileOutput {
                    uri: sandbox_file_uri(&id, &w.path),
                    bytes_written: i64::try_from(written).unwrap_or(i64::MAX),
                    size: i64::try_from(w.size).unwrap_or(i64::MAX),
                    path: w.path,
                };
                let text = format!(
                    "{} {} bytes to {} (now {} bytes).",
                    if args.append { "Appended" } else { "Wrote" },
                    out.bytes_written,
                    out.path,
                    out.size
                );
                render::ok(text, &out)
            }
            Err(e) => render::error(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for text per copy in these tests.
    const ROOM: usize = 1 << 20;

    fn content(path: &str, data: &[u8], offset: u64, size: u64) -> FileContent {
        FileContent {
            path: path.into(),
            data: data.to_vec(),
            offset,
            size,
        }
    }

    fn read(c: FileContent, asked: Option<Encoding>) -> Result<CallToolResult, Error> {
        read_result(c, asked, "sandbox://sbx_1/files/x".into(), ROOM)
    }

    fn structured(r: &CallToolResult) -> serde_json::Value {
        r.structured_content.clone().unwrap()
    }

    fn all_text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text())
            .map(|t| t.text.clone())
            .collect()
    }

    #[test]
    fn text_comes_back_as_text() {
        let r = read(content("/workspace/a.txt", b"hi\n", 0, 3), None).unwrap();
        assert_eq!(r.content.len(), 1);
        assert_eq!(r.content[0].as_text().unwrap().text, "hi\n");
        let s = structured(&r);
        assert_eq!(
            (
                s["encoding"].as_str(),
                s["more"].as_bool(),
                s["content"].as_str()
            ),
            (Some("utf-8"), Some(false), Some("hi\n"))
        );
        assert_eq!(s["uri"], "sandbox://sbx_1/files/x");
    }

    #[test]
    fn a_character_cut_by_a_part_is_left_for_the_next() {
        // "é" is two bytes; the part ends between them.
        let r = read(content("/workspace/a.txt", b"ab\xc3", 0, 4), None).unwrap();
        let s = structured(&r);
        assert_eq!(s["content"], "ab");
        assert_eq!(s["length"], 2);
        assert_eq!(s["more"], true);
        let note = r.content[1].as_text().unwrap().text.clone();
        assert!(note.contains("offset 2"), "{note}");
    }

    #[test]
    fn binary_comes_once_as_base64_unless_utf8_was_asked_for() {
        let r = read(content("/workspace/b.bin", &[0xff, 0, 1], 0, 3), None).unwrap();
        assert_eq!(structured(&r)["encoding"], "base64");
        assert_eq!(structured(&r)["content"], "/wAB");
        assert!(
            !all_text(&r).contains("/wAB"),
            "the bytes travel once: {}",
            all_text(&r)
        );
        let e = read(
            content("/workspace/b.bin", &[0xff, 0, 1], 0, 3),
            Some(Encoding::Utf8),
        )
        .unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
    }

    #[test]
    fn a_whole_image_is_an_image_block_and_its_bytes_travel_once() {
        let png = b"\x89PNG\r\n\x1a\n";
        let r = read(content("/workspace/p.png", png, 0, 8), None).unwrap();
        let image = r.content[1].as_image().expect("an image block");
        assert_eq!(image.mime_type, "image/png");
        assert_eq!(image.data, BASE64_OUT.encode(png));
        let s = structured(&r);
        assert_eq!(
            (s["content"].as_str(), s["length"].as_i64()),
            (Some(""), Some(8))
        );
        // A part of one is not an image; its bytes come as base64.
        let r = read(content("/workspace/p.png", &png[..4], 0, 8), None).unwrap();
        assert!(r.content.iter().all(|c| c.as_image().is_none()));
        assert_eq!(structured(&r)["content"], BASE64_OUT.encode(&png[..4]));
    }

    #[test]
    fn text_is_cut_to_fit_a_message_where_escapes_would_overflow_it() {
        assert_eq!(fit_json("abc", 10), "abc");
        assert_eq!(fit_json("a\"b", 3), "a\"");
        assert_eq!(fit_json("\u{1}\u{1}", 11), "\u{1}");
        assert_eq!(fit_json("éé", 3), "é");
        let s = "\u{1}".repeat(1 << 20);
        let r = read(content("/workspace/c.txt", s.as_bytes(), 0, 1 << 20), None).unwrap();
        let length = structured(&r)["length"].as_u64().unwrap();
        assert_eq!(length, (ROOM / 6) as u64);
        assert_eq!(structured(&r)["more"], true);
    }

    #[test]
    fn negative_offsets_are_refused() {
        assert!(offset_arg(Some(-1), "offset").is_err());
        assert_eq!(offset_arg(Some(5), "offset").unwrap(), Some(5));
    }
}
