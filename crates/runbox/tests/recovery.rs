//! Crash recovery, with the real binary: a server killed with SIGKILL leaves its sandboxes'
//! cgroups and its paused sandboxes' frozen processes behind; the next server to start with
//! the same state directory removes them and says so in its log, and never touches what a
//! server still alive owns.
//!
//! Each test uses a state directory of its own, so no other server of the suite (they run in
//! parallel) recovers its leftovers first; the cgroup parent is the shared one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use util::mcp::{Client, HttpServer, Revision, call, is_error, serve_command, structured, text};
use util::*;

/// A `runbox serve --http` with a state directory of its own.
struct Server {
    http: HttpServer,
}

impl Server {
    async fn start(state: &Path, args: &[&str]) -> Self {
        let state = state.to_str().unwrap();
        let mut all = vec!["--http", "127.0.0.1:0", "--state-dir", state];
        all.extend_from_slice(args);
        let mut command = serve_command(&all);
        command
            .env("RUNBOX_LOG", "warn,runbox_jail=info")
            .env("NO_COLOR", "1");
        Self {
            http: HttpServer::spawn(command).await,
        }
    }

    fn pid(&self) -> u32 {
        self.http.child.id().unwrap()
    }

    fn log(&self) -> String {
        self.http.log()
    }

    async fn client(&self) -> Client {
        self.http.client(Revision::Legacy).await.0
    }

    async fn kill_9(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        self.http.child.wait().await.unwrap();
    }
}

/// The cgroup directories a server's record in `state` lists, by the server's pid.
fn record_of(state: &Path, pid: u32) -> Option<(PathBuf, Vec<PathBuf>)> {
    let dir = state.join("servers");
    for e in fs::read_dir(dir).ok()?.flatten() {
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        if text.lines().any(|l| l == format!("pid {pid}")) {
            let parents = text
                .lines()
                .filter_map(|l| l.strip_prefix("cgroup "))
                .map(PathBuf::from)
                .collect();
            return Some((e.path(), parents));
        }
    }
    None
}

/// Every cgroup directory of the sandboxes of the server whose record is `record`.
fn groups_of(record: &Path, parents: &[PathBuf]) -> Vec<PathBuf> {
    let prefix = format!("{}.", record.file_name().unwrap().to_str().unwrap());
    parents
        .iter()
        .flat_map(|p| fs::read_dir(p).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_str().unwrap().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

fn sandbox_count(groups: &[PathBuf]) -> usize {
    groups
        .iter()
        .map(|g| g.file_name().unwrap().to_owned())
        .collect::<BTreeSet<_>>()
        .len()
}

/// A process by pid and start time (`/proc/PID/stat` field 22), so a reused pid is not it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    pid: i32,
    start: u64,
}

/// `(state, start time)` of a pid.
fn stat(pid: i32) -> Option<(char, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields[0].chars().next()?, fields[19].parse().ok()?))
}

fn proc_of(pid: i32) -> Option<Proc> {
    stat(pid).map(|(_, start)| Proc { pid, start })
}

/// Alive: the same process (not a reused pid), not a zombie.
fn alive(p: Proc) -> bool {
    stat(p.pid).is_some_and(|(state, start)| start == p.start && state != 'Z')
}

fn procs_in(groups: &[PathBuf]) -> BTreeSet<Proc> {
    groups
        .iter()
        .flat_map(|g| {
            fs::read_to_string(g.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| l.trim().parse().ok())
        .filter_map(proc_of)
        .collect()
}

/// The host uid of a process.
fn uid_of(pid: i32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether some process holds the lease (an `flock`) of sandbox uid `uid`.
fn lease_held(state: &Path, uid: u32) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(file) = fs::File::open(state.join("uids").join(uid.to_string())) else {
        return false;
    };
    Flock::lock(file, FlockArg::LockExclusiveNonblock).is_err()
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn new_sandbox(c: &Client) -> String {
    let r = call(c, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

async fn background(c: &Client, id: &str, command: &str) {
    let r = call(
        c,
        "run_command",
        json!({"sandbox_id": id, "command": command, "background": true}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
}

/// Pauses a sandbox; false when this host has no freezer.
async fn pause(c: &Client, id: &str) -> bool {
    let r = call(c, "pause_sandbox", json!({"sandbox_id": id})).await;
    if is_error(&r) {
        eprintln!("cannot pause here: {}", text(&r));
        return false;
    }
    true
}

async fn round_trip(c: &Client, sandbox: Option<&str>) {
    let mut args = json!({"code": "6 * 7"});
    if let Some(id) = sandbox {
        args["sandbox_id"] = json!(id);
    }
    let r = call(c, "run_code", args).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        json!("42"),
        "{}",
        text(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_kill_9_leaves_nothing_behind() {
    let state = tempfile::tempdir().unwrap();
    let tag = canary("recovery");
    let a = Server::start(state.path(), &["--pool", "2"]).await;
    let c = a.client().await;

    // One sandbox with a background process and a daemon in a session of its own, one
    // paused with a kernel and a background process, and the pool's two.
    let running = new_sandbox(&c).await;
    background(&c, &running, &format!("exec -a {tag}-bg sleep 1000")).await;
    background(
        &c,
        &running,
        &format!("setsid -f bash -c 'exec -a {tag}-daemon sleep 1000'"),
    )
    .await;
    let paused = new_sandbox(&c).await;
    round_trip(&c, Some(&paused)).await;
    background(&c, &paused, &format!("exec -a {tag}-paused sleep 1000")).await;
    let mut canaries = host_processes_at_least(&tag, 3);
    // The shells that started them may still be there for a moment, their command lines
    // naming the tag too.
    wait_until("only the three canaries are left", || {
        canaries = host_processes_with(&tag);
        canaries.len() == 3
    })
    .await;
    let paused_ok = pause(&c, &paused).await;

    let (record, parents) = record_of(state.path(), a.pid()).expect("the server's record");
    let cgroups = !parents.is_empty();
    if cgroups {
        wait_until("the pool is full", || {
            sandbox_count(&groups_of(&record, &parents)) == 4
        })
        .await;
    } else {
        eprintln!("no cgroups on this host: only processes can be left behind");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let groups = groups_of(&record, &parents);
    let mut before: BTreeSet<Proc> = procs_in(&groups);
    before.extend(canaries.iter().filter_map(|&p| proc_of(p)));
    let uids: BTreeSet<u32> = before
        .iter()
        .filter_map(|p| uid_of(p.pid))
        .filter(|&u| u != 0)
        .collect();
    let paused_canary = host_processes_with(&format!("{tag}-paused"))
        .into_iter()
        .filter_map(proc_of)
        .collect::<Vec<_>>();
    assert_eq!(paused_canary.len(), 1);
    eprintln!(
        "before the crash: {} groups ({} sandboxes), {} processes, uids {uids:?}",
        groups.len(),
        sandbox_count(&groups),
        before.len()
    );
    drop(c);
    let a_pid = a.pid();
    a.kill_9().await;

    // What the crash left: every group, and the paused sandbox, frozen. (Running sandboxes'
    // inits see their control sockets close, exit, and take their processes with them.)
    wait_until("the running sandbox's processes are gone", || {
        host_processes_with(&format!("{tag}-bg")).is_empty()
            && host_processes_with(&format!("{tag}-daemon")).is_empty()
    })
    .await;
    assert!(record.exists());
    if cgroups {
        assert!(groups.iter().all(|g| g.exists()), "groups left behind");
    }
    if paused_ok {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(alive(paused_canary[0]), "the paused sandbox survives");
        // Its uid lease went with the server, though its processes still run as that uid.
        let uid = uid_of(paused_canary[0].pid).unwrap();
        if running_as_root() {
            assert!(!lease_held(state.path(), uid));
        }
    }

    // Two servers start at once: one of them recovers, once.
    let (b, c2) = tokio::join!(
        Server::start(state.path(), &["--pool", "0"]),
        Server::start(state.path(), &["--pool", "0"])
    );
    let said: Vec<String> = [&b, &c2]
        .iter()
        .flat_map(|s| {
            s.log()
                .lines()
                .filter(|l| l.contains("recovered after a crash"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    if cgroups {
        assert_eq!(said.len(), 1, "exactly one server recovers: {said:?}");
        let line = &said[0];
        assert!(
            line.contains(&format!("runbox server pid {a_pid} ")),
            "{line}"
        );
        assert!(line.contains("the cgroups of 4 sandboxes"), "{line}");
        if paused_ok {
            assert!(line.contains("thawed 1 paused sandbox,"), "{line}");
            assert!(!line.contains("killed 0 "), "{line}");
        }
    }

    // Nothing from before is left: no process, no group, no record, no lease.
    let left: Vec<&Proc> = before.iter().filter(|p| alive(**p)).collect();
    assert!(left.is_empty(), "still alive: {left:?}");
    let left: Vec<&PathBuf> = groups.iter().filter(|g| g.exists()).collect();
    assert!(left.is_empty(), "still there: {left:?}");
    assert!(!record.exists());
    for uid in &uids {
        assert!(!lease_held(state.path(), *uid), "uid {uid} still leased");
        let file = state.path().join("uids").join(uid.to_string());
        assert!(
            !file.exists(),
            "the dead server's lease file {file:?} was kept"
        );
    }

    // And the new servers work.
    let c = b.client().await;
    round_trip(&c, None).await;
    let id = new_sandbox(&c).await;
    round_trip(&c, Some(&id)).await;
    drop(c);
    let c = c2.client().await;
    round_trip(&c, None).await;
    drop(c);

    // A clean stop leaves no record.
    assert_eq!(b.http.stop().await.code(), Some(0));
    assert_eq!(c2.http.stop().await.code(), Some(0));
    let records: Vec<_> = fs::read_dir(state.path().join("servers"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(records.is_empty(), "{records:?}");
    // Nor any lease file: each went with its sandbox.
    let leases: Vec<_> = fs::read_dir(state.path().join("uids"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leases.is_empty(), "{leases:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_starting_leaves_a_live_servers_sandboxes_alone() {
    let state = tempfile::tempdir().unwrap();
    let tag = canary("live");
    let a = Server::start(state.path(), &["--pool", "0"]).await;
    let ca = a.client().await;
    let running = new_sandbox(&ca).await;
    background(&ca, &running, &format!("exec -a {tag} sleep 1000")).await;
    let sleeper = proc_of(host_processes_at_least(&tag, 1)[0]).unwrap();
    let paused = new_sandbox(&ca).await;
    round_trip(&ca, Some(&paused)).await;
    let paused_ok = pause(&ca, &paused).await;
    let (record, parents) = record_of(state.path(), a.pid()).expect("the server's record");
    let groups = groups_of(&record, &parents);
    let before = procs_in(&groups);

    let b = Server::start(state.path(), &["--pool", "1"]).await;
    assert!(!b.log().contains("recovered after a crash"), "{}", b.log());

    // A's sandboxes are whole: processes, groups, and they still run code.
    assert!(alive(sleeper));
    assert!(before.iter().all(|p| alive(*p)));
    assert!(groups.iter().all(|g| g.exists()));
    assert!(record.exists());
    round_trip(&ca, Some(&running)).await;
    if paused_ok {
        let r = call(&ca, "resume_sandbox", json!({"sandbox_id": paused})).await;
        assert!(!is_error(&r), "{}", text(&r));
    }
    round_trip(&ca, Some(&paused)).await;
    let cb = b.client().await;
    round_trip(&cb, None).await;

    drop((ca, cb));
    assert_eq!(a.http.stop().await.code(), Some(0));
    assert_eq!(b.http.stop().await.code(), Some(0));
    assert!(!alive(sleeper));
    assert!(groups.iter().all(|g| !g.exists()));
    assert!(!record.exists());
}
