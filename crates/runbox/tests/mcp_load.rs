//! A load test: many MCP clients at once, each running one-shot code (a fresh sandbox per
//! call) over HTTP against one real server, with tokens of different tenants. Every answer
//! must be the right one (no crossed outputs between concurrent runs), nothing may be left
//! running afterwards, and the server's memory must come back to where it was: repeated
//! rounds must not make it grow.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use rmcp::model::CallToolRequestParams;
use serde_json::json;
use util::mcp::*;

const CLIENTS: usize = 12;
const RUNS_PER_CLIENT: usize = 3;
/// Rounds after the warm-up whose growth is measured.
const MEASURED_ROUNDS: usize = 14;

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// One round: every client runs its one-shot snippets at once; each answer is checked.
async fn round(clients: &[Client], round: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for (c, client) in clients.iter().enumerate() {
        let peer = client.peer().clone();
        tasks.spawn(async move {
            for k in 0..RUNS_PER_CLIENT {
                let n = (round * 1000 + c * 10 + k) as u64;
                let language = if k % 2 == 0 { "python" } else { "javascript" };
                let code = if language == "python" {
                    format!("import os\nprint({n} * {n}, len(os.listdir('/workspace')))")
                } else {
                    format!("console.log(String({n}n * {n}n), 0)")
                };
                let args = json!({"language": language, "code": code});
                let r = peer
                    .call_tool(
                        CallToolRequestParams::new("run_code")
                            .with_arguments(args.as_object().unwrap().clone()),
                    )
                    .await
                    .unwrap();
                assert!(!is_error(&r), "client {c} run {k}: {}", text(&r));
                let out = structured(&r)["stdout"].as_str().unwrap().trim().to_owned();
                assert_eq!(out, format!("{} 0", n * n), "client {c} run {k}");
                assert_eq!(structured(&r)["ephemeral"], true);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dozen_clients_running_one_shot_code_get_their_own_answers_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let tokens: Vec<String> = (0..3)
        .map(|t| add_token(&file, &format!("tenant{t}"), &[]))
        .collect();
    // glibc gives threads new malloc arenas as they contend, each holding its own slack;
    // two arenas bound that part of the noise.
    let mut command = serve_command(&[
        "--http",
        "127.0.0.1:0",
        "--tokens",
        file.to_str().unwrap(),
        "--pool",
        "2",
    ]);
    command.env("MALLOC_ARENA_MAX", "2");
    let server = HttpServer::spawn(command).await;
    let pid = server.child.id().unwrap();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let revision = if c % 2 == 0 {
            Revision::Stateless
        } else {
            Revision::Legacy
        };
        clients.push(client_with_token(&server.url, &tokens[c % tokens.len()], revision).await);
    }

    // Warm up: the allocator's arenas, the pool, the kernels' first starts. RSS at any one
    // moment swings by several MiB with what is in flight (pool refills, buffers of runs
    // ending), so the baseline is the highest of the warm-up rounds' samples: a leak is
    // growth past everything seen before, not past one lucky low sample.
    let mut before = 0;
    for r in 0..4 {
        round(&clients, r).await;
        before = before.max(rss_kib(pid));
    }
    for r in 4..(4 + MEASURED_ROUNDS) {
        round(&clients, r).await;
    }
    let after = rss_kib(pid);
    eprintln!(
        "server RSS: at most {before} KiB while warming up, {after} KiB after {} more one-shot runs",
        MEASURED_ROUNDS * CLIENTS * RUNS_PER_CLIENT
    );
    // Flat. Measured here, RSS swings by up to 15 MiB with what is in flight and where the
    // allocator's slack lies, leak or not; past a 16 MiB margin over 504 runs, a leak of
    // 32 KiB a run or more shows.
    assert!(
        after <= before + 16 * 1024,
        "server memory grew from {before} KiB to {after} KiB"
    );

    // Nothing is left running: one-shot sandboxes are closed, only the pool remains.
    let health = server.health().await;
    assert_eq!(health["sandboxes"], 0, "{health}");
    for client in clients {
        client.cancel().await.unwrap();
    }
    assert!(server.stop().await.success());
}
