//! [`ForwardedIp`]: the client's address behind trusted reverse proxies.
//!
//! Each proxy appends the address it received the request from to `X-Forwarded-For` (or adds
//! a `for=` element to RFC 7239 `Forwarded`), so the header reads
//! `client, proxy1, proxy2` and the peer is the last proxy. Anyone can write the left part, so
//! the header is read **from the right**: starting at the peer, each hop that is a
//! [trusted proxy](TrustedProxies) vouches for the address it appended; the first address not
//! vouched for — an untrusted hop — is the client. Leftmost-first parsing (take the first
//! address) lets any client pick its own key; this never does. An entry that does not parse
//! (`unknown`, an obfuscated identifier, garbage) ends the walk at the hop that wrote it: the
//! last address we could trust to have seen the client.
//!
//! Only one header is read — the one the proxies are configured to write — since a client can
//! add the other one unchecked.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderMap, HeaderName, FORWARDED};
use http::Request;

use super::key::{peer_addr, KeyError, KeyExtractor, PeerIp};
use super::trusted::TrustedProxies;

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which forwarding header the proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// Keys requests by the client address found behind [`TrustedProxies`]. Without trusted
/// proxies it is [`PeerIp`].
///
/// Each proxy appends the address it received the request from, so the header reads
/// `client, proxy1, proxy2` and the peer is the last proxy; anyone can write the left part.
/// The header is therefore read **from the right**: starting at the peer, each trusted hop
/// vouches for the address it appended, and the first address not vouched for is the client.
/// An entry that does not parse (`unknown`, an obfuscated name) ends the walk at the hop that
/// wrote it. Only the one header the proxies write is read ([`ForwardedHeader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedIp {
    trusted: TrustedProxies,
    header: ForwardedHeader,
    peer: PeerIp,
}

impl ForwardedIp {
    /// Believes forwarding headers added by `trusted` (read from `X-Forwarded-For`).
    pub fn new(trusted: TrustedProxies) -> Self {
        ForwardedIp {
            trusted,
            header: ForwardedHeader::default(),
            peer: PeerIp::new(),
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their first `bits` bits, as [`PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.peer = self.peer.ipv6_prefix(bits);
        self
    }

    /// The client address of a request from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusted.contains(peer) {
            return peer;
        }
        let mut client = peer;
        let mut walk = |hop: Option<IpAddr>| -> bool {
            match hop {
                Some(addr) => {
                    client = addr;
                    self.trusted.contains(addr)
                }
                // Unparseable: the hop that wrote it is as far as we can see.
                None => false,
            }
        };
        // Header lines in reverse order, and entries within each in reverse order.
        let name = match self.header {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &FORWARDED,
        };
        // Split as bytes: an element that is not UTF-8 (a client may send any byte above
        // 0x7F, and proxies append to its line) is one unparseable hop, not a line skipped
        // whole — which would key the client by the proxy it came through.
        'lines: for line in headers.get_all(name).iter().rev() {
            for element in line.as_bytes().rsplit(|&b| b == b',') {
                let element = std::str::from_utf8(element).ok();
                let hop = element.and_then(|element| match self.header {
                    ForwardedHeader::XForwardedFor => parse_addr(element.trim()),
                    ForwardedHeader::Forwarded => forwarded_for(element),
                });
                if !walk(hop) {
                    break 'lines;
                }
            }
        }
        client
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;
    type Borrowed = IpAddr;

    fn extract<'r, B>(&self, request: &'r Request<B>) -> Result<Cow<'r, IpAddr>, KeyError> {
        let peer = peer_addr(request.extensions()).ok_or(KeyError::NoPeerAddr)?;
        let client = self.client(peer, request.headers());
        Ok(Cow::Owned(self.peer.key_of(client)))
    }
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]:4711`, `"[2001:db8::1]"`.
fn parse_addr(s: &str) -> Option<IpAddr> {
    let s = s.trim_matches('"');
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Some(addr);
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    // `[v6]` without a port.
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// The `for=` address of one `Forwarded` element (`for=192.0.2.60;proto=http;by=…`); `None`
/// if it has none or it is not an address (`unknown`, `_hidden`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            parse_addr(value.trim())
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &HeaderName, lines: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(name, line.parse().unwrap());
        }
        map
    }

    fn behind(proxies: &[&str]) -> ForwardedIp {
        ForwardedIp::new(TrustedProxies::new(proxies).unwrap())
    }

    /// A client's entry that is not UTF-8 ends the walk at the hop that appended to it, as
    /// any unparseable entry does; it used to end it before the line's first entry, keying the
    /// client by the proxy it came through.
    #[test]
    fn an_entry_that_is_not_utf8_is_one_unparseable_hop() {
        let lb = ip("10.0.0.2");
        for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
            let (name, line): (_, &[u8]) = match header {
                ForwardedHeader::XForwardedFor => (&X_FORWARDED_FOR, b"\xff, 198.51.100.1"),
                ForwardedHeader::Forwarded => (&FORWARDED, b"for=\xff, for=198.51.100.1"),
            };
            let mut map = HeaderMap::new();
            map.append(name, http::HeaderValue::from_bytes(line).unwrap());
            let f = behind(&["10.0.0.0/8"]).header(header);
            assert_eq!(f.client(lb, &map), ip("198.51.100.1"), "{name}");
        }
    }

    #[test]
    fn x_forwarded_for_is_read_from_the_right_through_trusted_hops() {
        let xff = |lines: &[&str]| headers(&X_FORWARDED_FOR, lines);
        let lb = ip("10.0.0.2");
        let f = behind(&["10.0.0.0/8"]);
        // The spoofed leftmost entry is not taken: 198.51.100.9 reached our first proxy.
        assert_eq!(
            f.client(lb, &xff(&["1.2.3.4, 198.51.100.9, 10.0.0.7"])),
            ip("198.51.100.9")
        );
        // Several lines are one list, in order.
        assert_eq!(
            f.client(lb, &xff(&["1.2.3.4", "198.51.100.9:5555"])),
            ip("198.51.100.9")
        );
        // An untrusted peer's header is ignored.
        assert_eq!(
            f.client(ip("203.0.113.1"), &xff(&["1.2.3.4"])),
            ip("203.0.113.1")
        );
        // No header: the peer. All hops trusted: the leftmost.
        assert_eq!(f.client(lb, &HeaderMap::new()), lb);
        assert_eq!(f.client(lb, &xff(&["10.9.9.9, 10.0.0.7"])), ip("10.9.9.9"));
        // Garbage stops the walk at the hop that wrote it.
        assert_eq!(
            f.client(lb, &xff(&["1.2.3.4, bogus, 10.0.0.7"])),
            ip("10.0.0.7")
        );
        // No trusted proxies: always the peer.
        assert_eq!(behind(&[]).client(lb, &xff(&["1.2.3.4"])), lb);
    }

    #[test]
    fn forwarded_elements_give_their_for_address() {
        let fwd = |lines: &[&str]| headers(&FORWARDED, lines);
        let f = behind(&["10.0.0.0/8"]).header(ForwardedHeader::Forwarded);
        let lb = ip("10.0.0.2");
        let line = r#"for=1.2.3.4, for="[2001:db8::7]:4711";proto=https, for=10.0.0.5;by=10.0.0.2"#;
        assert_eq!(f.client(lb, &fwd(&[line])), ip("2001:db8::7"));
        assert_eq!(
            f.client(lb, &fwd(&["for=unknown, For=10.0.0.5"])),
            ip("10.0.0.5")
        );
        // The other header is not read.
        let xff = headers(&X_FORWARDED_FOR, &["1.2.3.4"]);
        assert_eq!(f.client(lb, &xff), lb);
    }

    #[test]
    fn the_extractor_needs_a_peer_and_masks_the_client() {
        let f = behind(&["::1"]).ipv6_prefix(64);
        let mut req = Request::get("/")
            .header("x-forwarded-for", "2001:db8:1:2:aaaa::1")
            .body(())
            .unwrap();
        assert_eq!(f.extract(&req), Err(KeyError::NoPeerAddr));
        req.extensions_mut()
            .insert("[::1]:9000".parse::<SocketAddr>().unwrap());
        assert_eq!(*f.extract(&req).unwrap(), ip("2001:db8:1:2::"));
    }
}
