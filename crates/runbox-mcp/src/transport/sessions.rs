//! MCP sessions (the `Mcp-Session-Id` of 2025-11-25 and older clients) over rmcp's
//! in-memory session manager, with what a server shared by tenants needs around it:
//!
//! - **Ownership.** A session belongs to the tenant that opened it. A request of another
//!   tenant naming its id (POST, GET or DELETE) gets exactly the `404` "Session not found" an
//!   id that never existed gets ([`guard`]).
//! - **Caps.** At most so many live sessions, all tenants together and per tenant; an
//!   `initialize` past them is refused (`503` with a JSON-RPC error, from the request gate).
//! - **Expiry.** A session with no request in progress and no stream open for the idle
//!   timeout is closed ([`spawn_reaper`]). rmcp's own keep-alive is off: it counts only
//!   messages, so it would end a session whose one request runs longer than the timeout.
//! - **Disconnects.** A client whose connection goes away while its request runs cancels
//!   the request, as a `notifications/cancelled` would, unless it resumes the stream
//!   (`Last-Event-ID`) within [`DISCONNECT_GRACE`]: rmcp does this for stateless requests
//!   only.
//!
//! Live sessions are counted in the metrics (`runbox_sessions`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use tokio_util::sync::CancellationToken;

use crate::caller::Caller;
use runbox_http::{HeldBody, Metrics};

/// How long a request whose client went away keeps running, waiting for the client to
/// resume its stream, before it is cancelled: past rmcp's `retry` hint (3 s), so a client
/// reconnecting as told is in time.
pub(crate) const DISCONNECT_GRACE: Duration = Duration::from_secs(10);

/// The header naming a session.
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

tokio::task_local! {
    /// The tenant of the request being served, for `create_session` (which rmcp calls with
    /// no request at hand).
    static TENANT: String;
}

/// Limits on sessions.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// Live sessions, all tenants together.
    pub max_sessions: usize,
    /// Live sessions of one tenant; `None`: only `max_sessions`.
    pub max_sessions_per_tenant: Option<usize>,
    /// How long a session with nothing in progress lives.
    pub idle_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_sessions: 1000,
            max_sessions_per_tenant: None,
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// Who owns each live session and whether it is in use.
#[derive(Debug)]
pub(crate) struct SessionBook {
    sessions: Mutex<HashMap<SessionId, Entry>>,
    limits: SessionLimits,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct Entry {
    tenant: String,
    /// Requests and streams of the session in progress.
    in_flight: usize,
    /// When the last of them ended (or the session opened).
    last_seen: Instant,
}

impl SessionBook {
    pub(crate) fn new(limits: SessionLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            limits,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Entry>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why `tenant` may not open a session now, if it may not.
    pub(crate) fn refusal(&self, tenant: &str) -> Option<String> {
        refusal(&self.lock(), &self.limits, tenant)
    }

    /// Records a new session of `tenant`, unless a cap refuses it.
    fn open(&self, id: &SessionId, tenant: &str) -> Result<(), String> {
        let mut sessions = self.lock();
        if let Some(why) = refusal(&sessions, &self.limits, tenant) {
            return Err(why);
        }
        sessions.insert(
            id.clone(),
            Entry {
                tenant: tenant.to_owned(),
                in_flight: 0,
                last_seen: Instant::now(),
            },
        );
        self.metrics.set_sessions(sessions.len());
        Ok(())
    }

    /// Forgets a session; whether it was live.
    fn close(&self, id: &SessionId) -> bool {
        let mut sessions = self.lock();
        let was = sessions.remove(id).is_some();
        self.metrics.set_sessions(sessions.len());
        was
    }

    /// A request of `tenant` on session `id`: its activity, or `None` when the session is
    /// not live or is another tenant's (the two are answered alike).
    fn enter(self: &Arc<Self>, id: &SessionId, tenant: &str) -> Option<Activity> {
        let mut sessions = self.lock();
        let entry = sessions.get_mut(id).filter(|e| e.tenant == tenant)?;
        entry.in_flight += 1;
        Some(Activity {
            book: Arc::clone(self),
            id: id.clone(),
        })
    }

    /// Sessions idle for the idle timeout, removed from the book.
    fn take_expired(&self, now: Instant) -> Vec<SessionId> {
        let mut sessions = self.lock();
        let idle = self.limits.idle_timeout;
        let expired: Vec<SessionId> = sessions
            .iter()
            .filter(|(_, e)| e.in_flight == 0 && now.duration_since(e.last_seen) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            sessions.remove(id);
        }
        self.metrics.set_sessions(sessions.len());
        expired
    }
}

fn refusal(
    sessions: &HashMap<SessionId, Entry>,
    limits: &SessionLimits,
    tenant: &str,
) -> Option<String> {
    if sessions.len() >= limits.max_sessions {
        return Some(format!(
            "this server already holds its maximum of {} MCP sessions; end sessions you no \
             longer use (DELETE /mcp) or try again later (idle sessions close after {} s)",
            limits.max_sessions,
            limits.idle_timeout.as_secs()
        ));
    }
    let max = limits.max_sessions_per_tenant?;
    let mine = sessions.values().filter(|e| e.tenant == tenant).count();
    (mine >= max).then(|| {
        format!(
            "you already hold {max} MCP sessions, the most one tenant may; end sessions you no \
             longer use (DELETE /mcp) or try again later (idle sessions close after {} s)",
            limits.idle_timeout.as_secs()
        )
    })
}

/// A request or stream of a session in progress; the session is not idle while one lives.
#[derive(Debug)]
struct Activity {
    book: Arc<SessionBook>,
    id: SessionId,
}

impl Drop for Activity {
    fn drop(&mut self) {
        let mut sessions = self.book.lock();
        if let Some(entry) = sessions.get_mut(&self.id) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_seen = Instant::now();
        }
    }
}

/// The tenant of a request: the one authentication found, else the server's local one.
pub(crate) fn tenant_of(req: &Request, default_tenant: &str) -> String {
    req.extensions()
        .get::<Caller>()
        .map_or_else(|| default_tenant.to_owned(), |c| c.tenant.clone())
}

/// The answer to a session id that is not live, or not the caller's: rmcp's own, byte for
/// byte, so the two cannot be told apart.
fn session_not_found() -> Response {
    let mut response = Response::new(Body::from("Not Found: Session not found"));
    *response.status_mut() = axum::http::StatusCode::NOT_FOUND;
    response
}

/// State of the [`guard`] layer.
#[derive(Debug, Clone)]
pub(crate) struct GuardState {
    pub(crate) book: Arc<SessionBook>,
    pub(crate) default_tenant: String,
}

/// In front of rmcp: a request naming a session must be its owner's, and is counted as the
/// session's activity until its answer (an SSE stream, maybe long) ends. Requests that open
/// a session carry their tenant to `create_session`.
pub(crate) async fn guard(State(state): State<GuardState>, req: Request, next: Next) -> Response {
    let tenant = tenant_of(&req, &state.default_tenant);
    let named = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(SessionId::from);
    let activity = match &named {
        Some(id) => match state.book.enter(id, &tenant) {
            Some(activity) => Some(activity),
            None => return session_not_found(),
        },
        None => None,
    };
    let response = TENANT.scope(tenant, next.run(req)).await;
    match activity {
        Some(activity) => response.map(|body| Body::new(HeldBody::new(body, activity))),
        None => response,
    }
}

/// Closes sessions idle past the timeout until `stop`.
pub(crate) fn spawn_reaper(sessions: Arc<TenantSessions>, stop: CancellationToken) {
    let every = (sessions.book.limits.idle_timeout / 4)
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for id in sessions.book.take_expired(Instant::now()) {
                tracing::debug!(session = %id, "closing an idle MCP session");
                sessions.book.metrics.session_expired();
                if let Err(e) = sessions.inner.close_session(&id).await {
                    tracing::warn!(session = %id, "closing an idle session: {e}");
                }
            }
        }
    });
}

/// Why a session could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    /// A cap on sessions.
    #[error("{0}")]
    Full(String),
    /// rmcp's manager failed.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`] with ownership, caps and cancellation on disconnect.
#[derive(Debug)]
pub(crate) struct TenantSessions {
    inner: Arc<LocalSessionManager>,
    book: Arc<SessionBook>,
    watches: Arc<Watches>,
}

impl TenantSessions {
    pub(crate) fn new(book: Arc<SessionBook>) -> Self {
        let mut local = LocalSessionManager::default();
        // Expiry is the book's: rmcp's keep-alive counts only messages.
        local.session_config.keep_alive = None;
        let inner = Arc::new(local);
        Self {
            watches: Arc::new(Watches {
                manager: Arc::clone(&inner),
                streams: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
            }),
            inner,
            book,
        }
    }
}

type SseStream = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync + 'static>>;

impl SessionManager for TenantSessions {
    type Error = SessionsError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let tenant = TENANT
            .try_with(Clone::clone)
            .unwrap_or_else(|_| String::new());
        let (id, transport) = self.inner.create_session().await?;
        if let Err(why) = self.book.open(&id, &tenant) {
            let _ = self.inner.close_session(&id).await;
            return Err(SessionsError::Full(why));
        }
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.book.close(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let stream = self.inner.create_stream(id, message).await?;
        Ok(Watched::new(
            Box::pin(stream),
            id.clone(),
            request,
            None,
            &self.watches,
        ))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.resume(id, last_event_id.clone()).await?;
        // A resumed request stream takes over the watch of the one that broke.
        let key = http_request_of(&last_event_id);
        let request = key.and_then(|k| self.watches.request_of(id, k));
        Ok(Watched::new(
            Box::pin(stream),
            id.clone(),
            request,
            key,
            &self.watches,
        ))
    }
}

/// The HTTP request number in one of rmcp's session event ids (`index/http_request`).
fn http_request_of(event_id: &str) -> Option<u64> {
    event_id.split_once('/')?.1.parse().ok()
}

/// The request streams of sessions whose client may come back for them.
#[derive(Debug)]
struct Watches {
    manager: Arc<LocalSessionManager>,
    /// (session, HTTP request number) → the MCP request and the generation of the stream
    /// that carries it now.
    streams: Mutex<HashMap<(SessionId, u64), (RequestId, u64)>>,
    next: AtomicU64,
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SessionId, u64), (RequestId, u64)>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn request_of(&self, session: &SessionId, key: u64) -> Option<RequestId> {
        self.lock()
            .get(&(session.clone(), key))
            .map(|(request, _)| request.clone())
    }

    /// Sends the cancellation of `request` into its session.
    fn cancel(self: &Arc<Self>, session: SessionId, request: RequestId) {
        let manager = Arc::clone(&self.manager);
        let cancelled = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request, "reason": "the client went away"},
        });
        let Ok(message) = serde_json::from_value::<ClientJsonRpcMessage>(cancelled) else {
            return;
        };
        tokio::spawn(async move {
            tracing::debug!(%session, "the client went away: cancelling its request");
            let _ = manager.accept_message(&session, message).await;
        });
    }
}

/// A request's answer stream: dropped before its end (the client went away), it cancels the
/// request after [`DISCONNECT_GRACE`] unless a resumed stream took over.
struct Watched {
    inner: SseStream,
    session: SessionId,
    request: Option<RequestId>,
    key: Option<u64>,
    generation: u64,
    ended: bool,
    watches: Arc<Watches>,
}

impl Watched {
    fn new(
        inner: SseStream,
        session: SessionId,
        request: Option<RequestId>,
        key: Option<u64>,
        watches: &Arc<Watches>,
    ) -> Self {
        let mut watched = Self {
            inner,
            session,
            request,
            key: None,
            generation: watches.next.fetch_add(1, Ordering::Relaxed),
            ended: false,
            watches: Arc::clone(watches),
        };
        if let Some(key) = key {
            watched.watch(key);
        }
        watched
    }

    /// Records that this stream now carries HTTP request `key` of its session.
    fn watch(&mut self, key: u64) {
        self.key = Some(key);
        if let Some(request) = &self.request {
            self.watches.lock().insert(
                (self.session.clone(), key),
                (request.clone(), self.generation),
            );
        }
    }

    /// Whether this stream is still the one its request is watched through.
    fn current(&self) -> bool {
        let Some(key) = self.key else {
            return true;
        };
        self.watches
            .lock()
            .get(&(self.session.clone(), key))
            .is_some_and(|(_, generation)| *generation == self.generation)
    }

    fn forget(&self) {
        if let Some(key) = self.key {
            let mut streams = self.watches.lock();
            let k = (self.session.clone(), key);
            if streams.get(&k).is_some_and(|(_, g)| *g == self.generation) {
                streams.remove(&k);
            }
        }
    }
}

impl Stream for Watched {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(message)) if self.key.is_none() => {
                if let Some(key) = message.event_id.as_deref().and_then(http_request_of) {
                    self.watch(key);
                }
            }
            Poll::Ready(None) => {
                self.ended = true;
                self.forget();
            }
            _ => {}
        }
        polled
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Some(request) = self.request.clone() else {
            return;
        };
        if !self.current() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watches = Arc::clone(&self.watches);
        let (session, key, generation) = (self.session.clone(), self.key, self.generation);
        runtime.spawn(async move {
            tokio::time::sleep(DISCONNECT_GRACE).await;
            if let Some(key) = key {
                let mut streams = watches.lock();
                let k = (session.clone(), key);
                match streams.get(&k) {
                    Some((_, g)) if *g == generation => {
                        streams.remove(&k);
                    }
                    // Resumed by another stream, or finished.
                    _ => return,
                }
            }
            watches.cancel(session, request);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_name_their_http_request() {
        assert_eq!(http_request_of("0/5"), Some(5));
        assert_eq!(http_request_of("12/0"), Some(0));
        assert_eq!(http_request_of("3"), None);
    }

    #[test]
    fn sessions_are_capped_owned_and_expire_when_idle() {
        let book = Arc::new(SessionBook::new(
            SessionLimits {
                max_sessions: 3,
                max_sessions_per_tenant: Some(2),
                idle_timeout: Duration::from_secs(60),
            },
            Arc::new(Metrics::new()),
        ));
        let ids: Vec<SessionId> = ["a", "b", "c", "d"].into_iter().map(Into::into).collect();
        book.open(&ids[0], "alice").unwrap();
        book.open(&ids[1], "alice").unwrap();
        assert!(
            book.open(&ids[2], "alice")
                .unwrap_err()
                .contains("2 MCP sessions")
        );
        book.open(&ids[2], "bob").unwrap();
        assert!(
            book.open(&ids[3], "carol")
                .unwrap_err()
                .contains("maximum of 3")
        );
        assert!(book.enter(&ids[0], "bob").is_none());
        let busy = book.enter(&ids[0], "alice").unwrap();
        let later = Instant::now() + Duration::from_secs(61);
        let mut expired = book.take_expired(later);
        expired.sort();
        assert_eq!(expired, [ids[1].clone(), ids[2].clone()]);
        drop(busy);
        let soon = Instant::now() + Duration::from_secs(59);
        assert!(book.take_expired(soon).is_empty(), "just used");
        assert!(book.close(&ids[0]));
        assert!(book.enter(&ids[0], "alice").is_none());
    }
}
