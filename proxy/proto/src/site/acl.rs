//! The data-center ACL: only traffic between the local and the remote
//! prefixes crosses the gateway.

use std::net::IpAddr;

use soya_config::Prefix;

use crate::roce::IpHeader;

/// Why a packet was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Not an IPv4/IPv6 packet whose lengths agree with the buffer.
    Malformed,
    /// Source outside the prefixes it must come from.
    BadSource,
    /// Destination outside the prefixes it must go to.
    BadDestination,
}

#[derive(Clone, Debug)]
pub struct Acl {
    pub local: Vec<Prefix>,
    pub remote: Vec<Prefix>,
}

/// Source and destination of an IP packet (lengths checked).
pub fn addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    let s = IpHeader::split(packet).ok()?;
    Some((s.header.src(), s.header.dst()))
}

fn within(prefixes: &[Prefix], ip: IpAddr) -> bool {
    prefixes.iter().any(|p| p.contains(ip))
}

impl Acl {
    /// A packet from the local DC toward the twin site.
    pub fn outbound(&self, packet: &[u8]) -> (Verdict, Option<(IpAddr, IpAddr)>) {
        self.check(packet, &self.local, &self.remote)
    }

    /// A packet from the twin site toward the local DC.
    pub fn inbound(&self, packet: &[u8]) -> (Verdict, Option<(IpAddr, IpAddr)>) {
        self.check(packet, &self.remote, &self.local)
    }

    /// Whether `ip` is a local host.
    pub fn is_local(&self, ip: IpAddr) -> bool {
        within(&self.local, ip)
    }

    fn check(
        &self,
        packet: &[u8],
        from: &[Prefix],
        to: &[Prefix],
    ) -> (Verdict, Option<(IpAddr, IpAddr)>) {
        let Some((src, dst)) = addresses(packet) else {
            return (Verdict::Malformed, None);
        };
        let v = if !within(from, src) {
            Verdict::BadSource
        } else if !within(to, dst) {
            Verdict::BadDestination
        } else {
            Verdict::Pass
        };
        (v, Some((src, dst)))
    }

    /// Which twin decides the WAN key directions (`is_client`). There is no
    /// configuration key for it: the twin whose lowest local prefix sorts
    /// below its lowest remote prefix is the client. The twins' prefix lists
    /// mirror each other (the ACL needs that anyway), so exactly one of them
    /// is the client, whatever their WAN addresses (NAT, wildcard binds).
    pub fn is_client(&self) -> bool {
        let key = |p: &Prefix| (p.addr.is_ipv6(), p.addr, p.len);
        let l = self.local.iter().map(key).min();
        let r = self.remote.iter().map(key).min();
        l < r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(local: &str, remote: &str) -> Acl {
        Acl {
            local: vec![local.parse().unwrap()],
            remote: vec![remote.parse().unwrap()],
        }
    }

    fn v4(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&20u16.to_be_bytes());
        p[9] = 1;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p
    }

    #[test]
    fn verdicts() {
        let a = acl("10.1.0.0/16", "10.2.0.0/16");
        // (outbound: from this site's DC toward the twin's, source, destination)
        for (outbound, src, dst, want) in [
            (true, [10, 1, 0, 1], [10, 2, 0, 1], Verdict::Pass),
            (true, [10, 3, 0, 1], [10, 2, 0, 1], Verdict::BadSource),
            (true, [10, 1, 0, 1], [10, 1, 0, 2], Verdict::BadDestination),
            (false, [10, 2, 0, 1], [10, 1, 0, 1], Verdict::Pass),
        ] {
            let p = v4(src, dst);
            let got = if outbound {
                a.outbound(&p)
            } else {
                a.inbound(&p)
            };
            assert_eq!(got.0, want, "{src:?} -> {dst:?}");
        }
        assert_eq!(a.outbound(&[0x45, 0, 0]).0, Verdict::Malformed);
    }

    #[test]
    fn exactly_one_twin_is_client() {
        let a = acl("10.1.0.0/16", "10.2.0.0/16");
        let b = acl("10.2.0.0/16", "10.1.0.0/16");
        assert!(a.is_client() != b.is_client());
    }
}
