//! The local engine's speed and memory, measured against plain interpreter start-up in the
//! same run: `cargo bench -p runbox --bench engine` prints a table (medians and p95 in ms).
//!
//! Set `RUNBOX_BENCH_N` to change the number of iterations (default 30; 300 for the warm
//! round trip).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runbox_core::{Backend, ExecContext, ExecRequest, Language, SandboxSpec};
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
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
