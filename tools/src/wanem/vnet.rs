//! TUN packets with a virtio-net header (`IFF_VNET_HDR`): UDP
//! segmentation offload in both directions, so the relay moves a run of
//! datagrams in one `read()` or one `write()` instead of one each.
//!
//! Why: a profile of `soya demo`'s relay (tun, 2 Gb/s, 300 km) put 63 % of
//! its CPU in the per-packet `read()` and `write()` on the devices. Senders
//! such as the gateways write runs of equal-size datagrams with UDP GSO;
//! a device that advertises USO receives such a run whole (one read), and
//! a run written back as one GSO packet is one write (and a receiver with
//! UDP GRO gets it whole).
//!
//! The emulation stays per datagram: a GSO packet read is cut here into its
//! datagrams ([`Splitter`]), each impaired on its own (own release time,
//! own loss draw, the rate counted on its IP length); only datagrams that
//! leave together (one `send` of the engine: due within the slack, in
//! order) and would have been one GSO packet are joined again ([`run_len`],
//! [`gso_header`]): same addresses, ports and IP header, IPv4 IDs that
//! already count up (DF or not: the kernel renumbers them), equal payloads
//! but a shorter last. Everything else is written as
//! read, header included.
//!
//! Checksums: with `TUN_F_CSUM` the kernel hands over UDP/TCP packets whose
//! checksum is left to "hardware" (`VIRTIO_NET_HDR_F_NEEDS_CSUM`, the field
//! seeded with the pseudo-header sum); they are written back with the same
//! header, so the kernel finishes them if they leave a real NIC.

/// Bytes of `struct virtio_net_hdr` (the tun default).
pub const HDR: usize = 10;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_UDP_L4: u8 = 5;
/// The kernel's UDP_MAX_SEGMENTS.
const MAX_SEGMENTS: usize = 64;
const UDP: u8 = 17;

/// A parsed virtio-net header (tun: native byte order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> VnetHdr {
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// Where the headers of a UDP packet (IP header first) end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Udp {
    v4: bool,
    /// IP header bytes (the UDP header follows).
    ip_len: usize,
}

impl Udp {
    fn of(ip: &[u8]) -> Option<Udp> {
        let u = match ip.first()? >> 4 {
            4 => {
                let ip_len = usize::from(ip[0] & 0xf) * 4;
                // Not a fragment (MF clear, offset 0), UDP.
                let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff;
                (ip_len >= 20 && frag == 0 && *ip.get(9)? == UDP)
                    .then_some(Udp { v4: true, ip_len })
            }
            // No extension headers: UDP right after the fixed header.
            6 => (*ip.get(6)? == UDP).then_some(Udp {
                v4: false,
                ip_len: 40,
            }),
            _ => None,
        }?;
        (ip.len() >= u.l4_end()).then_some(u)
    }

    fn l4_end(&self) -> usize {
        self.ip_len + 8
    }

    /// Sets the lengths (IP and UDP) of a packet of `payload` UDP payload
    /// bytes, its IPv4 ID and header checksum, and seeds its UDP checksum
    /// with the pseudo-header sum for the device to finish.
    fn set_lengths(&self, ip: &mut [u8], payload: usize, id: Option<u16>) {
        let udp_len = 8 + payload;
        let h = self.ip_len;
        if self.v4 {
            ip[2..4].copy_from_slice(&((h + udp_len) as u16).to_be_bytes());
            if let Some(id) = id {
                ip[4..6].copy_from_slice(&id.to_be_bytes());
            }
            ip[10..12].copy_from_slice(&[0, 0]);
            let c = !fold(sum16(&ip[..h]));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        } else {
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        }
        ip[h + 4..h + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        let addrs = if self.v4 { &ip[12..20] } else { &ip[8..40] };
        let pseudo = sum16(addrs) + u64::from(UDP) + udp_len as u64;
        ip[h + 6..h + 8].copy_from_slice(&fold(pseudo).to_be_bytes());
    }

    fn csum_hdr(&self) -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            hdr_len: self.l4_end() as u16,
            gso_size: 0,
            csum_start: self.ip_len as u16,
            csum_offset: 6,
        }
    }
}

/// Sum of big-endian 16-bit words (an odd last byte padded with zero).
fn sum16(b: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut it = b.chunks_exact(2);
    for w in &mut it {
        s += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [x] = it.remainder() {
        s += u64::from(*x) << 8;
    }
    s
}

fn fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// A UDP GSO packet read from the device (header included), cut into its
/// datagrams one at a time, each with a header of its own.
pub struct Splitter {
    udp: Udp,
    gso: usize,
    /// Offset (from the IP header) of the next datagram's payload.
    next: usize,
    /// Its index (IPv4 IDs count up from the GSO packet's).
    k: u16,
}

impl Splitter {
    /// The splitter of `pkt` (virtio header + IP packet) if it is a UDP
    /// GSO packet this module can cut; `None` if it is not one at all.
    /// `Some(Err(()))`: a GSO packet of a kind it cannot cut (not UDP, IP
    /// extension headers, no segment size).
    pub fn of(pkt: &[u8]) -> Option<Result<Splitter, ()>> {
        let h = VnetHdr::parse(pkt);
        if h.gso_type == GSO_NONE {
            return None;
        }
        let ip = &pkt[HDR..];
        Some(match Udp::of(ip) {
            Some(udp) if h.gso_type & 0x7f == GSO_UDP_L4 && h.gso_size > 0 => Ok(Splitter {
                udp,
                gso: usize::from(h.gso_size),
                next: udp.l4_end(),
                k: 0,
            }),
            _ => Err(()),
        })
    }

    /// Writes the next datagram of `pkt` (the packet given to [`Self::of`])
    /// into `out` (virtio header + IP packet); its length, or `None` when
    /// every datagram has been cut or `out` is too short (the rest is
    /// then lost, as the caller counts).
    pub fn next_into(&mut self, pkt: &[u8], out: &mut [u8]) -> Option<usize> {
        let ip = &pkt[HDR..];
        if self.next >= ip.len() {
            return None;
        }
        let l = self.gso.min(ip.len() - self.next);
        let hl = self.udp.l4_end();
        let total = HDR + hl + l;
        if out.len() < total {
            self.next = ip.len();
            return None;
        }
        self.udp.csum_hdr().write(out);
        out[HDR..HDR + hl].copy_from_slice(&ip[..hl]);
        out[HDR + hl..total].copy_from_slice(&ip[self.next..self.next + l]);
        let id = self
            .udp
            .v4
            .then(|| u16::from_be_bytes([ip[4], ip[5]]).wrapping_add(self.k));
        self.udp.set_lengths(&mut out[HDR..total], l, id);
        self.next += l;
        self.k += 1;
        Some(total)
    }

    /// Datagrams not cut yet.
    pub fn left(&self, pkt: &[u8]) -> usize {
        (pkt.len() - HDR)
            .saturating_sub(self.next)
            .div_ceil(self.gso)
    }
}

/// How many of `pkts` (virtio header + IP packet each), from the first,
/// may leave as one UDP GSO packet: 1 if the first cannot lead one.
pub fn run_len(pkts: &[&[u8]]) -> usize {
    let Some(first) = pkts.first() else { return 0 };
    let Some(udp) = csum_udp(first) else { return 1 };
    let ip0 = &first[HDR..];
    let hl = udp.l4_end();
    let seg = ip0.len() - hl;
    if seg == 0 {
        return 1;
    }
    let id0 = u16::from_be_bytes([ip0[4], ip0[5]]);
    let mut total = ip0.len();
    let mut n = 1;
    for p in &pkts[1..] {
        if n == MAX_SEGMENTS {
            break;
        }
        let ip = &p[HDR..];
        let l = ip.len().saturating_sub(hl);
        if csum_udp(p) != Some(udp) || l == 0 || l > seg || total + l > 0xffff {
            break;
        }
        if !same_flow(udp, ip0, ip) {
            break;
        }
        // The kernel numbers a GSO packet's datagrams from its ID up, DF or
        // not. So only datagrams whose IDs already count up are joined: an
        // emulated link must hand over the bytes it was given. RFC 6864
        // lets an atomic datagram's ID (DF set) be anything, but RoCEv2's
        // ICRC covers it: a RoCE socket sending with DF and no connection
        // puts 0 in every ID, and renumbered they would fail the
        // responder's ICRC check (every one but the first of a run).
        if udp.v4 && u16::from_be_bytes([ip[4], ip[5]]) != id0.wrapping_add(n as u16) {
            break;
        }
        total += l;
        n += 1;
        if l < seg {
            // Only the last may be shorter.
            break;
        }
    }
    n
}

/// The UDP layout of `p` if it is a plain datagram (not GSO) whose
/// checksum is left to the device, as `TUN_F_CSUM` hands them over.
fn csum_udp(p: &[u8]) -> Option<Udp> {
    if p.len() < HDR {
        return None;
    }
    let h = VnetHdr::parse(p);
    let udp = Udp::of(&p[HDR..])?;
    (h.gso_type == GSO_NONE
        && h.flags == F_NEEDS_CSUM
        && h.csum_start == udp.ip_len as u16
        && h.csum_offset == 6)
        .then_some(udp)
}

/// Whether `ip` has `ip0`'s IP header (but for lengths, ID and header
/// checksum) and ports.
fn same_flow(udp: Udp, ip0: &[u8], ip: &[u8]) -> bool {
    let h = udp.ip_len;
    let ports = ip0[h..h + 4] == ip[h..h + 4];
    ports
        && if udp.v4 {
            ip0[..2] == ip[..2] && ip0[6..10] == ip[6..10] && ip0[12..h] == ip[12..h]
        } else {
            ip0[..4] == ip[..4] && ip0[6..40] == ip[6..40]
        }
}

/// The headers (virtio + IP + UDP) of the GSO packet that carries `pkts`
/// (a run found by [`run_len`], more than one) into `out`; its length.
/// The payloads follow, each `pkts[i][HDR + ip + 8..]`.
pub fn gso_header(pkts: &[&[u8]], out: &mut [u8]) -> usize {
    let first = pkts[0];
    let udp = csum_udp(first).expect("a run leads with a datagram");
    let hl = udp.l4_end();
    let seg = first.len() - HDR - hl;
    let payload: usize = pkts.iter().map(|p| p.len() - HDR - hl).sum();
    VnetHdr {
        gso_type: GSO_UDP_L4,
        gso_size: seg as u16,
        ..udp.csum_hdr()
    }
    .write(out);
    out[HDR..HDR + hl].copy_from_slice(&first[HDR..HDR + hl]);
    udp.set_lengths(&mut out[HDR..HDR + hl], payload, None);
    HDR + hl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP datagram as the device hands it over with TUN_F_CSUM.
    fn dgram(v4: bool, id: u16, payload: &[u8]) -> Vec<u8> {
        let mut ip = if v4 {
            let mut h = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, UDP, 0, 0];
            h.extend([10, 0, 0, 1, 10, 0, 0, 2]);
            h
        } else {
            let mut h = vec![0x60, 0, 0, 0, 0, 0, UDP, 64];
            h.extend((0..32).map(|i| i as u8));
            h
        };
        ip.extend([0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0]);
        ip.extend(payload);
        let u = Udp::of(&ip).unwrap();
        let n = ip.len();
        u.set_lengths(&mut ip[..n], payload.len(), Some(id));
        let mut p = vec![0; HDR];
        u.csum_hdr().write(&mut p);
        p.extend(ip);
        p
    }

    /// A full checksum over a datagram whose field holds the pseudo sum,
    /// as the device computes it: what a receiver verifies.
    fn finish(p: &[u8]) -> Vec<u8> {
        let mut ip = p[HDR..].to_vec();
        let u = Udp::of(&ip).unwrap();
        let h = u.ip_len;
        let c = !fold(sum16(&ip[h..]));
        ip[h + 6..h + 8].copy_from_slice(&c.to_be_bytes());
        ip
    }

    fn valid(ip: &[u8]) -> bool {
        let u = Udp::of(ip).unwrap();
        let h = u.ip_len;
        let addrs = if u.v4 { &ip[12..20] } else { &ip[8..40] };
        let len = ip.len() - h;
        let ip_ok = !u.v4 || fold(sum16(&ip[..h])) == 0xffff;
        ip_ok && fold(sum16(addrs) + u64::from(UDP) + len as u64 + sum16(&ip[h..])) == 0xffff
    }

    fn payloads(n: usize, seg: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let l = if i + 1 == n { last } else { seg };
                (0..l).map(|j| (i * 31 + j * 7) as u8).collect()
            })
            .collect()
    }

    /// The datagrams of a run, joined as one GSO packet (headers +
    /// payloads) then cut again, are the datagrams themselves, with valid
    /// checksums once the device finishes them.
    #[test]
    fn a_run_joined_then_cut_gives_back_its_datagrams() {
        for v4 in [true, false] {
            let ps = payloads(5, 1_200, 333);
            let pkts: Vec<Vec<u8>> = ps
                .iter()
                .enumerate()
                .map(|(i, p)| dgram(v4, 700 + i as u16, p))
                .collect();
            let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
            assert_eq!(run_len(&refs), 5, "v4 {v4}");
            let mut gso = vec![0u8; 128];
            let n = gso_header(&refs, &mut gso);
            gso.truncate(n);
            for p in &refs {
                gso.extend_from_slice(&p[n..]);
            }
            let mut sp = Splitter::of(&gso).unwrap().unwrap();
            assert_eq!(sp.left(&gso), 5);
            let mut out = vec![0u8; 2_000];
            for (i, want) in pkts.iter().enumerate() {
                let l = sp.next_into(&gso, &mut out).expect("a datagram");
                assert_eq!(&out[..l], &want[..], "v4 {v4} datagram {i}");
                assert!(valid(&finish(&out[..l])), "v4 {v4} datagram {i}");
            }
            assert_eq!(sp.next_into(&gso, &mut out), None);
        }
    }

    #[test]
    fn a_run_stops_where_a_datagram_differs() {
        let ps = payloads(4, 1_000, 1_000);
        let mk = |ids: [u16; 4], lens: [usize; 4]| -> Vec<Vec<u8>> {
            (0..4)
                .map(|i| dgram(true, ids[i], &ps[i][..lens[i]]))
                .collect()
        };
        let len = |v: &Vec<Vec<u8>>| run_len(&v.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(len(&mk([1, 2, 3, 4], [1_000; 4])), 4);
        // An ID out of sequence, with DF and without (the kernel would
        // renumber it, and RoCEv2's ICRC covers the ID); equal IDs (a DF
        // socket without a connection sends 0 in every one); a shorter
        // datagram before the last, a longer one after the first.
        assert_eq!(len(&mk([1, 2, 9, 4], [1_000; 4])), 2, "DF: IDs kept");
        assert_eq!(len(&mk([0, 0, 0, 0], [1_000; 4])), 1, "DF, ID 0");
        let mut v = mk([1, 2, 9, 4], [1_000; 4]);
        for p in &mut v {
            p[HDR + 6] = 0;
        }
        assert_eq!(len(&v), 2);
        assert_eq!(len(&mk([1, 2, 3, 4], [1_000, 500, 1_000, 1_000])), 2);
        assert_eq!(len(&mk([1, 2, 3, 4], [500, 1_000, 1_000, 1_000])), 1);
        // Another port.
        let mut v = mk([1, 2, 3, 4], [1_000; 4]);
        v[2][HDR + 20] ^= 1;
        assert_eq!(len(&v), 2);
        // A datagram whose checksum is complete (no NEEDS_CSUM) stays alone.
        let mut v = mk([1, 2, 3, 4], [1_000; 4]);
        v[0][0] = 0;
        assert_eq!(len(&v), 1);
    }

    #[test]
    fn a_run_stays_within_the_gso_limits() {
        let ps = payloads(80, 1_000, 1_000);
        let pkts: Vec<Vec<u8>> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| dgram(true, i as u16, p))
            .collect();
        let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
        // 65,535 bytes of IPv4 packet: 20 + 8 + 65 x 1,000 would not fit.
        assert_eq!(run_len(&refs), 64);
        let big = payloads(3, 30_000, 30_000);
        let pkts: Vec<Vec<u8>> = big
            .iter()
            .enumerate()
            .map(|(i, p)| dgram(true, i as u16, p))
            .collect();
        let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
        assert_eq!(run_len(&refs), 2);
    }

    #[test]
    fn only_udp_gso_is_cut() {
        let d = dgram(true, 1, &[1; 100]);
        assert!(
            Splitter::of(&d).is_none(),
            "a plain datagram is no GSO packet"
        );
        let mut tcp = d.clone();
        tcp[1] = 1; // GSO_TCPV4
        tcp[HDR + 9] = 6;
        assert!(matches!(Splitter::of(&tcp), Some(Err(()))));
    }
}
