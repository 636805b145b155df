//! What one proxy allows and how much: the [`Policy`] (allowlist, address exceptions,
//! resolver, [`ProxyLimits`]) and the [`Resolve`] seam.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::address::{AddressClass, IpNet, classify};
use crate::{Allowlist, Result};

/// Concurrent connections one proxy serves by default; past it a client gets `503`. One
/// sandbox's package install opens a handful; 64 leaves room without letting one sandbox hold
/// hundreds of the server's sockets.
pub const DEFAULT_MAX_TUNNELS: usize = 64;
/// How long a client has to send its request head by default; stops idle half-opened
/// connections from holding a slot.
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long resolving a name, and then connecting to each address, may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head the proxy reads; a larger one is answered `400`.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Turns a host name into addresses. The proxy resolves each name once, checks every address,
/// and connects only to an address it checked, so a name that changes its answer between a
/// check and a connection (DNS rebinding) gains nothing.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses of `host` (a normalized DNS name, never an IP literal).
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The host's own resolver (`getaddrinfo`, through [`tokio::net::lookup_host`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0))
            .await?
            .map(|addr| addr.ip())
            .collect())
    }
}

/// Limits of one proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Connections served at once (tunnels, forwards, and requests still being read).
    pub max_tunnels: usize,
    /// Time allowed to send the request head.
    pub head_timeout: Duration,
    /// Time allowed to resolve the name, and then to connect to each address in turn.
    pub connect_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            max_tunnels: DEFAULT_MAX_TUNNELS,
            head_timeout: DEFAULT_HEAD_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// Everything one proxy decides with. The server builds the operator's policy once and gives
/// each sandbox a [`narrow`](Self::narrow)ed copy.
#[derive(Clone)]
pub struct Policy {
    /// The hosts and ports that may be reached.
    pub allowlist: Allowlist,
    /// Addresses reachable even though they are loopback, private, link-local, ...: the
    /// operator's exceptions for, say, a package mirror on the company network. Empty by
    /// default.
    pub allow_addresses: Vec<IpNet>,
    /// How names become addresses.
    pub resolver: Arc<dyn Resolve>,
    /// Limits and timeouts.
    pub limits: ProxyLimits,
}

impl Policy {
    /// A policy allowing `allowlist`, resolving with the [`SystemResolver`], no address
    /// exceptions, default limits.
    pub fn new(allowlist: Allowlist) -> Self {
        Self {
            allowlist,
            allow_addresses: Vec::new(),
            resolver: Arc::new(SystemResolver),
            limits: ProxyLimits::default(),
        }
    }

    /// Replaces the address exceptions.
    #[must_use]
    pub fn with_allow_addresses(mut self, allow_addresses: Vec<IpNet>) -> Self {
        self.allow_addresses = allow_addresses;
        self
    }

    /// Replaces the resolver (tests map names to loopback addresses with one).
    #[must_use]
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Replaces the limits.
    #[must_use]
    pub fn with_limits(mut self, limits: ProxyLimits) -> Self {
        self.limits = limits;
        self
    }

    /// This policy with the allowlist narrowed to what a sandbox asked for; see
    /// [`Allowlist::narrow`].
    pub fn narrow(&self, requested: &[String]) -> Result<Self> {
        Ok(Self {
            allowlist: self.allowlist.narrow(requested)?,
            ..self.clone()
        })
    }

    /// Checks a resolved address: `Ok` with the address to connect to (an IPv4-mapped IPv6
    /// address becomes IPv4), or the class that refuses it. The operator's exceptions win.
    pub fn check_address(&self, ip: IpAddr) -> std::result::Result<IpAddr, AddressClass> {
        let ip = ip.to_canonical();
        if self.allow_addresses.iter().any(|net| net.contains(&ip)) {
            return Ok(ip);
        }
        match classify(ip) {
            None => Ok(ip),
            Some(class) => Err(class),
        }
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("allowlist", &self.allowlist)
            .field("allow_addresses", &self.allow_addresses)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::parse_address_range;

    #[test]
    fn exceptions_let_listed_addresses_through() {
        let policy = Policy::new(Allowlist::default());
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(policy.check_address(loopback), Err(AddressClass::Loopback));
        let policy = policy.with_allow_addresses(vec![parse_address_range("127.0.0.1").unwrap()]);
        assert_eq!(policy.check_address(loopback), Ok(loopback));
        assert_eq!(
            policy.check_address("::ffff:127.0.0.1".parse().unwrap()),
            Ok(loopback)
        );
        assert_eq!(
            policy.check_address("127.0.0.2".parse().unwrap()),
            Err(AddressClass::Loopback)
        );
        assert_eq!(
            policy.check_address("::1".parse().unwrap()),
            Err(AddressClass::Loopback)
        );
    }

    #[test]
    fn narrowing_keeps_everything_but_the_allowlist() {
        let policy = Policy::new(Allowlist::parse(["*.example.org"]).unwrap())
            .with_allow_addresses(vec![parse_address_range("10.0.0.0/8").unwrap()])
            .with_limits(ProxyLimits {
                max_tunnels: 3,
                ..ProxyLimits::default()
            });
        let narrowed = policy.narrow(&["a.example.org".into()]).unwrap();
        assert_eq!(narrowed.allowlist.to_string(), "a.example.org");
        assert_eq!(narrowed.allow_addresses, policy.allow_addresses);
        assert_eq!(narrowed.limits.max_tunnels, 3);
        assert!(policy.narrow(&["example.org".into()]).is_err());
    }
}
