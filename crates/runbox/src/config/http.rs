//! Settings of the HTTP server's connections and MCP sessions, and their checks.

use anyhow::bail;
use clap::Args;
use runbox_http::ConnectionLimits;
use runbox_mcp::SessionLimits;

use super::secs;

/// Flags for the HTTP server's connections and sessions.
#[derive(Debug, Args)]
pub(crate) struct HttpLimitArgs {
    /// Most HTTP connections open at once; lowered at start if the open-files limit leaves
    /// no room for them beside every sandbox's descriptors.
    #[arg(long, env = "RUNBOX_MAX_CONNECTIONS", value_name = "N",
          default_value_t = ConnectionLimits::default().max_connections)]
    pub(crate) max_connections: usize,

    /// Most HTTP connections open at once from one peer address.
    #[arg(long, env = "RUNBOX_MAX_CONNECTIONS_PER_ADDRESS", value_name = "N",
          default_value_t = ConnectionLimits::default().max_connections_per_address)]
    pub(crate) max_connections_per_address: usize,

    /// Seconds a request head may take to arrive, from its first byte (a new connection:
    /// from the accept).
    #[arg(long, env = "RUNBOX_HTTP_HEADER_TIMEOUT", value_name = "S",
          default_value_t = ConnectionLimits::default().header_timeout.as_secs_f64())]
    pub(crate) http_header_timeout: f64,

    /// Seconds a kept-alive HTTP connection with no request in progress stays open.
    #[arg(long, env = "RUNBOX_HTTP_IDLE_TIMEOUT", value_name = "S",
          default_value_t = ConnectionLimits::default().idle_timeout.as_secs_f64())]
    pub(crate) http_idle_timeout: f64,

    /// Most MCP sessions (2025-11-25 clients) live at once.
    #[arg(long, env = "RUNBOX_MAX_SESSIONS", value_name = "N",
          default_value_t = SessionLimits::default().max_sessions)]
    pub(crate) max_sessions: usize,

    /// Most MCP sessions one tenant may hold [default: no limit but --max-sessions].
    #[arg(long, env = "RUNBOX_MAX_SESSIONS_PER_TENANT", value_name = "N")]
    pub(crate) max_sessions_per_tenant: Option<usize>,

    /// Seconds an MCP session with no request in progress and no stream open lives.
    #[arg(long, env = "RUNBOX_SESSION_IDLE_TIMEOUT", value_name = "S",
          default_value_t = SessionLimits::default().idle_timeout.as_secs_f64())]
    pub(crate) session_idle_timeout: f64,
}

/// The limits, checked.
pub(crate) fn resolve(args: HttpLimitArgs) -> anyhow::Result<(ConnectionLimits, SessionLimits)> {
    let count = |name: &str, v: usize| -> anyhow::Result<usize> {
        match v {
            0 => bail!("{name} must be at least 1"),
            n => Ok(n),
        }
    };
    let connections = ConnectionLimits {
        max_connections: count("max_connections", args.max_connections)?,
        max_connections_per_address: count(
            "max_connections_per_address",
            args.max_connections_per_address,
        )?,
        header_timeout: secs("http_header_timeout", args.http_header_timeout)?,
        idle_timeout: secs("http_idle_timeout", args.http_idle_timeout)?,
    };
    let sessions = SessionLimits {
        max_sessions: count("max_sessions", args.max_sessions)?,
        max_sessions_per_tenant: match args.max_sessions_per_tenant {
            Some(n) => Some(count("max_sessions_per_tenant", n)?),
            None => None,
        },
        idle_timeout: secs("session_idle_timeout", args.session_idle_timeout)?,
    };
    Ok((connections, sessions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

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
    fn the_defaults_are_the_transport_s_and_flags_change_them() {
        let (c, s) = resolve(args(&[])).unwrap();
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.max_connections_per_address, 128);
        assert_eq!(c.header_timeout, Duration::from_secs(10));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(s.max_sessions, 1000);
        assert_eq!(s.max_sessions_per_tenant, None);
        assert_eq!(s.idle_timeout, Duration::from_secs(600));

        let (c, s) = resolve(args(&[
            "--max-connections",
            "9",
            "--http-header-timeout",
            "2.5",
            "--http-idle-timeout",
            "5",
            "--max-sessions",
            "7",
            "--max-sessions-per-tenant",
            "2",
            "--session-idle-timeout",
            "30",
        ]))
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
            let e = resolve(args(&argv)).unwrap_err();
            let name = bad[0][2..].split('=').next().unwrap().replace('-', "_");
            assert!(e.to_string().contains(&name), "{bad:?}: {e}");
        }
    }
}
