//! `runbox serve` end to end through a real rmcp client: over stdio and streamable HTTP, with
//! both protocol revisions (2025-11-25 `initialize`, 2026-07-28 `server/discover`), every
//! tool, state, errors, timeouts, output caps, expiry, progress, cancellation and shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ClientRequest, ProtocolVersion};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};
use util::mcp::*;
use util::*;

const TOOLS: [&str; 15] = [
    "close_sandbox",
    "create_sandbox",
    "get_sandbox_status",
    "install_packages",
    "kill_process",
    "list_files",
    "list_sandboxes",
    "pause_sandbox",
    "read_file",
    "read_process_output",
    "resume_sandbox",
    "run_code",
    "run_command",
    "set_sandbox_timeout",
    "write_file",
];

/// Every tool, state across calls, and the errors a caller can act on.
async fn core_flow(client: &Client, revision: Revision) {
    let info = client.peer_info().expect("negotiated");
    let expected = match revision {
        Revision::Legacy => ProtocolVersion::V_2025_11_25,
        Revision::Stateless => ProtocolVersion::V_2026_07_28,
    };
    assert_eq!(info.protocol_version, expected);

    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(names, TOOLS);
    for t in &tools {
        assert!(t.output_schema.is_some(), "{} has no outputSchema", t.name);
        let a = t
            .annotations
            .as_ref()
            .unwrap_or_else(|| panic!("{} has no annotations", t.name));
        let read_only = matches!(
            t.name.as_ref(),
            "list_sandboxes" | "get_sandbox_status" | "list_files" | "read_file"
        );
        assert_eq!(a.read_only_hint, Some(read_only), "{}", t.name);
        assert!(t.description.as_ref().is_some_and(|d| d.len() > 20));
    }

    // create, then state across calls
    let r = call(
        client,
        "create_sandbox",
        json!({"timeout_seconds": 300, "metadata": {"task": "test"}, "env": {"GREETING": "hi"}}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = structured(&r);
    let id = s["sandbox_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sbx_") && id.len() > 30);
    assert_eq!(s["timeout_seconds"], 300.0);
    assert_eq!(s["network"], "none");
    assert!(
        s["languages"]
            .as_array()
            .unwrap()
            .contains(&json!("python"))
    );
    assert!(s["expires_at"].as_str().unwrap().ends_with('Z'));

    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "code": "import os\nx = 41\nos.environ['GREETING']"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["results"][0]["data"]["text/plain"], "'hi'");
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "code": "print('x is', x)\nx + 1"}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(s["stdout"], "x is 41\n");
    assert_eq!(s["results"][0]["data"]["text/plain"], "42");
    assert_eq!(s["ephemeral"], false);
    assert!(text(&r).contains("42"));
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": "javascript", "code": "let y = 2; y * 21"}),
    )
    .await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "42",
        "{}",
        text(&r)
    );
    let r = call(client, "run_code", json!({"sandbox_id": id, "language": "typescript", "code": "const z: number = y * 2;\nz + 0.5"})).await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "4.5",
        "{}",
        text(&r)
    );
    let ts = "import { basename } from 'node:path';\n\
              import * as crypto from 'crypto';\n\
              interface Point { x: number; y: number }\n\
              const p: Point = { x: 3, y: 4 };\n\
              const norm = (q: Point): number => Math.hypot(q.x, q.y);\n\
              console.log(basename('/a/b.csv'), crypto.createHash('md5').update('').digest('hex'));\n\
              norm(p)";
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": "typescript", "code": ts}),
    )
    .await;
    assert_eq!(
        structured(&r)["stdout"],
        "b.csv d41d8cd98f00b204e9800998ecf8427e\n",
        "{}",
        text(&r)
    );
    assert_eq!(structured(&r)["results"][0]["data"]["text/plain"], "5");
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": "javascript", "code": "norm({x: 6, y: 8})"}),
    )
    .await;
    assert_eq!(structured(&r)["results"][0]["data"]["text/plain"], "10");
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": "typescript", "code": "let a = 1;\nlet b: = 2;"}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["error"]["name"], "SyntaxError");
    assert!(
        structured(&r)["error"]["value"]
            .as_str()
            .unwrap()
            .contains("line 2"),
        "{}",
        text(&r)
    );
    let r = call(client, "run_code", json!({"sandbox_id": id, "language": "bash", "code": "cd /tmp && export K=v && echo bash-ok"})).await;
    assert_eq!(structured(&r)["stdout"], "bash-ok\n");
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": "bash", "code": "pwd; echo $K"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "/tmp\nv\n");

    // run_command: fresh shell, cwd and env per call, exit status
    let r = call(client, "run_command", json!({"sandbox_id": id, "command": "mkdir -p /workspace/sub && cd /workspace/sub && pwd && echo $A", "env": {"A": "b"}})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "/workspace/sub\nb\n");
    let r = call(
        client,
        "run_command",
        json!({"sandbox_id": id, "command": "pwd; exit 3", "cwd": "/workspace/sub"}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["exit_code"], 3);
    assert_eq!(structured(&r)["stdout"], "/workspace/sub\n");
    let r = call(
        client,
        "run_command",
        json!({"sandbox_id": id, "command": "true", "cwd": "/nope"}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("/nope"), "{}", text(&r));

    // status and list
    let r = call(client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    let s = structured(&r);
    assert_eq!(s["state"], "running");
    assert!(s["kernels"].as_array().unwrap().contains(&json!("python")));
    // The memory limit shown is the one that holds for the whole sandbox, if any.
    let memory = &s["enforced_limits"]["memory"];
    if memory["per"] == "sandbox" {
        assert_eq!(s["memory_limit_bytes"], memory["value"]);
        assert_eq!(s["memory_limit_bytes"], 1024 << 20);
    } else {
        assert!(s["memory_limit_bytes"].is_null(), "{s}");
    }
    assert!(s["created_at"].is_string() && s["expires_at"].is_string());
    if s["memory_bytes"].is_number() {
        assert!(s["memory_bytes"].as_i64().unwrap() > 0);
        assert!(s["processes"].as_i64().unwrap() >= 2);
    }
    let r = call(client, "list_sandboxes", json!({})).await;
    let listed = structured(&r)["sandboxes"].as_array().unwrap().clone();
    assert!(
        listed
            .iter()
            .any(|x| x["sandbox_id"] == id.as_str() && x["metadata"]["task"] == "test")
    );

    // errors the caller can act on
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": "1/0"})).await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["error"]["name"], "ZeroDivisionError");
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": id, "code": "import time\ntime.sleep(30)", "timeout_seconds": 1}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["timed_out"], true);
    assert!(text(&r).contains("timeout"), "{}", text(&r));
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": "x"})).await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "41",
        "state survives a timeout"
    );
    let r = call(
        client,
        "run_code",
        json!({"code": "1", "language": "cobol"}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("cobol"), "{}", text(&r));
    let r = call(client, "run_code", json!({"language": "python"})).await;
    assert!(is_error(&r) && text(&r).contains("code"), "{}", text(&r));
    let r = call(
        client,
        "run_code",
        json!({"code": "1", "timeout_seconds": 100000}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("maximum"), "{}", text(&r));
    let r = call(
        client,
        "run_code",
        json!({"code": "1", "sandbox_typo": "x"}),
    )
    .await;
    assert!(
        is_error(&r) && text(&r).contains("sandbox_typo"),
        "{}",
        text(&r)
    );

    // close, then the id is gone with a message that says what to do
    let r = call(client, "close_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r));
    assert_eq!(structured(&r)["closed"], true);
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": "1"})).await;
    assert!(is_error(&r));
    assert!(text(&r).contains("create_sandbox"), "{}", text(&r));
    let r = call(
        client,
        "get_sandbox_status",
        json!({"sandbox_id": "sbx_never"}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("sbx_never"));

    // one-shot: a fresh sandbox, closed afterwards
    let r = call(
        client,
        "run_code",
        json!({"code": "import socket\nsocket.gethostname()"}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(s["ephemeral"], true);
    assert_eq!(s["results"][0]["data"]["text/plain"], "'sandbox'");
    let one_shot = s["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(
        client,
        "run_code",
        json!({"sandbox_id": one_shot, "code": "1"}),
    )
    .await;
    assert!(is_error(&r), "a one-shot sandbox must not stay reachable");
    let r = call(
        client,
        "run_command",
        json!({"command": "echo once; uname -s"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "once\nLinux\n");
}

#[tokio::test]
async fn stdio_legacy_revision_core_flow() {
    let (client, _) = stdio_client(&["--pool", "1"], Revision::Legacy).await;
    core_flow(&client, Revision::Legacy).await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn stdio_stateless_revision_core_flow() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    core_flow(&client, Revision::Stateless).await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn http_both_revisions_core_flow() {
    let server = HttpServer::start(&["--pool", "1"]).await;
    for revision in [Revision::Legacy, Revision::Stateless] {
        let (client, _) = server.client(revision).await;
        core_flow(&client, revision).await;
        client.cancel().await.unwrap();
    }
    let health: Value = reqwest_get_json(&format!("{}/healthz", server.base)).await;
    assert_eq!(health["status"], "ok");
    assert!(server.stop().await.success());
}

async fn reqwest_get_json(url: &str) -> Value {
    let out = tokio::process::Command::new("curl")
        .args(["-sf", url])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "GET {url} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A sandbox id works across separate clients and HTTP sessions: it is not tied to one.
#[tokio::test]
async fn sandboxes_outlive_the_session_that_made_them() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let (a, _) = server.client(Revision::Legacy).await;
    let r = call(&a, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    call(
        &a,
        "run_code",
        json!({"sandbox_id": id, "code": "kept = 'across sessions'"}),
    )
    .await;
    a.cancel().await.unwrap();
    let (b, _) = server.client(Revision::Stateless).await;
    let r = call(&b, "run_code", json!({"sandbox_id": id, "code": "kept"})).await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "'across sessions'"
    );
    b.cancel().await.unwrap();
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn output_is_capped() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--output-limit", "4000"],
        Revision::Stateless,
    )
    .await;
    let r = call(
        &client,
        "run_code",
        json!({"code": "print('A' * 100000)\nprint('END')"}),
    )
    .await;
    let s = structured(&r);
    assert_eq!(s["truncated"], true);
    let out = s["stdout"].as_str().unwrap();
    assert!(out.len() < 4200 && out.ends_with("END\n"), "{}", out.len());
    assert!(out.contains("bytes of output truncated"));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn idle_sandboxes_expire() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--sandbox-timeout", "1"],
        Revision::Stateless,
    )
    .await;
    let r = call(&client, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(&client, "create_sandbox", json!({"timeout_seconds": 60})).await;
    let kept = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    // A run longer than the idle timeout does not expire it: the clock runs only when idle.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "import time\ntime.sleep(2)\n'survived'"}),
    )
    .await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "'survived'",
        "{}",
        text(&r)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    assert!(is_error(&r), "idle sandbox did not expire: {}", text(&r));
    let r = call(&client, "list_sandboxes", json!({})).await;
    let ids: Vec<Value> = structured(&r)["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandbox_id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(kept)]);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn output_streams_as_progress_notifications() {
    let (client, recorder) = stdio_client(&["--pool", "0"], Revision::Legacy).await;
    let (result, done) = call_with_progress(
        &client,
        "run_code",
        json!({"code": "import time, sys\nprint('step one', flush=True)\ntime.sleep(1.5)\nprint('warn', file=sys.stderr)\nprint('step two')"}),
    )
    .await;
    assert_eq!(structured(&result)["stdout"], "step one\nstep two\n");
    let seen = recorder.progress.lock().unwrap().clone();
    let messages: Vec<String> = seen.iter().filter_map(|(_, p)| p.message.clone()).collect();
    let all = messages.concat();
    assert!(
        all.contains("step one") && all.contains("step two"),
        "{messages:?}"
    );
    assert!(all.contains("[stderr] warn"), "{messages:?}");
    let first = seen
        .iter()
        .find(|(_, p)| p.message.as_deref().is_some_and(|m| m.contains("step one")))
        .unwrap();
    assert!(
        done.duration_since(first.0) > Duration::from_millis(800),
        "progress was not live"
    );
    let values: Vec<f64> = seen.iter().map(|(_, p)| p.progress).collect();
    assert!(
        values.windows(2).all(|w| w[1] > w[0]),
        "progress must increase: {values:?}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn cancellation_interrupts_the_run() {
    for revision in [Revision::Legacy, Revision::Stateless] {
        let (client, _) = stdio_client(&["--pool", "0"], revision).await;
        let r = call(&client, "create_sandbox", json!({})).await;
        let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
        call(
            &client,
            "run_code",
            json!({"sandbox_id": id, "code": "state = 'intact'"}),
        )
        .await;
        let params = CallToolRequestParams::new("run_code").with_arguments(
            json!({"sandbox_id": id, "code": "import time\nwhile True:\n    time.sleep(0.05)"})
                .as_object()
                .unwrap()
                .clone(),
        );
        let handle = client
            .send_cancellable_request(
                ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params)),
                PeerRequestOptions::default(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let t = Instant::now();
        handle.cancel(Some("test".into())).await.unwrap();
        // The kernel is free again at once (the run was interrupted), with its state.
        let r = call(
            &client,
            "run_code",
            json!({"sandbox_id": id, "code": "state"}),
        )
        .await;
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(
            structured(&r)["results"][0]["data"]["text/plain"],
            "'intact'",
            "{revision:?}: {}",
            text(&r)
        );
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn stdio_shutdown_at_end_of_input_leaves_nothing() {
    let tag = canary("stdio-shutdown");
    let (client, _) = stdio_client(&["--pool", "1"], Revision::Legacy).await;
    let r = call(&client, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    call(&client, "run_command", json!({"sandbox_id": id, "command": format!("(trap '' TERM HUP; exec -a {tag} sleep 1000 &)")})).await;
    assert_eq!(host_processes_at_least(&tag, 1).len(), 1);
    // Closing the client closes the server's stdin; the server closes every sandbox and exits.
    client.cancel().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !host_processes_with(&tag).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
}

#[tokio::test]
async fn sigterm_closes_every_sandbox_and_exits_cleanly() {
    let tag = canary("sigterm");
    let server = HttpServer::start(&["--pool", "2"]).await;
    let (client, _) = server.client(Revision::Stateless).await;
    for _ in 0..2 {
        let r = call(&client, "create_sandbox", json!({})).await;
        let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
        call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": format!("(exec -a {tag} sleep 1000 &)")}),
        )
        .await;
    }
    assert_eq!(host_processes_at_least(&tag, 2).len(), 2);
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
    assert_eq!(host_processes_with(&tag), Vec::<i32>::new());
    // Nor any sandbox init (pooled sandboxes included).
    assert_eq!(
        host_processes_with("__sandbox-init")
            .iter()
            .filter(|p| is_child_of_dead_server(**p))
            .count(),
        0
    );
}

/// Inits whose parent chain no longer exists would be orphans; live ones belong to other tests.
fn is_child_of_dead_server(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ppid: i32 = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    ppid == 1
}

#[tokio::test]
async fn http_refuses_foreign_host_headers() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let status = |host: &'static str| {
        let url = server.url.clone();
        async move {
            let out = tokio::process::Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-H",
                    &format!("Host: {host}"),
                    "-H",
                    "Content-Type: application/json",
                    "-H",
                    "Accept: application/json, text/event-stream",
                    "-d",
                    body,
                    &url,
                ])
                .output()
                .await
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        }
    };
    assert_eq!(status("attacker.example").await, "403");
    assert_eq!(status("localhost").await, "200");
    assert!(server.stop().await.success());
}

#[tokio::test]
async fn bad_configuration_is_refused_at_start() {
    for (args, needle) in [
        (vec!["--http", "0.0.0.0:0"], "--insecure-public"),
        (vec!["--stdio", "--run-timeout", "900"], "max_run_timeout"),
        (vec![], "--stdio"),
    ] {
        let out = serve_command(&args).output().await.unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn plots_arrive_as_image_content() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    let r = call(
        &client,
        "run_code",
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nimport pandas as pd\npd.DataFrame({'a': [1]})"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let images: Vec<_> = r.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.len(), 1, "{:?}", r.content);
    assert_eq!(images[0].mime_type, "image/png");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let s = structured(&r);
    assert!(
        s["results"][1]["data"]["text/html"]
            .as_str()
            .unwrap()
            .contains("<table")
    );
    assert!(text(&r).contains("(also as text/html)"), "{}", text(&r));
    client.cancel().await.unwrap();
}

async fn run_in(client: &Client, id: &str, code: &str) -> Value {
    let r = call(client, "run_code", json!({"sandbox_id": id, "code": code})).await;
    structured(&r)
}

/// Waits (up to a minute) until the sandbox no longer lists a running Python kernel.
async fn wait_for_python_to_die(client: &Client, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = call(client, "get_sandbox_status", json!({"sandbox_id": id})).await;
        assert!(!is_error(&r), "{}", text(&r));
        if !structured(&r)["kernels"]
            .as_array()
            .unwrap()
            .contains(&json!("python"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the kernel did not die: {}",
            text(&r)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_kernel_that_died_between_runs_is_reported_by_the_next_run() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    let r = call(&client, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let s = run_in(&client, &id, "import os\nx = 41\nos.getpid()").await;
    let pid = s["results"][0]["data"]["text/plain"]
        .as_str()
        .unwrap()
        .to_owned();
    // Killed from outside between two runs: the next run says so, not the one after.
    let r = call(
        &client,
        "run_command",
        json!({"sandbox_id": id, "command": format!("kill -9 {pid}")}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = run_in(&client, &id, "x + 1").await;
    assert_eq!(s["kernel_restarted"], true, "{s}");
    let notes = s["notes"].to_string();
    assert!(notes.contains("lost after the previous run"), "{notes}");
    assert!(notes.contains("signal 9"), "{notes}");
    assert_eq!(s["error"]["name"], "NameError", "{s}");
    let s = run_in(&client, &id, "x = 1\nx + 1").await;
    assert_eq!(s["kernel_restarted"], false, "{s}");
    assert_eq!(s["notes"], json!([]), "{s}");
    assert_eq!(s["results"][0]["data"]["text/plain"], "2", "{s}");

    // Out of memory between runs (a thread the last run left behind), where the sandbox's
    // memory is measured (cgroups): the next run says the memory limit killed it.
    let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    if structured(&r)["memory_bytes"].is_null() {
        client.cancel().await.unwrap();
        return;
    }
    let s = run_in(
        &client,
        &id,
        "import threading, time\nkept = []\ndef hog():\n    time.sleep(0.2)\n    while True:\n        \
         kept.append(b'x' * (64 << 20))\nthreading.Thread(target=hog, daemon=True).start()",
    )
    .await;
    assert_eq!(s["error"], Value::Null, "{s}");
    wait_for_python_to_die(&client, &id).await;
    let s = run_in(&client, &id, "'fresh'").await;
    assert_eq!(s["kernel_restarted"], true, "{s}");
    let notes = s["notes"].to_string();
    assert!(notes.contains("ran out of memory"), "{notes}");
    assert_eq!(s["results"][0]["data"]["text/plain"], "'fresh'", "{s}");
    client.cancel().await.unwrap();
}

/// A copy of the host's `node` laid out as an installation (`<prefix>/bin/node`,
/// `<prefix>/lib/node_modules`) in a fresh directory under `parent` with `mode`.
fn node_installation(parent: &str, mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let host_node = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .expect("node on PATH");
    let host_node = std::fs::canonicalize(host_node).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("runbox-node-")
        .tempdir_in(parent)
        .unwrap();
    std::fs::create_dir_all(dir.path().join("bin")).unwrap();
    std::fs::create_dir_all(dir.path().join("lib/node_modules")).unwrap();
    let node = dir.path().join("bin/node");
    std::fs::copy(&host_node, &node).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, node)
}

#[tokio::test]
async fn an_interpreter_under_the_hosts_tmp_works() {
    let (dir, node) = node_installation("/tmp", 0o755);
    let (client, _) = stdio_client(
        &["--pool", "0", "--node", node.to_str().unwrap()],
        Revision::Stateless,
    )
    .await;
    let r = call(
        &client,
        "run_code",
        json!({"code": "process.execPath", "language": "javascript"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains(node.to_str().unwrap()), "{}", text(&r));
    // Every other language too (a bind the sandbox could not make used to fail them all).
    let r = call(&client, "run_code", json!({"code": "6 * 7"})).await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    // The sandbox's own /tmp stays its own and writable; the host's files there are
    // read-only, and no other file of the host's /tmp shows.
    let r = call(
        &client,
        "run_command",
        json!({"command": format!(
            "touch /tmp/mine && ls /tmp && ! touch {}/x 2>/dev/null && echo read-only",
            dir.path().display()
        )}),
    )
    .await;
    let s = structured(&r);
    let listed: Vec<&str> = s["stdout"].as_str().unwrap().lines().collect();
    let name = dir.path().file_name().unwrap().to_str().unwrap();
    assert_eq!(listed, ["mine", name, "read-only"], "{s}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn serve_refuses_to_start_when_an_interpreter_cannot_run_in_a_sandbox() {
    // Under /dev, where a sandbox has its own: refused before any sandbox is made.
    let (_dir, node) = node_installation("/dev/shm", 0o755);
    let out = serve_command(&["--stdio", "--pool", "0", "--node", node.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(node.to_str().unwrap()), "{err}");
    assert!(err.contains("/dev"), "{err}");
    assert!(err.contains("--node PATH"), "{err}");
    // As root, sandboxes run as other users: a node they cannot read fails the check that
    // starts each interpreter in a sandbox at start-up.
    if !running_as_root() {
        return;
    }
    let (_dir, node) = node_installation("/tmp", 0o700);
    let out = serve_command(&["--stdio", "--pool", "0", "--node", node.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(node.to_str().unwrap()), "{err}");
    assert!(err.contains("chmod o+rx"), "{err}");
}
