//! What a hostile sandbox can make the server spend, through the real server and real
//! sandboxes: huge lines written to a kernel's control socket, which user code owns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::time::{Duration, Instant};

use serde_json::json;
use util::mcp::*;

/// Kilobytes of `field` (`VmRSS:`, `VmHWM:`) of process `pid`.
fn memory_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

/// Three 64 MiB JSON lines on fd 3, then a 16 MiB nested JSON array, then a value.
const FLOOD: &str = r#"
import os
def send(b):
    v = memoryview(b)
    while v:
        v = v[os.write(3, v):]
mib = b'A' * (1 << 20)
for _ in range(3):
    send(b'{"type":"display","data":{"text/plain":"')
    for _ in range(64):
        send(mib)
    send(b'"}}\n')
send(b'{"type":"display","data":{"application/json":[' + b'0,' * (8 << 20) + b'0]}}\n')
kept = 'still here'
'sent'
"#;

#[tokio::test]
async fn huge_control_lines_cost_the_server_little_and_are_reported() {
    let server = HttpServer::start(&["--pool", "0"]).await;
    let pid = server.child.id().unwrap();
    let (client, _) = server.client(Revision::Stateless).await;
    let r = call(&client, "create_sandbox", json!({})).await;
    let id = structured(&r)["sandbox_id"].as_str().unwrap().to_owned();
    let r = call(&client, "run_code", json!({"sandbox_id": id, "code": "1"})).await;
    assert!(!is_error(&r), "{}", text(&r));

    // The peak from here on is what the lines cost.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = memory_kib(pid, "VmRSS:");
    let run = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": FLOOD}),
    );
    tokio::pin!(run);
    // /healthz answers while the server reads them.
    let mut slowest = Duration::ZERO;
    let r = loop {
        tokio::select! {
            r = &mut run => break r,
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                let t = Instant::now();
                assert_eq!(server.get("/healthz").await.status(), 200);
                slowest = slowest.max(t.elapsed());
            }
        }
    };
    let grew_mib = memory_kib(pid, "VmHWM:").saturating_sub(before) / 1024;
    eprintln!("server peak grew {grew_mib} MiB; slowest /healthz {slowest:?}");
    assert!(grew_mib < 64, "the server grew by {grew_mib} MiB");
    assert!(
        slowest < Duration::from_secs(3),
        "/healthz took {slowest:?}"
    );

    // The run ends normally, says what was dropped, and the kernel keeps its state.
    let s = structured(&r);
    assert_eq!(s["results"][0]["data"]["text/plain"], "'sent'", "{s}");
    assert_eq!(s["results"].as_array().unwrap().len(), 1, "{s}");
    let notes = s["notes"].to_string();
    assert!(
        notes.contains(
            "3 rich results were (display() calls or images; the largest 64.0 MiB) left out"
        ),
        "{notes}"
    );
    assert!(notes.contains("application/json"), "{notes}");
    assert_eq!(s["kernel_restarted"], false, "{s}");
    let r = call(
        &client,
        "run_code",
        json!({"sandbox_id": id, "code": "kept"}),
    )
    .await;
    assert_eq!(
        structured(&r)["results"][0]["data"]["text/plain"],
        "'still here'",
        "{}",
        text(&r)
    );
    assert!(server.stop().await.success());
}
