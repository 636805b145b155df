//! The protocol contract: the e2b backend, through the `Backend` trait, against an
//! in-process fake of the three surfaces (control plane, envd, code interpreter) that checks
//! every request against the protocol and the traffic recorded from the reference SDKs,
//! serves answers split at awkward byte boundaries and injects failures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use runbox_core::{
    Backend, CommandRequest, Credential, Error, ExecContext, ExecRequest, FileKind, InstallRequest,
    Language, Network, PackageManager, SandboxId, SandboxSpec, SandboxState,
};
use runbox_e2b::{E2bBackend, E2bConfig};
use runbox_e2b_fake::{
    Chunking, CommandReply, ExecReply, Fake, FakeConfig, Fault, FaultKind, Provider, Surface,
};
use serde_json::json;

const KEY: &str = "sk_test_key";

fn domain(p: Provider) -> &'static str {
    match p {
        Provider::E2b => "e2b.app",
        Provider::Novita => runbox_e2b::NOVITA_DOMAIN,
        Provider::NovitaLegacy => "sandbox.novita.ai",
    }
}

async fn fake(provider: Provider, chunking: Chunking) -> Fake {
    Fake::start(FakeConfig {
        provider,
        api_keys: vec![KEY.to_owned(), "sk_other".to_owned()],
        chunking,
    })
    .await
}

fn backend_with(fake: &Fake, provider: Provider, key: Option<&str>) -> E2bBackend {
    let mut c = E2bConfig::new(domain(provider));
    c.api_url = Some(fake.api_url());
    c.sandbox_url = Some(fake.sandbox_url());
    c.api_key = key.map(Credential::new);
    c.request_timeout = Duration::from_secs(10);
    E2bBackend::new(c).unwrap()
}

fn backend(fake: &Fake, provider: Provider) -> E2bBackend {
    backend_with(fake, provider, Some(KEY))
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        env: BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]),
        metadata: BTreeMap::from([("owner".to_owned(), "mcp".to_owned())]),
        idle_timeout: Some(Duration::from_secs(600)),
        ..SandboxSpec::default()
    }
}

fn py(code: &str) -> ExecRequest {
    ExecRequest::new(Language::Python, code, Duration::from_secs(10))
}

/// Everything a tool can do, on one provider, with answers split as `chunking` says.
async fn whole_flow(provider: Provider, chunking: Chunking) {
    let fake = fake(provider, chunking).await;
    fake.on_execute("x = 41", ExecReply::lines(vec![]));
    fake.on_execute(
        "print(x + 1)\nx + 1",
        ExecReply::lines(vec![
            json!({"type": "stdout", "text": "42\n", "timestamp": "2025-01-01T00:00:00.000000+00:00"}),
            json!({"type": "result", "text": "42", "png": "iVBORw0K\nGgo=", "extra": {}, "is_main_result": false}),
            json!({"type": "result", "text": "42", "extra": {}, "is_main_result": true}),
        ])
        .with_keepalives(3),
    );
    fake.on_execute(
        "1/0",
        ExecReply::lines(vec![json!({"type": "error", "name": "ZeroDivisionError",
            "value": "division by zero",
            "traceback": "\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero"})]),
    );
    fake.on_command(
        "echo hi; echo err >&2; exit 3",
        CommandReply::exit(3, "hi\n", "err\n").with_keepalives(2),
    );
    fake.on_command("sleep 1000", CommandReply::hang("started\n"));
    fake.on_command(
        "python3 -m pip install --disable-pip-version-check --no-input -- 'numpy'",
        CommandReply::ok("Successfully installed numpy\n"),
    );
    let b = backend(&fake, provider);

    let info = b.create(spec()).await.unwrap();
    let id = info.id.clone();
    if provider == Provider::NovitaLegacy {
        assert!(id.as_str().contains('-'), "legacy ids are composite: {id}");
    }
    assert_eq!(info.languages, Language::ALL);
    // Memory, CPUs and disk are the template's, as the provider reports them.
    assert_eq!(
        (
            info.limits.memory_mb,
            info.limits.cpus,
            info.limits.workspace_mb
        ),
        (512, 2.0, 1024)
    );
    assert!(info.allowed_hosts.is_empty(), "network none by default");
    let created = &fake.sandboxes()[0];
    assert_eq!(created.id, id.as_str());
    assert_eq!(created.env_vars["FOO"], "bar");
    assert_eq!(created.metadata["owner"], "mcp");
    // The provider's timer is set past the idle timeout.
    assert!(created.timeout_secs > 600, "{}", created.timeout_secs);

    // /workspace is the home's other name, linked as root when the sandbox was made.
    let link = fake
        .requests()
        .into_iter()
        .find(|r| r.path == "/process.Process/Start")
        .unwrap();
    assert_eq!(link.header("authorization"), Some("Basic cm9vdDo="));
    let w = b
        .write_file(&id, "/workspace/w.txt", b"w".to_vec(), false)
        .await
        .unwrap();
    assert_eq!(w.path, "/workspace/w.txt");
    assert_eq!(fake.file(id.as_str(), "/home/user/w.txt").unwrap(), b"w");

    // Python twice, state kept in the interpreter's context.
    let first = b
        .exec(&id, py("x = 41"), ExecContext::default())
        .await
        .unwrap();
    assert!(first.succeeded(), "{first:?}");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = {
        let seen = seen.clone();
        std::sync::Arc::new(move |c: runbox_core::OutputChunk| {
            seen.lock().unwrap().push_str(&c.text)
        })
    };
    let second = b
        .exec(&id, py("print(x + 1)\nx + 1"), ExecContext::streaming(sink))
        .await
        .unwrap();
    assert_eq!(second.stdout, "42\n");
    assert_eq!(*seen.lock().unwrap(), "42\n", "output streamed as it came");
    assert_eq!(second.results.len(), 2);
    assert_eq!(second.results[0].data["image/png"], "iVBORw0KGgo=");
    assert!(second.results[1].is_main_result);
    assert_eq!(second.results[1].text(), Some("42"));
    let execs = fake.executions();
    assert_eq!(execs.len(), 2);
    assert_eq!(execs[0].1, execs[1].1, "both ran in one context");
    assert_eq!((execs[0].3, execs[1].3), (1, 2));

    let failed = b
        .exec(&id, py("1/0"), ExecContext::default())
        .await
        .unwrap();
    let err = failed.error.unwrap();
    assert_eq!(err.name, "ZeroDivisionError");
    assert_eq!(err.traceback, "ZeroDivisionError: division by zero");

    // A command: its output, its status.
    let cmd = CommandRequest::new("echo hi; echo err >&2; exit 3", Duration::from_secs(10));
    let out = b.command(&id, cmd, ExecContext::default()).await.unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str(), out.exit_code),
        ("hi\n", "err\n", Some(3))
    );

    // Files: write, read back whole and in part, list, errors.
    let w = b
        .write_file(&id, "/home/user/a.txt", b"hello world".to_vec(), false)
        .await
        .unwrap();
    assert_eq!((w.path.as_str(), w.size), ("/workspace/a.txt", 11));
    b.write_file(&id, "/home/user/a.txt", b"!".to_vec(), true)
        .await
        .unwrap();
    assert_eq!(
        fake.file(id.as_str(), "/home/user/a.txt").unwrap(),
        b"hello world!"
    );
    let r = b.read_file(&id, "/home/user/a.txt", 0, None).await.unwrap();
    assert_eq!((r.data.as_slice(), r.size), (&b"hello world!"[..], 12));
    let part = b
        .read_file(&id, "/home/user/a.txt", 6, Some(5))
        .await
        .unwrap();
    assert_eq!(part.data, b"world");
    assert!(part.more());
    fake.put_file(id.as_str(), "/home/user/d/deep.bin", &[0, 159, 146, 150]);
    let flat = b.list_files(&id, "/home/user", false).await.unwrap();
    let names: Vec<&str> = flat.entries.iter().map(|e| e.name.as_str()).collect();
    assert!(
        names.contains(&"a.txt") && names.contains(&"d"),
        "{names:?}"
    );
    assert!(!names.contains(&"deep.bin"));
    let deep = b.list_files(&id, "/home/user", true).await.unwrap();
    let bin = deep
        .entries
        .iter()
        .find(|e| e.path == "/workspace/d/deep.bin")
        .unwrap();
    assert_eq!((bin.kind, bin.size), (FileKind::File, 4));
    assert!(
        deep.entries
            .iter()
            .any(|e| e.path == "/workspace/d" && e.kind == FileKind::Directory)
    );
    let missing = b.read_file(&id, "/nope", 0, None).await.unwrap_err();
    assert!(matches!(missing, Error::FileNotFound { .. }), "{missing}");
    let dir = b.read_file(&id, "/home/user", 0, None).await.unwrap_err();
    assert!(dir.to_string().contains("is a directory"), "{dir}");

    // Packages.
    let install = InstallRequest {
        manager: PackageManager::Pip,
        packages: vec!["numpy".into()],
        timeout: Duration::from_secs(30),
    };
    let out = b
        .install(&id, install, ExecContext::default())
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
    assert!(out.stdout.contains("Successfully installed"));

    // A background process: started, read, killed.
    let p = b
        .start_process(
            &id,
            CommandRequest::new("sleep 1000", Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let got = b
        .read_process(&id, &p.id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got.stdout, "started\n");
    assert!(got.info.running());
    let killed = b.kill_process(&id, &p.id).await.unwrap();
    assert_eq!(killed.exit_code, Some(137));
    let status = b.status(&id).await.unwrap();
    assert_eq!(status.state, SandboxState::Running);
    assert_eq!(status.processes.len(), 1);
    assert_eq!(status.kernels, [Language::Python]);

    // Pause and resume.
    b.set_paused(&id, true).await.unwrap();
    assert_eq!(fake.sandboxes()[0].state, "paused");
    let refused = b.exec(&id, py("x = 41"), ExecContext::default()).await;
    assert!(refused.unwrap_err().to_string().contains("paused"));
    b.set_paused(&id, false).await.unwrap();
    assert_eq!(fake.sandboxes()[0].state, "running");
    let again = b
        .exec(&id, py("print(x + 1)\nx + 1"), ExecContext::default())
        .await
        .unwrap();
    assert_eq!(again.stdout, "42\n");

    b.close(&id).await.unwrap();
    assert!(fake.sandboxes().is_empty());
    let gone = b.status(&id).await.unwrap_err();
    assert!(matches!(gone, Error::SandboxNotFound { .. }));
    fake.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_whole_flow() {
    whole_flow(Provider::E2b, Chunking::Whole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_whole_flow_bytewise() {
    whole_flow(Provider::E2b, Chunking::Bytewise).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn novita_whole_flow() {
    whole_flow(Provider::Novita, Chunking::Every(7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn novita_legacy_whole_flow() {
    whole_flow(Provider::NovitaLegacy, Chunking::Bytewise).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_bodies_match_what_each_sdk_sends() {
    for provider in [Provider::E2b, Provider::Novita, Provider::NovitaLegacy] {
        let fake = fake(provider, Chunking::Whole).await;
        let b = backend(&fake, provider);
        let id = b
            .create(SandboxSpec {
                network: Network::Allowlist(Vec::new()),
                ..spec()
            })
            .await
            .unwrap()
            .id;
        let create = fake
            .requests()
            .into_iter()
            .find(|r| r.method == "POST" && r.path == "/sandboxes")
            .unwrap();
        let body = create.json().unwrap();
        assert_eq!(body["templateID"], "code-interpreter-v1");
        assert!(body["timeout"].is_u64());
        match provider {
            Provider::E2b => {
                assert_eq!(body["allow_internet_access"], true);
                assert!(body.get("secure").is_none());
            }
            Provider::Novita => {
                assert_eq!(
                    (&body["secure"], &body["autoPause"]),
                    (&json!(true), &json!(false))
                );
                assert_eq!(body["allow_internet_access"], true);
            }
            Provider::NovitaLegacy => {
                assert_eq!(body["secure"], false);
                assert_eq!(body["allowInternetAccess"], true);
            }
        }
        assert_eq!(create.header("x-api-key"), Some(KEY));
        assert_eq!(create.header("authorization"), None);
        b.close(&id).await.unwrap();
        fake.assert_clean();
    }
}

fn refuse(
    surface: Surface,
    method: Option<http::Method>,
    path: &str,
    times: usize,
    status: u16,
    body: &str,
    retry_after: Option<u64>,
) -> Fault {
    Fault {
        surface,
        method,
        path_suffix: path.to_owned(),
        times,
        kind: FaultKind::Status {
            status,
            body: body.to_owned(),
            retry_after,
        },
    }
}

fn post() -> Option<http::Method> {
    Some(http::Method::POST)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_for_now_are_retried_after_the_delay_asked() {
    let fake = fake(Provider::E2b, Chunking::Whole).await;
    let b = backend(&fake, Provider::E2b);
    fake.fail(refuse(
        Surface::Api,
        post(),
        "/sandboxes",
        1,
        429,
        r#"{"code":429,"message":"slow down"}"#,
        Some(1),
    ));
    let started = Instant::now();
    let id = b.create(spec()).await.unwrap().id;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    let creates = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/sandboxes")
        .count();
    assert_eq!(creates, 2);
    assert_eq!(fake.sandboxes().len(), 1, "one sandbox, not two");

    // 502, 503 and 504 on an idempotent call: retried until it works.
    for status in [502, 503, 504] {
        fake.fail(refuse(
            Surface::Api,
            Some(http::Method::GET),
            "",
            1,
            status,
            "upstream hiccup",
            Some(0),
        ));
    }
    assert_eq!(b.status(&id).await.unwrap().state, SandboxState::Running);

    // A 502 on create is not retried: the sandbox may have been made.
    fake.fail(refuse(
        Surface::Api,
        post(),
        "/sandboxes",
        1,
        502,
        "bad gateway",
        Some(0),
    ));
    let e = b.create(spec()).await.unwrap_err();
    assert!(runbox_core::chain(&e).contains("502"), "{e}");

    // A delay longer than runbox waits is reported, not slept through.
    fake.fail(refuse(
        Surface::Api,
        post(),
        "/sandboxes",
        1,
        429,
        r#"{"code":429,"message":"rate limit"}"#,
        Some(120),
    ));
    let started = Instant::now();
    let e = b.create(spec()).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("retry in 120 s"), "{e}");
    assert!(e.is_caller_error());

    // Should-Retry is the provider's word; a refusal beyond the retries is reported.
    fake.fail(refuse(
        Surface::Api,
        post(),
        "/sandboxes",
        4,
        503,
        "busy",
        Some(0),
    ));
    let e = b.create(spec()).await.unwrap_err();
    assert!(runbox_core::chain(&e).contains("503: busy"), "{e}");
    b.close(&id).await.unwrap();
    fake.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_become_clear_tool_errors() {
    let fake = fake(Provider::E2b, Chunking::Every(3)).await;
    // A key the provider does not know.
    let stranger = backend_with(&fake, Provider::E2b, Some("sk_unknown"));
    let e = stranger.create(spec()).await.unwrap_err();
    assert!(e.to_string().contains("refused the API key"), "{e}");
    assert!(e.is_caller_error());
    // No key at all: neither the server's nor the caller's.
    let keyless = backend_with(&fake, Provider::E2b, None);
    let e = keyless.create(spec()).await.unwrap_err();
    assert!(e.to_string().contains("no E2B API key"), "{e}");
    // The caller's own key (passthrough) makes the sandbox, and every later call about it
    // uses that key.
    let id = keyless
        .create(SandboxSpec {
            credential: Some(Credential::new("sk_other")),
            ..spec()
        })
        .await
        .unwrap()
        .id;
    assert_eq!(fake.sandboxes()[0].api_key, "sk_other");
    keyless.status(&id).await.unwrap();
    keyless.close(&id).await.unwrap();

    let b = backend(&fake, Provider::E2b);
    let id = b.create(spec()).await.unwrap().id;

    // The interpreter's stream cut before end_of_execution.
    fake.on_execute("print(1)", ExecReply::stdout("1\n"));
    fake.fail(Fault::cut(Surface::Interpreter, post(), "/execute", 1));
    let e = b
        .exec(&id, py("print(1)"), ExecContext::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("ended before the run did"), "{e}");
    // ... and one that just ends without it.
    fake.on_execute("print(2)", ExecReply::stdout("2\n").without_end());
    let e = b
        .exec(&id, py("print(2)"), ExecContext::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("ended before the run did"), "{e}");
    // The interpreter's plain-text errors.
    fake.fail(refuse(
        Surface::Interpreter,
        post(),
        "/execute",
        1,
        404,
        "Context abc not found",
        None,
    ));
    let e = b
        .exec(&id, py("print(1)"), ExecContext::default())
        .await
        .unwrap_err();
    assert!(
        runbox_core::chain(&e).contains("Context abc not found"),
        "{e}"
    );

    // A run past its timeout is stopped and says so.
    fake.on_execute(
        "import time; time.sleep(60)",
        ExecReply::stdout("sleeping\n").with_delay(Duration::from_secs(30)),
    );
    let slow = ExecRequest::new(
        Language::Python,
        "import time; time.sleep(60)",
        Duration::from_millis(500),
    );
    let out = b.exec(&id, slow, ExecContext::default()).await.unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout, "sleeping\n");
    assert!(out.notes[0].contains("timeout"));

    // A command past its timeout: envd's deadline ends it, the stream says so.
    fake.on_command("sleep 30", CommandReply::hang(""));
    let out = b
        .command(
            &id,
            CommandRequest::new("sleep 30", Duration::from_millis(300)),
            ExecContext::default(),
        )
        .await
        .unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, Some(137));
    // A command whose stream ends with an error after its exit.
    fake.on_command(
        "true",
        CommandReply::ok("").with_end_error("internal", "lost the pipe"),
    );
    let out = b
        .command(
            &id,
            CommandRequest::new("true", Duration::from_secs(5)),
            ExecContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
    // A Start stream cut after its first event.
    fake.on_command("echo cut", CommandReply::ok("cut\n"));
    fake.fail(Fault::cut(
        Surface::Envd,
        post(),
        "/process.Process/Start",
        1,
    ));
    let e = b
        .command(
            &id,
            CommandRequest::new("echo cut", Duration::from_secs(5)),
            ExecContext::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("before the command ended"), "{e}");
    assert!(
        runbox_core::chain(&e).contains("connection to E2B's sandbox daemon"),
        "{e}"
    );
    // A command runbox cancels is killed.
    let cancel = tokio_util::sync::CancellationToken::new();
    let ctx = ExecContext {
        cancel: cancel.clone(),
        ..ExecContext::default()
    };
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let out = b
        .command(
            &id,
            CommandRequest::new("sleep 30", Duration::from_secs(30)),
            ctx,
        )
        .await
        .unwrap();
    assert!(out.cancelled);
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path == "/process.Process/SendSignal"),
        "the cancelled command was killed"
    );

    // Pausing twice: the provider's 409 means done.
    b.set_paused(&id, true).await.unwrap();
    b.set_paused(&id, true).await.unwrap();
    b.set_paused(&id, false).await.unwrap();

    // A sandbox that expired at the provider is gone, and forgotten.
    fake.expire(id.as_str());
    let e = b
        .exec(&id, py("print(1)"), ExecContext::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::SandboxNotFound { .. }), "{e}");
    let e = b.status(&id).await.unwrap_err();
    assert!(matches!(e, Error::SandboxNotFound { .. }), "{e}");
    let unknown = SandboxId::from("never-made");
    assert!(matches!(
        b.close(&unknown).await.unwrap_err(),
        Error::SandboxNotFound { .. }
    ));

    // Appending rewrites the file, so only up to a size.
    let id = b.create(spec()).await.unwrap().id;
    fake.put_file(id.as_str(), "/home/user/big.bin", &vec![0u8; 33 << 20]);
    let e = b
        .write_file(&id, "/workspace/big.bin", b"more".to_vec(), true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cat >>"), "{e}");

    // A run that displays without end returns what fits, and says what it left out.
    let many: Vec<serde_json::Value> = (0..1005)
        .map(|i| json!({"type": "result", "text": i.to_string(), "extra": {}, "is_main_result": false}))
        .collect();
    fake.on_execute("for i in range(1005): display(i)", ExecReply::lines(many));
    let out = b
        .exec(
            &id,
            py("for i in range(1005): display(i)"),
            ExecContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.results.len(), runbox_core::capture::MAX_RESULTS);
    assert!(
        out.notes.iter().any(|n| n.starts_with("5 rich results")),
        "{:?}",
        out.notes
    );

    // Egress to chosen hosts is not something the provider offers.
    let e = b
        .create(SandboxSpec {
            network: Network::Allowlist(vec!["pypi.org".into()]),
            ..spec()
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    fake.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_in_use_has_its_life_at_the_provider_pushed_on() {
    let fake = fake(Provider::E2b, Chunking::Whole).await;
    let mut c = E2bConfig::new("e2b.app");
    c.api_url = Some(fake.api_url());
    c.sandbox_url = Some(fake.sandbox_url());
    c.api_key = Some(Credential::new(KEY));
    c.lifetime_margin = Duration::ZERO;
    let b = E2bBackend::new(c).unwrap();
    let id = b
        .create(SandboxSpec {
            idle_timeout: Some(Duration::from_secs(2)),
            ..spec()
        })
        .await
        .unwrap()
        .id;
    assert_eq!(fake.sandboxes()[0].timeout_secs, 3, "1.5 idle timeouts");
    let timeouts = || {
        fake.requests()
            .iter()
            .filter(|r| r.path.ends_with("/timeout"))
            .count()
    };
    // Used at once: nothing to push on yet.
    b.list_files(&id, "/home/user", false).await.unwrap();
    assert_eq!(timeouts(), 0);
    // Used after a quarter of its life: the timer starts again.
    tokio::time::sleep(Duration::from_millis(900)).await;
    b.list_files(&id, "/home/user", false).await.unwrap();
    assert_eq!(timeouts(), 1);
    let set = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/timeout"))
        .unwrap();
    assert_eq!(set.json().unwrap(), json!({"timeout": 3}));
    b.list_files(&id, "/home/user", false).await.unwrap();
    assert_eq!(timeouts(), 1, "not again so soon");
    // A longer idle timeout moves the provider's timer at once.
    b.idle_timeout_changed(&id, Duration::from_secs(100))
        .await
        .unwrap();
    assert_eq!(timeouts(), 2);
    assert_eq!(fake.sandboxes()[0].timeout_secs, 150);
    b.close(&id).await.unwrap();
    fake.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_every_sandbox() {
    let fake = fake(Provider::Novita, Chunking::Whole).await;
    let b = backend(&fake, Provider::Novita);
    for _ in 0..3 {
        b.create(spec()).await.unwrap();
    }
    assert_eq!(fake.sandboxes().len(), 3);
    b.shutdown().await;
    assert!(fake.sandboxes().is_empty());
    fake.assert_clean();
}
