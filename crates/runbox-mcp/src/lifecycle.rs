//! Tools for what a sandbox does over time: background processes (their output and
//! their end), pause and resume, and the idle timeout.

use crate::caller::Caller;
use rmcp::handler::server::tool::Extension;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use runbox_core::{Error, ProcessId, SandboxId, SandboxView};

use crate::render;
use crate::server::{RunboxServer, seconds};
use crate::types::{
    KillProcessOutput, LifecycleOutput, ProcessArgs, ProcessOutputOut, ReadProcessArgs,
    SandboxArgs, SetTimeoutArgs,
};

/// The longest `read_process_output` waits.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Output of background processes read but not yet sent: what did not fit in one answer
/// (see `budget`), sent first by the next read.
#[derive(Debug, Default)]
pub(crate) struct Backlogs {
    map: Mutex<HashMap<(String, SandboxId, ProcessId), Backlog>>,
}

#[derive(Debug, Default)]
struct Backlog {
    stdout: String,
    stderr: String,
}

/// Most processes with a backlog kept at once (each at most the 1 MiB a process keeps
/// unread); a backlog never read again goes first.
const MAX_BACKLOGS: usize = 64;

impl Backlogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, SandboxId, ProcessId), Backlog>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, key: &(String, SandboxId, ProcessId)) -> Option<Backlog> {
        self.lock().remove(key)
    }

    fn keep(&self, key: (String, SandboxId, ProcessId), backlog: Backlog) {
        let mut map = self.lock();
        if map.len() >= MAX_BACKLOGS
            && let Some(old) = map.keys().next().cloned()
        {
            map.remove(&old);
        }
        map.insert(key, backlog);
    }
}

/// Splits `text` where its start takes `room` bytes as JSON; the start, and the rest.
fn split_fitting(mut text: String, room: usize) -> (String, String) {
    let cut = crate::files::fit_json(&text, room).len();
    let rest = text.split_off(cut);
    (text, rest)
}

fn lifecycle(view: &SandboxView) -> LifecycleOutput {
    LifecycleOutput {
        sandbox_id: view.id.to_string(),
        state: render::state_name(view.state).into(),
        expires_at: render::rfc3339(view.expires_at),
        timeout_seconds: view.idle_timeout.as_secs_f64(),
    }
}

#[tool_router(router = lifecycle_tools, vis = "pub(crate)")]
impl RunboxServer {
    #[tool(
        description = "Read what a background process (run_command with background: true) wrote \
                       since the last read, and whether it has ended. wait_seconds (default 0, at \
                       most 60) waits for new output or the end when there is none yet. A read \
                       returns as much as fits in one answer; running stays true until all the \
                       process wrote has been read.",
        output_schema = schema_for_output::<ProcessOutputOut>(),
        annotations(title = "Read a background process's output", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn read_process_output(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ReadProcessArgs>,
    ) -> CallToolResult {
        let wait = match args.wait_seconds {
            None => Duration::ZERO,
            Some(0.0) => Duration::ZERO,
            Some(w) => match seconds(w, "wait_seconds") {
                Ok(w) if w <= MAX_WAIT => w,
                Ok(_) => {
                    return render::error(&Error::InvalidRequest(format!(
                        "wait_seconds {w} exceeds the maximum of {} s; call again to wait longer",
                        MAX_WAIT.as_secs()
                    )));
                }
                Err(e) => return render::error(&e),
            },
        };
        let id = SandboxId::from(args.sandbox_id);
        let process = ProcessId::from(args.process_id);
        let key = (caller.tenant.clone(), id.clone(), process.clone());
        let backlog = self.backlogs().take(&key);
        // Output left from the last read goes first, without waiting for more.
        let wait = if backlog.is_some() {
            Duration::ZERO
        } else {
            wait
        };
        match self
            .registry()
            .read_process(&caller.tenant, &id, &process, wait)
            .await
        {
            Ok(o) => {
                let Backlog {
                    mut stdout,
                    mut stderr,
                } = backlog.unwrap_or_default();
                stdout.push_str(&o.stdout);
                stderr.push_str(&o.stderr);
                // Each stream shows twice (text and structuredContent): as much of them as
                // fits in one answer, stderr first given a share; the rest waits.
                let room = self.read_budget() as usize;
                let (stderr, stderr_rest) = split_fitting(stderr, room / 4);
                let stdout_room = room - crate::files::fit_json(&stderr, usize::MAX).len();
                let (stdout, stdout_rest) = split_fitting(stdout, stdout_room);
                let more = !stdout_rest.is_empty() || !stderr_rest.is_empty();
                if more {
                    self.backlogs().keep(
                        key,
                        Backlog {
                            stdout: stdout_rest,
                            stderr: stderr_rest,
                        },
                    );
                }
                let out = ProcessOutputOut {
                    process_id: o.info.id.to_string(),
                    stdout,
                    stderr,
                    running: o.info.running() || more,
                    exit_code: if more {
                        None
                    } else {
                        o.info.exit_code.map(i64::from)
                    },
                    dropped_bytes: i64::try_from(o.dropped_bytes).unwrap_or(i64::MAX),
                };
                let mut text = String::new();
                render::section(&mut text, "stdout", &out.stdout);
                render::section(&mut text, "stderr", &out.stderr);
                if out.dropped_bytes > 0 {
                    text.push_str(&format!(
                        "[{} older bytes were dropped: more than 1 MiB waited unread]\n",
                        out.dropped_bytes
                    ));
                }
                match out.exit_code {
                    Some(c) => {
                        text.push_str(&format!("[process {} exited with {c}]\n", out.process_id))
                    }
                    None if more => text.push_str(&format!(
                        "[more output of process {} waits: read again for it]\n",
                        out.process_id
                    )),
                    None => text.push_str(&format!("[process {} is running]\n", out.process_id)),
                }
                render::ok(text, &out)
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Kill a background process and everything it started; answers once it has \
                       ended.",
        output_schema = schema_for_output::<KillProcessOutput>(),
        annotations(title = "Kill a background process", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn kill_process(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<ProcessArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        let process = ProcessId::from(args.process_id);
        match self
            .registry()
            .kill_process(&caller.tenant, &id, &process)
            .await
        {
            Ok(info) => {
                let out = KillProcessOutput {
                    process_id: info.id.to_string(),
                    exit_code: info.exit_code.map(i64::from),
                };
                render::ok(
                    format!(
                        "Process {} has ended (exit code {}).",
                        out.process_id,
                        out.exit_code.map_or("unknown".into(), |c| c.to_string())
                    ),
                    &out,
                )
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Pause a sandbox: every process in it is frozen (no CPU used) with its state \
                       intact, and its idle timeout stops counting. Runs are refused until \
                       resume_sandbox; files can still be read. A sandbox left paused past the \
                       server's pause timeout (expires_at) is closed.",
        output_schema = schema_for_output::<LifecycleOutput>(),
        annotations(title = "Pause a sandbox", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn pause_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        match self.registry().pause(&caller.tenant, &id).await {
            Ok(view) => {
                let out = lifecycle(&view);
                render::ok(
                    format!(
                        "Sandbox {id} is paused; resume it with resume_sandbox before {}, when \
                         it is closed.",
                        out.expires_at
                    ),
                    &out,
                )
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Resume a paused sandbox: its processes go on where they stopped, with \
                       variables and files intact.",
        output_schema = schema_for_output::<LifecycleOutput>(),
        annotations(title = "Resume a sandbox", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn resume_sandbox(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        match self.registry().resume(&caller.tenant, &id).await {
            Ok(view) => {
                let out = lifecycle(&view);
                render::ok(
                    format!(
                        "Sandbox {id} is running; it expires at {} if left idle.",
                        out.expires_at
                    ),
                    &out,
                )
            }
            Err(e) => render::error(&e),
        }
    }

    #[tool(
        description = "Change how long a sandbox may stay idle before it is closed, counted from \
                       now (at most the server's maximum).",
        output_schema = schema_for_output::<LifecycleOutput>(),
        annotations(title = "Set a sandbox's timeout", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn set_sandbox_timeout(
        &self,
        Extension(caller): Extension<Caller>,
        Parameters(args): Parameters<SetTimeoutArgs>,
    ) -> CallToolResult {
        let id = SandboxId::from(args.sandbox_id);
        let timeout = match seconds(args.timeout_seconds, "timeout_seconds") {
            Ok(t) => t,
            Err(e) => return render::error(&e),
        };
        match self
            .registry()
            .set_timeout(&caller.tenant, &id, timeout)
            .await
        {
            Ok(view) => {
                let out = lifecycle(&view);
                render::ok(
                    format!(
                        "Sandbox {id} now closes after {} s idle (at {} if left idle from now).",
                        out.timeout_seconds, out.expires_at
                    ),
                    &out,
                )
            }
            Err(e) => render::error(&e),
        }
    }
}
