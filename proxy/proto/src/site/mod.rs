//! One gateway site, sans-IO: the QP engine, the WAN connection to the
//! twin, and everything between them, behind one small API that both the
//! daemon's shards (`gateway::device`) and the simulator (`soya-sim`)
//! drive. Nothing here reads a clock or touches a socket.
//!
//! ```text
//!   DC packets ──handle_dc──▶ ACL ─▶ QpEngine ─▶ flows/Pending ─▶ WanConnection ──poll_wan_transmit──▶ WAN
//!   DC packets ◀──transmit_dc─── ACL ◀─ QpEngine ◀──────────── WanConnection ◀──handle_wan──────── WAN
//! ```
//!
//! A driver feeds input with `handle_dc` (or `handle_dc_owned`, into a
//! buffer from `rx_buffer`), `handle_wan` and `handle_timeout`, then drains
//! the DC side with `transmit_dc` (which lends each packet where it lies:
//! a driver that must keep one, such as the simulator putting it on a
//! simulated link, copies it inside its closure), then `poll_wan_transmit`
//! and `poll_event`, and sleeps until `poll_timeout`. There is one way out
//! to the data center, not two: the daemon (`gateway::turn`), the
//! simulator (`soya-sim`'s `World::drain_gateway`) and the tests all send
//! through `transmit_dc`, so what the simulator checks is the path the
//! daemon runs. The site moves traffic between engine and transport
//! lazily, on the first poll after an input, so a driver that feeds a batch
//! of packets pays for one pass.
//!
//! What the site decides on its own, so that every driver gets it:
//!
//! - the ACL (`acl`): only local ↔ remote prefixes cross, both ways;
//! - which WAN flow carries what, and queuing while the transport pushes
//!   back ([`flows`]); refusing new requests while draining or above the
//!   queue's high water (backpressure instead of overflow);
//! - the twin's life ([`twin`]): a restart or a CLOSE of the twin, and a
//!   twin unreachable for `wan.twin_timeout` (lost), fail every flow through
//!   it toward its application; while lost, new requests are refused.

pub mod acl;
pub mod counters;
pub mod flows;
pub mod params;
pub mod reconfig;
pub mod replays;
pub mod twin;

#[cfg(test)]
mod tests;

use crate::buffer::PacketBuf;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use crate::buffer::PacketPool;
use crate::keyed::HashKey;
use crate::qp::twin::Carry;
use crate::qp::{HalfKey, HeldRef, Output, QpEngine, TwinMsg};
use crate::roce::{OpKind, RocePacket};
use crate::time::Time;
use crate::wan::{CipherOffer, Event, Transmit, WanConnection};

pub use acl::{Acl, Verdict};
pub use counters::{DcCounters, TwinCounters};
pub use flows::{Pending, PENDING_HIGH_WATER};
pub use params::SiteParams;
pub use reconfig::ReconfigureReport;
pub use twin::TwinState;

use twin::{TwinChange, TwinWatch};

/// Draws a fresh, never-zero session nonce for a new WAN session (the
/// daemon: the kernel's CSPRNG; the simulator: its seeded generator, so
/// runs repeat). `None` when none can be had: the WAN then stays closed.
pub type NonceSource = Box<dyn FnMut() -> Option<u64> + Send>;

/// Something the driver should know (log, count, alert). Traffic is not
/// reported here: it comes out of `transmit_dc` and `poll_wan_transmit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteEvent {
    PathUp(usize),
    PathDown(usize),
    /// A session with the twin (generation `peer_generation`).
    Connected {
        peer_generation: u64,
    },
    /// The twin offers no cipher this site accepts: no session.
    CipherMismatch {
        peer_generation: u64,
        ours: CipherOffer,
        theirs: CipherOffer,
    },
    /// The twin came back with a new generation: what it held is gone.
    /// `flows_resumed` halves send it again what it had not delivered
    /// (`qp::resume`); `flows_failed` halves were failed toward their
    /// requesters (their QP had requests the twin pseudo-ACKed).
    TwinRestarted {
        old_generation: u64,
        new_generation: u64,
        flows_failed: usize,
        flows_resumed: usize,
    },
    /// The twin shut down (CLOSE); a new session waits for its return.
    TwinShutDown {
        flows_failed: usize,
    },
    /// The twin drained and closed to restart (CLOSE "restart"): every
    /// flow is kept, `flows_resumed` ingress halves resume toward its next
    /// incarnation, which has `wan.twin_timeout` to answer before the twin
    /// is declared lost.
    TwinRestarting {
        flows_resumed: usize,
    },
    /// The twin's next incarnation answered after its planned restart
    /// ([`Self::TwinRestarting`]): traffic through it paused `pause`.
    TwinReturned {
        pause: Duration,
    },
    /// No path answered for `wan.twin_timeout` (every path down since
    /// `since`): the twin is lost, its flows were failed, new requests are
    /// refused until it answers again.
    TwinLost {
        since: Time,
        flows_failed: usize,
    },
    /// A path is up again after the twin was lost.
    TwinBack {
        lost_for: Duration,
    },
    /// No session nonce could be drawn: the WAN stays closed.
    NoNonce,
}

/// What became of a packet [`Site::transmit_dc`] lent to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DcSent {
    Sent,
    /// udp backend: the destination host's UDP address is not learned yet.
    NoPeer,
    Error,
}

/// A packet waiting for the DC side: one the engine handed over (an ACK,
/// a response, a raw packet), or a request an egress half holds, sent
/// from where it is held (`qp::Output::DcHeld`: the re-injection path
/// copies nothing between the WAN's decode and the DC backend).
#[derive(Debug)]
enum DcOut {
    /// A packet the engine handed over, toward the local host `dst`.
    Owned(PacketBuf, IpAddr),
    Held(HeldRef, IpAddr),
}

pub struct Site {
    params: SiteParams,
    engine: QpEngine,
    wan: WanConnection,
    nonces: NonceSource,
    pending: Pending,
    twin: TwinWatch,
    dc_out: VecDeque<DcOut>,
    events: VecDeque<SiteEvent>,
    dcc: DcCounters,
    tw: TwinCounters,
    draining: bool,
    /// When the twin said CLOSE "restart", until its next incarnation's
    /// session (the pause `SiteEvent::TwinReturned` reports).
    twin_away_since: Option<Time>,
    closing: bool,
    /// Input arrived since the last pass between engine and transport.
    dirty: bool,
    /// The latest time any input carried (passes run at it).
    now: Time,
}

impl Site {
    /// A site at `now` with a first WAN session (no session at all, and a
    /// [`SiteEvent::NoNonce`], if `nonces` has none).
    pub fn new(mut params: SiteParams, now: Time, mut nonces: NonceSource) -> Site {
        let nonce = nonces();
        // The engine's tables are keyed from the same source (`crate::keyed`).
        params.engine.hash_key = HashKey([nonces().unwrap_or(0), nonces().unwrap_or(0)]);
        let mut events = VecDeque::new();
        if nonce.is_none() {
            events.push_back(SiteEvent::NoNonce);
        }
        let mut wan = WanConnection::new(params.wan.clone(), now, nonce.unwrap_or(1));
        if nonce.is_none() {
            wan.close(now);
        }
        Site {
            engine: QpEngine::new(params.engine),
            twin: TwinWatch::new(params.wan.paths.len(), params.twin_timeout, now),
            params,
            wan,
            nonces,
            pending: Pending::default(),
            // A pass's DC output is at most a window of pseudo-ACKs and
            // re-injected requests: room for it up front, so the steady
            // state does not grow the queue.
            dc_out: VecDeque::with_capacity(4096),
            events,
            dcc: DcCounters::default(),
            tw: TwinCounters::default(),
            draining: false,
            twin_away_since: None,
            closing: false,
            dirty: true,
            now,
        }
    }

    fn input(&mut self, now: Time) {
        self.now = self.now.max(now);
        self.dirty = true;
    }

    /// A packet from the local data center. Returns its source address when
    /// it passed the ACL (the udp lab backend learns hosts from it).
    pub fn handle_dc(&mut self, now: Time, packet: &[u8]) -> Option<IpAddr> {
        let (accepted, src) = self.screen_dc(now, packet);
        if accepted {
            self.refill_engine_pool();
            self.engine.handle_dc(now, packet);
        }
        src
    }

    /// [`Self::handle_dc`] for a packet the backend read into a buffer from
    /// [`Self::rx_buffer`]: the site keeps that buffer (a request is held
    /// in it, uncopied) or recycles it.
    pub fn handle_dc_owned(&mut self, now: Time, packet: PacketBuf) -> Option<IpAddr> {
        let (accepted, src) = self.screen_dc(now, &packet);
        if accepted {
            self.engine.handle_dc_owned(now, packet);
        } else {
            self.engine.return_rx_buffer(packet);
        }
        src
    }

    /// An empty pooled buffer for the DC backend to read one packet into
    /// and pass to [`Self::handle_dc_owned`] (or back to
    /// [`Self::return_rx_buffer`]). Its capacity holds any RoCE packet
    /// ([`crate::buffer::pool::PACKET_BUF_BYTES`]).
    pub fn rx_buffer(&mut self) -> PacketBuf {
        self.refill_engine_pool();
        self.engine.rx_buffer()
    }

    /// Before the engine takes buffers for a DC packet (the one it is read
    /// into, the pseudo-ACK it answers): an engine pool running dry takes
    /// half of the transport's idle buffers. At the requester's site the
    /// buffers come back to the engine's pool when the twin reports their
    /// requests delivered, and other buffers (decoded messages) gather in
    /// the transport's; balanced only once per pass, the engine's pool ran
    /// dry mid-pass and allocated while the transport's held idle ones
    /// (tests/steady_state_alloc.rs, 1452-byte datagrams). Cheap: only
    /// when nearly empty.
    fn refill_engine_pool(&mut self) {
        if self.engine.pool_idle() < 2 {
            PacketPool::balance(self.engine.pool_mut(), self.wan.pool_mut());
        }
    }

    /// Gives back an unused buffer from [`Self::rx_buffer`].
    pub fn return_rx_buffer(&mut self, buf: PacketBuf) {
        self.engine.return_rx_buffer(buf);
    }

    /// Counts a DC packet and applies the ACL and the refusals below.
    /// Returns whether it goes into the engine, and its source address when
    /// it passed the ACL.
    fn screen_dc(&mut self, now: Time, packet: &[u8]) -> (bool, Option<IpAddr>) {
        self.input(now);
        self.dcc.rx_packets += 1;
        self.dcc.rx_bytes += packet.len() as u64;
        let (verdict, addrs) = self.params.acl.outbound(packet);
        match verdict {
            Verdict::Malformed => self.dcc.rx_malformed += 1,
            Verdict::BadSource => self.dcc.rx_acl_source += 1,
            Verdict::BadDestination => self.dcc.rx_acl_destination += 1,
            Verdict::Pass => return (self.accept(packet), addrs.map(|(src, _)| src)),
        }
        (false, None)
    }

    /// Into the engine, unless it is a new request that must be refused:
    /// while draining or while the twin queue is above its high water the
    /// gateway does not take it (the requester resends it: backpressure, not
    /// loss).
    fn accept(&mut self, packet: &[u8]) -> bool {
        let refuse = self.draining || self.pending.bytes > PENDING_HIGH_WATER;
        // While draining, a resend and the rest of a message already begun
        // go in: the drain waits until every half owes its requester
        // nothing (`QpEngine::finishes_what_was_taken`).
        let finishes = || self.draining && self.engine.finishes_what_was_taken(packet);
        if refuse && is_request(packet) && !finishes() {
            if self.draining {
                self.dcc.rx_draining += 1;
            } else {
                self.dcc.rx_backpressure += 1;
            }
            return false;
        }
        if self.twin.state().is_lost() && is_request(packet) {
            // The engine answers it with an error NAK (it is not
            // reachable): counted here as well for the site's metrics.
            self.tw.rx_refused_twin_lost += 1;
        }
        self.dcc.rx_accepted += 1;
        true
    }

    /// A datagram from the WAN on path `path`; decrypted in place.
    pub fn handle_wan(&mut self, now: Time, path: usize, datagram: &mut [u8]) {
        self.input(now);
        self.wan.handle_datagram_in_place(now, path, datagram);
    }

    /// Fires whatever timer is due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.input(now);
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        if self.engine.expiry_deadline().is_some_and(|t| t <= now) {
            self.engine.expire(now);
        }
        if self.wan.poll_timeout().is_some_and(|t| t <= now) {
            self.wan.handle_timeout(now);
        }
        // Path events first: a path that came back just now saves the twin.
        self.pump();
        if let Some(TwinChange::Lost { since }) = self.twin.poll(now) {
            self.declare_lost(since);
        }
    }

    /// The earliest time [`Self::handle_timeout`] has something to do.
    /// Exact after the poll calls that follow an input.
    pub fn poll_timeout(&self) -> Option<Time> {
        [
            self.engine.poll_timeout(),
            self.engine.expiry_deadline(),
            self.wan.poll_timeout(),
            self.twin.deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Sends everything waiting for the data center through `send`, which
    /// gets each packet where it lies (no copy, nothing to recycle) and its
    /// local destination, and says what became of it (counted in
    /// [`DcCounters`]). The only way out to the data center: a driver
    /// that needs a packet of its own copies it inside `send` (that copy
    /// is the driver's, not the site's).
    pub fn transmit_dc(&mut self, mut send: impl FnMut(&[u8], IpAddr) -> DcSent) {
        self.settle();
        while let Some(out) = self.dc_out.pop_front() {
            let (bytes, dst) = match &out {
                DcOut::Owned(packet, dst) => (&packet[..], *dst),
                DcOut::Held(r, dst) => match self.engine.held_packet(r) {
                    Some(b) => (b, *dst),
                    None => {
                        self.dcc.tx_released += 1;
                        continue;
                    }
                },
            };
            let len = bytes.len() as u64;
            let c = &mut self.dcc;
            match send(bytes, dst) {
                DcSent::Sent => {
                    c.tx_packets += 1;
                    c.tx_bytes += len;
                }
                DcSent::NoPeer => c.tx_no_peer += 1,
                DcSent::Error => c.tx_errors += 1,
            }
            if let DcOut::Owned(packet, _) = out {
                self.engine.recycle(packet);
            }
        }
    }

    /// Packets decoded from the WAN go into `source`'s buffers from now on
    /// (the AF_XDP backend lends runs of its UMEM, so that the packet is
    /// sent toward the DC from where the decode wrote it); heap buffers
    /// when it has none left (counted in the transport's
    /// `PoolStats::lend_empty`).
    pub fn set_lender(&mut self, source: std::sync::Arc<dyn crate::buffer::LendSource>) {
        self.wan.pool_mut().set_source(source);
    }

    /// The next WAN datagram, written into `buf` (see
    /// [`WanConnection::poll_transmit`]: it may be due only at
    /// `release_at`).
    pub fn poll_wan_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        self.settle();
        self.wan.poll_transmit(now, buf)
    }

    pub fn poll_event(&mut self) -> Option<SiteEvent> {
        self.settle();
        self.events.pop_front()
    }

    /// Stops taking new requests from the data center; what is held is
    /// still delivered ([`Self::is_drained`] says when), and a requester's
    /// resend of a request already taken, or the rest of a message begun,
    /// still goes in (what the drain waits for needs them).
    pub fn start_drain(&mut self) {
        self.draining = true;
        self.dirty = true;
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Nothing held, nothing waiting, nothing unacknowledged on the WAN.
    pub fn is_drained(&self) -> bool {
        self.engine.occupancy().slots_used == 0
            && self.pending.is_empty()
            && self.wan.is_drained()
            && self.dc_out.is_empty()
    }

    /// Says goodbye to the twin (CLOSE): it fails what was mid-stream.
    pub fn close(&mut self, now: Time) {
        self.input(now);
        self.closing = true;
        self.wan.close(now);
    }

    /// Nothing this gateway pseudo-ACKed is still undelivered, every
    /// request it took was answered or acknowledged toward its requester,
    /// and nothing waits to go to the data center: what a
    /// gateway must reach, draining, before it may close to restart
    /// ([`Self::close_for_restart`]). What it re-injects for the twin's
    /// requesters need not be done: the twin holds those until they are
    /// delivered and sends them again to the next incarnation.
    pub fn is_restartable(&self) -> bool {
        self.engine.halves_owing_requesters() == 0 && self.dc_out.is_empty()
    }

    /// This gateway said CLOSE ([`Self::close`], [`Self::close_for_restart`])
    /// and it went out: the process may exit.
    pub fn is_closed(&self) -> bool {
        self.closing && self.wan.is_closed()
    }

    /// Says CLOSE "restart" to the twin: it keeps every flow and resumes
    /// them toward this gateway's next incarnation (`qp::resume`), or
    /// fails them if none answers within `wan.twin_timeout`. Only once
    /// [`Self::is_restartable`]; otherwise (the drain timed out) a final
    /// [`Self::close`], and false.
    pub fn close_for_restart(&mut self, now: Time) -> bool {
        self.input(now);
        if !self.is_restartable() {
            self.close(now);
            return false;
        }
        self.closing = true;
        self.wan.close_with(now, crate::wan::CloseWhy::Restart);
        true
    }

    fn settle(&mut self) {
        if self.dirty {
            self.pump();
        }
    }

    /// Moves traffic between the engine and the transport until nothing
    /// moves: messages and datagrams from the twin into the engine, the
    /// engine's outputs to the DC queue and to the transport (through
    /// `pending` when it pushes back), waiting messages into the transport.
    fn pump(&mut self) {
        self.dirty = false;
        let now = self.now;
        loop {
            let mut moved = false;
            while let Some(ev) = self.wan.poll_event() {
                moved = true;
                match ev {
                    Event::Message(msg) => {
                        self.tw.msgs_in += 1;
                        self.engine.handle_twin(now, msg);
                    }
                    Event::Datagram(packet) => {
                        self.tw.datagrams_in += 1;
                        if self.params.acl.inbound(&packet).0 == Verdict::Pass {
                            self.engine.handle_twin(now, TwinMsg::Datagram { packet });
                        } else {
                            self.tw.datagram_acl_drops += 1;
                            self.wan.recycle(packet);
                        }
                    }
                    other => self.on_wan_event(now, other),
                }
            }
            // Held requests the transport is done with: back to their
            // ingress halves, which keep them until delivered.
            while let Some(packet) = self.wan.take_handed_back() {
                self.engine.take_back(packet);
            }
            // Raw requests the twin has, and those dropped on the way:
            // their requesters' resends may go on (`qp::ingress::tunnel`).
            while let Some(packet) = self.wan.take_raw_released() {
                self.engine.raw_released(packet);
            }
            for (key, psn) in self.pending.raw_dropped.drain(..) {
                self.engine.raw_left(&key, psn);
            }
            while let Some(out) = self.engine.poll_output() {
                moved = true;
                match out {
                    Output::Dc(packet) if self.redundant_read(&packet) => {
                        self.engine.recycle(packet);
                    }
                    Output::Dc(packet) => self.queue_for_dc(packet),
                    Output::DcHeld(r) => self.queue_held_for_dc(r),
                    Output::Twin(msg) => match flows::flow_of(&msg) {
                        Some(flow) => {
                            self.tw.msgs_out += 1;
                            self.pending.submit(&mut self.wan, now, flow, msg);
                        }
                        None => {
                            if let TwinMsg::Datagram { packet } = msg {
                                self.tw.datagrams_out += 1;
                                self.wan.send_datagram(now, packet);
                            }
                        }
                    },
                }
            }
            if !self.pending.is_empty() && self.pending.flush(&mut self.wan, now) {
                moved = true;
            }
            // The requester's site sends the packets, the responder's
            // receives them: even the two pools out so neither allocates.
            PacketPool::balance(self.engine.pool_mut(), self.wan.pool_mut());
            if !moved {
                return;
            }
        }
    }

    /// Is `packet` a READ on its way to a local responder whose answer
    /// already waits for the WAN here? Then it is not injected; otherwise
    /// the answers it makes dead are dropped from the queue
    /// ([`replays`]: the requester's re-issues multiplied READ responses
    /// behind a slow WAN, issue 18 seed 3408). Only what the egress
    /// forwards as is (a tunnel-phase READ, a resend) comes this way.
    fn redundant_read(&mut self, packet: &[u8]) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let Ok(p) = RocePacket::parse(packet) else {
            return false;
        };
        if p.info.kind != OpKind::ReadRequest {
            return false;
        }
        let key = HalfKey::of_request(&p);
        let Some(qpn) = self.engine.requester_qpn(&key) else {
            return false;
        };
        let flow = flows::response_flow(key.requester, key.responder);
        self.pending.replays.on_read(flow, qpn, p.psn())
    }

    /// An engine packet for the DC side: only ever toward a local host.
    /// Queues a request held by an egress half (the ACL check of
    /// [`Self::queue_for_dc`]; its bytes stay where they are held and are
    /// not even looked at here: a request goes to its half's responder).
    fn queue_held_for_dc(&mut self, r: HeldRef) {
        let dst = r.key.responder;
        if self.params.acl.is_local(dst) {
            self.dc_out.push_back(DcOut::Held(r, dst));
        } else {
            self.dcc.tx_acl += 1;
        }
    }

    fn queue_for_dc(&mut self, packet: PacketBuf) {
        match acl::addresses(&packet) {
            Some((_, dst)) if self.params.acl.is_local(dst) => {
                self.dc_out.push_back(DcOut::Owned(packet, dst));
            }
            Some(_) => {
                self.dcc.tx_acl += 1;
                self.engine.recycle(packet);
            }
            None => {
                self.dcc.tx_errors += 1;
                self.engine.recycle(packet);
            }
        }
    }

    fn on_wan_event(&mut self, now: Time, ev: Event) {
        match ev {
            Event::Message(_) | Event::Datagram(_) => {}
            Event::PathUp(i) | Event::PathDown(i) => {
                let up = matches!(ev, Event::PathUp(_));
                self.events.push_back(if up {
                    SiteEvent::PathUp(i)
                } else {
                    SiteEvent::PathDown(i)
                });
                if let Some(TwinChange::Back { lost_for }) = self.twin.path(now, i, up) {
                    self.engine.set_twin_reachable(true);
                    self.events.push_back(SiteEvent::TwinBack { lost_for });
                }
            }
            Event::Connected { peer_generation } => {
                self.events
                    .push_back(SiteEvent::Connected { peer_generation });
                if let Some(since) = self.twin_away_since.take() {
                    let pause = now.since(since);
                    let us = pause.as_micros() as u64;
                    let tw = &mut self.tw;
                    tw.twin_returns += 1;
                    tw.restart_pause_last_us = us;
                    tw.restart_pause_max_us = tw.restart_pause_max_us.max(us);
                    tw.restart_pause_sum_us += us;
                    self.events.push_back(SiteEvent::TwinReturned { pause });
                }
                // A twin back after it was lost or shut down: the QPs at
                // its site whose flows were failed meanwhile (`qp::orphan`).
                self.engine.tell_orphans();
            }
            Event::CipherMismatch {
                peer_generation,
                ours,
                theirs,
            } => self.events.push_back(SiteEvent::CipherMismatch {
                peer_generation,
                ours,
                theirs,
            }),
            Event::PeerRestarted {
                old_generation,
                new_generation,
            } => {
                // What was queued for the old incarnation goes nowhere; the
                // requests among it go back to their halves, which resume
                // toward the new one (`qp::resume`) with every request not
                // yet delivered.
                self.drop_twin_output();
                let sum = self
                    .engine
                    .twin_restarted(now, crate::roce::NakCode::RemoteOperationalError);
                self.dirty = true;
                let flows_failed = (sum.failed.halves_failed + sum.failed.qps_poisoned) as usize;
                let flows_resumed = sum.halves_resumed as usize;
                self.tw.flows_failed_on_restart += flows_failed as u64;
                self.tw.flows_resumed_on_restart += flows_resumed as u64;
                // The new incarnation knows nothing of the QPs at its own
                // site that it had pseudo-ACKed: tell it (`qp::orphan`).
                self.engine.tell_orphans();
                self.events.push_back(SiteEvent::TwinRestarted {
                    old_generation,
                    new_generation,
                    flows_failed,
                    flows_resumed,
                });
            }
            Event::Closed { restart } => {
                if self.closing {
                    return;
                }
                if restart && self.twin_restarting(now) {
                    return;
                }
                // The twin shut down. Whatever it had not delivered is gone
                // with it; a new session lets its next incarnation find us.
                let flows_failed = self.fail_flows(now);
                self.tw.flows_failed_on_restart += flows_failed as u64;
                self.events
                    .push_back(SiteEvent::TwinShutDown { flows_failed });
                self.new_session(now);
            }
        }
    }

    /// The twin said CLOSE to restart after a clean drain: keep every flow
    /// for its next incarnation (`QpEngine::twin_restarting`). False,
    /// changing nothing, when a flow cannot be resumed: the caller then
    /// fails them all as for a final CLOSE.
    fn twin_restarting(&mut self, now: Time) -> bool {
        // The requests the old session still held go back to their halves
        // (they send them to the next incarnation), with those waiting in
        // `pending`.
        self.wan.hand_back_all();
        while let Some(packet) = self.wan.take_handed_back() {
            self.engine.take_back(packet);
        }
        self.drop_twin_output();
        let Some(sum) = self.engine.twin_restarting(now) else {
            return false;
        };
        let flows_resumed = sum.halves_resumed as usize;
        self.tw.flows_resumed_on_restart += flows_resumed as u64;
        self.tw.twin_restarts_clean += 1;
        self.twin_away_since = Some(now);
        self.events
            .push_back(SiteEvent::TwinRestarting { flows_resumed });
        self.new_session(now);
        // Its next incarnation has `twin_timeout` to answer; if none does,
        // the twin is lost and its flows fail then.
        self.twin.await_return(now);
        self.dirty = true;
        true
    }

    /// Every path has been down for `twin_timeout`.
    fn declare_lost(&mut self, since: Time) {
        let now = self.now;
        // A planned restart whose next incarnation never came: no pause
        // to report, the twin is lost.
        self.twin_away_since = None;
        let flows_failed = self.fail_flows(now);
        self.engine.set_twin_reachable(false);
        self.tw.twin_lost += 1;
        self.tw.flows_failed_twin_lost += flows_failed as u64;
        self.events.push_back(SiteEvent::TwinLost {
            since,
            flows_failed,
        });
        // A new generation, if there was a session: should the twin still
        // be alive behind a long outage, it sees a restart when the WAN
        // returns and fails its side too, and nothing queued for the failed
        // flows is ever delivered. (A twin that never answered has nothing
        // to forget; its session keeps trying, and its counters keep
        // telling why it fails, e.g. HELLOs that do not authenticate.)
        if self.wan.is_connected() {
            self.new_session(now);
        }
        self.dirty = true;
    }

    fn new_session(&mut self, now: Time) {
        match (self.nonces)() {
            Some(nonce) => {
                self.wan = WanConnection::new(self.params.wan.clone(), now, nonce);
            }
            None => {
                self.wan.close(now);
                self.events.push_back(SiteEvent::NoNonce);
            }
        }
        self.twin.restart_paths(now);
    }

    /// The answer to a twin that is gone (restarted, shut down or lost):
    /// whatever waited for the transport is dropped, and the engine fails
    /// every flow through the twin toward its application
    /// ([`QpEngine::fail_all`]): a NAK at each requester's oldest
    /// outstanding PSN, QPs with nothing outstanding moved to the error
    /// state through their responder role, the dead twin's egress state
    /// dropped. Messages the engine had queued for the twin before the
    /// failure are discarded too: a new incarnation of the twin must never
    /// receive requests of flows failed here. Returns the halves failed.
    fn fail_flows(&mut self, now: Time) -> usize {
        self.drop_twin_output();
        let summary = self
            .engine
            .fail_all(now, crate::roce::NakCode::RemoteOperationalError);
        self.dirty = true;
        (summary.halves_failed + summary.qps_poisoned) as usize
    }

    /// Drops whatever waits for a twin that is gone: the waiting queue,
    /// and the twin messages the engine had queued (DC packets still go:
    /// pseudo-ACKs of what it took). The packets of held requests among
    /// them, and those the transport hands back, go back to their ingress
    /// halves ([`QpEngine::take_back`]): a half resumed toward the twin's
    /// next incarnation sends them again.
    fn drop_twin_output(&mut self) {
        let engine = &mut self.engine;
        let mut keep = |msg: TwinMsg| match msg {
            TwinMsg::Request {
                carry: Carry::Reliable,
                packet,
            } => engine.take_back(packet),
            TwinMsg::Request { packet, .. }
            | TwinMsg::Response { packet }
            | TwinMsg::Datagram { packet } => engine.recycle(packet),
            TwinMsg::Delivered { .. } | TwinMsg::Error { .. } | TwinMsg::Orphaned { .. } => {}
        };
        self.pending.drain(&mut keep);
        // What the engine queued: DC packets still go, twin messages do not.
        while let Some(out) = self.engine.poll_output() {
            match out {
                Output::Dc(packet) => self.queue_for_dc(packet),
                // Requests of the twin's egress halves, which `fail_all`
                // drops: they find nothing when their turn comes.
                Output::DcHeld(r) => self.queue_held_for_dc(r),
                Output::Twin(msg) => {
                    self.pending.discarded += 1;
                    match msg {
                        TwinMsg::Request {
                            carry: Carry::Reliable,
                            packet,
                        } => self.engine.take_back(packet),
                        TwinMsg::Request { packet, .. }
                        | TwinMsg::Response { packet }
                        | TwinMsg::Datagram { packet } => self.engine.recycle(packet),
                        TwinMsg::Delivered { .. }
                        | TwinMsg::Error { .. }
                        | TwinMsg::Orphaned { .. } => {}
                    }
                }
            }
        }
        while let Some(packet) = self.wan.take_handed_back() {
            self.engine.take_back(packet);
        }
        self.tw.discarded_on_restart = self.pending.discarded;
    }

    pub fn engine(&self) -> &QpEngine {
        &self.engine
    }

    pub fn wan(&self) -> &WanConnection {
        &self.wan
    }

    pub fn params(&self) -> &SiteParams {
        &self.params
    }

    pub fn pending(&self) -> &Pending {
        &self.pending
    }

    pub fn twin_state(&self) -> TwinState {
        self.twin.state()
    }

    /// Connected in the sense an operator means: a path answers. (The
    /// transport alone keeps its session with a twin that vanished.)
    pub fn is_connected(&self) -> bool {
        self.twin.state() == TwinState::Connected && self.wan.is_connected()
    }

    pub fn dc_counters(&self) -> &DcCounters {
        &self.dcc
    }

    /// For the driver's own DC I/O outcomes (sent, no peer, errors).
    pub fn dc_counters_mut(&mut self) -> &mut DcCounters {
        &mut self.dcc
    }

    /// The engine ↔ transport counters, with the waiting queue's figures.
    pub fn twin_counters(&self) -> TwinCounters {
        TwinCounters {
            pending_messages: self.pending.messages as u64,
            pending_bytes: self.pending.bytes as u64,
            pending_high_water_bytes: self.pending.high_water_bytes as u64,
            pending_overflow: self.pending.overflow,
            read_replays_suppressed: self.pending.replays.redundant,
            stale_read_responses_dropped: self.pending.replays.stale,
            blocked: self.pending.blocked,
            send_errors: self.pending.send_errors,
            ..self.tw.clone()
        }
    }
}

/// A RoCE request packet whose ICRC is right (what draining and
/// backpressure refuse): only such a packet is refused (or counted as
/// refused). A forged or corrupt one goes on to the engine,
/// which counts it as bad ICRC or malformed and drops it, whatever the
/// state of the site: otherwise a forgery arriving while the twin queue is
/// above its high water would hide among the refused requests, and the
/// counters would say a host's request was refused. (The CRC is computed
/// only in those states: `accept` asks only then.)
fn is_request(pkt: &[u8]) -> bool {
    RocePacket::parse_verified(pkt).is_ok_and(|p| p.info.is_request())
}
