//! The shared HTTP layer with a front that is not MCP: an E2B-style REST route that takes its
//! key from `X-API-KEY` or a bearer token, mounted beside a second front, served by the
//! shared listener over real TCP on loopback. Authentication, rates, connection caps,
//! `/healthz` and `/metrics` hold for it as they do for `/mcp`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::http::{HeaderName, Method};
use axum::routing::{get, post};
use runbox_http::{
    AuthFailure, Authenticator, Caller, ConnectionLimits, Front, HttpAuth, Metrics, Shared, Status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Keys `key-NAME` stand for tenant NAME; `slow-NAME` too, with a rate of its own.
struct Keys;

#[async_trait::async_trait]
impl Authenticator for Keys {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthFailure> {
        if let Some(name) = token.strip_prefix("key-") {
            return Ok(Caller::new(name));
        }
        if let Some(name) = token.strip_prefix("slow-") {
            let mut caller = Caller::new(name);
            caller.requests_per_minute = Some(1);
            return Ok(caller);
        }
        Err(AuthFailure::Invalid("unknown key".into()))
    }
}

struct TwoSandboxes;

impl Status for TwoSandboxes {
    fn health(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("backend".into(), "test".into());
        m.insert("sandboxes".into(), 2.into());
        m
    }

    fn census(&self) -> runbox_core::Census {
        runbox_core::Census {
            idle: 2,
            ..Default::default()
        }
    }
}

/// Who the caller is, as the front sees it.
async fn whoami(Extension(caller): Extension<Caller>) -> String {
    caller.tenant
}

struct Server {
    base: String,
    addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

async fn start(limits: ConnectionLimits) -> Server {
    let metrics = Arc::new(Metrics::new());
    let shared = Shared {
        auth: Some(HttpAuth {
            authenticator: Arc::new(Keys),
            authorization_servers: Vec::new(),
            public_url: None,
        }),
        rate_limit: Some(3),
        default_tenant: "local".into(),
        metrics: Arc::clone(&metrics),
        status: Arc::new(TwoSandboxes),
    };
    let api = Front::new(
        axum::Router::new()
            .route("/sandboxes", post(whoami))
            .route("/sandboxes", get(whoami)),
    )
    .key_header(HeaderName::from_static("x-api-key"));
    // A second front that counts only its POSTs, as the MCP front does.
    let other = Front::new(axum::Router::new().route("/other", get(whoami).post(whoami)))
        .rate_counts(|m| m == Method::POST);
    let app = runbox_http::app(&shared, vec![api, other]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let done = tokio::spawn(runbox_http::serve(
        listener,
        app,
        limits,
        metrics,
        shutdown.clone(),
    ));
    Server {
        base: format!("http://{addr}"),
        addr,
        shutdown,
        done,
    }
}

#[tokio::test]
async fn a_rest_front_gets_the_shared_auth_rates_health_and_metrics() {
    let s = start(ConnectionLimits::default()).await;
    let http = reqwest::Client::new();

    // /healthz and /metrics need no key.
    let health: serde_json::Value = serde_json::from_str(
        &http
            .get(format!("{}/healthz", s.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        health,
        serde_json::json!({"status": "ok", "backend": "test", "sandboxes": 2})
    );

    // No key, or a wrong one: 401 with a Bearer challenge, saying which headers are read.
    let r = http
        .post(format!("{}/sandboxes", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert!(r.text().await.unwrap().contains("x-api-key"));
    let r = http
        .post(format!("{}/sandboxes", s.base))
        .header("X-API-KEY", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // The key from X-API-KEY or from a bearer token: the same caller.
    for (name, value) in [
        ("X-API-KEY", "key-alice"),
        ("Authorization", "Bearer key-alice"),
    ] {
        let r = http
            .post(format!("{}/sandboxes", s.base))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{name}");
        assert_eq!(r.text().await.unwrap(), "alice");
    }
    // A front without the key header reads only the bearer token.
    let r = http
        .get(format!("{}/other", s.base))
        .header("X-API-KEY", "key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // The rate: 3 a minute for alice, every request of this front counted (a GET too), and
    // one bucket per tenant across fronts.
    let r = http
        .get(format!("{}/sandboxes", s.base))
        .header("X-API-KEY", "key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(format!("{}/sandboxes", s.base))
        .header("X-API-KEY", "key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // The other front counts only POSTs: its GET passes, its POST is refused.
    let r = http
        .get(format!("{}/other", s.base))
        .bearer_auth("key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .post(format!("{}/other", s.base))
        .bearer_auth("key-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // Bob has a bucket of his own, and a token's own rate wins over the server's.
    let r = http
        .post(format!("{}/sandboxes", s.base))
        .header("X-API-KEY", "slow-bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "bob");
    let r = http
        .post(format!("{}/sandboxes", s.base))
        .header("X-API-KEY", "slow-bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);

    let text = http
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "runbox_rejected_requests_total{reason=\"unauthenticated\"} 3",
        "runbox_rejected_requests_total{reason=\"rate_limited\"} 3",
        "runbox_sandboxes{state=\"idle\"} 2",
        "runbox_http_connections ",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }

    s.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), s.done)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn the_connection_caps_hold_for_every_front() {
    let s = start(ConnectionLimits {
        max_connections_per_address: 1,
        ..ConnectionLimits::default()
    })
    .await;
    // The first connection is accepted first, and served.
    let mut first = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    first.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    // While it stays open, a second one from the same address is refused at once.
    let mut second = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut answer = String::new();
    second.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop(first);
    s.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), s.done)
        .await
        .unwrap()
        .unwrap();
}
