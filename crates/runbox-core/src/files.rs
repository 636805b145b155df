//! Files in a sandbox, as the file tools see them.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// What a directory entry is. Symbolic links are reported, never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name.
    pub name: String,
    /// Its absolute path inside the sandbox.
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Last modification.
    pub modified: SystemTime,
}

/// A listing, possibly cut short.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The entries, directories before their contents, names in order.
    pub entries: Vec<FileEntry>,
    /// Whether entries were left out to stay within the listing cap.
    pub truncated: bool,
}

/// Bytes read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    /// The file's absolute path inside the sandbox.
    pub path: String,
    /// The bytes read.
    pub data: Vec<u8>,
    /// Where they start in the file.
    pub offset: u64,
    /// The file's whole size.
    pub size: u64,
}

impl FileContent {
    /// Whether bytes remain after those read.
    pub fn more(&self) -> bool {
        self.offset + (self.data.len() as u64) < self.size
    }
}

/// A file written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWritten {
    /// Its absolute path inside the sandbox.
    pub path: String,
    /// Its size after the write.
    pub size: u64,
}
