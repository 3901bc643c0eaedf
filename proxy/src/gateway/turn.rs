//! One turn of a shard's device loop, between two waits: read what the
//! sockets have, fire due timers, send what the [`Site`] has for the data
//! center, then transmit what the WAN transport releases, honouring its
//! pacing. Written against [`DcPort`], [`WanPort`] and [`Clock`] only: the
//! daemon runs it over its sockets and the monotonic clock, the
//! differential test over memory in virtual time, so both run this code.
//!
//! # Transmitting
//!
//! `poll_wan_transmit` hands out datagrams with a release time. Those due
//! now are staged back to back in one buffer and sent with one flush (one
//! sendmmsg / GSO batch per socket). One due within [`SPIN`] is waited for
//! by spinning (after flushing what is due before it); one due later is
//! *held* and the loop sleeps until then.

use soya_proto::buffer::PacketBuf;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use soya_proto::site::{DcSent, Site};
use soya_proto::time::Time;
use soya_proto::wan::Transmit;

use super::ports::{Clock, DcPort, DcRx, TxOutcome, WanPort};

/// Batches read from one socket per turn before the others get their turn.
pub const RX_BATCHES: usize = 4;
/// Staging buffer for WAN datagrams, in `max_datagram` slots.
const STAGE_SLOTS: usize = 64;
/// Datagrams transmitted per turn before reading again.
const TX_BATCH: usize = 512;
/// A paced datagram due within this is waited for by spinning.
pub const SPIN: Duration = Duration::from_micros(50);
/// Largest DC packet read.
const RX_BYTES: usize = 65_536;
/// Buffers lent to the DC backend per batch: a tun batch's worth (the xdp
/// backend needs one per multi-chunk frame, the udp one none).
const LENT: usize = 64;

/// A shard's buffers for one turn after another.
pub struct Turn {
    /// DC packets are read into this, unless into a lent buffer.
    pub rx: Vec<u8>,
    /// The site's buffers lent to the DC backend ([`DcPort::recv_batch`]).
    lent: Vec<PacketBuf>,
    /// A held (paced, not yet due) datagram's bytes.
    tx: Vec<u8>,
    held: Option<Transmit>,
    /// WAN datagrams of this turn, staged for one flush.
    stage: Vec<u8>,
    stage_used: usize,
    max_datagram: usize,
}

/// What a DC packet read by this shard is for.
pub enum Route {
    /// This shard's: into its site.
    Mine,
    /// Another shard took it (or dropped it).
    Elsewhere,
}

impl Turn {
    pub fn new(max_datagram: usize) -> Turn {
        let max_datagram = max_datagram.max(soya_proto::wan::MIN_MAX_DATAGRAM);
        Turn {
            rx: vec![0; RX_BYTES],
            lent: Vec::with_capacity(LENT),
            tx: vec![0; soya_proto::wan::MAX_MAX_DATAGRAM],
            held: None,
            stage: vec![0; STAGE_SLOTS * max_datagram],
            stage_used: 0,
            max_datagram,
        }
    }

    /// Reads WAN socket `sock` (up to [`RX_BATCHES`] batches).
    pub fn recv_wan(&mut self, site: &mut Site, wan: &mut impl WanPort, sock: usize, now: Time) {
        for _ in 0..RX_BATCHES {
            let (_, drained) =
                wan.recv_batch(sock, |path, bytes| site.handle_wan(now, path, bytes));
            if drained {
                break;
            }
        }
    }

    /// Reads the DC side (up to [`RX_BATCHES`] batches); `route` decides
    /// for each packet whether it is this shard's.
    pub fn recv_dc(
        &mut self,
        site: &mut Site,
        dc: &mut impl DcPort,
        now: Time,
        mut route: impl FnMut(&[u8], Option<SocketAddr>) -> Route,
    ) -> io::Result<()> {
        for _ in 0..RX_BATCHES {
            // Lend the backend a batch's worth of the site's buffers (those
            // not used stay here for the next batch).
            while self.lent.len() < LENT {
                self.lent.push(site.rx_buffer());
            }
            let (_, drained) = dc.recv_batch(&mut self.rx, &mut self.lent, |pkt, from| {
                match (route(pkt.bytes(), from), pkt) {
                    (Route::Mine, DcRx::Borrowed(b)) => site.handle_dc(now, b),
                    (Route::Mine, DcRx::Lent(v)) => site.handle_dc_owned(now, v),
                    (Route::Elsewhere, DcRx::Lent(v)) => {
                        site.return_rx_buffer(v);
                        None
                    }
                    (Route::Elsewhere, DcRx::Borrowed(_)) => None,
                }
            })?;
            if drained {
                break;
            }
        }
        Ok(())
    }

    /// A DC packet another shard read for this one.
    pub fn handed_over(
        site: &mut Site,
        dc: &mut impl DcPort,
        now: Time,
        pkt: &[u8],
        from: Option<SocketAddr>,
    ) {
        let src: Option<IpAddr> = site.handle_dc(now, pkt);
        if let (Some(src), Some(from)) = (src, from) {
            dc.learn(src, from);
        }
    }

    /// Fires the site's timers if due.
    pub fn timers(site: &mut Site, now: Time) {
        if site.poll_timeout().is_some_and(|t| t <= now) {
            site.handle_timeout(now);
        }
    }

    /// Sends what the site has for the data center.
    /// Each packet goes from where the site holds it straight to the
    /// backend (`Site::transmit_dc`): the only copy left on the way out is
    /// the backend's own (into a UMEM frame; none for a tun `write`).
    pub fn send_dc(site: &mut Site, dc: &mut impl DcPort) {
        site.transmit_dc(|packet, dst| match dc.send(packet, dst) {
            TxOutcome::Sent => DcSent::Sent,
            TxOutcome::NoPeer => DcSent::NoPeer,
            TxOutcome::Error => DcSent::Error,
        });
        dc.flush();
    }

    /// Sends what the transport releases, honouring `release_at` (module
    /// docs).
    pub fn transmit(&mut self, site: &mut Site, wan: &mut impl WanPort, clock: &impl Clock) {
        if let Some(h) = self.held {
            if h.release_at > clock.now() {
                return;
            }
            soya_proto::copies::note(h.len);
            self.stage[..h.len].copy_from_slice(&self.tx[..h.len]);
            wan.stage(h.path, 0, h.len);
            self.stage_used = h.len;
            self.held = None;
        }
        for _ in 0..TX_BATCH {
            if self.stage.len() - self.stage_used < self.max_datagram {
                self.flush_wan(wan);
            }
            let now = clock.now();
            let off = self.stage_used;
            let Some(t) = site.poll_wan_transmit(now, &mut self.stage[off..]) else {
                break;
            };
            if t.release_at > now {
                if t.release_at.since(now) > SPIN {
                    soya_proto::copies::note(t.len);
                    self.tx[..t.len].copy_from_slice(&self.stage[off..off + t.len]);
                    self.held = Some(t);
                    break;
                }
                // Due soon: send what is due first, then wait for it.
                self.flush_wan(wan);
                if off > 0 {
                    soya_proto::copies::note(t.len);
                    self.stage.copy_within(off..off + t.len, 0);
                }
                clock.wait_until(t.release_at);
            }
            let off = self.stage_used;
            wan.stage(t.path, off, t.len);
            self.stage_used = off + t.len;
        }
        self.flush_wan(wan);
    }

    fn flush_wan(&mut self, wan: &mut impl WanPort) {
        if self.stage_used > 0 {
            wan.flush(&self.stage[..self.stage_used]);
            self.stage_used = 0;
        }
    }

    /// When the held datagram is due.
    pub fn held_until(&self) -> Option<Time> {
        self.held.map(|h| h.release_at)
    }

    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// Sends the held datagram now, whatever its pacing (stopping).
    pub fn release_held(&mut self, wan: &mut impl WanPort) {
        if let Some(h) = self.held.take() {
            wan.stage(h.path, 0, h.len);
            wan.flush(&self.tx[..h.len]);
        }
    }

    /// One whole turn after a wait, for drivers without readiness (the
    /// differential test; the daemon reads only the ready sockets): every
    /// WAN socket, the DC side, timers, DC sends, WAN transmits.
    pub fn run_all(
        &mut self,
        site: &mut Site,
        dc: &mut impl DcPort,
        wan: &mut impl WanPort,
        clock: &impl Clock,
    ) -> io::Result<()> {
        let now = clock.now();
        for s in 0..wan.sockets() {
            self.recv_wan(site, wan, s, now);
        }
        self.recv_dc(site, dc, now, |_, _| Route::Mine)?;
        let now = clock.now();
        Turn::timers(site, now);
        Turn::send_dc(site, dc);
        self.transmit(site, wan, clock);
        Ok(())
    }
}
