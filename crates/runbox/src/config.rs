//! `runbox serve` configuration: one schema, [`ServeArgs`], names every setting once. Each
//! field is a setting: its id (the field's name) is its TOML key, `--` and the id in kebab
//! case its flag, `RUNBOX_` and the id in upper case its variable; its doc comment is its
//! help, and its default (`default_value_t`, or the doc's `[default: ...]` when it depends
//! on other settings) is the one place that default is given. A test checks the three names
//! agree, and that the README's configuration table shows every setting with its default.
//!
//! A flag wins over its variable, both over the `--config` TOML file, and the file over the
//! defaults ([`layers`] merges them without naming any setting). The merged settings are
//! then checked and turned into one [`ServeConfig`] before anything starts; each backend's
//! own settings are checked by its module ([`e2b`], [`local`]).
//!
//! To add a setting: a field in [`ServeArgs`] (or the flattened struct it belongs to) with
//! `#[arg(long, env = "RUNBOX_...")]` and a doc comment, its use in
//! [`ServeConfig::resolve`], and its row in the README's configuration table.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{ArgMatches, Args, FromArgMatches};
use runbox_core::Limits;
use runbox_mcp::Profile;

use crate::cli::EngineArgs;

mod e2b;
mod http;
mod layers;
mod local;

pub(crate) use e2b::{E2bArgs, E2bSettings};

/// How the server's environment is read (tests give their own).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Result<String, std::env::VarError>;

/// Every setting of `runbox serve`: flags, `RUNBOX_*` variables and TOML keys alike.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Serve MCP on stdin and stdout (what desktop clients spawn).
    #[arg(long, env = "RUNBOX_STDIO", conflicts_with = "http")]
    pub(crate) stdio: bool,

    /// Serve MCP over streamable HTTP at ADDR (endpoint /mcp, plus /healthz), e.g.
    /// 127.0.0.1:8000.
    #[arg(long, env = "RUNBOX_HTTP", value_name = "ADDR")]
    pub(crate) http: Option<SocketAddr>,

    /// A TOML file with any of the settings below (flags and variables win over it).
    #[arg(long, env = "RUNBOX_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,

    /// Allow binding HTTP to a non-loopback address without authentication (no --tokens,
    /// no --oauth-issuer): anyone who can reach the port can run code.
    #[arg(long, env = "RUNBOX_INSECURE_PUBLIC")]
    pub(crate) insecure_public: bool,

    /// Where sandboxes run: local (this machine) or e2b (E2B or Novita cloud sandboxes; see
    /// the --e2b-* settings).
    #[arg(long, env = "RUNBOX_BACKEND", value_name = "NAME", value_enum,
          default_value_t = BackendKind::Local)]
    pub(crate) backend: BackendKind,

    #[command(flatten)]
    pub(crate) e2b: E2bArgs,

    /// How callers authenticate over HTTP besides --tokens and --oauth-issuer:
    /// "passthrough" takes each caller's `Authorization: Bearer` value as their own provider
    /// API key (--backend e2b): the server keeps no key, and each key sees only the
    /// sandboxes it made.
    #[arg(long, env = "RUNBOX_AUTH", value_name = "MODE")]
    pub(crate) auth: Option<AuthMode>,

    /// Require a bearer token on /mcp from this tokens file (made with `runbox token add`);
    /// it is re-read when it changes, so a revoked token stops working at once.
    #[arg(long, env = "RUNBOX_TOKENS", value_name = "PATH")]
    pub(crate) tokens: Option<PathBuf>,

    /// Accept OAuth 2.1 access tokens (JWTs) from this issuer on /mcp; their subject is the
    /// tenant. Needs --oauth-audience.
    #[arg(long, env = "RUNBOX_OAUTH_ISSUER", value_name = "URL")]
    pub(crate) oauth_issuer: Option<String>,

    /// The audience JWTs must be issued for (this server's resource identifier).
    #[arg(long, env = "RUNBOX_OAUTH_AUDIENCE", value_name = "AUD")]
    pub(crate) oauth_audience: Option<String>,

    /// The issuer's JWKS URL, when its metadata does not give one.
    #[arg(long, env = "RUNBOX_OAUTH_JWKS_URL", value_name = "URL")]
    pub(crate) oauth_jwks_url: Option<String>,

    /// This server's public base URL (https://runbox.example.com), named in its OAuth
    /// protected-resource metadata; default: http:// and the request's Host.
    #[arg(long, env = "RUNBOX_PUBLIC_URL", value_name = "URL")]
    pub(crate) public_url: Option<String>,

    /// Most sandboxes one tenant may hold at once, paused ones included [default: with
    /// authentication (--tokens, --oauth-issuer, --auth), a quarter of --max-sandboxes (at
    /// least 1), so no tenant can take every place; without, no limit but --max-sandboxes].
    #[arg(long, env = "RUNBOX_MAX_SANDBOXES_PER_TENANT", value_name = "N")]
    pub(crate) max_sandboxes_per_tenant: Option<usize>,

    /// Most runs one tenant may have in progress at once [default: no limit but
    /// --max-concurrent-runs].
    #[arg(long, env = "RUNBOX_MAX_RUNS_PER_TENANT", value_name = "N")]
    pub(crate) max_runs_per_tenant: Option<usize>,

    /// Most runs in progress at once, all tenants together [default: --max-sandboxes].
    #[arg(long, env = "RUNBOX_MAX_CONCURRENT_RUNS", value_name = "N")]
    pub(crate) max_concurrent_runs: Option<usize>,

    /// Requests a minute each tenant may send over HTTP (429 beyond it); a token's own
    /// rate wins [default: no limit].
    #[arg(long, env = "RUNBOX_RATE_LIMIT", value_name = "PER_MINUTE")]
    pub(crate) rate_limit: Option<u32>,

    /// Most tasks (long runs polled with tasks/get) one tenant may hold at once, running or
    /// finished and not yet forgotten.
    #[arg(long, env = "RUNBOX_MAX_TASKS_PER_TENANT", value_name = "N",
          default_value_t = runbox_mcp::TaskSettings::default().max_per_tenant)]
    pub(crate) max_tasks_per_tenant: usize,

    /// Most tasks held at once, all tenants together.
    #[arg(long, env = "RUNBOX_MAX_TASKS", value_name = "N",
          default_value_t = runbox_mcp::TaskSettings::default().max_tasks)]
    pub(crate) max_tasks: usize,

    /// Seconds a finished task's result is kept for tasks/get after the run ends.
    #[arg(long, env = "RUNBOX_TASK_RESULT_TTL", value_name = "SECONDS",
          default_value_t = runbox_mcp::TaskSettings::default().result_ttl.as_secs_f64())]
    pub(crate) task_result_ttl: f64,

    /// Seconds a run of a client that declares the tasks extension may take before the call
    /// is answered with a task to poll.
    #[arg(long, env = "RUNBOX_TASK_AFTER", value_name = "SECONDS",
          default_value_t = runbox_mcp::TaskSettings::default().inline_wait.as_secs_f64())]
    pub(crate) task_after: f64,

    /// Append one JSON line per tool call to FILE (time, tenant, tool, sandbox, outcome,
    /// duration).
    #[arg(long, env = "RUNBOX_AUDIT_LOG", value_name = "FILE")]
    pub(crate) audit_log: Option<PathBuf>,

    /// Also write the code and commands of each call in the audit log (needs --audit-log).
    #[arg(long, env = "RUNBOX_AUDIT_CODE")]
    pub(crate) audit_code: bool,

    /// Host header value accepted on HTTP, besides localhost (DNS-rebinding protection);
    /// repeatable.
    #[arg(
        long,
        env = "RUNBOX_ALLOWED_HOST",
        value_name = "HOST",
        value_delimiter = ','
    )]
    pub(crate) allowed_host: Vec<String>,

    /// Browser Origin accepted on HTTP (scheme://host:port); repeatable.
    #[arg(
        long,
        env = "RUNBOX_ALLOWED_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub(crate) allowed_origin: Vec<String>,

    /// Fresh sandboxes kept ready with a Python kernel started [default: 2, 0 with --backend
    /// e2b].
    #[arg(long, env = "RUNBOX_POOL", value_name = "N")]
    pub(crate) pool: Option<usize>,

    /// Most sandboxes alive at once, pool excluded.
    #[arg(
        long,
        env = "RUNBOX_MAX_SANDBOXES",
        value_name = "N",
        default_value_t = 50
    )]
    pub(crate) max_sandboxes: usize,

    /// Idle life of a sandbox in seconds when its creator gives none.
    #[arg(
        long,
        env = "RUNBOX_SANDBOX_TIMEOUT",
        value_name = "S",
        default_value_t = 900.0
    )]
    pub(crate) sandbox_timeout: f64,

    /// Longest idle life a creator may ask for, in seconds.
    #[arg(long, env = "RUNBOX_MAX_SANDBOX_TIMEOUT", value_name = "S",
          default_value_t = MAX_SECONDS)]
    pub(crate) max_sandbox_timeout: f64,

    /// Longest a sandbox may stay paused, in seconds: then it is closed, unless resumed
    /// first (its idle clock stands still while paused, this one does not).
    #[arg(
        long,
        env = "RUNBOX_PAUSE_TIMEOUT",
        value_name = "S",
        default_value_t = 3600.0
    )]
    pub(crate) pause_timeout: f64,

    /// A run's timeout in seconds when the caller gives none.
    #[arg(
        long,
        env = "RUNBOX_RUN_TIMEOUT",
        value_name = "S",
        default_value_t = 60.0
    )]
    pub(crate) run_timeout: f64,

    /// Longest run timeout a caller may ask for, in seconds.
    #[arg(
        long,
        env = "RUNBOX_MAX_RUN_TIMEOUT",
        value_name = "S",
        default_value_t = 600.0
    )]
    pub(crate) max_run_timeout: f64,

    #[command(flatten)]
    pub(crate) limits: LimitArgs,

    /// The most bytes one answer may take (512 KiB by default). Clients drop bigger
    /// messages (the Python SDK 2.x its whole session past 1 MiB), so big reads come in
    /// parts and big images and answers as links to read in pieces.
    #[arg(long, env = "RUNBOX_MESSAGE_LIMIT", value_name = "BYTES",
          default_value_t = runbox_mcp::DEFAULT_MESSAGE_LIMIT)]
    pub(crate) message_limit: usize,

    #[command(flatten)]
    pub(crate) local: local::LocalArgs,

    /// Serve a compatibility profile's tools instead of runbox's own: novita-tutorial,
    /// code-sandbox-mcp or mcp-code-sandbox.
    #[arg(long, env = "RUNBOX_PROFILE", value_name = "NAME")]
    pub(crate) profile: Option<String>,

    /// Host environment variables copied into every sandbox (names, comma-separated or
    /// repeated); each must be set when the server starts. Nothing else of the host's
    /// environment ever enters a sandbox.
    #[arg(
        long,
        env = "RUNBOX_PASS_THROUGH_ENV",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub(crate) pass_through_env: Vec<String>,

    #[command(flatten)]
    pub(crate) http_limits: http::HttpLimitArgs,

    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// The limits of each sandbox (the local backend's; the e2b backend applies the output
/// limit only).
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// Memory of a sandbox in MiB, files in /workspace and /tmp included.
    #[arg(long, env = "RUNBOX_MEMORY_MB", value_name = "MIB",
          default_value_t = Limits::default().memory_mb)]
    pub(crate) memory_mb: u64,

    /// Processes per sandbox.
    #[arg(long, env = "RUNBOX_PIDS", value_name = "N", default_value_t = Limits::default().pids)]
    pub(crate) pids: u32,

    /// CPU per sandbox, in cores.
    #[arg(long, env = "RUNBOX_CPUS", value_name = "CORES",
          default_value_t = Limits::default().cpus)]
    pub(crate) cpus: f64,

    /// Size of /workspace in MiB.
    #[arg(long, env = "RUNBOX_WORKSPACE_MB", value_name = "MIB",
          default_value_t = Limits::default().workspace_mb)]
    pub(crate) workspace_mb: u64,

    /// Size of /tmp in MiB.
    #[arg(long, env = "RUNBOX_TMP_MB", value_name = "MIB",
          default_value_t = Limits::default().tmp_mb)]
    pub(crate) tmp_mb: u64,

    /// Files and directories each of /workspace and /tmp may hold.
    #[arg(long, env = "RUNBOX_INODES", value_name = "N",
          default_value_t = Limits::default().inodes)]
    pub(crate) inodes: u64,

    /// Open files per process in a sandbox.
    #[arg(long, env = "RUNBOX_OPEN_FILES", value_name = "N",
          default_value_t = Limits::default().open_files)]
    pub(crate) open_files: u64,

    /// Output kept per stream per run, in bytes; beyond it the head and tail are kept.
    #[arg(long, env = "RUNBOX_OUTPUT_LIMIT", value_name = "BYTES",
          default_value_t = Limits::default().output_bytes)]
    pub(crate) output_limit: usize,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            memory_mb: self.memory_mb,
            pids: self.pids,
            cpus: self.cpus,
            workspace_mb: self.workspace_mb,
            tmp_mb: self.tmp_mb,
            inodes: self.inodes,
            open_files: self.open_files,
            output_bytes: self.output_limit,
        }
    }
}

/// Where sandboxes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendKind {
    /// On this machine, in runbox's own jail.
    #[default]
    Local,
    /// In E2B-compatible cloud sandboxes (E2B, Novita).
    E2b,
}

/// An authentication mode chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AuthMode {
    /// Each caller's bearer value is their own provider API key.
    Passthrough,
}

/// Where MCP is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    Stdio,
    Http(SocketAddr),
}

/// Who may use the HTTP transport.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AuthConfig {
    /// Each caller's bearer value is their provider key (`--auth passthrough`).
    pub(crate) passthrough: bool,
    /// runbox's own tokens file.
    pub(crate) tokens: Option<PathBuf>,
    /// An OAuth issuer whose JWTs are accepted.
    pub(crate) oauth: Option<OAuthConfig>,
    /// The public base URL named in the protected-resource metadata.
    pub(crate) public_url: Option<String>,
}

impl AuthConfig {
    /// Whether any authentication is configured.
    pub(crate) fn any(&self) -> bool {
        self.passthrough || self.tokens.is_some() || self.oauth.is_some()
    }
}

/// OAuth resource-server settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OAuthConfig {
    pub(crate) issuer: String,
    pub(crate) audience: String,
    pub(crate) jwks_url: Option<String>,
}

/// The validated configuration of `runbox serve`.
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    pub(crate) transport: Transport,
    /// The cloud backend's settings; `None`: the local backend.
    pub(crate) e2b: Option<E2bSettings>,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) allowed_origins: Vec<String>,
    pub(crate) pool: usize,
    pub(crate) max_sandboxes: usize,
    pub(crate) sandbox_timeout: Duration,
    pub(crate) max_sandbox_timeout: Duration,
    /// Longest a sandbox may stay paused before it is closed.
    pub(crate) pause_timeout: Duration,
    pub(crate) run_timeout: Duration,
    pub(crate) max_run_timeout: Duration,
    pub(crate) limits: Limits,
    /// The most bytes one answer may take.
    pub(crate) message_limit: usize,
    /// The operator's data directory, absolute.
    pub(crate) data_dir: Option<PathBuf>,
    /// Hosts the egress proxy lets through; `None`: those of the host's pip and npm.
    pub(crate) egress_hosts: Option<runbox_egress::Allowlist>,
    /// Private address ranges the egress proxy may connect to.
    pub(crate) egress_addresses: Vec<runbox_egress::IpNet>,
    /// The tools served: runbox's own or a compatibility profile's.
    pub(crate) profile: Profile,
    /// Host variables every sandbox gets (`--pass-through-env`).
    pub(crate) pass_through_env: PassThroughEnv,
    /// Authentication of the HTTP transport.
    pub(crate) auth: AuthConfig,
    /// Per-tenant and server-wide limits on sandboxes and runs.
    pub(crate) quotas: runbox_core::Quotas,
    /// Requests a minute per tenant over HTTP.
    pub(crate) rate_limit: Option<u32>,
    /// Limits on task-augmented calls.
    pub(crate) tasks: runbox_mcp::TaskSettings,
    /// Caps and timeouts of HTTP connections.
    pub(crate) connections: runbox_http::ConnectionLimits,
    /// Caps and expiry of MCP sessions.
    pub(crate) sessions: runbox_mcp::SessionLimits,
    /// The audit log, and whether it records code.
    pub(crate) audit_log: Option<PathBuf>,
    pub(crate) audit_code: bool,
    pub(crate) engine: EngineArgs,
}

/// Host environment variables given to every sandbox, read once at start. `Debug` shows
/// their names, never their values (they are often credentials).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct PassThroughEnv(pub(crate) BTreeMap<String, String>);

impl std::fmt::Debug for PassThroughEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Reads the variables `names` from the server's environment (through `get`). A name that is
/// not a valid variable name, or a variable that is not set or not UTF-8, stops the server
/// from starting: a sandbox silently missing a credential fails later in confusing ways.
fn pass_through_env(
    names: &[String],
    get: impl Fn(&str) -> Result<String, std::env::VarError>,
) -> anyhow::Result<PassThroughEnv> {
    let mut env = BTreeMap::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            bail!(
                "pass_through_env: {name:?} is not an environment variable name (letters, digits \
                 and _, not starting with a digit)"
            );
        }
        match get(name) {
            Ok(value) => {
                env.insert(name.to_owned(), value);
            }
            Err(std::env::VarError::NotPresent) => bail!(
                "pass_through_env names {name}, which is not set in the server's environment; set \
                 it for the server, or leave it out of --pass-through-env"
            ),
            Err(std::env::VarError::NotUnicode(_)) => {
                bail!("pass_through_env: the value of {name} is not UTF-8")
            }
        }
    }
    Ok(PassThroughEnv(env))
}

/// Longest timeout of any kind: one day.
const MAX_SECONDS: f64 = 86_400.0;

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v <= MAX_SECONDS) {
        bail!("{name} must be more than 0 and at most {MAX_SECONDS} seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// The schema as a command of its own (what [`layers::merge`] parses with).
fn command() -> clap::Command {
    ServeArgs::augment_args(clap::Command::new("serve"))
}

impl ServeConfig {
    /// The configuration from `runbox serve`'s flags and variables (`given`), over its
    /// config file, over the defaults, checked.
    pub(crate) fn load(given: &ArgMatches) -> anyhow::Result<Self> {
        Self::load_with(given, &|name| std::env::var(name))
    }

    /// [`ServeConfig::load`], reading the server's environment through `env`.
    fn load_with(given: &ArgMatches, env: Env<'_>) -> anyhow::Result<Self> {
        let file = given.get_one::<PathBuf>("config");
        let merged = layers::merge(&command(), given, file.map(PathBuf::as_path), env)?;
        let args = ServeArgs::from_arg_matches(&merged)
            .map_err(|e| anyhow::anyhow!("{}", layers::reason(&e)))?;
        Self::resolve(args, env)
    }

    /// Checks the merged settings.
    fn resolve(args: ServeArgs, env: Env<'_>) -> anyhow::Result<Self> {
        let transport = if args.stdio {
            Transport::Stdio
        } else if let Some(addr) = args.http {
            Transport::Http(addr)
        } else {
            bail!("choose a transport: --stdio, or --http ADDR (such as 127.0.0.1:8000)");
        };
        let backend = args.backend;
        let passthrough = match args.auth {
            Some(AuthMode::Passthrough) => true,
            None => false,
        };
        let auth = AuthConfig {
            passthrough,
            tokens: args.tokens,
            oauth: match (args.oauth_issuer, args.oauth_audience) {
                (Some(issuer), Some(audience)) => Some(OAuthConfig {
                    issuer,
                    audience,
                    jwks_url: args.oauth_jwks_url,
                }),
                (None, None) => None,
                (Some(_), None) => {
                    bail!("--oauth-issuer needs --oauth-audience: the audience JWTs must name")
                }
                (None, Some(_)) => bail!("--oauth-audience needs --oauth-issuer"),
            },
            public_url: args.public_url,
        };
        if transport == Transport::Stdio && auth.any() {
            bail!(
                "--tokens, --oauth-issuer and --auth apply to --http only: over stdio the client \
                 that started the server is its one local tenant"
            );
        }
        if passthrough && (auth.tokens.is_some() || auth.oauth.is_some()) {
            bail!(
                "--auth passthrough takes each caller's bearer value as their provider key, so it \
                 cannot be combined with --tokens or --oauth-issuer"
            );
        }
        if passthrough && backend != BackendKind::E2b {
            bail!(
                "--auth passthrough forwards each caller's key to the cloud provider: it needs \
                 --backend e2b"
            );
        }
        if let Transport::Http(addr) = transport
            && !addr.ip().is_loopback()
            && !auth.any()
            && !args.insecure_public
        {
            bail!(
                "refusing to serve on {addr} without authentication: anyone who can reach this \
                 address could run code. Require tokens (runbox token add NAME, then --tokens \
                 PATH) or OAuth (--oauth-issuer, --oauth-audience), bind a loopback address \
                 (127.0.0.1:PORT), or pass --insecure-public if every client that can reach it \
                 is trusted"
            );
        }

        let limits = args.limits.limits();
        limits.validate()?;
        let message_limit = args.message_limit;
        let message_range = runbox_mcp::MIN_MESSAGE_LIMIT..=runbox_mcp::MAX_MESSAGE_LIMIT;
        if !message_range.contains(&message_limit) {
            bail!(
                "message_limit {message_limit} is out of range: give {} to {} bytes",
                message_range.start(),
                message_range.end()
            );
        }

        let run_timeout = secs("run_timeout", args.run_timeout)?;
        let max_run_timeout = secs("max_run_timeout", args.max_run_timeout)?;
        if run_timeout > max_run_timeout {
            bail!("run_timeout ({run_timeout:?}) exceeds max_run_timeout ({max_run_timeout:?})");
        }
        let sandbox_timeout = secs("sandbox_timeout", args.sandbox_timeout)?;
        let max_sandbox_timeout = secs("max_sandbox_timeout", args.max_sandbox_timeout)?;
        if sandbox_timeout > max_sandbox_timeout {
            bail!(
                "sandbox_timeout ({sandbox_timeout:?}) exceeds max_sandbox_timeout ({max_sandbox_timeout:?})"
            );
        }
        let pause_timeout = secs("pause_timeout", args.pause_timeout)?;
        let max_sandboxes = args.max_sandboxes;
        if !(1..=10_000).contains(&max_sandboxes) {
            bail!("max_sandboxes must be between 1 and 10000, got {max_sandboxes}");
        }
        let positive = |name: &str, v: Option<usize>| -> anyhow::Result<Option<usize>> {
            match v {
                Some(0) => bail!("{name} must be at least 1"),
                v => Ok(v),
            }
        };
        let quotas = runbox_core::Quotas {
            max_sandboxes: Some(max_sandboxes),
            max_concurrent_runs: Some(
                positive("max_concurrent_runs", args.max_concurrent_runs)?.unwrap_or(max_sandboxes),
            ),
            per_tenant: runbox_core::TenantQuota {
                // With authentication there are tenants to keep apart: by default none may
                // hold more than a quarter of the server's places.
                max_sandboxes: positive("max_sandboxes_per_tenant", args.max_sandboxes_per_tenant)?
                    .or(auth.any().then_some((max_sandboxes / 4).max(1))),
                max_concurrent_runs: positive("max_runs_per_tenant", args.max_runs_per_tenant)?,
            },
            lookup: None,
        };
        let (connections, sessions) = http::resolve(args.http_limits)?;
        let rate_limit = args.rate_limit;
        if rate_limit == Some(0) {
            bail!("rate_limit must be at least 1 request a minute");
        }
        let tasks = runbox_mcp::TaskSettings {
            max_per_tenant: positive("max_tasks_per_tenant", Some(args.max_tasks_per_tenant))?
                .unwrap_or(args.max_tasks_per_tenant),
            max_tasks: positive("max_tasks", Some(args.max_tasks))?.unwrap_or(args.max_tasks),
            result_ttl: secs("task_result_ttl", args.task_result_ttl)?,
            inline_wait: secs("task_after", args.task_after)?,
        };
        let audit_log = args.audit_log;
        let audit_code = args.audit_code;
        if audit_code && audit_log.is_none() {
            bail!("audit_code needs audit_log");
        }
        // Cloud sandboxes cost money while they wait, so the e2b backend keeps none ready
        // unless asked.
        let pool = args.pool.unwrap_or(match backend {
            BackendKind::Local => 2,
            BackendKind::E2b => 0,
        });
        if pool > 64 {
            bail!("pool must be at most 64, got {pool}");
        }
        if passthrough && pool > 0 {
            bail!(
                "--auth passthrough makes every sandbox with its caller's key, so there can be no \
                 pool made in advance: leave out --pool or set it to 0"
            );
        }

        let mut allowed_hosts = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        allowed_hosts.extend(args.allowed_host);
        allowed_hosts.dedup();
        let allowed_origins = args.allowed_origin;

        let local = args.local.resolve(backend)?;
        let profile = match args.profile {
            Some(name) => name.parse::<Profile>()?,
            None => Profile::Default,
        };
        let pass_through_env = pass_through_env(&args.pass_through_env, env)?;
        let e2b = args.e2b.resolve(backend, passthrough, env)?;

        Ok(Self {
            transport,
            e2b,
            allowed_hosts,
            allowed_origins,
            pool,
            max_sandboxes,
            sandbox_timeout,
            max_sandbox_timeout,
            pause_timeout,
            run_timeout,
            max_run_timeout,
            limits,
            message_limit,
            data_dir: local.data_dir,
            egress_hosts: local.egress_hosts,
            egress_addresses: local.egress_addresses,
            profile,
            pass_through_env,
            auth,
            quotas,
            rate_limit,
            tasks,
            connections,
            sessions,
            audit_log,
            audit_code,
            engine: args.engine,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use std::path::Path;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn resolve(argv: &[&str]) -> anyhow::Result<ServeConfig> {
        let given = Wrapper::command()
            .try_get_matches_from(std::iter::once("serve").chain(argv.iter().copied()))?;
        ServeConfig::load(&given)
    }

    fn resolve_env(argv: &[&str], env: &[(&str, &str)]) -> anyhow::Result<ServeConfig> {
        let given = Wrapper::command()
            .try_get_matches_from(std::iter::once("serve").chain(argv.iter().copied()))?;
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ServeConfig::load_with(&given, &|name| {
            env.get(name).cloned().ok_or(std::env::VarError::NotPresent)
        })
    }

    #[test]
    fn the_e2b_backend_takes_its_key_from_the_provider_s_variable() {
        let http = ["--http", "127.0.0.1:8000", "--backend", "e2b"];
        let c = resolve_env(&http, &[("E2B_API_KEY", "e2b_env")]).unwrap();
        let e2b = c.e2b.unwrap();
        assert_eq!(e2b.domain, "e2b.app");
        assert_eq!(e2b.template, "code-interpreter-v1");
        assert_eq!(e2b.api_key.as_deref(), Some("e2b_env"));
        assert_eq!(c.pool, 0, "no cloud sandboxes wait unasked");
        assert!(
            !format!("{e2b:?}").contains("e2b_env"),
            "the key is never printed"
        );
        // Novita's own variable for a Novita domain; E2B's alone is not read for E2B.
        let novita = [&http[..], &["--e2b-domain", "sandbox.novita.ai"]].concat();
        let c = resolve_env(&novita, &[("NOVITA_API_KEY", "sk_nv")]).unwrap();
        assert_eq!(c.e2b.unwrap().api_key.as_deref(), Some("sk_nv"));
        let e = resolve_env(&http, &[("NOVITA_API_KEY", "sk_nv")]).unwrap_err();
        assert!(e.to_string().contains("E2B_API_KEY"), "{e}");
        // A flag wins over the variable.
        let flag = [&http[..], &["--e2b-api-key", "e2b_flag"]].concat();
        let c = resolve_env(&flag, &[("E2B_API_KEY", "e2b_env")]).unwrap();
        assert_eq!(c.e2b.unwrap().api_key.as_deref(), Some("e2b_flag"));
    }

    #[test]
    fn passthrough_keeps_no_key_and_no_pool() {
        let pass = [
            "--http",
            "0.0.0.0:8000",
            "--backend",
            "e2b",
            "--auth",
            "passthrough",
        ];
        // The operator's variable is not used, and a public address needs nothing more.
        let c = resolve_env(&pass, &[("E2B_API_KEY", "e2b_env")]).unwrap();
        assert!(c.auth.passthrough);
        assert_eq!(c.e2b.unwrap().api_key, None);
        let e = resolve_env(&[&pass[..], &["--pool", "1"]].concat(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no pool"), "{e}");
        let e = resolve_env(&[&pass[..], &["--tokens", "/x/t.toml"]].concat(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be combined"), "{e}");
        let e = resolve_env(
            &["--stdio", "--backend", "e2b", "--auth", "passthrough"],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--http only"), "{e}");
        let e = resolve_env(
            &[
                "--http",
                "127.0.0.1:8000",
                "--backend",
                "e2b",
                "--e2b-api-key",
                "k",
                "--allow-host",
                "pypi.org",
            ],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("egress proxy"), "{e}");
    }

    #[test]
    fn a_transport_is_required() {
        let e = resolve(&[]).unwrap_err().to_string();
        assert!(e.contains("--stdio"), "{e}");
        assert_eq!(resolve(&["--stdio"]).unwrap().transport, Transport::Stdio);
    }

    #[test]
    fn public_binding_needs_the_insecure_flag() {
        let e = resolve(&["--http", "0.0.0.0:8000"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--insecure-public"), "{e}");
        assert!(e.contains("--tokens"), "{e}");
        assert!(resolve(&["--http", "0.0.0.0:8000", "--insecure-public"]).is_ok());
        assert!(resolve(&["--http", "0.0.0.0:8000", "--tokens", "/x/tokens.toml"]).is_ok());
        let oauth = [
            "--http",
            "0.0.0.0:8000",
            "--oauth-issuer",
            "https://idp.example",
            "--oauth-audience",
            "runbox",
        ];
        assert!(resolve(&oauth).is_ok());
        let e = resolve(&oauth[..4]).unwrap_err().to_string();
        assert!(e.contains("--oauth-audience"), "{e}");
        let e = resolve(&["--stdio", "--tokens", "/x/tokens.toml"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--http only"), "{e}");
        assert!(resolve(&["--http", "127.0.0.1:8000"]).is_ok());
        assert!(resolve(&["--http", "[::1]:8000"]).is_ok());
    }

    #[test]
    fn timeouts_and_limits_are_checked() {
        let e = resolve(&["--stdio", "--run-timeout", "700"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_run_timeout"), "{e}");
        let e = resolve(&["--stdio", "--memory-mb", "4"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory_mb"), "{e}");
        let e = resolve(&["--stdio", "--max-sandboxes", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_sandboxes"), "{e}");
        let c = resolve(&["--stdio", "--run-timeout", "5", "--max-run-timeout", "10"]).unwrap();
        assert_eq!(c.run_timeout, Duration::from_secs(5));
        assert_eq!(c.pause_timeout, Duration::from_secs(3600));
        let c = resolve(&["--stdio", "--pause-timeout", "90"]).unwrap();
        assert_eq!(c.pause_timeout, Duration::from_secs(90));
        let e = resolve(&["--stdio", "--pause-timeout", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("pause_timeout"), "{e}");
    }

    #[test]
    fn the_file_fills_what_flags_leave_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(
            &path,
            "http = \"127.0.0.1:9000\"\npool = 0\nrun_timeout = 30\npause_timeout = 120\n[limits]\nmemory_mb = 256\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let c = resolve(&["--config", p]).unwrap();
        assert_eq!(c.pause_timeout, Duration::from_secs(120));
        assert_eq!(
            c.transport,
            Transport::Http("127.0.0.1:9000".parse().unwrap())
        );
        assert_eq!(c.pool, 0);
        assert_eq!(c.run_timeout, Duration::from_secs(30));
        assert_eq!(c.limits.memory_mb, 256);
        // A flag wins over the file.
        let c = resolve(&["--config", p, "--memory-mb", "512", "--stdio"]).unwrap();
        assert_eq!(c.limits.memory_mb, 512);
        assert_eq!(c.transport, Transport::Stdio);
        // A typo in the file is an error naming it.
        std::fs::write(&path, "memroy_mb = 5\n").unwrap();
        let e = format!("{:#}", resolve(&["--config", p, "--stdio"]).unwrap_err());
        assert!(e.contains("memroy_mb"), "{e}");
    }

    #[test]
    fn the_message_limit_defaults_to_half_a_mebibyte_and_is_bounded() {
        let c = resolve(&["--stdio"]).unwrap();
        assert_eq!(c.message_limit, 512 << 10);
        let c = resolve(&["--stdio", "--message-limit", "2097152"]).unwrap();
        assert_eq!(c.message_limit, 2 << 20);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(&path, "message_limit = 131072\n").unwrap();
        let c = resolve(&["--config", path.to_str().unwrap(), "--stdio"]).unwrap();
        assert_eq!(c.message_limit, 128 << 10);
        for bad in ["1000", "999999999"] {
            let e = format!(
                "{:#}",
                resolve(&["--stdio", "--message-limit", bad]).unwrap_err()
            );
            assert!(e.contains("message_limit"), "{e}");
        }
    }

    #[test]
    fn quotas_default_to_the_sandbox_cap_and_zero_is_refused() {
        let c = resolve(&["--stdio", "--max-sandboxes", "20"]).unwrap();
        assert_eq!(c.quotas.max_sandboxes, Some(20));
        assert_eq!(c.quotas.max_concurrent_runs, Some(20));
        assert_eq!(c.quotas.per_tenant, runbox_core::TenantQuota::default());
        // With authentication, a tenant may hold a quarter of the places unless told.
        let auth = ["--http", "127.0.0.1:8000", "--tokens", "/x/tokens.toml"];
        let c = resolve(&[&auth[..], &["--max-sandboxes", "20"]].concat()).unwrap();
        assert_eq!(c.quotas.per_tenant.max_sandboxes, Some(5));
        let c = resolve(&[&auth[..], &["--max-sandboxes", "2"]].concat()).unwrap();
        assert_eq!(c.quotas.per_tenant.max_sandboxes, Some(1));
        let c = resolve(&[&auth[..], &["--max-sandboxes-per-tenant", "20"]].concat()).unwrap();
        assert_eq!(c.quotas.per_tenant.max_sandboxes, Some(20));
        let c = resolve(&auth).unwrap();
        assert_eq!(c.quotas.per_tenant.max_sandboxes, Some(12));
        let c = resolve(&[
            "--stdio",
            "--max-sandboxes-per-tenant",
            "3",
            "--max-runs-per-tenant",
            "2",
            "--max-concurrent-runs",
            "8",
        ])
        .unwrap();
        assert_eq!(c.quotas.per_tenant.max_sandboxes, Some(3));
        assert_eq!(c.quotas.per_tenant.max_concurrent_runs, Some(2));
        assert_eq!(c.quotas.max_concurrent_runs, Some(8));
        for zero in [
            "--max-sandboxes-per-tenant",
            "--max-runs-per-tenant",
            "--max-concurrent-runs",
            "--rate-limit",
            "--max-tasks-per-tenant",
            "--max-tasks",
        ] {
            let e = resolve(&["--stdio", zero, "0"]).unwrap_err().to_string();
            assert!(e.contains("at least 1"), "{zero}: {e}");
        }
    }

    #[test]
    fn task_limits_come_from_flags_or_the_file() {
        let c = resolve(&["--stdio"]).unwrap();
        assert_eq!(c.tasks.max_per_tenant, 32);
        assert_eq!(c.tasks.max_tasks, 1024);
        assert_eq!(c.tasks.result_ttl, Duration::from_secs(300));
        assert_eq!(c.tasks.inline_wait, Duration::from_secs(30));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(
            &path,
            "stdio = true\nmax_tasks_per_tenant = 2\nmax_tasks = 9\ntask_result_ttl = 1.5\n\
             task_after = 2\n",
        )
        .unwrap();
        let c = resolve(&["--config", path.to_str().unwrap(), "--max-tasks", "7"]).unwrap();
        assert_eq!(c.tasks.max_per_tenant, 2);
        assert_eq!(c.tasks.max_tasks, 7);
        assert_eq!(c.tasks.result_ttl, Duration::from_millis(1500));
        assert_eq!(c.tasks.inline_wait, Duration::from_secs(2));
        let e = resolve(&["--stdio", "--task-result-ttl", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("task_result_ttl"), "{e}");
    }

    #[test]
    fn no_cgroups_comes_from_the_flag_or_the_file() {
        if std::env::var_os("RUNBOX_NO_CGROUPS").is_none() {
            assert!(!resolve(&["--stdio"]).unwrap().engine.no_cgroups);
        }
        assert!(
            resolve(&["--stdio", "--no-cgroups"])
                .unwrap()
                .engine
                .no_cgroups
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(&path, "stdio = true\nno_cgroups = true\n").unwrap();
        let c = resolve(&["--config", path.to_str().unwrap()]).unwrap();
        assert!(c.engine.no_cgroups);
        assert_eq!(
            c.engine.local_config(Limits::default()).jail.cgroups,
            runbox_jail::CgroupMode::Disabled
        );
    }

    #[test]
    fn connection_and_session_limits_come_from_the_file_and_variables_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(
            &path,
            "stdio = true\nmax_connections = 64\nmax_connections_per_address = 8\n\
             http_header_timeout = 3\nhttp_idle_timeout = 20\nmax_sessions = 10\n\
             max_sessions_per_tenant = 4\nsession_idle_timeout = 120\n",
        )
        .unwrap();
        let c = resolve(&["--config", path.to_str().unwrap(), "--max-sessions", "12"]).unwrap();
        assert_eq!(c.connections.max_connections, 64);
        assert_eq!(c.connections.max_connections_per_address, 8);
        assert_eq!(c.connections.header_timeout, Duration::from_secs(3));
        assert_eq!(c.connections.idle_timeout, Duration::from_secs(20));
        assert_eq!(c.sessions.max_sessions, 12);
        assert_eq!(c.sessions.max_sessions_per_tenant, Some(4));
        assert_eq!(c.sessions.idle_timeout, Duration::from_secs(120));
    }

    #[test]
    fn the_audit_log_and_auth_come_from_the_file_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(
            &path,
            "http = \"0.0.0.0:9000\"\ntokens = \"/etc/runbox/tokens.toml\"\naudit_log = \
             \"/var/log/runbox.jsonl\"\naudit_code = true\nrate_limit = 60\n",
        )
        .unwrap();
        let c = resolve(&["--config", path.to_str().unwrap()]).unwrap();
        assert_eq!(
            c.auth.tokens.as_deref(),
            Some(Path::new("/etc/runbox/tokens.toml"))
        );
        assert_eq!(
            c.audit_log.as_deref(),
            Some(Path::new("/var/log/runbox.jsonl"))
        );
        assert!(c.audit_code);
        assert_eq!(c.rate_limit, Some(60));
        std::fs::write(&path, "stdio = true\naudit_code = true\n").unwrap();
        let e = resolve(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("audit_code needs audit_log"), "{e}");
    }

    #[test]
    fn egress_hosts_are_checked_and_none_means_no_host() {
        let c = resolve(&["--stdio", "--allow-host", "example.org,*.example.net:8443"]).unwrap();
        assert_eq!(
            c.egress_hosts.unwrap().to_string(),
            "example.org, *.example.net:8443"
        );
        assert!(resolve(&["--stdio"]).unwrap().egress_hosts.is_none());
        let c = resolve(&["--stdio", "--allow-host", "none"]).unwrap();
        assert!(c.egress_hosts.unwrap().is_empty());
        let e = resolve(&["--stdio", "--allow-host", "http://x/"]).unwrap_err();
        assert!(format!("{e:#}").contains("allow-host"), "{e:#}");
        let e = resolve(&["--stdio", "--allow-address", "10.0.0.0/33"]).unwrap_err();
        assert!(format!("{e:#}").contains("allow-address"), "{e:#}");
        let c = resolve(&["--stdio", "--allow-address", "10.1.0.0/16"]).unwrap();
        assert_eq!(c.egress_addresses.len(), 1);
    }

    #[test]
    fn profiles_are_named_and_checked() {
        assert_eq!(resolve(&["--stdio"]).unwrap().profile, Profile::Default);
        for (name, profile) in [
            ("novita-tutorial", Profile::NovitaTutorial),
            ("code-sandbox-mcp", Profile::CodeSandboxMcp),
            ("mcp-code-sandbox", Profile::McpCodeSandbox),
        ] {
            let c = resolve(&["--stdio", "--profile", name]).unwrap();
            assert_eq!(c.profile, profile);
        }
        let e = resolve(&["--stdio", "--profile", "e2b"])
            .unwrap_err()
            .to_string();
        for needle in [
            "\"e2b\"",
            "novita-tutorial",
            "code-sandbox-mcp",
            "mcp-code-sandbox",
        ] {
            assert!(e.contains(needle), "{e}");
        }
        // From the file, and a flag wins over it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(&path, "stdio = true\nprofile = \"code-sandbox-mcp\"\n").unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(
            resolve(&["--config", p]).unwrap().profile,
            Profile::CodeSandboxMcp
        );
        let c = resolve(&["--config", p, "--profile", "novita-tutorial"]).unwrap();
        assert_eq!(c.profile, Profile::NovitaTutorial);
    }

    #[test]
    fn pass_through_variables_are_read_once_and_must_be_set() {
        let host = |name: &str| match name {
            "API_KEY" => Ok("s3cret".to_owned()),
            "REGION" => Ok("eu".to_owned()),
            _ => Err(std::env::VarError::NotPresent),
        };
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let env = pass_through_env(&names(&["API_KEY", " REGION", ""]), host).unwrap();
        assert_eq!(
            env.0,
            BTreeMap::from([
                ("API_KEY".to_owned(), "s3cret".to_owned()),
                ("REGION".to_owned(), "eu".to_owned()),
            ])
        );
        assert_eq!(
            format!("{env:?}"),
            "[\"API_KEY\", \"REGION\"]",
            "values stay hidden"
        );
        let e = pass_through_env(&names(&["API_KEY", "MISSING"]), host)
            .unwrap_err()
            .to_string();
        assert!(e.contains("MISSING") && e.contains("not set"), "{e}");
        let e = pass_through_env(&names(&["A=B"]), host)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"A=B\""), "{e}");
        assert!(pass_through_env(&names(&["1X"]), host).is_err());
        // Through the flag (comma-separated or repeated), the variable and the file; PATH is
        // set wherever tests run, the other surely not.
        let c = resolve(&["--stdio", "--pass-through-env", "PATH"]).unwrap();
        assert_eq!(c.pass_through_env.0.keys().collect::<Vec<_>>(), ["PATH"]);
        let e = resolve(&[
            "--stdio",
            "--pass-through-env",
            "PATH,RUNBOX_TEST_SURELY_UNSET_VARIABLE",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("RUNBOX_TEST_SURELY_UNSET_VARIABLE"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runbox.toml");
        std::fs::write(&path, "stdio = true\npass_through_env = [\"PATH\"]\n").unwrap();
        let c = resolve(&["--config", path.to_str().unwrap()]).unwrap();
        assert!(c.pass_through_env.0.contains_key("PATH"));
        assert!(resolve(&["--stdio"]).unwrap().pass_through_env.0.is_empty());
    }

    #[test]
    fn the_data_dir_must_be_a_directory_and_is_made_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let c = resolve(&["--stdio", "--data-dir", dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(c.data_dir, Some(dir.path().canonicalize().unwrap()));
        let missing = dir.path().join("missing");
        let e = format!(
            "{:#}",
            resolve(&["--stdio", "--data-dir", missing.to_str().unwrap()]).unwrap_err()
        );
        assert!(e.contains("missing"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let e = resolve(&["--stdio", "--data-dir", file.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn every_setting_has_one_name_in_each_layer() {
        let cmd = command();
        let mut ids = Vec::new();
        for arg in cmd.get_arguments().filter(|a| a.get_id() != "help") {
            let id = arg.get_id().as_str();
            assert_eq!(arg.get_long(), Some(id.replace('_', "-").as_str()), "{id}");
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env, Some(format!("RUNBOX_{}", id.to_uppercase())), "{id}");
            ids.push(id);
        }
        // No setting lost on the way: the old file's keys, and the new limits.
        for id in [
            "stdio",
            "allow_host",
            "allowed_origin",
            "e2b_domain",
            "no_cgroups",
            "tmp_mb",
        ] {
            assert!(ids.contains(&id), "{id} missing from {ids:?}");
        }
    }

    /// The rows of the README's configuration table.
    fn readme_rows() -> Vec<&'static str> {
        let readme = include_str!("../../../README.md");
        let section = readme
            .split("\n## Configuration\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .unwrap();
        section.lines().filter(|l| l.starts_with("| `")).collect()
    }

    /// The `--flags` a README row's first cell names.
    fn flags_of(row: &str) -> Vec<String> {
        let first = row.split('|').nth(1).unwrap();
        first
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|code| code.strip_prefix("--"))
            .map(|f| f.split(' ').next().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_readme_table_shows_every_setting_with_its_default() {
        let rows = readme_rows();
        let cmd = command();
        let settings: Vec<_> = cmd
            .get_arguments()
            .filter(|a| a.get_id() != "help" && !a.is_hide_set())
            .collect();
        for arg in &settings {
            let long = arg.get_long().unwrap();
            let row = rows
                .iter()
                .find(|r| flags_of(r).iter().any(|f| f == long))
                .unwrap_or_else(|| panic!("--{long} has no row in the README's table"));
            let shown = row.split('|').nth(2).unwrap();
            for default in arg.get_default_values() {
                let default = default.to_string_lossy();
                assert!(
                    default == "false" || shown.contains(default.as_ref()),
                    "--{long}: the README's default column ({shown}) lacks {default}"
                );
            }
        }
        // And the table names no flag that is gone.
        for row in rows {
            for flag in flags_of(row) {
                assert!(
                    settings.iter().any(|a| a.get_long() == Some(flag.as_str())),
                    "the README's table names --{flag}, which is no setting"
                );
            }
        }
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> String {
        let path = dir.path().join("runbox.toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    #[test]
    fn the_file_uses_the_flags_names_and_still_reads_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "stdio = true\nallowed_host = [\"a.example\"]\nallowed_origin = [\"https://a.example\"]\n\
             allow_host = [\"pkgs.example.org\"]\nallow_address = [\"10.1.0.0/16\"]\noutput_limit = 5000\n\
             tmp_mb = 64\ninodes = 1000\nopen_files = 256\n",
        );
        let c = resolve(&["--config", &p]).unwrap();
        assert!(c.allowed_hosts.contains(&"a.example".to_owned()));
        assert_eq!(c.allowed_origins, ["https://a.example"]);
        assert_eq!(c.egress_hosts.unwrap().to_string(), "pkgs.example.org");
        assert_eq!(c.egress_addresses.len(), 1);
        assert_eq!(
            (
                c.limits.output_bytes,
                c.limits.tmp_mb,
                c.limits.inodes,
                c.limits.open_files
            ),
            (5000, 64, 1000, 256)
        );
        // The names of before: the plural keys and the [limits] table.
        let p = write(
            &dir,
            "stdio = true\nallowed_hosts = [\"b.example\"]\nallow_hosts = [\"npm.example.org\"]\n\
             allow_addresses = [\"10.2.0.0/16\"]\n[limits]\noutput_bytes = 7000\nmemory_mb = 300\n",
        );
        let c = resolve(&["--config", &p]).unwrap();
        assert!(c.allowed_hosts.contains(&"b.example".to_owned()));
        assert_eq!(c.egress_hosts.unwrap().to_string(), "npm.example.org");
        assert_eq!(c.egress_addresses.len(), 1);
        assert_eq!((c.limits.output_bytes, c.limits.memory_mb), (7000, 300));
        // One setting under two names is an error, not a guess.
        let p = write(
            &dir,
            "stdio = true\nallow_host = [\"a.org\"]\nallow_hosts = [\"b.org\"]\n",
        );
        let e = format!("{:#}", resolve(&["--config", &p]).unwrap_err());
        assert!(e.contains("allow_host") && e.contains("twice"), "{e}");
        // The variable of before, when the new one is not set.
        let c = resolve_env(
            &["--stdio"],
            &[("RUNBOX_ALLOWED_HOSTS", "c.example,d.example")],
        )
        .unwrap();
        assert!(
            c.allowed_hosts.contains(&"d.example".to_owned()),
            "{:?}",
            c.allowed_hosts
        );
    }

    #[test]
    fn a_bad_value_in_the_file_names_the_setting_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, needle) in [
            ("pool = \"many\"", "pool = \"many\""),
            ("pool = [1, 2]", "pool takes one value"),
            ("stdio = \"yes\"", "stdio = true or"),
            ("backend = \"cloud\"", "backend = \"cloud\""),
            ("run_timeout = \"soon\"", "run_timeout"),
            ("[limits]\nmemroy_mb = 5", "limits.memroy_mb"),
            ("max_sandboxs = 5", "did you mean max_sandboxes"),
            ("config = \"other.toml\"", "config is not a setting"),
            ("stdio = true\nhttp = \"127.0.0.1:1\"", "cannot both be set"),
        ] {
            let p = write(&dir, text);
            let e = format!("{:#}", resolve(&["--config", &p]).unwrap_err());
            assert!(e.contains(needle) && e.contains(&p), "{text}: {e}");
        }
        // A value the parser takes but the checks refuse names the setting too.
        let p = write(&dir, "stdio = true\npool = 65\n");
        let e = format!("{:#}", resolve(&["--config", &p]).unwrap_err());
        assert!(e.contains("pool must be at most 64"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file_and_lists_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "stdio = true\npool = 3\nallow_host = [\"a.org\"]\npass_through_env = [\"PATH\"]\n",
        );
        let c = resolve(&["--config", &p, "--pool", "4", "--allow-host", "b.org"]).unwrap();
        assert_eq!(c.pool, 4);
        assert_eq!(c.egress_hosts.unwrap().to_string(), "a.org, b.org");
        assert!(c.pass_through_env.0.contains_key("PATH"));
        // A flag the file's setting cannot go with wins over it.
        let c = resolve(&["--config", &p, "--http", "127.0.0.1:8000"]).unwrap();
        assert_eq!(
            c.transport,
            Transport::Http("127.0.0.1:8000".parse().unwrap())
        );
        // A negative number is a value, not a flag.
        let p = write(&dir, "stdio = true\nrun_timeout = -1\n");
        let e = format!("{:#}", resolve(&["--config", &p]).unwrap_err());
        assert!(e.contains("run_timeout must be more than 0"), "{e}");
    }
}
