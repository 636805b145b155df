//! The optional parts of the protocol runbox serves, each through a real rmcp client in both
//! revisions, against `runbox serve` with real sandboxes: logging of sandbox lifecycle events
//! (2025-11-25 `logging/setLevel` on the session, 2026-07-28 per-request log levels),
//! completions for the resource template, resource subscriptions (`resources/subscribe`,
//! `subscriptions/listen`) and task-augmented runs (the tasks extension). Tenants never
//! hear of, complete, or touch another tenant's sandboxes and tasks.
#![allow(clippy::unwrap_used, clippy::expect_used, deprecated)]

mod util;

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompletionContext, ErrorCode,
    GetTaskParams, LoggingLevel, RequestMetaObject, SetLevelRequestParams, SubscribeRequestParams,
    SubscriptionFilter, TaskPayload, TaskStatus, UnsubscribeRequestParams,
};
use rmcp::service::ServiceError;
use serde_json::{Value, json};
use util::mcp::*;

const TEMPLATE: &str = "sandbox://{sandbox_id}/files/{path}";

/// Code that waits until `/workspace/<name>` exists, then prints and returns.
fn wait_for_file(name: &str) -> String {
    format!(
        "import os, time\nwhile not os.path.exists('/workspace/{name}'):\n    time.sleep(0.05)\nprint('released')\n'value'"
    )
}

/// A tokens file with tenants alice and bob; their tokens.
fn two_tenants(dir: &tempfile::TempDir) -> (std::path::PathBuf, String, String) {
    let file = dir.path().join("tokens.toml");
    let alice = add_token(&file, "alice", &[]);
    let bob = add_token(&file, "bob", &[]);
    (file, alice, bob)
}

fn params(tool: &str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().unwrap().clone())
}

/// Calls `tool` with `_meta` logLevel `level` (2026-07-28's per-request opt-in).
async fn call_logged(
    client: &Client,
    tool: &str,
    args: Value,
    level: LoggingLevel,
) -> rmcp::model::CallToolResult {
    let mut meta = RequestMetaObject::new();
    meta.set_log_level(level);
    let mut p = params(tool, args);
    p.meta = Some(meta);
    client.call_tool(p).await.unwrap()
}

async fn create(client: &Client, args: Value) -> String {
    let r = call(client, "create_sandbox", args).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

async fn write(client: &Client, id: &str, path: &str, content: &str) {
    let r = call(
        client,
        "write_file",
        json!({"sandbox_id": id, "path": path, "content": content}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
}

/// Sends a proxy request for a host off the allowlist; the proxy's status line.
const REFUSED_CONNECT: &str = "import os, socket
proxy = os.environ['HTTP_PROXY'].rsplit(':', 1)
s = socket.create_connection((proxy[0].split('//')[1], int(proxy[1])), timeout=20)
s.sendall(b'CONNECT evil.example:443 HTTP/1.1\\r\\nHost: evil.example:443\\r\\n\\r\\n')
s.recv(4096).split(b'\\r\\n')[0].decode()";

/// Python that ignores the interrupt: its kernel is killed and restarted.
const STUBBORN: &str =
    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";

/// Waits until `tenant`'s sandbox `id` is gone (expired), asking `client`.
async fn wait_gone(client: &Client, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = call(client, "list_sandboxes", json!({})).await;
        let listed = structured(&r)["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sandbox_id"] == id);
        if !listed {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn lifecycle_events_reach_the_owners_2025_sessions_that_set_a_level() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&[
        "--pool",
        "0",
        "--tokens",
        tokens.to_str().unwrap(),
        "--allow-host",
        "allowed.invalid",
    ])
    .await;
    let alice_log = Recorder::default();
    let a =
        recording_client_with_token(&server.url, &alice, Revision::Legacy, alice_log.clone()).await;
    let bob_log = Recorder::default();
    let b = recording_client_with_token(&server.url, &bob, Revision::Legacy, bob_log.clone()).await;
    // A second session of alice's that never sets a level hears nothing.
    let quiet_log = Recorder::default();
    let quiet =
        recording_client_with_token(&server.url, &alice, Revision::Legacy, quiet_log.clone()).await;
    a.set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .unwrap();
    b.set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .unwrap();

    let id = create(&a, json!({"network": "allowlist"})).await;
    alice_log
        .wait_for(30, "sandbox_created", |r| {
            r.events("sandbox_created", &id) == 1
        })
        .await;

    let r = call(
        &a,
        "run_code",
        json!({"sandbox_id": id, "code": REFUSED_CONNECT}),
    )
    .await;
    assert!(text(&r).contains("403"), "{}", text(&r));
    alice_log
        .wait_for(30, "egress_refused", |r| {
            r.events("egress_refused", &id) == 1
        })
        .await;
    let refusal = alice_log
        .logs
        .lock()
        .unwrap()
        .iter()
        .find(|m| m["data"]["event"] == "egress_refused")
        .cloned()
        .unwrap();
    assert_eq!(refusal["level"], "warning", "{refusal}");
    assert_eq!(refusal["data"]["host"], "evil.example", "{refusal}");
    assert_eq!(refusal["data"]["reason"], "host_not_allowed", "{refusal}");

    let r = call(
        &a,
        "run_code",
        json!({"sandbox_id": id, "code": STUBBORN, "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(structured(&r)["kernel_restarted"], true, "{}", text(&r));
    alice_log
        .wait_for(60, "kernel_restarted", |r| {
            r.events("kernel_restarted", &id) == 1
        })
        .await;

    let short = create(&a, json!({"timeout_seconds": 1})).await;
    alice_log
        .wait_for(60, "sandbox_expired", |r| {
            r.events("sandbox_expired", &short) == 1
        })
        .await;

    // Bob's session hears of his own sandbox, and of nothing of alice's: his event comes
    // after all of hers, through the same queue.
    let his = create(&b, json!({})).await;
    bob_log
        .wait_for(30, "bob's sandbox_created", |r| {
            r.events("sandbox_created", &his) == 1
        })
        .await;
    let heard: Vec<Value> = bob_log.logs.lock().unwrap().clone();
    assert_eq!(heard.len(), 1, "bob heard of alice's sandboxes: {heard:?}");
    assert_eq!(alice_log.events("sandbox_created", &his), 0);
    assert!(quiet_log.logs.lock().unwrap().is_empty());
    drop((a, b, quiet));
    server.stop().await;
}

#[tokio::test]
async fn lifecycle_events_go_with_the_2026_request_that_asked_for_them() {
    let (c, log) = stdio_client(
        &["--pool", "0", "--allow-host", "allowed.invalid"],
        Revision::Stateless,
    )
    .await;
    // 2026-07-28 removed logging/setLevel.
    let e = c
        .set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .unwrap_err();
    let ServiceError::McpError(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND);

    // Without a level in the request, no message at all.
    let silent = create(&c, json!({"network": "allowlist"})).await;
    // Below the level asked for, none either.
    let r = call_logged(&c, "create_sandbox", json!({}), LoggingLevel::Warning).await;
    let unheard = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    // At the level, the new sandbox's creation goes with the answer.
    let r = call_logged(&c, "create_sandbox", json!({}), LoggingLevel::Info).await;
    let heard = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    log.wait_for(30, "sandbox_created", |r| {
        r.events("sandbox_created", &heard) == 1
    })
    .await;
    assert_eq!(log.events("sandbox_created", &silent), 0);
    assert_eq!(log.events("sandbox_created", &unheard), 0);

    // The refusal and the restart of the sandbox a run names go with that run.
    let r = call(
        &c,
        "run_code",
        json!({"sandbox_id": silent, "code": REFUSED_CONNECT}),
    )
    .await;
    assert!(text(&r).contains("403"), "{}", text(&r));
    assert_eq!(log.events("egress_refused", &silent), 0, "not asked for");
    let r = call_logged(
        &c,
        "run_code",
        json!({"sandbox_id": silent, "code": REFUSED_CONNECT}),
        LoggingLevel::Debug,
    )
    .await;
    assert!(text(&r).contains("403"), "{}", text(&r));
    log.wait_for(30, "egress_refused", |r| {
        r.events("egress_refused", &silent) == 1
    })
    .await;
    let r = call_logged(
        &c,
        "run_code",
        json!({"sandbox_id": heard, "code": STUBBORN, "timeout_seconds": 1}),
        LoggingLevel::Warning,
    )
    .await;
    assert_eq!(structured(&r)["kernel_restarted"], true, "{}", text(&r));
    log.wait_for(30, "kernel_restarted", |r| {
        r.events("kernel_restarted", &heard) == 1
    })
    .await;

    // An expiry happens when no request is about: the next one naming the sandbox hears it.
    let short = create(&c, json!({"timeout_seconds": 1})).await;
    wait_gone(&c, &short).await;
    assert_eq!(log.events("sandbox_expired", &short), 0);
    let r = call_logged(
        &c,
        "run_code",
        json!({"sandbox_id": short, "code": "1"}),
        LoggingLevel::Info,
    )
    .await;
    assert!(is_error(&r));
    log.wait_for(30, "sandbox_expired", |r| {
        r.events("sandbox_expired", &short) == 1
    })
    .await;
}

#[tokio::test]
async fn a_2026_request_hears_only_its_own_tenants_events() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;
    let alice_log = Recorder::default();
    let a =
        recording_client_with_token(&server.url, &alice, Revision::Stateless, alice_log.clone())
            .await;
    let bob_log = Recorder::default();
    let b =
        recording_client_with_token(&server.url, &bob, Revision::Stateless, bob_log.clone()).await;
    let short = create(&a, json!({"timeout_seconds": 1})).await;
    wait_gone(&a, &short).await;
    // Bob names alice's expired sandbox: "not found", and not a word of its expiry.
    let r = call_logged(
        &b,
        "run_code",
        json!({"sandbox_id": short, "code": "1"}),
        LoggingLevel::Debug,
    )
    .await;
    assert!(is_error(&r));
    // Alice, naming it, is told.
    let r = call_logged(
        &a,
        "run_code",
        json!({"sandbox_id": short, "code": "1"}),
        LoggingLevel::Debug,
    )
    .await;
    assert!(is_error(&r));
    alice_log
        .wait_for(30, "sandbox_expired", |r| {
            r.events("sandbox_expired", &short) == 1
        })
        .await;
    // Bob's request had ended before alice's: whatever it heard, it has.
    assert!(bob_log.logs.lock().unwrap().is_empty());
    drop((a, b));
    server.stop().await;
}

#[tokio::test]
async fn completions_offer_the_callers_sandboxes_and_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;
    for revision in [Revision::Legacy, Revision::Stateless] {
        let a = client_with_token(&server.url, &alice, revision).await;
        let b = client_with_token(&server.url, &bob, revision).await;
        let id = create(&a, json!({})).await;
        write(&a, &id, "/workspace/data.csv", "x").await;
        write(&a, &id, "/workspace/dir/inner.txt", "y").await;
        write(&a, &id, "/workspace/other.txt", "z").await;

        let ids = a
            .complete_resource_simple(TEMPLATE, "sandbox_id", "sbx_")
            .await
            .unwrap();
        assert!(ids.contains(&id), "{revision:?}: {ids:?}");
        let ids = a
            .complete_resource_simple(TEMPLATE, "sandbox_id", "nope")
            .await
            .unwrap();
        assert!(ids.is_empty(), "{ids:?}");

        let context = || {
            Some(CompletionContext::with_arguments(
                [("sandbox_id".to_owned(), id.clone())].into(),
            ))
        };
        let path = |typed: &'static str| {
            let a = &a;
            let context = context();
            async move {
                a.complete_resource_argument(TEMPLATE, "path", typed, context)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(path("wor").await.values, vec!["workspace/"]);
        let got = path("workspace/d").await;
        assert_eq!(got.values, vec!["workspace/data.csv", "workspace/dir/"]);
        assert_eq!((got.total, got.has_more), (Some(2), Some(false)));
        assert_eq!(
            path("workspace/dir/").await.values,
            vec!["workspace/dir/inner.txt"]
        );

        // Bob is offered none of alice's sandboxes, nor their files.
        let theirs = b
            .complete_resource_simple(TEMPLATE, "sandbox_id", "")
            .await
            .unwrap();
        assert!(!theirs.contains(&id), "{theirs:?}");
        for typed in ["wor", "workspace/"] {
            let files = b
                .complete_resource_argument(TEMPLATE, "path", typed, context())
                .await
                .unwrap();
            assert!(files.values.is_empty(), "{typed}: {files:?}");
        }

        // A template or argument that does not exist is an invalid request.
        let e = a
            .complete_resource_simple("sandbox://{id}", "id", "")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ServiceError::McpError(e) if e.code == ErrorCode::INVALID_PARAMS),
            "{e:?}"
        );
        let e = a
            .complete_resource_simple(TEMPLATE, "size", "")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ServiceError::McpError(e) if e.code == ErrorCode::INVALID_PARAMS),
            "{e:?}"
        );
        call(&a, "close_sandbox", json!({"sandbox_id": id})).await;
        drop((a, b));
    }
    server.stop().await;
}

#[tokio::test]
async fn subscribed_files_are_updated_after_a_run_changes_them_in_2025_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;
    let alice_log = Recorder::default();
    let a =
        recording_client_with_token(&server.url, &alice, Revision::Legacy, alice_log.clone()).await;
    let b = client_with_token(&server.url, &bob, Revision::Legacy).await;
    let id = create(&a, json!({})).await;
    let uri_a = format!("sandbox://{id}/files/workspace/a.txt");
    let uri_b = format!("sandbox://{id}/files/workspace/b.txt");
    // A file that does not exist yet may be subscribed to.
    a.subscribe(SubscribeRequestParams::new(uri_a.clone()))
        .await
        .unwrap();
    let updates = |uri: &str| {
        alice_log
            .updates
            .lock()
            .unwrap()
            .iter()
            .filter(|u| *u == uri)
            .count()
    };

    // A run that writes both: only the subscribed one is reported.
    let r = call(
        &a,
        "run_code",
        json!({"sandbox_id": id, "code": "open('b.txt', 'w').write('b')\nopen('a.txt', 'w').write('a')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    alice_log
        .wait_for(30, "a.txt updated by a run", |_| updates(&uri_a) == 1)
        .await;
    // write_file is a change too.
    write(&a, &id, "/workspace/a.txt", "again").await;
    alice_log
        .wait_for(30, "a.txt updated by write_file", |_| updates(&uri_a) == 2)
        .await;
    // A run that leaves it alone says nothing of it.
    call(
        &a,
        "run_command",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;

    a.unsubscribe(UnsubscribeRequestParams::new(uri_a.clone()))
        .await
        .unwrap();
    a.subscribe(SubscribeRequestParams::new(uri_b.clone()))
        .await
        .unwrap();
    call(
        &a,
        "run_command",
        json!({"sandbox_id": id, "command": "echo 1 > a.txt; echo 2 > b.txt"}),
    )
    .await;
    alice_log
        .wait_for(30, "b.txt updated", |_| updates(&uri_b) == 1)
        .await;
    assert_eq!(updates(&uri_a), 2, "no longer subscribed to a.txt");

    // Bob cannot subscribe to alice's files: not found, as for a sandbox that never was.
    for uri in [
        uri_a.clone(),
        "sandbox://sbx_never/files/workspace/a.txt".into(),
    ] {
        let e = b
            .subscribe(SubscribeRequestParams::new(uri.clone()))
            .await
            .unwrap_err();
        let ServiceError::McpError(e) = e else {
            panic!("{e:?}")
        };
        assert_eq!(e.code, ErrorCode::RESOURCE_NOT_FOUND, "{uri}: {e:?}");
    }
    // Nor to anything but a sandbox file.
    let e = a
        .subscribe(SubscribeRequestParams::new("test://watched-resource"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ServiceError::McpError(e) if e.code == ErrorCode::INVALID_PARAMS),
        "{e:?}"
    );
    drop((a, b));
    server.stop().await;
}

fn updated_uri(n: &rmcp::model::ServerNotification) -> Option<String> {
    match n {
        rmcp::model::ServerNotification::ResourceUpdatedNotification(u) => {
            Some(u.params.uri.clone())
        }
        _ => None,
    }
}

#[tokio::test]
async fn listen_streams_updates_of_subscribed_files_in_2026() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&["--pool", "0", "--tokens", tokens.to_str().unwrap()]).await;
    let a = client_with_token(&server.url, &alice, Revision::Stateless).await;
    let b = client_with_token(&server.url, &bob, Revision::Stateless).await;
    let theirs = create(&a, json!({})).await;
    let mine = create(&b, json!({})).await;
    let alice_uri = format!("sandbox://{theirs}/files/workspace/out.txt");
    let bob_uri = format!("sandbox://{mine}/files/workspace/out.txt");

    let filter = |uris: Vec<String>| {
        SubscriptionFilter::builder()
            .resource_subscriptions(uris)
            .build()
    };
    let mut alice_sub = a
        .peer()
        .listen(filter(vec![alice_uri.clone(), "test://nothing".into()]))
        .await
        .unwrap();
    assert_eq!(
        alice_sub.acknowledged().resource_subscriptions,
        Some(vec![alice_uri.clone()]),
        "only sandbox files are accepted"
    );
    // Bob listens to alice's file too (accepted, as any sandbox URI) and to his own.
    let mut bob_sub = b
        .peer()
        .listen(filter(vec![alice_uri.clone(), bob_uri.clone()]))
        .await
        .unwrap();

    let r = call(
        &a,
        "run_code",
        json!({"sandbox_id": theirs, "code": "open('out.txt', 'w').write('x')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let n = tokio::time::timeout(Duration::from_secs(30), alice_sub.next())
        .await
        .expect("no update")
        .unwrap()
        .unwrap();
    assert_eq!(updated_uri(&n).as_deref(), Some(alice_uri.as_str()));

    // Bob's own change reaches him; alice's, which came first, never does.
    call(
        &b,
        "run_command",
        json!({"sandbox_id": mine, "command": "echo y > out.txt"}),
    )
    .await;
    let n = tokio::time::timeout(Duration::from_secs(30), bob_sub.next())
        .await
        .expect("no update")
        .unwrap()
        .unwrap();
    assert_eq!(updated_uri(&n).as_deref(), Some(bob_uri.as_str()));

    alice_sub.cancel().await.unwrap();
    bob_sub.cancel().await.unwrap();
    drop((a, b));
    server.stop().await;
}

/// Polls `tasks/get` until the task ends.
async fn settled(client: &Client, task: &str) -> rmcp::model::DetailedTask {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let t = client
            .get_task(GetTaskParams::new(task.to_owned()))
            .await
            .unwrap()
            .task;
        if t.status().is_terminal() {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "{task} never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Calls `tool` expecting a task; its id.
async fn as_task(client: &Client, tool: &str, args: Value) -> String {
    match client.call_tool_once(params(tool, args)).await.unwrap() {
        CallToolResponse::Task(t) => {
            assert_eq!(t.task.status, TaskStatus::Working);
            assert!(t.task.ttl_ms.is_some_and(|ttl| ttl > 0), "{t:?}");
            t.task.task_id
        }
        other => panic!("expected a task, got {other:?}"),
    }
}

fn completed(t: &rmcp::model::DetailedTask) -> Value {
    match &t.payload {
        TaskPayload::Completed { result } => Value::Object(result.clone()),
        other => panic!("expected completed, got {other:?}"),
    }
}

fn invalid_params(r: Result<impl std::fmt::Debug, ServiceError>) -> bool {
    matches!(r, Err(ServiceError::McpError(e)) if e.code == ErrorCode::INVALID_PARAMS)
}

#[tokio::test]
async fn long_runs_are_tasks_polled_to_their_result_in_both_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, alice, bob) = two_tenants(&dir);
    let server = HttpServer::start(&[
        "--pool",
        "0",
        "--tokens",
        tokens.to_str().unwrap(),
        "--task-after",
        "1",
    ])
    .await;
    for revision in [Revision::Legacy, Revision::Stateless] {
        let a = recording_client_with_token(&server.url, &alice, revision, Recorder::with_tasks())
            .await;
        let b =
            recording_client_with_token(&server.url, &bob, revision, Recorder::with_tasks()).await;
        let id = create(&a, json!({})).await;

        // run_code that outlasts the call's wait: a task, working until released.
        let task = as_task(
            &a,
            "run_code",
            json!({"sandbox_id": id, "code": wait_for_file("go")}),
        )
        .await;
        let t = a.get_task(GetTaskParams::new(task.clone())).await.unwrap();
        assert_eq!(t.task.status(), TaskStatus::Working, "{revision:?}");
        // Another tenant can neither see nor cancel it: as if it did not exist.
        assert!(invalid_params(
            b.get_task(GetTaskParams::new(task.clone())).await
        ));
        assert!(invalid_params(
            b.cancel_task(CancelTaskParams::new(task.clone())).await
        ));
        assert!(invalid_params(
            a.get_task(GetTaskParams::new("task_00000000000000000000000000000000"))
                .await
        ));
        write(&a, &id, "/workspace/go", "").await;
        let t = settled(&a, &task).await;
        let result = completed(&t);
        assert_eq!(
            result["structuredContent"]["stdout"], "released\n",
            "{result}"
        );
        assert_eq!(
            result["structuredContent"]["results"][0]["data"]["text/plain"],
            "'value'"
        );

        // run_command too; a failing command is a completed task whose result is an error.
        let task = as_task(
            &a,
            "run_command",
            json!({"sandbox_id": id, "command": "while [ ! -f go2 ]; do sleep 0.05; done; echo cmd; exit 3"}),
        )
        .await;
        write(&a, &id, "/workspace/go2", "").await;
        let result = completed(&settled(&a, &task).await);
        assert_eq!(result["isError"], true, "{result}");
        assert_eq!(result["structuredContent"]["stdout"], "cmd\n");
        assert_eq!(result["structuredContent"]["exit_code"], 3);

        // Cancelling a task interrupts its run: the kernel is free at once afterwards.
        let task = as_task(
            &a,
            "run_code",
            json!({"sandbox_id": id, "code": wait_for_file("never")}),
        )
        .await;
        a.cancel_task(CancelTaskParams::new(task.clone()))
            .await
            .unwrap();
        let t = settled(&a, &task).await;
        assert_eq!(t.status(), TaskStatus::Cancelled, "{t:?}");
        let r = call(
            &a,
            "run_code",
            json!({"sandbox_id": id, "code": "6 * 7", "timeout_seconds": 20}),
        )
        .await;
        assert_eq!(
            structured(&r)["results"][0]["data"]["text/plain"],
            "42",
            "{}",
            text(&r)
        );
        // Cancelling an ended task changes nothing.
        a.cancel_task(CancelTaskParams::new(task.clone()))
            .await
            .unwrap();
        assert_eq!(settled(&a, &task).await.status(), TaskStatus::Cancelled);

        // A quick run is answered at once, as a client without tasks would be.
        match a
            .call_tool_once(params(
                "run_code",
                json!({"sandbox_id": id, "code": "1 + 1"}),
            ))
            .await
            .unwrap()
        {
            CallToolResponse::Complete(r) => {
                assert_eq!(structured(&r)["results"][0]["data"]["text/plain"], "2")
            }
            // A loaded machine may take longer than the call waits: then it is a task.
            CallToolResponse::Task(t) => {
                let result = completed(&settled(&a, &t.task.task_id).await);
                assert_eq!(
                    result["structuredContent"]["results"][0]["data"]["text/plain"],
                    "2"
                );
            }
            other => panic!("{other:?}"),
        }

        // Without the extension, the same long run is an ordinary answer.
        let plain = client_with_token(&server.url, &alice, revision).await;
        let released = {
            let a = &a;
            let id = id.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                write(a, &id, "/workspace/go3", "").await;
            }
        };
        let (r, ()) = tokio::join!(
            call(
                &plain,
                "run_code",
                json!({"sandbox_id": id, "code": wait_for_file("go3")})
            ),
            released
        );
        assert_eq!(structured(&r)["stdout"], "released\n", "{}", text(&r));
        call(&a, "close_sandbox", json!({"sandbox_id": id})).await;
        drop((a, b, plain));
    }
    server.stop().await;
}

#[tokio::test]
async fn tasks_are_bounded_per_tenant_and_forgotten_after_their_ttl() {
    let server = HttpServer::start(&[
        "--pool",
        "0",
        "--max-tasks-per-tenant",
        "1",
        "--max-runs-per-tenant",
        "1",
        "--task-result-ttl",
        "1",
        "--task-after",
        "1",
    ])
    .await;
    let (c, _) = server
        .client_with(Revision::Stateless, Recorder::with_tasks())
        .await;
    let (plain, _) = server.client(Revision::Stateless).await;
    let id = create(&c, json!({})).await;
    let first = as_task(
        &c,
        "run_code",
        json!({"sandbox_id": id, "code": wait_for_file("go"), "timeout_seconds": 2}),
    )
    .await;
    // One task at a time for this tenant: the second is refused, saying why.
    match c
        .call_tool_once(params(
            "run_command",
            json!({"sandbox_id": id, "command": "sleep 5"}),
        ))
        .await
        .unwrap()
    {
        CallToolResponse::Complete(r) => {
            assert!(is_error(&r));
            assert!(
                text(&r).contains("most one tenant may hold"),
                "{}",
                text(&r)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        server
            .metrics()
            .await
            .contains("runbox_tool_calls_total{tool=\"run_command\",outcome=\"error\"} 1"),
        "a refused task is counted"
    );
    // The task's run counts against the tenant's runs like any other.
    let r = call(&plain, "run_code", json!({"code": "1"})).await;
    assert!(is_error(&r));
    assert!(text(&r).contains("runs in progress"), "{}", text(&r));
    // The first ends by its timeout; its result is kept a while, then forgotten.
    let t = settled(&c, &first).await;
    assert_eq!(completed(&t)["structuredContent"]["timed_out"], true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while c.get_task(GetTaskParams::new(first.clone())).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Which frees the tenant's place.
    as_task(
        &c,
        "run_code",
        json!({"sandbox_id": id, "code": wait_for_file("go2"), "timeout_seconds": 2}),
    )
    .await;
    drop((c, plain));
    server.stop().await;
}
