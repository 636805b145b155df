//! The HTTP transport under clients that misbehave, through the real server over real
//! sockets: idle and slow connections, more connections than the caps (with a low open-files
//! limit), sessions of other tenants, past their cap, and idle; foreign `Origin`s; clients
//! that go away mid-run; and bodies rmcp cannot take (too large, not JSON, batches, params
//! that do not fit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use util::mcp::*;
use util::runbox_exe;

/// Far longer than anything here should take: a bound that fails only when the behaviour is
/// missing.
const PATIENCE: Duration = Duration::from_secs(60);

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn addr(server: &HttpServer) -> SocketAddr {
    server.base.trim_start_matches("http://").parse().unwrap()
}

/// A TCP connection to the server from `local` (an address of the loopback range).
async fn connect_from(server: &HttpServer, local: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(addr(server)).await.unwrap()
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("the server should have closed the connection")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A POST of `body` to /mcp with the headers MCP needs, plus `extra`.
async fn post(server: &HttpServer, body: String, extra: &[(&str, &str)]) -> reqwest::Response {
    post_with(&http(), server, body, extra).await
}

async fn post_with(
    client: &reqwest::Client,
    server: &HttpServer,
    body: String,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// The JSON-RPC messages of an answer, whether JSON or an SSE stream.
async fn messages(r: reqwest::Response) -> Vec<Value> {
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    if !sse {
        return vec![serde_json::from_str(&text).unwrap()];
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect()
}

fn session_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned()
}

/// Opens a 2025-11-25 session (initialize, then initialized) with optional extra headers.
async fn open_session(server: &HttpServer, extra: &[(&str, &str)]) -> String {
    open_session_with(&http(), server, extra).await
}

async fn open_session_with(
    client: &reqwest::Client,
    server: &HttpServer,
    extra: &[(&str, &str)],
) -> String {
    let r = post_with(client, server, INITIALIZE.into(), extra).await;
    assert_eq!(r.status(), 200);
    let id = session_of(&r);
    let mut with = extra.to_vec();
    with.push(("mcp-session-id", &id));
    let r = post_with(
        client,
        server,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(),
        &with,
    )
    .await;
    assert_eq!(r.status(), 202);
    id
}

/// A session request: its status and, on 200, its messages.
async fn in_session(
    server: &HttpServer,
    session: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> (u16, Vec<Value>) {
    in_session_with(&http(), server, session, body, extra).await
}

async fn in_session_with(
    client: &reqwest::Client,
    server: &HttpServer,
    session: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> (u16, Vec<Value>) {
    let mut with = extra.to_vec();
    with.push(("mcp-session-id", session));
    let r = post_with(client, server, body.to_string(), &with).await;
    let status = r.status().as_u16();
    if status == 200 {
        (status, messages(r).await)
    } else {
        (status, vec![Value::String(r.text().await.unwrap())])
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn idle_and_slow_connections_are_closed() {
    let server = HttpServer::start(&[
        "--pool",
        "0",
        "--http-header-timeout",
        "1",
        "--http-idle-timeout",
        "1",
    ])
    .await;
    // Connected, nothing sent.
    let mut silent = TcpStream::connect(addr(&server)).await.unwrap();
    // Half a request head.
    let mut slow = TcpStream::connect(addr(&server)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    // One request, then kept alive with nothing to do.
    let mut kept = TcpStream::connect(addr(&server)).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(until_closed(&mut silent).await, "");
    assert_eq!(until_closed(&mut slow).await, "");
    let answer = until_closed(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("\"status\":\"ok\""), "{answer}");
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn connections_past_the_caps_are_refused_and_sandboxes_still_start() {
    // An open-files limit of 2048, and room for ten sandboxes: the server serves as many
    // connections as leave those sandboxes their descriptors, and closes the others at once.
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-c", "ulimit -n 2048 && exec \"$0\" \"$@\""])
        .arg(runbox_exe())
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--pool",
            "0",
            "--max-sandboxes",
            "10",
            "--max-connections-per-address",
            "1000",
            "--http-header-timeout",
            "300",
        ])
        .env("RUNBOX_INIT_EXE", runbox_exe())
        .env("RUNBOX_LOG", "warn");
    if let Some(p) = std::env::var_os("RUNBOX_CGROUP_PARENT") {
        command.env("RUNBOX_CGROUP_PARENT", p);
    }
    let server = HttpServer::spawn(command).await;
    assert!(server.log().contains("room for"), "{}", server.log());
    // A client connected before the flood, on one kept-alive connection (it reads every
    // answer to its end, so the connection goes back to its pool).
    let client = http();
    let session = open_session_with(&client, &server, &[]).await;

    // More idle connections than the server has descriptors.
    let mut idle = Vec::new();
    let mut refused = 0;
    for _ in 0..2100 {
        let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
        let mut byte = [0u8; 1];
        // A refused connection is answered at once; an accepted one waits for a request.
        match tokio::time::timeout(Duration::from_millis(50), stream.peek(&mut byte)).await {
            Ok(_) => {
                refused += 1;
                if refused == 1 {
                    let answer = until_closed(&mut stream).await;
                    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
                    assert!(answer.contains("-32000"), "{answer}");
                }
            }
            Err(_) => idle.push(stream),
        }
    }
    assert!(refused > 0, "every one of 2100 connections was accepted");
    assert!(idle.len() < 2048, "{} connections accepted", idle.len());

    // The cap is reached, and a sandbox still starts and runs.
    let create = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "create_sandbox", "arguments": {}}});
    let (status, answer) = in_session_with(&client, &server, &session, create, &[]).await;
    assert_eq!(status, 200, "{answer:?}");
    let result = &tool_result(&answer)["result"];
    assert_ne!(result["isError"], true, "{result}");
    let id = result["structuredContent"]["sandbox_id"].as_str().unwrap();
    let run = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_code", "arguments": {"sandbox_id": id, "code": "6 * 7"}}});
    let (_, answer) = in_session_with(&client, &server, &session, run, &[]).await;
    let result = &tool_result(&answer)["result"];
    assert_eq!(
        result["structuredContent"]["results"][0]["data"]["text/plain"], "42",
        "{result}"
    );
    drop(idle);
    let m = server.metrics().await;
    assert!(
        metric(&m, "runbox_rejected_requests_total{reason=\"connections\"}") > 0.0,
        "{m}"
    );
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let server = HttpServer::start(&["--pool", "0", "--max-connections-per-address", "4"]).await;
    let mut mine = Vec::new();
    for _ in 0..4 {
        mine.push(connect_from(&server, "127.0.0.2").await);
    }
    let mut fifth = connect_from(&server, "127.0.0.2").await;
    let answer = until_closed(&mut fifth).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("one address"), "{answer}");
    // Another address is served.
    let mut other = connect_from(&server, "127.0.0.3").await;
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut other).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(mine);
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn sessions_belong_to_the_tenant_that_opened_them() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let alice = add_token(&tokens, "alice", &[]);
    let bob = add_token(&tokens, "bob", &[]);
    let server = HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;
    let (alice, bob) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
    let as_alice = [("authorization", alice.as_str())];
    let as_bob = [("authorization", bob.as_str())];
    let session = open_session(&server, &as_alice).await;
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});

    // Bob naming Alice's session gets what an id that never existed gets.
    let unknown = in_session(
        &server,
        "0b9d6a51-0000-4000-8000-000000000000",
        ping.clone(),
        &as_bob,
    )
    .await;
    assert_eq!(unknown.0, 404);
    assert_eq!(
        in_session(&server, &session, ping.clone(), &as_bob).await,
        unknown
    );
    let get = http()
        .get(&server.url)
        .header("accept", "text/event-stream")
        .header("authorization", &bob)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 404);
    let delete = http()
        .delete(&server.url)
        .header("authorization", &bob)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 404);

    // Alice's session is untouched.
    let (status, answer) = in_session(&server, &session, ping, &as_alice).await;
    assert_eq!(status, 200);
    assert_eq!(answer.last().unwrap()["result"], json!({}));
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn sessions_are_capped_counted_and_expire_when_idle() {
    let server = HttpServer::start(&[
        "--pool",
        "0",
        "--max-sessions",
        "2",
        "--session-idle-timeout",
        "2",
    ])
    .await;
    let first = open_session(&server, &[]).await;
    open_session(&server, &[]).await;
    assert_eq!(metric(&server.metrics().await, "runbox_sessions"), 2.0);
    let r = post(&server, INITIALIZE.into(), &[]).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let answer = messages(r).await;
    assert_eq!(answer[0]["id"], 1);
    assert_eq!(answer[0]["error"]["code"], -32000);
    assert!(
        answer[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 2 MCP sessions"),
        "{answer:?}"
    );

    // Left idle, both expire.
    let waited = tokio::time::timeout(PATIENCE, async {
        while metric(&server.metrics().await, "runbox_sessions") != 0.0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{}", server.metrics().await);
    let m = server.metrics().await;
    assert_eq!(metric(&m, "runbox_sessions_expired_total"), 2.0, "{m}");
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    assert_eq!(in_session(&server, &first, ping, &[]).await.0, 404);
    open_session(&server, &[]).await;
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn foreign_origins_are_refused() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let status = |origin: Option<&'static str>| {
        let server = &server;
        async move {
            let extra: Vec<(&str, &str)> = origin.map(|o| ("origin", o)).into_iter().collect();
            post(server, INITIALIZE.into(), &extra)
                .await
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(Some("http://attacker.example")).await, 403);
    assert_eq!(status(Some("null")).await, 403);
    assert_eq!(status(Some("http://localhost:5173")).await, 200);
    assert_eq!(status(Some("http://127.0.0.1:8080")).await, 200);
    assert_eq!(status(None).await, 200);
    assert!(server.stop().await.success());

    let server =
        HttpServer::start(&["--pool", "0", "--allowed-origin", "https://app.example"]).await;
    let status = |origin: &'static str| {
        let server = &server;
        async move {
            post(server, INITIALIZE.into(), &[("origin", origin)])
                .await
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("https://app.example").await, 200);
    assert_eq!(status("http://attacker.example").await, 403);
    assert!(server.stop().await.success());
}

/// The `result` of a session's tools/call answer.
fn tool_result(answer: &[Value]) -> Value {
    answer
        .iter()
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_run() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let session = open_session(&server, &[]).await;
    let create = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "create_sandbox", "arguments": {}}});
    let (_, answer) = in_session(&server, &session, create, &[]).await;
    let sandbox = tool_result(&answer)["result"]["structuredContent"]["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // A long run; the client reads until the code has started, then goes away.
    let run = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "run_code", "_meta": {"progressToken": "p"},
        "arguments": {"sandbox_id": sandbox, "timeout_seconds": 600,
            "code": "import time\nprint('started', flush=True)\ntime.sleep(600)"}}});
    let mut response = post(&server, run.to_string(), &[("mcp-session-id", &session)]).await;
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    while !seen.contains("started") {
        let chunk = tokio::time::timeout(PATIENCE, response.chunk())
            .await
            .expect("progress in time")
            .unwrap()
            .expect("the stream ended before the code started");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(response);

    // The sandbox's next run does not wait for the abandoned one.
    let next = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "run_code", "arguments": {"sandbox_id": sandbox, "code": "print('next')"}}});
    let (status, answer) = tokio::time::timeout(
        Duration::from_secs(120),
        in_session(&server, &session, next, &[]),
    )
    .await
    .expect("the next run waited for the abandoned one");
    assert_eq!(status, 200);
    let result = tool_result(&answer);
    assert_eq!(
        result["result"]["structuredContent"]["stdout"], "next\n",
        "{result}"
    );
    let m = server.metrics().await;
    assert_eq!(
        metric(
            &m,
            "runbox_runs_total{language=\"python\",outcome=\"cancelled\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn requests_rmcp_cannot_take_get_json_rpc_errors() {
    let server = HttpServer::start(&["--pool", "0"]).await;

    // Refused by its Content-Length before a byte of the body is sent.
    let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
    stream
        .write_all(
            b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Accept: application/json, text/event-stream\r\nContent-Length: 30000000\r\n\r\n",
        )
        .await
        .unwrap();
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("24.0 MiB"),
        "{body}"
    );

    // Not JSON, a batch, not a JSON-RPC message.
    for (body, code) in [
        ("{\"jsonrpc\": \"2.0\", \"id\": 1,", -32700),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, -32600),
        (r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#, -32600),
    ] {
        let r = post(&server, body.into(), &[]).await;
        assert_eq!(r.status(), 400, "{body}");
        let answer = messages(r).await;
        assert_eq!(answer[0]["error"]["code"], code, "{body}: {answer:?}");
    }

    // Arguments that are not an object: -32602 naming them, in both revisions.
    let session = open_session(&server, &[]).await;
    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": "run_code", "arguments": "print(1)"}});
    let (_, answer) = in_session(&server, &session, call.clone(), &[]).await;
    let error = &tool_result(&answer)["error"];
    assert_eq!(error["code"], -32602, "{answer:?}");
    assert!(
        error["message"].as_str().unwrap().contains("`arguments`"),
        "{error}"
    );
    assert_eq!(tool_result(&answer)["id"], 6);
    assert!(server.stop().await.success());
}

/// `runbox serve --stdio` as a raw child: lines in, lines out.
struct Stdio {
    child: tokio::process::Child,
    input: tokio::process::ChildStdin,
    output: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Stdio {
    async fn start() -> Self {
        let mut child = serve_command(&["--stdio", "--pool", "0"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        let mut s = Self {
            child,
            input,
            output,
        };
        s.send(INITIALIZE.as_bytes()).await;
        assert_eq!(s.next().await["id"], 1);
        s.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        s
    }

    async fn send(&mut self, line: &[u8]) {
        self.input.write_all(line).await.unwrap();
        self.input.write_all(b"\n").await.unwrap();
        self.input.flush().await.unwrap();
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(PATIENCE, self.output.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .expect("the server exited");
        serde_json::from_str(&line).unwrap()
    }
}

#[tokio::test]
async fn stdio_answers_every_request_it_cannot_take() {
    let mut s = Stdio::start().await;
    // Past the line limit, with the id at the end (as some clients serialize it).
    let padding = "a".repeat(25 << 20);
    let big = format!(
        r#"{{"method":"tools/call","params":{{"name":"write_file","arguments":{{"content":"{padding}"}}}},"jsonrpc":"2.0","id":"big"}}"#
    );
    s.send(big.as_bytes()).await;
    let answer = s.next().await;
    assert_eq!(answer["id"], "big", "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    // A notification past the limit gets no answer: the next answer is the ping's.
    let note =
        format!(r#"{{"jsonrpc":"2.0","method":"notifications/x","params":{{"p":"{padding}"}}}}"#);
    s.send(note.as_bytes()).await;
    drop(note);
    for (line, id, code) in [
        ("{\"jsonrpc\":\"2.0\",\"id\":", Value::Null, -32700),
        (
            r#"[{"jsonrpc":"2.0","id":3,"method":"ping"}]"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_code","arguments":[1]}}"#,
            json!(4),
            -32602,
        ),
    ] {
        s.send(line.as_bytes()).await;
        let answer = s.next().await;
        assert_eq!(
            (&answer["id"], &answer["error"]["code"]),
            (&id, &json!(code)),
            "{line}: {answer}"
        );
    }
    s.send(br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#).await;
    assert_eq!(
        s.next().await,
        json!({"jsonrpc": "2.0", "id": 5, "result": {}})
    );
    drop(s.input);
    let status = tokio::time::timeout(PATIENCE, s.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}
