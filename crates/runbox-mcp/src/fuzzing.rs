//! Hooks for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.

use std::time::Duration;

use runbox_core::{Error, SandboxId};

use crate::resources::{DataFile, Target};

/// A resource URI parsed: `(Some(sandbox id), path)` for a sandbox file, `(None, name)`
/// for a data file, and `(None, "output://KEY/")` for a kept output (whose key is hex).
pub fn parse_resource_uri(uri: &str) -> Result<(Option<String>, String), String> {
    crate::resources::parse(uri).map(|t| match t {
        Target::SandboxFile(id, path) => (Some(id.to_string()), path),
        Target::Data(name) => (None, name),
        Target::Output(key) => (None, format!("{}{key}/", crate::outputs::SCHEME)),
    })
}

/// The piece of a resource a query asks for: `(offset, length)`.
pub type Piece = (u64, Option<u64>);

/// A resource URI and the piece its query asks for: the URI without the query, parsed as
/// [`parse_resource_uri`] does, and the piece.
pub fn parse_resource_piece(uri: &str) -> Result<(Option<String>, String, Option<Piece>), String> {
    crate::resources::parse_piece(uri).map(|(t, piece)| {
        let piece = piece.map(|p| (p.offset, p.length));
        match t {
            Target::SandboxFile(id, path) => (Some(id.to_string()), path, piece),
            Target::Data(name) => (None, name, piece),
            Target::Output(key) => (None, format!("{}{key}/", crate::outputs::SCHEME), piece),
        }
    })
}

/// The URI of the file at `path` (absolute) in sandbox `id`.
pub fn sandbox_file_uri(id: &str, path: &str) -> String {
    crate::resources::sandbox_file_uri(&SandboxId::from(id), path)
}

/// The URI of the data file named `name`.
pub fn data_file_uri(name: &str) -> String {
    let file = DataFile {
        name: name.to_owned(),
        relative: name.to_owned(),
        size: 0,
    };
    file.uri()
}

/// A `timeout_seconds` argument, checked and converted.
pub fn seconds(s: f64) -> Result<Duration, Error> {
    crate::server::seconds(s, "timeout_seconds")
}

/// The longest start of `text` that takes at most `budget` bytes as a JSON string.
pub fn fit_json(text: &str, budget: usize) -> &str {
    crate::files::fit_json(text, budget)
}
