//! Resource subscriptions: a client subscribes to files of its sandboxes
//! (`sandbox://{sandbox_id}/files/{path}`) and hears `notifications/resources/updated`
//! when a run changes one (or `write_file` writes it).
//!
//! - **2025-11-25 sessions** use `resources/subscribe` and `resources/unsubscribe`; the
//!   update goes on the session's stream. Subscribing to a file of a sandbox the caller
//!   does not own (or that does not exist) is "not found", like reading it; a file that does
//!   not exist yet may be subscribed to (a run may create it).
//! - **2026-07-28** replaced both with `subscriptions/listen`: one long-lived request whose
//!   filter names the URIs (`resourceSubscriptions`); updates go on that request's stream,
//!   tagged with its id, until the client cancels it. The filter is accepted for every
//!   sandbox file URI, but only the owner's runs ever update one.
//!
//! Which files changed comes from the run's before-and-after snapshot of `/workspace`
//! ([`runbox_core::changes`]). When that list is unknown or cut short (more than
//! [`runbox_core::MAX_CHANGES`] files, a backend without snapshots), every subscribed file of
//! the sandbox is reported: an update only tells a client to read the file again. Files a
//! background process changes between runs are reported by the next run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{ResourceUpdatedNotificationParam, SubscriptionFilter};
use rmcp::service::SubscriptionSink;
use rmcp::{Peer, RoleServer};
use runbox_core::SandboxId;

use crate::resources::{self, Target};

/// Most files one session or listener may subscribe to.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 256;

/// A subscribed file, as the client named it: updates repeat its URI exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Watched {
    sandbox: SandboxId,
    path: String,
    uri: String,
}

impl Watched {
    fn parse(uri: &str) -> Option<Self> {
        match resources::parse(uri).ok()? {
            Target::SandboxFile(sandbox, path) => Some(Self {
                sandbox,
                path,
                uri: uri.to_owned(),
            }),
            Target::Data(_) | Target::Output(_) => None,
        }
    }

    fn hit(&self, sandbox: &SandboxId, changed: Option<&[String]>) -> bool {
        &self.sandbox == sandbox && changed.is_none_or(|paths| paths.contains(&self.path))
    }
}

/// Where an update goes.
enum Channel {
    /// A 2025-11-25 session's stream.
    Session(Peer<RoleServer>),
    /// A 2026-07-28 `subscriptions/listen` request's stream.
    Listen(SubscriptionSink),
}

struct Subscriber {
    tenant: String,
    channel: Channel,
    files: Vec<Watched>,
}

impl Subscriber {
    fn open(&self) -> bool {
        match &self.channel {
            Channel::Session(peer) => !peer.is_transport_closed(),
            Channel::Listen(_) => true,
        }
    }
}

/// Every subscription, by session key (2025) or listen request (2026).
#[derive(Default)]
pub(crate) struct Subscriptions {
    subscribers: Mutex<HashMap<Key, Subscriber>>,
    next_listener: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Session(u64),
    Listener(u64),
}

/// Why a subscription was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a URI of a sandbox file.
    NotAFile,
    /// The session's subscriptions are full.
    TooMany,
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The sandbox a subscribable URI names (the caller checks it owns it).
    pub(crate) fn sandbox_of(uri: &str) -> Option<SandboxId> {
        Watched::parse(uri).map(|w| w.sandbox)
    }

    /// `resources/subscribe` of a 2025-11-25 session.
    pub(crate) fn subscribe(
        &self,
        session: u64,
        tenant: &str,
        peer: Peer<RoleServer>,
        uri: &str,
    ) -> Result<(), Refused> {
        let watched = Watched::parse(uri).ok_or(Refused::NotAFile)?;
        let mut subscribers = self.lock();
        subscribers.retain(|_, s| s.open());
        let s = subscribers
            .entry(Key::Session(session))
            .or_insert_with(|| Subscriber {
                tenant: tenant.to_owned(),
                channel: Channel::Session(peer),
                files: Vec::new(),
            });
        s.tenant = tenant.to_owned();
        if s.files.contains(&watched) {
            return Ok(());
        }
        if s.files.len() >= MAX_SUBSCRIPTIONS {
            return Err(Refused::TooMany);
        }
        s.files.push(watched);
        Ok(())
    }

    /// `resources/unsubscribe` of a 2025-11-25 session: a URI it never subscribed to is
    /// no error.
    pub(crate) fn unsubscribe(&self, session: u64, uri: &str) {
        let mut subscribers = self.lock();
        if let Some(s) = subscribers.get_mut(&Key::Session(session)) {
            s.files.retain(|w| w.uri != uri);
            if s.files.is_empty() {
                subscribers.remove(&Key::Session(session));
            }
        }
    }

    /// The part of a `subscriptions/listen` filter served here: sandbox file URIs (at most
    /// [`MAX_SUBSCRIPTIONS`]), and the list-changed flags as asked (rmcp keeps only those
    /// the server advertises, none).
    pub(crate) fn accepted(requested: &SubscriptionFilter) -> SubscriptionFilter {
        let mut accepted = requested.clone();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|u| Watched::parse(u).is_some())
                .take(MAX_SUBSCRIPTIONS)
                .cloned()
                .collect()
        });
        accepted
    }

    /// Registers a 2026 listen request until the returned guard is dropped.
    pub(crate) fn listen(
        self: &Arc<Self>,
        tenant: &str,
        sink: SubscriptionSink,
        accepted: &SubscriptionFilter,
    ) -> Listening {
        let files = accepted
            .resource_subscriptions
            .iter()
            .flatten()
            .filter_map(|u| Watched::parse(u))
            .collect();
        let id = self
            .next_listener
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(
            Key::Listener(id),
            Subscriber {
                tenant: tenant.to_owned(),
                channel: Channel::Listen(sink),
                files,
            },
        );
        Listening {
            subscriptions: Arc::clone(self),
            key: Key::Listener(id),
        }
    }

    /// Files of `tenant`'s sandbox changed: `changed` lists their absolute paths, or is
    /// `None` when which ones is unknown (then every subscribed file of the sandbox is
    /// reported). Never waits on a client.
    pub(crate) fn changed(&self, tenant: &str, sandbox: &SandboxId, changed: Option<&[String]>) {
        let mut subscribers = self.lock();
        subscribers.retain(|_, s| s.open());
        for s in subscribers.values().filter(|s| s.tenant == tenant) {
            for w in s.files.iter().filter(|w| w.hit(sandbox, changed)) {
                let uri = w.uri.clone();
                match &s.channel {
                    Channel::Session(peer) => {
                        let peer = peer.clone();
                        tokio::spawn(async move {
                            let param = ResourceUpdatedNotificationParam::new(uri);
                            let _ = peer.notify_resource_updated(param).await;
                        });
                    }
                    Channel::Listen(sink) => {
                        let sink = sink.clone();
                        tokio::spawn(async move {
                            let _ = sink.notify_resource_updated(uri).await;
                        });
                    }
                }
            }
        }
    }

    /// Subscribers now (for tests).
    #[cfg(test)]
    fn count(&self) -> usize {
        self.lock().len()
    }
}

/// A listen request's registration; dropping it (the request ended or was cancelled)
/// removes it.
pub(crate) struct Listening {
    subscriptions: Arc<Subscriptions>,
    key: Key,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.subscriptions.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_match_by_sandbox_and_path_whatever_the_encoding() {
        let w = Watched::parse("sandbox://sbx_1/files/workspace%2Fout%201.csv").unwrap();
        let id = SandboxId::from("sbx_1");
        assert!(w.hit(&id, Some(&["/workspace/out 1.csv".to_owned()])));
        assert!(!w.hit(&id, Some(&["/workspace/other.csv".to_owned()])));
        assert!(w.hit(&id, None), "unknown changes report every file");
        assert!(!w.hit(&SandboxId::from("sbx_2"), None));
        assert!(Watched::parse("data://prices").is_none());
        assert!(Watched::parse("test://watched-resource").is_none());
    }

    #[test]
    fn listen_filters_keep_only_sandbox_files() {
        let requested = SubscriptionFilter::builder()
            .tools_list_changed()
            .resource_subscriptions([
                "sandbox://sbx_1/files/workspace/a.txt",
                "test://watched-resource",
            ])
            .build();
        let accepted = Subscriptions::accepted(&requested);
        assert_eq!(
            accepted.resource_subscriptions,
            Some(vec!["sandbox://sbx_1/files/workspace/a.txt".to_owned()])
        );
        assert_eq!(accepted.tools_list_changed, Some(true));
    }

    #[test]
    fn unsubscribing_what_was_never_subscribed_is_no_error() {
        let s = Subscriptions::default();
        s.unsubscribe(1, "sandbox://sbx_1/files/workspace/a.txt");
        assert_eq!(s.count(), 0);
    }
}
