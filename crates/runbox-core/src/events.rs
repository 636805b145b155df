//! What happens to a sandbox on its own, for its owner to hear about: it was created, it
//! expired, its kernel had to be restarted, its egress proxy refused a connection.
//!
//! The [`Registry`](crate::Registry) publishes a [`SandboxEvent`] for each, always naming
//! the tenant that owns the sandbox, on a broadcast channel a front end subscribes to
//! ([`Registry::subscribe_events`](crate::Registry::subscribe_events)). The front end
//! decides who hears what (the MCP server sends each event only to its owner's sessions
//! and requests); nothing here knows a protocol. Events are a courtesy, never a record: a
//! subscriber that falls behind loses the oldest.

use std::time::{Duration, SystemTime};

use crate::exec::Language;
use crate::sandbox::SandboxId;

/// Events kept for subscribers that have not read them yet; a slower subscriber loses the
/// oldest.
pub const EVENT_BUFFER: usize = 1024;

/// Something that happened to one tenant's sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxEvent {
    /// The tenant that owns the sandbox: the only one who may hear of it.
    pub tenant: String,
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// When it happened.
    pub at: SystemTime,
    /// What happened.
    pub kind: EventKind,
}

/// What happened to a sandbox.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// It was created for its owner (`create_sandbox`; a one-shot run's sandbox is not
    /// announced).
    Created,
    /// It stayed idle for its whole idle timeout, or paused for the server's whole pause
    /// timeout, and was closed.
    Expired {
        /// The timeout that ran out.
        after: Duration,
        /// Whether it was paused (the pause timeout ran out, not the idle timeout).
        paused: bool,
    },
    /// A kernel had to be killed and started afresh during a run: its state was lost.
    KernelRestarted {
        /// The kernel's language.
        language: Language,
    },
    /// Its egress proxy refused a connection.
    EgressRefused {
        /// The host asked for, when the request named one.
        host: Option<String>,
        /// The port asked for, when the request named one.
        port: Option<u16>,
        /// Why, as a stable short name (`host_not_allowed`, `address_refused`, ...).
        reason: String,
        /// A sentence for people.
        detail: String,
    },
}

impl EventKind {
    /// A stable short name: `sandbox_created`, `sandbox_expired`, `kernel_restarted`,
    /// `egress_refused`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Created => "sandbox_created",
            Self::Expired { .. } => "sandbox_expired",
            Self::KernelRestarted { .. } => "kernel_restarted",
            Self::EgressRefused { .. } => "egress_refused",
        }
    }
}

impl SandboxEvent {
    /// The event told in a sentence.
    pub fn message(&self) -> String {
        let id = &self.sandbox_id;
        match &self.kind {
            EventKind::Created => format!("sandbox {id} was created"),
            EventKind::Expired { after, paused } => format!(
                "sandbox {id} expired after {} s {} and was closed; create a new one with \
                 create_sandbox",
                after.as_secs(),
                if *paused { "paused" } else { "idle" }
            ),
            EventKind::KernelRestarted { language } => format!(
                "the {language} kernel of sandbox {id} did not stop when interrupted and was \
                 restarted: its variables and imports are gone"
            ),
            EventKind::EgressRefused {
                host,
                port,
                reason,
                detail,
            } => {
                let target = match (host, port) {
                    (Some(h), Some(p)) => format!("{h}:{p}"),
                    (Some(h), None) => h.clone(),
                    _ => "a destination".to_owned(),
                };
                let mut s = format!("sandbox {id}: the egress proxy refused {target} ({reason})");
                if !detail.is_empty() {
                    s.push_str(": ");
                    s.push_str(detail);
                }
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_sandbox_and_what_happened() {
        let e = |kind| SandboxEvent {
            tenant: "t".into(),
            sandbox_id: SandboxId::from("sbx_1"),
            at: SystemTime::UNIX_EPOCH,
            kind,
        };
        let refused = e(EventKind::EgressRefused {
            host: Some("evil.example".into()),
            port: Some(443),
            reason: "host_not_allowed".into(),
            detail: "evil.example is not on the allowlist".into(),
        });
        assert_eq!(refused.kind.name(), "egress_refused");
        assert_eq!(
            refused.message(),
            "sandbox sbx_1: the egress proxy refused evil.example:443 (host_not_allowed): \
             evil.example is not on the allowlist"
        );
        let expired = e(EventKind::Expired {
            after: Duration::from_secs(900),
            paused: false,
        });
        assert!(expired.message().contains("after 900 s idle"));
        let paused = e(EventKind::Expired {
            after: Duration::from_secs(3600),
            paused: true,
        });
        assert!(paused.message().contains("after 3600 s paused"));
        assert!(
            e(EventKind::KernelRestarted {
                language: Language::Python
            })
            .message()
            .contains("python kernel")
        );
    }
}
