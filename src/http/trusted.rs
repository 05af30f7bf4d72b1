//! [`TrustedProxies`]: the address ranges whose forwarding headers are believed.
//!
//! `X-Forwarded-For` and `Forwarded` are written by whoever sends the request, so a client
//! that reaches the server directly can claim any address — and get a fresh budget per claim.
//! A hop's claim is only worth something if the hop is one of ours: the reverse proxies and
//! load balancers in front of the service, listed here as CIDR ranges. Parsing is strict and
//! reports a typed [`InvalidProxy`] for anything that is not an address or a range (a typo'd
//! proxy list must fail at start-up, not trust the world).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One address range: `10.0.0.0/8`, `2001:db8::/32`, or a single address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpRange {
    network: IpAddr,
    prefix: u8,
}

impl IpRange {
    /// The range of addresses sharing the first `prefix` bits of `addr` (host bits are
    /// cleared). An IPv4-mapped IPv6 range (`::ffff:10.0.0.2`, `::ffff:10.0.0.0/104`, as a
    /// dual-stack listener logs IPv4 peers) is the IPv4 range it maps (`10.0.0.2/32`,
    /// `10.0.0.0/8`), which is what [`contains`](Self::contains) compares peers with.
    ///
    /// # Errors
    /// [`InvalidProxy::Prefix`] if `prefix` exceeds the address's length (32 or 128).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, InvalidProxy> {
        if prefix > max_prefix(addr) {
            return Err(InvalidProxy::Prefix {
                range: format!("{addr}/{prefix}"),
            });
        }
        let (addr, prefix) = match addr.to_canonical() {
            v4 @ IpAddr::V4(_) if addr.is_ipv6() && prefix >= 96 => (v4, prefix - 96),
            _ => (addr, prefix),
        };
        Ok(IpRange {
            network: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `addr` is in this range. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, as a
    /// dual-stack listener reports IPv4 peers) matches IPv4 ranges.
    pub fn contains(&self, addr: IpAddr) -> bool {
        // An IPv4-mapped IPv6 address as the IPv4 address it is.
        let addr = addr.to_canonical();
        addr.is_ipv4() == self.network.is_ipv4() && mask(addr, self.prefix) == self.network
    }
}

impl FromStr for IpRange {
    type Err = InvalidProxy;

    fn from_str(s: &str) -> Result<Self, InvalidProxy> {
        let s = s.trim();
        let bad = || InvalidProxy::Syntax {
            range: s.to_owned(),
        };
        match s.split_once('/') {
            None => {
                let addr: IpAddr = s.parse().map_err(|_| bad())?;
                IpRange::new(addr, max_prefix(addr))
            }
            Some((addr, prefix)) => {
                let addr: IpAddr = addr.parse().map_err(|_| bad())?;
                // Digits only: `u8::from_str` would also take a leading `+`.
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let prefix = prefix.parse().map_err(|_| InvalidProxy::Prefix {
                    range: s.to_owned(),
                })?;
                IpRange::new(addr, prefix).map_err(|_| InvalidProxy::Prefix {
                    range: s.to_owned(),
                })
            }
        }
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// A proxy list entry that is not an address or a CIDR range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidProxy {
    /// Not of the form `ADDR` or `ADDR/PREFIX`.
    #[error("trusted proxy {range:?} is not an IP address or a CIDR range (like 10.0.0.0/8)")]
    Syntax {
        /// The entry as given.
        range: String,
    },
    /// The prefix is longer than the address (over 32 for IPv4, 128 for IPv6).
    #[error("trusted proxy range {range:?} has a prefix longer than its address")]
    Prefix {
        /// The entry as given.
        range: String,
    },
}

/// Under `?` into the umbrella [`Error`](crate::Error): its
/// [`Config`](crate::Error::Config), this error's text its message.
impl From<InvalidProxy> for crate::Error {
    fn from(e: InvalidProxy) -> Self {
        crate::Error::Config(e.to_string())
    }
}

/// The reverse proxies whose forwarding headers are believed, as address ranges. Empty by
/// default: nobody is trusted, and the peer address is the client. List only your own proxies
/// and load balancers: a trusted hop's claim about the client is taken as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    ranges: Vec<IpRange>,
}

impl TrustedProxies {
    /// Trusts no proxy.
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// Trusts the given addresses and CIDR ranges (`"10.0.0.0/8"`, `"::1"`).
    ///
    /// # Errors
    /// [`InvalidProxy`] for the first entry that does not parse.
    pub fn new<I>(ranges: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let ranges = ranges
            .into_iter()
            .map(|r| r.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { ranges })
    }

    /// Also trusts `range`.
    pub fn with(mut self, range: IpRange) -> Self {
        self.ranges.push(range);
        self
    }

    /// Whether `addr` is a trusted proxy.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(addr))
    }

    /// The trusted ranges.
    pub fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }
}

/// 32 or 128.
fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `addr` with all but its first `prefix` bits cleared (`prefix` at most the address's
/// length).
pub(crate) fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & kept).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & kept).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_match_their_addresses_only() {
        let r: IpRange = "10.1.0.0/16".parse().unwrap();
        assert!(r.contains(ip("10.1.255.3")));
        assert!(!r.contains(ip("10.2.0.1")));
        assert!(r.contains(ip("::ffff:10.1.0.9")), "IPv4-mapped");
        assert!(!r.contains(ip("::1")));
        let one: IpRange = "2001:db8::1".parse().unwrap();
        assert!(one.contains(ip("2001:db8::1")) && !one.contains(ip("2001:db8::2")));
        let all: IpRange = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.7")));
        // Host bits are cleared, so the range prints as its network.
        assert_eq!(
            "10.1.2.3/16".parse::<IpRange>().unwrap().to_string(),
            "10.1.0.0/16"
        );
    }

    /// A proxy written as an IPv4-mapped IPv6 address is trusted as the IPv4 address it is:
    /// as an IPv6 range it matched no peer (peers are compared as IPv4), and every client
    /// was keyed by that proxy's address.
    #[test]
    fn ipv4_mapped_ranges_are_their_ipv4_ranges() {
        let one: IpRange = "::ffff:10.0.0.2".parse().unwrap();
        assert_eq!(one.to_string(), "10.0.0.2/32");
        assert!(one.contains(ip("10.0.0.2")) && one.contains(ip("::ffff:10.0.0.2")));
        assert!(!one.contains(ip("10.0.0.3")));
        let net: IpRange = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.9.8.7")) && !net.contains(ip("11.0.0.1")));
        // Shorter than the mapped prefix: an IPv6 range as written.
        let wide: IpRange = "::ffff:0:0/80".parse().unwrap();
        assert_eq!(wide.to_string(), "::/80");
    }

    #[test]
    fn bad_entries_are_typed_errors() {
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0/8",
            "proxy.local",
            "1.2.3.4/x",
        ] {
            assert!(
                matches!(bad.parse::<IpRange>(), Err(InvalidProxy::Syntax { .. })),
                "{bad:?}"
            );
        }
        for bad in ["10.0.0.0/33", "::/129", "1.2.3.4/300"] {
            assert!(
                matches!(bad.parse::<IpRange>(), Err(InvalidProxy::Prefix { .. })),
                "{bad:?}"
            );
        }
        let err = TrustedProxies::new(["10.0.0.0/8", "nope"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "trusted proxy \"nope\" is not an IP address or a CIDR range (like 10.0.0.0/8)"
        );
    }
}
