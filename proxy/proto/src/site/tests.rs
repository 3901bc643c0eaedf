//! Two sites in memory, a WAN that can be cut, and virtual time: what a
//! site decides on its own (the twin's life, the ACL), packet by packet.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::qp::EngineConfig;
use crate::roce::{builders, IpHeader, OpKind, Opcode, Psn, Reth, RocePacket, Syndrome};
use crate::wan::{CcKind, PathConfig, WanConfig};

#[path = "tests_resume.rs"]
mod resume;

const REQUESTER: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const RESPONDER: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
const RS_QPN: u32 = 0x22;
const TWIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A request packet to the responder QP (`RS_QPN`), as the host at `ip`'s
/// source would send it.
fn request(
    ip: IpHeader,
    op: Opcode,
    psn: u32,
    ack_req: bool,
    reth: Reth,
    payload: &[u8],
) -> Vec<u8> {
    let mut pkt = vec![0; payload.len() + 256];
    let n = builders::request(ip, RS_QPN, op, Psn::new(psn), ack_req, reth)
        .emit(payload, &mut pkt)
        .unwrap();
    pkt.truncate(n);
    pkt
}

/// The RETH of a zero-length request, which the ACL tests send.
const EMPTY_RETH: Reth = Reth {
    va: 0,
    rkey: 1,
    len: 0,
};

fn site(client: bool) -> Site {
    site_from(client, if client { 0x1000 } else { 0x2000 })
}

/// A site whose session nonces start after `first_nonce` (a restarted
/// gateway draws new ones: a new generation).
fn site_from(client: bool, first_nonce: u64) -> Site {
    site_with(client, first_nonce, EngineConfig::default())
}

/// A site with the engine settings `engine`.
fn site_with(client: bool, first_nonce: u64, engine: EngineConfig) -> Site {
    let mut path = PathConfig::new("p0");
    path.rate_bps = Some(10_000_000_000);
    path.rtt_hint = Some(Duration::from_millis(3));
    let mut wan = WanConfig::new(vec![path], Some([7; 32]), client);
    wan.cc = CcKind::FixedRate;
    let (here, there) = ("10.1.0.0/16", "10.2.0.0/16");
    let (local, remote) = if client { (here, there) } else { (there, here) };
    let acl = Acl {
        local: vec![local.parse().unwrap()],
        remote: vec![remote.parse().unwrap()],
    };
    let params = SiteParams::new(engine, wan, acl, TWIN_TIMEOUT);
    let mut n = first_nonce;
    Site::new(
        params,
        Time::ZERO,
        Box::new(move || {
            n += 1;
            Some(n)
        }),
    )
}

/// Site A (the requester's), site B (the responder's), a 1.5 ms WAN each
/// way that is up or cut, and what each site sent its data center.
struct Pair {
    a: Site,
    b: Site,
    now: Time,
    wan_up: bool,
    /// Datagrams in flight: (arrival, to B?, path, bytes).
    flight: Vec<(Time, bool, usize, Vec<u8>)>,
    to_requester: Vec<Vec<u8>>,
    to_responder: Vec<Vec<u8>>,
    events_a: Vec<(Time, SiteEvent)>,
    events_b: Vec<(Time, SiteEvent)>,
    buf: Vec<u8>,
    /// The responder acknowledges every AckReq (else it stays silent).
    auto_ack: bool,
    /// Requests of `to_responder` already answered.
    answered: usize,
    /// Every `drop_every`-th WAN datagram (either way) is lost; 0: none.
    drop_every: usize,
    wan_sent: usize,
}

const ONE_WAY: Duration = Duration::from_micros(1500);

impl Pair {
    fn new() -> Pair {
        Pair::with(site(true), site(false))
    }

    fn with(a: Site, b: Site) -> Pair {
        let mut p = Pair {
            a,
            b,
            now: Time::ZERO,
            wan_up: true,
            flight: Vec::new(),
            to_requester: Vec::new(),
            to_responder: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
            buf: vec![0; 65_536],
            auto_ack: false,
            answered: 0,
            drop_every: 0,
            wan_sent: 0,
        };
        p.run_until(|p| p.a.is_connected() && p.b.is_connected(), "connect");
        p
    }

    /// Polls both sites until quiet at `now`.
    fn drain(&mut self) {
        let now = self.now;
        for (site, to_b) in [(&mut self.a, true), (&mut self.b, false)] {
            while let Some(t) = site.poll_wan_transmit(now, &mut self.buf) {
                self.wan_sent += 1;
                let lost = self.drop_every > 0 && self.wan_sent % self.drop_every == 0;
                if self.wan_up && !lost {
                    let at = t.release_at.max(now) + ONE_WAY;
                    self.flight
                        .push((at, to_b, t.path, self.buf[..t.len].to_vec()));
                }
            }
            // As the daemon's turn sends them (`Site::transmit_dc`): the
            // copy into the test's lists is the test's own.
            let out = if to_b {
                &mut self.to_requester
            } else {
                &mut self.to_responder
            };
            site.transmit_dc(|packet, _| {
                out.push(packet.to_vec());
                DcSent::Sent
            });
        }
        while let Some(ev) = self.a.poll_event() {
            self.events_a.push((now, ev));
        }
        while self.auto_ack && self.answered < self.to_responder.len() {
            self.answered += 1;
            let p = RocePacket::parse_verified(&self.to_responder[self.answered - 1]).unwrap();
            if p.bth.ack_req {
                let psn = p.psn().value();
                self.respond(psn, self.answered as u32);
            }
        }
        while let Some(ev) = self.b.poll_event() {
            self.events_b.push((now, ev));
        }
    }

    /// One step to the next arrival or timer.
    fn step(&mut self) {
        self.drain();
        let next = [
            self.a.poll_timeout(),
            self.b.poll_timeout(),
            self.flight.iter().map(|f| f.0).min(),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("something is always scheduled (keepalives, probes)");
        self.now = self.now.max(next);
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.flight.drain(..).partition(|f| f.0 <= now);
        self.flight = later;
        for (_, to_b, path, mut d) in due {
            let site = if to_b { &mut self.b } else { &mut self.a };
            site.handle_wan(now, path, &mut d);
        }
        for site in [&mut self.a, &mut self.b] {
            if site.poll_timeout().is_some_and(|t| t <= now) {
                site.handle_timeout(now);
            }
        }
        self.drain();
    }

    fn run_until(&mut self, mut done: impl FnMut(&Pair) -> bool, what: &str) {
        let limit = self.now + Duration::from_secs(60);
        while !done(self) {
            assert!(self.now < limit, "{what}: not within 60 s of virtual time");
            self.step();
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        while self.now < until {
            self.step();
        }
    }

    /// The requester's WRITE of 4 KiB at `psn` into site A.
    fn write(&mut self, psn: u32, ack_req: bool) {
        let reth = Reth {
            va: 0x1000,
            rkey: 7,
            len: 4096,
        };
        let ip = IpHeader::v4(REQUESTER, RESPONDER);
        let pkt = request(ip, Opcode::RC_WRITE_ONLY, psn, ack_req, reth, &[0x5a; 4096]);
        self.a.handle_dc(self.now, &pkt);
        self.drain();
    }

    /// The responder's ACK of `psn` (MSN `msn`) into site B.
    fn respond(&mut self, psn: u32, msn: u32) {
        let to = builders::ReplyTo {
            ip: IpHeader::v4(RESPONDER, REQUESTER),
            src_port: 0xc000,
            dest_qp: 0x11,
        };
        let mut pkt = vec![0; 256];
        let n = builders::ack(&to, Psn::new(psn), msn)
            .emit(&[], &mut pkt)
            .unwrap();
        self.b.handle_dc(self.now, &pkt[..n]);
    }

    fn lost_events(&self) -> Vec<(Time, usize)> {
        self.events_a
            .iter()
            .filter_map(|(t, e)| match e {
                SiteEvent::TwinLost { flows_failed, .. } => Some((*t, *flows_failed)),
                _ => None,
            })
            .collect()
    }

    /// NAKs the requester received (errors, not sequence NAKs).
    fn error_naks(&self) -> usize {
        self.to_requester
            .iter()
            .filter_map(|p| RocePacket::parse_verified(p).ok())
            .filter(|p| p.info.kind == OpKind::Ack)
            .filter(|p| {
                matches!(
                    p.ext.aeth.map(|a| a.syndrome),
                    Some(Syndrome::Nak(code)) if code != crate::roce::NakCode::PsnSequenceError
                )
            })
            .count()
    }
}

/// Writes that the twin received but the responder never acknowledged:
/// the ingress half at A holds them undelivered. (The first WRITE is
/// acknowledged by the responder: a half is accelerated, its requests
/// pseudo-ACKed and held, once the engine has seen the requester's QPN.)
fn pair_with_undelivered_writes() -> Pair {
    let mut p = Pair::new();
    p.write(100, true);
    p.run_until(|p| p.to_responder.len() == 1, "the first WRITE at B");
    p.respond(100, 1);
    p.answered = 1;
    p.run_until(|p| !p.to_requester.is_empty(), "the ACK at the requester");
    for i in 1..9 {
        p.write(100 + i, i == 8);
    }
    p.run_until(|p| p.to_responder.len() >= 9, "re-injection at B");
    assert!(
        p.a.engine().ingress_halves().any(|h| !h.is_idle()),
        "A holds undelivered requests"
    );
    p
}

#[test]
fn a_twin_that_vanishes_is_lost_after_the_timeout_and_its_flows_fail() {
    let mut p = pair_with_undelivered_writes();
    // And a READ outstanding at the requester (never pseudo-ACKed): the
    // loss must end in a NAK at exactly its PSN.
    let reth = Reth {
        va: 0x1000,
        rkey: 7,
        len: 4096,
    };
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let pkt = request(ip, Opcode::RC_READ_REQUEST, 109, true, reth, &[]);
    p.a.handle_dc(p.now, &pkt);
    p.run_until(|p| p.to_responder.len() >= 10, "the READ at B");
    assert_eq!(p.error_naks(), 0);
    // The twin vanishes: nothing crosses the WAN any more.
    p.wan_up = false;
    let cut = p.now;
    p.run_until(
        |p| matches!(p.a.twin_state(), TwinState::Unreachable { .. }),
        "path down",
    );
    assert!(
        !p.a.is_connected(),
        "never 'connected' with every path down"
    );
    let TwinState::Unreachable { since } = p.a.twin_state() else {
        unreachable!()
    };
    p.run_until(|p| p.a.twin_state().is_lost(), "twin lost");
    let lost = p.lost_events();
    assert_eq!(lost.len(), 1, "{:?}", p.events_a);
    let (at, failed) = lost[0];
    // Exactly the timeout after every path went down, and within a second
    // of down detection after the cut.
    assert_eq!(at, since + TWIN_TIMEOUT);
    assert!(since - cut < Duration::from_secs(1), "{:?}", since - cut);
    assert_eq!(failed, 1, "the one half with undelivered requests");
    assert_eq!(p.error_naks(), 1, "the requester is told, once");
    let nak = p
        .to_requester
        .iter()
        .filter_map(|x| RocePacket::parse_verified(x).ok())
        .find(|x| matches!(x.ext.aeth.map(|a| a.syndrome), Some(Syndrome::Nak(_))))
        .unwrap();
    assert_eq!(nak.psn(), Psn::new(109), "at the outstanding READ");
    // A new request while lost is refused at once with an error NAK.
    p.write(110, true);
    assert_eq!(p.error_naks(), 2, "refused while the twin is lost");
    assert_eq!(p.a.twin_counters().rx_refused_twin_lost, 1);
    let tw = p.a.twin_counters();
    assert_eq!((tw.twin_lost, tw.flows_failed_twin_lost), (1, 1));
    assert!(!p.a.is_connected());
    // Reported once, however long it stays lost.
    p.run_for(Duration::from_secs(20));
    assert_eq!(p.lost_events().len(), 1);
}

#[test]
fn an_outage_shorter_than_the_twin_timeout_fails_nothing() {
    let mut p = pair_with_undelivered_writes();
    // A live responder this time: nothing fails for its own sake.
    p.auto_ack = true;
    p.wan_up = false;
    p.run_until(
        |p| matches!(p.a.twin_state(), TwinState::Unreachable { .. }),
        "path down",
    );
    p.run_for(TWIN_TIMEOUT - Duration::from_secs(1));
    p.wan_up = true;
    p.run_until(|p| p.a.is_connected(), "path back");
    p.run_for(Duration::from_secs(10));
    assert!(p.lost_events().is_empty(), "{:?}", p.events_a);
    assert_eq!(p.error_naks(), 0);
    assert_eq!(p.a.twin_counters().flows_failed_twin_lost, 0);
    // The flow goes on: more WRITEs cross.
    p.write(109, true);
    p.run_until(|p| p.to_responder.len() >= 10, "a WRITE after the outage");
}

#[test]
fn a_lost_twin_that_answers_again_is_back() {
    let mut p = pair_with_undelivered_writes();
    p.wan_up = false;
    p.run_until(|p| p.a.twin_state().is_lost(), "twin lost");
    p.wan_up = true;
    p.run_until(|p| p.a.is_connected(), "twin back");
    assert!(
        p.events_a
            .iter()
            .any(|(_, e)| matches!(e, SiteEvent::TwinBack { .. })),
        "{:?}",
        p.events_a
    );
    // The twin saw a new generation from A (A rebuilt its session when it
    // declared the twin lost), so nothing queued for the failed flows is
    // delivered late.
    assert_eq!(p.a.twin_state(), TwinState::Connected);
}

#[test]
fn the_acl_keeps_other_prefixes_out_both_ways() {
    let mut p = Pair::new();
    // From outside the local prefixes: refused, counted.
    let spoofed = IpHeader::v4(Ipv4Addr::new(10, 9, 0, 1), RESPONDER);
    let pkt = request(spoofed, Opcode::RC_WRITE_ONLY, 1, true, EMPTY_RETH, &[]);
    assert_eq!(p.a.handle_dc(p.now, &pkt), None);
    let to_local = IpHeader::v4(REQUESTER, Ipv4Addr::new(10, 1, 0, 2));
    let pkt = request(to_local, Opcode::RC_WRITE_ONLY, 1, true, EMPTY_RETH, &[]);
    assert_eq!(p.a.handle_dc(p.now, &pkt), None);
    let c = p.a.dc_counters();
    assert_eq!((c.rx_acl_source, c.rx_acl_destination), (1, 1));
    assert_eq!(p.a.handle_dc(p.now, &[0x45, 0, 0]), None);
    assert_eq!(p.a.dc_counters().rx_malformed, 1);
    p.run_for(Duration::from_millis(20));
    assert!(p.to_responder.is_empty(), "nothing crossed");
}

/// Requests the requester's site sent its data center that the engine
/// originated: (source, destination QP, opcode, PSN, payload length).
fn poison_packets(p: &Pair) -> Vec<(Ipv4Addr, u32, Opcode, u32, usize)> {
    p.to_requester
        .iter()
        .filter_map(|x| RocePacket::parse_verified(x).ok())
        .filter(|x| x.info.is_request())
        .map(|x| {
            let std::net::IpAddr::V4(src) = x.ip.src() else {
                panic!("v4")
            };
            (
                src,
                x.bth.dest_qp,
                x.bth.opcode,
                x.psn().value(),
                x.payload().len(),
            )
        })
        .collect()
}

#[test]
fn a_restarted_near_gateway_is_told_its_orphaned_qps_and_moves_them_to_error() {
    // Site A pseudo-ACKed WRITEs 101..108 of REQUESTER's QP 0x11: it has
    // nothing outstanding. Then A crashes (kill -9) and restarts at once
    // with nothing: only B knows that QP (its number from the responder's
    // ACKs). Before this, nobody told it: a requester waiting for a SEND
    // would wait for ever (issue 14, the lab's rping and pingpong).
    let mut p = pair_with_undelivered_writes();
    assert_eq!(p.error_naks(), 0);
    let crash = p.now;
    p.a = site_from(true, 0x7000);
    p.to_requester.clear();
    p.run_until(|p| p.a.is_connected(), "the new incarnation connects");
    p.run_until(|p| !poison_packets(p).is_empty(), "the orphan at A");
    let told = p.now - crash;
    // Its ePSN as a responder is unknown at B (RESPONDER never sent it a
    // request): the restarted A probes it, in RESPONDER's name.
    let probes = poison_packets(&p);
    assert_eq!(
        probes,
        vec![
            (RESPONDER, 0x11, Opcode::RC_SEND_MIDDLE, 0, 0),
            (RESPONDER, 0x11, Opcode::RC_SEND_MIDDLE, 1 << 23, 0),
        ]
    );
    let e = &p.a.engine().stats;
    assert_eq!((e.orphans_received, e.orphan_qps_probed), (1, 1));
    assert!(p.b.engine().stats.orphans_told >= 1);
    // The QP answers a probe ahead of its ePSN with a NAK-seq at it (40);
    // the poison goes there.
    let to = builders::ReplyTo {
        ip: IpHeader::v4(REQUESTER, RESPONDER),
        src_port: 0xc000,
        dest_qp: RS_QPN,
    };
    let mut pkt = vec![0; 256];
    let n = builders::nak(&to, Psn::new(40), crate::roce::NakCode::PsnSequenceError, 0)
        .emit(&[], &mut pkt)
        .unwrap();
    p.a.handle_dc(p.now, &pkt[..n]);
    p.drain();
    assert_eq!(
        poison_packets(&p)[2..],
        [(RESPONDER, 0x11, Opcode::RC_SEND_MIDDLE, 40, 0)]
    );
    println!(
        "near gateway restart: its orphaned QP probed {:.1} ms after the crash \
         (virtual time; WAN one way {:.1} ms)",
        told.as_secs_f64() * 1e3,
        ONE_WAY.as_secs_f64() * 1e3
    );
}

/// A reload that widens the local prefixes lets a new host's flows cross at
/// once; one that narrows them refuses the host's packets (counted); a
/// buffer size change is reported as needing a restart and leaves the
/// running slots alone.
#[test]
fn a_reload_applies_the_new_acl_and_names_what_needs_a_restart() {
    let mut p = Pair::new();
    let newcomer = Ipv4Addr::new(10, 3, 0, 1);
    let send = |p: &mut Pair| {
        let ip = IpHeader::v4(newcomer, RESPONDER);
        let pkt = request(ip, Opcode::RC_WRITE_ONLY, 1, true, EMPTY_RETH, &[]);
        p.a.handle_dc(p.now, &pkt)
    };
    assert_eq!(send(&mut p), None, "10.3/16 is not local yet");
    let mut wider = p.a.params().clone();
    wider.acl.local.push("10.3.0.0/16".parse().unwrap());
    wider.engine.buffer_slots *= 2;
    let r = p.a.reconfigure(wider.clone(), p.now);
    assert!(r
        .applied
        .contains(&"dc.local_prefixes / dc.remote_prefixes"));
    assert_eq!(r.need_restart, vec!["buffer.size / buffer.slot_bytes"]);
    assert!(r.paths.is_empty(), "{r:?}");
    assert_eq!(
        p.a.engine().config().buffer_slots,
        EngineConfig::default().buffer_slots,
        "the running slots stay"
    );
    assert_eq!(send(&mut p), Some(IpAddr::V4(newcomer)), "now it crosses");
    let mut narrower = wider;
    narrower.acl.local.pop();
    p.a.reconfigure(narrower, p.now);
    let before = p.a.dc_counters().rx_acl_source;
    assert_eq!(send(&mut p), None, "refused again");
    assert_eq!(p.a.dc_counters().rx_acl_source, before + 1);
}

#[test]
fn a_forged_request_is_counted_as_forged_even_while_requests_are_refused() {
    // While draining (or above the twin queue's high water: the same
    // refusal) a new request is refused before the engine sees it. A
    // packet whose ICRC is wrong is no request of any host: it must be
    // counted as bad ICRC, not as a request refused for backpressure
    // (soya-soak counts its DC-side forgeries that way, and lost a few
    // whenever one arrived at a busy moment).
    let mut p = Pair::new();
    p.a.start_drain();
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let good = request(ip, Opcode::RC_WRITE_ONLY, 1, true, EMPTY_RETH, &[]);
    p.a.handle_dc(p.now, &good);
    assert_eq!(
        p.a.dc_counters().rx_draining,
        1,
        "a real request is refused"
    );
    let mut forged = good.clone();
    *forged.last_mut().unwrap() ^= 0xff;
    p.a.handle_dc(p.now, &forged);
    assert_eq!(p.a.dc_counters().rx_draining, 1, "a forgery is no request");
    assert_eq!(p.a.engine().stats.dc_bad_icrc, 1);
}

#[test]
fn a_draining_gateway_takes_resends_and_refuses_new_requests() {
    // The drain before a planned restart waits until every request its
    // halves forwarded is answered; one lost on the way is answered only
    // once the requester's resend of it gets through, so a resend goes in
    // while a new request is refused.
    let mut p = Pair::new();
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let write = |psn| request(ip, Opcode::RC_WRITE_ONLY, psn, true, EMPTY_RETH, &[]);
    for psn in [10, 11] {
        p.a.handle_dc(p.now, &write(psn));
    }
    p.run_until(|p| p.to_responder.len() == 2, "both at the responder");
    p.a.start_drain();
    assert!(!p.a.is_restartable(), "two requests unanswered");
    let accepted = p.a.dc_counters().rx_accepted;
    p.a.handle_dc(p.now, &write(11));
    assert_eq!(
        p.a.dc_counters().rx_accepted,
        accepted + 1,
        "a resend goes in"
    );
    assert_eq!(p.a.dc_counters().rx_draining, 0);
    p.a.handle_dc(p.now, &write(12));
    assert_eq!(p.a.dc_counters().rx_draining, 1, "a new request is refused");
    // The responder's ACK of both: nothing is owed, the drain is done.
    p.auto_ack = true;
    p.a.handle_dc(p.now, &write(11));
    p.run_until(|p| p.a.is_restartable(), "the drain done");
}

#[test]
fn a_draining_gateway_takes_the_rest_of_a_message_begun() {
    // A WRITE of three packets cut by the drain after its first: refusing
    // the rest would leave the half owing its requester the message's end
    // for ever (the drain would time out and fail the QP).
    let mut p = Pair::new();
    p.auto_ack = true;
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let reth = Reth {
        va: 0x1000,
        rkey: 7,
        len: 3 * 256,
    };
    let part = |op, psn: u32| {
        request(
            ip,
            op,
            psn,
            op == Opcode::RC_WRITE_LAST,
            reth,
            &[psn as u8; 256],
        )
    };
    p.a.handle_dc(p.now, &part(Opcode::RC_WRITE_FIRST, 20));
    p.run_until(
        |p| p.to_responder.len() == 1,
        "the first packet at the responder",
    );
    p.a.start_drain();
    p.a.handle_dc(p.now, &part(Opcode::RC_WRITE_MIDDLE, 21));
    p.a.handle_dc(p.now, &part(Opcode::RC_WRITE_LAST, 22));
    assert_eq!(
        p.a.dc_counters().rx_draining,
        0,
        "the rest of the message goes in"
    );
    p.a.handle_dc(p.now, &part(Opcode::RC_WRITE_FIRST, 23));
    assert_eq!(p.a.dc_counters().rx_draining, 1, "a new message is refused");
    p.run_until(|p| p.a.is_restartable(), "the drain done");
    assert_eq!(p.to_responder.len(), 3, "the whole message, nothing more");
}

/// Two QPs between the requester and the responder hosts: (responder
/// QPN, requester QPN). Their answers share one response flow.
const QP_X: (u32, u32) = (RS_QPN, 0x11);
const QP_Y: (u32, u32) = (0x23, 0x12);

/// A READ of `n` × 1 KiB at PSN `psn` on `qp`, as the requester sends it.
fn read_request(qp: (u32, u32), psn: u32, n: u32) -> Vec<u8> {
    let reth = Reth {
        va: 0x10_0000 + u64::from(psn) * 1024,
        rkey: 7,
        len: n * 1024,
    };
    let ip = IpHeader::v4(REQUESTER, RESPONDER);
    let mut pkt = vec![0; 256];
    let len = builders::request(ip, qp.0, Opcode::RC_READ_REQUEST, Psn::new(psn), true, reth)
        .emit(&[], &mut pkt)
        .unwrap();
    pkt.truncate(len);
    pkt
}

/// The responder's answer to [`read_request`]`(qp, psn, n)`.
fn read_responses(qp: (u32, u32), psn: u32, n: u32) -> Vec<Vec<u8>> {
    let to = builders::ReplyTo {
        ip: IpHeader::v4(RESPONDER, REQUESTER),
        src_port: 0xc000,
        dest_qp: qp.1,
    };
    (0..n)
        .map(|i| {
            let op = Opcode::read_response(i == 0, i == n - 1);
            builders::response(&to, op, Psn::new(psn + i), Syndrome::ACK_UNLIMITED, 1)
                .to_vec(&[0xcd; 1024])
                .unwrap()
        })
        .collect()
}

/// PSNs of the READ responses `qp`'s requester received, in order.
fn responses_received(p: &Pair, qp: (u32, u32)) -> Vec<u32> {
    p.to_requester
        .iter()
        .filter_map(|b| RocePacket::parse(b).ok())
        .filter(|r| r.info.kind == OpKind::ReadResponse && r.bth.dest_qp == qp.1)
        .map(|r| r.psn().value())
        .collect()
}

/// READs the egress at B passed on to the responder.
fn reads_at_responder(p: &Pair) -> usize {
    p.to_responder
        .iter()
        .filter_map(|b| RocePacket::parse_verified(b).ok())
        .filter(|r| r.info.kind == OpKind::ReadRequest)
        .count()
}

/// READs forwarded as is that reached B's egress (injected or not).
fn reads_at_egress(p: &Pair) -> u64 {
    p.b.engine()
        .egress_halves()
        .map(|r| r.stats.raw_injected)
        .sum()
}

/// Size of the big READ below (KiB): far more than the WAN transport
/// takes at once (its 8 MiB flow window with a small buffer, plus 1 MiB),
/// so that most of its answer waits in B's response flow.
const BIG_READ: u32 = 40_000;

/// A pair whose WAN transport takes at most ~9 MiB of a flow at once.
fn small_window_pair() -> Pair {
    let engine = EngineConfig {
        buffer_slots: 1024,
        ..EngineConfig::default()
    };
    Pair::with(
        site_with(true, 0x1000, engine),
        site_with(false, 0x2000, engine),
    )
}

/// The requester at A sends `reads` (QP, PSN, KiB) through the pair, the
/// responder at B answers them all at once (DC speed), in that order:
/// most of the answers wait at B for the WAN.
fn answers_waiting_at_b(reads: &[((u32, u32), u32, u32)]) -> Pair {
    let mut p = small_window_pair();
    for &(qp, psn, n) in reads {
        p.a.handle_dc(p.now, &read_request(qp, psn, n));
    }
    p.run_until(|p| reads_at_responder(p) == reads.len(), "the READs at B");
    for &(qp, psn, n) in reads {
        for r in read_responses(qp, psn, n) {
            p.b.handle_dc(p.now, &r);
        }
    }
    p.drain();
    let waiting = p.b.twin_counters().pending_messages;
    assert!(
        waiting > u64::from(BIG_READ) / 2,
        "the premise: most answers wait at B ({waiting} responses)"
    );
    p
}

/// Issue 18, sweep seed 3408 (3 QPs between two hosts, READs, a WAN ten
/// times slower than the datacenter, hardware requesters): a requester's
/// 2 ms timer fires while its READ's answer still waits at the
/// responder's gateway behind another QP's, and it re-issues the READ.
/// Injected, the re-issue had the responder replay the answer behind the
/// copy already waiting (seed 3408: ~85 responses sent per one needed,
/// and the queue's bound reached). The waiting answer reaches the
/// requester first and in order: the re-issue is redundant.
#[test]
fn a_resent_read_whose_answer_waits_for_the_wan_is_not_replayed() {
    let mut p = answers_waiting_at_b(&[(QP_Y, 5000, BIG_READ), (QP_X, 1000, 64)]);
    // X's requester has heard nothing for 2 ms: the same READ again.
    p.now += Duration::from_millis(2);
    p.a.handle_dc(p.now, &read_request(QP_X, 1000, 64));
    p.run_until(|p| reads_at_egress(p) == 3, "the resent READ at B");
    assert_eq!(
        reads_at_responder(&p),
        2,
        "a READ whose answer waits at B is not replayed by the responder"
    );
    assert_eq!(p.b.twin_counters().read_replays_suppressed, 1);
    // The waiting answer completes the READ, each response once, in order.
    p.run_until(|p| p.b.is_drained(), "B drained");
    p.run_for(Duration::from_millis(10));
    assert!(responses_received(&p, QP_X).into_iter().eq(1000..1064));
    assert_eq!(p.b.twin_counters().pending_overflow, 0);
}

/// The other case: the requester lost one response in its datacenter (it
/// had left B already) and re-issues the READ from there. The responder
/// must replay it, and the rest of the old answer still waiting at B is
/// dead: a go-back-N requester drops every response past the one it
/// expects until the replay comes, behind them. They are dropped at B
/// instead of crossing the WAN, and the replay completes the READ.
#[test]
fn a_resent_read_after_a_loss_is_replayed_and_the_dead_answer_dropped() {
    let mut p = answers_waiting_at_b(&[(QP_X, 1000, BIG_READ)]);
    p.run_until(
        |p| responses_received(p, QP_X).len() > 2,
        "the first responses",
    );
    // The requester lost 1001 in its datacenter; it asks for the rest.
    let lost = 1001;
    p.now += Duration::from_millis(2);
    p.a.handle_dc(p.now, &read_request(QP_X, lost, BIG_READ - 1));
    p.run_until(|p| reads_at_egress(p) == 2, "the resent READ at B");
    assert_eq!(reads_at_responder(&p), 2, "the re-issue is replayed");
    for r in read_responses(QP_X, lost, BIG_READ - 1) {
        p.b.handle_dc(p.now, &r);
    }
    p.run_until(|p| p.b.is_drained(), "B drained");
    p.run_for(Duration::from_millis(10));
    // The requester (go-back-N, 1001 lost) takes each next PSN only.
    let mut expected = 1000;
    let mut lost_once = false;
    let mut useless = 0u64;
    for psn in responses_received(&p, QP_X) {
        if psn == lost && !lost_once {
            lost_once = true;
        } else if psn == expected {
            expected += 1;
        } else {
            useless += 1;
        }
    }
    let dropped = p.b.twin_counters().stale_read_responses_dropped;
    assert!(
        useless < u64::from(BIG_READ) / 4,
        "{useless} responses crossed the WAN only to be discarded ({dropped} dropped at B)"
    );
    assert_eq!(expected, 1000 + BIG_READ, "the replay completes the READ");
    assert_eq!(p.b.twin_counters().pending_overflow, 0);
}
