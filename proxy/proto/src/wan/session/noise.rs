//! Session setup with identity keys: the Noise IKpsk2 handshake
//! (`handshake`) carried in HELLO datagrams, in place of the PSK HELLO
//! exchange when [`Session::set_identity`] was called.
//!
//! ```text
//!  client (initiator, nonce a)                 server (responder, nonce b)
//!  INITIATION(a: e, es, s, ss)  ───────▶       answered: pending (a, keys)
//!                               ◀───────       RESPONSE(b: e, ee, se, psk)
//!  commit (a,b): keys           ───────▶       first protected packet that
//!  protected packets            ◀──────▶       opens: commit (a,b)
//! ```
//!
//! The client commits on the RESPONSE to its own current INITIATION: it
//! depends on the client's fresh ephemeral key, so it cannot be a replay.
//! The server cannot tell a replayed INITIATION from a fresh one, so it
//! only holds the keys as *pending* and commits when a protected packet
//! authenticates under them (key confirmation, as WireGuard's responder
//! waits for the first data packet). The client sends PINGs at once on
//! commit, so the server commits half a round trip after the client, as
//! with a PSK: the handshake adds no round trip.
//!
//! Loss, duplication and reordering: the client sends its INITIATION,
//! byte for byte the same, on every HELLO round until the server confirms
//! (a protected packet arrives); the server answers every copy of an
//! INITIATION it holds (pending or current) with the RESPONSE it gave it,
//! and also repeats the last one on its own HELLO rounds until it commits.
//! A replayed INITIATION (say, of an earlier generation) is answered, but
//! never displaces the genuine pending handshake of another client
//! generation. A RESPONSE to an initiation already answered, or to none, is
//! stale and changes nothing. A client whose session stays unconfirmed for
//! [`UNCONFIRMED_ROUNDS`] HELLO rounds (the server lost the pending keys)
//! starts over with a new ephemeral key.
//!
//! A server without a session sends *probes* (a PSK-style HELLO: the body
//! under the PSK MAC, or a CRC without a PSK): a client whose session has
//! another server nonce (the server restarted) initiates anew; a probe
//! with the nonce of the client's session, confirmed or not, is stale.
//! A probe moves no keys; a forged one costs the client one INITIATION,
//! and the genuine server's answer to it, for the confirmed server nonce,
//! is stale: the session stands.

use std::collections::VecDeque;

use crate::time::Time;

use super::*;
use crate::wan::crypto::SessionKeys;
use crate::wan::handshake;
use crate::wan::handshake::{
    HandshakeError, Identity, Initiation, Responder, INIT_MSG_LEN, REKEY_INIT_MSG_LEN, RESP_MSG_LEN,
};

/// A whole INITIATION datagram.
pub const INIT_LEN: usize = HEADER_LEN + INIT_MSG_LEN;
/// A whole REKEY INITIATION datagram (`rekey`).
pub const REKEY_INIT_LEN: usize = HEADER_LEN + REKEY_INIT_MSG_LEN;
/// A whole RESPONSE datagram.
pub const RESP_LEN: usize = HEADER_LEN + RESP_MSG_LEN;
/// Answered initiations the server holds (distinct client nonces).
const PENDING: usize = 4;
/// HELLO rounds a client waits, committed, for the server's first packet
/// before it starts a new handshake.
pub const UNCONFIRMED_ROUNDS: u32 = 8;

/// The identity-mode state of a [`Session`].
pub struct Noise {
    pub identity: Identity,
    /// The PSK mixed in (zeros when none is configured).
    psk: [u8; 32],
    /// Client: the handshake in flight, or answered and awaiting
    /// confirmation.
    initiation: Option<Initiation>,
    unconfirmed_rounds: u32,
    /// Server: sessions answered but not confirmed, by client nonce.
    pending: VecDeque<Pending>,
    /// Server: the INITIATION and RESPONSE of the current session.
    current: Option<Exchange>,
    /// Server: the RESPONSE our HELLOs carry (the last one asked for).
    pub(super) answered: Option<Exchange>,
    /// The keys before an operator's rotation (`rotate`).
    pub(super) previous: Option<super::rotate::Previous>,
}

impl Noise {
    pub fn new(identity: Identity, psk: Option<&[u8; 32]>) -> Noise {
        Noise {
            identity,
            psk: psk.copied().unwrap_or([0; 32]),
            initiation: None,
            unconfirmed_rounds: 0,
            pending: VecDeque::new(),
            current: None,
            answered: None,
            previous: None,
        }
    }

    /// New keys (`rotate`); returns the ones replaced.
    pub(super) fn replace_keys(
        &mut self,
        identity: Identity,
        psk: [u8; 32],
    ) -> (Identity, [u8; 32]) {
        let old = (self.identity.clone(), self.psk);
        self.identity = identity;
        self.psk = psk;
        old
    }

    /// The PSK mixed in (zeros when none is configured).
    pub(super) fn psk(&self) -> &[u8; 32] {
        &self.psk
    }
}

/// An INITIATION and the RESPONSE it got: a copy of the INITIATION gets
/// the same RESPONSE (the server's ephemeral key is not drawn again, so
/// the keys the client may already have committed to stay valid).
#[derive(Clone)]
pub struct Exchange {
    pub(super) init: Vec<u8>,
    resp: Vec<u8>,
}

impl Exchange {
    pub(super) fn new(init: Vec<u8>, resp: Vec<u8>) -> Exchange {
        Exchange { init, resp }
    }
}

/// A session answered but not confirmed yet.
pub struct Pending {
    peer: Peer,
    exchange: Exchange,
    /// Protected packets of its generation that did not open under it.
    misses: u32,
}

/// Protected packets of a pending session's generation that fail to open
/// under its keys before it is dropped. Each is tried on a copy, an extra
/// AEAD pass: a pending session no client completes (a replayed
/// INITIATION of the current client generation, whose packets all open
/// under the current keys) costs at most this many, not one per packet for
/// the rest of the session. A genuine client's first packet opens.
const PENDING_MISSES: u32 = 64;

pub(super) fn body(h: &Hello) -> [u8; HELLO_BODY_LEN] {
    let mut b = [0u8; HELLO_BODY_LEN];
    h.encode(&mut b);
    b
}

impl Session {
    /// Switches this session to identity keys: the Noise IKpsk2 handshake
    /// sets up every session from now on; the PSK (if any) is mixed in.
    /// `offer`: the ciphers to offer.
    pub fn set_identity(&mut self, identity: Identity, offer: CipherOffer) {
        self.noise = Some(Noise::new(identity, self.psk.as_ref()));
        self.offer = offer;
    }

    /// This side's HELLO body (`echo`: the peer nonce it answers).
    pub(super) fn my_body(&self, echo: u64) -> Hello {
        Hello {
            nonce: self.my_nonce,
            echo,
            flow_window: self.flow_window,
            max_datagram: self.max_datagram,
            committed: false,
            offer: self.offer,
        }
    }

    /// A HELLO's header, written at the start of `buf` (both HELLO forms).
    pub(super) fn hello_header(&mut self, path: u8, buf: &mut [u8]) {
        let hdr = Header {
            kind: PacketKind::Hello,
            insecure: self.insecure(),
            client: self.is_client,
            key_phase: false,
            path,
            conn_id: 0,
            generation: self.generation(),
            pn: self.hello_pn & MAX_PN,
        };
        self.hello_pn += 1;
        let mut h = [0u8; HEADER_LEN];
        hdr.encode(&mut h);
        buf[..HEADER_LEN].copy_from_slice(&h);
    }

    /// A new INITIATION (a fresh ephemeral key), answering `echo`.
    fn initiate(&mut self, echo: u64) {
        self.abandon_rekey();
        let b = body(&self.my_body(echo));
        let context = self.context.clone();
        let Some(n) = self.noise.as_mut() else {
            return;
        };
        match Initiation::new(&n.identity, &n.psk, &context, &b) {
            Ok(i) => n.initiation = Some(i),
            Err(e) => tracing::warn!(cause = %e, "cannot start the WAN handshake"),
        }
        n.unconfirmed_rounds = 0;
    }

    /// Identity mode: what [`Session::write_hello`] writes.
    pub fn write_noise_hello(&mut self, path: u8, buf: &mut [u8]) -> usize {
        if self.is_client {
            if self.noise.as_ref().is_some_and(|n| n.initiation.is_none()) {
                let echo = self.peer.as_ref().map_or(0, |p| p.nonce);
                self.initiate(echo);
            }
            let rekey = self.rekey_message().filter(|_| !self.initiating());
            let Some(msg) = rekey.or_else(|| {
                self.noise
                    .as_ref()
                    .and_then(|n| n.initiation.as_ref())
                    .map(|i| i.message.clone())
            }) else {
                return 0;
            };
            if buf.len() < HEADER_LEN + msg.len() {
                return 0;
            }
            self.hello_header(path, buf);
            buf[HEADER_LEN..HEADER_LEN + msg.len()].copy_from_slice(&msg);
            return HEADER_LEN + msg.len();
        }
        // Server: the last RESPONSE until a session stands, else a probe.
        let resp = self
            .noise
            .as_ref()
            .and_then(|n| n.answered.as_ref())
            .map(|x| x.resp.clone());
        match resp {
            Some(msg) if buf.len() >= HEADER_LEN + msg.len() => {
                self.hello_header(path, buf);
                buf[HEADER_LEN..HEADER_LEN + msg.len()].copy_from_slice(&msg);
                HEADER_LEN + msg.len()
            }
            Some(_) => 0,
            None if self.peer.is_none() => self.write_probe(path, buf),
            None => 0,
        }
    }

    fn write_probe(&mut self, path: u8, buf: &mut [u8]) -> usize {
        if buf.len() < HELLO_LEN {
            return 0;
        }
        self.hello_header(path, buf);
        let b = body(&self.my_body(0));
        buf[HEADER_LEN..HEADER_LEN + HELLO_BODY_LEN].copy_from_slice(&b);
        let tag = self.auth.tag(&buf[..HEADER_LEN + HELLO_BODY_LEN]);
        buf[HEADER_LEN + HELLO_BODY_LEN..HELLO_LEN].copy_from_slice(&tag);
        HELLO_LEN
    }

    /// One periodic HELLO round went out (identity mode).
    pub fn on_noise_round(&mut self) {
        let unconfirmed = self.is_client && self.peer.is_some() && !self.confirmed;
        let Some(n) = self.noise.as_mut() else {
            return;
        };
        if unconfirmed && n.initiation.as_ref().is_some_and(|i| i.is_done()) {
            n.unconfirmed_rounds += 1;
            if n.unconfirmed_rounds > UNCONFIRMED_ROUNDS {
                let echo = self.peer.as_ref().map_or(0, |p| p.nonce);
                self.initiate(echo);
            }
        }
    }

    /// Identity mode: acts on a HELLO datagram (an INITIATION, a RESPONSE
    /// or a probe, told apart by length).
    pub fn on_noise_hello(&mut self, hdr: &Header, bytes: &[u8], now: Time) -> HelloVerdict {
        if hdr.client == self.is_client {
            return HelloVerdict::RoleConflict;
        }
        match (self.is_client, bytes.len()) {
            (false, INIT_LEN | REKEY_INIT_LEN) => self.on_initiation(hdr, bytes, now),
            (true, RESP_LEN) => self.on_response(hdr, &bytes[HEADER_LEN..], now),
            (true, HELLO_LEN) => self.on_probe(hdr, bytes),
            // A client HELLO of the PSK exchange: the twin has no identity
            // keys configured.
            (false, HELLO_LEN) => HelloVerdict::ModeMismatch,
            _ => HelloVerdict::Malformed,
        }
    }

    /// Checks common to both handshake bodies; `Ok` carries the cipher.
    fn check_body(&mut self, hdr: &Header, h: &Hello) -> Result<Cipher, HelloVerdict> {
        if h.nonce == self.my_nonce {
            return Err(HelloVerdict::RoleConflict);
        }
        if hdr.generation != h.nonce {
            return Err(HelloVerdict::Malformed);
        }
        if self.retired.contains(&h.nonce) {
            return Err(HelloVerdict::Retired);
        }
        agree(self.offer, h.offer).ok_or_else(|| {
            let first = self.mismatched != Some(h.nonce);
            self.mismatched = Some(h.nonce);
            HelloVerdict::CipherMismatch {
                theirs: h.offer,
                first,
            }
        })
    }

    fn new_peer(&self, h: &Hello, s: &handshake::Secrets, cipher: Cipher, now: Time) -> Peer {
        let policy = self.update_policy(Some(cipher));
        Peer {
            nonce: h.nonce,
            generation: h.nonce,
            keys: SessionKeys::from_handshake(s, self.is_client, cipher, policy, now),
            flow_window: h.flow_window,
            max_datagram: h.max_datagram,
        }
    }

    /// Makes `peer` the session; returns the generation it replaces.
    fn commit(&mut self, peer: Peer) -> Option<u64> {
        let previous = self.peer.take().map(|old| {
            if old.nonce != peer.nonce {
                if self.retired.len() >= RETIRED {
                    self.retired.pop_front();
                }
                self.retired.push_back(old.nonce);
            }
            old.generation
        });
        self.peer = Some(peer);
        self.confirmed = false;
        self.candidate = None;
        previous
    }

    fn on_initiation(&mut self, hdr: &Header, bytes: &[u8], now: Time) -> HelloVerdict {
        let msg = &bytes[HEADER_LEN..];
        let Some(n) = self.noise.as_ref() else {
            return HelloVerdict::Malformed;
        };
        // A copy of an initiation answered: the same answer.
        if let Some(x) = n.current.as_ref().filter(|x| x.init == msg) {
            let x = x.clone();
            if let Some(n) = self.noise.as_mut() {
                n.answered = Some(x);
            }
            return HelloVerdict::Known { needs_hello: true };
        }
        if msg.len() == REKEY_INIT_MSG_LEN && self.rekey_copy(msg) {
            return HelloVerdict::Answered;
        }
        let Some(n) = self.noise.as_ref() else {
            return HelloVerdict::Malformed;
        };
        if let Some(p) = n.pending.iter().find(|p| p.exchange.init == msg) {
            let x = p.exchange.clone();
            if let Some(n) = self.noise.as_mut() {
                n.answered = Some(x);
            }
            return HelloVerdict::Answered;
        }
        // After a rotation, while the keys before are accepted: answered
        // under the PSK before (the running session's, which a twin not
        // reloaded yet still has); read with our keys before if not with
        // the current ones (`rotate`).
        let previous = self.previous_keys(now).cloned();
        let psk = previous.as_ref().map_or(n.psk, |p| p.psk);
        let read = Responder::read(&n.identity, &psk, &self.context, msg);
        let read = match (read, previous) {
            (Err(_), Some(p)) => Responder::read(&p.identity, &p.psk, &self.context, msg),
            (r, _) => r,
        };
        let responder = match read {
            Ok(r) => r,
            Err(HandshakeError::UnknownPeer) => return HelloVerdict::UnknownPeer,
            Err(_) => return HelloVerdict::HandshakeFailed,
        };
        if let Some(number) = responder.rekey {
            return self.on_rekey_initiation(hdr, msg, responder, number);
        }
        let Ok(h) = Hello::decode(&responder.body) else {
            return HelloVerdict::Malformed;
        };
        let cipher = match self.check_body(hdr, &h) {
            Ok(c) => c,
            Err(v) => return v,
        };
        let mine = body(&self.my_body(h.nonce));
        let Ok((resp, secrets)) = responder.respond(&mine) else {
            return HelloVerdict::HandshakeFailed;
        };
        let peer = self.new_peer(&h, &secrets, cipher, now);
        let Some(n) = self.noise.as_mut() else {
            return HelloVerdict::Malformed;
        };
        n.pending.retain(|p| p.peer.nonce != h.nonce);
        if n.pending.len() >= PENDING {
            n.pending.pop_front();
        }
        let exchange = Exchange {
            init: msg.to_vec(),
            resp,
        };
        n.answered = Some(exchange.clone());
        n.pending.push_back(Pending {
            peer,
            exchange,
            misses: 0,
        });
        HelloVerdict::Answered
    }

    fn on_response(&mut self, hdr: &Header, msg: &[u8], now: Time) -> HelloVerdict {
        if !self.initiating() {
            // Not the session's handshake: perhaps a re-handshake's.
            return self
                .on_rekey_response(hdr, msg, now)
                .unwrap_or(HelloVerdict::Stale);
        }
        let confirmed_peer = self
            .peer
            .as_ref()
            .filter(|_| self.confirmed)
            .map(|p| p.nonce);
        let other_psk = self.previous_keys_psk(now);
        let Some(init) = self
            .noise
            .as_mut()
            .and_then(|n| n.initiation.as_mut())
            .filter(|i| !i.is_done())
        else {
            return HelloVerdict::Stale;
        };
        let Ok((b, secrets)) = init.read_response_or(msg, other_psk.as_ref()) else {
            return HelloVerdict::HandshakeFailed;
        };
        let Ok(h) = Hello::decode(&b) else {
            return HelloVerdict::Malformed;
        };
        if confirmed_peer == Some(h.nonce) {
            // An answer to an initiation a forged probe prompted: the
            // confirmed session with this server stands.
            return HelloVerdict::Stale;
        }
        let cipher = match self.check_body(hdr, &h) {
            Ok(c) => c,
            Err(v) => return v,
        };
        let peer = self.new_peer(&h, &secrets, cipher, now);
        if let Some(n) = self.noise.as_mut() {
            n.unconfirmed_rounds = 0;
        }
        HelloVerdict::Committed {
            previous: self.commit(peer),
        }
    }

    fn on_probe(&mut self, hdr: &Header, bytes: &[u8]) -> HelloVerdict {
        if !self.verify_hello(bytes) {
            return HelloVerdict::HandshakeFailed;
        }
        let Ok(h) = Hello::decode(&bytes[HEADER_LEN..HELLO_LEN - TAG_LEN]) else {
            return HelloVerdict::Malformed;
        };
        if h.nonce == self.my_nonce || hdr.generation != h.nonce {
            return HelloVerdict::RoleConflict;
        }
        if self.retired.contains(&h.nonce) {
            return HelloVerdict::Retired;
        }
        let in_flight = self
            .noise
            .as_ref()
            .and_then(|n| n.initiation.as_ref())
            .is_some_and(|i| !i.is_done());
        // A probe from the server nonce of our session is stale even before
        // the session is confirmed: the server probed before our
        // INITIATION reached it, and the probe arrived after its RESPONSE
        // (a race of a few milliseconds at start-up). Initiating again
        // would replace a session both sides just made with a second one
        // of the same generation, which the twin reports as a restart and
        // which resets every flow. A server that really lost our pending
        // keys keeps probing, and `on_noise_round` starts over after
        // `UNCONFIRMED_ROUNDS` rounds.
        let current = self.peer.as_ref().is_some_and(|p| p.nonce == h.nonce);
        if current {
            return HelloVerdict::Stale;
        }
        if !in_flight {
            self.initiate(h.nonce);
        }
        HelloVerdict::Probe
    }

    /// Server: a handshake answered for client generation `generation`
    /// waits for its first protected packet.
    pub fn pending_mut(&mut self, generation: u64) -> Option<&mut Peer> {
        self.noise
            .as_mut()?
            .pending
            .iter_mut()
            .map(|p| &mut p.peer)
            .find(|p| p.generation == generation)
    }

    /// Server: a protected packet of `generation` did not open under its
    /// pending keys; after [`PENDING_MISSES`] the pending session is dropped.
    pub fn pending_missed(&mut self, generation: u64) {
        let Some(n) = self.noise.as_mut() else {
            return;
        };
        n.pending.retain_mut(|p| {
            if p.peer.generation != generation {
                return true;
            }
            p.misses += 1;
            p.misses < PENDING_MISSES
        });
    }

    /// Server: sessions answered and not confirmed (tests).
    #[cfg(test)]
    pub fn pending_count(&self) -> usize {
        self.noise.as_ref().map_or(0, |n| n.pending.len())
    }

    /// Client: a handshake is in flight (not answered yet).
    pub fn initiating(&self) -> bool {
        self.noise
            .as_ref()
            .and_then(|n| n.initiation.as_ref())
            .is_some_and(|i| !i.is_done())
    }

    /// Server: a protected packet authenticated under the pending keys of
    /// `generation`: that session is confirmed and replaces the current
    /// one. Returns `Some(previous)` (as `Committed`), `None` if no such
    /// pending session.
    pub fn promote(&mut self, generation: u64) -> Option<Option<u64>> {
        let n = self.noise.as_mut()?;
        let i = n
            .pending
            .iter()
            .position(|p| p.peer.generation == generation)?;
        let Pending { peer, exchange, .. } = n.pending.remove(i)?;
        n.current = Some(exchange);
        Some(self.commit(peer))
    }
}
