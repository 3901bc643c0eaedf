//! Keys and packet protection.
//!
//! Pre-shared key (PSK) scheme, see `docs/wan-protocol.md` § Security:
//!
//! - HELLO packets carry a 16-byte truncated HMAC-SHA256 under
//!   `hello_key = HKDF-SHA256(salt "soya-wan/1 hello", ikm PSK, info "hello mac")`.
//!   A MAC, not an AEAD, because the HELLO key is the same for every session:
//!   a MAC has no nonce that could repeat. It also covers the cipher offers
//!   the HELLO carries, so an attacker cannot strip a cipher from an offer.
//! - Session secrets: `prk = HKDF-Extract(salt "soya-wan/1 session" ‖
//!   client_nonce ‖ server_nonce, PSK)`; the first traffic secret of each
//!   direction, `c2s` and `s2c` (32 bytes each), and the connection id (4
//!   bytes) are expanded from it with distinct labels; packet keys come
//!   from the traffic secrets, which change at each key update (see
//!   `keyphase`). The labels end with the agreed cipher's id
//!   (`"c2s secret" ‖ id`), so keys
//!   are bound to the cipher: the same key never serves two algorithms, and
//!   twins that somehow disagreed on the cipher share no key (every packet
//!   fails to authenticate) instead of talking under a cipher one of them
//!   did not choose. Each direction has its own key, so both sides may use
//!   the same (path, packet number) without reusing a nonce.
//! - Protected packets: the agreed AEAD (`cipher`), nonce = `0 0 0 path ‖
//!   pn (8 bytes)`, associated data = the 24-byte header. Packet numbers are
//!   never reused on a path, so a nonce never repeats under one key.
//!
//! With identity keys the handshake (`handshake`, Noise IKpsk2) replaces the
//! PSK key schedule above: [`SessionKeys::from_handshake`].
//!
//! Without a key (lab mode) the same layout is kept and the tag holds a CRC32
//! of header and payload: it catches corruption, not attackers.

use hkdf::hmac::{Hmac, Mac};
use hkdf::Hkdf;
use sha2::Sha256;

use std::time::Duration;

use crate::time::Time;

use super::cipher::Cipher;
use super::handshake::Secrets;
use super::keyphase::{Opened, RxKeys, TxKeys, UpdatePolicy};
use super::packet::{Header, HEADER_LEN, TAG_LEN};

const HELLO_SALT: &[u8] = b"soya-wan/1 hello";
const SESSION_SALT: &[u8] = b"soya-wan/1 session";
const NOISE_LABEL: &[u8] = b"soya-wan/5 noise ";

/// Authenticates HELLO packets (or checksums them in lab mode).
pub struct HelloAuth {
    key: Option<[u8; 32]>,
    /// Lab mode: appended to the checksummed bytes.
    context: Vec<u8>,
}

impl HelloAuth {
    pub fn new(psk: Option<&[u8; 32]>) -> HelloAuth {
        HelloAuth::with_context(psk, &[])
    }

    /// A HELLO authenticator bound to `context`: the HKDF info becomes
    /// `"hello mac" ‖ context` (lab mode: the CRC also covers `context`).
    /// An empty context is [`HelloAuth::new`].
    pub fn with_context(psk: Option<&[u8; 32]>, context: &[u8]) -> HelloAuth {
        HelloAuth {
            key: psk.map(|psk| {
                let hk = Hkdf::<Sha256>::new(Some(HELLO_SALT), psk);
                let mut k = [0u8; 32];
                // 32 bytes is far below HKDF's 255 × 32 limit: cannot fail.
                hk.expand_multi_info(&[b"hello mac", context], &mut k)
                    .unwrap_or_default();
                k
            }),
            context: context.to_vec(),
        }
    }

    pub fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        match &self.key {
            Some(k) => {
                let mut out = [0u8; TAG_LEN];
                let full = hmac(k, data);
                out.copy_from_slice(&full[..TAG_LEN]);
                out
            }
            None => crc_tag(data, &self.context),
        }
    }

    /// Constant-time check of a HELLO tag.
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        match &self.key {
            Some(k) => {
                let Ok(mut m) = <Hmac<Sha256> as Mac>::new_from_slice(k) else {
                    return false;
                };
                m.update(data);
                tag.len() == TAG_LEN && m.verify_truncated_left(tag).is_ok()
            }
            None => tag == crc_tag(data, &self.context).as_slice(),
        }
    }
}

fn hmac(key: &[u8; 32], data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if let Ok(mut m) = <Hmac<Sha256> as Mac>::new_from_slice(key) {
        m.update(data);
        out.copy_from_slice(&m.finalize().into_bytes());
    }
    out
}

fn crc_tag(a: &[u8], b: &[u8]) -> [u8; TAG_LEN] {
    let mut h = crc32fast::Hasher::new();
    h.update(a);
    h.update(b);
    let mut out = [0u8; TAG_LEN];
    out[..4].copy_from_slice(&h.finalize().to_be_bytes());
    out
}

/// One session's keys: derived once both nonces (and the cipher) are known.
/// Each direction's key changes over the session (`keyphase`).
pub struct SessionKeys {
    pub tx: TxKeys,
    pub rx: RxKeys,
    pub conn_id: u32,
    /// Server: a re-handshake's sending secret, armed once the client's
    /// first packet under the new key authenticated ([`Self::on_rekeyed`]).
    pending_tx: Option<[u8; 32]>,
}

/// The raw outputs of the key schedule: (c2s secret, s2c secret,
/// connection id). The secrets are each direction's first traffic secret;
/// packet keys are expanded from them (`keyphase`).
fn expand(psk: &[u8; 32], salt: &[u8], cipher: Cipher) -> ([u8; 32], [u8; 32], u32) {
    let hk = Hkdf::<Sha256>::new(Some(salt), psk);
    let mut c2s = [0u8; 32];
    let mut s2c = [0u8; 32];
    let mut cid = [0u8; 4];
    // Output lengths are fixed and valid: expand cannot fail.
    hk.expand_multi_info(&[b"c2s secret", &[cipher.id()]], &mut c2s)
        .unwrap_or_default();
    hk.expand_multi_info(&[b"s2c secret", &[cipher.id()]], &mut s2c)
        .unwrap_or_default();
    hk.expand(b"conn id", &mut cid).unwrap_or_default();
    (c2s, s2c, u32::from_be_bytes(cid))
}

impl SessionKeys {
    /// `cipher` is the agreed one (ignored, and may be `None`, without a
    /// PSK). `policy` says when the sending key is replaced; `now` starts
    /// its clock.
    pub fn derive(
        psk: Option<&[u8; 32]>,
        my_nonce: u64,
        peer_nonce: u64,
        i_am_client: bool,
        cipher: Option<Cipher>,
        policy: UpdatePolicy,
        now: Time,
    ) -> SessionKeys {
        let (c, s) = if i_am_client {
            (my_nonce, peer_nonce)
        } else {
            (peer_nonce, my_nonce)
        };
        let mut salt = Vec::with_capacity(SESSION_SALT.len() + 16);
        salt.extend_from_slice(SESSION_SALT);
        salt.extend_from_slice(&c.to_be_bytes());
        salt.extend_from_slice(&s.to_be_bytes());
        let (Some(psk), Some(cipher)) = (psk, cipher) else {
            // Lab mode: no keys, but the key phases still switch (so that
            // lab-mode simulations run the mechanism).
            let mut h = crc32fast::Hasher::new();
            h.update(&salt);
            return SessionKeys {
                tx: TxKeys::new(None, [0; 32], policy, now),
                rx: RxKeys::new(None, [0; 32]),
                conn_id: h.finalize(),
                pending_tx: None,
            };
        };
        let (c2s, s2c, conn_id) = expand(psk, &salt, cipher);
        let (tx, rx) = if i_am_client { (c2s, s2c) } else { (s2c, c2s) };
        SessionKeys {
            tx: TxKeys::new(Some(cipher), tx, policy, now),
            rx: RxKeys::new(Some(cipher), rx),
            conn_id,
            pending_tx: None,
        }
    }

    /// The keys of a session set up by the identity-key handshake
    /// (`handshake`): the Noise split keys are HKDF pseudorandom keys from
    /// which the first traffic secret of each direction is expanded, with
    /// the same labels (bound to the cipher) as under a PSK; the connection
    /// id comes from the handshake hash.
    pub fn from_handshake(
        secrets: &Secrets,
        i_am_client: bool,
        cipher: Cipher,
        policy: UpdatePolicy,
        now: Time,
    ) -> SessionKeys {
        let (tx, rx) = Self::handshake_secrets(secrets, i_am_client, cipher);
        let mut cid = [0u8; 4];
        Hkdf::<Sha256>::new(Some(NOISE_LABEL), &secrets.hash)
            .expand(b"conn id", &mut cid)
            .unwrap_or_default();
        SessionKeys {
            tx: TxKeys::new(Some(cipher), tx, policy, now),
            rx: RxKeys::new(Some(cipher), rx),
            conn_id: u32::from_be_bytes(cid),
            pending_tx: None,
        }
    }

    /// A re-handshake's secrets (`session::rekey`) for this session: the
    /// client arms its sending key at once (the server holds the receiving
    /// one since it answered), the server only once the client's first
    /// packet under the new key authenticated ([`Self::on_rekeyed`]); each
    /// side accepts the peer's move to the new key from now on.
    pub fn rekey(&mut self, secrets: &Secrets, i_am_client: bool) {
        let Some(cipher) = self.cipher() else {
            return;
        };
        let (tx, rx) = Self::handshake_secrets(secrets, i_am_client, cipher);
        self.rx.offer(rx);
        if i_am_client {
            self.tx.arm(tx);
        } else {
            self.pending_tx = Some(tx);
        }
    }

    /// The peer moved to the re-handshake's key: so does our sending key
    /// (server; the client armed its own on the RESPONSE).
    pub fn on_rekeyed(&mut self) {
        if let Some(s) = self.pending_tx.take() {
            self.tx.arm(s);
        }
    }

    /// (our first sending secret, our first receiving secret) of a Noise
    /// split (the same labels, bound to the cipher, as under a PSK).
    fn handshake_secrets(
        secrets: &Secrets,
        i_am_client: bool,
        cipher: Cipher,
    ) -> ([u8; 32], [u8; 32]) {
        let secret = |prk: &[u8; 32], label: &[u8]| {
            let mut out = [0u8; 32];
            // A 32-byte PRK and a 32-byte output: neither can fail.
            if let Ok(hk) = Hkdf::<Sha256>::from_prk(prk) {
                hk.expand_multi_info(&[NOISE_LABEL, label, &[cipher.id()]], &mut out)
                    .unwrap_or_default();
            }
            out
        };
        let c2s = secret(&secrets.c2s, b"c2s secret");
        let s2c = secret(&secrets.s2c, b"s2c secret");
        if i_am_client {
            (c2s, s2c)
        } else {
            (s2c, c2s)
        }
    }

    /// The session's cipher (`None`: lab mode).
    pub fn cipher(&self) -> Option<Cipher> {
        self.tx.cipher()
    }

    /// Failed authentications one receive key tolerates (any size of
    /// forgery up to the largest datagram: 64 KiB); no limit in lab mode.
    pub fn integrity_limit(&self) -> u64 {
        self.cipher()
            .map_or(u64::MAX, |c| c.integrity_limit(1 << 16))
    }

    fn nonce(path: u8, pn: u64) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[3] = path;
        n[4..].copy_from_slice(&pn.to_be_bytes());
        n
    }

    /// Encrypts `payload` in place under the current sending key and
    /// returns its tag; counts the packet against the key's limits. The
    /// header must carry the current phase ([`TxKeys::phase`]).
    pub fn seal(&mut self, path: u8, pn: u64, header: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = match self.tx.key() {
            Some(key) => key.seal(Self::nonce(path, pn), header, payload),
            None => crc_tag(header, payload),
        };
        self.tx.on_sealed(usize::from(path), pn);
        tag
    }

    /// [`open`](Self::open) of a whole protected packet in place: `packet`
    /// is the header (`HEADER_LEN` bytes, decoded as `hdr`), the payload
    /// and the tag, at least `HEADER_LEN + TAG_LEN` bytes. Returns the
    /// verdict and the payload, plaintext unless it failed. (The receive
    /// path, a re-handshake's pending keys and the tests all split a
    /// packet the same way.)
    pub fn open_packet<'a>(
        &mut self,
        hdr: &Header,
        packet: &'a mut [u8],
        now: Time,
        retain: Duration,
    ) -> (Opened, &'a [u8]) {
        let len = packet.len();
        let (head, rest) = packet.split_at_mut(HEADER_LEN);
        let (plain, tag) = rest.split_at_mut(len - HEADER_LEN - TAG_LEN);
        let opened = self.open(
            hdr.path,
            hdr.pn,
            hdr.key_phase,
            head,
            plain,
            tag,
            now,
            retain,
        );
        (opened, plain)
    }

    /// Checks and decrypts `payload` in place with the receive key that
    /// `phase` (the header's key phase bit) selects; a failure leaves it
    /// garbage. `retain`: how long the key before is held after the peer's
    /// update.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        path: u8,
        pn: u64,
        phase: bool,
        header: &[u8],
        payload: &mut [u8],
        tag: &[u8],
        now: Time,
        retain: Duration,
    ) -> Opened {
        if tag.len() != TAG_LEN {
            return Opened::Failed;
        }
        let nonce = Self::nonce(path, pn);
        // A failed open leaves garbage: a packet that may get a second try
        // (rare: the other phase while a re-handshake's key is offered)
        // keeps its ciphertext.
        let backup = self.rx.may_try_twice(phase).then(|| payload.to_vec());
        self.rx
            .open(usize::from(path), pn, phase, now, retain, |key, retry| {
                if let (true, Some(b)) = (retry, backup.as_ref()) {
                    payload.copy_from_slice(b);
                }
                match key {
                    Some(key) => key.open(nonce, header, payload, tag),
                    None => tag == crc_tag(header, payload).as_slice(),
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: UpdatePolicy = UpdatePolicy {
        packets: 1 << 22,
        interval: Duration::from_secs(120),
        hard_limit: 1 << 23,
    };

    fn derive(
        psk: Option<&[u8; 32]>,
        my: u64,
        peer: u64,
        client: bool,
        cipher: Option<Cipher>,
    ) -> SessionKeys {
        SessionKeys::derive(psk, my, peer, client, cipher, POLICY, Time::ZERO)
    }

    fn open(k: &mut SessionKeys, path: u8, pn: u64, hdr: &[u8], p: &[u8], tag: &[u8]) -> bool {
        let mut p = p.to_vec();
        let ms = Duration::from_millis(1);
        k.open(path, pn, false, hdr, &mut p, tag, Time::ZERO, ms) != Opened::Failed
    }

    #[test]
    fn directions_and_sessions_differ() {
        for cipher in Cipher::ALL {
            let c = Some(cipher);
            let psk = [7u8; 32];
            let mut a = derive(Some(&psk), 1, 2, true, c);
            let mut b = derive(Some(&psk), 2, 1, false, c);
            assert_eq!(a.conn_id, b.conn_id);
            assert_eq!(a.cipher(), c);
            let hdr = [1u8; 24];
            let mut p = b"payload".to_vec();
            let tag = a.seal(0, 5, &hdr, &mut p);
            assert_ne!(&p, b"payload");
            let mut q = p.clone();
            let zero = Duration::ZERO;
            assert_eq!(
                b.open(0, 5, false, &hdr, &mut q, &tag, Time::ZERO, zero),
                Opened::Current
            );
            assert_eq!(&q, b"payload");
            // Wrong pn, path, header, direction or session: all refused.
            assert!(!open(&mut b, 0, 6, &hdr, &p, &tag));
            assert!(!open(&mut b, 1, 5, &hdr, &p, &tag));
            assert!(!open(&mut b, 0, 5, &[2u8; 24], &p, &tag));
            assert!(!open(&mut a, 0, 5, &hdr, &p, &tag));
            let mut other = derive(Some(&psk), 3, 1, false, c);
            assert!(!open(&mut other, 0, 5, &hdr, &p, &tag));
            let mut wrong_psk = derive(Some(&[8u8; 32]), 2, 1, false, c);
            assert!(!open(&mut wrong_psk, 0, 5, &hdr, &p, &tag));
            assert_eq!(a.tx.sealed, 1, "the sealed packet counted");
        }
    }

    /// Keys are bound to the cipher: the same session under the other
    /// cipher has other key bytes (not merely another algorithm), so a twin
    /// that took another cipher than its peer authenticates nothing.
    #[test]
    fn keys_are_bound_to_the_cipher() {
        let psk = [7u8; 32];
        let (aes, cha) = (Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305);
        let (a1, a2, cid_a) = expand(&psk, b"salt", aes);
        let (c1, c2, cid_c) = expand(&psk, b"salt", cha);
        assert!(a1 != c1 && a2 != c2 && a1 != a2 && c1 != c2);
        assert_eq!(cid_a, cid_c, "the connection id names the session only");
        let mut client = derive(Some(&psk), 1, 2, true, Some(aes));
        let mut server = derive(Some(&psk), 2, 1, false, Some(cha));
        let hdr = [1u8; 24];
        let mut p = vec![0u8; 100];
        let tag = client.seal(0, 1, &hdr, &mut p);
        assert!(!open(&mut server, 0, 1, &hdr, &p, &tag));
        // Lab mode has no cipher.
        let lab = derive(None, 1, 2, true, Some(aes));
        assert_eq!(lab.cipher(), None);
    }

    #[test]
    fn hello_mac() {
        let h = HelloAuth::new(Some(&[1u8; 32]));
        let t = h.tag(b"hello");
        assert!(h.verify(b"hello", &t));
        assert!(!h.verify(b"hellp", &t));
        assert!(!HelloAuth::new(Some(&[2u8; 32])).verify(b"hello", &t));
        assert!(!h.verify(b"hello", &t[..8]));
        // A context separates HELLOs (shard i of N): keyed and lab mode.
        for psk in [Some(&[1u8; 32]), None] {
            let plain = HelloAuth::new(psk);
            let empty = HelloAuth::with_context(psk, b"");
            let s0 = HelloAuth::with_context(psk, b"shard 0/2");
            let s0of3 = HelloAuth::with_context(psk, b"shard 0/3");
            let t = plain.tag(b"hello");
            assert!(empty.verify(b"hello", &t), "empty context = no context");
            assert!(!s0.verify(b"hello", &t));
            let t0 = s0.tag(b"hello");
            assert!(s0.verify(b"hello", &t0));
            assert!(!s0of3.verify(b"hello", &t0));
            assert!(!plain.verify(b"hello", &t0));
        }
    }
}
