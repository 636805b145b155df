//! `runbox run`: one piece of code in a fresh sandbox, output streamed to the terminal.

use std::io::{Read, Write};
use std::sync::Arc;

use anyhow::Context;
use runbox_core::{
    Backend, ExecContext, ExecOutcome, ExecRequest, Language, Limits, OutputChunk, OutputStream,
    SandboxSpec,
};
use runbox_local::LocalBackend;

use crate::cli::RunArgs;

/// The code failed: an uncaught exception, or a non-zero exit.
pub(crate) const EXIT_CODE_FAILED: u8 = 1;
/// The run's timeout passed.
pub(crate) const EXIT_TIMEOUT: u8 = 124;
/// The sandbox itself could not run.
pub(crate) const EXIT_SANDBOX_FAILED: u8 = 125;
/// Interrupted from the terminal (Ctrl-C).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

pub(crate) async fn main(args: RunArgs) -> u8 {
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("runbox: {e:#}");
            EXIT_SANDBOX_FAILED
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<u8> {
    let code = if args.code == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the code from stdin")?;
        s
    } else {
        args.code.clone()
    };
    let mut limits = Limits::default();
    if let Some(m) = args.memory_mb {
        limits.memory_mb = m;
    }
    if let Some(o) = args.output_limit {
        limits.output_bytes = o;
    }
    limits.validate()?;

    let backend = LocalBackend::new(args.engine.local_config(limits.clone())).await?;
    let info = backend
        .create(SandboxSpec {
            limits: Some(limits),
            ..Default::default()
        })
        .await?;

    let sink = Arc::new(|chunk: OutputChunk| {
        let _ = match chunk.stream {
            OutputStream::Stdout => write_now(&mut std::io::stdout().lock(), &chunk.text),
            OutputStream::Stderr => write_now(&mut std::io::stderr().lock(), &chunk.text),
        };
    });
    let ctx = ExecContext::streaming(sink);
    let cancel = ctx.cancel.clone();
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let request = ExecRequest::new(args.language, code, args.timeout);
    let result = backend.exec(&info.id, request, ctx).await;
    ctrl_c.abort();
    backend.close(&info.id).await?;
    let outcome = result?;
    Ok(report(args.language, &outcome))
}

fn write_now(w: &mut impl Write, text: &str) -> std::io::Result<()> {
    w.write_all(text.as_bytes())?;
    w.flush()
}

/// Prints what was not streamed (results, the tail of truncated output, the error, notes)
/// and picks the exit status.
fn report(language: Language, outcome: &ExecOutcome) -> u8 {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    for (stream, text) in [
        (&mut out as &mut dyn Write, &outcome.stdout),
        (&mut err, &outcome.stderr),
    ] {
        if let Some(i) = text.find("\n[... ").filter(|_| outcome.truncated) {
            let _ = write!(stream, "{}", &text[i..]);
        }
    }
    for result in &outcome.results {
        if let Some(text) = result.text() {
            let _ = writeln!(out, "{text}");
        }
    }
    let _ = out.flush();
    if let Some(e) = &outcome.error {
        let text = if e.traceback.is_empty() {
            format!("{}: {}\n", e.name, e.value)
        } else {
            e.traceback.clone()
        };
        let _ = write!(
            err,
            "{}{}",
            text,
            if text.ends_with('\n') { "" } else { "\n" }
        );
    }
    for note in &outcome.notes {
        let _ = writeln!(err, "runbox: {note}");
    }
    if outcome.cancelled {
        EXIT_INTERRUPTED
    } else if outcome.timed_out {
        EXIT_TIMEOUT
    } else if language == Language::Bash
        && let Some(code) = outcome.exit_code
    {
        u8::try_from(code).unwrap_or(EXIT_CODE_FAILED)
    } else if outcome.succeeded() {
        0
    } else {
        EXIT_CODE_FAILED
    }
}
