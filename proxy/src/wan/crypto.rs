//! Keys and packet protection.
//!
//! Pre-shared key (PSK) scheme, see `docs/wan-protocol.md` § Security:
//!
//! - HELLO packets carry a 16-byte truncated HMAC-SHA256 under
//!   `hello_key = HKDF-SHA256(salt "soya-wan/1 hello", ikm PSK, info "hello mac")`.
//!   A MAC, not an AEAD, because the HELLO key is the same for every session:
//!   a MAC has no nonce that could repeat. It also covers the cipher offers
//!   the HELLO carries, so an attacker cannot strip a cipher from an offer.
//! - Session keys: `prk = HKDF-Extract(salt "soya-wan/1 session" ‖
//!   client_nonce ‖ server_nonce, PSK)`; `c2s`, `s2c` (32 bytes each) and the
//!   connection id (4 bytes) are expanded from it with distinct labels. The
//!   key labels end with the agreed cipher's id (`"c2s key" ‖ id`), so keys
//!   are bound to the cipher: the same key never serves two algorithms, and
//!   twins that somehow disagreed on the cipher share no key (every packet
//!   fails to authenticate) instead of talking under a cipher one of them
//!   did not choose. Each direction has its own key, so both sides may use
//!   the same (path, packet number) without reusing a nonce.
//! - Protected packets: the agreed AEAD (`cipher`), nonce = `0 0 0 path ‖
//!   pn (8 bytes)`, associated data = the 24-byte header. Packet numbers are
//!   never reused on a path, so a nonce never repeats under one key.
//!
//! Without a key (lab mode) the same layout is kept and the tag holds a CRC32
//! of header and payload: it catches corruption, not attackers.

use hkdf::hmac::{Hmac, Mac};
use hkdf::Hkdf;
use sha2::Sha256;

use super::cipher::{Cipher, PacketKey};
use super::packet::TAG_LEN;

const HELLO_SALT: &[u8] = b"soya-wan/1 hello";
const SESSION_SALT: &[u8] = b"soya-wan/1 session";

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
pub struct SessionKeys {
    tx: Option<PacketKey>,
    rx: Option<PacketKey>,
    pub conn_id: u32,
}

/// The raw outputs of the key schedule: (c2s key, s2c key, connection id).
fn expand(psk: &[u8; 32], salt: &[u8], cipher: Cipher) -> ([u8; 32], [u8; 32], u32) {
    let hk = Hkdf::<Sha256>::new(Some(salt), psk);
    let mut c2s = [0u8; 32];
    let mut s2c = [0u8; 32];
    let mut cid = [0u8; 4];
    // Output lengths are fixed and valid: expand cannot fail.
    hk.expand_multi_info(&[b"c2s key", &[cipher.id()]], &mut c2s)
        .unwrap_or_default();
    hk.expand_multi_info(&[b"s2c key", &[cipher.id()]], &mut s2c)
        .unwrap_or_default();
    hk.expand(b"conn id", &mut cid).unwrap_or_default();
    (c2s, s2c, u32::from_be_bytes(cid))
}

impl SessionKeys {
    /// `cipher` is the agreed one (ignored, and may be `None`, without a PSK).
    pub fn derive(
        psk: Option<&[u8; 32]>,
        my_nonce: u64,
        peer_nonce: u64,
        i_am_client: bool,
        cipher: Option<Cipher>,
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
            let mut h = crc32fast::Hasher::new();
            h.update(&salt);
            return SessionKeys {
                tx: None,
                rx: None,
                conn_id: h.finalize(),
            };
        };
        let (c2s, s2c, conn_id) = expand(psk, &salt, cipher);
        let c2s = PacketKey::new(cipher, &c2s);
        let s2c = PacketKey::new(cipher, &s2c);
        let (tx, rx) = if i_am_client { (c2s, s2c) } else { (s2c, c2s) };
        SessionKeys {
            tx: Some(tx),
            rx: Some(rx),
            conn_id,
        }
    }

    /// The session's cipher (`None`: lab mode).
    pub fn cipher(&self) -> Option<Cipher> {
        self.tx.as_ref().map(PacketKey::cipher)
    }

    fn nonce(path: u8, pn: u64) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[3] = path;
        n[4..].copy_from_slice(&pn.to_be_bytes());
        n
    }

    /// Encrypts `payload` in place and returns its tag.
    pub fn seal(&self, path: u8, pn: u64, header: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        match &self.tx {
            Some(key) => key.seal(Self::nonce(path, pn), header, payload),
            None => crc_tag(header, payload),
        }
    }

    /// Checks and decrypts `payload` in place; `false` leaves it garbage.
    pub fn open(&self, path: u8, pn: u64, header: &[u8], payload: &mut [u8], tag: &[u8]) -> bool {
        if tag.len() != TAG_LEN {
            return false;
        }
        match &self.rx {
            Some(key) => key.open(Self::nonce(path, pn), header, payload, tag),
            None => tag == crc_tag(header, payload).as_slice(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_and_sessions_differ() {
        for cipher in Cipher::ALL {
            let c = Some(cipher);
            let psk = [7u8; 32];
            let a = SessionKeys::derive(Some(&psk), 1, 2, true, c);
            let b = SessionKeys::derive(Some(&psk), 2, 1, false, c);
            assert_eq!(a.conn_id, b.conn_id);
            assert_eq!(a.cipher(), c);
            let hdr = [1u8; 24];
            let mut p = b"payload".to_vec();
            let tag = a.seal(0, 5, &hdr, &mut p);
            assert_ne!(&p, b"payload");
            let mut q = p.clone();
            assert!(b.open(0, 5, &hdr, &mut q, &tag));
            assert_eq!(&q, b"payload");
            // Wrong pn, path, header, direction or session: all refused.
            assert!(!b.open(0, 6, &hdr, &mut p.clone(), &tag));
            assert!(!b.open(1, 5, &hdr, &mut p.clone(), &tag));
            assert!(!b.open(0, 5, &[2u8; 24], &mut p.clone(), &tag));
            assert!(!a.open(0, 5, &hdr, &mut p.clone(), &tag));
            let other = SessionKeys::derive(Some(&psk), 3, 1, false, c);
            assert!(!other.open(0, 5, &hdr, &mut p.clone(), &tag));
            let wrong_psk = SessionKeys::derive(Some(&[8u8; 32]), 2, 1, false, c);
            assert!(!wrong_psk.open(0, 5, &hdr, &mut p.clone(), &tag));
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
        let client = SessionKeys::derive(Some(&psk), 1, 2, true, Some(aes));
        let server = SessionKeys::derive(Some(&psk), 2, 1, false, Some(cha));
        let hdr = [1u8; 24];
        let mut p = vec![0u8; 100];
        let tag = client.seal(0, 1, &hdr, &mut p);
        assert!(!server.open(0, 1, &hdr, &mut p, &tag));
        // Lab mode has no cipher.
        let lab = SessionKeys::derive(None, 1, 2, true, Some(aes));
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
