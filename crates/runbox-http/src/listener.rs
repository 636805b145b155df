//! The HTTP server's own accept loop over hyper, so that no client can hold the server's
//! descriptors: connections are capped (all together, and per peer address), a connection
//! must send a complete request head within the header timeout of its first byte (and a new
//! connection within it of being accepted), and a kept-alive connection with nothing in
//! progress is closed after the idle timeout. `TCP_NODELAY` is set on every connection, so
//! that an answer written in two pieces does not wait for the client's delayed ACK.
//!
//! A connection past a cap gets a short `503` (written without waiting) and is closed at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::HeldBody;
use crate::metrics::{Metrics, Rejection};

/// Limits on the HTTP server's connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once, all peers together.
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_connections_per_address: usize,
    /// Time for a request head to arrive, from its first byte (from the accept for a new
    /// connection).
    pub header_timeout: Duration,
    /// Time a kept-alive connection with no request in progress stays open.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_address: 128,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Pause after a failed `accept` (out of descriptors, say) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Open connections, all together and per peer.
#[derive(Debug, Default)]
struct Census {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A connection's place in the census, given back when it closes.
struct Slot {
    census: Arc<Mutex<Census>>,
    peer: IpAddr,
    metrics: Arc<Metrics>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut census = self.census.lock().unwrap_or_else(PoisonError::into_inner);
        census.total = census.total.saturating_sub(1);
        if let Some(n) = census.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                census.per_peer.remove(&self.peer);
            }
        }
        self.metrics.set_connections(census.total);
    }
}

/// A place for a connection from `peer`, or why there is none.
fn admit(
    census: &Arc<Mutex<Census>>,
    limits: &ConnectionLimits,
    peer: IpAddr,
    metrics: &Arc<Metrics>,
) -> Result<Slot, &'static str> {
    let mut c = census.lock().unwrap_or_else(PoisonError::into_inner);
    if c.total >= limits.max_connections {
        return Err("this server has as many connections open as it serves at once");
    }
    let mine = c.per_peer.entry(peer).or_default();
    if *mine >= limits.max_connections_per_address {
        return Err("your address has as many connections open as one address may");
    }
    *mine += 1;
    c.total += 1;
    metrics.set_connections(c.total);
    Ok(Slot {
        census: Arc::clone(census),
        peer,
        metrics: Arc::clone(metrics),
    })
}

/// Answers a connection past a cap without waiting on it (the socket's buffer is empty) and
/// drops it.
fn refuse(stream: TcpStream, why: &str) {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {"code": -32000, "message": format!("{why}; close connections you do not use and try again")},
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// Serves `app` on `listener` until `stop` fires; then stops accepting, lets each connection
/// finish the request in progress, and returns once all are closed or `force` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    force: CancellationToken,
) {
    let census = Arc::new(Mutex::new(Census::default()));
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let slot = match admit(&census, &limits, peer.ip().to_canonical(), &metrics) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(%peer, "{why}: connection refused");
                metrics.rejected(Rejection::Connections);
                refuse(stream, why);
                continue;
            }
        };
        let open = open_rx.clone();
        let (app, limits) = (app.clone(), limits.clone());
        let (stop, force) = (stop.clone(), force.clone());
        tokio::spawn(async move {
            connection(stream, peer, app, &limits, stop, force).await;
            drop(slot);
            drop(open);
        });
    }
    drop(open_rx);
    drop(listener);
    tokio::select! {
        () = open_tx.closed() => {}
        () = force.cancelled() => {}
    }
}

/// What a connection is doing, for its timeouts.
#[derive(Debug)]
struct Activity {
    clock: Mutex<Clock>,
    /// Woken when the last request in progress ends.
    idle: Notify,
}

#[derive(Debug)]
struct Clock {
    in_flight: usize,
    /// When the connection was accepted or its last request ended.
    since: Instant,
    /// Whether a request has been served (before that, the header timeout applies from
    /// `since`).
    served: bool,
    /// When the first byte of a request head arrived while nothing was in progress.
    head_started: Option<Instant>,
}

/// What to do when a deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// The head did not come in time: close at once.
    Head,
    /// Kept alive with nothing to do: close gracefully.
    Idle,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            clock: Mutex::new(Clock {
                in_flight: 0,
                since: Instant::now(),
                served: false,
                head_started: None,
            }),
            idle: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self) {
        let mut c = self.lock();
        if c.in_flight == 0 && c.head_started.is_none() {
            c.head_started = Some(Instant::now());
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        let mut c = self.lock();
        c.in_flight += 1;
        c.head_started = None;
        InFlight(Arc::clone(self))
    }

    /// The next deadline and what it means; `None` while a request is in progress.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, Expiry)> {
        let c = self.lock();
        if c.in_flight > 0 {
            return None;
        }
        Some(match c.head_started {
            Some(t) => (t + limits.header_timeout, Expiry::Head),
            None if !c.served => (c.since + limits.header_timeout, Expiry::Head),
            None => (c.since + limits.idle_timeout, Expiry::Idle),
        })
    }

    /// Waits until the connection has been idle or slow past its limits.
    async fn expired(&self, limits: &ConnectionLimits) -> Expiry {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.deadline(limits) {
                None => notified.await,
                Some((at, expiry)) => {
                    if at <= Instant::now() {
                        return expiry;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
            }
        }
    }
}

/// A request in progress on a connection (its answer included).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut c = self.0.lock();
        c.in_flight = c.in_flight.saturating_sub(1);
        if c.in_flight == 0 {
            c.since = Instant::now();
            c.served = true;
            drop(c);
            self.0.idle.notify_waiters();
        }
    }
}

/// The socket, noting every read in the connection's activity.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves one connection until it closes, expires, or the server stops.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    limits: &ConnectionLimits,
    stop: CancellationToken,
    force: CancellationToken,
) {
    let activity = Activity::new();
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
    });
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let in_flight = activity.begin();
            req.extensions_mut().insert(ConnectInfo(peer));
            let app = app.clone();
            async move {
                let response = app
                    .oneshot(req.map(Body::new))
                    .await
                    .unwrap_or_else(|never| match never {});
                Ok::<_, Infallible>(response.map(|body| Body::new(HeldBody::new(body, in_flight))))
            }
        })
    };
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    // Closing an idle connection gracefully cannot take longer than a head would.
    let mut close_by: Option<Instant> = None;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "HTTP connection ended with an error");
                }
                return;
            }
            () = stop.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = force.cancelled() => return,
            () = sleep_until(close_by) => return,
            expiry = activity.expired(limits), if !closing => match expiry {
                Expiry::Head => {
                    tracing::debug!(%peer, "no complete request head in time: connection closed");
                    return;
                }
                Expiry::Idle => {
                    tracing::debug!(%peer, "idle HTTP connection closed");
                    closing = true;
                    close_by = Some(Instant::now() + limits.header_timeout);
                    conn.as_mut().graceful_shutdown();
                }
            },
        }
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
