//! Authentication, tenants, quotas, rate limits, the audit log and metrics of `runbox serve
//! --http`, through real MCP clients and raw HTTP against the real server with real
//! sandboxes: tokens made with `runbox token add`, revoked with `runbox token revoke`, and
//! OAuth access tokens signed in the test and checked against a JWKS it serves on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::ReadResourceRequestParams;
use serde_json::{Value, json};
use util::mcp::*;

async fn client_with(server: &HttpServer, token: &str, revision: Revision) -> Client {
    client_with_token(&server.url, token, revision).await
}

/// A raw JSON-RPC POST to /mcp with an optional `Authorization` value.
async fn post(server: &HttpServer, authorization: Option<&str>) -> reqwest::Response {
    let mut req = http()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    req.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The value of one series in a metrics text, 0 when absent.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A tool's error text with `id` replaced, so that answers about two ids compare.
async fn error_text(client: &Client, tool: &str, args: Value, id: &str) -> String {
    let r = call(client, tool, args).await;
    assert!(is_error(&r), "{tool} should fail: {}", text(&r));
    text(&r).replace(id, "ID")
}

/// Every tool that takes a sandbox id, with arguments naming `id`.
fn calls_on(id: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("run_code", json!({"sandbox_id": id, "code": "x"})),
        ("run_command", json!({"sandbox_id": id, "command": "ls"})),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "sleep 1", "background": true}),
        ),
        ("get_sandbox_status", json!({"sandbox_id": id})),
        ("list_files", json!({"sandbox_id": id})),
        (
            "read_file",
            json!({"sandbox_id": id, "path": "/workspace/secret.txt"}),
        ),
        (
            "write_file",
            json!({"sandbox_id": id, "path": "/workspace/secret.txt", "content": "mine"}),
        ),
        (
            "read_process_output",
            json!({"sandbox_id": id, "process_id": "proc_1"}),
        ),
        (
            "kill_process",
            json!({"sandbox_id": id, "process_id": "proc_1"}),
        ),
        ("pause_sandbox", json!({"sandbox_id": id})),
        ("resume_sandbox", json!({"sandbox_id": id})),
        (
            "set_sandbox_timeout",
            json!({"sandbox_id": id, "timeout_seconds": 5}),
        ),
        (
            "install_packages",
            json!({"sandbox_id": id, "packages": ["tabulate"]}),
        ),
        ("close_sandbox", json!({"sandbox_id": id})),
    ]
}

#[tokio::test]
async fn tokens_tenants_quotas_revocation_audit_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let audit = dir.path().join("audit.jsonl");
    let alice = add_token(&file, "alice", &[]);
    let bob = add_token(&file, "bob-laptop", &["--tenant", "bob"]);
    let carol = add_token(&file, "carol", &["--max-sandboxes", "1"]);
    let listed = token_cmd(&["list", "--file", file.to_str().unwrap()]);
    for expected in ["alice", "bob-laptop", "bob", "max_sandboxes=1"] {
        assert!(listed.contains(expected), "{listed}");
    }
    for token in [&alice, &bob, &carol] {
        assert!(!listed.contains(token.as_str()), "list shows a token");
    }
    assert!(!std::fs::read_to_string(&file).unwrap().contains(&alice));

    let server = HttpServer::start(&[
        "--tokens",
        file.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
        "--pool",
        "0",
    ])
    .await;

    // Without a token, or with a wrong one: 401 and a Bearer challenge.
    let r = post(&server, None).await;
    assert_eq!(r.status(), 401);
    assert_eq!(header(&r, "www-authenticate"), "Bearer realm=\"runbox\"");
    let wrong = format!("rbx_{}", "A".repeat(43));
    for bad in [
        format!("Bearer {wrong}"),
        "Bearer not-a-token".to_owned(),
        format!("Basic {alice}"),
        format!("Bearer {alice}x"),
    ] {
        let r = post(&server, Some(&bad)).await;
        assert_eq!(r.status(), 401, "{bad}");
        assert!(
            header(&r, "www-authenticate").starts_with("Bearer "),
            "{bad}"
        );
    }
    let r = post(&server, Some(&format!("Bearer {wrong}"))).await;
    assert!(
        header(&r, "www-authenticate").contains("error=\"invalid_token\""),
        "{}",
        header(&r, "www-authenticate")
    );
    // The right token gets through (ping needs no session in either revision's eyes of
    // the auth layer: anything but 401).
    assert_ne!(
        post(&server, Some(&format!("Bearer {alice}")))
            .await
            .status(),
        401
    );
    // Health and metrics need no token.
    assert_eq!(server.get("/healthz").await.status(), 200);

    // Alice's sandbox, with state and a file.
    let a = client_with(&server, &alice, Revision::Stateless).await;
    let r = call(&a, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(&a, "run_code", json!({"sandbox_id": id, "code": "x = 41"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &a,
        "write_file",
        json!({"sandbox_id": id, "path": "/workspace/secret.txt", "content": "alice's"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));

    // Bob (another tenant) gets, for every tool, the answer an id that never existed gets.
    let b = client_with(&server, &bob, Revision::Legacy).await;
    let never = "sbx_0123456789abcdef0123456789abcdef";
    for ((tool, on_alices), (_, on_never)) in calls_on(&id).into_iter().zip(calls_on(never)) {
        let theirs = error_text(&b, tool, on_alices, &id).await;
        let nothing = error_text(&b, tool, on_never, never).await;
        assert_eq!(
            theirs, nothing,
            "{tool} tells another tenant's sandbox apart"
        );
    }
    let listed = call(&b, "list_sandboxes", json!({})).await;
    assert!(!text(&listed).contains(&id), "{}", text(&listed));
    assert_eq!(structured(&listed)["sandboxes"], json!([]));
    for (target, name) in [(&id, "theirs"), (&never.to_owned(), "never")] {
        let e = b
            .read_resource(ReadResourceRequestParams::new(format!(
                "sandbox://{target}/files/workspace/secret.txt"
            )))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not found"), "{name}: {e}");
        assert!(!e.contains("alice"), "{name}: {e}");
    }
    // Alice's sandbox is untouched by all of that.
    let r = call(&a, "run_code", json!({"sandbox_id": id, "code": "x + 1"})).await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    let r = call(
        &a,
        "read_file",
        json!({"sandbox_id": id, "path": "/workspace/secret.txt"}),
    )
    .await;
    assert!(text(&r).contains("alice's"), "{}", text(&r));
    let content = a
        .read_resource(ReadResourceRequestParams::new(format!(
            "sandbox://{id}/files/workspace/secret.txt"
        )))
        .await
        .unwrap();
    assert!(format!("{content:?}").contains("alice's"));

    // Carol may hold one sandbox.
    let c = client_with(&server, &carol, Revision::Stateless).await;
    let r = call(&c, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&c, "create_sandbox", json!({})).await;
    assert!(is_error(&r));
    assert!(
        text(&r).contains("most one tenant may hold"),
        "{}",
        text(&r)
    );
    assert!(text(&r).contains("(1)"), "{}", text(&r));
    // Alice is not limited by Carol's quota.
    let r = call(&a, "run_code", json!({"code": "print(6 * 7)"})).await;
    assert!(text(&r).contains("42"), "{}", text(&r));

    // Revoking Bob's token locks him out at once, with no restart; Alice goes on.
    token_cmd(&["revoke", "bob-laptop", "--file", file.to_str().unwrap()]);
    let r = post(&server, Some(&format!("Bearer {bob}"))).await;
    assert_eq!(r.status(), 401);
    assert!(
        b.list_tools(None).await.is_err(),
        "a revoked token still works"
    );
    let r = call(&a, "run_code", json!({"sandbox_id": id, "code": "x"})).await;
    assert!(text(&r).contains("41"), "{}", text(&r));

    // The audit log: one line per call, with the tenant, and no code.
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let created = lines
        .iter()
        .find(|l| l["tool"] == "create_sandbox" && l["tenant"] == "alice")
        .expect("alice's create_sandbox is audited");
    assert_eq!(created["sandbox_id"], id.as_str());
    assert_eq!(created["outcome"], "ok");
    assert!(created["duration_ms"].as_f64().unwrap() > 0.0);
    assert!(created["time"].as_str().unwrap().ends_with('Z'));
    let bobs = lines.iter().filter(|l| l["tenant"] == "bob").count();
    assert_eq!(bobs, calls_on(&id).len() * 2 + 1, "every call of bob's");
    assert!(
        lines
            .iter()
            .filter(|l| l["tenant"] == "bob" && l["tool"] != "list_sandboxes")
            .all(|l| l["outcome"] == "error")
    );
    assert!(lines.iter().all(|l| l.get("code").is_none()));
    let refused = lines
        .iter()
        .filter(|l| l["tenant"] == "carol" && l["outcome"] == "error")
        .count();
    assert_eq!(refused, 1);

    // The metrics saw all of it.
    let m = server.metrics().await;
    assert!(
        series(
            &m,
            "runbox_rejected_requests_total{reason=\"unauthenticated\"}"
        ) >= 7.0,
        "{m}"
    );
    assert_eq!(
        series(
            &m,
            "runbox_rejected_requests_total{reason=\"tenant_sandboxes\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(
        series(&m, "runbox_runs_total{language=\"python\",outcome=\"ok\"}") >= 4.0,
        "{m}"
    );
    assert!(
        series(&m, "runbox_run_duration_seconds_count{language=\"python\"}") >= 4.0,
        "{m}"
    );
    assert_eq!(series(&m, "runbox_sandboxes{state=\"idle\"}"), 2.0, "{m}");
    assert!(
        series(
            &m,
            "runbox_tool_calls_total{tool=\"get_sandbox_status\",outcome=\"error\"}"
        ) >= 2.0,
        "{m}"
    );
    a.cancel().await.unwrap();
    c.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_past_its_rate_gets_429_with_retry_after_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let slow = add_token(&file, "slow", &["--requests-per-minute", "3"]);
    let other = add_token(&file, "other", &[]);
    let server = HttpServer::start(&[
        "--tokens",
        file.to_str().unwrap(),
        "--rate-limit",
        "1000",
        "--pool",
        "0",
    ])
    .await;
    let auth = format!("Bearer {slow}");
    for i in 0..3 {
        let r = post(&server, Some(&auth)).await;
        assert_ne!(r.status(), 429, "request {i} is within the rate");
    }
    let r = post(&server, Some(&auth)).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("3 requests a minute"),
        "{body}"
    );
    // Another tenant has its own bucket, at the server's default rate.
    for _ in 0..5 {
        assert_ne!(
            post(&server, Some(&format!("Bearer {other}")))
                .await
                .status(),
            429
        );
    }
    // A wrong token is refused before any rate is counted.
    let r = post(&server, Some("Bearer rbx_nope")).await;
    assert_eq!(r.status(), 401);
    let m = server.metrics().await;
    assert_eq!(
        series(
            &m,
            "runbox_rejected_requests_total{reason=\"rate_limited\"}"
        ),
        1.0,
        "{m}"
    );
    server.stop().await;
}

#[tokio::test]
async fn no_tenant_takes_every_place_and_paused_sandboxes_do_not_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let alice = add_token(&file, "alice", &[]);
    let bob = add_token(&file, "bob", &[]);
    // Four places, so a tenant may hold one of them by default; a pause lasts a second.
    let server = HttpServer::start(&[
        "--tokens",
        file.to_str().unwrap(),
        "--pool",
        "0",
        "--max-sandboxes",
        "4",
        "--pause-timeout",
        "1",
    ])
    .await;
    let a = client_with(&server, &alice, Revision::Stateless).await;
    let r = call(&a, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let tag = util::canary("paused");
    let r = call(
        &a,
        "run_command",
        json!({"sandbox_id": id, "command": format!("exec -a {tag} sleep 1000"), "background": true}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&a, "pause_sandbox", json!({"sandbox_id": id})).await;
    let paused = !is_error(&r);
    if paused {
        assert!(text(&r).contains("when it is closed"), "{}", text(&r));
    } else {
        eprintln!("no freezer here, the pause part is skipped: {}", text(&r));
    }
    // Paused or not, the sandbox holds alice's one place ...
    let r = call(&a, "create_sandbox", json!({})).await;
    assert!(is_error(&r), "a second sandbox for alice: {}", text(&r));
    assert!(
        text(&r).contains("the most one tenant may hold at once (1)"),
        "{}",
        text(&r)
    );
    // ... but not the server's others.
    let b = client_with(&server, &bob, Revision::Legacy).await;
    let r = call(&b, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    if paused {
        // A second past its pause, the sandbox is closed, everything in it ended, and alice
        // has her place back.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let r = call(&a, "list_sandboxes", json!({})).await;
            if structured(&r)["sandboxes"] == json!([]) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a paused sandbox outlived its pause timeout: {}",
                text(&r)
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(util::host_processes_with(&tag), Vec::<i32>::new());
        let r = call(&a, "create_sandbox", json!({})).await;
        assert!(!is_error(&r), "{}", text(&r));
    }
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    server.stop().await;
}

/// A signing key made for the test: Ed25519 from 32 random bytes (PKCS#8 v1 is a fixed
/// 16-byte header and the seed), with its public JWK.
struct Key {
    encoding: jsonwebtoken::EncodingKey,
    jwk: Value,
}

impl Key {
    fn new(kid: &str) -> Self {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).unwrap();
        der.extend_from_slice(&seed);
        let encoding = jsonwebtoken::EncodingKey::from_ed_der(&der);
        let mut jwk =
            jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, jsonwebtoken::Algorithm::EdDSA)
                .unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        Self {
            encoding,
            jwk: serde_json::to_value(&jwk).unwrap(),
        }
    }

    fn sign(&self, kid: &str, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

/// An authorization server's metadata and JWKS, served on loopback.
async fn identity_provider(key: &Key) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let metadata = json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/jwks"),
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "response_types_supported": ["code"],
    });
    let jwks = Arc::new(json!({ "keys": [key.jwk] }));
    let app = axum::Router::new()
        .route(
            "/.well-known/oauth-authorization-server",
            axum::routing::get(move || async move { axum::Json(metadata) }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || async move { axum::Json((*jwks).clone()) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    issuer
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn oauth_access_tokens_are_checked_against_the_issuers_keys() {
    let key = Key::new("k1");
    let issuer = identity_provider(&key).await;
    let audience = "https://runbox.test/mcp";
    let server = HttpServer::start(&[
        "--oauth-issuer",
        &issuer,
        "--oauth-audience",
        audience,
        "--pool",
        "0",
    ])
    .await;
    let claims = |sub: &str, aud: &str, exp: u64| json!({"iss": issuer, "aud": aud, "sub": sub, "exp": exp, "iat": now()});

    // The protected-resource metadata, and a challenge that points to it.
    let prm: Value = server
        .get("/.well-known/oauth-protected-resource/mcp")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(prm["authorization_servers"], json!([issuer]));
    assert_eq!(prm["resource"], format!("{}/mcp", server.base));
    let r = post(&server, None).await;
    assert_eq!(r.status(), 401);
    assert!(
        header(&r, "www-authenticate").contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            server.base
        )),
        "{}",
        header(&r, "www-authenticate")
    );

    // Refused: expired, for another audience, from another issuer, signed by another key.
    let forged = Key::new("k1");
    for (why, token, says) in [
        (
            "expired",
            key.sign("k1", &claims("u1", audience, now() - 3600)),
            "expired",
        ),
        (
            "wrong audience",
            key.sign("k1", &claims("u1", "https://other.test/mcp", now() + 600)),
            "audience",
        ),
        (
            "wrong signature",
            forged.sign("k1", &claims("u1", audience, now() + 600)),
            "signature",
        ),
        (
            "unknown key",
            key.sign("k2", &claims("u1", audience, now() + 600)),
            "key",
        ),
    ] {
        let r = post(&server, Some(&format!("Bearer {token}"))).await;
        assert_eq!(r.status(), 401, "{why}");
        let challenge = header(&r, "www-authenticate");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{why}: {challenge}"
        );
        assert!(
            challenge.to_lowercase().contains(says),
            "{why}: {challenge}"
        );
    }

    // A good token works, and its subject is the tenant.
    let u1 = client_with(
        &server,
        &key.sign("k1", &claims("u1", audience, now() + 600)),
        Revision::Stateless,
    )
    .await;
    let r = call(&u1, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(&u1, "run_code", json!({"sandbox_id": id, "code": "1 + 1"})).await;
    assert!(text(&r).contains('2'), "{}", text(&r));
    let u2 = client_with(
        &server,
        &key.sign("k1", &claims("u2", audience, now() + 600)),
        Revision::Legacy,
    )
    .await;
    let r = call(&u2, "run_code", json!({"sandbox_id": id, "code": "1"})).await;
    assert!(is_error(&r));
    assert!(text(&r).contains("not found"), "{}", text(&r));
    let listed = call(&u1, "list_sandboxes", json!({})).await;
    assert!(text(&listed).contains(&id), "{}", text(&listed));
    u1.cancel().await.unwrap();
    u2.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_one_shot_run_is_not_held_against_the_tenants_sandbox_quota() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--max-sandboxes-per-tenant", "1"],
        Revision::Stateless,
    )
    .await;
    let r = call(&client, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    // The tenant holds its one sandbox; a run without an id still gets a sandbox of its own.
    let r = call(&client, "run_code", json!({"code": "print(6 * 7)"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "42\n", "{}", text(&r));
    assert_eq!(structured(&r)["ephemeral"], true);
    let r = call(&client, "run_command", json!({"command": "echo one-shot"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    // A second sandbox to keep is still refused, and says why in a sentence.
    let r = call(&client, "create_sandbox", json!({})).await;
    assert!(is_error(&r));
    assert!(
        text(&r).contains("you hold 1 sandbox, the most one tenant may hold at once (1)"),
        "{}",
        text(&r)
    );
    client.cancel().await.unwrap();
}
