//! What the proxy decided about one connection: a [`Decision`], logged with `tracing` (target
//! `runbox_egress`) and handed to the caller's [`EventSink`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::address::AddressClass;

/// Receives every [`Decision`] (for metrics or an audit log). Called on the proxy's tasks: it
/// must return quickly and never block.
pub type EventSink = Arc<dyn Fn(&Decision) + Send + Sync>;

/// One connection's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The destination host as requested (normalized), when the request named one.
    pub host: Option<String>,
    /// The destination port, when the request named one.
    pub port: Option<u16>,
    /// For [`Reason::Allowed`], the address connected to; for [`Reason::AddressRefused`], the
    /// first address refused.
    pub address: Option<SocketAddr>,
    /// Allowed, or why not.
    pub reason: Reason,
    /// A sentence for people (the body of a refusal); empty when allowed.
    pub detail: String,
}

impl Decision {
    /// Was the connection let through?
    pub fn allowed(&self) -> bool {
        self.reason == Reason::Allowed
    }
}

/// Why a connection was let through or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Connected: the tunnel (CONNECT) or forward (plain HTTP) is open.
    Allowed,
    /// The host is not on the allowlist (`403`).
    HostNotAllowed,
    /// The host is on the allowlist, but not with this port (`403`).
    PortNotAllowed,
    /// Every address of the host is loopback, private, link-local, ... (`403`).
    AddressRefused(AddressClass),
    /// The name did not resolve, or resolved to nothing (`502`).
    ResolveFailed,
    /// No address accepted the connection (`502`).
    ConnectFailed,
    /// Connecting timed out (`504`).
    ConnectTimeout,
    /// The request was not a proxy request the proxy can serve (`400`).
    BadRequest,
    /// The client did not send its request head in time (`408`).
    HeadTimeout,
    /// The proxy already serves as many connections as it may (`503`).
    Busy,
}

impl Reason {
    /// A stable short name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::HostNotAllowed => "host_not_allowed",
            Self::PortNotAllowed => "port_not_allowed",
            Self::AddressRefused(_) => "address_refused",
            Self::ResolveFailed => "resolve_failed",
            Self::ConnectFailed => "connect_failed",
            Self::ConnectTimeout => "connect_timeout",
            Self::BadRequest => "bad_request",
            Self::HeadTimeout => "head_timeout",
            Self::Busy => "busy",
        }
    }

    /// The HTTP status a client gets.
    pub fn status(self) -> u16 {
        match self {
            Self::Allowed => 200,
            Self::HostNotAllowed | Self::PortNotAllowed | Self::AddressRefused(_) => 403,
            Self::ResolveFailed | Self::ConnectFailed => 502,
            Self::ConnectTimeout => 504,
            Self::BadRequest => 400,
            Self::HeadTimeout => 408,
            Self::Busy => 503,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Logs a decision and hands it to the sink.
pub(crate) fn record(events: Option<&EventSink>, decision: &Decision) {
    let host = decision.host.as_deref().unwrap_or("");
    let port = decision.port.unwrap_or(0);
    let address = decision.address.map(|a| a.to_string()).unwrap_or_default();
    if decision.allowed() {
        tracing::info!(target: "runbox_egress", host, port, %address, "egress allowed");
    } else {
        tracing::info!(
            target: "runbox_egress",
            host, port, %address, reason = %decision.reason, detail = %decision.detail,
            "egress refused"
        );
    }
    if let Some(sink) = events {
        sink(decision);
    }
}
