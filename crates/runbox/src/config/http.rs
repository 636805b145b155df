//! Settings of the HTTP server's connections and MCP sessions: flags, their TOML keys, and
//! the defaults.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use runbox_mcp::{ConnectionLimits, SessionLimits};

use super::secs;

/// Flags for the HTTP server's connections and sessions.
#[derive(Debug, Default, Args)]
pub(crate) struct HttpLimitArgs {
    /// Most HTTP connections open at once; lowered at start if the open-files limit leaves
    /// no room for them beside every sandbox's descriptors [default: 1024].
    #[arg(long, env = "RUNBOX_MAX_CONNECTIONS", value_name = "N")]
    pub(crate) max_connections: Option<usize>,

    /// Most HTTP connections open at once from one peer address [default: 128].
    #[arg(long, env = "RUNBOX_MAX_CONNECTIONS_PER_ADDRESS", value_name = "N")]
    pub(crate) max_connections_per_address: Option<usize>,

    /// Seconds a request head may take to arrive, from its first byte (a new connection:
    /// from the accept) [default: 10].
    #[arg(long, env = "RUNBOX_HTTP_HEADER_TIMEOUT", value_name = "S")]
    pub(crate) http_header_timeout: Option<f64>,

    /// Seconds a kept-alive HTTP connection with no request in progress stays open
    /// [default: 60].
    #[arg(long, env = "RUNBOX_HTTP_IDLE_TIMEOUT", value_name = "S")]
    pub(crate) http_idle_timeout: Option<f64>,

    /// Most MCP sessions (2025-11-25 clients) live at once [default: 1000].
    #[arg(long, env = "RUNBOX_MAX_SESSIONS", value_name = "N")]
    pub(crate) max_sessions: Option<usize>,

    /// Most MCP sessions one tenant may hold [default: no limit but --max-sessions].
    #[arg(long, env = "RUNBOX_MAX_SESSIONS_PER_TENANT", value_name = "N")]
    pub(crate) max_sessions_per_tenant: Option<usize>,

    /// Seconds an MCP session with no request in progress and no stream open lives
    /// [default: 600].
    #[arg(long, env = "RUNBOX_SESSION_IDLE_TIMEOUT", value_name = "S")]
    pub(crate) session_idle_timeout: Option<f64>,
}

/// The same settings from the config file (top-level keys).
#[derive(Debug, Default)]
pub(crate) struct HttpLimitFile {
    pub(crate) max_connections: Option<usize>,
    pub(crate) max_connections_per_address: Option<usize>,
    pub(crate) http_header_timeout: Option<f64>,
    pub(crate) http_idle_timeout: Option<f64>,
    pub(crate) max_sessions: Option<usize>,
    pub(crate) max_sessions_per_tenant: Option<usize>,
    pub(crate) session_idle_timeout: Option<f64>,
}

/// Flags over the file over the defaults, checked.
pub(crate) fn resolve(
    args: HttpLimitArgs,
    file: HttpLimitFile,
) -> anyhow::Result<(ConnectionLimits, SessionLimits)> {
    let count = |name: &str, v: Option<usize>, default: usize| -> anyhow::Result<usize> {
        match v.unwrap_or(default) {
            0 => bail!("{name} must be at least 1"),
            n => Ok(n),
        }
    };
    let duration = |name: &str, v: Option<f64>, default: Duration| match v {
        Some(v) => secs(name, v),
        None => Ok(default),
    };
    let c = ConnectionLimits::default();
    let connections = ConnectionLimits {
        max_connections: count(
            "max_connections",
            args.max_connections.or(file.max_connections),
            c.max_connections,
        )?,
        max_connections_per_address: count(
            "max_connections_per_address",
            args.max_connections_per_address
                .or(file.max_connections_per_address),
            c.max_connections_per_address,
        )?,
        header_timeout: duration(
            "http_header_timeout",
            args.http_header_timeout.or(file.http_header_timeout),
            c.header_timeout,
        )?,
        idle_timeout: duration(
            "http_idle_timeout",
            args.http_idle_timeout.or(file.http_idle_timeout),
            c.idle_timeout,
        )?,
    };
    let s = SessionLimits::default();
    let per_tenant = args
        .max_sessions_per_tenant
        .or(file.max_sessions_per_tenant);
    let sessions = SessionLimits {
        max_sessions: count(
            "max_sessions",
            args.max_sessions.or(file.max_sessions),
            s.max_sessions,
        )?,
        max_sessions_per_tenant: match per_tenant {
            Some(n) => Some(count("max_sessions_per_tenant", Some(n), n)?),
            None => None,
        },
        idle_timeout: duration(
            "session_idle_timeout",
            args.session_idle_timeout.or(file.session_idle_timeout),
            s.idle_timeout,
        )?,
    };
    Ok((connections, sessions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: HttpLimitArgs,
    }

    fn args(argv: &[&str]) -> HttpLimitArgs {
        Wrapper::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn flags_win_over_the_file_over_the_defaults() {
        let (c, s) = resolve(args(&[]), HttpLimitFile::default()).unwrap();
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.max_connections_per_address, 128);
        assert_eq!(c.header_timeout, Duration::from_secs(10));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(s.max_sessions, 1000);
        assert_eq!(s.max_sessions_per_tenant, None);
        assert_eq!(s.idle_timeout, Duration::from_secs(600));

        let file = HttpLimitFile {
            max_connections: Some(50),
            max_sessions: Some(7),
            max_sessions_per_tenant: Some(2),
            session_idle_timeout: Some(30.0),
            http_idle_timeout: Some(5.0),
            ..HttpLimitFile::default()
        };
        let (c, s) = resolve(
            args(&["--max-connections", "9", "--http-header-timeout", "2.5"]),
            file,
        )
        .unwrap();
        assert_eq!(c.max_connections, 9);
        assert_eq!(c.header_timeout, Duration::from_millis(2500));
        assert_eq!(c.idle_timeout, Duration::from_secs(5));
        assert_eq!(s.max_sessions, 7);
        assert_eq!(s.max_sessions_per_tenant, Some(2));
        assert_eq!(s.idle_timeout, Duration::from_secs(30));
    }

    #[test]
    fn zero_caps_and_timeouts_are_refused() {
        for bad in [
            ["--max-connections", "0"],
            ["--max-connections-per-address", "0"],
            ["--max-sessions", "0"],
            ["--max-sessions-per-tenant", "0"],
            ["--http-idle-timeout", "0"],
            ["--session-idle-timeout=-1", ""],
        ] {
            let argv: Vec<&str> = bad.into_iter().filter(|a| !a.is_empty()).collect();
            let e = resolve(args(&argv), HttpLimitFile::default()).unwrap_err();
            let name = bad[0][2..].split('=').next().unwrap().replace('-', "_");
            assert!(e.to_string().contains(&name), "{bad:?}: {e}");
        }
    }
}
