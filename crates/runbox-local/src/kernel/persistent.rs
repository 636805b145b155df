//! A persistent interpreter (Python or Node.js) inside a sandbox, and runbox's side of the
//! driver protocol described in `kernels/python_kernel.py`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use runbox_core::{
    ExecContext, ExecError, ExecOutcome, ExecRequest, Language, Limits, OutputStream, RichResult,
};
use runbox_jail::{ExitStatus, Jail, SpawnRequest};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Action, RunOutput, Watchdog, dev_null, drain_now, pipe, random_hex};
use crate::output::MarkerScanner;
use tokio::net::unix::pipe as tokio_pipe;

/// Largest control line a kernel may send (a result with a large image fits; a runaway
/// write to the control socket does not exhaust the server).
const MAX_LINE: usize = 64 << 20;

/// How long to wait for the end markers once a kernel reported a run done.
const MARKER_WAIT: Duration = Duration::from_secs(2);

/// Why a kernel could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KernelError {
    /// The init could not start the process.
    #[error("could not start the {language} kernel: {source}")]
    Spawn {
        language: Language,
        source: runbox_jail::JailError,
    },
    /// The process started but the driver did not come up.
    #[error("could not start the {language} kernel: {message}")]
    Start { language: Language, message: String },
}

/// Reads newline-terminated lines, cancel-safely, refusing lines over [`MAX_LINE`].
struct LineReader {
    half: OwnedReadHalf,
    buf: Vec<u8>,
}

impl LineReader {
    async fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(i + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(Some(line));
            }
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "control line too long",
                ));
            }
            let mut chunk = [0u8; 65536];
            let n = self.half.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum FromKernel {
    Ready {
        version: String,
    },
    Display {
        data: BTreeMap<String, serde_json::Value>,
    },
    Done {
        result: Option<BTreeMap<String, serde_json::Value>>,
        error: Option<ExecError>,
        markers: bool,
    },
    Fatal {
        message: String,
    },
}

/// A running interpreter.
pub(crate) struct Kernel {
    language: Language,
    pid: i32,
    exit: oneshot::Receiver<ExitStatus>,
    exited: Option<Option<ExitStatus>>,
    ctrl_r: LineReader,
    ctrl_w: OwnedWriteHalf,
    stdout: tokio_pipe::Receiver,
    stderr: tokio_pipe::Receiver,
    version: String,
    /// The sandbox's OOM kill count when the last run ended, to tell a kernel the memory
    /// limit killed between runs from one killed otherwise.
    oom_after_run: Option<u64>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("language", &self.language)
            .field("pid", &self.pid)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The result of a run, and whether the kernel survived it.
pub(crate) struct RunReport {
    pub(crate) outcome: ExecOutcome,
    pub(crate) kernel_alive: bool,
}

impl Kernel {
    /// Starts `argv` in the sandbox and waits for the driver's `ready`.
    pub(crate) async fn start(
        jail: &Jail,
        language: Language,
        argv: Vec<String>,
        env: Vec<String>,
        timeout: Duration,
    ) -> Result<Self, KernelError> {
        let fail = |message: String| KernelError::Start { language, message };
        let io_fail = |e: io::Error| KernelError::Start {
            language,
            message: e.to_string(),
        };
        let (host, kernel_end) = std::os::unix::net::UnixStream::pair().map_err(io_fail)?;
        host.set_nonblocking(true).map_err(io_fail)?;
        let host = UnixStream::from_std(host).map_err(io_fail)?;
        let out = pipe().map_err(io_fail)?;
        let err = pipe().map_err(io_fail)?;
        let null = dev_null().map_err(io_fail)?;
        let kernel_end: OwnedFd = kernel_end.into();
        let spawned = jail
            .spawn(
                SpawnRequest {
                    argv,
                    env,
                    cwd: "/workspace".into(),
                },
                &[
                    null.as_fd(),
                    out.writer.as_fd(),
                    err.writer.as_fd(),
                    kernel_end.as_fd(),
                ],
            )
            .await
            .map_err(|source| KernelError::Spawn { language, source })?;
        drop((null, out.writer, err.writer, kernel_end));
        let (r, w) = host.into_split();
        let mut kernel = Kernel {
            language,
            pid: spawned.pid,
            exit: spawned.exit,
            exited: None,
            ctrl_r: LineReader {
                half: r,
                buf: Vec::new(),
            },
            ctrl_w: w,
            stdout: out.reader,
            stderr: err.reader,
            version: String::new(),
            oom_after_run: jail.usage().oom_kills,
        };
        match tokio::time::timeout(timeout, kernel.wait_ready()).await {
            Ok(Ok(version)) => {
                kernel.version = version;
                Ok(kernel)
            }
            Ok(Err(message)) => Err(fail(message)),
            Err(_) => {
                let _ = jail.signal(kernel.pid, libc::SIGKILL, true).await;
                Err(fail(format!("it did not start within {timeout:?}")))
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<String, String> {
        let mut stderr = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            tokio::select! {
                line = self.ctrl_r.next_line() => {
                    return match line {
                        Ok(Some(l)) => match serde_json::from_slice::<FromKernel>(&l) {
                            Ok(FromKernel::Ready { version }) => Ok(version),
                            other => Err(format!("unexpected first message {other:?}")),
                        },
                        _ => {
                            // Died before saying anything: its stderr says why.
                            let _ = tokio::time::timeout(Duration::from_millis(500), self.stderr.read_to_end(&mut stderr)).await;
                            Err(format!("it exited at start-up: {}", String::from_utf8_lossy(&stderr).trim()))
                        }
                    };
                }
                n = self.stderr.read(&mut buf) => {
                    if let Ok(n) = n && stderr.len() < 16384 {
                        stderr.extend_from_slice(&buf[..n]);
                    }
                }
            }
        }
    }

    /// The interpreter's version, as the driver reported it.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// Whether the process is still running.
    pub(crate) fn is_alive(&mut self) -> bool {
        if self.exited.is_none() {
            match self.exit.try_recv() {
                Ok(status) => self.exited = Some(Some(status)),
                Err(oneshot::error::TryRecvError::Closed) => self.exited = Some(None),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
        }
        self.exited.is_none()
    }

    /// Whether the kernel died since its last run (killed, out of memory, exited from a
    /// thread of its own): `Some(why)`, checked before a run so that the run itself can
    /// say the state is gone. Its end of the control socket closing tells at once, before
    /// the init has reaped it and reported its exit.
    pub(crate) async fn lost_since_last_run(&mut self, jail: &Jail) -> Option<String> {
        if self.is_alive() && !self.control_closed() {
            return None;
        }
        let oom =
            matches!((self.oom_after_run, jail.usage().oom_kills), (Some(a), Some(b)) if b > a);
        Some(if oom {
            "ran out of memory (the sandbox's memory limit was reached) and was killed".to_owned()
        } else {
            self.wait_exit_reason().await
        })
    }

    /// Whether the kernel's end of the control socket is closed (every process holding it
    /// has ended). Peeks without consuming or waiting; a kernel that wrote something
    /// between runs is alive.
    fn control_closed(&self) -> bool {
        use nix::sys::socket::{MsgFlags, recv};
        let fd = self.ctrl_r.half.as_ref().as_fd();
        let mut byte = [0u8; 1];
        loop {
            return match recv(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => true,
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) | Err(_) => false,
            };
        }
    }

    /// After the control channel closed: how the process ended, if it says so soon.
    async fn wait_exit_reason(&mut self) -> String {
        if self.exited.is_none()
            && let Ok(status) = tokio::time::timeout(Duration::from_secs(1), &mut self.exit).await
        {
            self.exited = Some(status.ok());
        }
        match self.exited {
            Some(Some(status)) => describe_exit(status),
            _ => "closed its control channel".into(),
        }
    }

    /// Kills the kernel's whole process group.
    pub(crate) async fn kill(&mut self, jail: &Jail) {
        let _ = jail.signal(self.pid, libc::SIGKILL, true).await;
    }

    /// Runs one piece of code.
    pub(crate) async fn run(
        &mut self,
        jail: &Jail,
        req: &ExecRequest,
        ctx: &ExecContext,
        limits: &Limits,
        grace: Duration,
    ) -> RunReport {
        let started = Instant::now();
        let marker = format!("RBX{}", random_hex());
        let env: Vec<u8> = req
            .env
            .iter()
            .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
            .collect();
        let mut request = format!("run {marker} {} {}\n", req.code.len(), env.len()).into_bytes();
        request.extend_from_slice(req.code.as_bytes());
        request.extend_from_slice(&env);

        let mut out = RunOutput::new(limits.output_bytes, ctx.output.clone());
        let mut out_scan = MarkerScanner::new(marker.as_bytes());
        let mut err_scan = MarkerScanner::new(marker.as_bytes());
        let mut watchdog = Watchdog::new(req.timeout, grace, ctx.cancel.clone());
        let mut results = runbox_core::capture::Results::new();
        let mut error = None;
        let mut done = false;
        let mut died: Option<String> = None;
        let mut marker_deadline: Option<Instant> = None;
        let oom_before = jail.usage().oom_kills;

        if self.ctrl_w.write_all(&request).await.is_err() {
            died = Some("closed its control channel".into());
        }
        let mut obuf = vec![0u8; 65536];
        let mut ebuf = vec![0u8; 65536];
        while died.is_none() && !(done && out_scan.found() && err_scan.found()) {
            tokio::select! {
                line = self.ctrl_r.next_line() => match line {
                    Ok(Some(l)) => match serde_json::from_slice::<FromKernel>(&l) {
                        Ok(FromKernel::Display { data }) => results.push(RichResult { data, is_main_result: false }),
                        Ok(FromKernel::Done { result, error: e, markers }) => {
                            done = true;
                            error = e;
                            if let Some(data) = result {
                                results.push(RichResult { data, is_main_result: true });
                            }
                            if !markers {
                                out_scan = MarkerScanner::new(b"");
                                err_scan = MarkerScanner::new(b"");
                            }
                            marker_deadline = Some(Instant::now() + MARKER_WAIT);
                        }
                        Ok(FromKernel::Fatal { message }) => died = Some(format!("failed: {message}")),
                        Ok(FromKernel::Ready { .. }) | Err(_) => {
                            died = Some("sent an unreadable control message".into());
                        }
                    },
                    Ok(None) | Err(_) => died = Some(self.wait_exit_reason().await),
                },
                n = self.stdout.read(&mut obuf), if !out_scan.found() => match n {
                    Ok(0) | Err(_) => out_scan = MarkerScanner::new(b""),
                    Ok(n) => out.push(OutputStream::Stdout, &out_scan.feed(&obuf[..n])),
                },
                n = self.stderr.read(&mut ebuf), if !err_scan.found() => match n {
                    Ok(0) | Err(_) => err_scan = MarkerScanner::new(b""),
                    Ok(n) => out.push(OutputStream::Stderr, &err_scan.feed(&ebuf[..n])),
                },
                status = &mut self.exit, if self.exited.is_none() => {
                    self.exited = Some(status.as_ref().ok().copied());
                    died = Some(match status {
                        Ok(s) => describe_exit(s),
                        Err(_) => "ended with its sandbox".into(),
                    });
                }
                action = watchdog.next(), if !done && !watchdog.done() => match action {
                    Action::Interrupt => { let _ = jail.signal(self.pid, libc::SIGINT, false).await; }
                    Action::Kill => {
                        self.kill(jail).await;
                        died = Some(String::new());
                    }
                },
                () = sleep_until_opt(marker_deadline) => {
                    out_scan = MarkerScanner::new(b"");
                    err_scan = MarkerScanner::new(b"");
                }
            }
        }
        if died.is_some() {
            // Whatever it wrote before dying is already in the pipes.
            drain_now(&self.stdout, |b| {
                out.push(OutputStream::Stdout, &out_scan.feed(b))
            });
            drain_now(&self.stderr, |b| {
                out.push(OutputStream::Stderr, &err_scan.feed(b))
            });
        }
        out.push(OutputStream::Stdout, &out_scan.flush());
        out.push(OutputStream::Stderr, &err_scan.flush());
        let (stdout, stderr, truncated) = out.finish();

        let (results, dropped) = results.finish();
        let mut outcome = ExecOutcome {
            stdout,
            stderr,
            results,
            error,
            duration: started.elapsed(),
            truncated,
            ..Default::default()
        };
        outcome.notes.extend(dropped);
        let cause = watchdog.cause();
        watchdog.record(&mut outcome, "was interrupted");
        let kernel_alive = died.is_none();
        self.oom_after_run = jail.usage().oom_kills;
        if let Some(reason) = died {
            let oom = matches!((oom_before, jail.usage().oom_kills), (Some(a), Some(b)) if b > a);
            let lang = self.language;
            let why = if oom {
                "ran out of memory (the sandbox's memory limit was reached) and was killed"
                    .to_owned()
            } else if cause.is_some() && reason.is_empty() {
                format!(
                    "did not stop within {} s of being interrupted and was killed",
                    grace.as_secs_f64()
                )
            } else {
                reason
            };
            outcome.kernel_restarted = true;
            outcome.notes.push(format!(
                "The {lang} kernel was lost (it {why}). A fresh kernel starts on the next run; variables, \
                 imports and definitions from earlier runs are gone."
            ));
            if outcome.error.is_none() {
                outcome.error = Some(ExecError {
                    name: if oom {
                        "MemoryError".into()
                    } else {
                        "KernelDied".into()
                    },
                    value: format!("the {lang} kernel {why}"),
                    traceback: String::new(),
                });
            }
        }
        RunReport {
            outcome,
            kernel_alive,
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn describe_exit(s: ExitStatus) -> String {
    match (s.code, s.signal) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "exited".into(),
    }
}
