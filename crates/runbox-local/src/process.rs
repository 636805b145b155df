//! Background processes of a local sandbox: a command started with `bash -c` that runs on
//! after the call, its output collected by a task of the server into a capped buffer that
//! `read` empties.
//!
//! The buffer keeps the newest [`MAX_PENDING`] bytes of unread output. Once it is full, the
//! task reads at a throttled pace ([`FULL_READ_INTERVAL`]), dropping the oldest bytes, until
//! someone reads: a process that floods its output with nobody reading blocks on its full
//! pipe most of the time, and costs the server almost nothing.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use runbox_core::{
    BackgroundActivity, CommandRequest, Error, ProcessId, ProcessInfo, ProcessOutput,
};
use runbox_jail::Jail;
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::kernel::bash::command_spawn;
use crate::kernel::{dev_null, pipe, spawn_failed};

/// Unread output kept per process (both streams together); beyond it the oldest goes.
pub(crate) const MAX_PENDING: usize = 1 << 20;
/// With [`MAX_PENDING`] bytes unread, a process's pipes are read once per interval (at most
/// 64 KiB each time, so about 6 MiB a second), not as fast as it writes.
const FULL_READ_INTERVAL: Duration = Duration::from_millis(10);
/// Background processes running at once in one sandbox.
pub(crate) const MAX_RUNNING: usize = 16;
/// Ended processes remembered for a last read; the oldest are forgotten beyond it.
const MAX_ENDED: usize = 32;

#[derive(Debug, Default)]
struct Pending {
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    dropped: u64,
    exit_code: Option<i32>,
    /// When the process ended and every writer of its pipes (children it left behind
    /// included) had closed them: until then it keeps its sandbox from being idle.
    ended_at: Option<tokio::time::Instant>,
}

impl Pending {
    fn is_full(&self) -> bool {
        self.stdout.len() + self.stderr.len() >= MAX_PENDING
    }

    /// Appends `bytes`; beyond the cap the oldest go, each byte moved once.
    fn push(&mut self, stderr: bool, bytes: &[u8]) {
        if stderr {
            self.stderr.extend(bytes);
        } else {
            self.stdout.extend(bytes);
        }
        let total = self.stdout.len() + self.stderr.len();
        if total > MAX_PENDING {
            // Drop the oldest bytes of the bigger stream: it is the one flooding.
            let excess = total - MAX_PENDING;
            let buf = if self.stdout.len() >= self.stderr.len() {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            let cut = excess.min(buf.len());
            buf.drain(..cut);
            self.dropped += cut as u64;
        }
    }
}

/// The text of `buf`, emptied; a UTF-8 sequence cut at the end stays for the next read
/// unless `all`.
fn take_text(buf: &mut VecDeque<u8>, all: bool) -> String {
    let bytes = buf.make_contiguous();
    let keep = if all {
        0
    } else {
        match std::str::from_utf8(bytes) {
            Err(e) if e.error_len().is_none() => bytes.len() - e.valid_up_to(),
            _ => 0,
        }
    };
    let taken = bytes.len() - keep;
    let text = String::from_utf8_lossy(&bytes[..taken]).into_owned();
    buf.drain(..taken);
    text
}

#[derive(Debug)]
struct Background {
    command: String,
    started_at: SystemTime,
    /// Its pid inside the sandbox (its process group, too).
    pid: i32,
    pending: Mutex<Pending>,
    /// Woken when output arrives or the process ends.
    changed: Notify,
    /// Told when a read emptied the buffer, so that the collector reads at full pace again.
    drained: Arc<Notify>,
    collector: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn info(&self, id: &ProcessId) -> ProcessInfo {
        ProcessInfo {
            id: id.clone(),
            command: self.command.clone(),
            started_at: self.started_at,
            exit_code: self.pending().exit_code,
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(h) = self
            .collector
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            h.abort();
        }
    }
}

/// The background processes of one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Processes {
    next: AtomicU64,
    all: Mutex<BTreeMap<u64, (ProcessId, Arc<Background>)>>,
}

impl Processes {
    fn all(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (ProcessId, Arc<Background>)>> {
        self.all.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, id: &ProcessId) -> Result<Arc<Background>, Error> {
        self.all()
            .values()
            .find(|(pid, _)| pid == id)
            .map(|(_, b)| Arc::clone(b))
            .ok_or_else(|| Error::ProcessNotFound { id: id.to_string() })
    }

    /// Every process, oldest first.
    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        self.all().values().map(|(id, b)| b.info(id)).collect()
    }

    /// Whether one of the processes runs, or when the last one ended.
    pub(crate) fn activity(&self) -> BackgroundActivity {
        let all = self.all();
        let mut last = None;
        for (_, b) in all.values() {
            let p = b.pending();
            if p.ended_at.is_none() {
                return BackgroundActivity::Running;
            }
            last = last.max(p.ended_at);
        }
        BackgroundActivity::Ended(last)
    }

    /// Starts `req.command` with `bash -c` in the background.
    pub(crate) async fn start(
        &self,
        jail: &Jail,
        bash: &str,
        base_env: &[String],
        req: &CommandRequest,
        pids_limit: u32,
    ) -> Result<ProcessInfo, Error> {
        let spawn = command_spawn(bash, base_env, req)?;
        let cwd = spawn.cwd.clone();
        {
            let all = self.all();
            let running = all
                .values()
                .filter(|(_, b)| b.pending().exit_code.is_none())
                .count();
            if running >= MAX_RUNNING {
                return Err(Error::LimitReached(format!(
                    "{running} background processes are running, the most one sandbox may have; \
                     kill one with kill_process first"
                )));
            }
        }
        let io_err = |e: std::io::Error| Error::sandbox_caused_by("could not set up a process", e);
        let out = pipe().map_err(io_err)?;
        let err = pipe().map_err(io_err)?;
        let null = dev_null().map_err(io_err)?;
        let fds = [null.as_fd(), out.writer.as_fd(), err.writer.as_fd()];
        let spawned = match jail.spawn(spawn, &fds).await {
            Ok(s) => s,
            Err(e)
                if e.errno()
                    .is_some_and(|e| e == libc::ENOENT || e == libc::ENOTDIR) =>
            {
                return Err(Error::InvalidRequest(format!(
                    "cwd {cwd} does not exist in the sandbox"
                )));
            }
            Err(e) => return Err(spawn_failed(e, "a background process", pids_limit)),
        };
        drop((null, out.writer, err.writer));

        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id = ProcessId::nth(n);
        let bg = Arc::new(Background {
            command: req.command.clone(),
            started_at: SystemTime::now(),
            pid: spawned.pid,
            pending: Mutex::default(),
            changed: Notify::new(),
            drained: Arc::new(Notify::new()),
            collector: Mutex::new(None),
        });
        let weak = Arc::downgrade(&bg);
        let drained = Arc::clone(&bg.drained);
        let (mut stdout, mut stderr, mut exit) = (out.reader, err.reader, spawned.exit);
        let collector = tokio::spawn(async move {
            let (mut obuf, mut ebuf) = (vec![0u8; 65536], vec![0u8; 65536]);
            let (mut out_open, mut err_open, mut running) = (true, true, true);
            let mut last_read = tokio::time::Instant::now();
            // Until the process has ended and every writer of its pipes (children it left
            // behind included) has closed them.
            while running || out_open || err_open {
                let Some(full) = weak.upgrade().map(|bg| bg.pending().is_full()) else {
                    return;
                };
                let resume_at = last_read + FULL_READ_INTERVAL;
                let paced = full && tokio::time::Instant::now() < resume_at;
                let event = tokio::select! {
                    status = &mut exit, if running => {
                        running = false;
                        Some((None, Some(status.map_or(-1, |s| s.shell_code()))))
                    }
                    () = tokio::time::sleep_until(resume_at), if paced => None,
                    () = drained.notified(), if paced => None,
                    n = stdout.read(&mut obuf), if out_open && !paced => match n {
                        Ok(n) if n > 0 => Some((Some((false, &obuf[..n])), None)),
                        _ => { out_open = false; None }
                    },
                    n = stderr.read(&mut ebuf), if err_open && !paced => match n {
                        Ok(n) if n > 0 => Some((Some((true, &ebuf[..n])), None)),
                        _ => { err_open = false; None }
                    },
                };
                if matches!(event, Some((Some(_), _))) {
                    last_read = tokio::time::Instant::now();
                }
                let Some(bg) = weak.upgrade() else { return };
                if let Some((output, code)) = event {
                    let mut p = bg.pending();
                    if let Some((is_err, bytes)) = output {
                        p.push(is_err, bytes);
                    }
                    if code.is_some() {
                        p.exit_code = code;
                    }
                }
                bg.changed.notify_waiters();
            }
            if let Some(bg) = weak.upgrade() {
                bg.pending().ended_at = Some(tokio::time::Instant::now());
            }
        });
        *bg.collector.lock().unwrap_or_else(PoisonError::into_inner) = Some(collector);
        let info = bg.info(&id);
        let mut all = self.all();
        all.insert(n, (id, bg));
        // Forget the oldest ended processes beyond the cap.
        let ended: Vec<u64> = all
            .iter()
            .filter(|(_, (_, b))| b.pending().exit_code.is_some())
            .map(|(k, _)| *k)
            .collect();
        for k in ended.iter().take(ended.len().saturating_sub(MAX_ENDED)) {
            all.remove(k);
        }
        Ok(info)
    }

    /// Output not read before, waiting up to `wait` for some or for the end.
    pub(crate) async fn read(
        &self,
        id: &ProcessId,
        wait: Duration,
    ) -> Result<ProcessOutput, Error> {
        let bg = self.get(id)?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = bg.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut p = bg.pending();
                let ended = p.exit_code.is_some();
                let now = tokio::time::Instant::now();
                if ended || !p.stdout.is_empty() || !p.stderr.is_empty() || now >= deadline {
                    let out = ProcessOutput {
                        info: ProcessInfo {
                            id: id.clone(),
                            command: bg.command.clone(),
                            started_at: bg.started_at,
                            exit_code: p.exit_code,
                        },
                        stdout: take_text(&mut p.stdout, ended),
                        stderr: take_text(&mut p.stderr, ended),
                        dropped_bytes: std::mem::take(&mut p.dropped),
                    };
                    bg.drained.notify_one();
                    return Ok(out);
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// Kills a process and its process group; returns once it has ended.
    pub(crate) async fn kill(&self, jail: &Jail, id: &ProcessId) -> Result<ProcessInfo, Error> {
        let bg = self.get(id)?;
        if bg.pending().exit_code.is_none() {
            let _ = jail.signal(bg.pid, libc::SIGKILL, true).await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let notified = bg.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if bg.pending().exit_code.is_some() {
                    break;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Err(Error::sandbox(format!(
                        "process {id} did not end within 5 s of SIGKILL"
                    )));
                }
            }
        }
        Ok(bg.info(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_output_keeps_the_newest_within_the_cap() {
        let mut p = Pending::default();
        p.push(false, &vec![b'a'; MAX_PENDING]);
        p.push(false, b"tail");
        assert_eq!(p.stdout.len(), MAX_PENDING);
        assert!(p.is_full());
        assert!(p.stdout.make_contiguous().ends_with(b"atail"));
        assert_eq!(p.dropped, 4);
        p.push(true, b"err");
        assert_eq!(p.stdout.len() + p.stderr.len(), MAX_PENDING);
        assert_eq!(p.stderr, b"err");
    }

    #[test]
    fn a_character_cut_at_the_end_waits_for_the_next_read() {
        let mut buf: VecDeque<u8> = "héllo €".bytes().collect();
        buf.truncate(buf.len() - 1);
        assert_eq!(take_text(&mut buf, false), "héllo ");
        assert_eq!(buf.len(), 2);
        buf.push_back(0xac);
        assert_eq!(take_text(&mut buf, false), "€");
        assert!(buf.is_empty());
        let mut buf = VecDeque::from([b'a', 0xe2]);
        assert_eq!(take_text(&mut buf, true), "a\u{fffd}");
    }
}
