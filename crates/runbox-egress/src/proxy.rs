//! The proxy: accept a connection, read one request, decide, connect, then splice (a
//! `CONNECT` tunnel) or forward that one request and its answer (plain HTTP: the connection
//! carries no second request, which would reach the upstream unchecked). One task per
//! connection, all owned by the accept loop, so stopping the loop closes every tunnel.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::timeout;
use tracing::Instrument;

use crate::decision::{Decision, EventSink, Reason, record};
use crate::policy::MAX_HEAD_BYTES;
use crate::request::{ChunkedEnd, Framing, HeadError, Request, read_request};
use crate::{Denial, Host, Policy};

/// The answer to a `CONNECT` the proxy let through.
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";
/// Addresses of one name tried in turn before giving up (each gets the connect timeout), so a
/// name with many unreachable addresses cannot hold a connection for minutes.
const MAX_ADDRESSES_TRIED: usize = 4;
/// `503` answers in flight at once when the proxy is full; past them a connection is closed
/// without an answer.
const MAX_BUSY_ANSWERS: usize = 16;
/// Time to write a refusal.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// After a refusal, how long and how much of what the client still sends is read and
/// dropped before closing, so the close does not reset the connection (and discard the
/// answer) while the client is still writing.
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;
/// Pause after a failed `accept` (out of descriptors, say) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A running proxy, from [`spawn`]. Dropping it stops accepting and aborts every open tunnel.
#[derive(Debug)]
pub struct EgressHandle {
    task: JoinHandle<()>,
    stop: Option<oneshot::Sender<()>>,
    local_addr: Option<SocketAddr>,
}

impl EgressHandle {
    /// The address the proxy listens on (as seen in the network namespace that owns the
    /// listener).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Stops accepting, closes every open tunnel and waits until all are gone.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a proxy on `listener` as a Tokio task (call it inside a runtime). The task runs in
/// the caller's current `tracing` span, so a sandbox's span labels its proxy's logs.
pub fn spawn(
    listener: TcpListener,
    policy: Arc<Policy>,
    events: Option<EventSink>,
) -> EgressHandle {
    let local_addr = listener.local_addr().ok();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(
        run(listener, policy, events, async move {
            let _ = stopped.await;
        })
        .in_current_span(),
    );
    EgressHandle {
        task,
        stop: Some(stop),
        local_addr,
    }
}

/// Serves `listener` until the returned future is dropped; dropping it aborts every open
/// tunnel. [`spawn`] wraps this in a task and a handle.
pub async fn serve(listener: TcpListener, policy: Arc<Policy>, events: Option<EventSink>) {
    run(listener, policy, events, std::future::pending()).await;
}

async fn run(
    listener: TcpListener,
    policy: Arc<Policy>,
    events: Option<EventSink>,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(policy.limits.max_tunnels));
    let busy_answers = Arc::new(Semaphore::new(MAX_BUSY_ANSWERS));
    let mut tasks = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    admit(&mut tasks, client, &slots, &busy_answers, &policy, &events);
                }
                Err(error) => {
                    tracing::warn!(target: "runbox_egress", %error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => reap(joined),
        }
    }
    tasks.shutdown().await;
}

/// Starts serving an accepted connection: with a slot, normally; without one, with a `503`
/// while there is a busy answer to spare; otherwise it is closed unanswered.
fn admit(
    tasks: &mut JoinSet<()>,
    client: TcpStream,
    slots: &Arc<Semaphore>,
    busy_answers: &Arc<Semaphore>,
    policy: &Arc<Policy>,
    events: &Option<EventSink>,
) {
    let _ = client.set_nodelay(true);
    let events = events.clone();
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        let policy = Arc::clone(policy);
        tasks.spawn(connection(client, policy, events, slot).in_current_span());
    } else if let Ok(busy) = Arc::clone(busy_answers).try_acquire_owned() {
        let max = policy.limits.max_tunnels;
        tasks.spawn(answer_busy(client, max, events, busy).in_current_span());
    } else {
        tracing::debug!(target: "runbox_egress", "proxy full; connection closed unanswered");
    }
}

/// Logs a connection task that panicked.
fn reap(joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(target: "runbox_egress", %error, "proxy connection task panicked");
    }
}

/// One client connection, holding a slot for its whole life.
async fn connection(
    mut client: TcpStream,
    policy: Arc<Policy>,
    events: Option<EventSink>,
    _slot: OwnedSemaphorePermit,
) {
    let events = events.as_ref();
    let request = match timeout(policy.limits.head_timeout, read_request(&mut client)).await {
        Ok(Ok(request)) => request,
        Ok(Err(HeadError::Closed(error))) => {
            tracing::debug!(target: "runbox_egress", ?error, "client left before a request");
            return;
        }
        Ok(Err(HeadError::TooLarge)) => {
            let detail = format!(
                "the request head is larger than {} KiB",
                MAX_HEAD_BYTES / 1024
            );
            return refuse(&mut client, events, unnamed(Reason::BadRequest, detail)).await;
        }
        Ok(Err(HeadError::Malformed(why))) => {
            return refuse(&mut client, events, unnamed(Reason::BadRequest, why)).await;
        }
        Err(_) => {
            let detail = format!(
                "no complete request head within {:?}",
                policy.limits.head_timeout
            );
            return refuse(&mut client, events, unnamed(Reason::HeadTimeout, detail)).await;
        }
    };

    let (mut upstream, address) = match open(&request, &policy).await {
        Ok(opened) => opened,
        Err(decision) => return refuse(&mut client, events, decision).await,
    };
    let _ = upstream.set_nodelay(true);
    record(
        events,
        &Decision {
            host: Some(request.host.to_string()),
            port: Some(request.port),
            address: Some(address),
            reason: Reason::Allowed,
            detail: String::new(),
        },
    );

    let spliced = match &request.forward {
        None => {
            async {
                client.write_all(ESTABLISHED).await?;
                upstream.write_all(&request.rest).await?;
                tokio::io::copy_bidirectional(&mut client, &mut upstream).await
            }
            .await
        }
        Some(head) => forward_one(&mut client, &mut upstream, head, &request).await,
    };
    match spliced {
        Ok((sent, received)) => tracing::debug!(
            target: "runbox_egress",
            host = %request.host, port = request.port, sent, received, "tunnel closed"
        ),
        Err(error) => tracing::debug!(
            target: "runbox_egress",
            host = %request.host, port = request.port, %error, "tunnel ended with an error"
        ),
    }
}

/// Forwards one plain-HTTP request, its head and exactly its body, and relays the answer
/// until the upstream closes (the head asked it to). Whatever the client sends after the body
/// is never forwarded: a second request on the connection would reach this upstream without
/// being checked against the allowlist, so the client gets one answer per connection.
async fn forward_one(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    head: &[u8],
    request: &Request,
) -> std::io::Result<(u64, u64)> {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let up = async {
        upstream_write.write_all(head).await?;
        send_body(
            &mut client_read,
            &mut upstream_write,
            request.framing,
            &request.rest,
        )
        .await
    };
    let down = tokio::io::copy(&mut upstream_read, &mut client_write);
    tokio::pin!(up, down);
    let mut sent = None;
    loop {
        tokio::select! {
            r = &mut up, if sent.is_none() => sent = Some(r?),
            r = &mut down => return Ok((sent.unwrap_or(0), r?)),
        }
    }
}

/// Copies a request body framed by `framing` from `early` (bytes read with the head) and then
/// `client` to `upstream`, and nothing past its end.
async fn send_body<R, W>(
    client: &mut R,
    upstream: &mut W,
    framing: Framing,
    early: &[u8],
) -> std::io::Result<u64>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    match framing {
        Framing::None => Ok(0),
        Framing::Length(length) => {
            let first = usize::try_from(length)
                .unwrap_or(usize::MAX)
                .min(early.len());
            upstream.write_all(&early[..first]).await?;
            let left = length - first as u64;
            let copied = tokio::io::copy(&mut client.take(left), upstream).await?;
            Ok(first as u64 + copied)
        }
        Framing::Chunked => {
            let mut end = ChunkedEnd::default();
            let invalid = |e: HeadError| {
                let why = match e {
                    HeadError::Malformed(why) => why,
                    other => format!("{other:?}"),
                };
                std::io::Error::new(std::io::ErrorKind::InvalidData, why)
            };
            let mut sent = 0u64;
            let mut buf = vec![0u8; 16 * 1024];
            let mut piece: &[u8] = early;
            loop {
                let found = end.feed(piece).map_err(invalid)?;
                let take = found.unwrap_or(piece.len());
                upstream.write_all(&piece[..take]).await?;
                sent += take as u64;
                if found.is_some() {
                    return Ok(sent);
                }
                let n = client.read(&mut buf).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                piece = &buf[..n];
            }
        }
    }
}

/// Checks the request against the policy, resolves, filters and connects: the upstream
/// stream and the (checked) address it is connected to, or the refusal.
async fn open(request: &Request, policy: &Policy) -> Result<(TcpStream, SocketAddr), Decision> {
    let (host, port) = (&request.host, request.port);
    let refusal = |reason, detail: String, address| Decision {
        host: Some(host.to_string()),
        port: Some(port),
        address,
        reason,
        detail,
    };

    match policy.allowlist.check(host, port) {
        Ok(()) => {}
        Err(Denial::Host) => {
            let detail = format!(
                "host {host} is not on this sandbox's allowlist; the operator's --allow-host \
                 (and create_sandbox's allow_hosts) decide which hosts are reachable"
            );
            return Err(refusal(Reason::HostNotAllowed, detail, None));
        }
        Err(Denial::Port) => {
            let detail = format!(
                "port {port} is not allowed for {host}; an allowlist entry without a port \
                 allows only 443 and 80 (--allow-host {host}:{port} allows this one)"
            );
            return Err(refusal(Reason::PortNotAllowed, detail, None));
        }
    }

    let resolved = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => {
            let wait = policy.limits.connect_timeout;
            match timeout(wait, policy.resolver.resolve(name)).await {
                Ok(Ok(addresses)) => addresses,
                Ok(Err(error)) => {
                    let detail = format!("could not resolve {host}: {error}");
                    return Err(refusal(Reason::ResolveFailed, detail, None));
                }
                Err(_) => {
                    let detail = format!("resolving {host} took longer than {wait:?}");
                    return Err(refusal(Reason::ResolveFailed, detail, None));
                }
            }
        }
    };

    let mut allowed: Vec<IpAddr> = Vec::new();
    let mut first_refused = None;
    for ip in resolved {
        match policy.check_address(ip) {
            Ok(ip) if !allowed.contains(&ip) => allowed.push(ip),
            Ok(_) => {}
            Err(class) => {
                tracing::debug!(target: "runbox_egress", %host, %ip, %class, "address refused");
                first_refused.get_or_insert((ip, class));
            }
        }
    }
    if allowed.is_empty() {
        return Err(match first_refused {
            Some((ip, class)) => refusal(
                Reason::AddressRefused(class),
                format!(
                    "{host} resolves to {ip}, a {class} address; sandboxes never reach \
                     loopback, private, link-local or other non-public addresses"
                ),
                Some(SocketAddr::new(ip, port)),
            ),
            None => refusal(
                Reason::ResolveFailed,
                format!("{host} has no addresses"),
                None,
            ),
        });
    }

    let wait = policy.limits.connect_timeout;
    let mut failures = Vec::new();
    let mut all_timed_out = true;
    for &ip in allowed.iter().take(MAX_ADDRESSES_TRIED) {
        let address = SocketAddr::new(ip, port);
        match timeout(wait, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok((stream, address)),
            Ok(Err(error)) => {
                all_timed_out = false;
                failures.push(format!("{address}: {error}"));
            }
            Err(_) => failures.push(format!("{address}: no answer within {wait:?}")),
        }
    }
    let reason = if all_timed_out {
        Reason::ConnectTimeout
    } else {
        Reason::ConnectFailed
    };
    let detail = format!(
        "could not connect to {host} port {port} ({})",
        failures.join("; ")
    );
    Err(refusal(reason, detail, None))
}

/// A refusal for a request that named no destination.
fn unnamed(reason: Reason, detail: String) -> Decision {
    Decision {
        host: None,
        port: None,
        address: None,
        reason,
        detail,
    }
}

/// Records a refusal and answers it.
async fn refuse(client: &mut TcpStream, events: Option<&EventSink>, decision: Decision) {
    record(events, &decision);
    answer(client, decision.reason.status(), &decision.detail).await;
}

/// Answers `503` to a connection over the limit.
async fn answer_busy(
    mut client: TcpStream,
    max: usize,
    events: Option<EventSink>,
    _slot: OwnedSemaphorePermit,
) {
    let detail = format!(
        "this sandbox already has {max} connections open through its proxy, the most it may; \
         close some and retry"
    );
    refuse(&mut client, events.as_ref(), unnamed(Reason::Busy, detail)).await;
}

/// Writes a plain-text answer and closes the connection gently.
async fn answer(client: &mut TcpStream, status: u16, detail: &str) {
    let body = format!("runbox egress proxy: {detail}\n");
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        reason_phrase(status),
        body.len()
    );
    let written = timeout(ANSWER_TIMEOUT, async {
        client.write_all(response.as_bytes()).await?;
        client.shutdown().await
    })
    .await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut left = LINGER_BYTES;
    let _ = timeout(LINGER_TIME, async {
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}
