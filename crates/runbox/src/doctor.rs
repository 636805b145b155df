//! `runbox doctor`: one line per isolation layer, then proof: a real sandbox is started,
//! its init's report is printed, and a process inside confirms what it sees. With
//! `--backend e2b`, the proof is a cloud sandbox: made with the configured key and template,
//! used from each side (code, a command, a file), and killed.

use std::time::{Duration, Instant};

use runbox_core::{Backend, ExecContext, ExecRequest, Language, Limits, SandboxId, SandboxSpec};
use runbox_local::LocalBackend;

use crate::cli::DoctorArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Default)]
struct Report {
    failures: Vec<String>,
    warnings: usize,
}

impl Report {
    fn line(&mut self, status: Status, layer: &str, detail: impl AsRef<str>) {
        let tag = match status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        println!("  {tag:<5} {layer:<22} {}", detail.as_ref());
        match status {
            Status::Fail => self.failures.push(format!("{layer}: {}", detail.as_ref())),
            Status::Warn => self.warnings += 1,
            Status::Ok => {}
        }
    }

    fn check(&mut self, ok: bool, layer: &str, good: impl AsRef<str>, bad: impl AsRef<str>) {
        if ok {
            self.line(Status::Ok, layer, good);
        } else {
            self.line(Status::Fail, layer, bad);
        }
    }
}

pub(crate) async fn main(args: DoctorArgs) -> u8 {
    if args.backend == Some(crate::config::BackendKind::E2b) {
        return e2b(args.e2b).await;
    }
    let mut r = Report::default();
    let probe = runbox_jail::probe::probe();
    let root = probe.euid == 0;
    println!(
        "runbox doctor: Linux {}, running as {}",
        probe.kernel,
        if root {
            "root".to_owned()
        } else {
            format!("uid {}", probe.euid)
        }
    );
    println!("host:");
    if root {
        r.line(
            Status::Ok,
            "identity",
            format!(
                "each sandbox runs as its own unprivileged host uid (from {}), never uid 0; no user namespace needed",
                runbox_jail::DEFAULT_UID_BASE
            ),
        );
    } else {
        match &probe.user_namespaces {
            Ok(()) => r.line(
                Status::Ok,
                "user namespace",
                "available: one sandbox uid maps to yours, nothing to root",
            ),
            Err(e) => r.line(Status::Fail, "user namespace", e),
        }
    }
    match &probe.seccomp {
        Ok(()) => r.line(
            Status::Ok,
            "seccomp",
            "filters with errno actions available",
        ),
        Err(e) => r.line(Status::Fail, "seccomp", e),
    }
    match probe.landlock_abi {
        0 => r.line(
            Status::Warn,
            "landlock",
            "not available: filesystem and TCP restrictions rest on mounts and namespaces alone",
        ),
        abi @ 1..=3 => r.line(
            Status::Warn,
            "landlock",
            format!("ABI {abi}: filesystem only (TCP rules need ABI 4, scopes ABI 6)"),
        ),
        abi @ 4..=5 => r.line(
            Status::Warn,
            "landlock",
            format!("ABI {abi}: filesystem and TCP (signal and socket scopes need ABI 6)"),
        ),
        abi => r.line(
            Status::Ok,
            "landlock",
            format!("ABI {abi}: filesystem, TCP bind/connect, signal and abstract-socket scopes"),
        ),
    }

    // Cgroups or not, the rest is checked; a missing layer `serve` requires is a FAIL line.
    let mut config = args.engine.local_config(Limits::default());
    if config.jail.cgroups == runbox_jail::CgroupMode::Required {
        config.jail.cgroups = runbox_jail::CgroupMode::IfAvailable;
    }
    let backend = match LocalBackend::new(config).await {
        Ok(b) => b,
        Err(e) => {
            r.line(Status::Fail, "engine", runbox_core::chain(&e));
            return finish(&r);
        }
    };
    match backend.host().cgroups() {
        Ok(c) => {
            let swap = if c.limits_swap() {
                "memory limit includes swap"
            } else {
                "memory limit excludes swap (no swap accounting)"
            };
            r.line(
                Status::Ok,
                "cgroups",
                format!("{:?}: {}; {swap}", c.version(), c.controllers().join(", ")),
            );
            if c.can_freeze() {
                r.line(Status::Ok, "pause", "cgroup freezer available");
            } else {
                r.line(
                    Status::Warn,
                    "pause",
                    "no cgroup freezer (v1 freezer hierarchy not mounted or not writable): \
                     pause_sandbox is refused",
                );
            }
        }
        Err(e) if args.engine.no_cgroups => {
            r.line(
                Status::Warn,
                "cgroups",
                format!(
                    "not used ({e}): memory is capped per process (RLIMIT_DATA), not per \
                     sandbox; processes by RLIMIT_NPROC; CPU not at all"
                ),
            );
            r.line(
                Status::Warn,
                "pause",
                "no cgroups, so no freezer: pause_sandbox is refused",
            );
        }
        Err(e) => {
            r.line(
                Status::Fail,
                "cgroups",
                format!(
                    "unavailable: {e}. runbox serve and runbox run refuse to start without \
                     them: give runbox a cgroup subtree (as root, or delegated to this user and \
                     named with --cgroup-parent), or pass --no-cgroups for per-process limits \
                     only"
                ),
            );
            r.line(
                Status::Warn,
                "pause",
                "no cgroups, so no freezer: pause_sandbox is refused",
            );
        }
    }
    let rt = backend.runtime();
    for (name, found) in [
        ("python", &rt.python),
        ("node", &rt.node),
        ("bash", &rt.bash),
    ] {
        match found {
            Ok(i) => {
                let binds = if i.binds.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", bound read-only from {}",
                        i.binds
                            .iter()
                            .map(|b| b.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                r.line(
                    Status::Ok,
                    name,
                    format!("{} ({}){binds}", i.path.display(), i.version),
                );
            }
            Err(e) => r.line(Status::Warn, name, format!("not available: {e}")),
        }
    }

    println!("a sandbox, started now:");
    let started = Instant::now();
    let id = match backend.create(SandboxSpec::default()).await {
        Ok(info) => {
            r.line(
                Status::Ok,
                "create",
                format!(
                    "started in {:.1} ms",
                    started.elapsed().as_secs_f64() * 1000.0
                ),
            );
            info.id
        }
        Err(e) => {
            r.line(Status::Fail, "create", runbox_core::chain(&e));
            return finish(&r);
        }
    };
    sandbox_checks(&mut r, &backend, &id).await;
    let _ = backend.close(&id).await;
    finish(&r)
}

async fn sandbox_checks(r: &mut Report, backend: &LocalBackend, id: &SandboxId) {
    let Ok(diag) = backend.diagnostics(id).await else {
        r.line(Status::Fail, "report", "the sandbox vanished");
        return;
    };
    let l = &diag.layers;
    r.line(Status::Ok, "namespaces", l.namespaces.join(", "));
    r.line(Status::Ok, "identity", &l.identity);
    r.check(
        l.pivot_root,
        "root",
        "fresh tmpfs root via pivot_root, old root detached",
        "pivot_root not done",
    );
    r.check(
        l.capabilities_dropped,
        "capabilities",
        "none: effective, permitted, inheritable, ambient and bounding sets empty",
        "capabilities remain",
    );
    r.check(l.no_new_privs, "no_new_privs", "set", "not set");
    r.check(
        l.seccomp_filters > 0,
        "seccomp",
        format!(
            "{} filters, {} syscalls refused outright or by argument",
            l.seccomp_filters, l.seccomp_rules
        ),
        "no filter installed",
    );
    let landlock = if l.landlock_abi == 0 {
        Status::Warn
    } else if l.landlock_status == "fully enforced" {
        Status::Ok
    } else {
        Status::Warn
    };
    r.line(
        landlock,
        "landlock",
        format!(
            "{} (ABI {}; TCP rules: {}; scopes: {})",
            l.landlock_status,
            l.landlock_abi,
            if l.landlock_tcp { "yes" } else { "no" },
            if l.landlock_scopes { "yes" } else { "no" }
        ),
    );
    let rlimits: Vec<String> = l
        .rlimits
        .iter()
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches("RLIMIT_")))
        .collect();
    r.line(Status::Ok, "rlimits", rlimits.join(" "));
    if diag.cgroup_paths.is_empty() {
        r.line(Status::Warn, "sandbox cgroup", "none (cgroups unavailable)");
    } else {
        r.line(
            Status::Ok,
            "sandbox cgroup",
            format!("{} directories, removed at close", diag.cgroup_paths.len()),
        );
    }
    // Which of the default limits actually hold, as get_sandbox_status reports them.
    match backend.status(id).await {
        Ok(s) => {
            let e = &s.enforced;
            let whole = e.sandbox_memory_bytes().is_some() && e.cpus.is_some();
            r.line(
                if whole { Status::Ok } else { Status::Warn },
                "limits in force",
                e.to_string(),
            );
        }
        Err(e) => r.line(Status::Fail, "limits in force", runbox_core::chain(&e)),
    }

    // What a process inside actually sees.
    let probe = "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapBnd):' /proc/self/status; id -u; \
                 ls /sys >/dev/null 2>&1 && echo sys-visible; cat /etc/shadow >/dev/null 2>&1 && echo shadow-readable; true";
    match backend
        .exec(
            id,
            ExecRequest::new(Language::Bash, probe, Duration::from_secs(20)),
            ExecContext::default(),
        )
        .await
    {
        Ok(o) if o.succeeded() => {
            let field = |name: &str| {
                o.stdout
                    .lines()
                    .find_map(|line| line.strip_prefix(name).map(|v| v.trim().to_owned()))
                    .unwrap_or_default()
            };
            let uid: u64 = o
                .stdout
                .lines()
                .find(|l| l.chars().all(|c| c.is_ascii_digit()) && !l.is_empty())
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let zero = "0000000000000000";
            let good = field("NoNewPrivs:") == "1"
                && field("Seccomp:") == "2"
                && field("CapEff:") == zero
                && field("CapPrm:") == zero
                && field("CapBnd:") == zero
                && uid != 0
                && !o.stdout.contains("sys-visible")
                && !o.stdout.contains("shadow-readable");
            r.check(
                good,
                "seen from inside",
                format!("uid {uid}, no capabilities, no_new_privs, seccomp filtering, no /sys, no /etc/shadow"),
                format!("unexpected view from inside: {}", o.stdout.replace('\n', "; ")),
            );
        }
        Ok(o) => r.line(
            Status::Fail,
            "seen from inside",
            format!("probe failed: {}", o.stderr.trim()),
        ),
        Err(e) => r.line(Status::Fail, "seen from inside", e.to_string()),
    }
    for language in [Language::Python, Language::JavaScript] {
        if backend.runtime().for_language(language).is_err() {
            continue;
        }
        let t = Instant::now();
        match backend.warm_kernel(id, language).await {
            Ok(version) => r.line(
                Status::Ok,
                &format!("{language} kernel"),
                format!(
                    "{version} started in {:.0} ms",
                    t.elapsed().as_secs_f64() * 1000.0
                ),
            ),
            Err(e) => r.line(
                Status::Fail,
                &format!("{language} kernel"),
                runbox_core::chain(&e),
            ),
        }
    }
}

/// The e2b backend's checks: settings, then a sandbox made, used and killed.
async fn e2b(args: crate::config::E2bArgs) -> u8 {
    let mut r = Report::default();
    let settings = match args.settings(false, &|name| std::env::var(name)) {
        Ok(s) => s,
        Err(e) => {
            println!("runbox doctor: the e2b backend");
            r.line(Status::Fail, "settings", format!("{e:#}"));
            return finish_e2b(&r);
        }
    };
    let config = settings.config();
    println!(
        "runbox doctor: the e2b backend: {} ({}{}), template {}",
        config.provider.name(),
        config.domain,
        config
            .api_url
            .as_deref()
            .map(|u| format!(", API at {u}"))
            .unwrap_or_default(),
        config.template
    );
    let backend = match runbox_e2b::E2bBackend::new(config) {
        Ok(b) => b,
        Err(e) => {
            r.line(Status::Fail, "settings", e.to_string());
            return finish_e2b(&r);
        }
    };
    let started = Instant::now();
    let info = match backend.create(SandboxSpec::default()).await {
        Ok(info) => info,
        Err(e) => {
            r.line(Status::Fail, "sandbox", runbox_core::chain(&e));
            return finish_e2b(&r);
        }
    };
    let id = info.id;
    r.line(
        Status::Ok,
        "sandbox",
        format!(
            "{id} made in {} ms ({} MiB, {} CPUs)",
            started.elapsed().as_millis(),
            info.limits.memory_mb,
            info.limits.cpus
        ),
    );
    let timeout = Duration::from_secs(60);
    let started = Instant::now();
    let python = ExecRequest::new(Language::Python, "print(1 + 1)", timeout);
    match backend.exec(&id, python, ExecContext::default()).await {
        Ok(o) => r.check(
            o.succeeded() && o.stdout == "2\n",
            "python",
            format!(
                "print(1 + 1) in the code interpreter: 2, in {} ms",
                started.elapsed().as_millis()
            ),
            format!("print(1 + 1) gave {:?}, {:?}", o.stdout, o.error),
        ),
        Err(e) => r.line(Status::Fail, "python", runbox_core::chain(&e)),
    }
    let started = Instant::now();
    let echo = runbox_core::CommandRequest::new("echo ok", timeout);
    match backend.command(&id, echo, ExecContext::default()).await {
        Ok(o) => r.check(
            o.succeeded() && o.stdout == "ok\n",
            "command",
            format!(
                "echo ok through envd, in {} ms",
                started.elapsed().as_millis()
            ),
            format!("echo ok gave {:?}, exit {:?}", o.stdout, o.exit_code),
        ),
        Err(e) => r.line(Status::Fail, "command", runbox_core::chain(&e)),
    }
    let path = "/workspace/runbox-doctor.txt";
    let written = backend.write_file(&id, path, b"ok".to_vec(), false).await;
    let read = match written {
        Ok(_) => backend.read_file(&id, path, 0, None).await.map(|c| c.data),
        Err(e) => Err(e),
    };
    match read {
        Ok(data) => r.check(
            data == b"ok",
            "files",
            format!("{path} written and read back"),
            format!("{path} read back as {data:?}"),
        ),
        Err(e) => r.line(Status::Fail, "files", runbox_core::chain(&e)),
    }
    match backend.close(&id).await {
        Ok(()) => r.line(Status::Ok, "closed", format!("{id} killed")),
        Err(e) => r.line(Status::Fail, "closed", runbox_core::chain(&e)),
    }
    finish_e2b(&r)
}

fn finish_e2b(r: &Report) -> u8 {
    if r.failures.is_empty() {
        println!("result: cloud sandboxes work with these settings");
        0
    } else {
        println!("result: cloud sandboxes do not work with these settings:");
        for f in &r.failures {
            println!("  - {f}");
        }
        1
    }
}

fn finish(r: &Report) -> u8 {
    if r.failures.is_empty() {
        let warn = match r.warnings {
            0 => String::new(),
            n => format!(
                " ({n} optional layer{} missing or partial, see warn lines)",
                if n == 1 { "" } else { "s" }
            ),
        };
        println!("result: sandboxes can run with every required layer{warn}");
        0
    } else {
        println!("result: sandboxes cannot run safely here:");
        for f in &r.failures {
            println!("  - {f}");
        }
        1
    }
}
