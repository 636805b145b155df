//! Which resolved addresses the proxy refuses to connect to: everything that is not a public
//! unicast address, so a permitted name that resolves to the host's loopback, a private
//! network or a cloud metadata address (169.254.169.254) is still refused.
//!
//! IPv6 is checked by default-deny: only global unicast (2000::/3) outside its special ranges
//! passes, plus the NAT64 well-known prefix when the IPv4 address inside it would pass. IPv4
//! addresses embedded in IPv6 (mapped, compatible, translated, NAT64) are judged as IPv4.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use ipnet::IpNet;

use crate::{Error, Result};

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressClass {
    /// `0.0.0.0`, `::`.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16.
    Private,
    /// 100.64.0.0/10, carrier-grade NAT (RFC 6598).
    SharedCgnat,
    /// 169.254.0.0/16 (where cloud metadata services live), fe80::/10.
    LinkLocal,
    /// fc00::/7, and the deprecated site-local fec0::/10.
    UniqueLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 0.0.0.0/8 ("this network").
    ThisNetwork,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18.0.0/15, 2001:2::/48.
    Benchmarking,
    /// 6to4 (2002::/16) and Teredo (2001::/32), which carry IPv4 addresses in other forms.
    Transition,
    /// Other special-purpose ranges: 240.0.0.0/4, 192.0.0.0/24, 192.88.99.0/24, 2001::/23,
    /// 64:ff9b:1::/48, IPv4-compatible IPv6, and IPv6 outside global unicast (2000::/3).
    Reserved,
}

impl AddressClass {
    /// A short name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::SharedCgnat => "shared (carrier-grade NAT)",
            Self::LinkLocal => "link-local",
            Self::UniqueLocal => "unique-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::ThisNetwork => "this-network",
            Self::Documentation => "documentation",
            Self::Benchmarking => "benchmarking",
            Self::Transition => "IPv6 transition",
            Self::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `None` for a public unicast address the proxy may connect to; otherwise why not.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(ip) => classify_v4(ip),
        IpAddr::V6(ip) => classify_v6(ip),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let [a, b, c, _] = ip.octets();
    let class = match (a, b, c) {
        _ if ip.is_unspecified() => Unspecified,
        _ if ip.is_broadcast() => Broadcast,
        (0, _, _) => ThisNetwork,
        (10, _, _) => Private,
        (100, b, _) if b & 0xc0 == 64 => SharedCgnat,
        (127, _, _) => Loopback,
        (169, 254, _) => LinkLocal,
        (172, b, _) if b & 0xf0 == 16 => Private,
        (192, 0, 0) | (192, 88, 99) => Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Documentation,
        (192, 168, _) => Private,
        (198, b, _) if b & 0xfe == 18 => Benchmarking,
        (224..=239, _, _) => Multicast,
        (240..=255, _, _) => Reserved,
        _ => return None,
    };
    Some(class)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let s = ip.segments();
    let embedded = || {
        let [_, _, _, _, _, _, hi, lo] = s;
        Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
    };
    let class = match s {
        _ if ip.is_unspecified() => Unspecified,
        _ if ip.is_loopback() => Loopback,
        // ::ffff:a.b.c.d (mapped): the IPv4 address itself.
        [0, 0, 0, 0, 0, 0xffff, _, _] => return classify_v4(embedded()),
        // ::a.b.c.d (compatible, deprecated) and ::ffff:0:a.b.c.d (translated): never
        // routed as public IPv6; refused, with the IPv4 address's own class when it has one.
        [0, 0, 0, 0, 0, 0, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => {
            classify_v4(embedded()).unwrap_or(Reserved)
        }
        // 64:ff9b::/96, NAT64 well-known prefix: as good as the IPv4 address it reaches.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => return classify_v4(embedded()),
        [0x64, 0xff9b, 1, ..] => Reserved,
        [x, ..] if x & 0xff00 == 0xff00 => Multicast,
        [x, ..] if x & 0xffc0 == 0xfe80 => LinkLocal,
        [x, ..] if x & 0xffc0 == 0xfec0 => UniqueLocal,
        [x, ..] if x & 0xfe00 == 0xfc00 => UniqueLocal,
        [0x2001, 0xdb8, ..] => Documentation,
        [0x3fff, y, ..] if y & 0xf000 == 0 => Documentation,
        [0x2001, 0, ..] | [0x2002, ..] => Transition,
        [0x2001, 2, 0, ..] => Benchmarking,
        [0x2001, y, ..] if y < 0x200 => Reserved,
        [x, ..] if x & 0xe000 != 0x2000 => Reserved,
        _ => return None,
    };
    Some(class)
}

/// Parses an address exception: a CIDR range (`10.1.0.0/16`, `fd00::/8`) or a single address
/// (`10.1.2.3`, `::1`).
pub fn parse_address_range(entry: &str) -> Result<IpNet> {
    let entry = entry.trim();
    let invalid = || Error::InvalidAddressRange {
        entry: entry.to_owned(),
    };
    if entry.contains('/') {
        entry
            .parse::<IpNet>()
            .map(|net| net.trunc())
            .map_err(|_| invalid())
    } else {
        entry
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(ip: &str) -> Option<AddressClass> {
        classify(ip.parse().unwrap())
    }

    #[test]
    fn refuses_every_special_ipv4_range() {
        use AddressClass::*;
        for (ip, want) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", ThisNetwork),
            ("10.0.0.1", Private),
            ("10.255.255.255", Private),
            ("100.64.0.1", SharedCgnat),
            ("100.127.255.255", SharedCgnat),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("169.254.169.254", LinkLocal),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.0.0.8", Reserved),
            ("192.0.2.1", Documentation),
            ("192.88.99.1", Reserved),
            ("192.168.1.1", Private),
            ("198.18.0.1", Benchmarking),
            ("198.19.255.255", Benchmarking),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.255", Broadcast),
        ] {
            assert_eq!(class(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn allows_public_ipv4_next_to_the_special_ranges() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "11.0.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "192.167.1.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
        ] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    #[test]
    fn refuses_special_ipv6_and_embedded_ipv4() {
        use AddressClass::*;
        for (ip, want) in [
            ("::", Unspecified),
            ("::1", Loopback),
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:10.0.0.1", Private),
            ("::127.0.0.1", Loopback),
            ("::10.0.0.1", Private),
            ("::8.8.8.8", Reserved),
            ("::ffff:0:127.0.0.1", Loopback),
            ("64:ff9b::127.0.0.1", Loopback),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::10.1.1.1", Private),
            ("64:ff9b:1::1", Reserved),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", UniqueLocal),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("ff02::1", Multicast),
            ("ff0e::1", Multicast),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("2001::1", Transition),
            ("2002:7f00:1::1", Transition),
            ("2001:2::1", Benchmarking),
            ("2001:10::1", Reserved),
            ("100::1", Reserved),
            ("4000::1", Reserved),
        ] {
            assert_eq!(class(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn allows_global_ipv6_and_public_nat64() {
        for ip in [
            "2606:4700::1111",
            "2a00:1450::1",
            "2001:200::1",
            "64:ff9b::8.8.8.8",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    #[test]
    fn parses_address_ranges() {
        assert_eq!(
            parse_address_range("127.0.0.1").unwrap().to_string(),
            "127.0.0.1/32"
        );
        assert_eq!(parse_address_range("::1").unwrap().to_string(), "::1/128");
        assert_eq!(
            parse_address_range(" 10.1.2.3/16 ").unwrap().to_string(),
            "10.1.0.0/16"
        );
        for bad in ["", "10.0.0.0/33", "example.org", "10.0.0/8"] {
            assert!(matches!(
                parse_address_range(bad),
                Err(Error::InvalidAddressRange { .. })
            ));
        }
    }
}
