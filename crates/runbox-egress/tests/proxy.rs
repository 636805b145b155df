//! The proxy over real sockets on loopback: fake upstreams on 127.0.0.1, names mapped to
//! addresses by an injected resolver, no internet.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runbox_egress::{
    AddressClass, Allowlist, Decision, EgressHandle, EventSink, Policy, ProxyLimits, Reason,
    Resolve, parse_address_range, spawn,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(5);

/// Maps names to fixed addresses and counts lookups.
#[derive(Debug, Default)]
struct MapResolver {
    names: HashMap<String, Vec<IpAddr>>,
    lookups: AtomicUsize,
}

impl MapResolver {
    fn new(names: &[(&str, &[&str])]) -> Arc<Self> {
        let names = names
            .iter()
            .map(|(name, ips)| {
                (
                    name.to_string(),
                    ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                )
            })
            .collect();
        Arc::new(Self {
            names,
            lookups: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Resolve for MapResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.names
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
    }
}

/// A running proxy, the decisions it reported, and its address.
struct Proxy {
    handle: EgressHandle,
    addr: SocketAddr,
    decisions: Arc<Mutex<Vec<Decision>>>,
}

impl Proxy {
    async fn start(policy: Policy) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let sink: EventSink = {
            let decisions = Arc::clone(&decisions);
            Arc::new(move |d: &Decision| decisions.lock().unwrap().push(d.clone()))
        };
        let handle = spawn(listener, Arc::new(policy), Some(sink));
        let addr = handle.local_addr().unwrap();
        Self {
            handle,
            addr,
            decisions,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Sends `request` on a new connection and reads the whole answer (the proxy closes).
    async fn ask(&self, request: &[u8]) -> String {
        let mut client = self.connect().await;
        client.write_all(request).await.unwrap();
        read_to_end(&mut client).await
    }

    fn decisions(&self) -> Vec<Decision> {
        self.decisions.lock().unwrap().clone()
    }

    fn last_decision(&self) -> Decision {
        self.decisions().pop().expect("a decision")
    }
}

fn policy(allow: &[&str], resolver: Arc<MapResolver>) -> Policy {
    Policy::new(Allowlist::parse(allow).unwrap()).with_resolver(resolver)
}

fn with_loopback_exception(policy: Policy) -> Policy {
    policy.with_allow_addresses(vec![parse_address_range("127.0.0.1").unwrap()])
}

/// An upstream on 127.0.0.1 that echoes every connection.
async fn echo_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    addr
}

async fn read_to_end(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    timeout(WAIT, stream.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a response head (through the blank line).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = timeout(WAIT, stream.read(&mut byte))
            .await
            .expect("head in time")
            .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

async fn read_exact(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    timeout(WAIT, stream.read_exact(&mut buf))
        .await
        .expect("data in time")
        .unwrap();
    buf
}

/// Asserts nothing connects to `listener` for a while.
async fn assert_no_connection(listener: &TcpListener) {
    let accepted = timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(
        accepted.is_err(),
        "the proxy connected to {:?}",
        listener.local_addr()
    );
}

fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[tokio::test]
async fn connect_tunnels_bytes_both_ways() {
    let upstream = echo_upstream().await;
    let port = upstream.port();
    let resolver = MapResolver::new(&[("echo.test", &["127.0.0.1"])]);
    let allow = format!("echo.test:{port}");
    let proxy = Proxy::start(with_loopback_exception(policy(&[&allow], resolver))).await;

    let mut client = proxy.connect().await;
    // Bytes sent right after the head (before the 200) are passed on too.
    let request =
        format!("CONNECT Echo.Test:{port} HTTP/1.1\r\nHost: echo.test:{port}\r\n\r\nearly,");
    client.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(
        read_head(&mut client).await,
        "HTTP/1.1 200 Connection Established\r\n\r\n"
    );
    assert_eq!(read_exact(&mut client, 6).await, b"early,");
    client.write_all(b"ping").await.unwrap();
    assert_eq!(read_exact(&mut client, 4).await, b"ping");
    let big = vec![7u8; 256 * 1024];
    let (mut reader, mut writer) = client.split();
    let (_, echoed) = tokio::join!(writer.write_all(&big), async {
        let mut buf = vec![0u8; big.len()];
        timeout(WAIT, reader.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        buf
    });
    assert_eq!(echoed, big);
    // Half-close: the upstream sees EOF, closes, and so does the tunnel.
    client.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "");

    let decision = proxy.last_decision();
    assert!(decision.allowed());
    assert_eq!(decision.reason, Reason::Allowed);
    assert_eq!(decision.host.as_deref(), Some("echo.test"));
    assert_eq!(decision.port, Some(port));
    assert_eq!(decision.address, Some(upstream));
}

#[tokio::test]
async fn host_not_on_the_allowlist_is_refused_unresolved_and_unconnected() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let resolver = MapResolver::new(&[("other.test", &["127.0.0.1"])]);
    let allow = format!("allowed.test:{port}");
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&allow],
        Arc::clone(&resolver),
    )))
    .await;

    let answer = proxy
        .ask(format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await;
    assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden");
    assert!(answer.contains("Content-Type: text/plain"), "{answer}");
    assert!(answer.contains("other.test"), "{answer}");
    assert!(
        answer.contains("--allow-host") && answer.contains("allow_hosts"),
        "{answer}"
    );
    assert_no_connection(&listener).await;
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 0);

    let decision = proxy.last_decision();
    assert!(!decision.allowed());
    assert_eq!(decision.reason, Reason::HostNotAllowed);
    assert_eq!(decision.host.as_deref(), Some("other.test"));
}

#[tokio::test]
async fn names_resolving_to_internal_addresses_are_refused_and_never_connected() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Also listen on ::1 with the same port when this machine has IPv6 loopback.
    let listener6 = TcpListener::bind(("::1", port)).await.ok();
    let cases: [(&str, AddressClass); 5] = [
        ("127.0.0.1", AddressClass::Loopback),
        ("169.254.169.254", AddressClass::LinkLocal),
        ("10.0.0.1", AddressClass::Private),
        ("::1", AddressClass::Loopback),
        ("::ffff:127.0.0.1", AddressClass::Loopback),
    ];
    for (ip, class) in cases {
        let resolver = MapResolver::new(&[("evil.test", &[ip])]);
        let proxy = Proxy::start(policy(&[&format!("evil.test:{port}")], resolver)).await;
        for request in [
            format!("CONNECT evil.test:{port} HTTP/1.1\r\n\r\n"),
            format!("GET http://evil.test:{port}/latest/meta-data/ HTTP/1.1\r\n\r\n"),
        ] {
            let answer = proxy.ask(request.as_bytes()).await;
            assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden", "{ip}: {answer}");
            assert!(answer.contains("evil.test resolves to"), "{answer}");
            let decision = proxy.last_decision();
            assert_eq!(decision.reason, Reason::AddressRefused(class), "{ip}");
            let expected: IpAddr = ip.parse().unwrap();
            assert_eq!(decision.address, Some(SocketAddr::new(expected, port)));
        }
        assert_no_connection(&listener).await;
        if let Some(listener6) = &listener6 {
            assert_no_connection(listener6).await;
        }
    }
}

#[tokio::test]
async fn literal_loopback_addresses_are_refused_even_when_listed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let allow = [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let proxy = Proxy::start(policy(&allow, MapResolver::new(&[]))).await;

    for target in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ] {
        let answer = proxy
            .ask(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
            .await;
        assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden", "{answer}");
        assert!(answer.contains("loopback"), "{answer}");
        assert_eq!(
            proxy.last_decision().reason,
            Reason::AddressRefused(AddressClass::Loopback)
        );
    }
    // Not listed at all: refused by name first.
    let answer = proxy.ask(b"CONNECT 127.0.0.2:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden", "{answer}");
    assert_eq!(proxy.last_decision().reason, Reason::HostNotAllowed);
    assert_no_connection(&listener).await;
}

#[tokio::test]
async fn refused_addresses_are_skipped_and_an_allowed_one_is_used() {
    let upstream = echo_upstream().await;
    let port = upstream.port();
    let resolver =
        MapResolver::new(&[("mixed.test", &["169.254.169.254", "10.0.0.1", "127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&format!("mixed.test:{port}")],
        resolver,
    )))
    .await;
    let mut client = proxy.connect().await;
    client
        .write_all(format!("CONNECT mixed.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut client).await.starts_with("HTTP/1.1 200 "));
    client.write_all(b"x").await.unwrap();
    assert_eq!(read_exact(&mut client, 1).await, b"x");
    assert_eq!(proxy.last_decision().address, Some(upstream));
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_proxy_headers() {
    // An upstream that answers with the request head it received.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let body = read_exact_owned(&mut stream, 5).await;
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            head.len() + body.len()
        );
        stream.write_all(reply.as_bytes()).await.unwrap();
        stream.write_all(&head).await.unwrap();
        stream.write_all(&body).await.unwrap();
    });

    let resolver = MapResolver::new(&[("web.test", &["127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&format!("web.test:{port}")],
        resolver,
    )))
    .await;
    let request = format!(
        "POST http://web.test:{port}/path?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\n\
         Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\
         Connection: keep-alive\r\nUser-Agent: egress-test\r\nContent-Length: 5\r\n\r\nhello"
    );
    let answer = proxy.ask(request.as_bytes()).await;
    upstream.await.unwrap();
    assert_eq!(status(&answer), "HTTP/1.1 200 OK", "{answer}");
    let (_, seen) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        seen.starts_with(&format!(
            "POST /path?q=1 HTTP/1.1\r\nHost: web.test:{port}\r\n"
        )),
        "{seen}"
    );
    assert!(seen.contains("User-Agent: egress-test\r\n"), "{seen}");
    assert!(seen.contains("Content-Length: 5\r\n"), "{seen}");
    assert!(seen.contains("Connection: close\r\n"), "{seen}");
    assert!(!seen.to_ascii_lowercase().contains("proxy-"), "{seen}");
    assert!(!seen.contains("keep-alive"), "{seen}");
    assert!(seen.ends_with("\r\n\r\nhello"), "{seen}");
    assert!(proxy.last_decision().allowed());
}

/// An upstream that takes one connection, reads one request head and `body` more bytes,
/// answers `ok` without closing, and then reports every further byte that reaches it before
/// a pause: what a keep-alive server that ignores `Connection: close` would serve next.
async fn one_request_upstream(body: usize) -> (u16, tokio::task::JoinHandle<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let mut request = String::from_utf8(head).unwrap();
        request.push_str(&String::from_utf8(read_exact_owned(&mut stream, body).await).unwrap());
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        let mut more = vec![0u8; 4096];
        let extra = match timeout(Duration::from_millis(300), stream.read(&mut more)).await {
            Ok(Ok(n)) => more[..n].to_vec(),
            _ => Vec::new(),
        };
        (request, extra)
    });
    (port, task)
}

#[tokio::test]
async fn plain_http_carries_one_request_per_connection() {
    // A second request after the first one's body (pipelined, or smuggled past a length)
    // names a host the allowlist refuses: it must never reach the first request's upstream.
    let smuggled = "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    for (first, body) in [
        (
            "GET http://web.test:PORT/ HTTP/1.1\r\nHost: web.test\r\n\r\n",
            "",
        ),
        (
            "POST http://web.test:PORT/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            "hello",
        ),
        (
            "POST http://web.test:PORT/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        ),
    ] {
        let (port, upstream) = one_request_upstream(body.len()).await;
        let resolver =
            MapResolver::new(&[("web.test", &["127.0.0.1"]), ("evil.test", &["127.0.0.1"])]);
        let proxy = Proxy::start(with_loopback_exception(policy(
            &[&format!("web.test:{port}")],
            resolver,
        )))
        .await;
        let mut client = proxy.connect().await;
        let request = format!("{}{smuggled}", first.replace("PORT", &port.to_string()));
        client.write_all(request.as_bytes()).await.unwrap();
        let (seen, extra) = upstream.await.unwrap();
        assert!(seen.ends_with(body), "{seen}");
        assert!(
            extra.is_empty(),
            "the upstream got a second request: {}",
            String::from_utf8_lossy(&extra)
        );
        let answer = read_to_end(&mut client).await;
        assert_eq!(answer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        assert_eq!(proxy.decisions().len(), 1, "{:?}", proxy.decisions());
    }
}

#[tokio::test]
async fn plain_http_with_ambiguous_framing_is_refused_unconnected() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let resolver = MapResolver::new(&[("web.test", &["127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&format!("web.test:{port}")],
        resolver,
    )))
    .await;
    for framing in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 5",
        "Content-Length: 5\r\nContent-Length: 6",
        "Transfer-Encoding: chunked, identity",
    ] {
        let request = format!(
            "POST http://web.test:{port}/ HTTP/1.1\r\n{framing}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let answer = proxy.ask(request.as_bytes()).await;
        assert_eq!(
            status(&answer),
            "HTTP/1.1 400 Bad Request",
            "{framing}: {answer}"
        );
        assert_eq!(proxy.last_decision().reason, Reason::BadRequest);
    }
    assert_no_connection(&listener).await;
}

async fn read_exact_owned(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await.unwrap();
    buf
}

#[tokio::test]
async fn ports_not_on_the_entry_are_refused() {
    let resolver = MapResolver::new(&[("web.test", &["127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &["web.test"],
        Arc::clone(&resolver),
    )))
    .await;
    let answer = proxy.ask(b"CONNECT web.test:22 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden", "{answer}");
    assert!(
        answer.contains("port 22 is not allowed for web.test"),
        "{answer}"
    );
    assert_eq!(proxy.last_decision().reason, Reason::PortNotAllowed);
    let answer = proxy
        .ask(b"GET http://web.test:8080/ HTTP/1.1\r\n\r\n")
        .await;
    assert_eq!(status(&answer), "HTTP/1.1 403 Forbidden", "{answer}");
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn malformed_and_oversized_heads_get_400() {
    let proxy = Proxy::start(policy(&["web.test"], MapResolver::new(&[]))).await;
    for request in [
        b"HELLO\r\n\r\n".to_vec(),
        b"GET /index.html HTTP/1.1\r\nHost: web.test\r\n\r\n".to_vec(),
        b"CONNECT web.test HTTP/1.1\r\n\r\n".to_vec(),
        b"GET https://web.test/ HTTP/1.1\r\n\r\n".to_vec(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
    ] {
        let answer = proxy.ask(&request).await;
        assert_eq!(
            status(&answer),
            "HTTP/1.1 400 Bad Request",
            "{request:?}: {answer}"
        );
        assert_eq!(proxy.last_decision().reason, Reason::BadRequest);
    }
    let mut oversized = b"GET http://web.test/ HTTP/1.1\r\nX-Padding: ".to_vec();
    oversized.resize(17 * 1024, b'a');
    let answer = proxy.ask(&oversized).await;
    assert_eq!(status(&answer), "HTTP/1.1 400 Bad Request", "{answer}");
    assert!(answer.contains("larger than 16 KiB"), "{answer}");
}

#[tokio::test]
async fn a_slow_head_times_out_with_408() {
    let limits = ProxyLimits {
        head_timeout: Duration::from_millis(200),
        ..ProxyLimits::default()
    };
    let proxy =
        Proxy::start(policy(&["web.test"], MapResolver::new(&[])).with_limits(limits)).await;
    let answer = proxy.ask(b"CONNECT web.test:443 HTTP/1.1\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 408 Request Timeout", "{answer}");
    assert_eq!(proxy.last_decision().reason, Reason::HeadTimeout);
}

#[tokio::test]
async fn resolution_and_connection_failures_are_502() {
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let resolver = MapResolver::new(&[("down.test", &["127.0.0.1"])]);
    let allow = [
        format!("down.test:{closed}"),
        format!("missing.test:{closed}"),
    ];
    let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
    let proxy = Proxy::start(with_loopback_exception(policy(&allow, resolver))).await;

    let answer = proxy
        .ask(format!("CONNECT missing.test:{closed} HTTP/1.1\r\n\r\n").as_bytes())
        .await;
    assert_eq!(status(&answer), "HTTP/1.1 502 Bad Gateway", "{answer}");
    assert!(
        answer.contains("could not resolve missing.test"),
        "{answer}"
    );
    assert_eq!(proxy.last_decision().reason, Reason::ResolveFailed);

    let answer = proxy
        .ask(format!("CONNECT down.test:{closed} HTTP/1.1\r\n\r\n").as_bytes())
        .await;
    assert_eq!(status(&answer), "HTTP/1.1 502 Bad Gateway", "{answer}");
    assert!(
        answer.contains("could not connect to down.test"),
        "{answer}"
    );
    assert_eq!(proxy.last_decision().reason, Reason::ConnectFailed);
}

#[tokio::test]
async fn connections_past_the_cap_get_503() {
    let upstream = echo_upstream().await;
    let port = upstream.port();
    let resolver = MapResolver::new(&[("echo.test", &["127.0.0.1"])]);
    let limits = ProxyLimits {
        max_tunnels: 2,
        ..ProxyLimits::default()
    };
    let proxy = Proxy::start(
        with_loopback_exception(policy(&[&format!("echo.test:{port}")], resolver))
            .with_limits(limits),
    )
    .await;
    let connect = format!("CONNECT echo.test:{port} HTTP/1.1\r\n\r\n");

    let mut open = Vec::new();
    for _ in 0..2 {
        let mut client = proxy.connect().await;
        client.write_all(connect.as_bytes()).await.unwrap();
        assert!(read_head(&mut client).await.starts_with("HTTP/1.1 200 "));
        open.push(client);
    }
    let answer = proxy.ask(connect.as_bytes()).await;
    assert_eq!(
        status(&answer),
        "HTTP/1.1 503 Service Unavailable",
        "{answer}"
    );
    assert!(answer.contains("2 connections"), "{answer}");
    assert_eq!(proxy.last_decision().reason, Reason::Busy);

    // Closing a tunnel frees its slot (once the proxy has seen the close).
    drop(open.pop());
    let mut freed = false;
    for _ in 0..50 {
        let mut client = proxy.connect().await;
        client.write_all(connect.as_bytes()).await.unwrap();
        if read_head(&mut client).await.starts_with("HTTP/1.1 200 ") {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the slot was not freed");
}

#[tokio::test]
async fn dropping_the_handle_closes_tunnels_and_stops_accepting() {
    let upstream = echo_upstream().await;
    let port = upstream.port();
    let resolver = MapResolver::new(&[("echo.test", &["127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&format!("echo.test:{port}")],
        resolver,
    )))
    .await;
    let mut client = proxy.connect().await;
    client
        .write_all(format!("CONNECT echo.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut client).await.starts_with("HTTP/1.1 200 "));

    let addr = proxy.addr;
    drop(proxy);
    let mut buf = [0u8; 16];
    let read = timeout(WAIT, client.read(&mut buf))
        .await
        .expect("tunnel closed in time");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test]
async fn shutdown_waits_for_tunnels_to_close() {
    let upstream = echo_upstream().await;
    let port = upstream.port();
    let resolver = MapResolver::new(&[("echo.test", &["127.0.0.1"])]);
    let proxy = Proxy::start(with_loopback_exception(policy(
        &[&format!("echo.test:{port}")],
        resolver,
    )))
    .await;
    let mut client = proxy.connect().await;
    client
        .write_all(format!("CONNECT echo.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut client).await.starts_with("HTTP/1.1 200 "));
    timeout(WAIT, proxy.handle.shutdown())
        .await
        .expect("shutdown in time");
    let mut buf = [0u8; 16];
    let read = timeout(WAIT, client.read(&mut buf))
        .await
        .expect("tunnel closed in time");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
