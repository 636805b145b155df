//! Running code in a sandbox: persistent kernels for Python and JavaScript, a fresh shell per
//! run for bash, and what they share (pipes, live output, the run's watchdog).
//!
//! Every run ends on one of three paths: the code finishes; its timeout passes (or the
//! caller cancels) and it is interrupted, keeping the kernel and its state; or it does not
//! stop within the grace period and its process group is killed (a kernel is then started
//! afresh on the next run, and the outcome says state was lost).

pub(crate) mod bash;
mod persistent;

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use runbox_core::{ExecOutcome, OutputChunk, OutputSink, OutputStream};
use tokio::net::unix::pipe;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use persistent::{Kernel, KernelError};

use crate::output::Capture;

/// Turns a failed spawn into the error a caller can act on: the process limit, a sandbox
/// that is gone, or an infrastructure failure.
pub(crate) fn spawn_failed(e: runbox_jail::JailError, what: &str, pids: u32) -> runbox_core::Error {
    use runbox_core::Error;
    match e {
        _ if e.errno() == Some(libc::EAGAIN) => Error::LimitReached(format!(
            "the sandbox's limit of {pids} processes is reached, so {what} cannot start; \
             end some of its processes or close the sandbox"
        )),
        runbox_jail::JailError::Ended => {
            Error::sandbox(format!("the sandbox ended before {what} could start"))
        }
        e => Error::sandbox_caused_by(format!("could not start {what}"), e),
    }
}

/// The read end (kept by runbox, non-blocking) and write end (given to a sandbox process)
/// of a pipe.
pub(crate) struct Pipe {
    pub(crate) reader: pipe::Receiver,
    pub(crate) writer: OwnedFd,
}

pub(crate) fn pipe() -> io::Result<Pipe> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok(Pipe {
        reader: pipe::Receiver::from_owned_fd(r)?,
        writer: w,
    })
}

pub(crate) fn dev_null() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

/// 128 random bits as hex.
pub(crate) fn random_hex() -> String {
    let mut b = [0u8; 16];
    // The kernel's random source does not fail once the system is up; a zero marker would
    // still work (it only has to be unlikely in the output, and the run is ours).
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Drains what is already in a pipe, without waiting for more.
///
/// Reads the descriptor directly: tokio's `try_read` answers from its cached readiness and
/// would miss bytes the reactor has not been told about yet, which is exactly the case
/// right after the writer exited.
pub(crate) fn drain_now(reader: &pipe::Receiver, mut f: impl FnMut(&[u8])) {
    use std::os::fd::AsFd;
    let mut buf = [0u8; 65536];
    loop {
        match nix::unistd::read(reader.as_fd(), &mut buf) {
            Ok(0) => return,
            Ok(n) => f(&buf[..n]),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// A run's two output streams: capped captures plus live streaming.
pub(crate) struct RunOutput {
    stdout: Capture,
    stderr: Capture,
    sink: Option<OutputSink>,
}

impl RunOutput {
    pub(crate) fn new(limit: usize, sink: Option<OutputSink>) -> Self {
        Self {
            stdout: Capture::new(limit),
            stderr: Capture::new(limit),
            sink,
        }
    }

    pub(crate) fn push(&mut self, stream: OutputStream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let capture = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        let live = capture.push(bytes);
        if let (Some(sink), Some(text)) = (&self.sink, live) {
            sink(OutputChunk { stream, text });
        }
    }

    /// `(stdout, stderr, truncated)`.
    pub(crate) fn finish(mut self) -> (String, String, bool) {
        for (stream, capture) in [
            (OutputStream::Stdout, &mut self.stdout),
            (OutputStream::Stderr, &mut self.stderr),
        ] {
            if let (Some(sink), Some(text)) = (&self.sink, capture.flush_live()) {
                sink(OutputChunk { stream, text });
            }
        }
        let (out, t1) = self.stdout.finish();
        let (err, t2) = self.stderr.finish();
        (out, err, t1 || t2)
    }
}

/// Why a run was stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    Timeout,
    Cancelled,
}

/// What the watchdog wants done now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Ask the code to stop (SIGINT to a kernel, SIGTERM to a shell).
    Interrupt,
    /// Kill its process group.
    Kill,
}

/// A run's deadline: interrupt when the timeout passes or the caller cancels, kill if the
/// code has not stopped a grace period later.
pub(crate) struct Watchdog {
    timeout: Duration,
    deadline: Instant,
    grace: Duration,
    kill_at: Option<Instant>,
    killed: bool,
    cause: Option<StopCause>,
    cancel: CancellationToken,
}

impl Watchdog {
    pub(crate) fn new(timeout: Duration, grace: Duration, cancel: CancellationToken) -> Self {
        Self {
            timeout,
            deadline: Instant::now() + timeout,
            grace,
            kill_at: None,
            killed: false,
            cause: None,
            cancel,
        }
    }

    /// Why the run was stopped, if it was.
    pub(crate) fn cause(&self) -> Option<StopCause> {
        self.cause
    }

    /// Marks `outcome` timed out or cancelled, with a note ending in `consequence` (what
    /// was done about it), when the watchdog stopped the run.
    pub(crate) fn record(&self, outcome: &mut ExecOutcome, consequence: &str) {
        match self.cause {
            Some(StopCause::Timeout) => {
                outcome.timed_out = true;
                outcome.notes.push(format!(
                    "The run exceeded its timeout of {} s and {consequence}.",
                    self.timeout.as_secs_f64()
                ));
            }
            Some(StopCause::Cancelled) => {
                outcome.cancelled = true;
                outcome
                    .notes
                    .push(format!("The run was cancelled and {consequence}."));
            }
            None => {}
        }
    }

    /// Whether the watchdog has nothing left to do.
    pub(crate) fn done(&self) -> bool {
        self.killed
    }

    /// Waits for the next thing to do. Cancel-safe: use it in `select!`.
    pub(crate) async fn next(&mut self) -> Action {
        match self.kill_at {
            None => {
                tokio::select! {
                    () = tokio::time::sleep_until(self.deadline) => self.cause = Some(StopCause::Timeout),
                    () = self.cancel.cancelled() => self.cause = Some(StopCause::Cancelled),
                }
                self.kill_at = Some(Instant::now() + self.grace);
                Action::Interrupt
            }
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.killed = true;
                Action::Kill
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn watchdog_interrupts_then_kills() {
        let mut w = Watchdog::new(
            Duration::from_secs(5),
            Duration::from_secs(2),
            CancellationToken::new(),
        );
        let t0 = Instant::now();
        assert_eq!(w.next().await, Action::Interrupt);
        assert_eq!(w.cause(), Some(StopCause::Timeout));
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        assert_eq!(w.next().await, Action::Kill);
        assert_eq!(t0.elapsed(), Duration::from_secs(7));
        assert!(w.done());
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_interrupts_at_once() {
        let cancel = CancellationToken::new();
        let mut w = Watchdog::new(
            Duration::from_secs(60),
            Duration::from_secs(2),
            cancel.clone(),
        );
        cancel.cancel();
        let t0 = Instant::now();
        assert_eq!(w.next().await, Action::Interrupt);
        assert_eq!(w.cause(), Some(StopCause::Cancelled));
        assert!(t0.elapsed() < Duration::from_millis(1));
    }
}
