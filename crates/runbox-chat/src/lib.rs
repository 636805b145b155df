//! `runbox chat`: a terminal agent. A model behind any OpenAI-compatible chat completions
//! API answers the user's messages using the tools of an MCP server (a runbox started
//! here with `serve --stdio`, or one at a URL): it keeps the conversation, shows each tool
//! call and result, stops a turn at a step limit, and closes on exit every sandbox the
//! conversation opened.
//!
//! [`model`] is the streaming API client, [`mcp`] the server connection, [`render`] the
//! terminal output, [`agent`] the loop.

mod agent;
mod error;
mod mcp;
mod model;
mod render;

use std::path::PathBuf;

use tokio::sync::mpsc;

pub use error::ChatError;

use agent::{Agent, TurnEnd};
use mcp::{Server, Target};
use model::{ModelClient, ModelSettings};
use render::Renderer;

/// The arguments of `runbox chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The MCP server's streamable HTTP endpoint (`http://HOST:PORT/mcp`). Without it, the
    /// chat starts `runbox serve --stdio` itself.
    #[arg(long, value_name = "URL", conflicts_with = "stdio")]
    pub url: Option<String>,

    /// Bearer token for `--url` (ignored with `--stdio`).
    #[arg(long, env = "RUNBOX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Start `runbox serve --stdio` as the MCP server (the default without `--url`).
    #[arg(long)]
    pub stdio: bool,

    /// An argument for the `runbox serve --stdio` started here; repeatable
    /// (`--serve-arg --profile --serve-arg novita-tutorial`).
    #[arg(
        long = "serve-arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        conflicts_with = "url"
    )]
    pub serve_args: Vec<String>,

    /// The model. Default: gpt-4.1-mini, or qwen/qwen3-coder-480b-a35b-instruct on Novita.
    #[arg(long, env = "RUNBOX_CHAT_MODEL")]
    pub model: Option<String>,

    /// The OpenAI-compatible API's base URL. Default: https://api.openai.com/v1, or
    /// https://api.novita.ai/v3/openai when only NOVITA_API_KEY is set.
    #[arg(long, value_name = "URL", env = "OPENAI_BASE_URL")]
    pub base_url: Option<String>,

    /// The API key. Default: OPENAI_API_KEY (NOVITA_API_KEY for Novita's URL); a local
    /// server given with --base-url may need none.
    #[arg(long)]
    pub api_key: Option<String>,

    /// Model responses allowed per user message; when reached, the turn stops.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: u32,

    /// Answer this one message and exit: the answer on stdout, tool calls and results on
    /// stderr; exit status 0 when answered, 1 on an error or at the step limit.
    #[arg(long, short = 'p', value_name = "TEXT")]
    pub prompt: Option<String>,

    /// Where images in tool results are saved (default: a runbox-chat-PID folder in the
    /// temporary directory).
    #[arg(long, value_name = "DIR")]
    pub images_dir: Option<PathBuf>,
}

/// Runs the chat; returns the exit status.
pub async fn run(args: ChatArgs) -> u8 {
    match start(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("runbox chat: {e}");
            1
        }
    }
}

async fn start(args: ChatArgs) -> Result<u8, ChatError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let settings = ModelSettings::resolve(
        args.base_url,
        args.api_key,
        args.model,
        env("OPENAI_API_KEY"),
        env("NOVITA_API_KEY"),
    )?;
    let model = ModelClient::new(settings)?;
    let target = match args.url {
        Some(url) => Target::Url {
            url,
            token: args.token,
        },
        None => Target::Spawn {
            exe: std::env::current_exe().map_err(|e| ChatError::McpConnect {
                target: "runbox serve --stdio".to_owned(),
                reason: format!("cannot find this program: {e}"),
            })?,
            args: args.serve_args,
        },
    };
    let server = Server::connect(&target).await?;
    let images_dir = args.images_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("runbox-chat-{}", std::process::id()))
    });
    let one_shot = args.prompt.is_some();
    let render = Renderer::new(one_shot, images_dir);
    let mut agent = Agent::new(model, server, render, args.max_steps).await;
    let code = match args.prompt {
        Some(prompt) => answer_once(&mut agent, &prompt).await,
        None => converse(&mut agent).await,
    };
    agent.shutdown().await;
    Ok(code)
}

/// `--prompt`: one turn; Ctrl-C stops it.
async fn answer_once(agent: &mut Agent, prompt: &str) -> u8 {
    tokio::select! {
        end = agent.turn(prompt) => match end {
            Ok(TurnEnd::Answer(text)) => {
                agent.render.final_answer(&text);
                0
            }
            Ok(TurnEnd::StepLimit) => 1,
            Err(e) => {
                eprintln!("runbox chat: {e}");
                1
            }
        },
        _ = tokio::signal::ctrl_c() => {
            agent.render.notice("interrupted");
            130
        }
    }
}

/// The conversation: a line is a message; `quit`, `exit` or end of input ends it; Ctrl-C
/// interrupts the step in progress, and at the prompt ends the chat.
async fn converse(agent: &mut Agent) -> u8 {
    agent.render.banner(&agent.describe());
    agent
        .render
        .banner("Type a message; quit, exit or Ctrl-D ends the chat, Ctrl-C interrupts a step.");
    let mut lines = stdin_lines();
    loop {
        agent.render.prompt();
        let line = tokio::select! {
            line = lines.recv() => line,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(line) = line else {
            agent.render.banner("");
            return 0;
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if matches!(text, "quit" | "exit" | "quit()" | "exit()") {
            return 0;
        }
        tokio::select! {
            end = agent.turn(text) => if let Err(e) = end {
                eprintln!("runbox chat: {e}");
            },
            _ = tokio::signal::ctrl_c() => {
                agent.render.notice("\ninterrupted (Ctrl-C again at the prompt to leave)");
            }
        }
    }
}

/// Lines of standard input, read on a thread of their own: a blocking read cannot be
/// cancelled, and the process must be able to exit while one waits.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(1);
    std::thread::spawn(move || {
        let mut line = String::new();
        loop {
            line.clear();
            match std::io::stdin().read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.blocking_send(line.clone()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// An HTTP client for `url`: loopback addresses are never sent through a proxy.
pub(crate) fn http_client(url: &str) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    let loopback = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .is_some_and(|host| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
    if loopback {
        builder.no_proxy()
    } else {
        builder
    }
}
