//! Drives the fake with plain reqwest: well-formed flows stay clean, the recorded SDK
//! traffic replays clean, breaches are caught, chunking/faults/paging/scoping work.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use runbox_e2b_fake::{
    Chunking, CommandReply, ExecReply, Fake, FakeConfig, Fault, FaultKind, Provider, Surface,
    sdk_requests,
};
use serde_json::{Value, json};

const KEY: &str = "e2b_test_key";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn fake_with(provider: Provider, chunking: Chunking) -> Fake {
    Fake::start(FakeConfig {
        provider,
        api_keys: vec![KEY.into(), "key_b".into()],
        chunking,
    })
    .await
}

fn envelope(v: &Value) -> Vec<u8> {
    let payload = serde_json::to_vec(v).unwrap();
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

fn parse_envelopes(mut b: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        assert!(b.len() >= 5, "truncated envelope header");
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        out.push((b[0], serde_json::from_slice(&b[5..5 + len]).unwrap()));
        b = &b[5 + len..];
    }
    out
}

/// Reads a whole body, returning it and the number of HTTP chunks it came in.
async fn read_all(mut resp: reqwest::Response) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut chunks = 0;
    while let Some(c) = resp.chunk().await.unwrap() {
        chunks += 1;
        out.extend_from_slice(&c);
    }
    (out, chunks)
}

async fn create(fake: &Fake, key: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}/sandboxes", fake.api_url()))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// `GET /sandboxes/{id}` with `key`.
async fn get_sandbox(fake: &Fake, key: &str, id: &str) -> reqwest::Response {
    client()
        .get(format!("{}/sandboxes/{id}", fake.api_url()))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
}

async fn create_ok(fake: &Fake) -> Value {
    let resp = create(
        fake,
        KEY,
        json!({"templateID": "code-interpreter-v1", "timeout": 300, "metadata": {"owner": "mcp"}}),
    )
    .await;
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

fn sandbox_url(fake: &Fake, port: u16, id: &str, rest: &str) -> String {
    fake.sandbox_url()
        .replace("{port}", &port.to_string())
        .replace("{sandbox_id}", id)
        + rest
}

/// An envd request with the E2B headers.
fn envd(fake: &Fake, id: &str, token: &str, rest: &str) -> reqwest::RequestBuilder {
    client()
        .post(sandbox_url(fake, 49983, id, rest))
        .header("x-access-token", token)
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
}

fn start_req(fake: &Fake, id: &str, token: &str, cmd: &str) -> reqwest::RequestBuilder {
    envd(fake, id, token, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("connect-content-encoding", "identity")
        .header("connect-accept-encoding", "identity")
        .header("keepalive-ping-interval", "50")
        .header("authorization", "Basic dXNlcjo=")
        .body(envelope(&json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": {}, "cwd": "/home/user"},
            "stdin": false
        })))
}

fn unary_req(
    fake: &Fake,
    id: &str,
    token: &str,
    method: &str,
    body: Value,
) -> reqwest::RequestBuilder {
    envd(fake, id, token, method)
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .header("content-encoding", "identity")
        .header("connect-timeout-ms", "60000")
        .body(body.to_string())
}

fn execute_req(fake: &Fake, id: &str, token: &str, body: Value) -> reqwest::RequestBuilder {
    client()
        .post(sandbox_url(fake, 49999, id, "/execute"))
        .header("x-access-token", token)
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49999")
        .json(&body)
}

#[tokio::test]
async fn well_formed_flow_is_clean() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    let sb = create_ok(&fake).await;
    assert_eq!(sb["sandboxID"], "sbx1");
    assert_eq!(sb["envdAccessToken"], "envd-tok-1");
    assert_eq!(sb["envdVersion"], "0.5.7");
    assert_eq!(sb["unknownFutureField"], 1);
    let (id, tok) = ("sbx1", "envd-tok-1");

    // A command.
    fake.on_command(
        "echo hi; echo err >&2; exit 3",
        CommandReply::exit(3, "hi\n", "err\n"),
    );
    let resp = start_req(&fake, id, tok, "echo hi; echo err >&2; exit 3")
        .header("connect-timeout-ms", "60000")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/connect+json");
    let (body, _) = read_all(resp).await;
    let msgs = parse_envelopes(&body);
    assert_eq!(msgs[0], (0, json!({"event": {"start": {"pid": 100}}})));
    assert_eq!(msgs[1], (0, json!({"event": {"data": {"stdout": "aGkK"}}})));
    assert_eq!(
        msgs[2],
        (0, json!({"event": {"data": {"stderr": "ZXJyCg=="}}}))
    );
    assert_eq!(
        msgs[3],
        (
            0,
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"}}})
        )
    );
    assert_eq!(msgs[4], (2, json!({})));

    // exit 0: exitCode omitted.
    fake.on_command("true", CommandReply::ok(""));
    let (body, _) = read_all(start_req(&fake, id, tok, "true").send().await.unwrap()).await;
    let msgs = parse_envelopes(&body);
    assert_eq!(msgs[0].1["event"]["start"]["pid"], 101);
    assert_eq!(
        msgs[1].1,
        json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
    );

    // Unscripted: exit 127.
    let (body, _) = read_all(start_req(&fake, id, tok, "nope").send().await.unwrap()).await;
    let msgs = parse_envelopes(&body);
    let err = base64::engine::general_purpose::STANDARD
        .decode(msgs[1].1["event"]["data"]["stderr"].as_str().unwrap())
        .unwrap();
    assert_eq!(err, b"fake: no script for nope\n");
    assert_eq!(msgs[2].1["event"]["end"]["exitCode"], 127);

    // Upload (multipart), ListDir, download, Stat of a missing file.
    let boundary = "b0undary";
    let mp = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\nContent-Type: text/plain\r\n\r\nabc\r\n--{boundary}--\r\n"
    );
    let resp = envd(&fake, id, tok, "/files?path=%2Fhome%2Fuser%2Fa.txt")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(mp)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v,
        json!([{"path": "/home/user/a.txt", "name": "a.txt", "type": "file"}])
    );
    // Raw octet-stream upload into a new directory.
    let resp = envd(&fake, id, tok, "/files?path=d%2Fb.bin")
        .header("content-type", "application/octet-stream")
        .body(vec![0u8, 1, 2])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(fake.file(id, "/home/user/d/b.bin").unwrap(), vec![0, 1, 2]);

    let resp = unary_req(
        &fake,
        id,
        tok,
        "/filesystem.Filesystem/ListDir",
        json!({"path": "/home/user", "depth": 1}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["name"], "a.txt");
    assert_eq!(entries[0]["size"], "3");
    assert_eq!(entries[0]["type"], "FILE_TYPE_FILE");
    assert_eq!(entries[1]["type"], "FILE_TYPE_DIRECTORY");

    let resp = client()
        .get(sandbox_url(
            &fake,
            49983,
            id,
            "/files?path=%2Fhome%2Fuser%2Fa.txt",
        ))
        .header("x-access-token", tok)
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), b"abc");

    let resp = unary_req(
        &fake,
        id,
        tok,
        "/filesystem.Filesystem/Stat",
        json!({"path": "missing"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], "not_found");

    // Code.
    fake.on_execute("1+1", ExecReply::result("2"));
    let resp = execute_req(
        &fake,
        id,
        tok,
        json!({"code": "1+1", "context_id": null, "language": null, "env_vars": {"X": "y"}}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(read_all(resp).await.0).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        r#"{"type": "number_of_executions", "execution_count": 1}"#
    );
    let result: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(result["text"], "2");
    assert_eq!(lines[2], r#"{"type": "end_of_execution"}"#);
    assert!(text.ends_with('\n'));

    // Timeout, info, delete.
    let c = client();
    let resp = c
        .post(format!("{}/sandboxes/sbx1/timeout", fake.api_url()))
        .header("x-api-key", KEY)
        .json(&json!({"timeout": 900}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(fake.sandboxes()[0].timeout_secs, 900);
    let resp = get_sandbox(&fake, KEY, "sbx1").await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["state"], "running");
    assert_eq!(v["cpuCount"], 2);
    assert_eq!(v["metadata"], json!({"owner": "mcp"}));
    assert!(v["endAt"].as_str().unwrap().ends_with('Z'));
    let resp = c
        .delete(format!("{}/sandboxes/sbx1", fake.api_url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert!(fake.sandboxes().is_empty());
    // Gone: 404 on the control plane, a proxy 502 on envd. Not violations.
    let resp = c
        .delete(format!("{}/sandboxes/sbx1", fake.api_url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = start_req(&fake, id, tok, "true").send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("was not found"));

    fake.assert_clean();
    assert_eq!(
        fake.executions(),
        vec![("sbx1".into(), fake_ctx(&fake), "python".into(), 1)]
    );
}

fn fake_ctx(fake: &Fake) -> String {
    fake.executions()[0].1.clone()
}

async fn replay(provider: Provider, key: &str) -> Fake {
    let fake = Fake::start(FakeConfig {
        provider,
        api_keys: vec![key.into()],
        chunking: Chunking::Whole,
    })
    .await;
    let c = client();
    for r in sdk_requests(provider) {
        let url = if r.is_api() {
            format!("{}{}", fake.api_url(), r.path)
        } else {
            sandbox_url(&fake, r.sandbox_port(), "sbx1", &r.path)
        };
        let mut body = r.body.clone();
        if r.path == "/process.Process/Start" && body.is_empty() {
            // The recorder could not capture E2B's streamed body: same message as Novita's.
            body = envelope(
                &json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/home/user"}, "stdin": false}),
            );
        }
        let mut rb = c.request(
            reqwest::Method::from_bytes(r.method.as_bytes()).unwrap(),
            url,
        );
        for (k, v) in &r.headers {
            if matches!(
                k.as_str(),
                "host" | "content-length" | "transfer-encoding" | "connection"
            ) {
                continue;
            }
            let v = if k == "x-access-token" {
                "envd-tok-1"
            } else {
                v.as_str()
            };
            rb = rb.header(k.as_str(), v);
        }
        let resp = rb.body(body).send().await.unwrap();
        assert_ne!(
            resp.status(),
            599,
            "{} {}: {:?}",
            r.method,
            r.path,
            fake.violations()
        );
        read_all(resp).await;
    }
    fake
}

#[tokio::test]
async fn recorded_e2b_sdk_traffic_replays_clean() {
    let fake = replay(Provider::E2b, "e2b_test_key").await;
    assert_eq!(fake.violations(), Vec::<String>::new());
    assert_eq!(fake.requests().len(), 10);
    fake.assert_clean();
}

#[tokio::test]
async fn recorded_novita_sdk_traffic_replays_clean() {
    let fake = replay(Provider::Novita, "sk_test_key").await;
    assert_eq!(fake.violations(), Vec::<String>::new());
    let sb = &fake.sandboxes()[0];
    assert_eq!(sb.envd_access_token.as_deref(), Some("envd-tok-1"));
    assert_eq!(fake.file("sbx1", "/home/user/a.txt").unwrap(), b"abc");
    assert_eq!(fake.executions().len(), 1);
    fake.assert_clean();
}

#[tokio::test]
async fn breaches_are_violations() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    // Create without timeout: still created (15 s), but a violation.
    let resp = create(&fake, KEY, json!({"templateID": "base"})).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(fake.sandboxes()[0].timeout_secs, 15);
    let v = fake.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("without `timeout`"), "{v:?}");

    // Bad envelope length: 599.
    let mut body = envelope(&json!({"process": {"cmd": "ls"}}));
    body[4] += 1;
    let resp = start_req(&fake, "sbx1", "envd-tok-1", "ls")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 599);
    assert!(resp.text().await.unwrap().contains("envelope length"));
    assert!(
        fake.violations()
            .last()
            .unwrap()
            .contains("envelope length")
    );

    // Wrong token: 401 Connect error and a violation.
    let n = fake.violations().len();
    let resp = unary_req(&fake, "sbx1", "wrong", "/process.Process/List", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], "unauthenticated");
    assert_eq!(fake.violations().len(), n + 1);
    assert!(fake.violations()[n].contains("X-Access-Token"));

    // Missing routing header: answered, but a violation.
    let resp = client()
        .post(sandbox_url(&fake, 49983, "sbx1", "/process.Process/List"))
        .header("x-access-token", "envd-tok-1")
        .header("e2b-sandbox-id", "sbx1")
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        fake.violations()
            .last()
            .unwrap()
            .contains("E2b-Sandbox-Port"),
        "{:?}",
        fake.violations()
    );

    // Unknown sandbox, bad port, unknown route, unknown create field, bad proto JSON.
    let n = fake.violations().len();
    let resp = unary_req(
        &fake,
        "sbx9",
        "envd-tok-1",
        "/process.Process/List",
        json!({}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 599);
    let resp = client()
        .get(sandbox_url(&fake, 8080, "sbx1", "/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 599);
    let resp = client()
        .get(format!("{}/nope", fake.api_url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 599);
    let resp = create(
        &fake,
        KEY,
        json!({"templateID": "base", "timeout": 10, "template_id": "x"}),
    )
    .await;
    assert_eq!(resp.status(), 201);
    let resp = unary_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        "/filesystem.Filesystem/ListDir",
        json!({"path": 3}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 599);
    // Execute with both context_id and language: the real 400, and a violation.
    let resp = execute_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        json!({"code": "x", "context_id": "c", "language": "python"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(
        resp.text().await.unwrap(),
        "Only one of context_id or language can be provided"
    );
    assert_eq!(fake.violations().len(), n + 6, "{:?}", fake.violations());

    // Authorization on the control plane.
    let resp = client()
        .get(format!("{}/sandboxes/sbx1", fake.api_url()))
        .header("x-api-key", KEY)
        .header("authorization", "Bearer x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(fake.violations().last().unwrap().contains("Authorization"));
    // Missing key header: 401 and a violation; an unknown key is just 401.
    let resp = client()
        .get(format!("{}/sandboxes/sbx1", fake.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let n = fake.violations().len();
    let resp = get_sandbox(&fake, "other", "sbx1").await;
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], 401);
    assert_eq!(fake.violations().len(), n);
}

#[tokio::test]
async fn bytewise_chunking_still_parses() {
    let fake = fake_with(Provider::E2b, Chunking::Bytewise).await;
    create_ok(&fake).await;
    fake.on_command("echo hi", CommandReply::ok("hi\n").with_keepalives(2));
    let resp = start_req(&fake, "sbx1", "envd-tok-1", "echo hi")
        .send()
        .await
        .unwrap();
    let (body, chunks) = read_all(resp).await;
    assert_eq!(chunks, body.len(), "one byte per chunk");
    let msgs = parse_envelopes(&body);
    assert_eq!(msgs.len(), 6); // start, keepalive, data, keepalive, end, end-stream
    assert_eq!(msgs[1].1, json!({"event": {"keepalive": {}}}));
    assert_eq!(msgs[5].0, 2);

    fake.on_execute("print(1)", ExecReply::stdout("1\n").with_keepalives(1));
    let resp = execute_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        json!({"code": "print(1)", "context_id": null, "language": null, "env_vars": null}),
    )
    .send()
    .await
    .unwrap();
    let (body, chunks) = read_all(resp).await;
    assert!(chunks > 10);
    let text = String::from_utf8(body).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "number_of_executions",
            "keepalive",
            "stdout",
            "end_of_execution"
        ]
    );

    // Plain bodies too.
    let resp = get_sandbox(&fake, KEY, "sbx1").await;
    let (body, chunks) = read_all(resp).await;
    assert_eq!(chunks, body.len());
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["sandboxID"], "sbx1");
    fake.assert_clean();
}

#[tokio::test]
async fn every_n_chunking() {
    let fake = fake_with(Provider::E2b, Chunking::Every(7)).await;
    create_ok(&fake).await;
    fake.on_command("x", CommandReply::ok("0123456789"));
    let resp = start_req(&fake, "sbx1", "envd-tok-1", "x")
        .send()
        .await
        .unwrap();
    let (body, chunks) = read_all(resp).await;
    assert!(chunks > 4);
    assert_eq!(parse_envelopes(&body).len(), 4);
    fake.assert_clean();
}

#[tokio::test]
async fn faults_are_served_and_consumed() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    fake.fail(Fault {
        surface: Surface::Api,
        method: Some(http::Method::POST),
        path_suffix: "/sandboxes".into(),
        times: 2,
        kind: FaultKind::Status {
            status: 429,
            body: r#"{"code":429,"message":"slow down"}"#.into(),
            retry_after: Some(1),
        },
    });
    for _ in 0..2 {
        let resp = create(&fake, KEY, json!({"templateID": "base", "timeout": 60})).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "1");
        assert_eq!(resp.headers()["content-type"], "application/json");
    }
    assert!(
        fake.sandboxes().is_empty(),
        "a failed create creates nothing"
    );
    create_ok(&fake).await;

    // Cut a Start stream after the first message, and an execute after its first line.
    fake.fail(Fault::cut(Surface::Envd, None, "/process.Process/Start", 1));
    fake.fail(Fault::cut(Surface::Interpreter, None, "/execute", 1));
    fake.fail(Fault::status(
        Surface::Envd,
        None,
        "/files",
        1,
        502,
        "bad gateway",
    ));
    assert_eq!(fake.pending_faults().len(), 3);
    fake.on_command("x", CommandReply::ok("out"));
    let mut resp = start_req(&fake, "sbx1", "envd-tok-1", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    let err = loop {
        match resp.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => panic!("stream ended cleanly"),
            Err(e) => break e,
        }
    };
    let _ = err;
    assert_eq!(parse_envelopes(&got).len(), 1);
    let resp = execute_req(&fake, "sbx1", "envd-tok-1", json!({"code": "1"}))
        .send()
        .await
        .unwrap();
    assert!(resp.bytes().await.is_err());
    let resp = client()
        .get(sandbox_url(&fake, 49983, "sbx1", "/files?path=x"))
        .header("x-access-token", "envd-tok-1")
        .header("e2b-sandbox-id", "sbx1")
        .header("e2b-sandbox-port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.text().await.unwrap(), "bad gateway");
    assert!(fake.pending_faults().is_empty());
    // The next Start is whole again.
    let (body, _) = read_all(
        start_req(&fake, "sbx1", "envd-tok-1", "x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(parse_envelopes(&body).len(), 4);
    fake.assert_clean();

    // An unconsumed fault makes assert_clean panic.
    fake.fail(Fault::cut(Surface::Api, None, "/never", 1));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fake.assert_clean()));
    assert!(panicked.is_err());
}

#[tokio::test]
async fn list_pages_with_next_token() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    for _ in 0..3 {
        create_ok(&fake).await;
    }
    create(
        &fake,
        KEY,
        json!({"templateID": "base", "timeout": 5, "metadata": {"owner": "other"}}),
    )
    .await;
    let c = client();
    let url = format!("{}/v2/sandboxes", fake.api_url());
    let resp = c
        .get(format!(
            "{url}?metadata=owner%3Dmcp&state=running%2Cpaused&limit=2"
        ))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let token = resp.headers()["x-next-token"].to_str().unwrap().to_owned();
    let page: Vec<Value> = resp.json().await.unwrap();
    let ids: Vec<&str> = page
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["sbx1", "sbx2"]);
    let resp = c
        .get(format!(
            "{url}?metadata=owner%3Dmcp&limit=2&nextToken={token}"
        ))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("x-next-token").is_none());
    let page: Vec<Value> = resp.json().await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0]["sandboxID"], "sbx3");
    assert_eq!(page[0]["state"], "running");
    // Paused ones are filtered by state.
    let resp = c
        .post(format!("{}/sandboxes/sbx2/pause", fake.api_url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let page: Vec<Value> = c
        .get(format!("{url}?state=paused"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0]["sandboxID"], "sbx2");
    // Legacy list: running only.
    let page: Vec<Value> = c
        .get(format!("{}/sandboxes", fake.api_url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page.len(), 3);
    fake.assert_clean();
}

#[tokio::test]
async fn keys_are_teams() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    create_ok(&fake).await;
    let c = client();
    let resp = get_sandbox(&fake, "key_b", "sbx1").await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], 404);
    let page: Vec<Value> = c
        .get(format!("{}/v2/sandboxes", fake.api_url()))
        .header("x-api-key", "key_b")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(page.is_empty());
    let resp = c
        .delete(format!("{}/sandboxes/sbx1", fake.api_url()))
        .header("x-api-key", "key_b")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(fake.sandboxes().len(), 1);
    assert_eq!(fake.sandboxes()[0].api_key, KEY);
    fake.assert_clean();
}

#[tokio::test]
async fn hanging_processes_end_by_signal_or_deadline() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    create_ok(&fake).await;
    fake.on_command("sleep 100", CommandReply::hang("started\n"));

    // Killed by SendSignal.
    let mut resp = start_req(&fake, "sbx1", "envd-tok-1", "sleep 100")
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    assert_eq!(parse_envelopes(&first)[0].1["event"]["start"]["pid"], 100);
    let list: Value = unary_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        "/process.Process/List",
        json!({}),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(list["processes"][0]["pid"], 100);
    assert_eq!(list["processes"][0]["config"]["cmd"], "/bin/bash");
    let resp2 = unary_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        "/process.Process/SendSignal",
        json!({"process": {"pid": 100}, "signal": "SIGNAL_SIGKILL"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp2.status(), 200);
    let (rest, _) = read_all(resp).await;
    let msgs = parse_envelopes(&rest);
    let n = msgs.len();
    assert_eq!(
        msgs[n - 2].1,
        json!({"event": {"end": {"exitCode": -1, "status": "signal: killed"}}})
    );
    assert_eq!(msgs[n - 1], (2, json!({})));
    // Gone now.
    let resp2 = unary_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        "/process.Process/SendSignal",
        json!({"process": {"pid": 100}, "signal": "SIGNAL_SIGKILL"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp2.status(), 404);

    // Deadline from Connect-Timeout-Ms, with keepalives meanwhile.
    let resp = start_req(&fake, "sbx1", "envd-tok-1", "sleep 100")
        .header("connect-timeout-ms", "650")
        .send()
        .await
        .unwrap();
    let (body, _) = read_all(resp).await;
    let msgs = parse_envelopes(&body);
    let n = msgs.len();
    assert!(
        msgs.iter()
            .filter(|m| m.1["event"].get("keepalive").is_some())
            .count()
            >= 2
    );
    assert_eq!(msgs[n - 2].1["event"]["end"]["status"], "signal: killed");
    assert_eq!(msgs[n - 1].0, 2);
    assert_eq!(msgs[n - 1].1["error"]["code"], "deadline_exceeded");

    // Re-attach with Connect, then kill by tag-less pid.
    let mut resp = start_req(&fake, "sbx1", "envd-tok-1", "sleep 100")
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    let pid = parse_envelopes(&first)[0].1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    drop(resp);
    let conn = envd(&fake, "sbx1", "envd-tok-1", "/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(envelope(&json!({"process": {"pid": pid}})))
        .send()
        .await
        .unwrap();
    unary_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        "/process.Process/SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}),
    )
    .send()
    .await
    .unwrap();
    let (body, _) = read_all(conn).await;
    let msgs = parse_envelopes(&body);
    assert_eq!(msgs[0].1["event"]["start"]["pid"], pid);
    assert_eq!(msgs.last().unwrap(), &(2, json!({})));
    fake.assert_clean();
}

#[tokio::test]
async fn novita_legacy_uses_composite_ids() {
    let fake = Fake::start(FakeConfig {
        provider: Provider::NovitaLegacy,
        api_keys: vec!["sk_legacy".into()],
        chunking: Chunking::Whole,
    })
    .await;
    let resp = create(
        &fake,
        "sk_legacy",
        json!({"templateID": "code-interpreter-v1", "timeout": 300, "allowInternetAccess": true, "autoPause": false, "secure": false, "metadata": {}, "envVars": {}}),
    )
    .await;
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.unwrap();
    assert!(v.get("envdAccessToken").is_none());
    let id = format!(
        "{}-{}",
        v["sandboxID"].as_str().unwrap(),
        v["clientID"].as_str().unwrap()
    );
    assert_eq!(fake.sandboxes()[0].id, id);
    let resp = client()
        .post(sandbox_url(
            &fake,
            49983,
            &id,
            "/filesystem.Filesystem/Stat",
        ))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .header("content-encoding", "identity")
        .body(r#"{"path":"/home/user"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = get_sandbox(&fake, "sk_legacy", &id).await;
    assert_eq!(resp.status(), 200);
    fake.assert_clean();

    // The bare id is the wrong form.
    let resp = client()
        .post(sandbox_url(
            &fake,
            49983,
            "sbx1",
            "/filesystem.Filesystem/Stat",
        ))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .body(r#"{"path":"/home/user"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 599);
    let resp = get_sandbox(&fake, "sk_legacy", "sbx1").await;
    assert_eq!(resp.status(), 599);
    assert_eq!(fake.violations().len(), 2);
    // snake_case allow_internet_access and secure:true are wrong on legacy.
    create(
        &fake,
        "sk_legacy",
        json!({"templateID": "x", "timeout": 1, "allow_internet_access": true, "secure": true}),
    )
    .await;
    assert_eq!(fake.violations().len(), 4, "{:?}", fake.violations());
}

#[tokio::test]
async fn novita_token_follows_secure_and_routing_is_envd_only() {
    let fake = Fake::start(FakeConfig {
        provider: Provider::Novita,
        api_keys: vec!["sk".into()],
        chunking: Chunking::Whole,
    })
    .await;
    let v: Value = create(
        &fake,
        "sk",
        json!({"templateID": "t", "timeout": 60, "secure": false}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(v.get("envdAccessToken").is_none());
    // Interpreter: no routing headers needed on Novita.
    let resp = client()
        .post(sandbox_url(&fake, 49999, "sbx1", "/execute"))
        .json(&json!({"code": "1", "context_id": null, "language": null, "env_vars": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("FakeError"));
    fake.assert_clean();
    // envd: Novita-Sandbox-* required.
    let resp = client()
        .post(sandbox_url(&fake, 49983, "sbx1", "/process.Process/List"))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v = fake.violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].contains("Novita-Sandbox-Id"));
    // v2 create is E2B-only.
    let resp = client()
        .post(format!("{}/v2/sandboxes", fake.api_url()))
        .header("x-api-key", "sk")
        .json(&json!({"templateID": "t", "timeout": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 599);
}

#[tokio::test]
async fn lifecycle_pause_connect_expire() {
    let fake = fake_with(Provider::E2b, Chunking::Whole).await;
    create_ok(&fake).await;
    let c = client();
    let post = |path: &str, body: Option<Value>| {
        let mut rb = c
            .post(format!("{}{path}", fake.api_url()))
            .header("x-api-key", KEY);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        rb.send()
    };
    assert_eq!(
        post("/sandboxes/sbx1/pause", None).await.unwrap().status(),
        204
    );
    assert_eq!(
        post("/sandboxes/sbx1/pause", None).await.unwrap().status(),
        409
    );
    assert_eq!(fake.sandboxes()[0].state, "paused");
    let resp = start_req(&fake, "sbx1", "envd-tok-1", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("paused"));
    let resp = post("/sandboxes/sbx1/connect", Some(json!({"timeout": 120})))
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["envdAccessToken"], "envd-tok-1");
    assert_eq!(fake.sandboxes()[0].timeout_secs, 120);
    let resp = post("/v2/sandboxes/sbx1/connect", Some(json!({})))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        post("/sandboxes/sbx1/refreshes", Some(json!({"duration": 10})))
            .await
            .unwrap()
            .status(),
        204
    );

    // Contexts and per-context counters.
    let resp = c
        .post(sandbox_url(&fake, 49999, "sbx1", "/contexts"))
        .header("x-access-token", "envd-tok-1")
        .header("e2b-sandbox-id", "sbx1")
        .header("e2b-sandbox-port", "49999")
        .json(&json!({"language": "python", "cwd": "/tmp"}))
        .send()
        .await
        .unwrap();
    let ctx: Value = resp.json().await.unwrap();
    assert_eq!(ctx["cwd"], "/tmp");
    let ctx_id = ctx["id"].as_str().unwrap();
    for body in [
        json!({"code": "a", "context_id": ctx_id}),
        json!({"code": "b", "context_id": ctx_id}),
        json!({"code": "c", "language": "js"}),
        json!({"code": "d"}),
    ] {
        let resp = execute_req(&fake, "sbx1", "envd-tok-1", body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let ex = fake.executions();
    assert_eq!(ex[0].1, ctx_id);
    assert_eq!((ex[1].1.as_str(), ex[1].3), (ctx_id, 2));
    assert_eq!((ex[2].2.as_str(), ex[2].3), ("javascript", 1));
    assert_eq!((ex[3].2.as_str(), ex[3].3), ("python", 1));
    assert_ne!(ex[3].1, ctx_id);
    let resp = execute_req(
        &fake,
        "sbx1",
        "envd-tok-1",
        json!({"code": "x", "context_id": "nope"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.text().await.unwrap(), "Context nope not found");

    // Delay + no end.
    fake.on_execute(
        "slow",
        ExecReply::stdout("x")
            .without_end()
            .with_delay(Duration::from_millis(50)),
    );
    let text = execute_req(&fake, "sbx1", "envd-tok-1", json!({"code": "slow"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("end_of_execution"));

    fake.expire("sbx1");
    assert!(fake.sandboxes().is_empty());
    let resp = get_sandbox(&fake, KEY, "sbx1").await;
    assert_eq!(resp.status(), 404);
    let resp = execute_req(&fake, "sbx1", "envd-tok-1", json!({"code": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("was not found"));
    fake.assert_clean();
}
