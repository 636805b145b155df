//! Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663): `run_code`,
//! `run_command` and `install_packages` become task-augmented calls for clients that
//! declare the extension, so a run longer than a client waits for an answer (many stop at
//! 60 s) is polled to its result instead.
//!
//! Such a call starts the run at once and waits [`TaskSettings::inline_wait`] for it (30 s by
//! default: well inside the 60 s many clients wait, and long enough that a client which
//! declares the extension but does not poll, as MCP Inspector's CLI does, still gets
//! ordinary runs answered as usual): a run that ends by
//! then is answered as usual (the extension's immediate-result shortcut); a longer one is
//! answered with a task (`resultType: "task"`, its `taskId`), which `tasks/get` reports as
//! `working` and then `completed` with the tool's result inlined (`isError` results too),
//! `failed` with a protocol error, or `cancelled`. `tasks/cancel` interrupts the run, as
//! cancelling a request would. Clients that do not declare the extension always get the
//! plain answer.
//!
//! Each task belongs to the tenant that started it: another tenant's `tasks/get` or
//! `tasks/cancel` gets exactly the "unknown task" of an id that never existed. The runs are
//! the registry's like any other (its run quotas apply), and the tasks themselves are
//! bounded: at most [`TaskSettings::max_per_tenant`] per tenant and
//! [`TaskSettings::max_tasks`] in all, running or finished. A finished task is kept for
//! [`TaskSettings::result_ttl`] after it ends, and never less than the `ttlMs` it was
//! created with (its run's timeout plus that time), then forgotten: a sweeper drops it even
//! when no one asks again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::render;

/// The tools a client that declares the extension may get a task for.
pub(crate) const TASK_TOOLS: [&str; 3] = ["run_code", "run_command", "install_packages"];

/// How often clients are asked to poll `tasks/get`, in milliseconds.
const POLL_INTERVAL_MS: u64 = 1_000;

/// Limits on tasks.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    /// Most tasks one tenant may hold at once, running or finished and not yet forgotten.
    pub max_per_tenant: usize,
    /// Most tasks held at once, all tenants together.
    pub max_tasks: usize,
    /// How long a finished task's result is kept after it ends.
    pub result_ttl: Duration,
    /// How long a task-augmented call waits for its run before answering with a task.
    pub inline_wait: Duration,
}

impl Default for TaskSettings {
    fn default() -> Self {
        Self {
            max_per_tenant: 32,
            max_tasks: 1024,
            result_ttl: Duration::from_secs(300),
            inline_wait: Duration::from_secs(30),
        }
    }
}

struct Entry {
    tenant: String,
    task: Task,
    created: Instant,
    /// Never forgotten before `created + ttl` (the `ttlMs` announced).
    ttl: Duration,
    finished: Option<Instant>,
    /// The terminal state, once the run has ended.
    payload: Option<TaskPayload>,
    cancel: CancellationToken,
}

impl Entry {
    fn detailed(&self) -> DetailedTask {
        DetailedTask::new(
            self.task.clone(),
            self.payload.clone().unwrap_or(TaskPayload::Working),
        )
    }

    fn forgettable(&self, now: Instant, result_ttl: Duration) -> bool {
        self.finished
            .is_some_and(|f| now >= (self.created + self.ttl).max(f + result_ttl))
    }
}

/// Every task of the server.
pub(crate) struct Tasks {
    settings: TaskSettings,
    entries: Mutex<HashMap<String, Entry>>,
    sweeper: OnceLock<()>,
}

/// A task just started.
pub(crate) struct Started {
    /// Its seed state, for the `CreateTaskResult`.
    pub(crate) task: Task,
    /// The run's own answer, as the tool gave it.
    pub(crate) result: oneshot::Receiver<Result<CallToolResponse, ErrorData>>,
    /// Cancels the run.
    pub(crate) cancel: CancellationToken,
}

fn unknown(id: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("unknown task: {id} (tasks are forgotten some time after they end)"),
        Some(serde_json::json!({ "taskId": id })),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_text() -> String {
    render::rfc3339(SystemTime::now())
}

fn object<T: serde::Serialize>(value: &T) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

/// A random task id.
fn task_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness: the clock still makes it unique, and a task is only ever
        // reached by its tenant anyway.
        let n = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = n.to_le_bytes();
    }
    let mut s = String::with_capacity(37);
    s.push_str("task_");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

impl Tasks {
    pub(crate) fn new(settings: TaskSettings) -> Arc<Self> {
        Arc::new(Self {
            settings,
            entries: Mutex::default(),
            sweeper: OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the finished tasks whose time is up.
    fn sweep(&self) {
        let now = Instant::now();
        let ttl = self.settings.result_ttl;
        self.lock().retain(|_, e| !e.forgettable(now, ttl));
    }

    /// Starts `run` as a task of `tenant` whose run may take up to `timeout`, or says
    /// which limit refuses it. `run` gets the task's cancellation.
    pub(crate) fn start<F>(
        self: &Arc<Self>,
        tenant: &str,
        timeout: Duration,
        run: impl FnOnce(CancellationToken) -> F,
    ) -> Result<Started, String>
    where
        F: Future<Output = Result<CallToolResponse, ErrorData>> + Send + 'static,
    {
        self.start_sweeper();
        self.sweep();
        let id = task_id();
        let cancel = CancellationToken::new();
        let ttl = timeout + self.settings.result_ttl;
        let now = now_text();
        let mut task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
            .with_ttl_ms(millis(ttl))
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        task.status_message = Some("running".into());
        {
            let mut entries = self.lock();
            let held = entries.values().filter(|e| e.tenant == tenant).count();
            if held >= self.settings.max_per_tenant {
                return Err(format!(
                    "you hold {held} tasks, the most one tenant may hold at once ({}); wait for \
                     one to end (tasks/get), cancel one (tasks/cancel), or try again once \
                     finished ones are forgotten ({} s after they end)",
                    self.settings.max_per_tenant,
                    self.settings.result_ttl.as_secs()
                ));
            }
            if entries.len() >= self.settings.max_tasks {
                return Err(format!(
                    "this server holds its maximum of {} tasks, all tenants together; try again \
                     in a little while",
                    self.settings.max_tasks
                ));
            }
            entries.insert(
                id.clone(),
                Entry {
                    tenant: tenant.to_owned(),
                    task: task.clone(),
                    created: Instant::now(),
                    ttl,
                    finished: None,
                    payload: None,
                    cancel: cancel.clone(),
                },
            );
        }
        let (tx, rx) = oneshot::channel();
        let future = run(cancel.clone());
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let result = future.await;
            if let Some(me) = me.upgrade() {
                me.settle(&id, &result);
            }
            let _ = tx.send(result);
        });
        Ok(Started {
            task,
            result: rx,
            cancel,
        })
    }

    /// Records how a task's run ended.
    fn settle(&self, id: &str, result: &Result<CallToolResponse, ErrorData>) {
        let mut entries = self.lock();
        let Some(e) = entries.get_mut(id) else {
            return;
        };
        let payload = if e.cancel.is_cancelled() {
            TaskPayload::Cancelled
        } else {
            match result {
                Ok(CallToolResponse::Complete(r)) => TaskPayload::Completed { result: object(r) },
                Ok(_) => TaskPayload::Failed {
                    error: object(&ErrorData::internal_error(
                        "the tool answered with something other than a result",
                        None,
                    )),
                },
                Err(error) => TaskPayload::Failed {
                    error: object(error),
                },
            }
        };
        let now = Instant::now();
        e.finished = Some(now);
        // Kept for result_ttl from now, and no less than announced.
        e.ttl = e.ttl.max(now - e.created + self.settings.result_ttl);
        e.task.ttl_ms = Some(millis(e.ttl));
        e.task.status = payload.status();
        e.task.status_message = None;
        e.task.last_updated_at = now_text();
        e.payload = Some(payload);
    }

    /// Drops a task whose result was answered directly (the immediate-result shortcut).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// `tasks/get`.
    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<DetailedTask, ErrorData> {
        self.sweep();
        match self.lock().get(id) {
            Some(e) if e.tenant == tenant => Ok(e.detailed()),
            _ => Err(unknown(id)),
        }
    }

    /// `tasks/cancel`: interrupts the run; a finished task stays as it ended.
    pub(crate) fn cancel(&self, tenant: &str, id: &str) -> Result<(), ErrorData> {
        self.sweep();
        match self.lock().get_mut(id) {
            Some(e) if e.tenant == tenant => {
                if e.payload.is_none() {
                    e.cancel.cancel();
                    e.task.status_message = Some("cancelling".into());
                    e.task.last_updated_at = now_text();
                }
                Ok(())
            }
            _ => Err(unknown(id)),
        }
    }

    /// `tasks/update`: runbox's tasks never ask for input, so there is nothing to deliver;
    /// acknowledged for the owner's tasks.
    pub(crate) fn update(&self, tenant: &str, id: &str) -> Result<(), ErrorData> {
        self.sweep();
        match self.lock().get(id) {
            Some(e) if e.tenant == tenant => Ok(()),
            _ => Err(unknown(id)),
        }
    }

    /// Tasks held now, running or finished.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().len()
    }

    /// Sweeps regularly while the tasks exist, so finished ones are forgotten even when no
    /// one calls again.
    fn start_sweeper(self: &Arc<Self>) {
        self.sweeper.get_or_init(|| {
            let every = (self.settings.result_ttl / 4)
                .clamp(Duration::from_millis(100), Duration::from_secs(15));
            tokio::spawn(sweep_loop(Arc::downgrade(self), every));
        });
    }
}

async fn sweep_loop(tasks: Weak<Tasks>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match tasks.upgrade() {
            Some(t) => t.sweep(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock};

    fn ok(text: &str) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(text.to_owned())]).into())
    }

    fn settings(per_tenant: usize, total: usize) -> TaskSettings {
        TaskSettings {
            max_per_tenant: per_tenant,
            max_tasks: total,
            result_ttl: Duration::from_secs(10),
            inline_wait: Duration::from_secs(1),
        }
    }

    async fn settled(tasks: &Tasks, tenant: &str, id: &str) -> DetailedTask {
        loop {
            let t = tasks.get(tenant, id).unwrap();
            if t.status().is_terminal() {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn results_are_kept_for_their_ttl_then_forgotten_without_a_caller() {
        let tasks = Tasks::new(settings(4, 8));
        let started = tasks
            .start("alice", Duration::from_secs(5), |_| async { ok("done") })
            .unwrap();
        let id = started.task.task_id.clone();
        assert_eq!(started.task.ttl_ms, Some(15_000), "timeout plus result ttl");
        let t = settled(&tasks, "alice", &id).await;
        assert_eq!(t.status(), TaskStatus::Completed);
        let TaskPayload::Completed { result } = &t.payload else {
            panic!("{t:?}")
        };
        assert_eq!(result["content"][0]["text"], "done");
        // Kept for the ttl announced at creation, although it ended at once.
        tokio::time::sleep(Duration::from_secs(14)).await;
        assert!(tasks.get("alice", &id).is_ok());
        // Then the sweeper forgets it, with no one asking.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(tasks.held(), 0);
        assert!(tasks.get("alice", &id).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_longer_than_its_ttl_is_kept_until_result_ttl_after_it_ends() {
        let tasks = Tasks::new(settings(4, 8));
        let started = tasks
            .start("alice", Duration::from_secs(1), |_| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                ok("late")
            })
            .unwrap();
        let id = started.task.task_id.clone();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            tasks.get("alice", &id).unwrap().status(),
            TaskStatus::Working,
            "a running task is never forgotten"
        );
        settled(&tasks, "alice", &id).await;
        tokio::time::sleep(Duration::from_secs(9)).await;
        let t = tasks.get("alice", &id).unwrap();
        assert!(t.task.ttl_ms.unwrap() >= 40_000, "{t:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(tasks.get("alice", &id).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_are_the_tenants_own_and_bounded() {
        let tasks = Tasks::new(settings(2, 3));
        let forever = |cancel: CancellationToken| async move {
            cancel.cancelled().await;
            ok("stopped")
        };
        let a1 = tasks
            .start("alice", Duration::from_secs(60), forever)
            .unwrap();
        tasks
            .start("alice", Duration::from_secs(60), forever)
            .unwrap();
        let refused = tasks
            .start("alice", Duration::from_secs(60), forever)
            .err()
            .unwrap();
        assert!(refused.contains("most one tenant may hold"), "{refused}");
        tasks
            .start("bob", Duration::from_secs(60), forever)
            .unwrap();
        let refused = tasks
            .start("carol", Duration::from_secs(60), forever)
            .err()
            .unwrap();
        assert!(refused.contains("all tenants together"), "{refused}");

        let id = a1.task.task_id.clone();
        // Another tenant cannot see, cancel or update it: the error of an unknown id.
        let theirs = tasks.get("bob", &id).unwrap_err();
        let none = tasks.get("bob", "task_nope").unwrap_err();
        assert_eq!(theirs.code, none.code);
        assert_eq!(theirs.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(tasks.cancel("bob", &id).is_err());
        assert!(tasks.update("bob", &id).is_err());
        assert_eq!(
            tasks.get("alice", &id).unwrap().status(),
            TaskStatus::Working
        );
        // The owner's cancel interrupts the run: the task ends cancelled.
        tasks.cancel("alice", &id).unwrap();
        assert!(a1.cancel.is_cancelled());
        assert_eq!(
            settled(&tasks, "alice", &id).await.status(),
            TaskStatus::Cancelled
        );
        // Cancelling a finished task is acknowledged and changes nothing.
        tasks.cancel("alice", &id).unwrap();
        assert_eq!(
            tasks.get("alice", &id).unwrap().status(),
            TaskStatus::Cancelled
        );
    }

    #[tokio::test(start_paused = true)]
    async fn protocol_errors_fail_the_task() {
        let tasks = Tasks::new(settings(2, 2));
        let started = tasks
            .start("alice", Duration::from_secs(1), |_| async {
                Err(ErrorData::invalid_params("bad arguments", None))
            })
            .unwrap();
        let t = settled(&tasks, "alice", &started.task.task_id).await;
        let TaskPayload::Failed { error } = &t.payload else {
            panic!("{t:?}")
        };
        assert_eq!(error["message"], "bad arguments");
        assert!(started.result.await.unwrap().is_err());
    }
}
