//! The SSRF guard: which addresses an outbound call may reach.
//!
//! Every address that is not globally routable is refused: loopback, private, link-local (cloud
//! metadata among them), shared (CGNAT), unique-local, multicast, broadcast, documentation,
//! benchmarking, reserved, the unspecified addresses, and the IPv6 forms that carry or route to
//! IPv4 (mapped, compatible, NAT64, 6to4, Teredo). `localhost` names are refused by name. URL
//! parsing turns decimal, hex and octal IPv4 spellings (`2130706433`, `0x7f000001`, `0177.1`) into
//! the address they mean before the check. Names are resolved once, checked, and the connection
//! goes to the very addresses checked (no second lookup). An allow-list of networks lets tests and
//! private deployments reach chosen addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// A refused destination; sending nothing is the point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused to connect to {target}: {why} (not on the allow-list)")]
pub struct Blocked {
    /// The host or address refused.
    pub target: String,
    /// Why the address is refused (loopback, private, metadata, ...).
    pub why: &'static str,
}

/// Why `ip` is not globally routable, or `None` if it is.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4),
        IpAddr::V6(v6) => refusal_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn refusal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u8, &str)] = &[
        ([0, 0, 0, 0], 8, "\"this network\" (0.0.0.0/8)"),
        ([10, 0, 0, 0], 8, "a private address (10.0.0.0/8)"),
        (
            [100, 64, 0, 0],
            10,
            "a shared (CGNAT) address (100.64.0.0/10)",
        ),
        ([127, 0, 0, 0], 8, "a loopback address (127.0.0.0/8)"),
        (
            [169, 254, 0, 0],
            16,
            "a link-local address, cloud metadata among them (169.254.0.0/16)",
        ),
        ([172, 16, 0, 0], 12, "a private address (172.16.0.0/12)"),
        (
            [192, 0, 0, 0],
            24,
            "an IETF protocol assignment (192.0.0.0/24)",
        ),
        ([192, 0, 2, 0], 24, "a documentation address (192.0.2.0/24)"),
        ([192, 31, 196, 0], 24, "an AS112 address (192.31.196.0/24)"),
        ([192, 52, 193, 0], 24, "an AMT address (192.52.193.0/24)"),
        (
            [192, 88, 99, 0],
            24,
            "a 6to4 relay address (192.88.99.0/24)",
        ),
        ([192, 168, 0, 0], 16, "a private address (192.168.0.0/16)"),
        (
            [192, 175, 48, 0],
            24,
            "a direct delegation AS112 address (192.175.48.0/24)",
        ),
        (
            [198, 18, 0, 0],
            15,
            "a benchmarking address (198.18.0.0/15)",
        ),
        (
            [198, 51, 100, 0],
            24,
            "a documentation address (198.51.100.0/24)",
        ),
        (
            [203, 0, 113, 0],
            24,
            "a documentation address (203.0.113.0/24)",
        ),
        ([224, 0, 0, 0], 4, "a multicast address (224.0.0.0/4)"),
        (
            [240, 0, 0, 0],
            4,
            "a reserved or broadcast address (240.0.0.0/4)",
        ),
    ];
    RANGES
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
        .map(|(_, _, why)| *why)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    (u128::from(ip) & mask) == (u128::from(Ipv6Addr::from(net)) & mask)
}

fn refusal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("the unspecified address (::)");
    }
    if ip.is_loopback() {
        return Some("the loopback address (::1)");
    }
    const RANGES: &[([u16; 8], u8, &str)] = &[
        (
            [0, 0, 0, 0, 0, 0xffff, 0, 0],
            96,
            "an IPv4-mapped address (::ffff:0:0/96)",
        ),
        (
            [0, 0, 0, 0, 0, 0, 0, 0],
            96,
            "an IPv4-compatible address (::/96)",
        ),
        (
            [0x64, 0xff9b, 0, 0, 0, 0, 0, 0],
            96,
            "a NAT64 address (64:ff9b::/96)",
        ),
        (
            [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
            48,
            "a local NAT64 address (64:ff9b:1::/48)",
        ),
        (
            [0x100, 0, 0, 0, 0, 0, 0, 0],
            64,
            "a discard-only address (100::/64)",
        ),
        (
            [0x2001, 0, 0, 0, 0, 0, 0, 0],
            32,
            "a Teredo address (2001::/32)",
        ),
        (
            [0x2001, 0x2, 0, 0, 0, 0, 0, 0],
            48,
            "a benchmarking address (2001:2::/48)",
        ),
        (
            [0x2001, 0x10, 0, 0, 0, 0, 0, 0],
            28,
            "an ORCHID address (2001:10::/28)",
        ),
        (
            [0x2001, 0x20, 0, 0, 0, 0, 0, 0],
            28,
            "an ORCHIDv2 address (2001:20::/28)",
        ),
        (
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
            32,
            "a documentation address (2001:db8::/32)",
        ),
        (
            [0x2002, 0, 0, 0, 0, 0, 0, 0],
            16,
            "a 6to4 address (2002::/16)",
        ),
        (
            [0x3fff, 0, 0, 0, 0, 0, 0, 0],
            20,
            "a documentation address (3fff::/20)",
        ),
        (
            [0x5f00, 0, 0, 0, 0, 0, 0, 0],
            16,
            "a segment-routing address (5f00::/16)",
        ),
        (
            [0xfc00, 0, 0, 0, 0, 0, 0, 0],
            7,
            "a unique-local address, cloud metadata among them (fc00::/7)",
        ),
        (
            [0xfe80, 0, 0, 0, 0, 0, 0, 0],
            10,
            "a link-local address (fe80::/10)",
        ),
        (
            [0xfec0, 0, 0, 0, 0, 0, 0, 0],
            10,
            "a site-local address (fec0::/10)",
        ),
        (
            [0xff00, 0, 0, 0, 0, 0, 0, 0],
            8,
            "a multicast address (ff00::/8)",
        ),
    ];
    if let Some((_, _, why)) = RANGES.iter().find(|(net, len, _)| in_v6(ip, *net, *len)) {
        return Some(why);
    }
    // Only global unicast (2000::/3) is routable on the Internet.
    if !in_v6(ip, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some("a reserved IPv6 address (outside 2000::/3)");
    }
    None
}

/// The guard: the classifier plus an allow-list of networks.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow: Vec<IpNet>,
}

impl Guard {
    /// A guard that lets `allow` through even where the classifier refuses.
    pub fn new(allow: Vec<IpNet>) -> Self {
        Guard { allow }
    }

    /// Parses networks such as `"127.0.0.1/32"` or `"10.1.0.0/16"`; the error names the bad one.
    pub fn parse(allow: &[impl AsRef<str>]) -> Result<Self, crate::SetupError> {
        let nets = allow
            .iter()
            .map(|s| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| crate::SetupError::BadNetwork(s.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Guard::new(nets))
    }

    /// Whether a call may go to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Blocked> {
        let ip = match ip {
            // An IPv4-mapped address is its IPv4 address for the allow-list.
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .filter(|v4| self.allowed(*v4))
                .unwrap_or(ip),
            v4 => v4,
        };
        if self.allowed(ip) {
            return Ok(());
        }
        match refusal(ip) {
            Some(why) => Err(Blocked {
                target: ip.to_string(),
                why,
            }),
            None => Ok(()),
        }
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(&ip))
    }

    /// Whether a URL names a literal address this guard will always refuse (a private,
    /// loopback, link-local or metadata address not on the allow-list, in any spelling the URL
    /// parser accepts): such a URL can be refused when it is registered, not at every call.
    /// Names are not looked up here (they may resolve elsewhere later); a URL that does not
    /// parse is for the caller's own check.
    pub fn check_literal(&self, url: &str) -> Result<(), Blocked> {
        match reqwest::Url::parse(url)
            .ok()
            .and_then(|u| u.host().map(|h| h.to_owned()))
        {
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            _ => Ok(()),
        }
    }

    /// Checks what can be checked without a lookup: literal addresses (in any spelling the URL
    /// parser accepts) and `localhost` names. Other names are checked when resolved.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Blocked> {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                let n = name.trim_end_matches('.').to_ascii_lowercase();
                if n == "localhost" || n.ends_with(".localhost") {
                    return Err(Blocked {
                        target: name.to_string(),
                        why: "a localhost name",
                    });
                }
                Ok(())
            }
            None => Err(Blocked {
                target: url.to_string(),
                why: "a URL without a host",
            }),
        }
    }
}

/// A resolver that refuses names resolving to a refused address, and hands the checked
/// addresses to the connector so nothing is looked up twice.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    pub(crate) guard: Arc<Guard>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() {
                return Err(format!("{host} has no address").into());
            }
            for a in &addrs {
                // One refused address refuses the name: no choosing among a rebinding answer.
                guard.check_ip(a.ip()).map_err(|b| Blocked {
                    target: format!("{host} ({})", b.target),
                    why: b.why,
                })?;
            }
            let it: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(it)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use reqwest::dns::Resolve;

    use super::*;

    #[tokio::test]
    async fn the_resolver_refuses_names_that_resolve_to_refused_addresses() {
        let r = GuardedResolver {
            guard: Arc::new(Guard::default()),
        };
        for name in ["127.0.0.1", "::1", "0.0.0.0"] {
            let err = match r.resolve(reqwest::dns::Name::from_str(name).unwrap()).await {
                Err(e) => e,
                Ok(_) => panic!("{name} resolved"),
            };
            let b = err
                .downcast_ref::<Blocked>()
                .unwrap_or_else(|| panic!("{name}: {err}"));
            assert!(b.target.starts_with(name), "{b}");
        }
        let open = GuardedResolver {
            guard: Arc::new(Guard::parse(&["127.0.0.1/32"]).unwrap()),
        };
        let addrs: Vec<SocketAddr> = open
            .resolve(reqwest::dns::Name::from_str("127.0.0.1").unwrap())
            .await
            .unwrap()
            .collect();
        assert_eq!(
            addrs[0].ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            "the checked address is the one connected to"
        );
    }
}
