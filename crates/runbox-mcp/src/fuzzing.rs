//! Hooks for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.

use std::time::Duration;

use runbox_core::{Error, SandboxId};

use crate::resources::{DataFile, Target};

/// A resource URI parsed: `(Some(sandbox id), path)` for a sandbox file, `(None, name)`
/// for a data file.
pub fn parse_resource_uri(uri: &str) -> Result<(Option<String>, String), String> {
    crate::resources::parse(uri).map(|t| match t {
        Target::SandboxFile(id, path) => (Some(id.to_string()), path),
        Target::Data(name) => (None, name),
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
