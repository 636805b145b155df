//! Command-line arguments. Every flag can also be set with a `RUNBOX_*` environment
//! variable.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use runbox_core::{Language, Limits};
use runbox_local::{InterpreterPaths, LocalConfig};

#[derive(Debug, Parser)]
#[command(
    name = "runbox",
    version,
    about = "Run untrusted code in sandboxes, for AI agents (an MCP server)."
)]
pub(crate) struct Cli {
    /// Log filter for stderr (`warn`, `info`, `debug`, or a tracing directive).
    #[arg(long, global = true, env = "RUNBOX_LOG", default_value = "warn")]
    pub(crate) log: String,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve MCP (stdio or streamable HTTP): tools to create sandboxes and run code in them.
    Serve(Box<crate::config::ServeArgs>),
    /// Run code in a fresh sandbox, streaming its output; exit 0 on success, 1 when the code
    /// failed (bash: its own status), 124 on timeout, 125 when the sandbox could not run.
    Run(RunArgs),
    /// Report each isolation layer this machine offers and prove a sandbox runs with them.
    Doctor(DoctorArgs),
    /// Manage the bearer tokens of `serve --http ADDR --tokens PATH`: add, list, revoke.
    Token(crate::token::TokenArgs),
    /// Chat with a model (any OpenAI-compatible API) that uses this server's tools.
    Chat(Box<runbox_chat::ChatArgs>),
}

/// Settings of the local sandbox engine, shared by every command that starts sandboxes.
#[derive(Debug, Clone, Args)]
pub(crate) struct EngineArgs {
    /// Runtime state directory (uid leases, mount point). Default: /run/runbox as root,
    /// $XDG_RUNTIME_DIR/runbox or /tmp/runbox-UID otherwise.
    #[arg(long, env = "RUNBOX_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,

    /// Parent cgroup for sandboxes, relative to the hierarchy root (a subtree delegated to
    /// this user); default: the server's own cgroup.
    #[arg(long, env = "RUNBOX_CGROUP_PARENT")]
    pub(crate) cgroup_parent: Option<PathBuf>,

    /// Run sandboxes without cgroups: each process's memory is capped (RLIMIT_DATA) but not
    /// the sandbox's as a whole, processes by RLIMIT_NPROC, CPU not at all; no pause.
    /// Without this flag runbox refuses to start where cgroups are unavailable.
    #[arg(
        long,
        env = "RUNBOX_NO_CGROUPS",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub(crate) no_cgroups: bool,

    /// Python 3 for sandboxes (default: python3 on PATH, resolved through version managers).
    #[arg(long, env = "RUNBOX_PYTHON")]
    pub(crate) python: Option<PathBuf>,

    /// Node.js for sandboxes (default: node on PATH).
    #[arg(long, env = "RUNBOX_NODE")]
    pub(crate) node: Option<PathBuf>,

    /// bash for sandboxes (default: /usr/bin/bash).
    #[arg(long, env = "RUNBOX_BASH")]
    pub(crate) bash: Option<PathBuf>,

    /// The runbox binary sandboxes re-execute as their init (default: this very binary).
    #[arg(long, env = "RUNBOX_INIT_EXE", hide = true)]
    pub(crate) init_exe: Option<PathBuf>,
}

impl EngineArgs {
    pub(crate) fn local_config(&self, limits: Limits) -> LocalConfig {
        let mut config = LocalConfig {
            default_limits: limits,
            interpreters: InterpreterPaths {
                python: self.python.clone(),
                node: self.node.clone(),
                bash: self.bash.clone(),
            },
            ..Default::default()
        };
        if let Some(dir) = &self.state_dir {
            config.jail.state_dir = dir.clone();
        }
        if let Some(exe) = &self.init_exe {
            config.jail.init_exe = exe.clone();
        }
        config.jail.cgroup_parent = self.cgroup_parent.clone();
        config.jail.cgroups = if self.no_cgroups {
            runbox_jail::CgroupMode::Disabled
        } else {
            runbox_jail::CgroupMode::Required
        };
        config
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Language of the code.
    #[arg(short, long, default_value = "python", value_parser = parse_language)]
    pub(crate) language: Language,

    /// Wall-clock limit in seconds (up to a day); the run is interrupted when it passes.
    #[arg(short, long, env = "RUNBOX_TIMEOUT", default_value = "60", value_parser = parse_timeout)]
    pub(crate) timeout: std::time::Duration,

    /// Memory limit of the sandbox in MiB (files in /workspace and /tmp count too).
    #[arg(long, env = "RUNBOX_MEMORY_MB")]
    pub(crate) memory_mb: Option<u64>,

    /// Output kept per stream in bytes; beyond it the head and tail are kept.
    #[arg(long, env = "RUNBOX_OUTPUT_LIMIT")]
    pub(crate) output_limit: Option<usize>,

    #[command(flatten)]
    pub(crate) engine: EngineArgs,

    /// The code, or `-` to read it from standard input.
    pub(crate) code: String,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Check this backend: local (this machine's isolation layers, the default) or e2b (the
    /// provider, the key and the template, by running a cloud sandbox).
    #[arg(long, env = "RUNBOX_BACKEND", value_name = "NAME")]
    pub(crate) backend: Option<crate::config::BackendKind>,

    #[command(flatten)]
    pub(crate) e2b: crate::config::E2bArgs,

    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// Longest timeout accepted, one day: longer work belongs in a background process.
const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECONDS) {
        return Err(format!(
            "must be more than 0 and at most {MAX_TIMEOUT_SECONDS} seconds"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

fn parse_language(s: &str) -> Result<Language, String> {
    s.parse::<Language>().map_err(|e| e.to_string())
}
