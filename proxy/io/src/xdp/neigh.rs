//! Ethernet headers toward local hosts, from the kernel's own tables read
//! over rtnetlink (`netlink-packet-route`): the route to the host on our
//! interface (its gateway, if any, is the next hop), then the next hop's
//! entry in the neighbour table. No ARP or ND of our own: when the kernel
//! has no entry yet, it is asked to resolve one (RTM_NEWNEIGH with
//! NTF_USE, which makes it send the ARP request / neighbour solicitation
//! itself) and the backend holds the packet meanwhile (`XdpDc::send`).
//!
//! The kernel never sees the packets we send with these headers, so it
//! would take the entries for unused: past `gc_thresh1` entries (128 by
//! default: a GPU cluster has more hosts) the periodic collection removes
//! an entry unused for `gc_stale_time` (60 s), and every host we serve
//! would lose its entry once a minute (a drop, then a resolution). So the
//! next hops we sent to are marked *in use* every [`MAX_AGE`], with the
//! same request (NTF_USE), as the kernel's own sends would: that also
//! has the kernel re-confirm an entry gone stale (a unicast probe).

use soya_proto::keyed::KeyedMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The tables are read again at most this often on misses.
const REFRESH_MIN: Duration = Duration::from_millis(20);
/// Known entries are re-read after this long (a host's MAC may change),
/// and the hops used are marked in use as often.
pub const MAX_AGE: Duration = Duration::from_secs(5);
const RT_TABLE_MAIN: u32 = 254;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Route {
    dst: IpAddr,
    len: u8,
    gateway: Option<IpAddr>,
}

/// A cached header, and whether a packet was sent with it since the
/// hops were last marked in use.
#[derive(Clone, Copy)]
struct Cached {
    eth: [u8; 14],
    used: bool,
}

/// Ethernet headers toward local hosts on one interface.
pub struct Neighbours {
    sock: Socket,
    ifindex: u32,
    own_mac: [u8; 6],
    routes: Vec<Route>,
    /// Next hop → its MAC. (Keyed tables, `soya_proto::keyed`: `headers` is looked
    /// up for every packet sent toward a host, by an address from the DC.)
    macs: KeyedMap<IpAddr, [u8; 6]>,
    /// Destination host → Ethernet header (cache of the two lookups).
    headers: KeyedMap<IpAddr, Cached>,
    read_at: Option<Instant>,
    /// When the hops used were last marked in use.
    kept_at: Option<Instant>,
    asked: KeyedMap<IpAddr, Instant>,
    seq: u32,
    /// Packets dropped for want of a neighbour entry.
    pub misses: u64,
}

impl std::fmt::Debug for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbours")
            .field("ifindex", &self.ifindex)
            .field("entries", &self.macs.len())
            .finish()
    }
}

impl Neighbours {
    pub fn new(ifname: &str, ifindex: u32) -> io::Result<Neighbours> {
        let mac_text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))?;
        let own_mac = parse_mac(mac_text.trim()).ok_or_else(|| {
            io::Error::other(format!("{ifname} has no Ethernet address ({mac_text:?})"))
        })?;
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Neighbours {
            sock,
            ifindex,
            own_mac,
            routes: Vec::new(),
            macs: KeyedMap::default(),
            headers: KeyedMap::default(),
            read_at: None,
            kept_at: None,
            asked: KeyedMap::default(),
            seq: 0,
            misses: 0,
        })
    }

    /// The Ethernet header of a packet to `dst` (IPv4 or IPv6 ethertype by
    /// its family); `None` (counted) when the kernel has no entry yet.
    pub fn header(&mut self, dst: IpAddr, now: Instant) -> Option<[u8; 14]> {
        if self
            .kept_at
            .is_none_or(|t| now.duration_since(t) >= MAX_AGE)
        {
            self.kept_at = Some(now);
            self.keep_in_use();
        }
        let stale = self
            .read_at
            .is_none_or(|t| now.duration_since(t) >= MAX_AGE);
        if !stale {
            if let Some(c) = self.headers.get_mut(&dst) {
                c.used = true;
                return Some(c.eth);
            }
        }
        if stale
            || self
                .read_at
                .is_none_or(|t| now.duration_since(t) >= REFRESH_MIN)
        {
            if let Err(e) = self.refresh() {
                tracing::debug!(error = %e, "xdp: reading the neighbour table failed");
            }
            self.read_at = Some(now);
            if let Some(h) = self.learn(dst) {
                return Some(h);
            }
        }
        self.misses += 1;
        let hop = self.next_hop(dst);
        if self
            .asked
            .get(&hop)
            .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.asked.insert(hop, now);
            if let Err(e) = self.resolve(hop) {
                tracing::debug!(host = %hop, error = %e, "xdp: asking the kernel to resolve failed");
            }
        }
        None
    }

    /// The next hop toward `dst`: the gateway of the longest matching
    /// route on our interface, else `dst` itself (on-link).
    fn next_hop(&self, dst: IpAddr) -> IpAddr {
        self.routes
            .iter()
            .filter(|r| contains(r.dst, r.len, dst))
            .max_by_key(|r| r.len)
            .and_then(|r| r.gateway)
            .unwrap_or(dst)
    }

    fn header_for(&self, dst: IpAddr) -> Option<[u8; 14]> {
        let mac = self.macs.get(&self.next_hop(dst))?;
        let mut h = [0u8; 14];
        h[..6].copy_from_slice(mac);
        h[6..12].copy_from_slice(&self.own_mac);
        let ethertype: u16 = if dst.is_ipv4() { 0x0800 } else { 0x86dd };
        h[12..].copy_from_slice(&ethertype.to_be_bytes());
        Some(h)
    }

    fn refresh(&mut self) -> io::Result<()> {
        let mut routes = Vec::new();
        let ifindex = self.ifindex;
        self.dump(
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            |m| {
                let RouteNetlinkMessage::NewRoute(r) = m else {
                    return;
                };
                let mut table = u32::from(r.header.table);
                let (mut dst, mut gateway, mut oif) = (None, None, None);
                for a in &r.attributes {
                    match a {
                        RouteAttribute::Table(t) => table = *t,
                        RouteAttribute::Destination(d) => dst = route_ip(d),
                        RouteAttribute::Gateway(g) => gateway = route_ip(g),
                        RouteAttribute::Oif(o) => oif = Some(*o),
                        _ => {}
                    }
                }
                if table != RT_TABLE_MAIN || oif != Some(ifindex) {
                    return;
                }
                let dst = dst.unwrap_or(match r.header.address_family {
                    AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                    _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                });
                routes.push(Route {
                    dst,
                    len: r.header.destination_prefix_length,
                    gateway,
                });
            },
        )?;
        let mut macs = KeyedMap::with_hasher(self.macs.hasher().clone());
        self.dump(
            RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()),
            |m| {
                let RouteNetlinkMessage::NewNeighbour(n) = m else {
                    return;
                };
                if n.header.ifindex != ifindex
                    || matches!(
                        n.header.state,
                        NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None
                    )
                {
                    return;
                }
                let (mut ip, mut mac) = (None, None);
                for a in &n.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                            ip = Some(IpAddr::V4(*v4))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                            ip = Some(IpAddr::V6(*v6))
                        }
                        NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => {
                            mac = Some([l[0], l[1], l[2], l[3], l[4], l[5]])
                        }
                        _ => {}
                    }
                }
                if let (Some(ip), Some(mac)) = (ip, mac) {
                    macs.insert(ip, mac);
                }
            },
        )?;
        self.routes = routes;
        self.macs = macs;
        let old: Vec<(IpAddr, bool)> = self.headers.iter().map(|(d, c)| (*d, c.used)).collect();
        self.headers.clear();
        for (d, used) in old {
            if let Some(eth) = self.header_for(d) {
                self.headers.insert(d, Cached { eth, used });
            }
        }
        Ok(())
    }

    /// Caches the header of `dst` if its next hop is known now.
    pub fn learn(&mut self, dst: IpAddr) -> Option<[u8; 14]> {
        let eth = self.header_for(dst)?;
        self.headers.insert(dst, Cached { eth, used: true });
        Some(eth)
    }

    /// Tells the kernel that the next hops of the hosts we sent to since
    /// the last call are in use (see the module documentation).
    fn keep_in_use(&mut self) {
        let mut hops: Vec<IpAddr> = Vec::new();
        for (dst, c) in self.headers.iter_mut() {
            if std::mem::take(&mut c.used) {
                hops.push(*dst);
            }
        }
        for h in &mut hops {
            *h = self.next_hop(*h);
        }
        hops.sort_unstable();
        hops.dedup();
        for hop in hops {
            if let Err(e) = self.resolve(hop) {
                tracing::debug!(host = %hop, error = %e, "xdp: marking a neighbour in use failed");
            }
        }
    }

    /// Asks the kernel to resolve `hop` on our interface (NTF_USE: it
    /// creates the entry and sends the ARP request / solicitation), or,
    /// for an entry it has, marks it used (re-confirming a stale one).
    fn resolve(&mut self, hop: IpAddr) -> io::Result<()> {
        let mut m = NeighbourMessage::default();
        m.header.family = if hop.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        m.header.ifindex = self.ifindex;
        m.header.flags = NeighbourFlags::Use;
        m.attributes
            .push(NeighbourAttribute::Destination(match hop {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        let mut hdr = NetlinkHeader::default();
        hdr.flags = NLM_F_REQUEST | NLM_F_CREATE;
        self.send(hdr, RouteNetlinkMessage::NewNeighbour(m))
    }

    fn send(&mut self, mut hdr: NetlinkHeader, msg: RouteNetlinkMessage) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        hdr.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(hdr, NetlinkPayload::from(msg));
        req.finalize();
        let mut buf = vec![0; req.header.length as usize];
        req.serialize(&mut buf[..]);
        self.sock.send(&buf, 0)?;
        Ok(())
    }

    /// Sends a dump request and calls `f` on every answer until Done.
    fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
        mut f: impl FnMut(&RouteNetlinkMessage),
    ) -> io::Result<()> {
        let mut hdr = NetlinkHeader::default();
        hdr.flags = NLM_F_REQUEST | NLM_F_DUMP;
        self.send(hdr, msg)?;
        let seq = self.seq;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = self.sock.recv(&mut &mut buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg: NetlinkMessage<RouteNetlinkMessage> =
                    NetlinkMessage::deserialize(&buf[off..n])
                        .map_err(|e| io::Error::other(format!("netlink: {e}")))?;
                let len = msg.header.length as usize;
                // Answers to an earlier, unacknowledged request: skip.
                if msg.header.sequence_number == seq {
                    match msg.payload {
                        NetlinkPayload::Done(_) => return Ok(()),
                        NetlinkPayload::Error(e) => {
                            return Err(io::Error::other(format!("netlink: {e:?}")))
                        }
                        NetlinkPayload::InnerMessage(m) => f(&m),
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += len;
            }
        }
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_matching_and_macs() {
        // (route, prefix length, address, inside)
        for (net, len, addr, inside) in [
            ("10.1.0.0", 16, "10.1.2.3", true),
            ("10.1.0.0", 16, "10.2.0.1", false),
            ("0.0.0.0", 0, "10.2.0.1", true),
            ("fd00:1::", 48, "fd00:1::5", true),
            ("fd00:1::", 48, "10.1.0.1", false),
        ] {
            assert_eq!(
                contains(net.parse().unwrap(), len, addr.parse().unwrap()),
                inside,
                "{addr} in {net}/{len}"
            );
        }
        assert_eq!(parse_mac("02:00:0a:01:00:ff"), Some([2, 0, 10, 1, 0, 255]));
        assert_eq!(parse_mac("02:00:0a:01:00"), None);
    }
}
