//! Bash runs: a fresh `bash -c CODE` per run, keeping the working directory and exported
//! variables between runs (see `kernels/bash_prelude.sh`).

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::Duration;

use runbox_core::{
    CommandRequest, Error, ExecContext, ExecOutcome, ExecRequest, Limits, OutputStream,
};
use runbox_jail::{ExitStatus, Jail, SpawnRequest};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::{Action, RunOutput, Watchdog, dev_null, drain_now, pipe, spawn_failed};
use crate::layout::BASH_PRELUDE;

/// Largest bash code accepted: one `argv` string may not exceed 128 KiB on Linux.
pub(crate) const MAX_CODE: usize = 128 * 1024 - 1;

/// Largest state a run may save (directory plus exported variables).
const MAX_STATE: usize = 1 << 20;

/// Variables bash maintains itself, never carried from one run to the next.
const SHELL_OWNED: [&str; 6] = ["PWD", "OLDPWD", "SHLVL", "_", "BASH_ENV", "RUNBOX_CWD"];

/// What persists between bash runs of a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct BashState {
    /// Exported variables, as of the end of the last run.
    pub(crate) env: BTreeMap<String, String>,
    /// Working directory, as of the end of the last run.
    pub(crate) cwd: String,
}

impl BashState {
    pub(crate) fn new(env: BTreeMap<String, String>) -> Self {
        Self {
            env,
            cwd: "/workspace".into(),
        }
    }

    /// Takes the state a run saved (`dir\0KEY=VALUE\0...`); a run that saved nothing (killed,
    /// or its code replaced the exit trap) leaves the state as it was. Variables passed for
    /// that run only and left unchanged are not kept.
    fn absorb(&mut self, saved: &[u8], per_run: &BTreeMap<String, String>) {
        let mut parts = saved.split(|&b| b == 0).filter(|p| !p.is_empty());
        let Some(cwd) = parts.next() else { return };
        let mut env = BTreeMap::new();
        for part in parts {
            let text = String::from_utf8_lossy(part);
            if let Some((k, v)) = text.split_once('=')
                && !SHELL_OWNED.contains(&k)
                && per_run.get(k).is_none_or(|pv| pv != v)
            {
                env.insert(k.to_owned(), v.to_owned());
            }
        }
        self.cwd = String::from_utf8_lossy(cwd).into_owned();
        self.env = env;
    }
}

fn check_shell_text(what: &str, text: &str) -> Result<(), Error> {
    if text.len() > MAX_CODE {
        return Err(Error::InvalidRequest(format!(
            "the {what} is {} bytes, over the {MAX_CODE}-byte limit of one command line; write it to a \
             file in /workspace and run `bash file.sh`",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(Error::InvalidRequest(format!(
            "the {what} must not contain NUL bytes"
        )));
    }
    Ok(())
}

/// Runs `req.code` with bash at `bash` in the sandbox, carrying `state` over from the last
/// run and saving it for the next.
pub(crate) async fn run(
    jail: &Jail,
    bash: &str,
    state: &mut BashState,
    req: &ExecRequest,
    ctx: &ExecContext,
    limits: &Limits,
    grace: Duration,
) -> Result<ExecOutcome, Error> {
    check_shell_text("bash code", &req.code)?;
    let mut env = state.env.clone();
    env.extend(req.env.clone());
    env.insert("BASH_ENV".into(), BASH_PRELUDE.into());
    env.insert("RUNBOX_CWD".into(), state.cwd.clone());
    let spawn = SpawnRequest {
        argv: shell_argv(bash, &req.code),
        env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        cwd: "/workspace".into(),
    };
    let (outcome, saved) = run_shell(jail, spawn, true, req.timeout, ctx, limits, grace).await?;
    if !outcome.timed_out && !outcome.cancelled {
        state.absorb(&saved, &req.env);
    }
    Ok(outcome)
}

/// Runs a command line in a fresh shell with the sandbox's environment `base_env` plus the
/// request's, in the request's directory.
pub(crate) async fn command(
    jail: &Jail,
    bash: &str,
    base_env: &[String],
    req: &CommandRequest,
    ctx: &ExecContext,
    limits: &Limits,
    grace: Duration,
) -> Result<ExecOutcome, Error> {
    let spawn = command_spawn(bash, base_env, req)?;
    let cwd = spawn.cwd.clone();
    match run_shell(jail, spawn, false, req.timeout, ctx, limits, grace).await {
        Err(Error::Sandbox {
            source: Some(source),
            ..
        }) if source
            .downcast_ref::<runbox_jail::JailError>()
            .and_then(runbox_jail::JailError::errno)
            .is_some_and(|e| e == libc::ENOENT || e == libc::ENOTDIR) =>
        {
            Err(Error::InvalidRequest(format!(
                "cwd {cwd} does not exist in the sandbox"
            )))
        }
        other => other.map(|(outcome, _)| outcome),
    }
}

/// How to start `req.command` with `bash -c` in its directory (absolute, default
/// /workspace), with `base_env` plus the request's variables.
pub(crate) fn command_spawn(
    bash: &str,
    base_env: &[String],
    req: &CommandRequest,
) -> Result<SpawnRequest, Error> {
    check_shell_text("command", &req.command)?;
    let cwd = req.cwd.clone().unwrap_or_else(|| "/workspace".into());
    if !cwd.starts_with('/') {
        return Err(Error::InvalidRequest(format!(
            "cwd {cwd:?} must be an absolute path inside the sandbox, such as /workspace/project"
        )));
    }
    let mut env: Vec<String> = base_env.to_vec();
    env.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
    Ok(SpawnRequest {
        argv: shell_argv(bash, &req.command),
        env,
        cwd,
    })
}

fn shell_argv(bash: &str, text: &str) -> Vec<String> {
    vec![
        bash.to_owned(),
        "--noprofile".into(),
        "--norc".into(),
        "-c".into(),
        text.to_owned(),
        "bash".into(),
    ]
}

/// Starts a shell and follows it to its end: output captured and streamed, the watchdog
/// armed, and, with `with_state`, a pipe on fd 3 whose contents are returned.
pub(crate) async fn run_shell(
    jail: &Jail,
    spawn: SpawnRequest,
    with_state: bool,
    timeout: Duration,
    ctx: &ExecContext,
    limits: &Limits,
    grace: Duration,
) -> Result<(ExecOutcome, Vec<u8>), Error> {
    let started = Instant::now();
    let io_err = |e: std::io::Error| Error::sandbox_caused_by("could not set up a shell", e);
    let out = pipe().map_err(io_err)?;
    let err = pipe().map_err(io_err)?;
    let saved = pipe().map_err(io_err)?;
    let null = dev_null().map_err(io_err)?;
    let mut fds = vec![null.as_fd(), out.writer.as_fd(), err.writer.as_fd()];
    if with_state {
        fds.push(saved.writer.as_fd());
    }
    let spawned = jail
        .spawn(spawn, &fds)
        .await
        .map_err(|e| spawn_failed(e, "bash", limits.pids))?;
    drop(fds);
    drop((null, out.writer, err.writer, saved.writer));

    let (mut stdout, mut stderr, mut state_pipe) = (out.reader, err.reader, saved.reader);
    let mut exit = spawned.exit;
    let mut output = RunOutput::new(limits.output_bytes, ctx.output.clone());
    let mut saved_state = Vec::new();
    let mut watchdog = Watchdog::new(timeout, grace, ctx.cancel.clone());
    let (mut out_open, mut err_open, mut state_open) = (true, true, with_state);
    let mut obuf = vec![0u8; 65536];
    let mut ebuf = vec![0u8; 65536];
    let mut sbuf = vec![0u8; 65536];
    let status: Option<ExitStatus> = loop {
        tokio::select! {
            status = &mut exit => break status.ok(),
            n = stdout.read(&mut obuf), if out_open => match n {
                Ok(n) if n > 0 => output.push(OutputStream::Stdout, &obuf[..n]),
                _ => out_open = false,
            },
            n = stderr.read(&mut ebuf), if err_open => match n {
                Ok(n) if n > 0 => output.push(OutputStream::Stderr, &ebuf[..n]),
                _ => err_open = false,
            },
            n = state_pipe.read(&mut sbuf), if state_open => match n {
                Ok(n) if n > 0 && saved_state.len() + n <= MAX_STATE => saved_state.extend_from_slice(&sbuf[..n]),
                _ => state_open = false,
            },
            action = watchdog.next(), if !watchdog.done() => {
                let signal = match action { Action::Interrupt => libc::SIGTERM, Action::Kill => libc::SIGKILL };
                let _ = jail.signal(spawned.pid, signal, true).await;
            }
        }
    };
    // What the shell wrote before it exited is in the pipes; later writes belong to processes
    // it left in the background, which the run does not wait for.
    drain_now(&stdout, |b| output.push(OutputStream::Stdout, b));
    drain_now(&stderr, |b| output.push(OutputStream::Stderr, b));
    if with_state {
        drain_now(&state_pipe, |b| {
            if saved_state.len() + b.len() <= MAX_STATE {
                saved_state.extend_from_slice(b);
            }
        });
    }
    let (stdout, stderr, truncated) = output.finish();
    let mut outcome = ExecOutcome {
        stdout,
        stderr,
        exit_code: Some(status.map_or(-1, |s| s.shell_code())),
        duration: started.elapsed(),
        truncated,
        ..Default::default()
    };
    watchdog.record(&mut outcome, "its processes were stopped");
    if status.is_none() {
        outcome
            .notes
            .push("The sandbox ended during the run.".into());
    }
    Ok((outcome, saved_state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_keeps_exports_and_directory_but_not_shell_variables() {
        let mut s = BashState::new(BTreeMap::new());
        let per_run: BTreeMap<String, String> = [("TOKEN".to_owned(), "x".to_owned())].into();
        s.absorb(
            b"/workspace/a\0FOO=bar\0PWD=/x\0SHLVL=1\0TOKEN=x\0MULTI=a\nb\0",
            &per_run,
        );
        assert_eq!(s.cwd, "/workspace/a");
        assert_eq!(s.env.get("FOO").map(String::as_str), Some("bar"));
        assert_eq!(s.env.get("MULTI").map(String::as_str), Some("a\nb"));
        assert!(!s.env.contains_key("PWD"));
        assert!(!s.env.contains_key("SHLVL"));
        assert!(
            !s.env.contains_key("TOKEN"),
            "per-run variable leaked into state"
        );
    }

    #[test]
    fn a_run_that_saved_nothing_keeps_the_old_state() {
        let mut s = BashState::new([("A".to_owned(), "1".to_owned())].into());
        s.absorb(b"", &BTreeMap::new());
        assert_eq!(s.cwd, "/workspace");
        assert_eq!(s.env.get("A").map(String::as_str), Some("1"));
    }
}
