//! The MCP server's latency and throughput through a real rmcp client, with plain
//! `python3 -c 'print(1)'` timed in the same run: `cargo bench -p runbox --bench mcp`.
//!
//! `RUNBOX_BENCH_N` sets the iterations (default 200 for round trips, a tenth of that for
//! one-shot runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

type Client = RunningService<RoleClient, ()>;

const EXE: &str = env!("CARGO_BIN_EXE_runbox");

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(v[v.len() / 2]),
        ms(v[((v.len() as f64 * 0.95).ceil() as usize).min(v.len()) - 1]),
    )
}

fn command(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(EXE);
    c.arg("serve")
        .args(args)
        .env("RUNBOX_INIT_EXE", EXE)
        .env("RUNBOX_LOG", "error")
        // The e2b rows reach a fake provider on loopback, never through a proxy.
        .env("NO_PROXY", "127.0.0.1,localhost");
    c
}

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

async fn stdio(args: &[&str]) -> Client {
    let mut all = vec!["--stdio"];
    all.extend_from_slice(args);
    let t = TokioChildProcess::builder(command(&all))
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
        .0;
    ().serve_with_lifecycle(t, modern()).await.unwrap()
}

async fn http_server(args: &[&str]) -> (tokio::process::Child, String) {
    let mut all = vec!["--http", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut child = command(&all)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = lines.next_line().await.unwrap().expect("server exited");
        if let Some(rest) = line.strip_prefix("runbox: serving MCP on ") {
            return (child, rest.split_whitespace().next().unwrap().to_owned());
        }
    }
}

async fn http(url: &str, mode: ClientLifecycleMode) -> Client {
    ().serve_with_lifecycle(
        StreamableHttpClientTransport::from_uri(url.to_owned()),
        mode,
    )
    .await
    .unwrap()
}

async fn call(client: &Client, tool: &str, args: Value) -> Value {
    let p = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().unwrap().clone());
    let r = client.call_tool(p).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    r.structured_content.unwrap()
}

async fn warm_round_trips(client: &Client, n: usize) -> Vec<Duration> {
    warm_round_trips_among(client, n, 0).await
}

/// Warm runs in a sandbox whose /workspace holds `files` files: each run in a named sandbox
/// lists /workspace before and after, to report the files it changed.
async fn warm_round_trips_among(client: &Client, n: usize, files: usize) -> Vec<Duration> {
    let id = call(client, "create_sandbox", json!({})).await["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();
    if files > 0 {
        let code = format!(
            "import os\nfor i in range({files}):\n    d = f'/workspace/data/{{i // 100}}'\n    os.makedirs(d, exist_ok=True)\n    open(f'{{d}}/{{i}}.txt', 'w').write('x')"
        );
        call(client, "run_code", json!({"sandbox_id": id, "code": code})).await;
    }
    let args = json!({"sandbox_id": id, "code": "print(1)"});
    for _ in 0..5 {
        call(client, "run_code", args.clone()).await;
    }
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let out = call(client, "run_code", args.clone()).await;
        t.push(start.elapsed());
        assert_eq!(out["stdout"], "1\n");
    }
    call(client, "close_sandbox", json!({"sandbox_id": id})).await;
    t
}

/// write_file then read_file of `size` random-looking bytes, base64 both ways.
async fn file_round_trips(client: &Client, n: usize, size: usize) -> Vec<Duration> {
    use base64::Engine as _;
    let id = call(client, "create_sandbox", json!({})).await["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7919 % 251) as u8).collect();
    let content = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let w = call(
            client,
            "write_file",
            json!({"sandbox_id": id, "path": "blob.bin", "content": content, "encoding": "base64"}),
        )
        .await;
        let r = call(
            client,
            "read_file",
            json!({"sandbox_id": id, "path": "blob.bin", "encoding": "base64"}),
        )
        .await;
        t.push(start.elapsed());
        assert_eq!(w["size"], size);
        assert_eq!(r["content"], content);
    }
    call(client, "close_sandbox", json!({"sandbox_id": id})).await;
    t
}

/// Start-up of `serve --stdio` as a desktop client sees it: from spawning the process to the
/// answer to `initialize`.
async fn stdio_starts(n: usize) -> Vec<Duration> {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let transport = TokioChildProcess::builder(command(&["--stdio", "--pool", "0"]))
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
            .0;
        let client =
            ().serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
                .await
                .unwrap();
        t.push(start.elapsed());
        client.cancel().await.unwrap();
    }
    t
}

/// Back-to-back `tools/call`s on one kept-alive HTTP connection in a 2025-11-25 session,
/// each answer read to its end (an answer written in two pieces waits for the client's
/// delayed ACK unless the server sets TCP_NODELAY).
async fn keep_alive_round_trips(url: &str, n: usize) -> Vec<Duration> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let post = |body: String, session: Option<String>| {
        let mut req = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    let r = post(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#.into(),
        None,
    )
    .await
    .unwrap();
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    r.text().await.unwrap();
    post(
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(),
        Some(session.clone()),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let mut t = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let body = json!({"jsonrpc": "2.0", "id": i + 2, "method": "tools/call",
            "params": {"name": "list_sandboxes", "arguments": {}}});
        let start = Instant::now();
        let answer = post(body.to_string(), Some(session.clone()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if i >= 5 {
            t.push(start.elapsed());
        }
        assert!(answer.contains("\"result\""), "{answer}");
    }
    t
}

async fn one_shots(client: &Client, n: usize, pause: Duration) -> Vec<Duration> {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        // Not timed: lets a pool refill between runs, as between a person's requests.
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        let out = call(client, "run_code", json!({"code": "print(1)"})).await;
        t.push(start.elapsed());
        assert_eq!(out["stdout"], "1\n");
    }
    t
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("RUNBOX_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let one_shot_n = (n / 10).max(10);
    let mut rows: Vec<(String, (f64, f64), String)> = Vec::new();

    // The Python the sandboxes run, as `runbox doctor` would find it.
    let python = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap();
    let mut base = Vec::new();
    for i in 0..(one_shot_n + 3) {
        let start = Instant::now();
        assert!(
            std::process::Command::new(&python)
                .args(["-c", "print(1)"])
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success()
        );
        if i >= 3 {
            base.push(start.elapsed());
        }
    }
    let base = stats(base);
    rows.push((
        format!("baseline: {python} -c 'print(1)'"),
        base,
        String::new(),
    ));

    rows.push((
        "serve --stdio: spawn to initialize answered".into(),
        stats(stdio_starts(10).await),
        "package indexes are found on first use; goal < 200 ms".into(),
    ));

    let client = stdio(&["--pool", "0"]).await;
    rows.push((
        "warm run_code round trip, stdio".into(),
        stats(warm_round_trips(&client, n).await),
        "goal < 1 ms median".into(),
    ));
    rows.push((
        "warm run_code round trip, 1000 files in /workspace, stdio".into(),
        stats(warm_round_trips_among(&client, n, 1000).await),
        "the changed-files snapshot before and after".into(),
    ));
    rows.push((
        "write_file + read_file of 1 MiB (base64), stdio".into(),
        stats(file_round_trips(&client, (n / 10).max(10), 1 << 20).await),
        String::new(),
    ));
    let s = stats(one_shots(&client, one_shot_n, Duration::ZERO).await);
    rows.push((
        "one-shot run_code, no pool, stdio".into(),
        s,
        format!("{:.2}x baseline; goal <= 1.2x", s.0 / base.0),
    ));
    client.cancel().await.unwrap();

    let client = stdio(&["--pool", "2"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = stats(one_shots(&client, one_shot_n, Duration::from_millis(400)).await);
    rows.push((
        "one-shot run_code, pool of 2, stdio".into(),
        s,
        format!("{:.2}x baseline; goal < 10 ms", s.0 / base.0),
    ));
    client.cancel().await.unwrap();

    let (mut server, url) = http_server(&["--pool", "0", "--max-sandboxes", "20"]).await;
    rows.push((
        "back-to-back tools/call, one keep-alive connection, HTTP 2025-11-25".into(),
        stats(keep_alive_round_trips(&url, n).await),
        "TCP_NODELAY: no delayed-ACK wait".into(),
    ));
    for (label, mode) in [
        ("2026-07-28", modern()),
        ("2025-11-25", ClientLifecycleMode::Initialize),
    ] {
        let client = http(&url, mode).await;
        rows.push((
            format!("warm run_code round trip, HTTP {label}"),
            stats(warm_round_trips(&client, n).await),
            String::new(),
        ));
        client.cancel().await.unwrap();
    }

    // The same behind authentication: a bearer token checked on every request (the tokens
    // file is stat'ed each time), with the audit log written for every call.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let out = std::process::Command::new(EXE)
        .args(["token", "add", "bench", "--file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();
    let audit = dir.path().join("audit.jsonl");
    let (mut authed, authed_url) = http_server(&[
        "--pool",
        "0",
        "--tokens",
        tokens.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ])
    .await;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(authed_url).auth_header(token),
    );
    let client = ().serve_with_lifecycle(transport, modern()).await.unwrap();
    rows.push((
        "warm run_code round trip, HTTP 2026-07-28, bearer token and audit log".into(),
        stats(warm_round_trips(&client, n).await),
        String::new(),
    ));
    client.cancel().await.unwrap();
    let _ = authed.start_kill();

    // The e2b backend against the in-process fake provider, which answers at once: what
    // runbox itself adds to a cloud sandbox's round trip (the control plane is not on the
    // path of a run; the code interpreter's /execute is).
    let fake = runbox_e2b_fake::Fake::start(runbox_e2b_fake::FakeConfig {
        api_keys: vec!["e2b_bench".into()],
        ..Default::default()
    })
    .await;
    fake.on_execute("print(1)", runbox_e2b_fake::ExecReply::stdout("1\n"));
    let (api, sandbox) = (fake.api_url(), fake.sandbox_url());
    let (mut cloud, cloud_url) = http_server(&[
        "--backend",
        "e2b",
        "--e2b-api-key",
        "e2b_bench",
        "--e2b-api-url",
        &api,
        "--e2b-sandbox-url",
        &sandbox,
    ])
    .await;
    let client = http(&cloud_url, modern()).await;
    rows.push((
        "warm run_code round trip, HTTP 2026-07-28, e2b backend (loopback fake provider)".into(),
        stats(warm_round_trips(&client, n).await),
        "runbox's own share of a cloud run".into(),
    ));
    client.cancel().await.unwrap();
    let _ = cloud.start_kill();

    // Throughput: 8 clients, each with its own sandbox, calling as fast as they can.
    let clients = 8;
    let duration = Duration::from_secs(5);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let url = url.clone();
        tasks.spawn(async move {
            let client = http(&url, modern()).await;
            let id = call(&client, "create_sandbox", json!({})).await["sandbox_id"]
                .as_str()
                .unwrap()
                .to_owned();
            let args = json!({"sandbox_id": id, "code": "print(1)"});
            call(&client, "run_code", args.clone()).await;
            let start = Instant::now();
            let mut done = 0u64;
            while start.elapsed() < duration {
                call(&client, "run_code", args.clone()).await;
                done += 1;
            }
            call(&client, "close_sandbox", json!({"sandbox_id": id})).await;
            client.cancel().await.unwrap();
            done
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r.unwrap();
    }
    let _ = server.start_kill();

    println!("\nrunbox MCP server (release build), {n} round trips, {one_shot_n} one-shot runs");
    println!("| measurement | median ms | p95 ms | note |");
    println!("|---|---:|---:|---|");
    for (name, (median, p95), note) in rows {
        println!("| {name} | {median:.2} | {p95:.2} | {note} |");
    }
    println!(
        "\nthroughput: {clients} concurrent HTTP clients (2026-07-28), each in its own sandbox: {:.0} run_code calls/s over {} s",
        total as f64 / duration.as_secs_f64(),
        duration.as_secs()
    );
}
