//! Resources: any file of a caller's sandbox through the template
//! `sandbox://{sandbox_id}/files/{path}`, and the operator's data files (`--data-dir`) as
//! `data://<name>`. The URIs that run answers link to are made here too.
//!
//! A sandbox URI's path is the file's absolute path in the sandbox without its leading
//! slash, each segment percent-encoded: `/workspace/out/plot 1.png` in sandbox `sbx_x` is
//! `sandbox://sbx_x/files/workspace/out/plot%201.png`. Slashes may also come encoded
//! (`%2F`), as RFC 6570 expands `{path}`; both read the same file.
//!
//! Kept outputs (`output://{key}/{name}`, see `outputs`) are resources too. Any resource is
//! read whole when it fits in one message, and in pieces otherwise: `?offset=N&length=M`
//! after its URI reads M bytes from N, always as a base64 blob.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use rmcp::model::{Resource, ResourceContents};
use runbox_core::{Error, SandboxId};

/// The template of sandbox file URIs.
pub const SANDBOX_FILE_TEMPLATE: &str = "sandbox://{sandbox_id}/files/{path}";
const SANDBOX_SCHEME: &str = "sandbox://";
const DATA_SCHEME: &str = "data://";

/// Most data files listed.
const MAX_DATA_FILES: usize = 1_000;
/// Deepest folder of the data directory listed.
const MAX_DATA_DEPTH: usize = 8;

/// What a path segment percent-encodes: controls, space and the characters with a meaning
/// in URIs (RFC 3986 `pchar` keeps the rest).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

fn encode_path(path: &str) -> String {
    path.trim_start_matches('/')
        .split('/')
        .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// The URI of a file (absolute path) in a sandbox.
pub(crate) fn sandbox_file_uri(id: &SandboxId, path: &str) -> String {
    format!("{SANDBOX_SCHEME}{id}/files/{}", encode_path(path))
}

/// A resource URI, understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A file of a sandbox: its id and absolute path.
    SandboxFile(SandboxId, String),
    /// A data file, by name.
    Data(String),
    /// A kept output, by key.
    Output(String),
}

/// A piece of a resource: `length` bytes (as many as one message carries when `None`) from
/// `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub offset: u64,
    pub length: Option<u64>,
}

/// Parses a resource URI, and the piece its query asks for (`?offset=N&length=M`); the
/// error says what a valid one looks like.
pub(crate) fn parse_piece(uri: &str) -> Result<(Target, Option<Piece>), String> {
    let Some((base, query)) = uri.split_once('?') else {
        return Ok((parse(uri)?, None));
    };
    let mut piece = Piece {
        offset: 0,
        length: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let bad = || {
            format!(
                "{uri}: a resource's query reads a piece of it, as ?offset=N&length=M (bytes); \
                 {pair:?} is not one of those"
            )
        };
        let (key, value) = pair.split_once('=').ok_or_else(bad)?;
        let n: u64 = value.parse().map_err(|_| bad())?;
        match key {
            "offset" => piece.offset = n,
            "length" => piece.length = Some(n),
            _ => return Err(bad()),
        }
    }
    Ok((parse(base)?, Some(piece)))
}

/// Parses a resource URI; the error says what a valid one looks like.
pub(crate) fn parse(uri: &str) -> Result<Target, String> {
    let decode = |s: &str| {
        percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| format!("{uri}: the percent-encoded path is not UTF-8"))
    };
    if let Some(rest) = uri.strip_prefix(SANDBOX_SCHEME) {
        let bad = || {
            format!(
                "{uri} is not a sandbox file URI: the form is {SANDBOX_FILE_TEMPLATE}, e.g. sandbox://sbx_1a2b/files/workspace/out.csv"
            )
        };
        let (id, path) = rest.split_once("/files/").ok_or_else(bad)?;
        if id.is_empty() || id.contains('/') {
            return Err(bad());
        }
        let path = decode(path)?;
        let path = path.trim_start_matches('/');
        if path.is_empty() {
            return Err(bad());
        }
        return Ok(Target::SandboxFile(SandboxId::from(id), format!("/{path}")));
    }
    if let Some(name) = uri.strip_prefix(DATA_SCHEME) {
        return Ok(Target::Data(decode(name)?));
    }
    if let Some(rest) = uri.strip_prefix(crate::outputs::SCHEME) {
        return crate::outputs::key_of(rest)
            .map(|k| Target::Output(k.to_owned()))
            .ok_or_else(|| {
                format!("{uri} is not an output URI: answers name them as output://KEY/NAME")
            });
    }
    Err(format!(
        "{uri}: unknown resource; this server has sandbox files ({SANDBOX_FILE_TEMPLATE}), data \
         files (data://<name>, see resources/list) and the outputs answers link to \
         (output://KEY/NAME)"
    ))
}

/// A file's MIME type, guessed from its name.
pub(crate) fn mime_type(path: &str) -> String {
    mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream")
        .to_owned()
}

/// Images that clients show when sent as image content.
pub(crate) fn is_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

/// The contents of a resource read: text when the bytes are UTF-8, not an image, and take
/// at most `text_room` bytes as JSON (text full of control characters escapes to six times
/// its size), a base64 blob otherwise.
pub(crate) fn contents(
    uri: &str,
    mime: String,
    data: Vec<u8>,
    text_room: usize,
) -> ResourceContents {
    if !is_image(&mime)
        && let Ok(text) = std::str::from_utf8(&data)
        && crate::files::fit_json(text, text_room).len() == text.len()
    {
        return ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: Some(mime),
            text: text.to_owned(),
            meta: None,
        };
    }
    ResourceContents::BlobResourceContents {
        uri: uri.to_owned(),
        mime_type: Some(mime),
        blob: base64::engine::general_purpose::STANDARD.encode(data),
        meta: None,
    }
}

/// A piece of a resource: its bytes as they are, base64.
pub(crate) fn blob(uri: &str, mime: String, data: &[u8]) -> ResourceContents {
    ResourceContents::BlobResourceContents {
        uri: uri.to_owned(),
        mime_type: Some(mime),
        blob: base64::engine::general_purpose::STANDARD.encode(data),
        meta: None,
    }
}

/// One of the operator's data files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DataFile {
    /// Its resource name: the path below the data directory without the extension (with
    /// it, when two files would otherwise share a name).
    pub name: String,
    /// Its path below the data directory.
    pub relative: String,
    /// Size in bytes.
    pub size: u64,
}

impl DataFile {
    pub(crate) fn uri(&self) -> String {
        format!("{DATA_SCHEME}{}", encode_path(&self.name))
    }

    pub(crate) fn resource(&self) -> rmcp::model::Resource {
        Resource::new(self.uri(), self.name.clone())
            .with_title(self.relative.clone())
            .with_description(format!(
                "Data file {}, also readable by code at /data/{} in every sandbox",
                self.relative, self.relative
            ))
            .with_mime_type(mime_type(&self.relative))
            .with_size(self.size)
    }
}

/// The operator's data directory, mounted read-only at `/data` in every sandbox.
#[derive(Debug, Clone)]
pub(crate) struct DataCatalog {
    dir: PathBuf,
}

impl DataCatalog {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The files now in the directory (hidden ones left out), by name. Read on every call,
    /// so files the operator adds show up without a restart.
    pub(crate) fn files(&self) -> Vec<DataFile> {
        let mut found = Vec::new();
        walk_data(&self.dir, "", 0, &mut found);
        found.sort();
        let stem = |rel: &str| match rel.rsplit_once('.') {
            Some((s, ext)) if !s.is_empty() && !s.ends_with('/') && !ext.contains('/') => {
                s.to_owned()
            }
            _ => rel.to_owned(),
        };
        let mut out: Vec<DataFile> = found
            .iter()
            .map(|(rel, size)| {
                let name = stem(rel);
                let shared = found
                    .iter()
                    .filter(|(other, _)| other != rel && stem(other) == name)
                    .count()
                    > 0;
                DataFile {
                    name: if shared { rel.clone() } else { name },
                    relative: rel.clone(),
                    size: *size,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// At most `length` bytes of a data file from `offset`, by resource name.
    pub(crate) fn read(
        &self,
        name: &str,
        offset: u64,
        length: u64,
    ) -> Result<Option<(DataFile, Vec<u8>)>, Error> {
        use std::io::{Read as _, Seek as _};
        let Some(file) = self.files().into_iter().find(|f| f.name == name) else {
            return Ok(None);
        };
        let failed =
            |e| Error::sandbox_caused_by(format!("cannot read data file {}", file.relative), e);
        let mut f = std::fs::File::open(self.dir.join(&file.relative)).map_err(failed)?;
        f.seek(std::io::SeekFrom::Start(offset)).map_err(failed)?;
        let mut data = Vec::new();
        f.take(length).read_to_end(&mut data).map_err(failed)?;
        Ok(Some((file, data)))
    }
}

fn walk_data(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<(String, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        if out.len() >= MAX_DATA_FILES {
            return;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = format!("{prefix}{name}");
        // The operator's own directory: symbolic links are followed, as they are in /data.
        match std::fs::metadata(entry.path()) {
            Ok(m) if m.is_file() => out.push((rel, m.len())),
            Ok(m) if m.is_dir() && depth < MAX_DATA_DEPTH => {
                walk_data(&entry.path(), &format!("{rel}/"), depth + 1, out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_uris_round_trip_with_encoded_names() {
        let id = SandboxId::from("sbx_1");
        let uri = sandbox_file_uri(&id, "/workspace/out dir/plot #1.png");
        assert_eq!(
            uri,
            "sandbox://sbx_1/files/workspace/out%20dir/plot%20%231.png"
        );
        assert_eq!(
            parse(&uri),
            Ok(Target::SandboxFile(
                id.clone(),
                "/workspace/out dir/plot #1.png".into()
            ))
        );
        // As RFC 6570 expands {path}: slashes encoded.
        assert_eq!(
            parse("sandbox://sbx_1/files/workspace%2Fa.txt"),
            Ok(Target::SandboxFile(id.clone(), "/workspace/a.txt".into()))
        );
        assert_eq!(
            parse("sandbox://sbx_1/files/%2Ftmp%2Fa.txt"),
            Ok(Target::SandboxFile(id, "/tmp/a.txt".into()))
        );
    }

    #[test]
    fn malformed_uris_say_what_is_expected() {
        for bad in [
            "sandbox://sbx_1/workspace/a",
            "sandbox:///files/a",
            "sandbox://sbx_1/files/",
            "file:///etc/passwd",
            "sandbox://sbx_1/files/%FF",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert_eq!(
            parse("data://sales%202024"),
            Ok(Target::Data("sales 2024".into()))
        );
    }

    #[test]
    fn text_is_text_and_the_rest_is_base64() {
        let t = contents("u", "text/csv".into(), b"a,b\n".to_vec(), 100);
        assert!(
            matches!(t, ResourceContents::TextResourceContents { ref text, .. } if text == "a,b\n")
        );
        let b = contents("u", "application/octet-stream".into(), vec![0xff, 0], 100);
        assert!(
            matches!(b, ResourceContents::BlobResourceContents { ref blob, .. } if blob == "/wA=")
        );
        let png = contents("u", "image/png".into(), b"abc".to_vec(), 100);
        assert!(matches!(png, ResourceContents::BlobResourceContents { .. }));
        // Text that would escape past the room goes as base64.
        let c = contents("u", "text/plain".into(), vec![1; 20], 100);
        assert!(matches!(c, ResourceContents::BlobResourceContents { .. }));
    }

    #[test]
    fn a_query_asks_for_a_piece() {
        assert_eq!(
            parse_piece("output://1f/result-1.png?offset=10&length=20"),
            Ok((
                Target::Output("1f".into()),
                Some(Piece {
                    offset: 10,
                    length: Some(20)
                })
            ))
        );
        assert_eq!(
            parse_piece("sandbox://sbx_1/files/workspace/a.bin?offset=5"),
            Ok((
                Target::SandboxFile(SandboxId::from("sbx_1"), "/workspace/a.bin".into()),
                Some(Piece {
                    offset: 5,
                    length: None
                })
            ))
        );
        assert_eq!(
            parse_piece("data://sales"),
            Ok((Target::Data("sales".into()), None))
        );
        for bad in [
            "data://a?offset=x",
            "data://a?from=1",
            "output://zz/a",
            "output://1",
        ] {
            assert!(parse_piece(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn data_names_drop_the_extension_unless_two_files_share_it() {
        let dir = std::env::temp_dir().join(format!("runbox-data-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("reports")).unwrap();
        std::fs::write(dir.join("sales.csv"), "a,b\n").unwrap();
        std::fs::write(dir.join("sales.json"), "{}").unwrap();
        std::fs::write(dir.join("notes.md"), "# hi").unwrap();
        std::fs::write(dir.join("reports/q1.csv"), "x").unwrap();
        std::fs::write(dir.join(".hidden"), "x").unwrap();
        let catalog = DataCatalog::new(dir.clone());
        let names: Vec<String> = catalog.files().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["notes", "reports/q1", "sales.csv", "sales.json"]);
        let (file, data) = catalog.read("reports/q1", 0, 10).unwrap().unwrap();
        assert_eq!(
            (file.relative.as_str(), data.as_slice()),
            ("reports/q1.csv", &b"x"[..])
        );
        assert_eq!(file.uri(), "data://reports/q1");
        let (_, piece) = catalog.read("sales.csv", 1, 2).unwrap().unwrap();
        assert_eq!(piece, b",b");
        assert!(catalog.read("missing", 0, 1).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
