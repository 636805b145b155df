//! The file tools' path resolution (`runbox-local`'s `FileAreas`), fuzzed.
//!
//! An input is a few list, read, write, mkdir and snapshot calls, each with a path built
//! from fragments that matter (the areas, `..`, `//`, NUL, `/proc/self/root`, the names of
//! symbolic links planted in the areas that lead out of them, the host directory itself)
//! and arbitrary text. They run over host directories laid out as a sandbox's /workspace,
//! /tmp and read-only /data, beside a canary directory and a file that hold a secret.
//!
//! What must hold, whatever the input:
//! - no answer (result or error) carries the secret, nor the name of the fixture's host
//!   directory unless a path of the input had it;
//! - nothing outside the writable areas changes: the canary, /data, the directories around
//!   the areas, and nothing appears in the directory above the fixture or in `/`;
//! - a write or mkdir in /data fails;
//! - every path an answer names is in an area;
//! - what a write wrote reads back at the same path, and a directory made can be listed;
//! - nothing panics: every failure is a `runbox_core::Error`.
//!
//! The areas are wiped and laid anew after any input that wrote (or tried to), so that an
//! input does the same whatever ran before it (a crash reproduces from its input alone).

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use runbox_core::Error;
use runbox_local::fuzzing::FileAreas;

/// Where the areas are mounted in the sandbox.
const MOUNTS: [&str; 3] = ["/workspace", "/tmp", "/data"];
/// Most calls an input makes.
const MAX_OPS: usize = 8;
/// Most pieces a path is made of.
const MAX_PIECES: usize = 24;

/// Path fragments; `{root}` is the fixture's host directory and `{marker}` is never used
/// (the secret must not be guessable from here).
const FRAGMENTS: &[&str] = &[
    "/workspace",
    "/tmp",
    "/data",
    "/",
    "//",
    "..",
    ".",
    "../",
    "./",
    "/..",
    "/.",
    "\0",
    "/proc/self/root",
    "/proc/self/cwd",
    "/proc/self/fd/3",
    "/etc/hostname",
    "~",
    "%2e%2e",
    "\\",
    " ",
    "file.txt",
    "sub",
    "deep",
    "new",
    "escape_abs",
    "escape_rel",
    "escape_dir",
    "up",
    "up3",
    "root_link",
    "dangle_abs",
    "dangle_rel",
    "dangle_in",
    "loop_a",
    "loop_self",
    "self",
    "proc_root",
    "proc_rel",
    "inside",
    "back",
    "data_link",
    "ws_link",
    "fifo",
    "null",
    "data.csv",
    "reports",
    "q1.csv",
    "canary",
    "jail",
    "workspace",
    "tmp",
    "data",
    "{root}",
    "{long}",
];

/// One piece of a path.
enum Piece {
    /// A fragment.
    Frag(u8),
    /// `/` and a fragment.
    Seg(u8),
    /// Any text.
    Text(String),
}

impl<'a> Arbitrary<'a> for Piece {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0..=9u8)? {
            0..=4 => Piece::Seg(u8::arbitrary(u)?),
            5..=7 => Piece::Frag(u8::arbitrary(u)?),
            _ => Piece::Text(String::arbitrary(u)?),
        })
    }
}

/// A caller's path, as pieces.
#[derive(Arbitrary)]
struct SandboxPath(Vec<Piece>);

impl SandboxPath {
    fn render(&self, fx: &Fixture) -> String {
        let frag = |i: u8| match FRAGMENTS[usize::from(i) % FRAGMENTS.len()] {
            "{root}" => fx.root_str.as_str(),
            "{long}" => fx.long.as_str(),
            f => f,
        };
        let mut out = String::new();
        for piece in self.0.iter().take(MAX_PIECES) {
            match piece {
                Piece::Frag(i) => out.push_str(frag(*i)),
                Piece::Seg(i) => {
                    out.push('/');
                    out.push_str(frag(*i));
                }
                Piece::Text(t) => out.extend(t.chars().take(64)),
            }
        }
        out
    }
}

impl fmt::Debug for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.render(fixture()))
    }
}

/// An offset or a length: mostly small.
#[derive(Debug, Arbitrary, Clone, Copy)]
enum Count {
    Small(u8),
    Any(u64),
}

impl Count {
    fn get(self) -> u64 {
        match self {
            Count::Small(n) => u64::from(n),
            Count::Any(n) => n,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    List {
        path: SandboxPath,
        recursive: bool,
    },
    Read {
        path: SandboxPath,
        offset: Count,
        length: Option<Count>,
    },
    Write {
        path: SandboxPath,
        len: u8,
        append: bool,
    },
    Mkdir {
        path: SandboxPath,
    },
    Snapshot,
}

#[derive(Debug, Arbitrary)]
struct Input {
    ops: Vec<Op>,
}

/// What is known of one file of the fixture, to tell whether it changed.
#[derive(Debug, PartialEq, Eq)]
struct Meta {
    mode: u32,
    ino: u64,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    link: Option<PathBuf>,
}

struct Fixture {
    root: PathBuf,
    root_str: String,
    /// The name of `root`, which no answer may carry unless a path of the input had it.
    root_name: String,
    workspace: PathBuf,
    tmp: PathBuf,
    /// The secret: in the canary's files and in one beside the areas; only hex digits.
    marker: String,
    /// A name too long for most filesystems.
    long: String,
    files: FileAreas,
    /// Everything under `root` but the writable areas, as laid.
    baseline: BTreeMap<PathBuf, Meta>,
    /// The symbolic links planted in the writable areas, and their targets.
    links: Vec<(PathBuf, PathBuf)>,
    /// Unexpected errors (`Error::Sandbox`) already reported.
    noted: Mutex<BTreeSet<String>>,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(Fixture::new)
}

fn random_hex() -> String {
    let state = std::collections::hash_map::RandomState::new();
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = state.build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Removes fixtures left by fuzzing processes that are gone.
fn remove_stale(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("runbox-fuzz-")
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn scan(dir: &Path, skip: &[&Path], out: &mut BTreeMap<PathBuf, Meta>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("fixture: cannot read {}: {e}", dir.display()))
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("fixture: cannot read {}: {e}", dir.display()));
    entries.push(dir.to_owned());
    entries.sort();
    for path in entries {
        if skip.contains(&path.as_path()) {
            continue;
        }
        let m = fs::symlink_metadata(&path)
            .unwrap_or_else(|e| panic!("fixture: cannot stat {}: {e}", path.display()));
        let link = m.file_type().is_symlink().then(|| {
            fs::read_link(&path).unwrap_or_else(|e| panic!("readlink {}: {e}", path.display()))
        });
        if m.is_dir() && path != dir {
            scan(&path, skip, out);
        }
        out.insert(
            path,
            Meta {
                mode: m.mode(),
                ino: m.ino(),
                nlink: m.nlink(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
                link,
            },
        );
    }
}

fn must<T, E: fmt::Display>(r: Result<T, E>, what: impl fmt::Display) -> T {
    r.unwrap_or_else(|e| panic!("fixture: {what}: {e}"))
}

impl Fixture {
    fn new() -> Self {
        // On a tmpfs where there is one, as a sandbox's areas are (and ext4 is slow to make
        // and remove the fixture's files over and over).
        let shm = Path::new("/dev/shm");
        let tmp = match fs::metadata(shm) {
            Ok(m) if m.is_dir() && !m.permissions().readonly() => shm.to_owned(),
            _ => std::env::temp_dir(),
        };
        remove_stale(&tmp);
        let marker = random_hex();
        let suffix = random_hex();
        let root = tmp.join(format!(
            "runbox-fuzz-{}-{}",
            std::process::id(),
            &suffix[..8]
        ));
        let jail = root.join("jail");
        let canary = root.join("canary");
        let (workspace, tmp_area, data) =
            (jail.join("workspace"), jail.join("tmp"), jail.join("data"));
        for dir in [
            &workspace,
            &tmp_area,
            &data.join("reports"),
            &canary.join(format!("dir-{marker}")),
        ] {
            must(
                fs::create_dir_all(dir),
                format_args!("mkdir {}", dir.display()),
            );
        }
        let secret = format!("{marker}\n{marker}\n");
        must(fs::write(canary.join(&marker), &secret), "write the secret");
        must(
            fs::write(jail.join(format!("beside-{marker}")), &secret),
            "write the secret",
        );
        must(fs::write(data.join("data.csv"), "a,b\n1,2\n"), "write data");
        must(fs::write(data.join("reports/q1.csv"), "q\n"), "write data");
        let root_str = root.to_string_lossy().into_owned();
        for (name, target) in [
            ("escape_rel", format!("../../canary/{marker}")),
            ("escape_abs", format!("{root_str}/canary/{marker}")),
            ("up", "..".to_owned()),
        ] {
            must(symlink(target, data.join(name)), "symlink in /data");
        }
        let files = must(
            FileAreas::for_fuzzing(&[
                ("/workspace", &workspace, false),
                ("/tmp", &tmp_area, false),
                ("/data", &data, true),
            ]),
            "FileAreas",
        );
        let mut fx = Fixture {
            root_name: root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            root_str,
            workspace,
            tmp: tmp_area,
            marker,
            long: "x".repeat(300),
            files,
            baseline: BTreeMap::new(),
            links: Vec::new(),
            noted: Mutex::new(BTreeSet::new()),
            root,
        };
        fx.links = fx.lay();
        let mut baseline = BTreeMap::new();
        scan(&fx.root, &[&fx.workspace, &fx.tmp], &mut baseline);
        fx.baseline = baseline;
        fx
    }

    /// Lays the writable areas' files (into empty areas); returns the links planted.
    fn lay(&self) -> Vec<(PathBuf, PathBuf)> {
        let (ws, tmp, root) = (&self.workspace, &self.tmp, &self.root_str);
        let marker = &self.marker;
        must(fs::create_dir_all(ws.join("sub/deep")), "mkdir sub/deep");
        must(fs::write(ws.join("file.txt"), "hello\n"), "write file.txt");
        must(
            fs::write(ws.join("sub/file.txt"), "inner\n"),
            "write sub/file.txt",
        );
        must(
            fs::write(tmp.join("file.txt"), "tmp\n"),
            "write tmp/file.txt",
        );
        let links: Vec<(PathBuf, PathBuf)> = [
            (ws.join("escape_abs"), format!("{root}/canary/{marker}")),
            (ws.join("escape_rel"), format!("../../canary/{marker}")),
            (ws.join("escape_dir"), "../../canary".to_owned()),
            (ws.join("up"), "..".to_owned()),
            (ws.join("up3"), "../../..".to_owned()),
            (ws.join("root_link"), "/".to_owned()),
            (ws.join("dangle_abs"), format!("{root}/canary/created")),
            (ws.join("dangle_rel"), "../../canary/created".to_owned()),
            (ws.join("dangle_in"), "sub/created".to_owned()),
            (ws.join("loop_a"), "loop_b".to_owned()),
            (ws.join("loop_b"), "loop_a".to_owned()),
            (ws.join("loop_self"), "loop_self".to_owned()),
            (ws.join("self"), ".".to_owned()),
            (ws.join("proc_root"), "/proc/self/root".to_owned()),
            (
                ws.join("proc_rel"),
                "../../../../../../../../../../proc/self/root".to_owned(),
            ),
            (ws.join("inside"), "sub/file.txt".to_owned()),
            (ws.join("data_link"), "../data".to_owned()),
            (ws.join("sub/back"), "../file.txt".to_owned()),
            (ws.join("sub/up"), "../..".to_owned()),
            (tmp.join("ws_link"), "../workspace".to_owned()),
            (tmp.join("escape_rel"), format!("../../canary/{marker}")),
            (tmp.join("dangle_rel"), "../../canary/created".to_owned()),
        ]
        .into_iter()
        .map(|(link, target)| (link, PathBuf::from(target)))
        .collect();
        for (link, target) in &links {
            must(
                symlink(target, link),
                format_args!("symlink {}", link.display()),
            );
        }
        let fifo = rustix::fs::FileType::Fifo;
        must(
            rustix::fs::mknodat(rustix::fs::CWD, ws.join("fifo"), fifo, 0o644.into(), 0),
            "mkfifo",
        );
        // A device, where the fuzzer may make one (as root).
        let dev = rustix::fs::FileType::CharacterDevice;
        let null = rustix::fs::makedev(1, 3);
        let _ = rustix::fs::mknodat(rustix::fs::CWD, tmp.join("null"), dev, 0o666.into(), null);
        links
    }

    /// Empties the writable areas and lays them anew.
    fn reset(&self) {
        for area in [&self.workspace, &self.tmp] {
            for entry in must(fs::read_dir(area), "read an area") {
                let entry = must(entry, "read an area");
                let path = entry.path();
                let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                let removed = if is_dir {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                must(removed, format_args!("remove {}", path.display()));
            }
        }
        self.lay();
    }
}

fn in_an_area(path: &str) -> bool {
    MOUNTS.iter().any(|m| Path::new(path).starts_with(m))
}

/// Where a caller's path is, as the file tools take it.
fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/workspace/{path}")
    }
}

/// The names a path could create: its normal components.
fn names(path: &str) -> Vec<String> {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .filter(|n| !n.is_empty() && n.len() <= 255)
        .collect()
}

/// Whether each of `dirs` x `names` exists.
fn probe(dirs: &[&Path], names: &[String]) -> Vec<(PathBuf, bool)> {
    dirs.iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .map(|p| {
            let exists = fs::symlink_metadata(&p).is_ok();
            (p, exists)
        })
        .collect()
}

impl Fixture {
    /// Checks what every answer must be; `echoes` when a path of the input named the
    /// fixture's host directory (which answers then may repeat).
    fn check_answer<T: fmt::Debug>(&self, op: &Op, echoes: bool, answer: &Result<T, Error>) {
        let text = format!("{answer:?}");
        assert!(
            !text.contains(&self.marker),
            "the secret leaked: {op:?} answered {text}"
        );
        if !echoes {
            assert!(
                !text.contains(&self.root_name),
                "a host path leaked: {op:?} answered {text}"
            );
        }
        if let Err(e @ Error::Sandbox { .. }) = answer {
            // Not an escape, but a caller's mistake taken for a failure of the sandbox.
            let cause = std::error::Error::source(e).map(ToString::to_string);
            let kind = format!("{:?}", std::mem::discriminant(op));
            let key = format!("{kind} {cause:?}");
            if self
                .noted
                .lock()
                .map(|mut n| n.insert(key))
                .unwrap_or(false)
            {
                eprintln!("note: {op:?} failed as a sandbox failure: {e} ({cause:?})");
            }
        }
    }

    fn run(&self, op: &Op, echoes: bool) {
        let files = &self.files;
        match op {
            Op::Snapshot => {
                let answer = files.snapshot();
                self.check_answer(op, echoes, &answer);
                let listing = answer.unwrap_or_else(|e| panic!("snapshot failed: {e}"));
                for entry in &listing.entries {
                    assert!(
                        entry.path.starts_with("/workspace/"),
                        "snapshot named {}",
                        entry.path
                    );
                }
            }
            Op::List { path, recursive } => {
                let path = path.render(self);
                let answer = files.list(&path, *recursive);
                self.check_answer(op, echoes, &answer);
                if let Ok(listing) = &answer {
                    for entry in &listing.entries {
                        assert!(in_an_area(&entry.path), "{op:?} named {}", entry.path);
                    }
                }
            }
            Op::Read {
                path,
                offset,
                length,
            } => {
                let path = path.render(self);
                let length = length.map(Count::get);
                let answer = files.read(&path, offset.get(), length);
                self.check_answer(op, echoes, &answer);
                if let Ok(content) = &answer {
                    assert!(in_an_area(&content.path), "{op:?} named {}", content.path);
                    let marker = self.marker.as_bytes();
                    assert!(
                        !content.data.windows(marker.len()).any(|w| w == marker),
                        "the secret leaked: {op:?} read {:?}",
                        String::from_utf8_lossy(&content.data)
                    );
                    assert!(content.data.len() as u64 <= length.unwrap_or(u64::MAX));
                }
            }
            Op::Write { path, len, append } => {
                let path = path.render(self);
                // Only letters that are not hex digits: no write can spell the secret.
                let data: Vec<u8> = (0..*len % 48)
                    .map(|i| b"wxyz\n"[usize::from(i) % 5])
                    .collect();
                let around = self.root.parent().unwrap_or(Path::new("/"));
                let before = probe(&[around, Path::new("/")], &names(&path));
                let answer = files.write(&path, &data, *append);
                self.check_answer(op, echoes, &answer);
                self.check_probes(op, &before);
                if Path::new(&absolute(&path)).starts_with("/data") {
                    assert!(answer.is_err(), "{op:?} wrote in /data: {answer:?}");
                }
                if let Ok(written) = &answer {
                    assert!(in_an_area(&written.path), "{op:?} named {}", written.path);
                    let back = files.read(&path, 0, None);
                    let back = back.unwrap_or_else(|e| {
                        panic!("{op:?} wrote {written:?}, reading it back failed: {e}")
                    });
                    let ok = if *append {
                        back.data.ends_with(&data)
                    } else {
                        back.data == data
                    };
                    assert!(ok, "{op:?} wrote {data:?} but {:?} reads back", back.data);
                    if !*append {
                        assert_eq!(written.size, data.len() as u64, "{op:?}");
                    }
                }
            }
            Op::Mkdir { path } => {
                let path = path.render(self);
                let around = self.root.parent().unwrap_or(Path::new("/"));
                let before = probe(&[around, Path::new("/")], &names(&path));
                let answer = files.create_dir_all(&path);
                self.check_answer(op, echoes, &answer);
                self.check_probes(op, &before);
                if Path::new(&absolute(&path)).starts_with("/data") {
                    assert!(answer.is_err(), "{op:?} made a directory in /data");
                }
                if answer.is_ok() {
                    let listed = files.list(&path, false);
                    assert!(
                        listed.is_ok(),
                        "{op:?} made a directory that does not list: {listed:?}"
                    );
                }
            }
        }
    }

    fn check_probes(&self, op: &Op, before: &[(PathBuf, bool)]) {
        for (path, existed) in before {
            if !existed {
                assert!(
                    fs::symlink_metadata(path).is_err(),
                    "{op:?} created {} outside the areas",
                    path.display()
                );
            }
        }
    }

    /// Checks that nothing but the writable areas changed.
    fn check_untouched(&self, ops: &[Op]) {
        let mut now = BTreeMap::new();
        scan(&self.root, &[&self.workspace, &self.tmp], &mut now);
        if now != self.baseline {
            let changed: Vec<_> = now
                .iter()
                .filter(|(p, m)| self.baseline.get(*p) != Some(*m))
                .map(|(p, _)| p.display().to_string())
                .chain(
                    self.baseline
                        .keys()
                        .filter(|p| !now.contains_key(*p))
                        .map(|p| format!("{} (gone)", p.display())),
                )
                .collect();
            panic!("{ops:?} changed files outside the writable areas: {changed:?}");
        }
        for (link, target) in &self.links {
            let now = fs::read_link(link);
            assert!(
                now.as_ref().is_ok_and(|t| t == target),
                "{ops:?} changed the link {}: {now:?}",
                link.display()
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let fx = fixture();
    let ops = &input.ops[..input.ops.len().min(MAX_OPS)];
    let paths: Vec<String> = ops
        .iter()
        .map(|op| match op {
            Op::List { path, .. }
            | Op::Read { path, .. }
            | Op::Write { path, .. }
            | Op::Mkdir { path } => path.render(fx),
            Op::Snapshot => String::new(),
        })
        .collect();
    // libFuzzer learns the strings the checks look for: an input that names the secret
    // itself would only see it repeated (in an error, or as a name it made).
    if paths.iter().any(|p| p.contains(&fx.marker)) {
        return;
    }
    let echoes = paths.iter().any(|p| p.contains(&fx.root_name));
    for op in ops {
        fx.run(op, echoes);
    }
    // Only writes and mkdirs create or open for writing: after reads alone, nothing changed.
    if ops
        .iter()
        .any(|op| matches!(op, Op::Write { .. } | Op::Mkdir { .. }))
    {
        fx.check_untouched(ops);
        fx.reset();
    }
});
