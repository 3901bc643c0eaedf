//! Key updates: each direction's packet key is replaced, without a pause,
//! long before the AEAD's usage limits (docs/wan-protocol.md § Key updates).
//!
//! The scheme is QUIC's (RFC 9001 §6), adapted to twins that update each
//! direction independently and to packet numbers that are per path:
//!
//! - Each direction has a *traffic secret*; the packet key is expanded from
//!   it, and the next secret is `HKDF-Expand-Label(secret, "ku")`. The old
//!   secret is overwritten by the new one, so a key stolen from memory does
//!   not reveal the keys before it.
//! - A sender updates when the current key sealed `packets` packets or is
//!   `interval` old, but only once its peer has shown it reads the current
//!   phase (an ACK of a packet sealed under it) and `2 × retain` has passed
//!   since: so the receiver has already dropped the key before, and one
//!   header bit (the *key phase*) tells the two candidate keys apart.
//! - A receiver holds the current key, the next one (derived in advance,
//!   so that a packet of the other phase costs one AEAD pass whoever sent
//!   it) and, for `retain` after a switch, the previous one. A packet of the
//!   other phase is of the previous key when that key is still held and the
//!   packet number is below the first one seen under the current key on its
//!   path (packet numbers rise with send time on each path); otherwise it is
//!   of the next key. The switch happens only once a packet of the next key
//!   *authenticated*: a forged phase bit moves nothing.
//!
//! A periodic re-handshake (identity mode, `session::rekey`) gives each
//! direction a fresh secret from a new Diffie–Hellman: the sender *arms*
//! it ([`TxKeys::arm`]) and its next update moves to it instead of the
//! ratchet; the receiver holds it beside the ratchet's next key
//! ([`RxKeys::offer`]) and tries it when a packet of the other phase fails
//! under the ratchet's (two AEAD passes, only then and only while a
//! re-handshake is pending). Same phase bit, same rules: no pause.
//!
//! Packet numbers are never reset by an update (they are per path for the
//! session's life), so nonces stay unique under every key and the replay
//! window works across phases unchanged.
//!
//! Sans-IO: times come from the caller, nothing here reads a clock.

use std::time::Duration;

use hkdf::Hkdf;
use sha2::Sha256;

use crate::time::Time;

use super::cipher::{Cipher, PacketKey};

/// `HKDF-Expand-Label(secret, label, "", 32)` with TLS 1.3's `HkdfLabel`
/// layout (RFC 8446 §7.1: length u16, label with its length byte and a
/// `"soya "` prefix instead of `"tls13 "`, empty context).
pub fn expand_label(secret: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // A 32-byte PRK is valid for HKDF-SHA256 and 32 bytes of output far
    // below its 255 × 32 limit: neither call can fail.
    if let Ok(hk) = Hkdf::<Sha256>::from_prk(secret) {
        let full_len = (5 + label.len()) as u8;
        hk.expand_multi_info(&[&[0, 32], &[full_len], b"soya ", label, &[0]], &mut out)
            .unwrap_or_default();
    }
    out
}

/// The next traffic secret of a direction.
pub fn next_secret(secret: &[u8; 32]) -> [u8; 32] {
    expand_label(secret, b"ku")
}

/// The packet key of a traffic secret, bound to the cipher (the label ends
/// with its id: the same secret never keys two algorithms).
fn packet_key(cipher: Option<Cipher>, secret: &[u8; 32]) -> Option<PacketKey> {
    let c = cipher?;
    Some(PacketKey::new(
        c,
        &expand_label(secret, &[b'k', b'e', b'y', c.id()]),
    ))
}

/// When a sender replaces its key (`wan::Tuning`, clamped by the AEAD's
/// limit: see [`Cipher::confidentiality_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdatePolicy {
    /// Packets sealed under one key before the next update.
    pub packets: u64,
    /// Age of a key before the next update.
    pub interval: Duration,
    /// Packets one key may seal, at most, whatever happens: at this count
    /// sending stops until the update is allowed (never reached unless the
    /// peer acknowledges nothing for a long time).
    pub hard_limit: u64,
}

/// One direction's sending key.
pub struct TxKeys {
    cipher: Option<Cipher>,
    secret: [u8; 32],
    key: Option<PacketKey>,
    phase: bool,
    /// Packets sealed under the current key.
    pub sealed: u64,
    /// Keys replaced so far in this session.
    pub updates: u64,
    started: Time,
    /// When the peer was first seen reading the current phase (an ACK of a
    /// packet sealed under it); `None` until then.
    confirmed: Option<Time>,
    /// Per path, the first packet number sealed under the current key.
    first_pn: Vec<Option<u64>>,
    policy: UpdatePolicy,
    /// A re-handshake's secret: the next update moves to it.
    armed: Option<[u8; 32]>,
    /// Updates that moved to a re-handshake's secret.
    pub rekeys: u64,
}

impl TxKeys {
    /// `cipher` `None`: lab mode (no encryption; phases still switch, so
    /// that the mechanism runs in lab-mode simulations too).
    pub fn new(
        cipher: Option<Cipher>,
        secret: [u8; 32],
        policy: UpdatePolicy,
        now: Time,
    ) -> TxKeys {
        TxKeys {
            cipher,
            key: packet_key(cipher, &secret),
            secret,
            phase: false,
            sealed: 0,
            updates: 0,
            started: now,
            // The peer reads phase 0 from its commit on: nothing to wait for.
            confirmed: Some(now),
            first_pn: Vec::new(),
            policy,
            armed: None,
            rekeys: 0,
        }
    }

    pub fn phase(&self) -> bool {
        self.phase
    }

    /// A re-handshake's secret for this direction: the next update (due at
    /// once) moves to it, not to the ratchet's next secret.
    pub fn arm(&mut self, secret: [u8; 32]) {
        self.armed = Some(secret);
    }

    pub fn key(&self) -> Option<&PacketKey> {
        self.key.as_ref()
    }

    pub fn cipher(&self) -> Option<Cipher> {
        self.cipher
    }

    pub fn policy(&self) -> UpdatePolicy {
        self.policy
    }

    /// The current key is due for replacement (cheap: two comparisons;
    /// whether it *may* be replaced is [`Self::may_update`]).
    pub fn due(&self, now: Time) -> bool {
        self.armed.is_some()
            || self.sealed >= self.policy.packets
            || now >= self.started + self.policy.interval
    }

    /// The peer has shown it reads the current phase, long enough ago that
    /// it has dropped the key before (`retain`, its retention period).
    pub fn may_update(&self, now: Time, retain: Duration) -> bool {
        self.confirmed.is_some_and(|t| now >= t + retain * 2)
    }

    /// The current key may seal no more packets (its hard limit).
    pub fn exhausted(&self) -> bool {
        self.sealed >= self.policy.hard_limit
    }

    /// Replaces the key: the next secret (a re-handshake's if armed), the
    /// other phase.
    pub fn update(&mut self, now: Time) {
        self.secret = match self.armed.take() {
            Some(s) => {
                self.rekeys += 1;
                s
            }
            None => next_secret(&self.secret),
        };
        self.key = packet_key(self.cipher, &self.secret);
        self.phase = !self.phase;
        self.sealed = 0;
        self.updates += 1;
        self.started = now;
        self.confirmed = None;
        self.first_pn.iter_mut().for_each(|f| *f = None);
    }

    /// Packet `pn` was sealed on `path` under the current key.
    pub fn on_sealed(&mut self, path: usize, pn: u64) {
        self.sealed += 1;
        if self.first_pn.len() <= path {
            self.first_pn.resize(path + 1, None);
        }
        self.first_pn[path].get_or_insert(pn);
    }

    /// The peer acknowledged packets up to `largest` on `path`: if one was
    /// sealed under the current key, the peer reads this phase.
    pub fn on_acked(&mut self, path: usize, largest: u64, now: Time) {
        if self.confirmed.is_none()
            && self
                .first_pn
                .get(path)
                .copied()
                .flatten()
                .is_some_and(|f| largest >= f)
        {
            self.confirmed = Some(now);
        }
    }
}

/// Which receive key a packet is tried with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Current,
    Previous,
    Next,
}

/// What opening a packet did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// Authentic, under the current key.
    Current,
    /// Authentic, under the key before (a packet sent before the peer's
    /// update, arriving after it).
    Previous,
    /// Authentic under the next key: the peer updated, and so did we.
    Switched,
    /// Authentic under a re-handshake's key ([`RxKeys::offer`]): the peer
    /// moved to it, and so did we.
    Rekeyed,
    /// Did not authenticate under the key its phase bit selects.
    Failed,
}

/// One direction's receiving keys.
pub struct RxKeys {
    cipher: Option<Cipher>,
    phase: bool,
    current: Option<PacketKey>,
    /// The next secret and its key, derived in advance.
    next_secret: [u8; 32],
    next: Option<PacketKey>,
    /// The key before, and until when it is held.
    previous: Option<(Option<PacketKey>, Time)>,
    /// Per path, the lowest packet number accepted under the current key.
    first_pn: Vec<Option<u64>>,
    /// A re-handshake's secret and key, tried after `next`.
    rekey: Option<([u8; 32], Option<PacketKey>)>,
    /// Keys the peer replaced so far in this session.
    pub updates: u64,
    /// Packets that failed to authenticate since the last switch (the AEAD
    /// integrity limit counts these: [`Cipher::integrity_limit`]).
    pub failures: u64,
}

impl RxKeys {
    pub fn new(cipher: Option<Cipher>, secret: [u8; 32]) -> RxKeys {
        let next_secret = next_secret(&secret);
        RxKeys {
            cipher,
            phase: false,
            current: packet_key(cipher, &secret),
            next: packet_key(cipher, &next_secret),
            next_secret,
            previous: None,
            first_pn: Vec::new(),
            rekey: None,
            updates: 0,
            failures: 0,
        }
    }

    /// A re-handshake's secret for this direction: the peer's update to it
    /// is recognised ([`Opened::Rekeyed`]). Replaces one offered before.
    pub fn offer(&mut self, secret: [u8; 32]) {
        self.rekey = Some((secret, packet_key(self.cipher, &secret)));
    }

    /// A packet of phase `phase` may be tried with two keys: the caller
    /// keeps a copy of the ciphertext for the second try.
    pub fn may_try_twice(&self, phase: bool) -> bool {
        phase != self.phase && self.rekey.is_some()
    }

    /// The phase of the current key.
    pub fn phase(&self) -> bool {
        self.phase
    }

    /// The key a packet of phase `phase`, number `pn` on `path` is for.
    fn which(&mut self, path: usize, pn: u64, phase: bool, now: Time) -> Which {
        if phase == self.phase {
            return Which::Current;
        }
        if self
            .previous
            .as_ref()
            .is_some_and(|&(_, until)| now >= until)
        {
            self.previous = None;
        }
        let before_current = self
            .first_pn
            .get(path)
            .copied()
            .flatten()
            .is_none_or(|first| pn < first);
        if self.previous.is_some() && before_current {
            Which::Previous
        } else {
            Which::Next
        }
    }

    /// Checks and decrypts a packet with the key its phase bit selects;
    /// switches to the next key when that one authenticated it. `open`
    /// does the AEAD (or, in lab mode with `None`, the checksum); its flag
    /// is set on a second try (a re-handshake's key, after the ratchet's
    /// failed: the caller restores the ciphertext first). `retain`: how
    /// long the key before is kept after a switch.
    pub fn open(
        &mut self,
        path: usize,
        pn: u64,
        phase: bool,
        now: Time,
        retain: Duration,
        mut open: impl FnMut(Option<&PacketKey>, bool) -> bool,
    ) -> Opened {
        let which = self.which(path, pn, phase, now);
        let key = match which {
            Which::Current => self.current.as_ref(),
            Which::Previous => self.previous.as_ref().and_then(|(k, _)| k.as_ref()),
            Which::Next => self.next.as_ref(),
        };
        if !open(key, false) {
            if which == Which::Next {
                if let Some((secret, key)) = self.rekey.take() {
                    if open(key.as_ref(), true) {
                        self.switch_to(now, retain, secret, key);
                        self.note_current(path, pn);
                        return Opened::Rekeyed;
                    }
                    self.rekey = Some((secret, key));
                }
            }
            self.failures += 1;
            return Opened::Failed;
        }
        match which {
            Which::Current => {
                self.note_current(path, pn);
                Opened::Current
            }
            Which::Previous => Opened::Previous,
            Which::Next => {
                self.switch(now, retain);
                self.note_current(path, pn);
                Opened::Switched
            }
        }
    }

    fn note_current(&mut self, path: usize, pn: u64) {
        if self.first_pn.len() <= path {
            self.first_pn.resize(path + 1, None);
        }
        let f = &mut self.first_pn[path];
        *f = Some(f.map_or(pn, |x| x.min(pn)));
    }

    fn switch(&mut self, now: Time, retain: Duration) {
        let secret = self.next_secret;
        let key = self.next.take();
        self.switch_to(now, retain, secret, key);
    }

    /// Makes `key` (of `secret`) current; the one before is held for
    /// `retain`.
    fn switch_to(&mut self, now: Time, retain: Duration, secret: [u8; 32], key: Option<PacketKey>) {
        self.next_secret = next_secret(&secret);
        let old = std::mem::replace(&mut self.current, key);
        self.next = packet_key(self.cipher, &self.next_secret);
        self.previous = Some((old, now + retain));
        self.phase = !self.phase;
        self.first_pn.iter_mut().for_each(|f| *f = None);
        self.updates += 1;
        self.failures = 0;
    }

    /// The key before is still held.
    #[cfg(test)]
    pub fn holds_previous(&self, now: Time) -> bool {
        self.previous
            .as_ref()
            .is_some_and(|&(_, until)| now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: UpdatePolicy = UpdatePolicy {
        packets: 10,
        interval: Duration::from_secs(120),
        hard_limit: 20,
    };

    fn ms(x: u64) -> Time {
        Time::from_millis(x)
    }

    /// A sealer and an opener of one direction with the same secret.
    fn pair(c: Option<Cipher>) -> (TxKeys, RxKeys) {
        (
            TxKeys::new(c, [3; 32], POLICY, ms(0)),
            RxKeys::new(c, [3; 32]),
        )
    }

    /// Seals packet `pn` on `path` under `tx`'s current key; returns
    /// (phase, nonce, header, ciphertext, tag).
    fn seal(tx: &mut TxKeys, path: usize, pn: u64) -> (bool, [u8; 12], Vec<u8>, [u8; 16]) {
        let mut nonce = [0u8; 12];
        nonce[3] = path as u8;
        nonce[4..].copy_from_slice(&pn.to_be_bytes());
        let mut body = pn.to_be_bytes().to_vec();
        let tag = tx
            .key()
            .unwrap()
            .seal(nonce, &[tx.phase() as u8], &mut body);
        tx.on_sealed(path, pn);
        (tx.phase(), nonce, body, tag)
    }

    fn open(
        rx: &mut RxKeys,
        path: usize,
        pn: u64,
        p: &(bool, [u8; 12], Vec<u8>, [u8; 16]),
        now: Time,
    ) -> Opened {
        let (phase, nonce, body, tag) = p;
        let mut b = body.clone();
        rx.open(
            path,
            pn,
            *phase,
            now,
            Duration::from_millis(30),
            |k, retry| {
                if retry {
                    b = body.clone();
                }
                k.is_some_and(|k| k.open(*nonce, &[*phase as u8], &mut b, tag))
            },
        )
    }

    #[test]
    fn expand_label_is_deterministic_and_label_bound() {
        let s = [1u8; 32];
        assert_eq!(expand_label(&s, b"ku"), expand_label(&s, b"ku"));
        assert_ne!(expand_label(&s, b"ku"), expand_label(&s, b"kv"));
        assert_ne!(next_secret(&s), next_secret(&next_secret(&s)));
        assert_ne!(next_secret(&s), s);
    }

    #[test]
    fn update_switches_the_receiver_and_keeps_the_old_key_for_late_packets() {
        for c in Cipher::ALL {
            let (mut tx, mut rx) = pair(Some(c));
            let old = seal(&mut tx, 0, 5);
            let first = seal(&mut tx, 0, 6);
            assert_eq!(open(&mut rx, 0, 6, &first, ms(1)), Opened::Current);
            tx.update(ms(2));
            let new = seal(&mut tx, 0, 7);
            assert_ne!(new.0, old.0, "{c}: the phase bit flipped");
            assert_eq!(open(&mut rx, 0, 7, &new, ms(3)), Opened::Switched, "{c}");
            // Packet 5 of the old phase, late (reordered): the key before.
            assert_eq!(open(&mut rx, 0, 5, &old, ms(4)), Opened::Previous, "{c}");
            assert_eq!(rx.updates, 1);
            // Once the key before is dropped, a late old packet fails
            // (tried with the next key) and switches nothing.
            assert_eq!(open(&mut rx, 0, 5, &old, ms(40)), Opened::Failed);
            assert!(!rx.holds_previous(ms(40)));
            assert_eq!(rx.updates, 1);
        }
    }

    /// The packet number tells a late packet of the key before from one of
    /// the next key on the same path, even while the old key is held.
    #[test]
    fn packet_number_orders_phases_per_path() {
        let (mut tx, mut rx) = pair(Some(Cipher::Aes256Gcm));
        let p1 = seal(&mut tx, 0, 1);
        assert_eq!(open(&mut rx, 0, 1, &p1, ms(0)), Opened::Current);
        tx.update(ms(1));
        let p2 = seal(&mut tx, 0, 2);
        assert_eq!(open(&mut rx, 0, 2, &p2, ms(1)), Opened::Switched);
        // The sender acts too early (a faulty peer): phase 2 on path 0,
        // above the first number of phase 1 there: the next key, not the
        // held one.
        tx.update(ms(2));
        let p3 = seal(&mut tx, 0, 3);
        assert!(rx.holds_previous(ms(2)));
        assert_eq!(open(&mut rx, 0, 3, &p3, ms(2)), Opened::Switched);
        assert_eq!(rx.updates, 2);
    }

    /// A flipped phase bit (on the wire: the header is authenticated, so the
    /// tag fails) never switches keys; neither does garbage of either phase.
    #[test]
    fn a_forged_phase_bit_switches_nothing() {
        let (mut tx, mut rx) = pair(Some(Cipher::ChaCha20Poly1305));
        let p = seal(&mut tx, 0, 1);
        let mut forged = p.clone();
        forged.0 = !forged.0;
        assert_eq!(open(&mut rx, 0, 1, &forged, ms(0)), Opened::Failed);
        assert_eq!((rx.updates, rx.failures), (0, 1));
        assert_eq!(open(&mut rx, 0, 1, &p, ms(0)), Opened::Current);
    }

    /// The sender waits for an ACK of a packet of the current phase, then
    /// twice the receiver's retention, before updating again.
    #[test]
    fn sender_updates_only_when_due_and_allowed() {
        let (mut tx, _) = pair(Some(Cipher::Aes256Gcm));
        let retain = Duration::from_millis(5);
        assert!(!tx.due(ms(0)));
        for pn in 0..10 {
            seal(&mut tx, 1, pn);
        }
        assert!(tx.due(ms(0)) && tx.may_update(ms(10), retain));
        tx.update(ms(10));
        assert_eq!((tx.updates, tx.sealed), (1, 0));
        for pn in 10..20 {
            seal(&mut tx, 1, pn);
        }
        assert!(tx.due(ms(11)));
        assert!(!tx.may_update(ms(100), retain), "no ACK of phase 1 yet");
        tx.on_acked(1, 9, ms(12));
        tx.on_acked(0, 15, ms(12));
        assert!(
            !tx.may_update(ms(100), retain),
            "ACKs of phase 0 or another path"
        );
        tx.on_acked(1, 10, ms(20));
        assert!(!tx.may_update(ms(29), retain));
        assert!(tx.may_update(ms(30), retain));
        assert!(!tx.exhausted());
        for pn in 20..30 {
            seal(&mut tx, 1, pn);
        }
        assert!(tx.exhausted(), "20 packets: the hard limit");
        // The age bound.
        tx.update(ms(30));
        assert!(!tx.due(ms(31)));
        assert!(tx.due(ms(30) + POLICY.interval));
    }

    /// Lab mode runs the same state machine without keys.
    #[test]
    fn lab_mode_switches_phases() {
        let (mut tx, mut rx) = pair(None);
        tx.update(ms(1));
        let ok = rx.open(
            0,
            1,
            tx.phase(),
            ms(1),
            Duration::from_millis(30),
            |k, _| k.is_none(),
        );
        assert_eq!(ok, Opened::Switched);
    }
}
