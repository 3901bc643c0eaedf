//! Session setup: the HELLO exchange that agrees on both nonces and keys.
//!
//! Each gateway starts with a fresh random nonce (its *generation*). HELLO
//! carries the sender's nonce and `echo`, the peer nonce it last saw. A side
//! commits to a peer session only on a HELLO whose `echo` is its own current
//! nonce: only a peer that saw this side's current nonce (so: after this side
//! started) can send that, so a replayed HELLO from an earlier life cannot
//! start a session. Peer nonces of sessions already left are remembered
//! (bounded) and refused, so a replayed HELLO cannot switch back either.
//!
//! ```text
//!  A (nonce a)                         B (nonce b)
//!  HELLO(a, echo 0)        ───────▶    candidate a
//!                          ◀───────    HELLO(b, echo a)
//!  commit (a,b): keys      ───────▶    HELLO(a, echo b): commit (a,b)
//!  protected packets       ◀──────▶    (first one received: "confirmed")
//! ```
//!
//! A restarted peer is a new nonce: the same exchange runs again, and the
//! surviving side reports `PeerRestarted` when it commits to the new nonce.
//!
//! Every HELLO also carries the sender's cipher offer. Both sides apply the
//! same symmetric rule ([`agree`]) to the two offers, so the side that
//! commits first needs no extra round trip to learn the cipher; keys are
//! bound to it (see `crypto`). A HELLO whose offer shares no cipher with
//! ours is refused ([`HelloVerdict::CipherMismatch`]) before it can become
//! a candidate: no session, never a fallback.

use std::collections::VecDeque;

mod noise;
mod rekey;
mod rotate;
use noise::body as noise_body;
#[cfg(test)]
pub use noise::{INIT_LEN, REKEY_INIT_LEN, RESP_LEN};
pub use rekey::REKEY_INTERVAL;
pub use rotate::ROTATION_WINDOW;

use std::time::Duration;

use crate::time::Time;

use super::cipher::{agree, Cipher, CipherOffer};
use super::crypto::{HelloAuth, SessionKeys};
use super::keyphase::UpdatePolicy;
use super::packet::{
    Header, Hello, PacketKind, HEADER_LEN, HELLO_BODY_LEN, HELLO_LEN, MAX_PN, TAG_LEN,
};

/// Peer nonces of left sessions kept to refuse replayed HELLOs.
const RETIRED: usize = 64;
/// HELLO rounds we keep answering a candidate that never completes.
const CANDIDATE_ROUNDS: u32 = 8;

pub struct Peer {
    pub nonce: u64,
    pub generation: u64,
    pub keys: SessionKeys,
    pub flow_window: u64,
    pub max_datagram: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelloVerdict {
    /// Both sides claim the same role (misconfiguration or reflection).
    RoleConflict,
    /// A nonce of a session already left: a replay.
    Retired,
    /// The current peer again: it still waits for proof that we committed
    /// (a protected packet), and for our HELLO too unless it committed.
    Known { needs_hello: bool },
    /// A new nonce without proof of freshness yet: answer it.
    Candidate,
    /// A new session; `previous` is the generation it replaces.
    Committed { previous: Option<u64> },
    /// The sender's cipher offer shares no cipher with ours: no session.
    /// `first` is set the first time a given peer nonce is refused (report
    /// it once, not on every HELLO).
    CipherMismatch { theirs: CipherOffer, first: bool },
    /// Identity mode, server: an INITIATION answered (a new one, or a copy
    /// of one not confirmed yet): send the RESPONSE.
    Answered,
    /// Identity mode, client: a server probe; send our INITIATION.
    Probe,
    /// Identity mode, client: the RESPONSE to our re-handshake (`rekey`):
    /// the new keys are armed (the session goes on).
    Rekeyed,
    /// Identity mode: a RESPONSE to no initiation in flight (a copy, or
    /// late), or a probe from the current server: nothing to do.
    Stale,
    /// Identity mode: a handshake message that does not authenticate
    /// (sealed to another static key, another PSK, forged).
    HandshakeFailed,
    /// Identity mode, server: an INITIATION from a static key other than
    /// the configured twin's.
    UnknownPeer,
    /// Identity mode, server: a client HELLO of the PSK exchange (the twin
    /// has no identity keys configured).
    ModeMismatch,
    /// A handshake message of the wrong length or with a bad body.
    Malformed,
}

pub struct Session {
    pub my_nonce: u64,
    pub is_client: bool,
    psk: Option<[u8; 32]>,
    /// What our HELLOs offer ([`CipherOffer::NONE`] in lab mode).
    pub offer: CipherOffer,
    auth: HelloAuth,
    pub peer: Option<Peer>,
    /// An authenticated protected packet arrived under the current keys.
    pub confirmed: bool,
    candidate: Option<u64>,
    candidate_rounds: u32,
    retired: VecDeque<u64>,
    /// The last peer nonce refused for a cipher mismatch.
    mismatched: Option<u64>,
    hello_pn: u64,
    flow_window: u64,
    max_datagram: u16,
    /// When our sending key is replaced (before the AEAD limit clamps it).
    key_update_packets: u64,
    key_update_interval: Duration,
    /// Identity mode (`noise`): the Noise IKpsk2 handshake.
    noise: Option<noise::Noise>,
    /// [`Session::set_hello_context`]'s context (the Noise prologue too).
    context: Vec<u8>,
    /// Identity mode: the periodic re-handshake (`rekey`).
    rekey: rekey::Rekey,
}

/// Default [`Tuning::key_update_packets`](super::Tuning): 2^22 packets, a
/// fourteenth of AES-GCM's limit for 8952-byte datagrams (docs/wan-protocol.md
/// § Key updates); 0.75 s of a 400 Gb/s path.
pub const KEY_UPDATE_PACKETS: u64 = 1 << 22;
/// Default [`Tuning::key_update_interval`](super::Tuning): two minutes, as
/// WireGuard rekeys.
pub const KEY_UPDATE_INTERVAL: Duration = Duration::from_secs(120);

impl Session {
    pub fn new(
        nonce: u64,
        is_client: bool,
        psk: Option<[u8; 32]>,
        offer: CipherOffer,
        flow_window: u64,
        max_datagram: u16,
    ) -> Session {
        Session {
            // 0 means "none" in `echo`; a caller passing 0 still gets a
            // valid (if predictable: callers must pass randomness) nonce.
            my_nonce: if nonce == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                nonce
            },
            is_client,
            auth: HelloAuth::new(psk.as_ref()),
            offer: if psk.is_some() {
                offer
            } else {
                CipherOffer::NONE
            },
            psk,
            peer: None,
            confirmed: false,
            candidate: None,
            candidate_rounds: 0,
            retired: VecDeque::new(),
            mismatched: None,
            hello_pn: 0,
            flow_window,
            max_datagram,
            key_update_packets: KEY_UPDATE_PACKETS,
            key_update_interval: KEY_UPDATE_INTERVAL,
            noise: None,
            context: Vec::new(),
            rekey: rekey::Rekey::new(REKEY_INTERVAL),
        }
    }

    /// When sessions from now on replace their sending key: after
    /// `packets` packets (never more than half the AEAD's limit for our
    /// datagram size) or `interval`, whichever comes first.
    pub fn set_key_updates(&mut self, packets: u64, interval: Duration) {
        self.key_update_packets = packets.max(1);
        self.key_update_interval = interval;
    }

    /// The key update policy of a session under `cipher` (`None`: lab mode,
    /// no limit but ours).
    pub fn update_policy(&self, cipher: Option<Cipher>) -> UpdatePolicy {
        let hard_limit = cipher.map_or(u64::MAX, |c| {
            c.confidentiality_limit(usize::from(self.max_datagram))
        });
        UpdatePolicy {
            packets: self.key_update_packets.min(hard_limit / 2).max(1),
            interval: self.key_update_interval,
            hard_limit,
        }
    }

    /// Binds `context` into the HELLO authentication (see
    /// [`WanConfig::hello_context`](super::WanConfig)).
    pub fn set_hello_context(&mut self, context: &[u8]) {
        self.auth = HelloAuth::with_context(self.psk.as_ref(), context);
        self.context = context.to_vec();
    }

    /// This side's generation (= its nonce).
    pub fn generation(&self) -> u64 {
        self.my_nonce
    }

    pub fn insecure(&self) -> bool {
        self.psk.is_none() && self.noise.is_none()
    }

    /// Sessions are set up by the identity-key handshake.
    pub fn has_identity(&self) -> bool {
        self.noise.is_some()
    }

    /// HELLOs are still needed (periodically, on every path).
    pub fn wants_hello(&self) -> bool {
        self.peer.is_none()
            || !self.confirmed
            || self.candidate.is_some()
            || self.initiating()
            || self.rekeying()
    }

    /// One periodic HELLO round went out.
    pub fn on_hello_round(&mut self) {
        self.on_noise_round();
        if self.candidate.is_some() {
            self.candidate_rounds += 1;
            if self.candidate_rounds > CANDIDATE_ROUNDS {
                self.candidate = None;
            }
        }
    }

    fn echo(&self) -> u64 {
        self.candidate
            .or(self.peer.as_ref().map(|p| p.nonce))
            .unwrap_or(0)
    }

    /// Writes a HELLO for `path` into `buf`; returns its length (0 if `buf`
    /// is too small).
    pub fn write_hello(&mut self, path: u8, buf: &mut [u8]) -> usize {
        if self.noise.is_some() {
            return self.write_noise_hello(path, buf);
        }
        if buf.len() < HELLO_LEN {
            return 0;
        }
        self.hello_header(path, buf);
        let mut body = [0u8; HELLO_BODY_LEN];
        let echo = self.echo();
        Hello {
            nonce: self.my_nonce,
            echo,
            flow_window: self.flow_window,
            max_datagram: self.max_datagram,
            committed: self.peer.as_ref().is_some_and(|p| p.nonce == echo),
            offer: self.offer,
        }
        .encode(&mut body);
        buf[HEADER_LEN..HEADER_LEN + HELLO_BODY_LEN].copy_from_slice(&body);
        let tag = self.auth.tag(&buf[..HEADER_LEN + HELLO_BODY_LEN]);
        buf[HEADER_LEN + HELLO_BODY_LEN..HELLO_LEN].copy_from_slice(&tag);
        HELLO_LEN
    }

    /// Checks a HELLO datagram's MAC (or lab-mode checksum).
    pub fn verify_hello(&self, bytes: &[u8]) -> bool {
        bytes.len() == HELLO_LEN
            && self
                .auth
                .verify(&bytes[..HELLO_LEN - TAG_LEN], &bytes[HELLO_LEN - TAG_LEN..])
    }

    /// Acts on an authenticated HELLO (`now` starts a new session's key
    /// clock).
    pub fn on_hello(&mut self, hdr: &Header, h: &Hello, now: Time) -> HelloVerdict {
        if hdr.client == self.is_client || h.nonce == self.my_nonce {
            return HelloVerdict::RoleConflict;
        }
        if self.retired.contains(&h.nonce) {
            return HelloVerdict::Retired;
        }
        // Lab mode has nothing to agree on (and keyed peers never get here:
        // the INSECURE flag is refused before).
        let cipher = agree(self.offer, h.offer);
        if !self.insecure() && cipher.is_none() {
            let first = self.mismatched != Some(h.nonce);
            self.mismatched = Some(h.nonce);
            return HelloVerdict::CipherMismatch {
                theirs: h.offer,
                first,
            };
        }
        if self.peer.as_ref().is_some_and(|p| p.nonce == h.nonce) {
            if self.candidate == Some(h.nonce) {
                self.candidate = None;
            }
            return HelloVerdict::Known {
                needs_hello: !(h.committed && h.echo == self.my_nonce),
            };
        }
        if h.echo != self.my_nonce {
            if self.candidate != Some(h.nonce) {
                self.candidate = Some(h.nonce);
                self.candidate_rounds = 0;
            }
            return HelloVerdict::Candidate;
        }
        // Fresh proof: the peer saw our current nonce.
        let previous = self.peer.take().map(|old| {
            if self.retired.len() >= RETIRED {
                self.retired.pop_front();
            }
            self.retired.push_back(old.nonce);
            old.generation
        });
        self.peer = Some(Peer {
            nonce: h.nonce,
            generation: hdr.generation,
            keys: SessionKeys::derive(
                self.psk.as_ref(),
                self.my_nonce,
                h.nonce,
                self.is_client,
                cipher,
                self.update_policy(cipher),
                now,
            ),
            flow_window: h.flow_window,
            max_datagram: h.max_datagram,
        });
        self.confirmed = false;
        self.candidate = None;
        HelloVerdict::Committed { previous }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::cipher::{Cipher, CipherPolicy};

    const AUTO: CipherOffer = CipherOffer {
        accept: 0b11,
        prefer: 2,
    };

    fn only(c: Cipher) -> CipherOffer {
        CipherOffer::new(CipherPolicy::Only(c), true)
    }

    fn exchange(from: &mut Session, to: &mut Session) -> HelloVerdict {
        let mut buf = [0u8; HELLO_LEN];
        assert_eq!(from.write_hello(0, &mut buf), HELLO_LEN);
        assert!(to.verify_hello(&buf));
        let hdr = Header::decode(&buf).unwrap();
        let h = Hello::decode(&buf[HEADER_LEN..HELLO_LEN - TAG_LEN]).unwrap();
        to.on_hello(&hdr, &h, Time::ZERO)
    }

    /// A whole handshake that `first` starts: `second` takes its HELLO as a
    /// candidate, `first` commits on the answer; returns what `second` says
    /// on `first`'s next HELLO (its commit: `previous` tells a restart).
    fn handshake(first: &mut Session, second: &mut Session) -> HelloVerdict {
        assert_eq!(exchange(first, second), HelloVerdict::Candidate);
        assert_eq!(
            exchange(second, first),
            HelloVerdict::Committed { previous: None }
        );
        exchange(first, second)
    }

    #[test]
    fn handshake_restart_and_replay() {
        let psk = Some([5u8; 32]);
        let mut a = Session::new(11, true, psk, AUTO, 1000, 1452);
        let mut b = Session::new(22, false, psk, AUTO, 1000, 1452);
        assert_eq!(
            handshake(&mut a, &mut b),
            HelloVerdict::Committed { previous: None }
        );
        let mut old_b_hello = [0u8; HELLO_LEN];
        b.write_hello(0, &mut old_b_hello);
        // B restarts with a new nonce.
        let mut b2 = Session::new(33, false, psk, AUTO, 1000, 1452);
        assert_eq!(
            handshake(&mut b2, &mut a),
            HelloVerdict::Committed { previous: Some(22) }
        );
        // The old B's HELLO (echoing a's current nonce!) replayed: refused.
        let hdr = Header::decode(&old_b_hello).unwrap();
        let h = Hello::decode(&old_b_hello[HEADER_LEN..HELLO_LEN - TAG_LEN]).unwrap();
        assert_eq!(a.on_hello(&hdr, &h, Time::ZERO), HelloVerdict::Retired);
        assert_eq!(a.peer.as_ref().unwrap().generation, 33);
        // Same role on both sides: refused.
        let mut c = Session::new(44, true, psk, AUTO, 1000, 1452);
        assert_eq!(exchange(&mut c, &mut a), HelloVerdict::RoleConflict);
        // Keys agree.
        let (ka, kb) = (
            &a.peer.as_ref().unwrap().keys,
            &b2.peer.as_ref().unwrap().keys,
        );
        assert_eq!(ka.conn_id, kb.conn_id);
    }

    /// Both ciphers through the whole handshake; the keys of the two sides
    /// then protect packets for each other.
    #[test]
    fn handshake_with_each_cipher() {
        let psk = Some([5u8; 32]);
        for (oa, ob, want) in [
            (AUTO, AUTO, Cipher::Aes256Gcm),
            (
                AUTO,
                only(Cipher::ChaCha20Poly1305),
                Cipher::ChaCha20Poly1305,
            ),
            (only(Cipher::Aes256Gcm), AUTO, Cipher::Aes256Gcm),
            (
                CipherOffer::new(CipherPolicy::Auto, false),
                AUTO,
                Cipher::ChaCha20Poly1305,
            ),
        ] {
            let mut a = Session::new(11, true, psk, oa, 1000, 1452);
            let mut b = Session::new(22, false, psk, ob, 1000, 1452);
            assert_eq!(
                handshake(&mut a, &mut b),
                HelloVerdict::Committed { previous: None }
            );
            let (pa, pb) = (a.peer.as_mut().unwrap(), b.peer.as_mut().unwrap());
            assert_eq!(pa.keys.cipher(), Some(want));
            assert_eq!(pb.keys.cipher(), Some(want));
            let hdr = [0u8; HEADER_LEN];
            let mut p = vec![1u8; 300];
            let tag = pa.keys.seal(0, 9, &hdr, &mut p);
            let opened = pb
                .keys
                .open(0, 9, false, &hdr, &mut p, &tag, Time::ZERO, Duration::ZERO);
            assert_eq!(opened, crate::wan::keyphase::Opened::Current, "{want}");
            assert_eq!(p, vec![1u8; 300]);
        }
    }

    /// No common cipher: both sides refuse every HELLO (reporting each peer
    /// nonce once), never commit, and the periodic HELLOs go on (so the
    /// error stays visible on both sides until a twin is reconfigured).
    #[test]
    fn cipher_mismatch_never_commits() {
        let psk = Some([5u8; 32]);
        let (aes, cha) = (only(Cipher::Aes256Gcm), only(Cipher::ChaCha20Poly1305));
        let mut a = Session::new(11, true, psk, aes, 1000, 1452);
        let mut b = Session::new(22, false, psk, cha, 1000, 1452);
        for round in 0..3 {
            let first = round == 0;
            assert_eq!(
                exchange(&mut a, &mut b),
                HelloVerdict::CipherMismatch { theirs: aes, first }
            );
            assert_eq!(
                exchange(&mut b, &mut a),
                HelloVerdict::CipherMismatch { theirs: cha, first }
            );
        }
        assert!(a.peer.is_none() && b.peer.is_none());
        assert!(a.wants_hello() && b.wants_hello());
        // A restarted (reconfigured) twin is a new nonce: reported again,
        // and once it offers AES-256-GCM the session comes up.
        let mut b2 = Session::new(33, false, psk, cha, 1000, 1452);
        assert!(matches!(
            exchange(&mut b2, &mut a),
            HelloVerdict::CipherMismatch { first: true, .. }
        ));
        let mut b3 = Session::new(44, false, psk, AUTO, 1000, 1452);
        assert_eq!(exchange(&mut b3, &mut a), HelloVerdict::Candidate);
        assert_eq!(
            exchange(&mut a, &mut b3),
            HelloVerdict::Committed { previous: None }
        );
        assert_eq!(
            b3.peer.as_ref().unwrap().keys.cipher(),
            Some(Cipher::Aes256Gcm)
        );
    }

    /// Downgrade: an attacker who rewrites the offer in a HELLO (to strip
    /// AES-256-GCM, or to force a cipher) breaks its MAC: refused before
    /// `on_hello` ever sees it.
    #[test]
    fn rewritten_offer_is_refused() {
        let psk = Some([5u8; 32]);
        let mut a = Session::new(11, true, psk, AUTO, 1000, 1452);
        let b = Session::new(22, false, psk, AUTO, 1000, 1452);
        let mut buf = [0u8; HELLO_LEN];
        a.write_hello(0, &mut buf);
        assert!(b.verify_hello(&buf));
        let at = HEADER_LEN + 28;
        for (accept, prefer) in [(0b01, 1), (0b11, 1), (0b10, 2), (0, 0)] {
            let mut m = buf;
            m[at] = accept;
            m[at + 1] = prefer;
            assert!(!b.verify_hello(&m), "offer {accept:#b}/{prefer} accepted");
        }
        // Lab mode: the offer is not sent and not checked.
        let mut lab = Session::new(11, true, None, AUTO, 1000, 1452);
        lab.write_hello(0, &mut buf);
        assert_eq!(&buf[at..at + 2], &[0, 0]);
    }
}
