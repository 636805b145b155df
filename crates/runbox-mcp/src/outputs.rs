//! Outputs kept for reading as resources: the images and other large values of runs (which
//! an answer names by URI instead of carrying their bytes twice, or at all when they do not
//! fit in one message), and whole answers too big to send. Each is `output://{key}/{name}`,
//! readable by the tenant whose call made it, whole or in pieces (`?offset=N&length=M`).
//!
//! They are kept in memory, the newest first: at most [`MAX_BYTES`] and [`MAX_ENTRIES`] in
//! all, the oldest dropped to make room, so a URI stays readable for a while after the
//! answer that named it, not forever.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

/// The scheme of output URIs.
pub(crate) const SCHEME: &str = "output://";
/// Most bytes kept, all outputs together.
pub(crate) const MAX_BYTES: usize = 128 << 20;
/// Most outputs kept.
const MAX_ENTRIES: usize = 4096;

/// A kept output.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    /// Its MIME type.
    pub mime: String,
    /// Its bytes.
    pub data: Arc<[u8]>,
}

#[derive(Debug)]
struct Entry {
    tenant: String,
    output: Output,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Keys, oldest first.
    order: VecDeque<String>,
    bytes: usize,
    next: u64,
}

/// Where outputs are kept.
#[derive(Debug, Default)]
pub(crate) struct OutputStore {
    inner: Mutex<Inner>,
}

/// What [`OutputStore::put`] kept: its URI and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub uri: String,
    pub size: u64,
}

impl OutputStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `data` for `tenant` under a new URI ending in `name`.
    pub(crate) fn put(&self, tenant: &str, name: &str, mime: &str, data: Vec<u8>) -> Kept {
        let size = data.len();
        let mut inner = self.lock();
        inner.next += 1;
        let key = format!("{:x}", inner.next);
        while !inner.order.is_empty()
            && (inner.bytes + size > MAX_BYTES || inner.order.len() >= MAX_ENTRIES)
        {
            if let Some(old) = inner.order.pop_front()
                && let Some(e) = inner.entries.remove(&old)
            {
                inner.bytes -= e.output.data.len();
            }
        }
        inner.bytes += size;
        inner.order.push_back(key.clone());
        inner.entries.insert(
            key.clone(),
            Entry {
                tenant: tenant.to_owned(),
                output: Output {
                    mime: mime.to_owned(),
                    data: data.into(),
                },
            },
        );
        let name = utf8_percent_encode(name, NON_ALPHANUMERIC_BUT_DOT).to_string();
        Kept {
            uri: format!("{SCHEME}{key}/{name}"),
            size: size as u64,
        }
    }

    /// The output of `key`, if `tenant` made it and it is still kept.
    pub(crate) fn get(&self, tenant: &str, key: &str) -> Option<Output> {
        self.lock()
            .entries
            .get(key)
            .filter(|e| e.tenant == tenant)
            .map(|e| e.output.clone())
    }
}

/// Names keep letters, digits, `.`, `-` and `_`; the rest is percent-encoded.
const NON_ALPHANUMERIC_BUT_DOT: &percent_encoding::AsciiSet =
    &NON_ALPHANUMERIC.remove(b'.').remove(b'-').remove(b'_');

/// The key of an output URI's path (`{key}/{name}`).
pub(crate) fn key_of(path: &str) -> Option<&str> {
    let (key, _name) = path.split_once('/')?;
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_hexdigit())).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_kept_for_their_tenant_only() {
        let store = OutputStore::default();
        let kept = store.put("alice", "figure 1.png", "image/png", vec![1, 2, 3]);
        assert_eq!(kept.size, 3);
        assert!(kept.uri.starts_with(SCHEME) && kept.uri.ends_with("/figure%201.png"));
        let path = kept.uri.strip_prefix(SCHEME).unwrap();
        let key = key_of(path).unwrap();
        assert_eq!(&*store.get("alice", key).unwrap().data, &[1, 2, 3]);
        assert!(store.get("bob", key).is_none(), "another tenant's output");
        assert!(key_of("nothex/x").is_none());
    }

    #[test]
    fn the_oldest_go_to_make_room() {
        let store = OutputStore::default();
        let first = store.put("t", "a", "x/y", vec![0; MAX_BYTES / 2]);
        let second = store.put("t", "b", "x/y", vec![0; MAX_BYTES / 2]);
        let third = store.put("t", "c", "x/y", vec![0; 10]);
        let key = |k: &Kept| {
            key_of(k.uri.strip_prefix(SCHEME).unwrap())
                .unwrap()
                .to_owned()
        };
        assert!(store.get("t", &key(&first)).is_none(), "dropped for room");
        assert!(store.get("t", &key(&second)).is_some());
        assert!(store.get("t", &key(&third)).is_some());
    }
}
