//! Background processes, pause and resume, and the idle timeout, through a real MCP client
//! against `runbox serve` with real sandboxes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::mcp::*;

async fn create(client: &Client) -> String {
    let r = call(client, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["sandbox_id"].as_str().unwrap().to_owned()
}

async fn background(client: &Client, id: &str, command: &str) -> String {
    let r = call(
        client,
        "run_command",
        json!({"sandbox_id": id, "command": command, "background": true}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = structured(&r);
    assert_eq!(s["exit_code"], Value::Null);
    s["process_id"].as_str().unwrap().to_owned()
}

async fn read(client: &Client, id: &str, process: &str, wait: f64) -> Value {
    let r = call(
        client,
        "read_process_output",
        json!({"sandbox_id": id, "process_id": process, "wait_seconds": wait}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)
}

async fn file_text(client: &Client, id: &str, path: &str) -> String {
    let r = call(client, "read_file", json!({"sandbox_id": id, "path": path})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)["content"].as_str().unwrap().to_owned()
}

async fn status(client: &Client, id: &str) -> Value {
    let r = call(client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    structured(&r)
}

#[tokio::test]
async fn background_output_arrives_incrementally_and_kills_leave_nothing() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    let id = create(&client).await;

    let started = Instant::now();
    let p = background(
        &client,
        &id,
        "for i in 1 2 3 4; do echo line$i; sleep 0.4; done; echo done >&2; exit 3",
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "background start waited for the command"
    );
    let (mut stdout, mut stderr, mut reads_with_output) = (String::new(), String::new(), 0);
    let exit = loop {
        let o = read(&client, &id, &p, 10.0).await;
        let chunk = o["stdout"].as_str().unwrap();
        if !chunk.is_empty() {
            reads_with_output += 1;
        }
        stdout.push_str(chunk);
        stderr.push_str(o["stderr"].as_str().unwrap());
        if o["running"] == false {
            break o["exit_code"].clone();
        }
    };
    assert_eq!(stdout, "line1\nline2\nline3\nline4\n");
    assert_eq!(stderr, "done\n");
    assert_eq!(exit, 3);
    assert!(
        reads_with_output >= 2,
        "output came all at once, not as it was written"
    );
    // Nothing new after the end, and the end stays known.
    let o = read(&client, &id, &p, 0.0).await;
    assert_eq!(
        (o["stdout"].as_str(), o["exit_code"].clone()),
        (Some(""), json!(3))
    );

    // A process that would run forever, with a child of its own, killed.
    let p = background(&client, &id, "sleep 1000 & echo started; wait").await;
    assert_eq!(read(&client, &id, &p, 10.0).await["stdout"], "started\n");
    let s = status(&client, &id).await;
    let listed: Vec<&Value> = s["background_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["process_id"] == p.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{s}");
    assert_eq!(listed[0]["running"], true);
    let r = call(
        &client,
        "kill_process",
        json!({"sandbox_id": id, "process_id": p}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["exit_code"], 137, "{}", text(&r));
    let s = status(&client, &id).await;
    let still: Vec<&Value> = s["background_processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["running"] == true)
        .collect();
    assert!(still.is_empty(), "{s}");
    let r = call(
        &client,
        "run_command",
        // Every process but zombies (ended, not yet reaped by the init): name and state.
        json!({"sandbox_id": id, "command": "cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 != \"Z\" {print $2}' | sort | uniq -c"}),
    )
    .await;
    assert!(
        !structured(&r)["stdout"].as_str().unwrap().contains("sleep"),
        "the killed process's child survived: {}",
        text(&r)
    );

    // Clear errors.
    let r = call(
        &client,
        "run_command",
        json!({"command": "sleep 1", "background": true}),
    )
    .await;
    assert!(
        is_error(&r) && text(&r).contains("sandbox_id"),
        "{}",
        text(&r)
    );
    let r = call(
        &client,
        "read_process_output",
        json!({"sandbox_id": id, "process_id": "p99"}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("p99"), "{}", text(&r));
    let r = call(
        &client,
        "read_process_output",
        json!({"sandbox_id": id, "process_id": p, "wait_seconds": 600}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("maximum"), "{}", text(&r));

    // Output beyond the per-process cap keeps the newest and says how much was dropped.
    let p = background(
        &client,
        &id,
        "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo tail-marker",
    )
    .await;
    let mut last = Value::Null;
    let mut dropped = 0;
    let mut seen = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = read(&client, &id, &p, 0.0).await;
        dropped += last["dropped_bytes"].as_i64().unwrap();
        seen.push_str(last["stdout"].as_str().unwrap());
        if last["running"] == false && last["stdout"] == "" {
            break;
        }
    }
    assert!(seen.ends_with("tail-marker\n"), "{last}");
    assert!(dropped > 0, "nothing was dropped: {last}");
    assert_eq!(
        seen.len() as i64 + dropped,
        3_000_000 + "\ntail-marker\n".len() as i64
    );

    // Closing the sandbox ends its background processes.
    background(&client, &id, "sleep 1000").await;
    let r = call(&client, "close_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn pause_stops_progress_and_resume_continues_with_state() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Legacy).await;
    let id = create(&client).await;
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "x = 41"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    background(
        &client,
        &id,
        "i=0; while true; do i=$((i+1)); echo $i > /workspace/count.tmp; mv /workspace/count.tmp /workspace/count; done",
    )
    .await;
    let count = |s: String| s.trim().parse::<u64>().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = count(file_text(&client, &id, "count").await);

    let r = call(&client, "pause_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["state"], "paused");
    let paused = count(file_text(&client, &id, "count").await);
    assert!(paused >= before);
    let cpu = status(&client, &id).await["cpu_seconds"].as_f64();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        count(file_text(&client, &id, "count").await),
        paused,
        "the loop went on while paused"
    );
    let s = status(&client, &id).await;
    assert_eq!(s["state"], "paused");
    if let Some(cpu) = cpu {
        assert!(
            s["cpu_seconds"].as_f64().unwrap() - cpu < 0.05,
            "CPU used while paused: {cpu} then {}",
            s["cpu_seconds"]
        );
    }
    let r = call(&client, "list_sandboxes", json!({})).await;
    assert_eq!(structured(&r)["sandboxes"][0]["state"], "paused");
    // Runs wait for a resume.
    let r = call(&client, "run_code", json!({"sandbox_id": id, "code": "x"})).await;
    assert!(
        is_error(&r) && text(&r).contains("resume_sandbox"),
        "{}",
        text(&r)
    );
    // Pausing twice is harmless.
    let r = call(&client, "pause_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));

    let r = call(&client, "resume_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["state"], "running");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        count(file_text(&client, &id, "count").await) > paused,
        "the loop did not go on after resume"
    );
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "x + 1"}),
    )
    .await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "42",
        "{}",
        text(&r)
    );
    // A paused sandbox closes cleanly.
    let r = call(&client, "pause_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&client, "close_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_idle_timeout_can_change_and_stands_still_while_paused() {
    let (client, _) = stdio_client(
        &["--pool", "0", "--max-sandbox-timeout", "3600"],
        Revision::Stateless,
    )
    .await;
    let id = create(&client).await;
    let r = call(
        &client,
        "set_sandbox_timeout",
        json!({"sandbox_id": id, "timeout_seconds": 7200}),
    )
    .await;
    assert!(is_error(&r) && text(&r).contains("3600"), "{}", text(&r));
    let r = call(
        &client,
        "set_sandbox_timeout",
        json!({"sandbox_id": id, "timeout_seconds": 1.5}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["timeout_seconds"], 1.5);
    // Paused, it outlives its timeout.
    let r = call(&client, "pause_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(&client, &id).await["state"], "paused");
    // Resumed, the clock goes on and it expires.
    let r = call(&client, "resume_sandbox", json!({"sandbox_id": id})).await;
    assert!(!is_error(&r), "{}", text(&r));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
    assert!(is_error(&r), "the sandbox did not expire: {}", text(&r));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_running_background_process_keeps_its_sandbox_alive() {
    let (client, _) = stdio_client(&["--pool", "0"], Revision::Stateless).await;
    let r = call(&client, "create_sandbox", json!({"timeout_seconds": 1})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let p = background(
        &client,
        &id,
        "while [ ! -e /workspace/stop ]; do sleep 0.1; done; echo stopped",
    )
    .await;
    // Three idle timeouts pass with no call that uses the sandbox (status does not): the
    // process runs, so the sandbox is not idle.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
        assert!(
            !is_error(&r),
            "the sandbox expired while its background process ran: {}",
            text(&r)
        );
        let running = &structured(&r)["background_processes"][0];
        assert_eq!(running["process_id"], p.as_str(), "{running}");
        assert_eq!(running["exit_code"], Value::Null, "{running}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Once it has ended, the idle clock runs again and the sandbox expires.
    let r = call(
        &client,
        "write_file",
        json!({"sandbox_id": id, "path": "stop", "content": ""}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call(&client, "get_sandbox_status", json!({"sandbox_id": id})).await;
        if is_error(&r) {
            assert!(text(&r).contains("not found"), "{}", text(&r));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sandbox did not expire once its process ended: {}",
            text(&r)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.cancel().await.unwrap();
}
