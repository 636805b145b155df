//! # runbox-egress
//!
//! The egress proxy of a sandbox in egress mode. A sandbox has its own, empty network
//! namespace; its init listens on `127.0.0.1:PORT` inside it and hands the listening socket
//! to the server, which runs one proxy per sandbox on it ([`spawn`]). Sandboxed code reaches
//! the outside only through that proxy (`HTTP_PROXY`/`HTTPS_PROXY`), by `CONNECT host:port`
//! or a plain-HTTP request in absolute form.
//!
//! **Threat model.** The client is hostile code. It may name any host, send any bytes, and
//! control DNS for names it owns. So the proxy lets a connection through only when the host
//! and port are on the sandbox's [`Allowlist`] (narrowed from the operator's), then resolves
//! the name once, refuses every address that is not public unicast ([`classify`]: loopback,
//! private, link-local such as 169.254.169.254, unique-local, multicast, documentation, the
//! IPv4-in-IPv6 forms of these, ...) unless the operator excepted it, and connects to exactly
//! an address it checked, so a name that resolves differently a second time (DNS rebinding)
//! gains nothing. Request heads are size- and time-limited and the connections of one proxy
//! are capped. Every decision is logged (target `runbox_egress`) and handed to an optional
//! [`EventSink`].
//!
//! This crate never opens a socket of its own to listen on and never decides which hosts an
//! operator allows: both come from the server. [`discover_index_hosts`] helps the operator
//! allow the package indexes this machine's pip and npm already use.

#![forbid(unsafe_code)]

mod address;
mod allowlist;
mod decision;
mod discover;
mod error;
mod policy;
mod proxy;
mod request;

pub use address::{AddressClass, IpNet, classify, parse_address_range};
pub use allowlist::{Allowlist, DEFAULT_PORTS, Denial, Host, HostPattern};
pub use decision::{Decision, EventSink, Reason};
pub use discover::{
    IndexCommands, IndexHosts, PipSettings, discover_index_hosts, discover_package_hosts, url_host,
};
pub use error::{Error, Result};
pub use policy::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEAD_TIMEOUT, DEFAULT_MAX_TUNNELS, MAX_HEAD_BYTES, Policy,
    ProxyLimits, Resolve, SystemResolver,
};
pub use proxy::{EgressHandle, serve, spawn};
