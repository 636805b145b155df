//! `runbox serve --backend e2b` end to end: real MCP clients over streamable HTTP, the real
//! server binary, and an in-process fake of the provider's three surfaces (control plane,
//! envd, code interpreter) that checks every request against the protocol and the traffic
//! recorded from the reference SDKs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use runbox_e2b_fake::{Chunking, CommandReply, ExecReply, Fake, FakeConfig, Provider};
use serde_json::{Value, json};
use util::mcp::*;

const ALICE: &str = "sk_alice_0123456789";
const BOB: &str = "sk_bob_9876543210";

async fn fake(provider: Provider) -> Fake {
    Fake::start(FakeConfig {
        provider,
        api_keys: vec![ALICE.to_owned(), BOB.to_owned()],
        chunking: Chunking::Every(5),
    })
    .await
}

/// `runbox serve --http` on the e2b backend pointed at `fake`, with `args` besides.
async fn server(fake: &Fake, domain: &str, args: &[&str]) -> HttpServer {
    let api = fake.api_url();
    let sandbox = fake.sandbox_url();
    let mut all = vec![
        "--http",
        "127.0.0.1:0",
        "--backend",
        "e2b",
        "--e2b-domain",
        domain,
        "--e2b-api-url",
        &api,
        "--e2b-sandbox-url",
        &sandbox,
    ];
    all.extend_from_slice(args);
    let mut command = serve_command(&all);
    command
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("E2B_API_KEY")
        .env_remove("NOVITA_API_KEY");
    HttpServer::spawn(command).await
}

fn sandbox_id_of(created: &str) -> String {
    created
        .rsplit("Sandbox ID: ")
        .next()
        .unwrap()
        .trim()
        .to_owned()
}

/// Seed 000's flow: a Novita-tutorial server in front of Novita, each user's own key sent as
/// the bearer token. Create, run Python twice with state, run a command, stop.
#[tokio::test]
async fn the_novita_tutorial_flow_with_each_users_own_key() {
    let fake = fake(Provider::Novita).await;
    fake.on_execute("x = 21", ExecReply::lines(vec![]));
    fake.on_execute("print(x * 2)", ExecReply::stdout("42\n"));
    fake.on_command("ls -1 /workspace", CommandReply::ok("data.csv\n"));
    let server = server(
        &fake,
        "us-phx-1.sandbox.novita.ai",
        &["--profile", "novita-tutorial", "--auth", "passthrough"],
    )
    .await;

    // Without a key there is nothing to pass through.
    let anonymous = http()
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    for revision in [Revision::Legacy, Revision::Stateless] {
        let alice = client_with_token(&server.url, ALICE, revision).await;
        let created = call(&alice, "create_sandbox_session", json!({})).await;
        assert!(!is_error(&created), "{}", text(&created));
        let id = sandbox_id_of(&text(&created));
        let at_provider = fake.sandboxes();
        let made = at_provider.iter().find(|s| s.id == id).unwrap();
        assert_eq!(made.api_key, ALICE, "made with the caller's own key");

        let first = call(
            &alice,
            "run_python_code",
            json!({"python_code": "x = 21", "sandbox_id": id}),
        )
        .await;
        assert!(!is_error(&first), "{}", text(&first));
        let second = call(
            &alice,
            "run_python_code",
            json!({"python_code": "print(x * 2)", "sandbox_id": id}),
        )
        .await;
        assert!(!is_error(&second), "{}", text(&second));
        let answer: Value = serde_json::from_str(&text(&second)).unwrap();
        assert_eq!(answer["logs"]["stdout"], json!(["42\n"]), "{answer}");
        let runs: Vec<_> = fake
            .executions()
            .into_iter()
            .filter(|e| e.0 == id)
            .collect();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].1, runs[1].1, "both runs in one context: state kept");

        let listed = call(
            &alice,
            "run_on_command_line",
            json!({"command_line": "ls -1 /workspace", "sandbox_id": id}),
        )
        .await;
        assert!(!is_error(&listed), "{}", text(&listed));
        let answer: Value = serde_json::from_str(&text(&listed)).unwrap();
        assert_eq!(answer["output"]["stdout"], "data.csv\n", "{answer}");
        assert_eq!(answer["output"]["exit_code"], 0, "{answer}");

        // Another key sees nothing of Alice's, and nothing reaches the provider for it.
        let bob = client_with_token(&server.url, BOB, revision).await;
        let before = fake.requests().len();
        let stolen = call(
            &bob,
            "run_python_code",
            json!({"python_code": "print(x * 2)", "sandbox_id": id}),
        )
        .await;
        // As the tutorial answered: {"error": ...} and a "Failed to kill" text, in ordinary
        // content.
        assert!(!is_error(&stolen));
        let answer: Value = serde_json::from_str(&text(&stolen)).unwrap();
        assert!(
            answer["error"].as_str().unwrap().contains("not found"),
            "{answer}"
        );
        let stop = call(&bob, "stop_sandbox_session", json!({"sandbox_id": id})).await;
        assert!(
            text(&stop).starts_with(&format!("Failed to kill Sandbox ID: {id}")),
            "{}",
            text(&stop)
        );
        assert_eq!(
            fake.requests().len(),
            before,
            "Bob's calls never left runbox"
        );

        let stopped = call(&alice, "stop_sandbox_session", json!({"sandbox_id": id})).await;
        assert!(!is_error(&stopped), "{}", text(&stopped));
        assert!(fake.sandboxes().iter().all(|s| s.id != id));
        alice.cancel().await.unwrap();
        bob.cancel().await.unwrap();
    }

    // Every request the provider got carried the key of the caller it was for.
    for r in fake.requests() {
        if let Some(key) = r.header("x-api-key") {
            assert!(key == ALICE || key == BOB, "{key}");
        }
    }

    // A key the provider refuses: the provider's word, plainly.
    let stranger = client_with_token(&server.url, "sk_nobody", Revision::Legacy).await;
    let refused = call(&stranger, "create_sandbox_session", json!({})).await;
    assert!(text(&refused).starts_with("Failed to create new sandbox: "));
    assert!(
        text(&refused).contains("refused the API key"),
        "{}",
        text(&refused)
    );
    stranger.cancel().await.unwrap();

    // A sandbox left open is killed at the provider when the server stops.
    let bob = client_with_token(&server.url, BOB, Revision::Legacy).await;
    let created = call(&bob, "create_sandbox_session", json!({})).await;
    assert!(!is_error(&created), "{}", text(&created));
    assert_eq!(fake.sandboxes().len(), 1);
    bob.cancel().await.unwrap();
    assert!(server.stop().await.success());
    assert!(fake.sandboxes().is_empty(), "{:?}", fake.sandboxes());
    fake.assert_clean();
}

/// runbox's own tools on the e2b backend with the operator's key: every tool answers in
/// the shape it has on the local backend.
#[tokio::test]
async fn runbox_tools_answer_alike_on_cloud_sandboxes() {
    let fake = fake(Provider::E2b).await;
    fake.on_execute(
        "plot()",
        ExecReply::lines(vec![
            json!({"type": "stdout", "text": "drawing\n", "timestamp": "2025-01-01T00:00:00.000000+00:00"}),
            json!({"type": "result", "text": "<Figure size 640x480 with 1 Axes>", "png": "iVBORw0KGgo=", "extra": {}, "is_main_result": false}),
        ]),
    );
    fake.on_execute(
        "1/0",
        ExecReply::lines(vec![json!({"type": "error",
        "name": "ZeroDivisionError", "value": "division by zero",
        "traceback": "\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero"})]),
    );
    fake.on_command("exit 3", CommandReply::exit(3, "", "bye\n"));
    fake.on_command("tail -f /dev/null", CommandReply::hang("waiting\n"));
    let server = server(&fake, "e2b.app", &["--e2b-api-key", ALICE]).await;
    let (c, _) = server.client(Revision::Stateless).await;

    let created = call(&c, "create_sandbox", json!({})).await;
    assert!(!is_error(&created), "{}", text(&created));
    let id = structured(&created)["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(fake.sandboxes()[0].api_key, ALICE);

    let plot = call(
        &c,
        "run_code",
        json!({"code": "plot()", "language": "python", "sandbox_id": id}),
    )
    .await;
    assert!(!is_error(&plot), "{}", text(&plot));
    assert_eq!(structured(&plot)["stdout"], "drawing\n");
    let image = plot.content.iter().find_map(|c| c.as_image()).unwrap();
    assert_eq!(
        (image.mime_type.as_str(), image.data.as_str()),
        ("image/png", "iVBORw0KGgo=")
    );

    let raised = call(
        &c,
        "run_code",
        json!({"code": "1/0", "language": "python", "sandbox_id": id}),
    )
    .await;
    assert!(is_error(&raised));
    assert_eq!(structured(&raised)["error"]["name"], "ZeroDivisionError");
    assert!(!text(&raised).contains('\u{1b}'), "no terminal escapes");

    let exit = call(
        &c,
        "run_command",
        json!({"command": "exit 3", "sandbox_id": id}),
    )
    .await;
    assert!(is_error(&exit));
    assert_eq!(structured(&exit)["exit_code"], 3);
    assert_eq!(structured(&exit)["stderr"], "bye\n");

    let written = call(
        &c,
        "write_file",
        json!({"sandbox_id": id, "path": "notes/a.txt", "content": "hello"}),
    )
    .await;
    assert!(!is_error(&written), "{}", text(&written));
    assert_eq!(fake.file(&id, "/home/user/notes/a.txt").unwrap(), b"hello");
    let read = call(
        &c,
        "read_file",
        json!({"sandbox_id": id, "path": "notes/a.txt"}),
    )
    .await;
    assert_eq!(structured(&read)["content"], "hello", "{}", text(&read));
    let listed = call(
        &c,
        "list_files",
        json!({"sandbox_id": id, "path": "/workspace/notes"}),
    )
    .await;
    assert!(
        text(&listed).contains("/workspace/notes/a.txt"),
        "{}",
        text(&listed)
    );
    let absolute = call(
        &c,
        "write_file",
        json!({"sandbox_id": id, "path": "/workspace/b.txt", "content": "b"}),
    )
    .await;
    assert_eq!(
        structured(&absolute)["path"],
        "/workspace/b.txt",
        "{}",
        text(&absolute)
    );
    assert_eq!(fake.file(&id, "/home/user/b.txt").unwrap(), b"b");

    let started = call(
        &c,
        "run_command",
        json!({"command": "tail -f /dev/null", "sandbox_id": id, "background": true}),
    )
    .await;
    assert!(!is_error(&started), "{}", text(&started));
    let process = structured(&started)["process_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = call(
        &c,
        "read_process_output",
        json!({"sandbox_id": id, "process_id": process, "wait_seconds": 5}),
    )
    .await;
    assert_eq!(
        structured(&out)["stdout"],
        "waiting\n",
        "{}\n{:#?}",
        text(&out),
        fake.requests()
            .iter()
            .map(|r| (&r.path, String::from_utf8_lossy(&r.body)))
            .collect::<Vec<_>>()
    );
    let killed = call(
        &c,
        "kill_process",
        json!({"sandbox_id": id, "process_id": process}),
    )
    .await;
    assert!(!is_error(&killed), "{}", text(&killed));

    let paused = call(&c, "pause_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&paused), "{}", text(&paused));
    assert_eq!(fake.sandboxes()[0].state, "paused");
    let resumed = call(&c, "resume_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&resumed), "{}", text(&resumed));
    // A new idle timeout moves the provider's timer past it at once.
    let longer = call(
        &c,
        "set_sandbox_timeout",
        json!({"sandbox_id": id, "timeout_seconds": 3600}),
    )
    .await;
    assert!(!is_error(&longer), "{}", text(&longer));
    assert_eq!(fake.sandboxes()[0].timeout_secs, 3600 + 1800 + 600);
    let status = call(&c, "get_sandbox_status", json!({"sandbox_id": id})).await;
    assert!(!is_error(&status), "{}", text(&status));
    assert_eq!(structured(&status)["state"], "running");

    let closed = call(&c, "close_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&closed), "{}", text(&closed));
    assert!(fake.sandboxes().is_empty());
    c.cancel().await.unwrap();
    fake.assert_clean();
}

/// Settings that cannot work are refused at start, saying why.
#[tokio::test]
async fn bad_e2b_settings_are_refused_at_start() {
    let cases: [(&[&str], &str); 5] = [
        (&["--backend", "e2b"], "needs an API key for E2B"),
        (
            &[
                "--backend",
                "e2b",
                "--auth",
                "passthrough",
                "--e2b-api-key",
                "k",
            ],
            "leave out --e2b-api-key",
        ),
        (&["--auth", "passthrough"], "needs --backend e2b"),
        (
            &["--e2b-domain", "e2b.app"],
            "applies to --backend e2b only",
        ),
        (
            &[
                "--backend",
                "e2b",
                "--e2b-api-key",
                "k",
                "--e2b-sandbox-url",
                "http://x/{port}",
            ],
            "{sandbox_id}",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["--http", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let out = serve_command(&all)
            .env_remove("E2B_API_KEY")
            .env_remove("NOVITA_API_KEY")
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// Output of a cloud run arrives as progress while it runs; the audit log and the metrics
/// count cloud runs as they count local ones, and name a passed-through key only by its
/// hash.
#[tokio::test]
async fn progress_audit_and_metrics_work_on_cloud_sandboxes() {
    use std::time::Duration;

    let fake = fake(Provider::E2b).await;
    fake.on_execute(
        "work()",
        ExecReply::stdout("step one\n").with_delay(Duration::from_millis(1500)),
    );
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let server = server(
        &fake,
        "e2b.app",
        &[
            "--auth",
            "passthrough",
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    )
    .await;
    let client = client_with_token(&server.url, ALICE, Revision::Legacy).await;
    let id = structured(&call(&client, "create_sandbox", json!({})).await)["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (result, done) = call_with_progress(
        &client,
        "run_code",
        json!({"code": "work()", "sandbox_id": id}),
    )
    .await;
    assert_eq!(structured(&result)["stdout"], "step one\n");
    let seen = client.service().progress.lock().unwrap().clone();
    let first = seen
        .iter()
        .find(|(_, p)| p.message.as_deref().is_some_and(|m| m.contains("step one")))
        .expect("output came as progress");
    assert!(
        done.duration_since(first.0) > Duration::from_millis(800),
        "progress was not live"
    );
    call(&client, "close_sandbox", json!({"sandbox_id": id})).await;
    client.cancel().await.unwrap();

    let metrics = server.metrics().await;
    assert!(
        metrics.contains("runbox_runs_total{language=\"python\",outcome=\"ok\"} 1"),
        "{metrics}"
    );
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(!log.contains(ALICE), "the key is never written");
    let run: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["tool"] == "run_code")
        .unwrap();
    assert!(run["tenant"].as_str().unwrap().starts_with("key-"), "{run}");
    assert_eq!(run["sandbox_id"], id.as_str());
    assert_eq!(run["outcome"], "ok");
    fake.assert_clean();
}

/// `runbox doctor --backend e2b` proves the settings with a real (here: fake) cloud
/// sandbox, and says plainly when the key is refused.
#[tokio::test]
async fn doctor_proves_the_e2b_settings_with_a_sandbox() {
    let fake = fake(Provider::Novita).await;
    fake.on_execute("print(1 + 1)", ExecReply::stdout("2\n"));
    fake.on_command("echo ok", CommandReply::ok("ok\n"));
    let doctor = |key: &str| {
        let mut c = tokio::process::Command::new(util::runbox_exe());
        c.args([
            "doctor",
            "--backend",
            "e2b",
            "--e2b-domain",
            "us-phx-1.sandbox.novita.ai",
            "--e2b-api-url",
            &fake.api_url(),
            "--e2b-sandbox-url",
            &fake.sandbox_url(),
            "--e2b-api-key",
            key,
        ])
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("RUNBOX_LOG", "warn");
        c
    };
    let out = doctor(ALICE).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for line in [
        "ok    sandbox",
        "ok    python",
        "ok    command",
        "ok    files",
        "ok    closed",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
    assert!(stdout.contains("Novita"), "{stdout}");
    assert!(!stdout.contains(ALICE), "the key is never printed");
    assert!(
        fake.sandboxes().is_empty(),
        "the doctor's sandbox is killed"
    );

    let out = doctor("sk_wrong").output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  sandbox"), "{stdout}");
    assert!(stdout.contains("refused the API key"), "{stdout}");
    fake.assert_clean();
}
