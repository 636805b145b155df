//! `runbox token add | list | revoke`: the tokens file a server started with `--tokens`
//! reads. Only tokens' SHA-256 hashes are stored; a new token is printed once, as the last
//! word of `add`'s output, and cannot be shown again.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use runbox_auth::{NewToken, TenantLimits, TokenFile};

/// `runbox token`.
#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token for a tenant and print it (once).
    Add(AddArgs),
    /// List the tokens (names, tenants, limits; never the tokens themselves).
    List(FileArg),
    /// Revoke a token: a server using the file refuses it from its next request.
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
struct FileArg {
    /// The tokens file [default: $RUNBOX_TOKENS, else ~/.config/runbox/tokens.toml].
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
}

impl FileArg {
    fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.file {
            Some(p) => Ok(p.clone()),
            None => runbox_auth::default_token_path().context("where is the tokens file?"),
        }
    }
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The token's name (unique; what `revoke` takes): letters, digits, '.', '_', '-'.
    name: String,
    /// The tenant the token acts for [default: NAME]. Tokens of one tenant share its
    /// sandboxes.
    #[arg(long)]
    tenant: Option<String>,
    /// Most sandboxes the tenant may hold at once.
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<u32>,
    /// Most runs the tenant may have in progress at once.
    #[arg(long, value_name = "N")]
    max_concurrent_runs: Option<u32>,
    /// Most requests a minute the tenant may send.
    #[arg(long, value_name = "N")]
    requests_per_minute: Option<u32>,
    #[command(flatten)]
    file: FileArg,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The token's name.
    name: String,
    #[command(flatten)]
    file: FileArg,
}

/// Runs a `token` subcommand; the exit status.
pub(crate) fn main(args: TokenArgs) -> u8 {
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("runbox token: {e:#}");
            1
        }
    }
}

fn run(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Add(a) => {
            let path = a.file.path()?;
            let tenant = a.tenant.clone().unwrap_or_else(|| a.name.clone());
            let token = runbox_auth::add_token(
                &path,
                NewToken {
                    name: a.name.clone(),
                    tenant: a.tenant,
                    limits: TenantLimits {
                        max_sandboxes: a.max_sandboxes,
                        max_concurrent_runs: a.max_concurrent_runs,
                        requests_per_minute: a.requests_per_minute,
                    },
                },
            )?;
            println!(
                "Added token {:?} for tenant {tenant:?} to {}.\nClients send it as \
                 \"Authorization: Bearer <token>\". It is shown only this once:\n{token}",
                a.name,
                path.display()
            );
        }
        TokenCommand::List(f) => {
            let path = f.path()?;
            let file = TokenFile::load(&path)?;
            if file.entries().is_empty() {
                println!("No tokens in {}.", path.display());
                return Ok(());
            }
            println!("{:<24} {:<24} {:<22} LIMITS", "NAME", "TENANT", "CREATED");
            for e in file.entries() {
                let mut limits = Vec::new();
                if let Some(n) = e.limits.max_sandboxes {
                    limits.push(format!("max_sandboxes={n}"));
                }
                if let Some(n) = e.limits.max_concurrent_runs {
                    limits.push(format!("max_concurrent_runs={n}"));
                }
                if let Some(n) = e.limits.requests_per_minute {
                    limits.push(format!("requests_per_minute={n}"));
                }
                println!(
                    "{:<24} {:<24} {:<22} {}",
                    e.name,
                    e.tenant,
                    e.created.as_deref().unwrap_or("-"),
                    if limits.is_empty() {
                        "-".to_owned()
                    } else {
                        limits.join(" ")
                    }
                );
            }
        }
        TokenCommand::Revoke(r) => {
            let path = r.file.path()?;
            runbox_auth::revoke_token(&path, &r.name)?;
            println!(
                "Revoked token {:?} in {}. A server using this file refuses it from its next \
                 request.",
                r.name,
                path.display()
            );
        }
    }
    Ok(())
}
