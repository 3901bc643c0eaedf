//! The periodic re-handshake (identity mode): every `rekey_interval` the
//! client runs the Noise IKpsk2 handshake again *inside* the running
//! session, so that a fresh ephemeral–ephemeral DH bounds what a stolen
//! traffic secret exposes. The session stays: generation, connection id,
//! flows, packet numbers, replay windows, recovery; only the traffic
//! secrets change, through the key-phase switch of `keyphase` (no pause).
//!
//! ```text
//!  client (nonce a)                              server (nonce b)
//!  REKEY INITIATION(a, echo b, number n) ──▶     offers c2s' (rx), holds s2c'
//!                                        ◀──     RESPONSE(b, echo a)
//!  offers s2c' (rx), arms c2s' (tx):
//!  next update moves to c2s'           ──▶       first packet under c2s'
//!                                                authenticates: arms s2c'
//!  first packet under s2c': done       ◀──       next update moves to s2c'
//! ```
//!
//! - The REKEY INITIATION is an INITIATION whose payload also carries the
//!   *rekey number* (u64, 1, 2, … per client generation): the server takes
//!   only a number above the last it answered, as WireGuard takes only a
//!   newer TAI64N timestamp, so a replayed one (of this session or an
//!   earlier one) is refused and counted (`replays_dropped`) and can never
//!   displace the genuine re-handshake's keys. A copy of the one answered
//!   gets the same RESPONSE.
//! - Lost or reordered messages: the client sends its REKEY INITIATION,
//!   the same bytes, on every HELLO round (10 ms doubling to 1 s) until the
//!   RESPONSE arrives; data flows under the current keys meanwhile.
//! - The switch is a key update of each direction: the old keys stay
//!   readable for `retain` after it, so retransmissions and late packets
//!   across it open; a packet sealed under a key older than that fails
//!   authentication (its data is retransmitted like a lost packet's).

use super::noise::Exchange;
use super::*;
use crate::wan::handshake::{Initiation, Responder};

/// Default [`Tuning::rekey_interval`](crate::wan::Tuning): two minutes, as
/// WireGuard's `REKEY_AFTER_TIME` (`wan.rekey_interval`'s default).
pub const REKEY_INTERVAL: Duration = soya_config::DEFAULT_REKEY_INTERVAL;

/// The re-handshake state of a [`Session`].
#[derive(Default)]
pub struct Rekey {
    /// How long after the session (or the last re-handshake) started the
    /// client starts the next one (`Duration::ZERO`: never).
    pub interval: Duration,
    /// Client: when the next re-handshake starts.
    next: Option<Time>,
    /// Client: the number of the last re-handshake started this session.
    number: u64,
    /// Client: the re-handshake in flight (its INITIATION until answered).
    init: Option<Initiation>,
    /// Client: answered; done once a packet under the server's new key
    /// authenticates.
    answered: bool,
    /// Server: the number and exchange of the last one answered.
    last: Option<(u64, Exchange)>,
    /// Re-handshakes completed (client: both directions moved; server: the
    /// client's first packet under the new key authenticated).
    pub done: u64,
    /// Client: start the next one as soon as the one in flight is done
    /// (a key rotation).
    again: bool,
}

impl Rekey {
    pub fn new(interval: Duration) -> Rekey {
        Rekey {
            interval,
            ..Rekey::default()
        }
    }
}

impl Session {
    pub fn set_rekey_interval(&mut self, interval: Duration) {
        self.rekey.interval = interval;
    }

    /// A new interval in a running session (a reload): the next
    /// re-handshake planned comes no later than `interval` from `now`
    /// (`Duration::ZERO`: none planned from now on).
    pub fn retime_rekey(&mut self, interval: Duration, now: Time) {
        self.rekey.interval = interval;
        if interval.is_zero() {
            self.rekey.next = None;
        } else if let Some(next) = self.rekey.next {
            self.rekey.next = Some(next.min(now + interval));
        }
    }

    /// A session (re)started at `now`: no re-handshake in flight; the
    /// client's first one is due an interval later.
    pub fn rekey_on_session(&mut self, now: Time) {
        let done = self.rekey.done;
        let interval = self.rekey.interval;
        self.rekey = Rekey {
            interval,
            done,
            ..Rekey::default()
        };
        if self.is_client && self.has_identity() && !interval.is_zero() {
            self.rekey.next = Some(now + interval);
        }
    }

    /// Client: when the next re-handshake starts (`None`: none planned, or
    /// one in flight, or no confirmed session).
    pub fn rekey_deadline(&self) -> Option<Time> {
        if !self.confirmed || self.peer.is_none() || self.rekey.init.is_some() {
            return None;
        }
        self.rekey.next
    }

    /// Client: the REKEY INITIATION is not answered yet (HELLO rounds go on).
    pub fn rekeying(&self) -> bool {
        self.rekey.init.as_ref().is_some_and(|i| !i.is_done())
    }

    /// Client: starts a re-handshake (a fresh ephemeral key).
    pub fn start_rekey(&mut self) {
        let Some(peer_nonce) = self.peer.as_ref().map(|p| p.nonce) else {
            return;
        };
        let b = noise_body(&self.my_body(peer_nonce));
        let Some(n) = self.noise.as_ref() else {
            return;
        };
        let number = self.rekey.number + 1;
        match Initiation::rekey(&n.identity, n.psk(), &self.context, &b, number) {
            Ok(i) => {
                self.rekey.number = number;
                self.rekey.init = Some(i);
                self.rekey.answered = false;
                // `next` stays (past): if this one is abandoned unanswered,
                // the next starts at once.
            }
            Err(e) => tracing::warn!(cause = %e, "cannot start the WAN re-handshake"),
        }
    }

    /// Client: a re-handshake now, or right after the one in flight (never
    /// two at once: the server holds the keys of the last one answered
    /// only, which the client may have armed already).
    pub fn rekey_soon(&mut self) {
        if self.rekey.init.is_none() {
            self.start_rekey();
        } else {
            self.rekey.again = true;
        }
    }

    /// Client: the REKEY INITIATION our HELLOs carry, while unanswered.
    pub fn rekey_message(&self) -> Option<Vec<u8>> {
        self.rekey
            .init
            .as_ref()
            .filter(|i| !i.is_done())
            .map(|i| i.message.clone())
    }

    /// Client: drops a re-handshake in flight and not answered yet (a
    /// handshake starts: a new session, or a probe's, which may leave the
    /// session standing); another starts when due, if the session stands.
    /// One answered goes on to its switch: the server holds its keys, and
    /// we may have armed ours, so a new one (whose keys would replace them
    /// at the server) must not start before it is done.
    pub fn abandon_rekey(&mut self) {
        if !self.rekey.answered {
            self.rekey.init = None;
        }
    }

    /// Client: a RESPONSE while a re-handshake is in flight. `None`: it is
    /// not one (no re-handshake unanswered).
    pub fn on_rekey_response(
        &mut self,
        hdr: &Header,
        msg: &[u8],
        now: Time,
    ) -> Option<HelloVerdict> {
        let other_psk = self.previous_keys_psk(now);
        let init = self.rekey.init.as_mut().filter(|i| !i.is_done())?;
        let Ok((b, secrets)) = init.read_response_or(msg, other_psk.as_ref()) else {
            return Some(HelloVerdict::HandshakeFailed);
        };
        let Ok(h) = Hello::decode(&b) else {
            return Some(HelloVerdict::Malformed);
        };
        let my_nonce = self.my_nonce;
        let offer = self.offer;
        let Some(peer) = self.peer.as_mut() else {
            return Some(HelloVerdict::Stale);
        };
        // Authentic (it answers our fresh ephemeral key), so only a
        // confused server sends another nonce or cipher: refuse it.
        if h.nonce != peer.nonce
            || hdr.generation != h.nonce
            || h.echo != my_nonce
            || agree(offer, h.offer) != peer.keys.cipher()
        {
            return Some(HelloVerdict::Malformed);
        }
        peer.keys.rekey(&secrets, true);
        self.rekey.answered = true;
        Some(HelloVerdict::Rekeyed)
    }

    /// Server: a REKEY INITIATION (read and authenticated: `responder`)
    /// numbered `number`; `msg` its bytes.
    pub(super) fn on_rekey_initiation(
        &mut self,
        hdr: &Header,
        msg: &[u8],
        responder: Responder,
        number: u64,
    ) -> HelloVerdict {
        let Ok(h) = Hello::decode(&responder.body) else {
            return HelloVerdict::Malformed;
        };
        let current = self
            .peer
            .as_ref()
            .is_some_and(|p| p.nonce == h.nonce && p.generation == hdr.generation);
        if !self.confirmed || !current || h.echo != self.my_nonce {
            // Not for the session we have (an earlier one of ours, or a
            // client that missed our restart: it learns from our probes).
            return HelloVerdict::Stale;
        }
        if self.rekey.last.as_ref().is_some_and(|(n, _)| number <= *n) {
            return HelloVerdict::Retired;
        }
        let mine = noise_body(&self.my_body(h.nonce));
        let Ok((resp, secrets)) = responder.respond(&mine) else {
            return HelloVerdict::HandshakeFailed;
        };
        let Some(peer) = self.peer.as_mut() else {
            return HelloVerdict::Stale;
        };
        if agree(self.offer, h.offer) != peer.keys.cipher() {
            return HelloVerdict::Malformed;
        }
        peer.keys.rekey(&secrets, false);
        let x = Exchange::new(msg.to_vec(), resp);
        self.rekey.last = Some((number, x.clone()));
        if let Some(n) = self.noise.as_mut() {
            n.answered = Some(x);
        }
        HelloVerdict::Answered
    }

    /// Server: a copy of the REKEY INITIATION answered last gets the same
    /// RESPONSE (no new keys). `false`: not a copy.
    pub(super) fn rekey_copy(&mut self, msg: &[u8]) -> bool {
        let Some((_, x)) = self.rekey.last.as_ref().filter(|(_, x)| x.init == msg) else {
            return false;
        };
        let x = x.clone();
        if let Some(n) = self.noise.as_mut() {
            n.answered = Some(x);
        }
        true
    }

    /// A packet authenticated under the peer's re-handshake key (both
    /// sides: `Opened::Rekeyed`). Server: our sending key follows; client:
    /// the re-handshake is done, the next one due an interval later.
    pub fn on_rekeyed(&mut self, now: Time) {
        if let Some(p) = self.peer.as_mut() {
            p.keys.on_rekeyed();
        }
        self.rekey.done += 1;
        if self.is_client {
            self.rekey.init = None;
            self.rekey.answered = false;
            if std::mem::take(&mut self.rekey.again) {
                self.rekey.next = Some(now);
            } else if !self.rekey.interval.is_zero() {
                self.rekey.next = Some(now + self.rekey.interval);
            }
        }
    }

    /// Re-handshakes completed (over the connection's life).
    pub fn rekeys_done(&self) -> u64 {
        self.rekey.done
    }
}
