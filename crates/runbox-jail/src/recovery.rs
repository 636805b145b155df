//! Crash recovery: what a runbox server that died without closing its sandboxes left behind
//! is found and removed when the next one starts, and nothing that belongs to a live one.
//!
//! **What a crash leaves.** When a server dies (SIGKILL, the OOM killer, an abort), the
//! kernel closes its end of every sandbox's control socket and releases its `flock`s. A
//! running sandbox's init sees its socket close and exits; the kernel kills every process
//! left in its PID namespace (daemons in sessions of their own included) and stage one
//! exits after it. The sandbox's uid lease (an `flock`) went with the server, no mount was
//! ever made in the host's mount namespace (the root is built in the sandbox's own), and
//! the egress proxies' sockets were the server's. Two things stay:
//!
//! - every sandbox's cgroup directories (one per v1 hierarchy, or one on v2), empty;
//! - a paused sandbox, whole: its processes are frozen, so its init never sees the socket
//!   close (and on v1 a frozen process cannot even die of SIGKILL). Stage one, the init and
//!   everything the sandbox's code started stay in memory, frozen, for good.
//!
//! **Owners.** Several servers may share a state directory and a cgroup parent at once (the
//! test suite runs dozens in parallel, as root all under `/run/runbox`), so a leftover is
//! removed only once its owner is proven dead:
//!
//! - each [`JailHost`](crate::JailHost) registers as an owner under a token `<pid>-<random>`:
//!   a record `<state>/servers/<token>` on which it holds an exclusive `flock` for its whole
//!   life (and its sandboxes for theirs), listing the cgroup directories in which it makes
//!   its sandboxes' groups;
//! - it names each sandbox's group `<token>.<random token>` (never the sandbox's id, which
//!   other users of the host could read there);
//! - when it starts, it tries to lock every other record. A lock it cannot take is a live
//!   owner's. A lock it takes is a dead owner's: the kernel releases an `flock` however its
//!   holder dies, and the lock belongs to an open file, not to a pid, so neither pid reuse
//!   nor a server in another PID namespace can fool the test. The dead owner's groups
//!   (entries `<token>.*` of the directories its record lists, each checked to be on a
//!   cgroup filesystem) are emptied and removed, then the record is deleted, still locked;
//! - a record is made by creating, locking, and checking that the file locked is still the
//!   one at the path (a recovering server may have taken and deleted it in between; then
//!   another token is tried). So a record being made is never mistaken for a dead owner's,
//!   and when two servers start at once each dead owner is cleaned by one of them.
//!
//! Groups without a record in this state directory (a server using another state directory,
//! or a runbox from before this scheme) are left alone. A server that ends cleanly deletes
//! its record once its last group is gone.
//!
//! **Emptying a group.** SIGKILL first (`cgroup.kill` on v2 where the kernel has it, every pid
//! in `cgroup.procs` otherwise), then thaw (`freezer.state` THAWED on v1, `cgroup.freeze` 0 on
//! v2): a frozen process with SIGKILL pending dies as it thaws, before it runs any more of its
//! own code (its uid may already belong to another sandbox). Then wait, up to [`PATIENCE`], for
//! every directory to be empty, killing again whatever is found, and remove the directories
//! deepest first. A group that does not empty keeps its record, so the next start tries again;
//! the failure is logged.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// How long a dead owner's groups may take to empty before recovery gives up on them.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// The directory of the state directory holding the owners' records.
pub(crate) const RECORDS: &str = "servers";

/// A live server's (more exactly, a live [`JailHost`](crate::JailHost)'s) claim on the
/// sandbox groups it makes. Dropping it deletes the record, unless groups of its are still
/// there (a cleanup failed): then the next start removes them.
#[derive(Debug)]
pub(crate) struct Owner {
    token: String,
    record: PathBuf,
    parents: Vec<PathBuf>,
    _lock: Flock<File>,
}

impl Owner {
    /// Registers a new owner in `dir` whose groups go in `parents`.
    pub(crate) fn register(dir: &Path, parents: Vec<PathBuf>) -> io::Result<Owner> {
        fs::create_dir_all(dir)?;
        let pid = std::process::id();
        for _ in 0..32 {
            let mut r = [0u8; 4];
            getrandom::fill(&mut r).map_err(|e| io::Error::other(e.to_string()))?;
            let token = format!("{pid}-{:08x}", u32::from_ne_bytes(r));
            let record = dir.join(&token);
            let file = match OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&record)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            // Held: a recovering server took it for a dead owner's and will delete it.
            let Ok(mut lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            // Deleted in between by a recovering server: this inode is nobody's record.
            if !is_at(&lock, &record) {
                continue;
            }
            let mut text = format!("pid {pid}\n").into_bytes();
            for p in &parents {
                let p = p.as_os_str().as_bytes();
                if !p.contains(&b'\n') {
                    text.extend_from_slice(b"cgroup ");
                    text.extend_from_slice(p);
                    text.push(b'\n');
                }
            }
            lock.write_all(&text)?;
            return Ok(Owner {
                token,
                record,
                parents,
                _lock: lock,
            });
        }
        Err(io::Error::other(format!(
            "could not register in {}: every attempt collided",
            dir.display()
        )))
    }

    /// The cgroup name of a sandbox whose own part is `name`.
    pub(crate) fn group_name(&self, name: &str) -> String {
        format!("{}.{name}", self.token)
    }

    /// The owner's token (the prefix of its groups' names).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if groups_of(&self.token, &self.parents).is_empty() {
            let _ = fs::remove_file(&self.record);
        }
    }
}

/// Whether `file` is the file at `path` now.
pub(crate) fn is_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// `<pid>-<8 hex digits>`.
fn is_token(name: &str) -> bool {
    name.split_once('-').is_some_and(|(pid, r)| {
        !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && r.len() == 8
            && r.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Whether `dir` is on a cgroup (v1 or v2) filesystem.
fn on_cgroupfs(dir: &Path) -> bool {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
    statfs(dir).is_ok_and(|s| {
        let t = s.filesystem_type();
        t == CGROUP_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC
    })
}

/// The group directories of owner `token` under `parents`.
fn groups_of(token: &str, parents: &[PathBuf]) -> Vec<PathBuf> {
    let prefix = format!("{token}.");
    let mut found = Vec::new();
    for parent in parents {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().as_bytes().starts_with(prefix.as_bytes())
                && e.file_type().is_ok_and(|t| t.is_dir())
            {
                found.push(e.path());
            }
        }
    }
    found
}

/// What a start found of dead servers' leftovers and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Dead servers whose records were found (with or without leftovers).
    pub servers: usize,
    /// Sandboxes whose groups were removed.
    pub sandboxes: usize,
    /// Of those, paused ones (frozen groups thawed).
    pub paused: usize,
    /// Cgroup directories removed (one per sandbox and hierarchy on v1).
    pub cgroup_dirs: usize,
    /// Leftover processes killed.
    pub processes: usize,
    /// What could not be removed; the records stay, so the next start tries again.
    pub failures: Vec<String>,
}

impl Recovered {
    /// Whether anything was left behind besides records.
    pub fn found_leftovers(&self) -> bool {
        self.sandboxes > 0 || self.processes > 0 || !self.failures.is_empty()
    }
}

/// One dead owner's leftovers.
#[derive(Debug, Default)]
struct Cleaned {
    sandboxes: usize,
    paused: usize,
    dirs: usize,
    processes: usize,
}

/// Removes what owners that are no longer alive left behind, as recorded in `dir`; skips
/// `own` and every owner still alive. Logs what it found.
pub(crate) fn recover(dir: &Path, own: &Owner) -> Recovered {
    let mut out = Recovered::default();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(token) = name.to_str() else {
            continue;
        };
        if token == own.token() || !is_token(token) {
            continue;
        }
        let path = e.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // Held: its owner is alive (or another server is recovering it right now).
        let Ok(mut lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        // Deleted meanwhile: recovered by another server already.
        if !is_at(&lock, &path) {
            continue;
        }
        let mut text = Vec::new();
        if lock.read_to_end(&mut text).is_err() {
            continue;
        }
        let (pid, parents) = parse_record(&text);
        let who = match pid {
            Some(pid) => format!("runbox server pid {pid} (record {token})"),
            None => format!("runbox server record {token}"),
        };
        out.servers += 1;
        match clean(token, &parents) {
            Ok(c) => {
                if c.sandboxes > 0 || c.processes > 0 {
                    tracing::info!(
                        "recovered after a crash: {who} ended without closing its sandboxes; \
                         killed {}, thawed {}, removed the cgroups of {} ({} directories)",
                        count(c.processes, "leftover process", "leftover processes"),
                        count(c.paused, "paused sandbox", "paused sandboxes"),
                        count(c.sandboxes, "sandbox", "sandboxes"),
                        c.dirs,
                    );
                } else {
                    tracing::debug!(
                        "removed the record of {who}, which ended leaving nothing behind"
                    );
                }
                out.sandboxes += c.sandboxes;
                out.paused += c.paused;
                out.processes += c.processes;
                out.cgroup_dirs += c.dirs;
                let _ = fs::remove_file(&path);
            }
            Err(e) => {
                tracing::warn!(
                    server = %who,
                    "crash recovery: could not remove what {who} left behind: {e}; the next start tries again"
                );
                out.failures.push(format!("{who}: {e}"));
            }
        }
        drop(lock);
    }
    out
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The pid and the cgroup directories of a record.
fn parse_record(text: &[u8]) -> (Option<u32>, Vec<PathBuf>) {
    let mut pid = None;
    let mut parents = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if let Some(p) = line.strip_prefix(b"pid ") {
            pid = std::str::from_utf8(p).ok().and_then(|p| p.parse().ok());
        } else if let Some(dir) = line.strip_prefix(b"cgroup ") {
            let dir = PathBuf::from(std::ffi::OsString::from_vec(dir.to_vec()));
            if dir.is_absolute() && !parents.contains(&dir) {
                parents.push(dir);
            }
        }
    }
    (pid, parents)
}

/// Empties and removes the groups of dead owner `token` under `parents`.
fn clean(token: &str, parents: &[PathBuf]) -> Result<Cleaned, String> {
    let parents: Vec<PathBuf> = parents
        .iter()
        .filter(|p| p.is_dir() && on_cgroupfs(p))
        .cloned()
        .collect();
    let tops = groups_of(token, &parents);
    let mut out = Cleaned {
        sandboxes: tops
            .iter()
            .filter_map(|t| t.file_name())
            .collect::<BTreeSet<_>>()
            .len(),
        ..Default::default()
    };
    if tops.is_empty() {
        return Ok(out);
    }
    // Every directory of every group, parents before children.
    let mut dirs = Vec::new();
    for top in &tops {
        walk(top, &mut dirs);
    }
    let mut killed = BTreeSet::new();
    kill_round(&dirs, &mut killed, true);
    let mut paused = BTreeSet::new();
    for d in &dirs {
        if thaw(d) {
            paused.insert(
                tops.iter()
                    .find(|t| d.starts_with(t))
                    .and_then(|t| t.file_name()),
            );
        }
    }
    out.paused = paused.len();
    let deadline = Instant::now() + PATIENCE;
    loop {
        kill_round(&dirs, &mut killed, false);
        if dirs.iter().all(|d| procs(d).is_empty()) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "processes of {} did not end within {PATIENCE:?} of SIGKILL",
                tops[0].display()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    out.processes = killed.len();
    // Deepest first. The last processes' exit may still be under way: retry until empty.
    for d in dirs.iter().rev() {
        loop {
            match fs::remove_dir(d) {
                Ok(()) => {
                    out.dirs += 1;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(format!("remove {}: {e}", d.display())),
            }
        }
    }
    Ok(out)
}

/// `dir` and every directory below it, parents first.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
    }
}

/// Pids in a group's `cgroup.procs`.
fn procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Sends SIGKILL to every process of `dirs` (first: through `cgroup.kill` as well, where the
/// kernel has it), noting each pid in `killed`.
fn kill_round(dirs: &[PathBuf], killed: &mut BTreeSet<i32>, first: bool) {
    use nix::sys::signal::{Signal, kill};
    for d in dirs {
        let pids = procs(d);
        if first && !pids.is_empty() {
            let _ = fs::write(d.join("cgroup.kill"), "1");
        }
        for pid in pids {
            if pid > 1 {
                killed.insert(pid);
                let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Thaws a group; returns whether it was frozen.
fn thaw(dir: &Path) -> bool {
    let read = |f: &str| fs::read_to_string(dir.join(f)).map(|s| s.trim().to_owned());
    let mut was = false;
    if let Ok(state) = read("freezer.state")
        && state != "THAWED"
    {
        was = true;
        let _ = fs::write(dir.join("freezer.state"), "THAWED");
    }
    if let Ok(state) = read("cgroup.freeze")
        && state != "0"
    {
        was = true;
        let _ = fs::write(dir.join("cgroup.freeze"), "0");
    }
    was
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_pid_dash_eight_hex_digits() {
        assert!(is_token("1234-0badf00d"));
        assert!(!is_token("1234-0badf00"));
        assert!(!is_token("-0badf00d"));
        assert!(!is_token("12a4-0badf00d"));
        assert!(!is_token("1234-0badf00d.tmp"));
    }

    #[test]
    fn records_round_trip() {
        let t = tempfile::tempdir().unwrap();
        let parents = vec![
            PathBuf::from("/sys/fs/cgroup/memory/runbox"),
            PathBuf::from("/sys/fs/cgroup/pids/runbox"),
        ];
        let owner = Owner::register(t.path(), parents.clone()).unwrap();
        let text = fs::read(t.path().join(owner.token())).unwrap();
        let (pid, got) = parse_record(&text);
        assert_eq!(pid, Some(std::process::id()));
        assert_eq!(got, parents);
        assert!(owner.group_name("sbx_1").ends_with(".sbx_1"));
        assert!(is_token(owner.token()));
    }

    #[test]
    fn a_live_owner_is_skipped_and_a_dead_one_removed() {
        let t = tempfile::tempdir().unwrap();
        let me = Owner::register(t.path(), vec![]).unwrap();
        let live = Owner::register(t.path(), vec![]).unwrap();
        // A dead owner: its record, unlocked.
        fs::write(t.path().join("99999999-deadbeef"), "pid 99999999\n").unwrap();
        // Not a record.
        fs::write(t.path().join("junk"), "").unwrap();
        let r = recover(t.path(), &me);
        assert_eq!(r.servers, 1);
        assert!(!r.found_leftovers());
        assert!(!t.path().join("99999999-deadbeef").exists());
        assert!(t.path().join(live.token()).exists());
        assert!(t.path().join(me.token()).exists());
        assert!(t.path().join("junk").exists());
        drop(live);
        // A clean end deletes the record.
        let token = me.token().to_owned();
        drop(me);
        assert!(!t.path().join(token).exists());
    }

    #[test]
    fn a_record_naming_no_cgroup_filesystem_touches_nothing() {
        let t = tempfile::tempdir().unwrap();
        let records = t.path().join("servers");
        let me = Owner::register(&records, vec![]).unwrap();
        // A directory that looks like a dead owner's group, but not on a cgroup filesystem.
        let parent = t.path().join("fake-cgroup");
        fs::create_dir_all(parent.join("1-0000abcd.sbx_x")).unwrap();
        fs::write(
            records.join("1-0000abcd"),
            format!("pid 1\ncgroup {}\n", parent.display()),
        )
        .unwrap();
        let r = recover(&records, &me);
        assert_eq!(r.sandboxes, 0);
        assert!(parent.join("1-0000abcd.sbx_x").exists());
    }

    /// The v2 path on a real cgroup2 mount, when there is one this test may write (root):
    /// a frozen group with a process in it is killed, thawed and removed.
    #[test]
    fn a_frozen_v2_group_is_killed_and_removed() {
        let Some(root) = writable_cgroup2() else {
            eprintln!("skipped: no writable cgroup2 mount");
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let parent = root.join(format!("runbox-recovery-test-{}", std::process::id()));
        fs::create_dir_all(&parent).unwrap();
        let group = parent.join("7-0000abcd.sbx_frozen");
        fs::create_dir(&group).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        fs::write(group.join("cgroup.procs"), child.id().to_string()).unwrap();
        fs::write(group.join("cgroup.freeze"), "1").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !fs::read_to_string(group.join("cgroup.events"))
            .unwrap()
            .contains("frozen 1")
        {
            assert!(Instant::now() < deadline, "did not freeze");
            std::thread::sleep(Duration::from_millis(5));
        }
        fs::write(
            t.path().join("7-0000abcd"),
            format!("pid 7\ncgroup {}\n", parent.display()),
        )
        .unwrap();
        let me = Owner::register(t.path(), vec![]).unwrap();
        let r = recover(t.path(), &me);
        let status = child.wait().unwrap();
        let _ = fs::remove_dir(&parent);
        assert_eq!(r.failures, Vec::<String>::new());
        assert_eq!((r.sandboxes, r.paused, r.processes), (1, 1, 1), "{r:?}");
        assert!(!group.exists());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    fn writable_cgroup2() -> Option<PathBuf> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
        mounts.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.starts_with("cgroup2 ") {
                left.split_whitespace().nth(4).map(PathBuf::from)
            } else {
                None
            }
        })
    }
}
