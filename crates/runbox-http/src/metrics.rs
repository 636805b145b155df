//! Prometheus metrics, served at `/metrics` in the text exposition format. Every name starts
//! with `runbox_`. Tenants are never a label: their number is unbounded and their names are
//! the operator's business, not the scraper's.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `runbox_sandboxes` | gauge | `state`: idle, busy, paused, pooled, creating |
//! | `runbox_runs_in_progress` | gauge | |
//! | `runbox_runs_total` | counter | `language` (python, javascript, typescript, bash, command), `outcome` (ok, error, timeout, cancelled, failed, refused) |
//! | `runbox_run_duration_seconds` | histogram | `language` |
//! | `runbox_tool_calls_total` | counter | `tool`, `outcome` (ok, error, invalid) |
//! | `runbox_rejected_requests_total` | counter | `reason`: unauthenticated, rate_limited, tenant_sandboxes, tenant_runs, server_sandboxes, server_runs, connections, sessions, too_large |
//! | `runbox_http_connections` | gauge | |
//! | `runbox_sessions` | gauge | |
//! | `runbox_sessions_expired_total` | counter | |
//! | `runbox_egress_decisions_total` | counter | `decision`: allowed, or why the proxy refused |

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry as Exposition;
use runbox_core::{Census, Limit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Run {
    language: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Language {
    language: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Tool {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Egress {
    decision: &'static str,
}

/// Why a request was turned away before any tool ran, or by a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No credentials, or wrong ones (HTTP 401).
    Unauthenticated,
    /// The tenant sent more requests than its rate allows (HTTP 429).
    RateLimited,
    /// A quota refused the request.
    Quota(Limit),
    /// A connection past the caps on HTTP connections (HTTP 503).
    Connections,
    /// An `initialize` past the caps on MCP sessions (HTTP 503).
    Sessions,
    /// A message larger than the server reads (HTTP 413).
    TooLarge,
}

impl Rejection {
    fn as_str(self) -> &'static str {
        match self {
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::RateLimited => "rate_limited",
            Rejection::Quota(limit) => limit.as_str(),
            Rejection::Connections => "connections",
            Rejection::Sessions => "sessions",
            Rejection::TooLarge => "too_large",
        }
    }
}

/// How a run ended, for `runbox_runs_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// It ran to the end without an error.
    Ok,
    /// The code raised, or the command exited non-zero.
    Error,
    /// It ran out of time.
    Timeout,
    /// The caller cancelled it.
    Cancelled,
    /// The sandbox failed, or the run could not start.
    Failed,
    /// A quota refused it.
    Refused,
}

impl RunOutcome {
    fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Error => "error",
            RunOutcome::Timeout => "timeout",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Failed => "failed",
            RunOutcome::Refused => "refused",
        }
    }
}

/// Run durations' bucket bounds, in seconds: from a warm kernel's sub-millisecond round trip
/// to the longest timeout.
const RUN_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0,
];

/// The server's metrics. One per server, shared by every transport and session.
pub struct Metrics {
    exposition: Mutex<Exposition>,
    sandboxes: Family<State, Gauge>,
    runs_in_progress: Gauge,
    runs: Family<Run, Counter>,
    run_seconds: Family<Language, Histogram>,
    tool_calls: Family<Tool, Counter>,
    rejected: Family<Reason, Counter>,
    egress: Family<Egress, Counter>,
    connections: Gauge,
    sessions: Gauge,
    sessions_expired: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero.
    pub fn new() -> Self {
        let mut reg = Exposition::with_prefix("runbox");
        let sandboxes = Family::<State, Gauge>::default();
        let runs_in_progress = Gauge::default();
        let runs = Family::<Run, Counter>::default();
        let run_seconds = Family::<Language, Histogram>::new_with_constructor(
            (|| Histogram::new(RUN_BUCKETS)) as fn() -> Histogram,
        );
        let tool_calls = Family::<Tool, Counter>::default();
        let rejected = Family::<Reason, Counter>::default();
        let egress = Family::<Egress, Counter>::default();
        let connections = Gauge::default();
        let sessions = Gauge::default();
        let sessions_expired = Counter::default();
        reg.register(
            "http_connections",
            "HTTP connections open now",
            connections.clone(),
        );
        reg.register("sessions", "MCP sessions live now", sessions.clone());
        reg.register(
            "sessions_expired",
            "MCP sessions closed for being idle",
            sessions_expired.clone(),
        );
        reg.register(
            "sandboxes",
            "Sandboxes alive now, by state",
            sandboxes.clone(),
        );
        reg.register(
            "runs_in_progress",
            "Runs in progress now, all tenants together",
            runs_in_progress.clone(),
        );
        reg.register(
            "runs",
            "Runs of code and commands, by language and outcome",
            runs.clone(),
        );
        reg.register(
            "run_duration_seconds",
            "How long runs took, by language",
            run_seconds.clone(),
        );
        reg.register(
            "tool_calls",
            "Tool calls, by tool and outcome",
            tool_calls.clone(),
        );
        reg.register(
            "rejected_requests",
            "Requests turned away, by reason",
            rejected.clone(),
        );
        reg.register(
            "egress_decisions",
            "Connections sandboxes asked the egress proxy for, by decision",
            egress.clone(),
        );
        // Every reason is listed from the start, at zero, so that a rate is defined before
        // the first refusal.
        for reason in [
            Rejection::Unauthenticated,
            Rejection::RateLimited,
            Rejection::Quota(Limit::TenantSandboxes),
            Rejection::Quota(Limit::TenantRuns),
            Rejection::Quota(Limit::Sandboxes),
            Rejection::Quota(Limit::Runs),
            Rejection::Connections,
            Rejection::Sessions,
            Rejection::TooLarge,
        ] {
            drop(rejected.get_or_create(&Reason {
                reason: reason.as_str(),
            }));
        }
        Self {
            exposition: Mutex::new(reg),
            sandboxes,
            runs_in_progress,
            runs,
            run_seconds,
            tool_calls,
            rejected,
            egress,
            connections,
            sessions,
            sessions_expired,
        }
    }

    /// Sets the number of open HTTP connections.
    pub fn set_connections(&self, n: usize) {
        self.connections.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the number of live MCP sessions.
    pub fn set_sessions(&self, n: usize) {
        self.sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a session closed for being idle.
    pub fn session_expired(&self) {
        self.sessions_expired.inc();
    }

    /// Counts a run that ended (or was refused) after `elapsed`.
    pub fn run(&self, language: &'static str, outcome: RunOutcome, elapsed: Duration) {
        self.runs
            .get_or_create(&Run {
                language,
                outcome: outcome.as_str(),
            })
            .inc();
        if outcome != RunOutcome::Refused {
            self.run_seconds
                .get_or_create(&Language { language })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// Counts a tool call: `outcome` is ok, error (a tool result with `isError`) or invalid
    /// (a protocol error: unknown tool, arguments that do not decode).
    pub fn tool_call(&self, tool: &str, outcome: &'static str) {
        self.tool_calls
            .get_or_create(&Tool {
                tool: tool.to_owned(),
                outcome,
            })
            .inc();
    }

    /// Counts a request turned away.
    pub fn rejected(&self, why: Rejection) {
        self.rejected
            .get_or_create(&Reason {
                reason: why.as_str(),
            })
            .inc();
    }

    /// Counts an egress proxy decision (`allowed`, or the reason of a refusal).
    pub fn egress(&self, decision: &'static str) {
        self.egress.get_or_create(&Egress { decision }).inc();
    }

    /// The text exposition, with the sandbox gauges taken from `census` now.
    pub fn render(&self, census: Census) -> String {
        for (state, n) in [
            ("idle", census.idle),
            ("busy", census.busy),
            ("paused", census.paused),
            ("pooled", census.pooled),
            ("creating", census.creating),
        ] {
            self.sandboxes
                .get_or_create(&State { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.runs_in_progress
            .set(i64::try_from(census.runs).unwrap_or(i64::MAX));
        let mut out = String::new();
        let exposition = self
            .exposition
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &exposition) {
            tracing::error!("encoding metrics: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_series_with_the_prefix() {
        let m = Metrics::new();
        m.run("python", RunOutcome::Ok, Duration::from_millis(3));
        m.run("python", RunOutcome::Refused, Duration::ZERO);
        m.tool_call("run_code", "ok");
        m.rejected(Rejection::RateLimited);
        m.egress("host_not_allowed");
        let text = m.render(Census {
            idle: 2,
            paused: 1,
            ..Census::default()
        });
        for line in [
            "runbox_sandboxes{state=\"idle\"} 2",
            "runbox_sandboxes{state=\"paused\"} 1",
            "runbox_runs_total{language=\"python\",outcome=\"ok\"} 1",
            "runbox_runs_total{language=\"python\",outcome=\"refused\"} 1",
            "runbox_run_duration_seconds_count{language=\"python\"} 1",
            "runbox_run_duration_seconds_bucket{le=\"0.005\",language=\"python\"} 1",
            "runbox_tool_calls_total{tool=\"run_code\",outcome=\"ok\"} 1",
            "runbox_rejected_requests_total{reason=\"rate_limited\"} 1",
            "runbox_rejected_requests_total{reason=\"tenant_sandboxes\"} 0",
            "runbox_egress_decisions_total{decision=\"host_not_allowed\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.starts_with("runbox_")),
            "{text}"
        );
    }
}
