//! The `runbox` binary: `serve` (the MCP server), `run` (one piece of code in a fresh
//! sandbox), `doctor` (which isolation layers this machine offers), `token` (the tokens
//! file of an authenticated server), `chat` (a terminal agent using a model and these
//! tools), and, hidden, the sandbox
//! init that the local backend re-executes this binary as.

mod auth;
mod cli;
mod config;
mod doctor;
mod run;
mod serve;
mod token;

use clap::{CommandFactory, FromArgMatches};

fn main() -> std::process::ExitCode {
    // The sandbox init must take over before anything else happens in this process: it
    // needs a single thread to create a user namespace, and none of the host's state.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == runbox_jail::init::INIT_ARG)
    {
        runbox_jail::init::main();
    }
    // The matches are kept: `serve` tells a flag from a default when it reads its file.
    let matches = cli::Cli::command().get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_tracing(&cli.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runbox: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(run::EXIT_SANDBOX_FAILED);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            cli::Command::Run(args) => run::main(args).await,
            cli::Command::Doctor(args) => doctor::main(args).await,
            cli::Command::Serve(_) => match matches.subcommand_matches("serve") {
                Some(given) => serve::main(given).await,
                None => serve::EXIT_CONFIG,
            },
            cli::Command::Token(args) => token::main(args),
            cli::Command::Chat(args) => runbox_chat::run(*args).await,
        }
    });
    std::process::ExitCode::from(code)
}

/// Logs go to stderr only: stdout belongs to the code's output (and, in stdio server mode,
/// to the protocol).
fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
