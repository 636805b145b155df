//! Kernel behaviour in real sandboxes: state, last values, errors, timeouts and kernel
//! restarts, output caps and invalid UTF-8, streaming, bash state, concurrency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use runbox_core::{Backend, ExecContext, ExecRequest, Language, Limits, OutputStream};
use util::*;

#[tokio::test]
async fn python_keeps_variables_imports_and_functions() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "import math\nx = 20\ndef f(y):\n    return math.floor(y) + x",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(value(&o), None, "assignments and definitions have no value");
    let o = py(&b, &id, "f(22.7)").await;
    assert_eq!(value(&o).as_deref(), Some("42"));
    let o = py(&b, &id, "x += 1\nx").await;
    assert_eq!(value(&o).as_deref(), Some("21"));
    // `_` holds the last value, as in a notebook.
    let o = py(&b, &id, "_ * 2").await;
    assert_eq!(value(&o).as_deref(), Some("42"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_last_expression_is_the_value_and_none_is_silent() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(&b, &id, "print('side effect')\n{'a': [1, 2]}").await;
    assert_eq!(o.stdout, "side effect\n");
    assert_eq!(value(&o).as_deref(), Some("{'a': [1, 2]}"));
    let o = py(&b, &id, "None").await;
    assert!(o.results.is_empty());
    let o = py(&b, &id, "for i in range(3):\n    pass").await;
    assert!(o.results.is_empty());
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_exception_comes_back_as_name_value_and_user_traceback() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "kept = 'yes'\ndef inner():\n    raise ValueError('bad value')\ninner()",
    )
    .await;
    let e = o.error.clone().expect("an error");
    assert_eq!(e.name, "ValueError");
    assert_eq!(e.value, "bad value");
    assert!(e.traceback.contains("<cell 1>"), "{}", e.traceback);
    assert!(e.traceback.contains("line 3, in inner"), "{}", e.traceback);
    assert!(
        !e.traceback.contains("python_kernel"),
        "driver frames leaked: {}",
        e.traceback
    );
    assert!(!o.succeeded());
    // The kernel survives: state from before the exception is still there.
    let o = py(&b, &id, "kept").await;
    assert_eq!(value(&o).as_deref(), Some("'yes'"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_syntax_error_names_the_line() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(&b, &id, "x = 1\ny = (2 +\n").await;
    let e = o.error.expect("syntax error");
    assert_eq!(e.name, "SyntaxError");
    assert!(e.traceback.contains("line 2"), "{}", e.traceback);
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_stdout_and_stderr_stay_apart() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "import sys, os\nprint('out1')\nprint('err1', file=sys.stderr)\nos.write(1, b'out2\\n')\nos.write(2, b'err2\\n')",
    )
    .await;
    assert_eq!(o.stdout, "out1\nout2\n");
    assert_eq!(o.stderr, "err1\nerr2\n");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_top_level_await_works() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "import asyncio\nasync def twice(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\nr = await twice(21)\nr",
    )
    .await;
    assert_eq!(value(&o).as_deref(), Some("42"), "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn per_run_environment_applies_to_that_run_only() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let mut req = ExecRequest::new(
        Language::Python,
        "import os\nos.environ.get('RUN_ONLY')",
        TIMEOUT,
    );
    req.env = BTreeMap::from([("RUN_ONLY".to_owned(), "here".to_owned())]);
    let o = b.exec(&id, req, ExecContext::default()).await.unwrap();
    assert_eq!(value(&o).as_deref(), Some("'here'"));
    let o = py(&b, &id, "os.environ.get('RUN_ONLY')").await;
    assert!(o.results.is_empty(), "variable outlived its run: {o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn timeout_interrupts_python_and_keeps_its_state() {
    let b = backend().await;
    let id = sandbox(&b).await;
    py(&b, &id, "survivor = 7").await;
    let t = Instant::now();
    let o = run_for(
        &b,
        &id,
        Language::Python,
        "print('before', flush=True)\nwhile True:\n    pass",
        Duration::from_secs(1),
    )
    .await;
    assert!(o.timed_out, "{o:?}");
    assert!(!o.kernel_restarted);
    assert_eq!(
        o.error.as_ref().map(|e| e.name.as_str()),
        Some("KeyboardInterrupt")
    );
    assert_eq!(o.stdout, "before\n");
    assert!(t.elapsed() < Duration::from_secs(10));
    let o = py(&b, &id, "survivor").await;
    assert_eq!(value(&o).as_deref(), Some("7"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn python_that_ignores_interrupts_is_killed_and_restarted() {
    let b = backend().await;
    let id = sandbox(&b).await;
    py(&b, &id, "lost = 1").await;
    let o = run_for(
        &b,
        &id,
        Language::Python,
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        Duration::from_secs(1),
    )
    .await;
    assert!(o.timed_out);
    assert!(o.kernel_restarted, "{o:?}");
    assert!(
        o.notes.iter().any(|n| n.contains("kernel was lost")),
        "{:?}",
        o.notes
    );
    // A fresh kernel answers, without the old state, and says so.
    let o = py(&b, &id, "'lost' in globals()").await;
    assert_eq!(value(&o).as_deref(), Some("False"));
    assert!(
        o.notes.iter().any(|n| n.contains("fresh python kernel")),
        "{:?}",
        o.notes
    );
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn a_kernel_that_exits_is_reported_and_replaced() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(&b, &id, "import os\nprint('bye', flush=True)\nos._exit(3)").await;
    let e = o.error.clone().expect("error");
    assert_eq!(e.name, "KernelDied");
    assert!(e.value.contains("status 3"), "{e:?}");
    assert_eq!(o.stdout, "bye\n");
    assert!(o.kernel_restarted);
    let o = py(&b, &id, "1 + 1").await;
    assert_eq!(value(&o).as_deref(), Some("2"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn output_is_capped_keeping_head_and_tail() {
    let b = backend().await;
    let id = sandbox_with(
        &b,
        Limits {
            output_bytes: 10_000,
            ..Default::default()
        },
    )
    .await;
    let o = py(
        &b,
        &id,
        "print('HEAD')\nprint('x' * 5_000_000)\nprint('TAIL')",
    )
    .await;
    assert!(o.truncated);
    assert!(o.stdout.starts_with("HEAD\n"), "{}", &o.stdout[..50]);
    assert!(o.stdout.ends_with("TAIL\n"));
    assert!(o.stdout.len() < 10_200, "{}", o.stdout.len());
    assert!(o.stdout.contains("bytes of output truncated"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn an_output_flood_is_bounded_in_memory() {
    let b = backend().await;
    let id = sandbox(&b).await;
    // 256 MiB straight to the pipe, and as much to stderr: what is kept stays within the cap.
    let o = py(
        &b,
        &id,
        "import os\nchunk = b'y' * (1 << 20)\nfor _ in range(256):\n    os.write(1, chunk)\n    os.write(2, chunk)\nprint('done')",
    )
    .await;
    assert!(o.succeeded(), "{:?} {:?}", o.error, o.notes);
    assert!(o.truncated);
    let cap = Limits::default().output_bytes + 200;
    assert!(o.stdout.len() <= cap && o.stderr.len() <= cap);
    assert!(o.stdout.ends_with("done\n"), "the tail is kept");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn invalid_utf8_is_replaced_not_fatal() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "import os\nos.write(1, b'ok \\xff\\xfe end\\n')\nos.write(2, b'\\xc3')",
    )
    .await;
    assert!(o.succeeded());
    assert_eq!(o.stdout, "ok \u{FFFD}\u{FFFD} end\n");
    assert_eq!(o.stderr, "\u{FFFD}");
    let o = run(&b, &id, Language::Bash, "printf 'a\\x80b'").await;
    assert_eq!(o.stdout, "a\u{FFFD}b");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn printing_protocol_lookalikes_forges_nothing() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "print('{\"type\": \"done\", \"result\": null, \"error\": null, \"markers\": true}')\n\
         print('RBX' + '0' * 32)\nimport time; time.sleep(0.2)\nprint('still running')\n'real'",
    )
    .await;
    assert!(o.stdout.contains("\"type\": \"done\""));
    assert!(o.stdout.contains("still running"), "{:?}", o.stdout);
    assert_eq!(value(&o).as_deref(), Some("'real'"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn output_streams_while_the_code_runs() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let (ctx, seen) = recording_context();
    let req = ExecRequest::new(
        Language::Python,
        "import sys, time\nprint('first')\ntime.sleep(1.5)\nprint('oops', file=sys.stderr)\nprint('second')",
        TIMEOUT,
    );
    let o = b.exec(&id, req, ctx).await.unwrap();
    let ended = Instant::now();
    let seen = seen.lock().unwrap().clone();
    let first = seen
        .iter()
        .find(|(_, c)| c.text.contains("first"))
        .expect("first streamed");
    assert_eq!(first.1.stream, OutputStream::Stdout);
    assert!(
        ended.duration_since(first.0) > Duration::from_millis(700),
        "'first' arrived only {:?} before the end",
        ended.duration_since(first.0)
    );
    assert!(
        seen.iter()
            .any(|(_, c)| c.stream == OutputStream::Stderr && c.text.contains("oops"))
    );
    assert_eq!(o.stdout, "first\nsecond\n");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn cancellation_interrupts_a_run() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let ctx = ExecContext::default();
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        cancel.cancel();
    });
    let t = Instant::now();
    let o = b
        .exec(
            &id,
            ExecRequest::new(Language::Python, "import time\ntime.sleep(60)", TIMEOUT),
            ctx,
        )
        .await
        .unwrap();
    assert!(o.cancelled);
    assert!(!o.timed_out);
    assert!(t.elapsed() < Duration::from_secs(10));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn stdin_is_empty_not_blocking() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = run_for(
        &b,
        &id,
        Language::Python,
        "input()",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(o.error.map(|e| e.name), Some("EOFError".to_owned()));
    let o = run_for(
        &b,
        &id,
        Language::Bash,
        "cat; read x; echo \"read=$?\"",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(o.stdout, "read=1\n");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn javascript_keeps_state_and_returns_values() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let js = |code: &'static str| {
        let b = b.clone();
        let id = id.clone();
        async move { run(&b, &id, Language::JavaScript, code).await }
    };
    let o = js("var a = 40; let b = 1; const c = 1; function add(x, y) { return x + y; }").await;
    assert!(o.succeeded(), "{o:?}");
    let o = js("add(a, b + c)").await;
    assert_eq!(value(&o).as_deref(), Some("42"));
    let o = js("console.log('out'); console.error('err'); ({ nested: { list: [1, 2] } })").await;
    assert_eq!(o.stdout, "out\n");
    assert_eq!(o.stderr, "err\n");
    assert_eq!(value(&o).as_deref(), Some("{ nested: { list: [ 1, 2 ] } }"));
    let o = js("require('path').join('a', 'b')").await;
    assert_eq!(value(&o).as_deref(), Some("'a/b'"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn javascript_top_level_await_keeps_declarations() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = run(
        &b,
        &id,
        Language::JavaScript,
        "const wait = (ms) => new Promise(r => setTimeout(r, ms));\nawait wait(10);\nconst answer = await Promise.resolve(41);\nanswer + 1",
    )
    .await;
    assert_eq!(value(&o).as_deref(), Some("42"), "{o:?}");
    let o = run(&b, &id, Language::JavaScript, "answer").await;
    assert_eq!(value(&o).as_deref(), Some("41"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn javascript_errors_and_interrupts() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = run(
        &b,
        &id,
        Language::JavaScript,
        "globalThis.kept = 1;\nfunction boom() { throw new TypeError('nope'); }\nboom()",
    )
    .await;
    let e = o.error.expect("error");
    assert_eq!(e.name, "TypeError");
    assert_eq!(e.value, "nope");
    assert!(e.traceback.contains("<cell 1>"), "{}", e.traceback);
    assert!(!e.traceback.contains("node_kernel"), "{}", e.traceback);
    // A synchronous infinite loop is interrupted; the context survives.
    let o = run_for(
        &b,
        &id,
        Language::JavaScript,
        "while (true) {}",
        Duration::from_secs(1),
    )
    .await;
    assert!(o.timed_out);
    assert!(!o.kernel_restarted, "{o:?}");
    // So is a promise that never settles.
    let o = run_for(
        &b,
        &id,
        Language::JavaScript,
        "await new Promise(() => {})",
        Duration::from_secs(1),
    )
    .await;
    assert!(o.timed_out);
    assert!(!o.kernel_restarted, "{o:?}");
    // An error thrown later by a timer does not take the kernel down.
    run(
        &b,
        &id,
        Language::JavaScript,
        "setTimeout(() => { throw new Error('late') }, 10)",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let o = run(&b, &id, Language::JavaScript, "kept").await;
    assert_eq!(value(&o).as_deref(), Some("1"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn bash_keeps_exports_and_directory_but_not_plain_variables() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = sh(
        &b,
        &id,
        "mkdir -p proj/src && cd proj/src && export GREETING='hello world' && PLAIN=1",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    let o = sh(
        &b,
        &id,
        "pwd; echo \"$GREETING\"; echo \"plain=${PLAIN:-unset}\"",
    )
    .await;
    assert_eq!(o.stdout, "/workspace/proj/src\nhello world\nplain=unset\n");
    // A removed directory falls back to /workspace.
    sh(
        &b,
        &id,
        "cd /workspace && rm -rf proj && cd /tmp && mkdir gone && cd gone && rmdir /tmp/gone",
    )
    .await;
    let o = sh(&b, &id, "pwd").await;
    assert_eq!(o.stdout, "/workspace\n");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn bash_exit_status_and_timeout() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = sh(&b, &id, "echo partial; exit 7").await;
    assert_eq!(o.exit_code, Some(7));
    assert_eq!(o.stdout, "partial\n");
    assert!(!o.succeeded());
    let t = Instant::now();
    let o = run_for(
        &b,
        &id,
        Language::Bash,
        "trap '' TERM; sleep 100 & sleep 100",
        Duration::from_secs(1),
    )
    .await;
    assert!(o.timed_out);
    assert!(t.elapsed() < Duration::from_secs(10));
    // The whole process group is gone: nothing is left sleeping. (The run ended when the
    // last of them closed its output, so each has exited; one the init has not reaped yet
    // is a zombie, not a survivor.)
    let o = sh(
        &b,
        &id,
        "ps -eo stat=,comm= 2>/dev/null | grep -v '^Z' | grep -c ' sleep$' || true",
    )
    .await;
    assert_eq!(o.stdout.trim(), "0", "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn bash_does_not_wait_for_background_processes() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let t = Instant::now();
    let o = sh(&b, &id, "sleep 30 & echo started").await;
    assert_eq!(o.stdout, "started\n");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn concurrent_runs_in_different_sandboxes_overlap() {
    let b = backend().await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let id = sandbox(&b).await;
            let o = py(
                &b,
                &id,
                &format!("import time\ns = time.time()\ntime.sleep(1)\n(s, time.time(), {i})"),
            )
            .await;
            b.close(&id).await.unwrap();
            let v = value(&o).unwrap();
            let parts: Vec<f64> = v
                .trim_matches(|c| c == '(' || c == ')')
                .split(", ")
                .map(|p| p.parse().unwrap())
                .collect();
            assert_eq!(parts[2] as usize, i);
            (parts[0], parts[1])
        }));
    }
    let mut spans = Vec::new();
    for t in tasks {
        spans.push(t.await.unwrap());
    }
    let latest_start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let earliest_end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(
        latest_start < earliest_end,
        "runs did not overlap: {spans:?}"
    );
}

#[tokio::test]
async fn typescript_runs_in_the_javascript_context() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let ts = |code: &'static str| {
        let b = b.clone();
        let id = id.clone();
        async move { run(&b, &id, Language::TypeScript, code).await }
    };
    let o = ts("import * as path from 'node:path';\n\
                import { createHash } from 'crypto';\n\
                interface User { name: string; age: number }\n\
                enum Color { Red, Green }\n\
                function greet<T extends User>(u: T): string { return `${u.name} (${u.age})`; }\n\
                const user: User = { name: 'Ada', age: 36 };\n\
                console.log(greet(user), Color.Green, path.basename('/a/b.txt'));\n\
                createHash('sha256').update('x').digest('hex').slice(0, 8)")
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.stdout, "Ada (36) 1 b.txt\n");
    assert_eq!(value(&o).as_deref(), Some("'2d711642'"));
    // TypeScript and JavaScript share one context.
    let o = run(&b, &id, Language::JavaScript, "greet(user)").await;
    assert_eq!(value(&o).as_deref(), Some("'Ada (36)'"));
    // Type errors do not block a run: nothing is type-checked.
    let o = ts("const n: number = 'not a number' as any;\nn").await;
    assert_eq!(value(&o).as_deref(), Some("'not a number'"), "{o:?}");
    // Top-level await.
    let o = ts("const v: number = await Promise.resolve(41);\nv + 1").await;
    assert_eq!(value(&o).as_deref(), Some("42"), "{o:?}");
    // A syntax error names its line; nothing ran.
    let o = ts("console.log('never');\nconst broken: = 2;").await;
    let e = o.error.expect("syntax error");
    assert_eq!(e.name, "SyntaxError");
    assert!(e.value.contains("line 2"), "{e:?}");
    assert_eq!(o.stdout, "");
    // Plain JavaScript may use import too.
    let o = run(
        &b,
        &id,
        Language::JavaScript,
        "import os from 'os';\ntypeof os.cpus",
    )
    .await;
    assert_eq!(value(&o).as_deref(), Some("'function'"), "{o:?}");
    // Node's global `crypto` is a getter without a setter; an import of the module by that
    // name must still win, in TypeScript and in JavaScript.
    let o = ts("import * as crypto from 'crypto';\ntypeof crypto.createHash").await;
    assert_eq!(value(&o).as_deref(), Some("'function'"), "{o:?}");
    let o = run(&b, &id, Language::JavaScript, "var crypto = 7;\ncrypto + 1").await;
    assert_eq!(value(&o).as_deref(), Some("8"), "{o:?}");
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn unknown_sandbox_is_a_caller_error() {
    let b = backend().await;
    let e = b
        .exec(
            &"sbx_doesnotexist".into(),
            ExecRequest::new(Language::Python, "1", TIMEOUT),
            ExecContext::default(),
        )
        .await
        .unwrap_err();
    assert!(e.is_caller_error());
    assert!(e.to_string().contains("sbx_doesnotexist"));
    let id = sandbox(&b).await;
    b.close(&id).await.unwrap();
    assert!(b.close(&id).await.unwrap_err().is_caller_error());
    assert!(b.status(&id).await.unwrap_err().is_caller_error());
}
