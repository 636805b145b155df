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

/// Regular files that a run created or changed, from snapshots of a directory before and
/// after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The files, by path, at most the number asked for.
    pub files: Vec<FileEntry>,
    /// How many more changed beyond those.
    pub omitted: usize,
}

/// The regular files in `after` that are new or differ in size or modification time from
/// `before`, at most `max` of them. `None` when either snapshot was cut short, since then a
/// file missing from one of them may simply not have been listed.
pub fn changes(before: &Listing, after: &Listing, max: usize) -> Option<Changes> {
    if before.truncated || after.truncated {
        return None;
    }
    let old: std::collections::HashMap<&str, &FileEntry> = before
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e))
        .collect();
    let mut changed: Vec<&FileEntry> = after
        .entries
        .iter()
        .filter(|e| e.kind == FileKind::File)
        .filter(|e| {
            old.get(e.path.as_str())
                .is_none_or(|o| o.kind != e.kind || o.size != e.size || o.modified != e.modified)
        })
        .collect();
    changed.sort_by(|a, b| a.path.cmp(&b.path));
    let omitted = changed.len().saturating_sub(max);
    changed.truncate(max);
    Some(Changes {
        files: changed.into_iter().cloned().collect(),
        omitted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(path: &str, kind: FileKind, size: u64, secs: u64) -> FileEntry {
        FileEntry {
            name: path.rsplit('/').next().unwrap().to_owned(),
            path: path.to_owned(),
            kind,
            size,
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    fn listing(entries: Vec<FileEntry>) -> Listing {
        Listing {
            entries,
            truncated: false,
        }
    }

    #[test]
    fn new_and_modified_files_count_and_the_rest_do_not() {
        let before = listing(vec![
            entry("/w/same", FileKind::File, 1, 1),
            entry("/w/grown", FileKind::File, 1, 1),
            entry("/w/touched", FileKind::File, 1, 1),
            entry("/w/gone", FileKind::File, 1, 1),
            entry("/w/dir", FileKind::Directory, 0, 1),
        ]);
        let after = listing(vec![
            entry("/w/same", FileKind::File, 1, 1),
            entry("/w/grown", FileKind::File, 2, 1),
            entry("/w/touched", FileKind::File, 1, 2),
            entry("/w/dir", FileKind::Directory, 0, 2),
            entry("/w/dir/new", FileKind::File, 0, 2),
            entry("/w/link", FileKind::Symlink, 3, 2),
        ]);
        let c = changes(&before, &after, 20).unwrap();
        let paths: Vec<&str> = c.files.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/w/dir/new", "/w/grown", "/w/touched"]);
        assert_eq!(c.omitted, 0);
    }

    #[test]
    fn at_most_max_are_kept_and_the_rest_counted() {
        let after = listing(
            (0..25)
                .map(|i| entry(&format!("/w/f{i:02}"), FileKind::File, 1, 1))
                .collect(),
        );
        let c = changes(&Listing::default(), &after, 20).unwrap();
        assert_eq!(c.files.len(), 20);
        assert_eq!(c.files[0].path, "/w/f00");
        assert_eq!(c.omitted, 5);
    }

    #[test]
    fn a_truncated_snapshot_tells_nothing() {
        let mut cut = listing(vec![]);
        cut.truncated = true;
        assert_eq!(changes(&cut, &Listing::default(), 20), None);
        assert_eq!(changes(&Listing::default(), &cut, 20), None);
    }
}
