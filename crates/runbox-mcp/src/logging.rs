//! Logging: the lifecycle events of a tenant's sandboxes (created, expired, kernel restarted,
//! egress refused; [`runbox_core::SandboxEvent`]) as `notifications/message`, to that
//! tenant only.
//!
//! The two revisions differ, and each is served as it says:
//!
//! - **2025-11-25 sessions** opt in with `logging/setLevel`: from then on the session hears
//!   every event of its tenant's sandboxes at or above that level, on the session's own
//!   stream (stdout over stdio, the standalone GET stream over HTTP), whenever it happens.
//!   A session that never set a level hears nothing.
//! - **2026-07-28** removed `logging/setLevel` (answered `-32601` here) and sessions: a
//!   request opts in with `_meta["io.modelcontextprotocol/logLevel"]`, and log messages go
//!   only on the response stream of the request they relate to, never for a request
//!   without that key. A tool call hears the events of the sandbox it names (`sandbox_id`)
//!   while it runs, and of the sandbox its answer names (the one `create_sandbox` made, a
//!   one-shot run's); a call naming a sandbox that expired is told so first.
//!
//! Logging is deprecated by 2026-07-28 (SEP-2577); rmcp marks its API so, hence the
//! `allow(deprecated)` of this module.
#![allow(deprecated)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, ProtocolVersion};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use runbox_core::{EventKind, Registry, SandboxEvent, SandboxId};
use tokio::sync::{broadcast, oneshot};

use crate::render;

/// The logger named in every message.
const LOGGER: &str = "runbox";
/// Expired sandboxes remembered, all tenants together, to tell a later 2026 request
/// naming one of them.
const EXPIRED_KEPT: usize = 1024;
/// Events of other sandboxes a 2026 request keeps while it runs, in case its answer
/// names one of them (a sandbox it created).
const REQUEST_BUFFER: usize = 64;
/// Messages queued for a 2025 session that reads slowly; beyond them the newest are dropped.
const SESSION_QUEUE: usize = 256;

/// How severe a level is, lowest first.
pub(crate) fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// The level an event is logged at.
fn level_of(kind: &EventKind) -> LoggingLevel {
    match kind {
        EventKind::Created => LoggingLevel::Info,
        EventKind::Expired { .. } => LoggingLevel::Notice,
        _ => LoggingLevel::Warning,
    }
}

/// Whether an event is at or above `level`.
fn passes(event: &SandboxEvent, level: LoggingLevel) -> bool {
    severity(level_of(&event.kind)) >= severity(level)
}

/// An event as a log message: its data names the event, the sandbox, when, and says what
/// happened in a sentence.
pub(crate) fn message(event: &SandboxEvent) -> LoggingMessageNotificationParam {
    let mut data = serde_json::json!({
        "event": event.kind.name(),
        "sandbox_id": event.sandbox_id.as_str(),
        "time": render::rfc3339(event.at),
        "message": event.message(),
    });
    if let EventKind::EgressRefused {
        host, port, reason, ..
    } = &event.kind
    {
        data["host"] = serde_json::json!(host);
        data["port"] = serde_json::json!(port);
        data["reason"] = serde_json::json!(reason);
    }
    LoggingMessageNotificationParam::new(level_of(&event.kind), data).with_logger(LOGGER)
}

/// Whether a request speaks 2026-07-28 or later (per-request log levels, no
/// `logging/setLevel`).
pub(crate) fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// A 2025-11-25 session that asked for log messages. Its messages go out in order through
/// a queue of its own, so a slow session never holds up another.
struct SessionLog {
    tenant: String,
    level: LoggingLevel,
    peer: Peer<RoleServer>,
    queue: tokio::sync::mpsc::Sender<LoggingMessageNotificationParam>,
}

/// Who hears which lifecycle event.
pub(crate) struct Logs {
    /// Sessions that set a level, by session key.
    sessions: Mutex<HashMap<u64, SessionLog>>,
    /// Recently expired sandboxes, newest last.
    expired: Mutex<VecDeque<SandboxEvent>>,
}

impl Logs {
    /// The logs of `registry`'s events, and the task that hands each event out (when there
    /// is a runtime to run it; it ends with the registry).
    pub(crate) fn start(registry: &Registry) -> Arc<Self> {
        let logs = Arc::new(Self {
            sessions: Mutex::default(),
            expired: Mutex::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(dispatch(Arc::downgrade(&logs), registry.subscribe_events()));
        }
        logs
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SessionLog>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `logging/setLevel` of a 2025-11-25 session: from now on it hears its tenant's events
    /// at or above `level`.
    pub(crate) fn set_level(
        &self,
        session: u64,
        tenant: String,
        level: LoggingLevel,
        peer: Peer<RoleServer>,
    ) {
        let mut sessions = self.sessions();
        sessions.retain(|_, s| !s.peer.is_transport_closed());
        if let Some(s) = sessions.get_mut(&session) {
            s.tenant = tenant;
            s.level = level;
            return;
        }
        let (queue, mut queued) = tokio::sync::mpsc::channel(SESSION_QUEUE);
        let sender = peer.clone();
        // Ends when the session is dropped from the map (its queue closes) or goes away.
        tokio::spawn(async move {
            while let Some(param) = queued.recv().await {
                if sender.notify_logging_message(param).await.is_err() {
                    return;
                }
            }
        });
        sessions.insert(
            session,
            SessionLog {
                tenant,
                level,
                peer,
                queue,
            },
        );
    }

    /// Sessions listening now (for tests).
    #[cfg(test)]
    fn listening(&self) -> usize {
        self.sessions().len()
    }

    /// Hands `event` to every session of its tenant whose level it reaches.
    fn hand_out(&self, event: &SandboxEvent) {
        if matches!(event.kind, EventKind::Expired { .. }) {
            let mut expired = self.expired.lock().unwrap_or_else(PoisonError::into_inner);
            if expired.len() == EXPIRED_KEPT {
                expired.pop_front();
            }
            expired.push_back(event.clone());
        }
        let mut sessions = self.sessions();
        sessions.retain(|_, s| !s.peer.is_transport_closed());
        for s in sessions.values() {
            if s.tenant == event.tenant && passes(event, s.level) {
                // Never waits on a slow client: a full queue drops the message.
                let _ = s.queue.try_send(message(event));
            }
        }
    }

    /// The expiry of `tenant`'s sandbox `id`, if it expired lately.
    fn expiry_of(&self, tenant: &str, id: &SandboxId) -> Option<SandboxEvent> {
        self.expired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .find(|e| e.tenant == tenant && &e.sandbox_id == id)
            .cloned()
    }

    /// Starts following the events a 2026 tool call relates to, when it asked for log
    /// messages (`_meta` logLevel): those of `named` (its `sandbox_id` argument) go out on
    /// its response stream as they happen; [`RequestLog::finish`] adds those of the sandbox
    /// its answer names. `None` for a request without a log level, or of an older revision
    /// (whose sessions use `logging/setLevel`).
    pub(crate) async fn follow(
        &self,
        registry: &Registry,
        ctx: &RequestContext<RoleServer>,
        tenant: &str,
        named: Option<SandboxId>,
    ) -> Option<RequestLog> {
        if !is_modern(ctx) {
            return None;
        }
        let level = ctx.meta.log_level()?;
        let peer = ctx.peer.clone();
        let rx = registry.subscribe_events();
        if let Some(expired) = named.as_ref().and_then(|id| self.expiry_of(tenant, id))
            && passes(&expired, level)
        {
            let _ = peer.notify_logging_message(message(&expired)).await;
        }
        let (stop, stopped) = oneshot::channel();
        let forwarder = tokio::spawn(forward(
            peer.clone(),
            level,
            tenant.to_owned(),
            named.clone(),
            rx,
            stopped,
        ));
        Some(RequestLog {
            peer,
            level,
            named,
            stop,
            forwarder,
        })
    }
}

/// Hands every event of `registry` out until the registry (or the logs) is gone.
async fn dispatch(logs: std::sync::Weak<Logs>, mut events: broadcast::Receiver<SandboxEvent>) {
    loop {
        match events.recv().await {
            Ok(event) => match logs.upgrade() {
                Some(logs) => logs.hand_out(&event),
                None => return,
            },
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!("{n} sandbox events were not logged to clients: too many at once");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// The events of one 2026 tool call in progress.
pub(crate) struct RequestLog {
    peer: Peer<RoleServer>,
    level: LoggingLevel,
    named: Option<SandboxId>,
    stop: oneshot::Sender<()>,
    forwarder: tokio::task::JoinHandle<Vec<SandboxEvent>>,
}

impl RequestLog {
    /// Ends the following once the call is done, before its answer goes out: what happened
    /// to the named sandbox meanwhile is sent, and so are the events of `answered` (the
    /// sandbox the answer names) held back while the call ran.
    pub(crate) async fn finish(self, answered: Option<SandboxId>) {
        let _ = self.stop.send(());
        let held = self.forwarder.await.unwrap_or_default();
        let Some(answered) = answered.filter(|a| Some(a) != self.named.as_ref()) else {
            return;
        };
        for event in held.iter().filter(|e| e.sandbox_id == answered) {
            if passes(event, self.level) {
                let _ = self.peer.notify_logging_message(message(event)).await;
            }
        }
    }
}

/// Sends the events of `named` as they come; holds back the tenant's others (up to
/// [`REQUEST_BUFFER`]) and returns them when told to stop, after the events already
/// published.
async fn forward(
    peer: Peer<RoleServer>,
    level: LoggingLevel,
    tenant: String,
    named: Option<SandboxId>,
    mut rx: broadcast::Receiver<SandboxEvent>,
    mut stopped: oneshot::Receiver<()>,
) -> Vec<SandboxEvent> {
    let mut held = Vec::new();
    loop {
        let event = tokio::select! {
            // The end first, so a flood of events cannot hold the answer back.
            biased;
            _ = &mut stopped => {
                // Whatever was published before the call ended still belongs to it.
                loop {
                    match rx.try_recv() {
                        Ok(e) => take(&peer, level, &tenant, named.as_ref(), e, &mut held).await,
                        Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                        Err(_) => return held,
                    }
                }
            }
            r = rx.recv() => match r {
                Ok(e) => e,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return held,
            },
        };
        take(&peer, level, &tenant, named.as_ref(), event, &mut held).await;
    }
}

async fn take(
    peer: &Peer<RoleServer>,
    level: LoggingLevel,
    tenant: &str,
    named: Option<&SandboxId>,
    event: SandboxEvent,
    held: &mut Vec<SandboxEvent>,
) {
    if event.tenant != tenant {
        return;
    }
    if Some(&event.sandbox_id) == named {
        if passes(&event, level) {
            let _ = peer.notify_logging_message(message(&event)).await;
        }
    } else if held.len() < REQUEST_BUFFER {
        held.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn event(tenant: &str, kind: EventKind) -> SandboxEvent {
        SandboxEvent {
            tenant: tenant.into(),
            sandbox_id: SandboxId::from("sbx_1"),
            at: SystemTime::UNIX_EPOCH,
            kind,
        }
    }

    #[test]
    fn levels_filter_by_severity() {
        let created = event("t", EventKind::Created);
        let restarted = event(
            "t",
            EventKind::KernelRestarted {
                language: runbox_core::Language::Python,
            },
        );
        assert!(passes(&created, LoggingLevel::Debug));
        assert!(passes(&created, LoggingLevel::Info));
        assert!(!passes(&created, LoggingLevel::Notice));
        assert!(passes(&restarted, LoggingLevel::Warning));
        assert!(!passes(&restarted, LoggingLevel::Error));
    }

    #[test]
    fn messages_carry_the_event_and_the_sandbox() {
        let m = message(&event(
            "t",
            EventKind::EgressRefused {
                host: Some("evil.example".into()),
                port: Some(443),
                reason: "host_not_allowed".into(),
                detail: String::new(),
            },
        ));
        assert_eq!(m.level, LoggingLevel::Warning);
        assert_eq!(m.logger.as_deref(), Some("runbox"));
        assert_eq!(m.data["event"], "egress_refused");
        assert_eq!(m.data["sandbox_id"], "sbx_1");
        assert_eq!(m.data["host"], "evil.example");
        assert_eq!(m.data["port"], 443);
    }

    #[tokio::test]
    async fn expiries_are_remembered_per_tenant_and_bounded() {
        let logs = Logs {
            sessions: Mutex::default(),
            expired: Mutex::default(),
        };
        let expired = |tenant: &str, id: String| SandboxEvent {
            sandbox_id: SandboxId::from(id),
            ..event(
                tenant,
                EventKind::Expired {
                    after: Duration::from_secs(1),
                    paused: false,
                },
            )
        };
        logs.hand_out(&expired("alice", "sbx_a".into()));
        assert!(logs.expiry_of("alice", &SandboxId::from("sbx_a")).is_some());
        assert!(logs.expiry_of("bob", &SandboxId::from("sbx_a")).is_none());
        for i in 0..EXPIRED_KEPT {
            logs.hand_out(&expired("bob", format!("sbx_{i}")));
        }
        assert!(logs.expiry_of("alice", &SandboxId::from("sbx_a")).is_none());
        assert_eq!(logs.expired.lock().unwrap().len(), EXPIRED_KEPT);
        assert_eq!(logs.listening(), 0);
    }
}
