//! A persistent interpreter (Python or Node.js) inside a sandbox, and runbox's side of the
//! driver protocol described in `kernels/python_kernel.py`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use runbox_core::capture::Results;
use runbox_core::{
    ExecContext, ExecError, ExecOutcome, ExecRequest, Language, Limits, OutputStream, RichResult,
};
use runbox_jail::{ExitStatus, Jail, SpawnRequest};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Action, RunOutput, Watchdog, dev_null, drain_now, pipe, random_hex};
use crate::output::MarkerScanner;
use tokio::net::unix::pipe as tokio_pipe;

/// How much longer than the room left for a run's results a control line may be: enough
/// for a `done` with a long traceback and no result once the results are full.
const LINE_OVERHEAD: usize = 1 << 20;
/// How much longer than its representations a result bundle may be as sent (MIME types,
/// quotes, escapes) before it is refused unparsed.
const RESULT_FRAMING: usize = 64 << 10;

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

/// A control line.
#[derive(Debug)]
enum Line {
    /// Whole, without its newline.
    Whole(Vec<u8>),
    /// Longer than the reader's cap: read and thrown away as it came, never held.
    TooLong(Skipped),
}

/// What is kept of a line too long to hold: its length, and its first and last bytes,
/// which tell what kind of message it was.
#[derive(Debug, Default)]
struct Skipped {
    len: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Skipped {
    const HEAD: usize = 64;
    const TAIL: usize = 32;

    fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        let take = Self::HEAD.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..take]);
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(Self::TAIL)..]);
        let excess = self.tail.len().saturating_sub(Self::TAIL);
        self.tail.drain(..excess);
    }

    /// Whether it is a driver's `done` (the drivers write `type` first).
    fn is_done(&self) -> bool {
        self.head.starts_with(br#"{"type":"done""#)
    }

    /// Whether it says the end markers were written (the drivers write `markers` last).
    fn markers(&self) -> bool {
        !self.tail.ends_with(br#""markers":false}"#)
    }
}

/// Reads newline-terminated lines, cancel-safely, looking at each byte once. A line past
/// the cap given to [`LineReader::next_line`] is not held: its bytes are thrown away as
/// they arrive, so whatever a sandbox writes to its control socket costs the server at
/// most the cap in memory.
struct LineReader {
    half: OwnedReadHalf,
    buf: Vec<u8>,
    /// Bytes at the start of `buf` known to hold no newline.
    scanned: usize,
    /// The line being thrown away, once it outgrew the cap.
    skipping: Option<Skipped>,
}

impl LineReader {
    fn new(half: OwnedReadHalf) -> Self {
        Self {
            half,
            buf: Vec::new(),
            scanned: 0,
            skipping: None,
        }
    }

    async fn next_line(&mut self, cap: usize) -> io::Result<Option<Line>> {
        let mut chunk = [0u8; 65536];
        loop {
            if self.skipping.is_none() {
                if let Some(i) = memchr::memchr(b'\n', &self.buf[self.scanned..]) {
                    let end = self.scanned + i;
                    let rest = self.buf[end + 1..].to_vec();
                    let mut line = std::mem::replace(&mut self.buf, rest);
                    line.truncate(end);
                    self.scanned = 0;
                    return Ok(Some(Line::Whole(line)));
                }
                self.scanned = self.buf.len();
                if self.buf.len() > cap {
                    let mut skipped = Skipped::default();
                    skipped.push(&self.buf);
                    self.buf = Vec::new();
                    self.scanned = 0;
                    self.skipping = Some(skipped);
                }
            }
            let n = self.half.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            let data = &chunk[..n];
            if let Some(skipped) = self.skipping.as_mut() {
                match memchr::memchr(b'\n', data) {
                    Some(i) => {
                        skipped.push(&data[..i]);
                        self.buf.extend_from_slice(&data[i + 1..]);
                        return Ok(self.skipping.take().map(Line::TooLong));
                    }
                    None => {
                        skipped.push(data);
                        continue;
                    }
                }
            }
            // Grown by doubling, never past what the cap can need.
            let need = self.buf.len() + n;
            if need > self.buf.capacity() {
                let target = (self.buf.capacity() * 2)
                    .min(cap.saturating_add(chunk.len()))
                    .max(need);
                self.buf.reserve_exact(target - self.buf.len());
            }
            self.buf.extend_from_slice(data);
        }
    }
}

/// A control message as sent; result bundles stay raw until their size is known.
#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ExecError>,
    #[serde(default)]
    markers: Option<bool>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Adds a result bundle, sent as `raw`, to `results`: measured before it is parsed, its
/// text parsed only when it can be kept and its structured representations only within
/// their own budget.
fn add_result(results: &mut Results, raw: &RawValue, is_main_result: bool) {
    let text = raw.get();
    if text.len() > results.room().saturating_add(RESULT_FRAMING) {
        results.drop_unread(text.len());
        return;
    }
    let Ok(bundle) = serde_json::from_str::<BTreeMap<String, &RawValue>>(text) else {
        results.drop_unread(text.len());
        return;
    };
    let mut data = BTreeMap::new();
    let mut size = 0;
    for (mime, raw) in bundle {
        let text = raw.get();
        let value = if text.starts_with('"') {
            serde_json::from_str::<String>(text).map(serde_json::Value::String)
        } else if results.take_structured(&mime, text.len()) {
            serde_json::from_str::<serde_json::Value>(text)
        } else {
            continue;
        };
        let Ok(value) = value else { continue };
        size += mime.len() + runbox_core::capture::value_size(&value);
        data.insert(mime, value);
    }
    if data.is_empty() {
        // Every representation was left out (and said so) or unreadable.
        return;
    }
    results.push_sized(
        RichResult {
            data,
            is_main_result,
        },
        size,
    );
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
            ctrl_r: LineReader::new(r),
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
                line = self.ctrl_r.next_line(LINE_OVERHEAD) => {
                    return match line {
                        Ok(Some(Line::Whole(l))) => match serde_json::from_slice::<Message<'_>>(&l) {
                            Ok(Message { kind, version: Some(version), .. }) if kind == "ready" => Ok(version),
                            _ => Err(format!(
                                "unexpected first message {:?}",
                                String::from_utf8_lossy(&l[..l.len().min(200)])
                            )),
                        },
                        Ok(Some(Line::TooLong(_))) => Err("its first message was too long".into()),
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
        let mut results = Results::new();
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
                line = self.ctrl_r.next_line(results.room().saturating_add(LINE_OVERHEAD)) => match line {
                    Ok(Some(Line::Whole(l))) => match serde_json::from_slice::<Message<'_>>(&l) {
                        Ok(m) if m.kind == "display" => {
                            if let Some(raw) = m.data {
                                add_result(&mut results, raw, false);
                            }
                        }
                        Ok(m) if m.kind == "done" => {
                            if let Some(raw) = m.result {
                                add_result(&mut results, raw, true);
                            }
                            error = m.error;
                            finished(m.markers.unwrap_or(true), &mut done, &mut marker_deadline, &mut out_scan, &mut err_scan);
                        }
                        Ok(m) if m.kind == "fatal" => {
                            died = Some(format!("failed: {}", m.message.unwrap_or_default()));
                        }
                        Ok(_) | Err(_) => {
                            died = Some("sent an unreadable control message".into());
                        }
                    },
                    Ok(Some(Line::TooLong(skipped))) => {
                        // Too long for any result to be kept: thrown away unread, and said.
                        results.drop_unread(skipped.len);
                        if skipped.is_done() {
                            finished(skipped.markers(), &mut done, &mut marker_deadline, &mut out_scan, &mut err_scan);
                        }
                    }
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

/// A run's `done` arrived: the end markers are awaited for a little while, if they were
/// written at all.
fn finished(
    markers: bool,
    done: &mut bool,
    marker_deadline: &mut Option<Instant>,
    out_scan: &mut MarkerScanner,
    err_scan: &mut MarkerScanner,
) {
    *done = true;
    if !markers {
        *out_scan = MarkerScanner::new(b"");
        *err_scan = MarkerScanner::new(b"");
    }
    *marker_deadline = Some(Instant::now() + MARKER_WAIT);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> (LineReader, OwnedWriteHalf, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = a.into_split();
        (LineReader::new(r), w, b)
    }

    #[tokio::test]
    async fn lines_past_the_cap_are_thrown_away_and_measured() {
        let (mut lines, _own, mut w) = reader();
        let writer = tokio::spawn(async move {
            w.write_all(b"{\"type\":\"display\"}\n{\"type\":\"done\",\"x\":\"")
                .await
                .unwrap();
            w.write_all(&vec![b'A'; 300_000]).await.unwrap();
            w.write_all(b"\",\"markers\":false}\nnext\n").await.unwrap();
            w.write_all(b"partial").await.unwrap();
        });
        let Some(Line::Whole(l)) = lines.next_line(1000).await.unwrap() else {
            panic!()
        };
        assert_eq!(l, b"{\"type\":\"display\"}");
        let Some(Line::TooLong(s)) = lines.next_line(1000).await.unwrap() else {
            panic!()
        };
        assert_eq!(s.len, 300_000 + 38);
        assert!(s.is_done());
        assert!(!s.markers());
        assert!(lines.buf.capacity() < 70_000, "{}", lines.buf.capacity());
        let Some(Line::Whole(l)) = lines.next_line(1000).await.unwrap() else {
            panic!()
        };
        assert_eq!(l, b"next");
        writer.await.unwrap();
        // The writer is gone: a line without its newline is not a line.
        assert!(lines.next_line(1000).await.unwrap().is_none());
    }

    #[test]
    fn results_are_measured_before_they_are_parsed() {
        let mut results = Results::new();
        let big = format!(
            "{{\"text/plain\":\"{}\"}}",
            "x".repeat(runbox_core::capture::MAX_RESULT_BYTES + RESULT_FRAMING)
        );
        let raw: &RawValue = serde_json::from_str(&big).unwrap();
        add_result(&mut results, raw, false);
        let structured = format!(
            "{{\"text/plain\":\"[...]\",\"application/json\":[{}0]}}",
            "0,".repeat(runbox_core::capture::MAX_STRUCTURED_BYTES)
        );
        let raw: &RawValue = serde_json::from_str(&structured).unwrap();
        add_result(&mut results, raw, true);
        let (kept, note) = results.finish();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].text(), Some("[...]"));
        assert!(!kept[0].data.contains_key("application/json"));
        let note = note.unwrap();
        assert!(note.starts_with("1 rich result was"), "{note}");
        assert!(note.contains("application/json"), "{note}");
    }
}
