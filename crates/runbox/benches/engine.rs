//! The local engine's speed and memory, measured against plain interpreter start-up in the
//! same run: `cargo bench -p runbox --bench engine` prints a table (medians and p95 in ms).
//!
//! Set `RUNBOX_BENCH_N` to change the number of iterations (default 30; 300 for the warm
//! round trip).
//!
//! A second table shows what a hostile sandbox costs the server (this process): an output
//! flood of background processes nobody reads, and huge lines on a kernel's control socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runbox_core::{Backend, CommandRequest, ExecContext, ExecRequest, Language, SandboxSpec};
use runbox_local::{LocalBackend, LocalConfig};

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = ms(v[v.len() / 2]);
    let p95 = ms(v[((v.len() as f64 * 0.95).ceil() as usize).min(v.len()) - 1]);
    (median, p95)
}

fn time_command(program: &Path, args: &[&str], n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let s = Command::new(program)
                .args(args)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(s.success());
            t.elapsed()
        })
        .collect()
}

/// Kilobytes of `field` (VmRSS, Pss) summed over `pids`.
fn memory_kib(pids: &[i32], file: &str, field: &str) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .sum()
}

/// The sandbox's processes on the host: stage one and its descendants.
fn descendants(root: i32) -> Vec<i32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        let pid = all[i];
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten();
        for t in tasks {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            all.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
        i += 1;
    }
    all
}

/// CPU time this process has used so far, user and system.
fn own_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    d(u.user_time()) + d(u.system_time())
}

/// This process's resident memory now and at its peak since [`reset_peak`], in MiB.
fn own_memory() -> (f64, f64) {
    let me = [std::process::id() as i32];
    let mib = |field| memory_kib(&me, "status", field) as f64 / 1024.0;
    (mib("VmRSS:"), mib("VmHWM:"))
}

/// Resets this process's peak resident memory to what it holds now.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// Two `cat /dev/zero` in the background of one sandbox, unread, for five seconds: the
/// server's CPU and the sandbox's, in percent of a core.
async fn background_flood(backend: &LocalBackend) -> (f64, Option<f64>) {
    let id = backend.create(SandboxSpec::default()).await.unwrap().id;
    for _ in 0..2 {
        let req = CommandRequest::new("cat /dev/zero", Duration::from_secs(3600));
        backend.start_process(&id, req).await.unwrap();
    }
    // Let the buffers fill: the steady state is what costs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sandbox_cpu = async || backend.status(&id).await.unwrap().cpu_seconds;
    let (cpu, sandbox, t) = (own_cpu(), sandbox_cpu().await, Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let wall = t.elapsed().as_secs_f64();
    let server = (own_cpu() - cpu).as_secs_f64() / wall * 100.0;
    let sandbox = match (sandbox, sandbox_cpu().await) {
        (Some(a), Some(b)) => Some((b - a) / wall * 100.0),
        _ => None,
    };
    backend.close(&id).await.unwrap();
    (server, sandbox)
}

/// Code that writes three 64 MiB JSON lines to its kernel's control socket (fd 3).
const CONTROL_FLOOD: &str = r#"
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
'sent'
"#;

/// The control flood in a warm Python kernel: the server's CPU time, its memory growth
/// (now and at the peak) in MiB, the run's duration and its notes.
async fn control_flood(backend: &LocalBackend) -> (Duration, f64, f64, Duration, Vec<String>) {
    let id = backend.create(SandboxSpec::default()).await.unwrap().id;
    backend.warm_kernel(&id, Language::Python).await.unwrap();
    reset_peak();
    let (rss, _) = own_memory();
    let (cpu, t) = (own_cpu(), Instant::now());
    let o = backend
        .exec(
            &id,
            ExecRequest::new(Language::Python, CONTROL_FLOOD, Duration::from_secs(600)),
            ExecContext::default(),
        )
        .await
        .unwrap();
    let (took, cpu) = (t.elapsed(), own_cpu() - cpu);
    let (now, peak) = own_memory();
    backend.close(&id).await.unwrap();
    let mut said = o.notes;
    said.extend(o.error.map(|e| format!("{}: {}", e.name, e.value)));
    (cpu, now - rss, peak - rss, took, said)
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("RUNBOX_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut config = LocalConfig::default();
    config.jail.init_exe = PathBuf::from(env!("CARGO_BIN_EXE_runbox"));
    let backend = LocalBackend::new(config).await.expect("backend");
    let python = backend
        .runtime()
        .python
        .as_ref()
        .expect("python")
        .path
        .clone();
    let node = backend.runtime().node.as_ref().expect("node").path.clone();
    let mut rows: Vec<(String, (f64, f64), String)> = Vec::new();

    // Warm the page cache for both baselines and the engine.
    time_command(&python, &["-c", "print(1)"], 3);
    time_command(&node, &["-e", "console.log(1)"], 3);
    let id = backend.create(SandboxSpec::default()).await.unwrap().id;
    backend.close(&id).await.unwrap();

    let py_base = stats(time_command(&python, &["-c", "print(1)"], n));
    rows.push((
        format!("baseline: {} -c 'print(1)'", python.display()),
        py_base,
        String::new(),
    ));
    let node_base = stats(time_command(&node, &["-e", "console.log(1)"], n));
    rows.push((
        format!("baseline: {} -e 'console.log(1)'", node.display()),
        node_base,
        String::new(),
    ));

    let mut t = Vec::new();
    for _ in 0..n {
        let start = Instant::now();
        let id = backend.create(SandboxSpec::default()).await.unwrap().id;
        backend.close(&id).await.unwrap();
        t.push(start.elapsed());
    }
    rows.push((
        "sandbox create + destroy".into(),
        stats(t),
        "goal < 10 ms".into(),
    ));

    for (lang, code, base, goal) in [
        (
            Language::Python,
            "print(1)",
            py_base,
            "goal <= 1.3x python3 -c",
        ),
        (Language::JavaScript, "console.log(1)", node_base, ""),
    ] {
        let mut t = Vec::new();
        for _ in 0..n {
            let start = Instant::now();
            let id = backend.create(SandboxSpec::default()).await.unwrap().id;
            let o = backend
                .exec(
                    &id,
                    ExecRequest::new(lang, code, Duration::from_secs(30)),
                    ExecContext::default(),
                )
                .await
                .unwrap();
            assert_eq!(o.stdout, "1\n");
            t.push(start.elapsed());
            backend.close(&id).await.unwrap();
        }
        let s = stats(t);
        let ratio = format!(
            "{:.2}x baseline{}{goal}",
            s.0 / base.0,
            if goal.is_empty() { "" } else { "; " }
        );
        rows.push((format!("first {lang} result in a fresh sandbox"), s, ratio));
    }

    let id = backend.create(SandboxSpec::default()).await.unwrap().id;
    for lang in [Language::Python, Language::JavaScript] {
        let code = if lang == Language::Python {
            "print(1)"
        } else {
            "console.log(1)"
        };
        let run = || {
            backend.exec(
                &id,
                ExecRequest::new(lang, code, Duration::from_secs(30)),
                ExecContext::default(),
            )
        };
        run().await.unwrap();
        let mut t = Vec::new();
        for _ in 0..(n * 10) {
            let start = Instant::now();
            run().await.unwrap();
            t.push(start.elapsed());
        }
        let goal = if lang == Language::Python {
            "goal < 1 ms"
        } else {
            ""
        };
        rows.push((
            format!("warm {lang} round trip (print 1)"),
            stats(t),
            goal.into(),
        ));
    }
    backend.close(&id).await.unwrap();

    let id = backend.create(SandboxSpec::default()).await.unwrap().id;
    backend.warm_kernel(&id, Language::Python).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let diag = backend.diagnostics(&id).await.unwrap();
    let pids = descendants(diag.stage_one_pid.unwrap() as i32);
    let rss = memory_kib(&pids, "status", "VmRSS:");
    let pss = memory_kib(&pids, "smaps_rollup", "Pss:");
    let cg = backend.status(&id).await.unwrap().memory_bytes;
    backend.close(&id).await.unwrap();

    let (flood_server, flood_sandbox) = background_flood(&backend).await;
    let (ctl_cpu, ctl_rss, ctl_peak, ctl_took, ctl_notes) = control_flood(&backend).await;

    println!(
        "\nrunbox local engine, {n} iterations ({} for round trips), {} cores",
        n * 10,
        num_cpus()
    );
    println!("| measurement | median ms | p95 ms | note |");
    println!("|---|---:|---:|---|");
    for (name, (median, p95), note) in rows {
        println!("| {name} | {median:.2} | {p95:.2} | {note} |");
    }
    println!(
        "\nidle sandbox with a Python kernel ({} processes: stage one, init, kernel): RSS {:.1} MiB, PSS {:.1} MiB{}; goal < 20 MiB",
        pids.len(),
        rss as f64 / 1024.0,
        pss as f64 / 1024.0,
        cg.map(|b| format!(", cgroup charge {:.1} MiB", b as f64 / 1048576.0))
            .unwrap_or_default()
    );
    println!("\n| a hostile sandbox | server CPU | server memory | note |");
    println!("|---|---:|---:|---|");
    println!(
        "| 2 x cat /dev/zero in the background, unread, 5 s | {flood_server:.1}% of a core | | \
         sandbox {}; goal < 10% |",
        flood_sandbox.map_or("?".into(), |s| format!("{s:.1}%"))
    );
    println!(
        "| three 64 MiB lines on a kernel's control socket | {:.2} s | +{ctl_rss:.1} MiB (peak +{ctl_peak:.1} MiB) | \
         run took {:.1} s; goal < 64 MiB; {} |",
        ctl_cpu.as_secs_f64(),
        ctl_took.as_secs_f64(),
        ctl_notes.join(" ")
    );
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
