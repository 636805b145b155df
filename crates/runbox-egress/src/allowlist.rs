//! Which hosts and ports a sandbox may reach, by name: [`Host`], [`HostPattern`] and
//! [`Allowlist`]. Names are compared lowercased and without a trailing dot; IP literals are
//! compared as addresses (an IPv4-mapped IPv6 literal is the IPv4 address).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::{Error, Result};

/// The ports an entry without `:port` allows: HTTPS and HTTP.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// Longest DNS name, without the trailing dot (RFC 1035).
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label (RFC 1035).
const MAX_LABEL_LEN: usize = 63;

/// A destination host: a normalized DNS name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lowercase ASCII letters, digits, `-` and `_`, no trailing dot.
    Name(String),
    /// An IP address literal (IPv4-mapped IPv6 literals are stored as IPv4).
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as a client or an operator writes it: a DNS name (any case, one trailing
    /// dot allowed) or an IP literal (IPv6 with or without brackets).
    pub fn parse(host: &str) -> Result<Self> {
        parse_host(host).map_err(|reason| Error::InvalidHost {
            host: host.to_owned(),
            reason,
        })
    }

    /// True for an IP literal.
    pub fn is_ip(&self) -> bool {
        matches!(self, Self::Ip(_))
    }
}

impl fmt::Display for Host {
    /// The name, or the address (IPv6 without brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

fn parse_host(host: &str) -> std::result::Result<Host, &'static str> {
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if let Some(inner) = bracketed {
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(ip) => Ok(Host::Ip(IpAddr::V6(ip).to_canonical())),
            Err(_) => Err("brackets must hold an IPv6 address"),
        };
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Host::Ip(ip.to_canonical()));
    }
    validate_name(host).map(Host::Name)
}

/// Checks a DNS name and returns it normalized (lowercase, no trailing dot).
fn validate_name(name: &str) -> std::result::Result<String, &'static str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("empty host name");
    }
    if !name.is_ascii() {
        return Err("not ASCII: write an internationalized name in its xn-- form");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("host name longer than 253 characters");
    }
    let name = name.to_ascii_lowercase();
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)");
        }
        if label.len() > MAX_LABEL_LEN {
            return Err("label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, `-`, `_` and dots may appear in a host name");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label may not start or end with `-`");
        }
        last = label;
    }
    // `127.1` or `0x7f.1` are not names: resolvers read them as numeric addresses.
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a host name nor a complete IP address");
    }
    Ok(name)
}

/// What a [`HostPattern`] matches, by host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HostMatch {
    /// Exactly this host.
    Exact(Host),
    /// Any subdomain of this name (not the name itself).
    Subdomains(String),
}

/// One allowlist entry: `example.org`, `*.example.org` (subdomains, not the apex), or an IP
/// literal, each optionally with `:port`. Without a port it allows 443 and 80.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    host: HostMatch,
    port: Option<u16>,
}

impl HostPattern {
    /// Parses an entry; see the type's documentation for the forms.
    pub fn parse(entry: &str) -> Result<Self> {
        parse_pattern(entry.trim()).map_err(|reason| Error::InvalidPattern {
            entry: entry.to_owned(),
            reason,
        })
    }

    /// The port the entry names, if it names one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The ports the entry allows: its own, or [`DEFAULT_PORTS`].
    pub fn ports(&self) -> &[u16] {
        match &self.port {
            Some(port) => std::slice::from_ref(port),
            None => &DEFAULT_PORTS,
        }
    }

    /// True for a `*.domain` entry.
    pub fn is_wildcard(&self) -> bool {
        matches!(self.host, HostMatch::Subdomains(_))
    }

    /// Does this entry allow `host` on `port`?
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.ports().contains(&port) && self.matches_host(host)
    }

    /// Does this entry match `host`, on any of its ports?
    pub fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostMatch::Exact(own), host) => own == host,
            (HostMatch::Subdomains(domain), Host::Name(name)) => is_subdomain(name, domain),
            (HostMatch::Subdomains(_), Host::Ip(_)) => false,
        }
    }

    /// Does this entry match every host `other` matches (ports aside)?
    fn covers_hosts_of(&self, other: &HostPattern) -> bool {
        match (&self.host, &other.host) {
            (_, HostMatch::Exact(host)) => self.matches_host(host),
            (HostMatch::Subdomains(own), HostMatch::Subdomains(theirs)) => {
                own == theirs || is_subdomain(theirs, own)
            }
            (HostMatch::Exact(_), HostMatch::Subdomains(_)) => false,
        }
    }
}

/// `name` is a strict subdomain of `domain` (both normalized).
fn is_subdomain(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.ends_with(domain)
        && name.as_bytes()[name.len() - domain.len() - 1] == b'.'
}

impl FromStr for HostPattern {
    type Err = Error;

    fn from_str(entry: &str) -> Result<Self> {
        Self::parse(entry)
    }
}

impl fmt::Display for HostPattern {
    /// The canonical form, which parses back to the same pattern.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Exact(Host::Ip(IpAddr::V6(ip))) => write!(f, "[{ip}]")?,
            HostMatch::Exact(host) => write!(f, "{host}")?,
            HostMatch::Subdomains(domain) => write!(f, "*.{domain}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

fn parse_pattern(entry: &str) -> std::result::Result<HostPattern, &'static str> {
    if entry.is_empty() {
        return Err("empty entry");
    }
    if entry.contains('/') || entry.contains('@') {
        return Err("write a host, not a URL");
    }
    let (host, port) = split_port(entry)?;
    let port = port
        .map(|port| match port.parse::<u16>() {
            Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
            Ok(port) => Ok(port),
        })
        .transpose()?;
    let host = match host.strip_prefix("*.") {
        Some(domain) => {
            if domain.contains('*') {
                return Err("a wildcard may only be a leading `*.`");
            }
            if domain.parse::<IpAddr>().is_ok() {
                return Err("a wildcard needs a domain name, not an address");
            }
            HostMatch::Subdomains(validate_name(domain)?)
        }
        None if host.contains('*') => return Err("a wildcard may only be a leading `*.`"),
        None => HostMatch::Exact(parse_host(host)?),
    };
    Ok(HostPattern { host, port })
}

/// Splits `host[:port]`, where an IPv6 host is bracketed when a port follows and may be bare
/// when none does.
fn split_port(entry: &str) -> std::result::Result<(&str, Option<&str>), &'static str> {
    if entry.starts_with('[') {
        let end = entry.find(']').ok_or("unclosed `[`")?;
        let (host, rest) = entry.split_at(end + 1);
        return match rest {
            "" => Ok((host, None)),
            rest => match rest.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err("only `:port` may follow `]`"),
            },
        };
    }
    match entry.matches(':').count() {
        0 => Ok((entry, None)),
        1 => Ok(entry
            .split_once(':')
            .map_or((entry, None), |(host, port)| (host, Some(port)))),
        // A bare IPv6 address: no port.
        _ => Ok((entry, None)),
    }
}

/// The hosts a sandbox may reach: a list of [`HostPattern`]s, any of which may match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    patterns: Vec<HostPattern>,
}

/// Why an [`Allowlist`] does not allow a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// No entry names the host.
    Host,
    /// An entry names the host, but not on this port.
    Port,
}

impl Allowlist {
    /// An allowlist of these entries (duplicates dropped).
    pub fn new(patterns: impl IntoIterator<Item = HostPattern>) -> Self {
        let mut list = Self::default();
        for pattern in patterns {
            if !list.patterns.contains(&pattern) {
                list.patterns.push(pattern);
            }
        }
        list
    }

    /// Parses entries such as the operator's `--allow-host` values.
    pub fn parse<I, S>(entries: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let patterns = entries
            .into_iter()
            .map(|entry| HostPattern::parse(entry.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(patterns))
    }

    /// The entries, in order.
    pub fn patterns(&self) -> &[HostPattern] {
        &self.patterns
    }

    /// True when nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Checks `host` on `port`: `Ok` when an entry allows it, otherwise why not.
    pub fn check(&self, host: &Host, port: u16) -> std::result::Result<(), Denial> {
        if self.patterns.iter().any(|p| p.matches(host, port)) {
            Ok(())
        } else if self.patterns.iter().any(|p| p.matches_host(host)) {
            Err(Denial::Port)
        } else {
            Err(Denial::Host)
        }
    }

    /// Does an entry allow `host` on `port`?
    pub fn permits(&self, host: &Host, port: u16) -> bool {
        self.check(host, port).is_ok()
    }

    /// The part of this (the operator's) list a sandbox asks for: each requested entry must be
    /// covered, host and every port, by this list's entries; the first one that is not is an
    /// error naming it. An empty request gives an empty list: nothing is reachable.
    pub fn narrow(&self, requested: &[String]) -> Result<Allowlist> {
        let mut narrowed = Vec::with_capacity(requested.len());
        for entry in requested {
            let pattern = HostPattern::parse(entry)?;
            let covered = pattern.ports().iter().all(|&port| {
                self.patterns
                    .iter()
                    .any(|own| own.ports().contains(&port) && own.covers_hosts_of(&pattern))
            });
            if !covered {
                let allowed = if self.is_empty() {
                    "the operator allows no hosts".to_owned()
                } else {
                    format!("the operator allows {self}")
                };
                return Err(Error::NotCovered {
                    requested: entry.clone(),
                    allowed,
                });
            }
            narrowed.push(pattern);
        }
        Ok(Self::new(narrowed))
    }
}

impl fmt::Display for Allowlist {
    /// The entries, comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pattern) in self.patterns.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{pattern}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    #[test]
    fn exact_names_match_case_insensitively_and_without_trailing_dot() {
        let list = list(&["Example.ORG."]);
        assert!(list.permits(&host("example.org"), 443));
        assert!(list.permits(&host("EXAMPLE.org."), 80));
        assert!(!list.permits(&host("www.example.org"), 443));
        assert!(!list.permits(&host("example.org.evil.test"), 443));
    }

    #[test]
    fn wildcards_match_subdomains_but_not_the_apex() {
        let list = list(&["*.example.org"]);
        assert!(list.permits(&host("a.example.org"), 443));
        assert!(list.permits(&host("a.b.EXAMPLE.org."), 443));
        assert!(!list.permits(&host("example.org"), 443));
        assert!(!list.permits(&host("badexample.org"), 443));
        assert!(!list.permits(&host("example.org.evil.test"), 443));
        assert!(!list.permits(&host("10.0.0.1"), 443));
    }

    #[test]
    fn ports_default_to_https_and_http() {
        let list = list(&["example.org", "api.example.test:8443"]);
        assert_eq!(list.check(&host("example.org"), 443), Ok(()));
        assert_eq!(list.check(&host("example.org"), 80), Ok(()));
        assert_eq!(list.check(&host("example.org"), 22), Err(Denial::Port));
        assert_eq!(list.check(&host("api.example.test"), 8443), Ok(()));
        assert_eq!(
            list.check(&host("api.example.test"), 443),
            Err(Denial::Port)
        );
        assert_eq!(list.check(&host("other.test"), 443), Err(Denial::Host));
    }

    #[test]
    fn ip_literals_are_exact_hosts() {
        let list = list(&[
            "10.1.2.3",
            "[2001:db8::1]:8080",
            "2001:db8::2",
            "[::ffff:10.9.9.9]",
        ]);
        assert!(list.permits(&host("10.1.2.3"), 443));
        assert!(list.permits(&host("[2001:db8::1]"), 8080));
        assert!(list.permits(&host("2001:db8::1"), 8080));
        assert!(list.permits(&host("[2001:DB8::2]"), 80));
        assert!(
            list.permits(&host("10.9.9.9"), 443),
            "mapped literal is the IPv4 address"
        );
        assert!(!list.permits(&host("10.1.2.4"), 443));
    }

    #[test]
    fn patterns_display_in_canonical_form() {
        for (entry, canonical) in [
            ("Example.Org.", "example.org"),
            ("*.Example.org:8080", "*.example.org:8080"),
            ("::1", "[::1]"),
            ("[::1]:443", "[::1]:443"),
            ("  10.0.0.1:80 ", "10.0.0.1:80"),
        ] {
            let pattern = HostPattern::parse(entry).unwrap();
            assert_eq!(pattern.to_string(), canonical);
            assert_eq!(HostPattern::parse(canonical).unwrap(), pattern);
        }
    }

    #[test]
    fn bad_entries_say_why() {
        for entry in [
            "",
            "*",
            "*.",
            "a.*.example.org",
            "*example.org",
            "*.*.example.org",
            "*.10.0.0.1",
            "exa mple.org",
            "example.org:0",
            "example.org:65536",
            "example.org:https",
            "-bad.example.org",
            "example..org",
            "http://example.org",
            "user@example.org",
            "bücher.example",
            "[::1",
            "[10.0.0.1]",
            "[::1]x",
            "127.1",
        ] {
            let err = HostPattern::parse(entry).unwrap_err();
            assert!(
                matches!(err, Error::InvalidPattern { .. }),
                "{entry}: {err}"
            );
            assert!(err.to_string().contains("invalid allowed host"), "{err}");
        }
    }

    #[test]
    fn narrowing_keeps_covered_requests() {
        let operator = list(&["*.example.org", "api.example.test:8443", "mirror.test"]);
        let narrowed = operator
            .narrow(&[
                "a.example.org".into(),
                "*.b.example.org".into(),
                "*.example.org:443".into(),
                "API.example.test:8443".into(),
                "mirror.test:80".into(),
            ])
            .unwrap();
        assert_eq!(
            narrowed.to_string(),
            "a.example.org, *.b.example.org, *.example.org:443, api.example.test:8443, \
             mirror.test:80"
        );
        assert!(!narrowed.permits(&host("c.example.org"), 80));
        assert!(operator.narrow(&[]).unwrap().is_empty());
    }

    #[test]
    fn narrowing_refuses_what_the_operator_does_not_allow() {
        let operator = list(&["*.example.org", "api.example.test:8443"]);
        for request in [
            "example.org",
            "other.test",
            "api.example.test",
            "*.example.test",
            "a.example.org:22",
        ] {
            let err = operator
                .narrow(&["a.example.org".into(), request.into()])
                .unwrap_err();
            assert!(matches!(&err, Error::NotCovered { requested, .. } if requested == request));
            let message = err.to_string();
            assert!(
                message.contains(request) && message.contains("--allow-host"),
                "{message}"
            );
        }
        let err = Allowlist::default()
            .narrow(&["a.example.org".into()])
            .unwrap_err();
        assert!(err.to_string().contains("allows no hosts"), "{err}");
        let err = operator.narrow(&["not a host".into()]).unwrap_err();
        assert!(matches!(err, Error::InvalidPattern { .. }), "{err}");
    }

    #[test]
    fn narrowing_checks_each_default_port() {
        let operator = list(&["split.test:443", "split.test:80"]);
        assert!(operator.narrow(&["split.test".into()]).is_ok());
        let half = list(&["split.test:443"]);
        assert!(half.narrow(&["split.test".into()]).is_err());
    }
}
