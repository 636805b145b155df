//! Which limits hold, through a real MCP client against `runbox serve` with real sandboxes,
//! in each mode: with cgroups (root, or a delegated subtree) the sandbox as a whole is capped;
//! without (`--no-cgroups`) each process's memory is, by RLIMIT_DATA, and get_sandbox_status
//! says exactly that; and without cgroups or that flag the server does not start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use util::mcp::*;

async fn create(client: &Client) -> String {
    let r = call(client, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

async fn run(client: &Client, id: &str, language: &str, code: &str) -> rmcp::model::CallToolResult {
    call(
        client,
        "run_code",
        json!({"sandbox_id": id, "language": language, "code": code}),
    )
    .await
}

async fn status(client: &Client, id: &str) -> (Value, String) {
    let r = call(client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    (structured(&r), text(&r))
}

#[tokio::test]
async fn without_cgroups_each_process_is_capped_and_status_says_so() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--no-cgroups", "--memory-mb", "128"],
        Revision::Stateless,
    )
    .await;
    let id = create(&client).await;
    let (s, said) = status(&client, &id).await;
    let limits = &s["enforced_limits"];
    assert_eq!(
        limits["memory"],
        json!({"value": 128 << 20, "per": "process", "by": "RLIMIT_DATA"}),
        "{s}"
    );
    assert_eq!(
        limits["processes"],
        json!({"value": 256, "per": "sandbox", "by": "RLIMIT_NPROC"}),
        "{s}"
    );
    assert_eq!(limits["cpus"], Value::Null, "no CPU limit holds: {s}");
    assert_eq!(s["memory_limit_bytes"], Value::Null, "{s}");
    assert!(said.contains("memory 128 MiB per process"), "{said}");
    assert!(said.contains("CPU not limited"), "{said}");

    // 1 GiB in a sandbox of 128 MiB: refused in every language, and each goes on working.
    let r = run(&client, &id, "python", "x = bytearray(1 << 30)").await;
    assert!(is_error(&r), "{}", text(&r));
    assert_eq!(
        structured(&r)["error"]["name"],
        "MemoryError",
        "{}",
        text(&r)
    );
    let r = run(&client, &id, "python", "sum(range(10))").await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "45",
        "{}",
        text(&r)
    );
    let r = run(&client, &id, "javascript", "Buffer.alloc(1 << 30).length").await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("allocation failed"), "{}", text(&r));
    let r = run(&client, &id, "javascript", "6 * 7").await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "42",
        "{}",
        text(&r)
    );
    let r = run(
        &client,
        &id,
        "bash",
        "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}",
    )
    .await;
    assert!(
        !structured(&r)["stdout"]
            .as_str()
            .unwrap()
            .contains("300000000"),
        "{}",
        text(&r)
    );
    let r = run(&client, &id, "bash", "echo still here").await;
    assert_eq!(structured(&r)["stdout"], "still here\n", "{}", text(&r));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn with_cgroups_the_whole_sandbox_is_capped_and_status_says_so() {
    if util::no_cgroups() {
        eprintln!("SKIP: this run is without cgroups");
        return;
    }
    // Starts only where cgroups hold (the server refuses otherwise, as the next test shows).
    let (client, _) = stdio_client(
        &["--pool", "0", "--memory-mb", "256", "--cpus", "0.5"],
        Revision::Legacy,
    )
    .await;
    let id = create(&client).await;
    let (s, said) = status(&client, &id).await;
    let limits = &s["enforced_limits"];
    assert_eq!(limits["memory"]["value"], 256 << 20, "{s}");
    assert_eq!(limits["memory"]["per"], "sandbox", "{s}");
    assert!(
        limits["memory"]["by"]
            .as_str()
            .unwrap()
            .starts_with("cgroup memory"),
        "{s}"
    );
    assert_eq!(
        limits["processes"],
        json!({"value": 256, "per": "sandbox", "by": "cgroup pids"}),
        "{s}"
    );
    assert_eq!(s["memory_limit_bytes"], 256 << 20, "{s}");
    assert!(said.contains("memory 256 MiB per sandbox"), "{said}");
    // The CPU controller is there unless the host lacks it.
    if !limits["cpus"].is_null() {
        assert_eq!(limits["cpus"], 0.5, "{s}");
        assert!(said.contains("CPU 0.5 cores"), "{said}");
    }
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn without_cgroups_or_the_flag_the_server_does_not_start() {
    // A cgroup parent that cannot be (a file's child) leaves no cgroups, in every mode.
    let mut command = serve_command(&["--stdio", "--cgroup-parent", "/cgroup.procs/runbox"]);
    command
        .env_remove("RUNBOX_NO_CGROUPS")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = command.spawn().unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the server started without cgroups")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for needle in ["cgroups are unavailable", "--cgroup-parent", "--no-cgroups"] {
        assert!(err.contains(needle), "no {needle:?} in: {err}");
    }
}
