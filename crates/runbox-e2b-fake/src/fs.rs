//! A sandbox's in-memory filesystem, with envd's `EntryInfo` (§2.4) and error codes.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Value, json};

use crate::time::rfc3339;

pub(crate) const HOME: &str = "/home/user";

/// An envd error: a Connect code name and a message.
#[derive(Debug, Clone)]
pub(crate) struct FsError {
    pub code: &'static str,
    pub message: String,
}

fn err(code: &'static str, message: String) -> FsError {
    FsError { code, message }
}

fn not_found(p: &str) -> FsError {
    err(
        "not_found",
        format!("path not found: stat {p}: no such file or directory"),
    )
}

/// Resolve a client path: relative paths (and `~`) against `/home/user`, `.`/`..`
/// folded.
pub(crate) fn resolve(p: &str) -> Result<String, FsError> {
    if p.is_empty() {
        return Err(err("invalid_argument", "empty path".into()));
    }
    let full = if p == "~" {
        HOME.to_owned()
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{HOME}/{rest}")
    } else if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("{HOME}/{p}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in full.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

fn parent(p: &str) -> Option<String> {
    if p == "/" {
        return None;
    }
    let (head, _) = p.rsplit_once('/')?;
    Some(if head.is_empty() {
        "/".into()
    } else {
        head.into()
    })
}

fn basename(p: &str) -> &str {
    if p == "/" {
        return "/";
    }
    p.rsplit('/').next().unwrap_or(p)
}

struct Node {
    /// `None` for a directory.
    data: Option<Vec<u8>>,
    mtime: SystemTime,
}

pub(crate) struct Fs {
    nodes: BTreeMap<String, Node>,
    /// Symbolic links to directories (link path → target), followed by every operation.
    links: BTreeMap<String, String>,
}

impl Fs {
    pub fn new() -> Fs {
        let mut fs = Fs {
            nodes: BTreeMap::new(),
            links: BTreeMap::new(),
        };
        for d in ["/", "/home", HOME, "/tmp"] {
            fs.nodes.insert(
                d.to_owned(),
                Node {
                    data: None,
                    mtime: SystemTime::now(),
                },
            );
        }
        fs
    }

    /// `p` with a leading symbolic link replaced by its target.
    fn follow(&self, p: &str) -> String {
        for (link, target) in &self.links {
            if p == link {
                return target.clone();
            }
            if let Some(rest) = p.strip_prefix(link.as_str())
                && rest.starts_with('/')
            {
                return format!("{target}{rest}");
            }
        }
        p.to_owned()
    }

    /// `ln -s target link` for a directory `target`.
    pub fn symlink(&mut self, target: &str, link: &str) -> Result<(), FsError> {
        if self.nodes.contains_key(link) || self.links.contains_key(link) {
            return Err(err("already_exists", format!("{link}: File exists")));
        }
        self.links.insert(link.to_owned(), target.to_owned());
        Ok(())
    }

    fn descendants(&self, p: &str) -> Vec<String> {
        let prefix = if p == "/" {
            "/".to_owned()
        } else {
            format!("{p}/")
        };
        self.nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| k.as_str() != "/")
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn entry(&self, p: &str) -> Option<Value> {
        let node = self.nodes.get(p)?;
        let dir = node.data.is_none();
        let owner = if p == HOME || p.starts_with("/home/user/") {
            "user"
        } else {
            "root"
        };
        let mut e = json!({
            "name": basename(p),
            "type": if dir { "FILE_TYPE_DIRECTORY" } else { "FILE_TYPE_FILE" },
            "path": p,
            "mode": if dir { 0o755 } else { 0o644 },
            "permissions": if dir { "drwxr-xr-x" } else { "-rw-r--r--" },
            "owner": owner,
            "group": owner,
            "modifiedTime": rfc3339(node.mtime),
        });
        // int64 is a JSON string; zero values are omitted (proto3-JSON).
        let size = node.data.as_ref().map(Vec::len).unwrap_or(4096);
        if size > 0 {
            e["size"] = Value::String(size.to_string());
        }
        Some(e)
    }

    pub fn stat(&self, p: &str) -> Result<Value, FsError> {
        let p = &self.follow(p);
        self.entry(p).ok_or_else(|| not_found(p))
    }

    pub fn read(&self, p: &str) -> Result<&[u8], FsError> {
        let p = &self.follow(p);
        match self.nodes.get(p) {
            None => Err(not_found(p)),
            Some(Node { data: None, .. }) => Err(err(
                "invalid_argument",
                format!("path '{p}' is a directory"),
            )),
            Some(Node { data: Some(d), .. }) => Ok(d),
        }
    }

    fn mkdir_p(&mut self, p: &str) -> Result<(), FsError> {
        let mut missing = Vec::new();
        let mut cur = Some(p.to_owned());
        while let Some(c) = cur {
            match self.nodes.get(&c) {
                Some(Node { data: None, .. }) => break,
                Some(_) => {
                    return Err(err(
                        "invalid_argument",
                        format!("path '{c}' is not a directory"),
                    ));
                }
                None => {
                    cur = parent(&c);
                    missing.push(c);
                }
            }
        }
        for d in missing {
            self.nodes.insert(
                d,
                Node {
                    data: None,
                    mtime: SystemTime::now(),
                },
            );
        }
        Ok(())
    }

    /// Write a file, creating parents, replacing an existing file.
    pub fn write(&mut self, p: &str, data: Vec<u8>) -> Result<Value, FsError> {
        let p = &self.follow(p);
        if matches!(self.nodes.get(p), Some(Node { data: None, .. })) {
            return Err(err(
                "invalid_argument",
                format!("path '{p}' is a directory"),
            ));
        }
        if let Some(par) = parent(p) {
            self.mkdir_p(&par)?;
        }
        self.nodes.insert(
            p.to_owned(),
            Node {
                data: Some(data),
                mtime: SystemTime::now(),
            },
        );
        self.stat(p)
    }

    /// Entries under directory `p` down to `depth` levels (1 = direct children).
    pub fn list(&self, p: &str, depth: u64) -> Result<Vec<Value>, FsError> {
        let p = &self.follow(p);
        match self.nodes.get(p) {
            None => return Err(not_found(p)),
            Some(Node { data: Some(_), .. }) => {
                return Err(err(
                    "invalid_argument",
                    format!("path '{p}' is not a directory"),
                ));
            }
            Some(_) => {}
        }
        let depth = usize::try_from(depth.max(1)).unwrap_or(usize::MAX);
        let base = if p == "/" { 0 } else { p.matches('/').count() };
        Ok(self
            .descendants(p)
            .iter()
            .filter(|k| k.matches('/').count() - base <= depth)
            .filter_map(|k| self.entry(k))
            .collect())
    }

    pub fn make_dir(&mut self, p: &str) -> Result<Value, FsError> {
        let p = &self.follow(p);
        if self.nodes.contains_key(p) {
            return Err(err(
                "already_exists",
                format!("directory at {p} already exists"),
            ));
        }
        self.mkdir_p(p)?;
        self.stat(p)
    }

    pub fn rename(&mut self, src: &str, dst: &str) -> Result<Value, FsError> {
        let (src, dst) = (&self.follow(src), &self.follow(dst));
        if !self.nodes.contains_key(src) {
            return Err(not_found(src));
        }
        if src == "/" || dst == src || dst.starts_with(&format!("{src}/")) {
            return Err(err(
                "invalid_argument",
                format!("cannot move '{src}' to '{dst}'"),
            ));
        }
        if matches!(self.nodes.get(dst), Some(Node { data: None, .. })) {
            return Err(err(
                "already_exists",
                format!("destination '{dst}' is an existing directory"),
            ));
        }
        if let Some(par) = parent(dst) {
            self.mkdir_p(&par)?;
        }
        let mut moved = vec![src.to_owned()];
        moved.extend(self.descendants(src));
        for old in moved {
            if let Some(node) = self.nodes.remove(&old) {
                let new = format!("{dst}{}", &old[src.len()..]);
                self.nodes.insert(new, node);
            }
        }
        self.stat(dst)
    }

    pub fn remove(&mut self, p: &str) -> Result<(), FsError> {
        if self.links.remove(p).is_some() {
            return Ok(());
        }
        let p = &self.follow(p);
        if p == "/" {
            return Err(err("permission_denied", "cannot remove '/'".into()));
        }
        if !self.nodes.contains_key(p) {
            return Err(not_found(p));
        }
        for d in self.descendants(p) {
            self.nodes.remove(&d);
        }
        self.nodes.remove(p);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_followed() {
        let mut fs = Fs::new();
        fs.symlink(HOME, "/workspace").unwrap();
        fs.write("/workspace/d/a.txt", b"x".to_vec()).unwrap();
        assert_eq!(fs.read("/home/user/d/a.txt").unwrap(), b"x");
        let listed = fs.list("/workspace", 2).unwrap();
        assert!(listed.iter().any(|e| e["path"] == "/home/user/d/a.txt"));
        assert!(fs.symlink(HOME, "/workspace").is_err());
        fs.remove("/workspace").unwrap();
        assert!(fs.read("/workspace/d/a.txt").is_err());
        assert!(fs.read("/home/user/d/a.txt").is_ok());
    }

    #[test]
    fn resolves() {
        assert_eq!(resolve("a.txt").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("/tmp/../etc/./x").unwrap(), "/etc/x");
        assert_eq!(resolve("~/d").unwrap(), "/home/user/d");
        assert_eq!(resolve("/").unwrap(), "/");
    }

    #[test]
    fn tree_operations() {
        let mut fs = Fs::new();
        fs.write("/home/user/d/e/f.txt", b"hello".to_vec()).unwrap();
        fs.write("/home/user/empty", Vec::new()).unwrap();
        let names = |v: Vec<Value>| -> Vec<String> {
            v.iter()
                .map(|e| e["path"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            names(fs.list(HOME, 1).unwrap()),
            vec!["/home/user/d", "/home/user/empty"]
        );
        assert_eq!(fs.list(HOME, 3).unwrap().len(), 4);
        let f = fs.stat("/home/user/d/e/f.txt").unwrap();
        assert_eq!(f["size"], "5");
        assert_eq!(f["type"], "FILE_TYPE_FILE");
        assert!(fs.stat("/home/user/empty").unwrap().get("size").is_none());
        assert_eq!(fs.make_dir(HOME).unwrap_err().code, "already_exists");
        fs.rename("/home/user/d", "/tmp/x/d").unwrap();
        assert_eq!(fs.read("/tmp/x/d/e/f.txt").unwrap(), b"hello");
        assert_eq!(
            fs.read("/home/user/d/e/f.txt").unwrap_err().code,
            "not_found"
        );
        fs.remove("/tmp/x").unwrap();
        assert_eq!(fs.remove("/tmp/x").unwrap_err().code, "not_found");
        assert_eq!(fs.read("/tmp").unwrap_err().code, "invalid_argument");
    }
}
