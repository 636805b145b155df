//! The `runbox` command line, run as a user would: exit statuses, streaming, stdin, Ctrl-C,
//! `doctor`, and nothing left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use util::*;

fn runbox() -> Command {
    let mut c = Command::new(runbox_exe());
    c.env("RUNBOX_INIT_EXE", runbox_exe());
    if let Some(p) = std::env::var_os("RUNBOX_CGROUP_PARENT") {
        c.env("RUNBOX_CGROUP_PARENT", p);
    }
    c
}

fn run(args: &[&str]) -> Output {
    runbox().arg("run").args(args).output().unwrap()
}

/// Reads one byte at a time up to a newline (output arrives in whatever pieces the code
/// wrote it in).
fn read_line(r: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while r.read(&mut byte).unwrap() == 1 {
        line.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    text(&line)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn success_prints_output_and_the_value_and_exits_0() {
    let o = run(&["import sys\nprint('hi')\nprint('warn', file=sys.stderr)\n6 * 7"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "hi\n42\n");
    assert_eq!(text(&o.stderr), "warn\n");
}

#[test]
fn an_exception_exits_1_with_its_traceback() {
    let o = run(&["def f():\n    return 1 / 0\nf()"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("ZeroDivisionError: division by zero"), "{err}");
    assert!(err.contains("line 2, in f"), "{err}");
}

#[test]
fn a_timeout_exits_124() {
    let t = Instant::now();
    let o = run(&["--timeout", "1", "import time\ntime.sleep(30)"]);
    assert_eq!(o.status.code(), Some(124));
    assert!(
        text(&o.stderr).contains("timeout of 1 s"),
        "{}",
        text(&o.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn bash_passes_its_status_through() {
    let o = run(&["-l", "bash", "echo out; exit 42"]);
    assert_eq!(o.status.code(), Some(42));
    assert_eq!(text(&o.stdout), "out\n");
    let o = run(&["--language", "bash", "true"]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn javascript_runs_with_top_level_await() {
    let o = run(&[
        "-l",
        "javascript",
        "const v = await Promise.resolve(2);\nconsole.log(v * 21)",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "42\n");
    let o = run(&["-l", "js", "null.x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("TypeError"));
}

#[test]
fn dash_reads_the_code_from_stdin() {
    let mut child = runbox()
        .args(["run", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"for i in range(3):\n    print(i)\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o.stdout), "0\n1\n2\n");
}

#[test]
fn output_streams_to_the_terminal_as_it_comes() {
    let mut child = runbox()
        .args([
            "run",
            "import time\nprint('early', flush=True)\ntime.sleep(2)\nprint('late')",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let first = read_line(&mut stdout);
    let first_at = Instant::now();
    assert_eq!(first, "early\n");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(rest, "late\n");
    assert!(status.success());
    assert!(
        first_at.elapsed() > Duration::from_millis(1200),
        "'early' was not streamed before the run ended"
    );
}

#[test]
fn ctrl_c_interrupts_the_run_and_exits_130() {
    let child = runbox()
        .args([
            "run",
            "import time\nprint('started', flush=True)\ntime.sleep(60)",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let mut stdout = child.stdout.take().unwrap();
    assert_eq!(read_line(&mut stdout), "started\n");
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_sandbox_that_cannot_start_exits_125() {
    let o = run(&["--state-dir", "/proc/runbox-cannot-be-here", "print(1)"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("runbox-cannot-be-here"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_state_directory_another_user_could_have_made_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let says_what_to_do = |o: &Output, problem: &str| {
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        for needle in [problem, "--state-dir", "XDG_RUNTIME_DIR", "Remove it"] {
            assert!(err.contains(needle), "no {needle:?} in: {err}");
        }
    };
    // A link planted where the directory should be.
    let real = t.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = run(&["--state-dir", link.to_str().unwrap(), "print(1)"]);
    says_what_to_do(&o, "is a symbolic link");
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0, "used anyway");
    // A directory of ours that others could enter is closed and used.
    let open = t.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = run(&["--state-dir", open.to_str().unwrap(), "print(1)"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o700);
    if !running_as_root() {
        eprintln!("SKIP the other user's directory: making one needs root");
        return;
    }
    // Another user's directory, named as given ...
    let theirs = t.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(4245), Some(4245)).unwrap();
    let o = run(&["--state-dir", theirs.to_str().unwrap(), "print(1)"]);
    says_what_to_do(&o, "belongs to uid 4245");
    // ... and made first at the default of a user without XDG_RUNTIME_DIR.
    use std::os::unix::process::CommandExt;
    let default = std::path::PathBuf::from("/tmp/runbox-4244");
    let _ = std::fs::remove_dir_all(&default);
    std::fs::create_dir(&default).unwrap();
    std::os::unix::fs::chown(&default, Some(4245), Some(4245)).unwrap();
    let o = runbox()
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("RUNBOX_STATE_DIR")
        .uid(4244)
        .gid(4244)
        .args(["run", "print(1)"])
        .output();
    std::fs::remove_dir(&default).unwrap();
    match o {
        Ok(o) => says_what_to_do(&o, "/tmp/runbox-4244 belongs to uid 4245"),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!(
                "SKIP the default directory: uid 4244 cannot run {runbox_exe:?}: {e}",
                runbox_exe = runbox_exe()
            );
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    let o = run(&["-l", "cobol", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("python, javascript"),
        "{}",
        text(&o.stderr)
    );
    for bad in ["0", "-5", "1e9", "soon"] {
        let o = run(&[&format!("--timeout={bad}"), "1"]);
        assert_eq!(o.status.code(), Some(2), "--timeout {bad}");
        assert!(text(&o.stderr).contains("--timeout"), "{}", text(&o.stderr));
    }
}

#[test]
fn nothing_outlives_runbox_run() {
    let tag = canary("cli");
    let o = run(&[
        "-l",
        "bash",
        &format!("(trap '' TERM HUP; exec -a {tag} sleep 1000 &) ; echo left-behind"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
}

#[test]
fn doctor_reports_every_layer_and_passes() {
    let o = runbox().arg("doctor").output().unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    for layer in [
        "seccomp",
        "landlock",
        "cgroups",
        "pause",
        "python",
        "node",
        "bash",
        "namespaces",
        "capabilities",
        "no_new_privs",
        "rlimits",
        "limits in force",
        "seen from inside",
        "python kernel",
        "javascript kernel",
    ] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().nth(1).is_some() && l.contains(layer)),
            "doctor said nothing about {layer}:\n{out}"
        );
    }
    assert!(
        out.contains("result: sandboxes can run with every required layer"),
        "{out}"
    );
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn doctor_fails_with_the_reason_when_sandboxes_cannot_run() {
    let o = runbox()
        .args(["doctor", "--state-dir", "/proc/runbox-cannot-be-here"])
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL"), "{out}");
    assert!(out.contains("sandboxes cannot run"), "{out}");
    assert!(out.contains("runbox-cannot-be-here"), "{out}");
}

#[test]
fn doctor_says_which_limits_hold_without_cgroups() {
    // A cgroup parent that cannot be (a file's child): no cgroups, whoever runs this.
    let without = ["doctor", "--cgroup-parent", "/cgroup.procs/runbox"];
    let o = runbox()
        .env_remove("RUNBOX_NO_CGROUPS")
        .args(without)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("FAIL") && l.contains("cgroups"))
        .unwrap_or_else(|| panic!("no FAIL line for cgroups:\n{out}"));
    assert!(line.contains("--no-cgroups"), "{line}");
    // The operator's choice: sandboxes run, and doctor says what holds and what does not.
    let o = runbox().args(without).arg("--no-cgroups").output().unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    let line = out
        .lines()
        .find(|l| l.contains("limits in force"))
        .unwrap_or_else(|| panic!("no limits line:\n{out}"));
    for needle in [
        "warn",
        "memory 1024 MiB per process (RLIMIT_DATA",
        "256 processes per sandbox (RLIMIT_NPROC)",
        "CPU not limited",
    ] {
        assert!(line.contains(needle), "no {needle:?} in: {line}");
    }
}

/// `runbox serve` with `args` and the variables `vars`, expected to refuse its settings: its
/// exit status and what it said.
fn serve_refused(args: &[&str], vars: &[(&str, &str)]) -> String {
    let mut c = runbox();
    c.arg("serve").args(args).stdin(Stdio::null());
    for v in [
        "RUNBOX_POOL",
        "RUNBOX_STDIO",
        "RUNBOX_HTTP",
        "RUNBOX_CONFIG",
    ] {
        c.env_remove(v);
    }
    c.envs(vars.iter().copied());
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    text(&o.stderr)
}

#[test]
fn serve_takes_a_flag_over_its_variable_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("runbox.toml");
    // Every pool here is too big, so the server says which one it got and starts nothing.
    std::fs::write(&file, "stdio = true\npool = 100\n").unwrap();
    let f = file.to_str().unwrap();
    let said = serve_refused(&["--config", f], &[]);
    assert!(said.contains("pool must be at most 64, got 100"), "{said}");
    let said = serve_refused(&["--config", f], &[("RUNBOX_POOL", "65")]);
    assert!(said.contains("got 65"), "{said}");
    let said = serve_refused(&["--config", f, "--pool", "66"], &[("RUNBOX_POOL", "65")]);
    assert!(said.contains("got 66"), "{said}");
    // The file named by its variable; a key it should not have is named, with the file.
    std::fs::write(&file, "stdio = true\nmax_sandboxs = 5\n").unwrap();
    let said = serve_refused(&[], &[("RUNBOX_CONFIG", f)]);
    assert!(
        said.contains("max_sandboxs")
            && said.contains("did you mean max_sandboxes")
            && said.contains(f),
        "{said}"
    );
}
