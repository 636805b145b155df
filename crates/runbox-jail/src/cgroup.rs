//! The cgroup layer, host side: one group per sandbox for memory (swap included), processes
//! and CPU, on cgroup v2 or on the v1 hierarchies (as on this project's CI machines).
//!
//! Sandbox groups live under `<the server's own group>/runbox/<sandbox>` in each hierarchy
//! (or under an operator-given parent, for a delegated subtree when not running as root).
//! The host moves stage one and the init into the group before the init runs anything of
//! the sandbox's, so every sandboxed process is accounted and limited there (only the few
//! pages the init writes while building the root may stay charged to the server's group).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup interface is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 hierarchies, one per controller.
    V1,
    /// The unified v2 hierarchy.
    V2,
}

/// A controller runbox uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// Memory and swap.
    Memory,
    /// Process count.
    Pids,
    /// CPU quota.
    Cpu,
    /// CPU accounting (v1 only; v2 reports it in `cpu.stat`).
    Cpuacct,
    /// Freezing every process for a pause (v1 only; v2 has `cgroup.freeze` in every group).
    Freezer,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }
}

/// Limits applied to a sandbox's group.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CgroupLimits {
    /// Memory, swap included, in bytes.
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u32,
    /// CPU, in cores.
    pub cpus: f64,
}

/// Resource use of a sandbox, as far as the cgroup layer can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Memory in use, bytes.
    pub memory_bytes: Option<u64>,
    /// CPU time used, seconds.
    pub cpu_seconds: Option<f64>,
    /// Processes and threads alive.
    pub pids: Option<u64>,
    /// Times the kernel's OOM killer fired in the group.
    pub oom_kills: Option<u64>,
}

/// The cgroup setup of a host: where sandbox groups are made.
#[derive(Debug, Clone)]
pub struct Cgroups {
    version: CgroupVersion,
    /// `(controller, directory under which sandbox groups are created)`. On v2 every entry
    /// has the same directory.
    parents: Vec<(Controller, PathBuf)>,
}

/// Why cgroups cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CgroupUnavailable(pub String);

const CPU_PERIOD_US: u64 = 100_000;

impl Cgroups {
    /// Finds the cgroup hierarchy this process lives in and prepares `<own>/runbox` (or
    /// `<parent>/runbox` when `parent` is given, a path relative to each hierarchy's root).
    pub fn detect(parent: Option<&Path>) -> Result<Self, CgroupUnavailable> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| CgroupUnavailable(format!("read /proc/self/mountinfo: {e}")))?;
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| CgroupUnavailable(format!("read /proc/self/cgroup: {e}")))?;
        let mounts = parse_mountinfo(&mountinfo);
        let memberships = parse_proc_cgroup(&own);

        // Prefer v2 when it carries the controllers we need.
        if let Some(v2) = mounts.iter().find(|m| m.v2) {
            let controllers =
                fs::read_to_string(v2.mount_point.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                let own_path = memberships
                    .iter()
                    .find(|(id, _, _)| id == "0")
                    .map(|(_, _, p)| p.clone())
                    .unwrap_or_else(|| "/".into());
                let base = v2
                    .mount_point
                    .join(rel(parent.unwrap_or(Path::new(&own_path))));
                return Self::prepare_v2(&base, has("cpu"));
            }
        }

        let mut parents = Vec::new();
        for controller in [
            Controller::Memory,
            Controller::Pids,
            Controller::Cpu,
            Controller::Cpuacct,
        ] {
            let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller.name()))
            else {
                continue;
            };
            let own_path = memberships
                .iter()
                .find(|(_, ctrls, _)| ctrls.split(',').any(|c| c == controller.name()))
                .map(|(_, _, p)| p.clone())
                .unwrap_or_else(|| "/".into());
            let base = m
                .mount_point
                .join(rel(parent.unwrap_or(Path::new(&own_path))));
            parents.push((controller, base.join("runbox")));
        }
        let found = |c: Controller| parents.iter().any(|(x, _)| *x == c);
        if !found(Controller::Memory) || !found(Controller::Pids) {
            return Err(CgroupUnavailable(
                "no cgroup v2 hierarchy with the memory and pids controllers, and no v1 memory and pids hierarchies"
                    .into(),
            ));
        }
        for (_, dir) in &parents {
            fs::create_dir_all(dir)
                .map_err(|e| CgroupUnavailable(format!("create {}: {e}", dir.display())))?;
            writable(dir)?;
        }
        // The freezer is optional: without it (not mounted, or not delegated to this user)
        // sandboxes run the same but cannot be paused, which `runbox doctor` reports.
        if let Some(m) = mounts
            .iter()
            .find(|m| !m.v2 && m.controllers.iter().any(|c| c == "freezer"))
        {
            let own_path = memberships
                .iter()
                .find(|(_, ctrls, _)| ctrls.split(',').any(|c| c == "freezer"))
                .map(|(_, _, p)| p.clone())
                .unwrap_or_else(|| "/".into());
            let dir = m
                .mount_point
                .join(rel(parent.unwrap_or(Path::new(&own_path))))
                .join("runbox");
            match fs::create_dir_all(&dir)
                .map_err(|e| CgroupUnavailable(format!("create {}: {e}", dir.display())))
                .and_then(|()| writable(&dir))
            {
                Ok(()) => parents.push((Controller::Freezer, dir)),
                Err(e) => tracing::debug!("no cgroup freezer, sandboxes cannot pause: {e}"),
            }
        }
        Ok(Self {
            version: CgroupVersion::V1,
            parents,
        })
    }

    fn prepare_v2(base: &Path, cpu: bool) -> Result<Self, CgroupUnavailable> {
        let wanted = if cpu {
            "+memory +pids +cpu"
        } else {
            "+memory +pids"
        };
        let runbox = base.join("runbox");
        let enable = |dir: &Path| -> io::Result<()> {
            for c in wanted.split(' ') {
                fs::write(dir.join("cgroup.subtree_control"), c)?;
            }
            Ok(())
        };
        if let Err(e) = enable(base) {
            // The "no internal processes" rule: a group holding processes cannot hand
            // controllers to children. When the only process is this one, move it to a leaf.
            let procs = fs::read_to_string(base.join("cgroup.procs")).unwrap_or_default();
            let me = std::process::id().to_string();
            if e.raw_os_error() == Some(libc::EBUSY) && procs.lines().all(|l| l.trim() == me) {
                let leaf = base.join("runbox-server");
                fs::create_dir_all(&leaf)
                    .and_then(|()| fs::write(leaf.join("cgroup.procs"), &me))
                    .and_then(|()| enable(base))
                    .map_err(|e| {
                        CgroupUnavailable(format!("enable controllers in {}: {e}", base.display()))
                    })?;
            } else {
                return Err(CgroupUnavailable(format!(
                    "enable controllers in {}: {e} (run runbox in a cgroup of its own with delegation, \
                     e.g. `systemd-run --user --scope -p Delegate=yes runbox ...`)",
                    base.display()
                )));
            }
        }
        fs::create_dir_all(&runbox)
            .and_then(|()| enable(&runbox))
            .map_err(|e| CgroupUnavailable(format!("prepare {}: {e}", runbox.display())))?;
        writable(&runbox)?;
        let mut parents = vec![
            (Controller::Memory, runbox.clone()),
            (Controller::Pids, runbox.clone()),
        ];
        if cpu {
            parents.push((Controller::Cpu, runbox));
        }
        Ok(Self {
            version: CgroupVersion::V2,
            parents,
        })
    }

    /// A setup rooted at explicit directories, for tests against a fake hierarchy.
    pub fn with_parents(version: CgroupVersion, parents: Vec<(Controller, PathBuf)>) -> Self {
        Self { version, parents }
    }

    /// The interface in use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// Controllers available for sandboxes.
    pub fn controllers(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.parents.iter().map(|(c, _)| c.name()).collect();
        v.dedup();
        v
    }

    /// Whether sandboxes can be paused: v2 groups always can, v1 needs the freezer.
    pub fn can_freeze(&self) -> bool {
        match self.version {
            CgroupVersion::V2 => true,
            CgroupVersion::V1 => self.dir_of(Controller::Freezer).is_some(),
        }
    }

    /// Whether the memory limit includes swap (v1 needs swap accounting for that).
    pub fn limits_swap(&self) -> bool {
        match self.version {
            CgroupVersion::V2 => true,
            CgroupVersion::V1 => self
                .dir_of(Controller::Memory)
                .is_some_and(|d| d.join("memory.memsw.limit_in_bytes").exists()),
        }
    }

    fn dir_of(&self, c: Controller) -> Option<&Path> {
        self.parents
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, p)| p.as_path())
    }

    /// Directory holding every sandbox group of the memory controller (for crash recovery
    /// and tests).
    pub fn sandbox_parent(&self) -> Option<&Path> {
        self.dir_of(Controller::Memory)
    }

    /// Every directory sandbox groups are made in (one per v1 hierarchy, one on v2).
    pub fn parent_dirs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = Vec::new();
        for (_, p) in &self.parents {
            if !v.contains(p) {
                v.push(p.clone());
            }
        }
        v
    }

    /// Creates the group `name` with `limits`.
    pub fn create(&self, name: &str, limits: CgroupLimits) -> io::Result<SandboxCgroup> {
        let mut group = SandboxCgroup {
            version: self.version,
            dirs: Vec::new(),
        };
        for (c, parent) in &self.parents {
            let dir = parent.join(name);
            if !group.dirs.iter().any(|(_, d)| *d == dir)
                && let Err(e) = fs::create_dir(&dir)
            {
                group.remove_now();
                return Err(io::Error::new(
                    e.kind(),
                    format!("create {}: {e}", dir.display()),
                ));
            }
            group.dirs.push((*c, dir));
        }
        // Remove what was made if a limit cannot be set.
        if let Err(e) = group.set_limits(limits) {
            group.remove_now();
            return Err(e);
        }
        Ok(group)
    }
}

/// One sandbox's group (one directory per v1 hierarchy, or one v2 directory).
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    dirs: Vec<(Controller, PathBuf)>,
}

fn write(dir: &Path, file: &str, value: impl AsRef<[u8]>) -> io::Result<()> {
    fs::write(dir.join(file), value)
        .map_err(|e| io::Error::new(e.kind(), format!("write {}: {e}", dir.join(file).display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_key(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok())?
    })
}

impl SandboxCgroup {
    fn dir(&self, c: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, p)| p.as_path())
    }

    /// Whether the group has `controller` (its limit holds).
    pub fn has(&self, controller: Controller) -> bool {
        self.dir(controller).is_some()
    }

    /// Whether its memory limit includes swap (on v1 only with swap accounting).
    pub fn limits_swap(&self) -> bool {
        match self.version {
            CgroupVersion::V2 => self.has(Controller::Memory),
            CgroupVersion::V1 => self
                .dir(Controller::Memory)
                .is_some_and(|d| d.join("memory.memsw.limit_in_bytes").exists()),
        }
    }

    /// Every directory of the group (one per hierarchy on v1).
    pub fn paths(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = self.dirs.iter().map(|(_, p)| p.as_path()).collect();
        v.dedup();
        v
    }

    fn set_limits(&self, l: CgroupLimits) -> io::Result<()> {
        let quota = ((l.cpus * CPU_PERIOD_US as f64) as u64).max(1000);
        match self.version {
            CgroupVersion::V1 => {
                if let Some(d) = self.dir(Controller::Memory) {
                    write(d, "memory.limit_in_bytes", l.memory_bytes.to_string())?;
                    if d.join("memory.memsw.limit_in_bytes").exists() {
                        write(d, "memory.memsw.limit_in_bytes", l.memory_bytes.to_string())?;
                    }
                }
                if let Some(d) = self.dir(Controller::Pids) {
                    write(d, "pids.max", l.pids.to_string())?;
                }
                if let Some(d) = self.dir(Controller::Cpu) {
                    write(d, "cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                    write(d, "cpu.cfs_quota_us", quota.to_string())?;
                }
            }
            CgroupVersion::V2 => {
                if let Some(d) = self.dir(Controller::Memory) {
                    write(d, "memory.max", l.memory_bytes.to_string())?;
                    if d.join("memory.swap.max").exists() {
                        write(d, "memory.swap.max", "0")?;
                    }
                }
                if let Some(d) = self.dir(Controller::Pids) {
                    write(d, "pids.max", l.pids.to_string())?;
                }
                if let Some(d) = self.dir(Controller::Cpu) {
                    write(d, "cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
                }
            }
        }
        Ok(())
    }

    /// Moves process `pid` (and its future children) into the group.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        for dir in self.paths() {
            write(dir, "cgroup.procs", pid.to_string())?;
        }
        Ok(())
    }

    /// Current resource use.
    pub fn usage(&self) -> Usage {
        match self.version {
            CgroupVersion::V1 => Usage {
                memory_bytes: self
                    .dir(Controller::Memory)
                    .and_then(|d| read_u64(&d.join("memory.usage_in_bytes"))),
                cpu_seconds: self
                    .dir(Controller::Cpuacct)
                    .and_then(|d| read_u64(&d.join("cpuacct.usage")))
                    .map(|ns| ns as f64 / 1e9),
                pids: self
                    .dir(Controller::Pids)
                    .and_then(|d| read_u64(&d.join("pids.current"))),
                oom_kills: self
                    .dir(Controller::Memory)
                    .and_then(|d| read_key(&d.join("memory.oom_control"), "oom_kill")),
            },
            CgroupVersion::V2 => {
                let d = self.dirs.first().map(|(_, p)| p.as_path());
                Usage {
                    memory_bytes: d.and_then(|d| read_u64(&d.join("memory.current"))),
                    cpu_seconds: d
                        .and_then(|d| read_key(&d.join("cpu.stat"), "usage_usec"))
                        .map(|us| us as f64 / 1e6),
                    pids: d.and_then(|d| read_u64(&d.join("pids.current"))),
                    oom_kills: d.and_then(|d| read_key(&d.join("memory.events"), "oom_kill")),
                }
            }
        }
    }

    /// Pids of every process in the group.
    pub fn procs(&self) -> Vec<i32> {
        self.paths()
            .first()
            .and_then(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether the group can be frozen ([`SandboxCgroup::freeze`]).
    pub fn can_freeze(&self) -> bool {
        match self.version {
            CgroupVersion::V2 => self
                .paths()
                .first()
                .is_some_and(|d| d.join("cgroup.freeze").exists()),
            CgroupVersion::V1 => self.dir(Controller::Freezer).is_some(),
        }
    }

    /// Freezes (`true`) or thaws every process of the group and waits, up to `patience`,
    /// until the kernel reports it done. A frozen process uses no CPU and keeps its state.
    pub async fn set_frozen(&self, frozen: bool, patience: Duration) -> io::Result<()> {
        let (dir, file, value) = self.freezer(frozen)?;
        write(dir, file, value)?;
        let deadline = tokio::time::Instant::now() + patience;
        while !self.reached(dir, frozen) {
            if tokio::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{} did not reach {value}", dir.join(file).display()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// The directory, file and value that freeze or thaw the group.
    fn freezer(&self, frozen: bool) -> io::Result<(&Path, &'static str, &'static str)> {
        let dir = match self.version {
            CgroupVersion::V2 => self.paths().first().copied(),
            CgroupVersion::V1 => self.dir(Controller::Freezer),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no cgroup freezer"))?;
        Ok(match (self.version, frozen) {
            (CgroupVersion::V2, true) => (dir, "cgroup.freeze", "1"),
            (CgroupVersion::V2, false) => (dir, "cgroup.freeze", "0"),
            (CgroupVersion::V1, true) => (dir, "freezer.state", "FROZEN"),
            (CgroupVersion::V1, false) => (dir, "freezer.state", "THAWED"),
        })
    }

    /// Whether the kernel reports the group frozen (or thawed) throughout.
    fn reached(&self, dir: &Path, frozen: bool) -> bool {
        match self.version {
            CgroupVersion::V2 => {
                read_key(&dir.join("cgroup.events"), "frozen") == Some(u64::from(frozen))
            }
            CgroupVersion::V1 => fs::read_to_string(dir.join("freezer.state"))
                .is_ok_and(|s| s.trim() == if frozen { "FROZEN" } else { "THAWED" }),
        }
    }

    /// Thaws the group at once without waiting (before a teardown: a process frozen on v1
    /// cannot die).
    pub fn thaw_now(&self) {
        if self.can_freeze()
            && let Ok((dir, file, value)) = self.freezer(false)
        {
            let _ = write(dir, file, value);
        }
    }

    /// Kills every process in the group: `cgroup.kill` on v2, one by one on v1.
    pub fn kill_all(&self) {
        self.thaw_now();
        if self.version == CgroupVersion::V2
            && let Some(d) = self.paths().first()
            && write(d, "cgroup.kill", "1").is_ok()
        {
            return;
        }
        for pid in self.procs() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    fn remove_now(&self) -> bool {
        let mut all = true;
        for dir in self.paths() {
            match fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => all = false,
            }
        }
        all
    }

    /// Removes the group, waiting (up to `patience`) for its last processes to go.
    pub async fn remove(&self, patience: Duration) -> io::Result<()> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if self.remove_now() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                self.kill_all();
                tokio::time::sleep(Duration::from_millis(50)).await;
                return if self.remove_now() {
                    Ok(())
                } else {
                    Err(io::Error::other(format!(
                        "cgroup {:?} still busy",
                        self.paths()
                    )))
                };
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Sandbox groups are made in `dir`: it must be writable by this process (an existing
/// directory made by another user, root say, is not).
fn writable(dir: &Path) -> Result<(), CgroupUnavailable> {
    use nix::unistd::{AccessFlags, access};
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
        CgroupUnavailable(format!(
            "{} is not writable by uid {} ({e}); delegate a cgroup subtree to this user and pass it \
             with --cgroup-parent",
            dir.display(),
            nix::unistd::geteuid()
        ))
    })
}

fn rel(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

#[derive(Debug)]
struct CgroupMount {
    mount_point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let _source = r.next()?;
            let options = r.next().unwrap_or("");
            let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
            match fstype {
                "cgroup2" => Some(CgroupMount {
                    mount_point,
                    v2: true,
                    controllers: vec![],
                }),
                "cgroup" => Some(CgroupMount {
                    mount_point,
                    v2: false,
                    controllers: options.split(',').map(str::to_owned).collect(),
                }),
                _ => None,
            }
        })
        .collect()
}

/// `(hierarchy id, controllers, path)` per line of `/proc/self/cgroup`.
fn parse_proc_cgroup(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            Some((
                it.next()?.to_owned(),
                it.next()?.to_owned(),
                it.next()?.to_owned(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/pids rw,relatime shared:14 - cgroup cgroup rw,pids
37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
38 25 0:33 / /sys/fs/cgroup/unified rw,relatime shared:16 - cgroup2 cgroup2 rw
40 25 0:34 / /proc rw - proc proc rw";

    #[test]
    fn mountinfo_finds_v1_and_v2_mounts() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert!(m[0].controllers.contains(&"memory".to_string()));
        assert_eq!(
            m[2].mount_point,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert!(m[2].controllers.contains(&"cpuacct".to_string()));
        assert!(m[3].v2);
    }

    #[test]
    fn proc_cgroup_lines_split_into_three() {
        let p = parse_proc_cgroup("4:memory:/a/b\n0::/user.slice/x:y\n");
        assert_eq!(p[0], ("4".into(), "memory".into(), "/a/b".into()));
        assert_eq!(p[1].2, "/user.slice/x:y");
    }

    fn fake(version: CgroupVersion) -> (tempfile::TempDir, Cgroups) {
        let t = tempfile::tempdir().unwrap();
        let parents = match version {
            CgroupVersion::V1 => [
                Controller::Memory,
                Controller::Pids,
                Controller::Cpu,
                Controller::Cpuacct,
            ]
            .into_iter()
            .map(|c| {
                let d = t.path().join(c.name()).join("runbox");
                fs::create_dir_all(&d).unwrap();
                (c, d)
            })
            .collect(),
            CgroupVersion::V2 => {
                let d = t.path().join("unified/runbox");
                fs::create_dir_all(&d).unwrap();
                vec![
                    (Controller::Memory, d.clone()),
                    (Controller::Pids, d.clone()),
                    (Controller::Cpu, d),
                ]
            }
        };
        (t, Cgroups::with_parents(version, parents))
    }

    const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 64 << 20,
        pids: 32,
        cpus: 0.5,
    };

    #[test]
    fn v1_limits_land_in_each_hierarchy() {
        let (t, cg) = fake(CgroupVersion::V1);
        let g = cg.create("sbx1", LIMITS).unwrap();
        let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
        assert_eq!(read("memory/runbox/sbx1/memory.limit_in_bytes"), "67108864");
        assert_eq!(read("pids/runbox/sbx1/pids.max"), "32");
        assert_eq!(read("cpu/runbox/sbx1/cpu.cfs_quota_us"), "50000");
        assert_eq!(g.paths().len(), 4);
        g.add(4242).unwrap();
        assert_eq!(read("pids/runbox/sbx1/cgroup.procs"), "4242");
        fs::write(
            t.path().join("memory/runbox/sbx1/memory.usage_in_bytes"),
            "1234\n",
        )
        .unwrap();
        fs::write(
            t.path().join("memory/runbox/sbx1/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        fs::write(
            t.path().join("cpuacct/runbox/sbx1/cpuacct.usage"),
            "1500000000",
        )
        .unwrap();
        let u = g.usage();
        assert_eq!(u.memory_bytes, Some(1234));
        assert_eq!(u.oom_kills, Some(2));
        assert_eq!(u.cpu_seconds, Some(1.5));
    }

    #[test]
    fn v2_limits_land_in_one_directory() {
        let (t, cg) = fake(CgroupVersion::V2);
        let g = cg.create("sbx2", LIMITS).unwrap();
        let read =
            |p: &str| fs::read_to_string(t.path().join("unified/runbox/sbx2").join(p)).unwrap();
        assert_eq!(read("memory.max"), "67108864");
        assert_eq!(read("pids.max"), "32");
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(g.paths().len(), 1);
        fs::write(
            t.path().join("unified/runbox/sbx2/cpu.stat"),
            "usage_usec 2500000\nuser_usec 1\n",
        )
        .unwrap();
        assert_eq!(g.usage().cpu_seconds, Some(2.5));
    }

    #[tokio::test]
    async fn remove_deletes_empty_groups() {
        let (t, cg) = fake(CgroupVersion::V1);
        let g = cg.create("sbx3", LIMITS).unwrap();
        // A real cgroupfs deletes control files with the directory; emulate that.
        for p in g.paths() {
            for e in fs::read_dir(p).unwrap() {
                fs::remove_file(e.unwrap().path()).unwrap();
            }
        }
        g.remove(Duration::from_millis(100)).await.unwrap();
        assert!(!t.path().join("memory/runbox/sbx3").exists());
    }
}
