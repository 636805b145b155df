//! The sandbox's filesystem and restrictions, as a [`JailSpec`]: what of the host is visible
//! (read-only), which files are generated, where the kernel drivers go, and the Landlock,
//! rlimit and cgroup settings derived from the sandbox's [`Limits`]; and which of those
//! limits then hold ([`enforced`]).

use std::path::{Path, PathBuf};

use runbox_core::{Enforced, EnforcedLimits, Limits, Scope};
use runbox_jail::{
    Bind, CgroupLimits, Controller, File, Jail, JailSpec, LandlockPolicy, Rlimits, Tmpfs,
};

use crate::files::{AREAS, DATA_DIR};
use crate::runtime::Runtime;

/// Where the kernel drivers live inside every sandbox.
pub(crate) const DRIVER_DIR: &str = "/opt/runbox";
pub(crate) const PYTHON_DRIVER: &str = "/opt/runbox/python_kernel.py";
pub(crate) const NODE_DRIVER: &str = "/opt/runbox/node_kernel.js";
pub(crate) const BASH_PRELUDE: &str = "/opt/runbox/bash_prelude.sh";

/// Where the egress proxy appears inside a sandbox with network access: `127.0.0.1:3128`.
pub(crate) const EGRESS_PORT: u16 = 3128;
/// Where `install_packages` puts Python packages (on `PYTHONPATH`).
pub(crate) const PYTHON_PACKAGES: &str = "/workspace/.packages/python";
/// The CA bundle sandboxes trust, when the host has it (`/etc/ssl` is bound read-only).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The least `RLIMIT_DATA` a sandbox without a cgroup gets, whatever its memory limit: Node
/// needs about 48 MiB of private writable memory to start (its threads' stacks count), and
/// below that hangs rather than failing; Python and bash start in 16 MiB.
pub(crate) const MIN_DATA_BYTES: u64 = 64 << 20;

/// The environment of a sandbox with network access: the proxy, the host's CA bundle (so
/// TLS works where the host's does), where installed Python packages go, and the host's
/// package-index settings (`index_env`).
pub(crate) fn egress_env(index_env: &[(String, String)]) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
    let mut env: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
    ]
    .into_iter()
    .map(|k| (k.to_owned(), proxy.clone()))
    .collect();
    env.push(("NO_PROXY".into(), "localhost,127.0.0.1,::1".into()));
    env.push(("no_proxy".into(), "localhost,127.0.0.1,::1".into()));
    // The host's own choice of bundle when it is one a sandbox can see, else the system's.
    let ca = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
    ]
    .into_iter()
    .filter_map(|k| std::env::var(k).ok())
    .find(|p| p.starts_with("/etc/ssl/") && Path::new(p).is_file())
    .or_else(|| Path::new(CA_BUNDLE).is_file().then(|| CA_BUNDLE.to_owned()));
    if let Some(ca) = ca {
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "NODE_EXTRA_CA_CERTS",
            "CURL_CA_BUNDLE",
        ] {
            env.push((k.to_owned(), ca.clone()));
        }
    }
    env.push(("PYTHONPATH".into(), PYTHON_PACKAGES.into()));
    env.push(("npm_config_cache".into(), "/tmp/.npm".into()));
    env.push(("npm_config_update_notifier".into(), "false".into()));
    env.extend(index_env.iter().cloned());
    env
}

/// Top-level entries of the host that every sandbox mirrors: a symlink where the host has
/// one (merged /usr), a read-only bind where it has a directory.
const TOP_LEVEL: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Files and directories of the host's `/etc` bound read-only when present: the dynamic
/// linker's cache, certificates, time zone, MIME and service tables, alternatives (plus
/// every `python3*` entry, where Debian's Python keeps its site configuration).
const ETC_BINDS: [&str; 13] = [
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "fonts",
];

/// Where a sandbox has directories of its own, so that no host directory can be bound at
/// or above them: binds under `/tmp` and `/workspace` go on top of the sandbox's tmpfs,
/// but one of the whole of either would hide it.
const OWN_DIRS: [&str; 8] = [
    "/proc",
    "/dev",
    "/sys",
    DRIVER_DIR,
    "/var/tmp",
    "/etc",
    "/tmp",
    "/workspace",
];
/// Where a sandbox's contents are its own all the way down: nothing can be bound inside.
const OWN_TREES: [&str; 5] = ["/proc", "/dev", "/sys", DRIVER_DIR, "/var/tmp"];

/// Refuses an interpreter that cannot run in a sandbox because what it needs from the host
/// would have to be bound where a sandbox has its own directories; the message names the
/// path and the fix.
pub(crate) fn check_binds(runtime: &Runtime, data_dir: bool) -> Result<(), String> {
    let data = data_dir.then_some(DATA_DIR);
    let own = OWN_DIRS.iter().copied().chain(data);
    let trees: Vec<&str> = OWN_TREES.iter().copied().chain(data).collect();
    let own: Vec<&str> = own.collect();
    for (name, flag, found) in [
        ("Python", "python", &runtime.python),
        ("Node.js", "node", &runtime.node),
        ("bash", "bash", &runtime.bash),
    ] {
        let Ok(interpreter) = found else { continue };
        for bind in &interpreter.binds {
            let clash = own
                .iter()
                .find(|dir| Path::new(dir).starts_with(bind))
                .or_else(|| trees.iter().find(|dir| bind.starts_with(dir)));
            if let Some(dir) = clash {
                return Err(format!(
                    "the {name} at {} cannot run in a sandbox: it needs {} of the host, and a \
                     sandbox has its own {dir}; install it in another directory (any that \
                     others can read, /tmp included) or choose another with --{flag} PATH \
                     (RUNBOX_{})",
                    interpreter.path.display(),
                    bind.display(),
                    flag.to_uppercase()
                ));
            }
        }
    }
    Ok(())
}

/// The parts of a sandbox's layout that do not change between sandboxes.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    binds: Vec<Bind>,
    symlinks: Vec<(PathBuf, PathBuf)>,
    files: Vec<File>,
    read_exec: Vec<PathBuf>,
    tcp_ports: Vec<u16>,
    /// The directories the file tools reach, exported by every sandbox's init.
    pub(crate) export_dirs: Vec<PathBuf>,
}

fn file(path: &str, contents: impl Into<String>, mode: u32) -> File {
    File {
        path: path.into(),
        contents: contents.into(),
        mode,
    }
}

impl Layout {
    /// Plans the layout for the interpreters in `runtime`, reading the host's top level;
    /// `data_dir` (the operator's data files) is bound read-only at `/data`.
    pub(crate) fn plan(runtime: &Runtime, tcp_ports: Vec<u16>, data_dir: Option<&Path>) -> Self {
        let mut binds = Vec::new();
        let mut symlinks = Vec::new();
        let mut read_exec: Vec<PathBuf> = vec!["/etc".into(), DRIVER_DIR.into(), "/proc".into()];
        for name in TOP_LEVEL {
            let host = Path::new("/").join(name);
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&host) {
                        symlinks.push((host, target));
                    }
                }
                Ok(m) if m.is_dir() => {
                    binds.push(Bind {
                        source: host.clone(),
                        target: host.clone(),
                    });
                    read_exec.push(host);
                }
                _ => {}
            }
        }
        let python_etc = std::fs::read_dir("/etc")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("python3"));
        for name in ETC_BINDS.iter().map(|s| (*s).to_owned()).chain(python_etc) {
            let host = Path::new("/etc").join(name);
            if host.exists() {
                binds.push(Bind {
                    source: host.clone(),
                    target: host,
                });
            }
        }
        for interpreter in [&runtime.python, &runtime.node, &runtime.bash]
            .into_iter()
            .flatten()
        {
            for dir in &interpreter.binds {
                if !binds.iter().any(|b| dir.starts_with(&b.target)) {
                    binds.push(Bind {
                        source: dir.clone(),
                        target: dir.clone(),
                    });
                    read_exec.push(dir.clone());
                }
            }
        }
        symlinks.push(("/var/tmp".into(), "/tmp".into()));
        let mut export_dirs: Vec<PathBuf> = AREAS.iter().map(PathBuf::from).collect();
        if let Some(dir) = data_dir {
            binds.push(Bind {
                source: dir.to_owned(),
                target: DATA_DIR.into(),
            });
            read_exec.push(DATA_DIR.into());
            export_dirs.push(DATA_DIR.into());
        }
        let files = vec![
            file("/etc/hostname", "sandbox\n", 0o644),
            file(
                "/etc/hosts",
                "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
                0o644,
            ),
            file(
                "/etc/resolv.conf",
                "# This sandbox has no network access.\n",
                0o644,
            ),
            file(
                "/etc/nsswitch.conf",
                "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
                 protocols: files\nservices: files\n",
                0o644,
            ),
            file(
                PYTHON_DRIVER,
                include_str!("../kernels/python_kernel.py"),
                0o644,
            ),
            file(
                NODE_DRIVER,
                include_str!("../kernels/node_kernel.js"),
                0o644,
            ),
            file(
                BASH_PRELUDE,
                include_str!("../kernels/bash_prelude.sh"),
                0o644,
            ),
        ];
        Self {
            binds,
            symlinks,
            files,
            read_exec,
            tcp_ports,
            export_dirs,
        }
    }

    /// The jail of one sandbox with `limits`; with `egress`, the init listens on
    /// [`EGRESS_PORT`] for the server's proxy, and Landlock lets the sandbox connect there.
    /// Without a `cgroup` to cap the sandbox's memory, each of its processes gets
    /// `RLIMIT_DATA` at the memory limit instead.
    pub(crate) fn spec(&self, limits: &Limits, egress: bool, cgroup: bool) -> JailSpec {
        let mut tcp_ports = self.tcp_ports.clone();
        if egress {
            tcp_ports.push(EGRESS_PORT);
        }
        let mib = |m: u64| m.saturating_mul(1 << 20);
        JailSpec {
            hostname: "sandbox".into(),
            binds: self.binds.clone(),
            symlinks: self.symlinks.clone(),
            files: self.files.clone(),
            workspace: Tmpfs {
                size_bytes: mib(limits.workspace_mb),
                inodes: limits.inodes,
            },
            tmp: Tmpfs {
                size_bytes: mib(limits.tmp_mb),
                inodes: limits.inodes,
            },
            rlimits: Rlimits {
                nproc: u64::from(limits.pids),
                nofile: limits.open_files,
                // Above every tmpfs, so a full disk reports ENOSPC rather than killing the
                // writer with SIGXFSZ; still a bound should a writable mount ever be larger.
                fsize: mib(limits.workspace_mb.max(limits.tmp_mb)).saturating_mul(2),
                cpu_seconds: 0,
                memlock: 64 * 1024,
                stack: 0,
                data: if cgroup {
                    0
                } else {
                    limits.memory_bytes().max(MIN_DATA_BYTES)
                },
            },
            landlock: LandlockPolicy {
                list: vec!["/".into()],
                read_exec: self.read_exec.clone(),
                read_write: vec!["/workspace".into(), "/tmp".into(), "/dev/shm".into()],
                devices: vec!["/dev".into()],
                tcp_ports,
            },
            export_dirs: self.export_dirs.clone(),
            listen_tcp: if egress {
                vec![EGRESS_PORT]
            } else {
                Vec::new()
            },
            resources: CgroupLimits {
                memory_bytes: limits.memory_bytes(),
                pids: limits.pids,
                cpus: limits.cpus,
            },
        }
    }

    /// The environment every process of a sandbox starts with, before the caller's own.
    pub(crate) fn base_env(runtime: &Runtime) -> Vec<(String, String)> {
        let mut path = String::new();
        if let Ok(py) = &runtime.python
            && let Some(dir) = py.path.parent()
            && !dir.starts_with("/usr")
        {
            path.push_str(&format!("{}:", dir.display()));
        }
        path.push_str("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        [
            ("PATH", path.as_str()),
            ("HOME", "/workspace"),
            ("USER", "sandbox"),
            ("LOGNAME", "sandbox"),
            ("SHELL", "/bin/bash"),
            ("LANG", "C.UTF-8"),
            ("TERM", "dumb"),
            ("TMPDIR", "/tmp"),
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("MPLBACKEND", "Agg"),
            ("MPLCONFIGDIR", "/tmp/.matplotlib"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// Which of `limits` hold in `jail`: the cgroup's where it has one (memory, processes and,
/// with the CPU controller, CPU for the whole sandbox), else the rlimits its init applied
/// (memory per process, processes per sandbox: its own host uid as root, its own user
/// namespace otherwise) and no CPU limit at all.
pub(crate) fn enforced(limits: &Limits, jail: &Jail) -> EnforcedLimits {
    let rlimit = |name: &str| {
        jail.report()
            .rlimits
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    };
    let by = |s: &str| s.to_owned();
    match jail.cgroup() {
        Some(cg) => EnforcedLimits {
            memory: cg.has(Controller::Memory).then(|| Enforced {
                value: limits.memory_bytes(),
                per: Scope::Sandbox,
                by: by(if cg.limits_swap() {
                    "cgroup memory, swap included"
                } else {
                    "cgroup memory (swap not counted: no swap accounting)"
                }),
            }),
            processes: cg.has(Controller::Pids).then(|| Enforced {
                value: u64::from(limits.pids),
                per: Scope::Sandbox,
                by: by("cgroup pids"),
            }),
            cpus: cg.has(Controller::Cpu).then_some(limits.cpus),
        },
        None => EnforcedLimits {
            memory: rlimit("RLIMIT_DATA").map(|value| Enforced {
                value,
                per: Scope::Process,
                by: by("RLIMIT_DATA"),
            }),
            processes: rlimit("RLIMIT_NPROC").map(|value| Enforced {
                value,
                per: Scope::Sandbox,
                by: by("RLIMIT_NPROC"),
            }),
            cpus: None,
        },
    }
}
