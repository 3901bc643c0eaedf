//! The AEADs that protect packets, and how twins agree on one.
//!
//! Two ciphers, both with 256-bit keys, 96-bit nonces and 128-bit tags, so
//! the packet layout is the same whichever is used:
//!
//! - **AES-256-GCM**: the fast one on CPUs with AES and carry-less multiply
//!   instructions (x86 AES-NI + PCLMULQDQ, better with VAES + VPCLMULQDQ;
//!   ARMv8 AES + PMULL). Without them a constant-time software AES is several
//!   times slower, so it is not what `auto` prefers there.
//! - **ChaCha20-Poly1305** (RFC 8439): fast in plain SIMD everywhere; the
//!   choice for a twin without AES hardware.
//!
//! Both come from `ring` (BoringSSL's assembly). Measured on the project's
//! machine for one 4 KiB seal: ring AES-256-GCM ≈ 0.7 µs, ring ChaCha20-
//! Poly1305 ≈ 1.9 µs, the RustCrypto `chacha20poly1305` crate used before
//! ≈ 5.5 µs (docs/benchmarks.md).
//!
//! Agreement (docs/wan-protocol.md § Cipher agreement): every HELLO carries
//! the sender's [`CipherOffer`] (what it accepts, what it prefers), covered
//! by the HELLO MAC. Both twins apply the same symmetric rule, [`agree`], to
//! the two offers, so whichever side commits first derives keys for the same
//! cipher without another round trip. No common cipher: no session, and an
//! [`Event::CipherMismatch`](super::Event) for the operator; never a silent
//! fallback.

use std::fmt;

use ring::aead;

/// AEAD tag (AES-256-GCM or ChaCha20-Poly1305: both 16 bytes), or CRC32 +
/// zeroes in insecure lab mode; it ends every datagram ([`super::packet`]).
pub const TAG_LEN: usize = 16;

/// A packet AEAD. The discriminants are the wire ids (HELLO offer, HKDF
/// info): never renumber them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cipher {
    ChaCha20Poly1305 = 1,
    Aes256Gcm = 2,
}

impl Cipher {
    pub const ALL: [Cipher; 2] = [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305];

    /// Wire id: 1 ChaCha20-Poly1305, 2 AES-256-GCM.
    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn from_id(id: u8) -> Option<Cipher> {
        Cipher::ALL.into_iter().find(|c| c.id() == id)
    }

    /// Bit `id - 1` of an offer's `accept` set.
    fn bit(self) -> u8 {
        1 << (self.id() - 1)
    }

    /// As spelt in the configuration (`wan.cipher`).
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    /// Packets of at most `max_datagram` bytes one key may seal: the
    /// confidentiality limit of RFC 9001 §6.6, derived as its Appendix B
    /// does for an attacker advantage of 2^-57, for this datagram size.
    ///
    /// AES-GCM: the advantage is about `(l × q)² / 2^127` for `q` packets
    /// of `l` 16-byte blocks, so `q ≤ 2^35 / l` (QUIC's 2^23 is this for
    /// 64 KiB packets; Sōya's 8952-byte datagrams, `l` = 560, allow
    /// 61 356 675). ChaCha20-Poly1305's limit exceeds the 2^62 packet
    /// numbers a path has (RFC 9001 §6.6): none in practice.
    pub fn confidentiality_limit(self, max_datagram: usize) -> u64 {
        match self {
            Cipher::Aes256Gcm => (1u64 << 35) / blocks(max_datagram),
            Cipher::ChaCha20Poly1305 => 1 << 62,
        }
    }

    /// Forged packets of at most `max_datagram` bytes a receiver may try
    /// to open under one key: RFC 9001's integrity limit (Appendix B, the
    /// same 2^-57 target). AES-GCM: `v ≤ 2^64 / l` (2^52 for 64 KiB
    /// packets, ≈ 2^54.9 for 8952 bytes). ChaCha20-Poly1305: 2^36, as
    /// RFC 9001 §6.6 states it.
    pub fn integrity_limit(self, max_datagram: usize) -> u64 {
        match self {
            Cipher::Aes256Gcm => u64::MAX / blocks(max_datagram),
            Cipher::ChaCha20Poly1305 => 1 << 36,
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// 16-byte blocks in a datagram of `len` bytes (all of it, header and tag
/// included: an upper bound on what the AEAD processes), at least 1.
fn blocks(len: usize) -> u64 {
    (len as u64).div_ceil(16).max(1)
}

/// What the configuration allows (`wan.cipher`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CipherPolicy {
    /// Accept both; prefer AES-256-GCM when this CPU has AES hardware.
    #[default]
    Auto,
    /// This cipher or no session.
    Only(Cipher),
}

/// Whether this CPU runs AES-GCM in hardware (AES rounds and the GHASH
/// carry-less multiply). Reads CPU feature flags only: no clock, no I/O.
pub fn aes_hardware() -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        // Rust's aarch64 "aes" feature is FEAT_AES and FEAT_PMULL together.
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "x86", target_arch = "aarch64")))]
    {
        false
    }
}

/// One side's offer, as carried in its HELLO: the set of ciphers it accepts
/// (bit `id - 1` per cipher) and the one it prefers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CipherOffer {
    pub accept: u8,
    pub prefer: u8,
}

impl CipherOffer {
    /// The offer of insecure (lab) mode: nothing to agree on.
    pub const NONE: CipherOffer = CipherOffer {
        accept: 0,
        prefer: 0,
    };

    /// This side's offer under `policy`; `aes_hw` is [`aes_hardware`] (a
    /// parameter so that tests can play a CPU without it).
    pub fn new(policy: CipherPolicy, aes_hw: bool) -> CipherOffer {
        match policy {
            CipherPolicy::Only(c) => CipherOffer {
                accept: c.bit(),
                prefer: c.id(),
            },
            CipherPolicy::Auto => CipherOffer {
                accept: Cipher::Aes256Gcm.bit() | Cipher::ChaCha20Poly1305.bit(),
                prefer: if aes_hw {
                    Cipher::Aes256Gcm.id()
                } else {
                    Cipher::ChaCha20Poly1305.id()
                },
            },
        }
    }

    pub fn accepts(self, c: Cipher) -> bool {
        self.accept & c.bit() != 0
    }

    fn prefers(self, c: Cipher) -> bool {
        self.prefer == c.id()
    }
}

impl fmt::Display for CipherOffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Cipher::ALL
            .into_iter()
            .filter(|c| self.accepts(*c))
            .map(Cipher::name)
            .collect();
        if names.is_empty() {
            return f.write_str("no known cipher");
        }
        write!(f, "accepts {}", names.join(", "))?;
        match Cipher::from_id(self.prefer) {
            Some(c) => write!(f, ", prefers {c}"),
            None => Ok(()),
        }
    }
}

/// The cipher two offers agree on, or `None`: they share none.
///
/// Symmetric (`agree(a, b) == agree(b, a)`), so both twins reach the same
/// answer from the same two HELLOs, whichever commits first:
///
/// 1. only ciphers both accept are candidates (bits a side does not know
///    are ignored, so a cipher can be added later without a version bump);
/// 2. a cipher both prefer wins;
/// 3. otherwise ChaCha20-Poly1305, if both accept it: the preferences differ
///    only when one CPU lacks AES hardware, and ChaCha is fast on both;
/// 4. otherwise the one cipher left.
pub fn agree(a: CipherOffer, b: CipherOffer) -> Option<Cipher> {
    let common: Vec<Cipher> = Cipher::ALL
        .into_iter()
        .filter(|&c| a.accepts(c) && b.accepts(c))
        .collect();
    if let Some(&c) = common.iter().find(|&&c| a.prefers(c) && b.prefers(c)) {
        return Some(c);
    }
    if common.contains(&Cipher::ChaCha20Poly1305) {
        return Some(Cipher::ChaCha20Poly1305);
    }
    common.first().copied()
}

/// One direction's packet key.
pub struct PacketKey {
    key: aead::LessSafeKey,
}

impl PacketKey {
    pub fn new(cipher: Cipher, key: &[u8; 32]) -> PacketKey {
        // Both algorithms take exactly 32-byte keys, which the type
        // guarantees: `new` only fails for a wrong key length.
        let unbound = aead::UnboundKey::new(cipher.algorithm(), key)
            .expect("AES-256-GCM and ChaCha20-Poly1305 keys are 32 bytes");
        PacketKey {
            key: aead::LessSafeKey::new(unbound),
        }
    }

    /// Encrypts `in_out` in place; returns the tag.
    pub fn seal(&self, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let mut out = [0u8; TAG_LEN];
        // Fails only beyond the algorithms' per-message limits (≥ 256 GiB).
        if let Ok(tag) = self.key.seal_in_place_separate_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad),
            in_out,
        ) {
            out.copy_from_slice(tag.as_ref());
        }
        out
    }

    /// Checks `tag` and decrypts `in_out` in place; `false` leaves `in_out`
    /// garbage (never plaintext of a forgery).
    pub fn open(&self, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8], tag: &[u8]) -> bool {
        let Ok(tag) = aead::Tag::try_from(tag) else {
            return false;
        };
        self.key
            .open_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(aad),
                tag,
                in_out,
                0..,
            )
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Seals `plain` under `key` and `nonce` with `aad` (hex): the tag must
    /// be `tag` and the ciphertext begin with `sealed`; opening gives
    /// `plain` back.
    fn known_answer(
        c: Cipher,
        key: &str,
        nonce: &str,
        aad: &str,
        plain: &[u8],
        sealed: &str,
        tag: &str,
    ) {
        let key: [u8; 32] = hex(key).try_into().unwrap();
        let nonce: [u8; 12] = hex(nonce).try_into().unwrap();
        let (aad, sealed, tag) = (hex(aad), hex(sealed), hex(tag));
        let k = PacketKey::new(c, &key);
        let mut buf = plain.to_vec();
        assert_eq!(k.seal(nonce, &aad, &mut buf).to_vec(), tag, "{c}");
        assert_eq!(&buf[..sealed.len()], &sealed[..], "{c}");
        assert!(k.open(nonce, &aad, &mut buf, &tag), "{c}");
        assert_eq!(buf, plain, "{c}");
    }

    /// AES-256-GCM known answer through our wrapper: the McGrew–Viega GCM
    /// specification's test case 16 (256-bit key, 96-bit IV, 20 bytes of
    /// AAD, 60 bytes of plaintext), also in NIST's GCM validation vectors.
    #[test]
    fn aes_256_gcm_known_answer() {
        known_answer(
            Cipher::Aes256Gcm,
            "feffe9928665731c6d6a8f9467308308 feffe9928665731c6d6a8f9467308308",
            "cafebabefacedbaddecaf888",
            "feedfacedeadbeeffeedfacedeadbeefabaddad2",
            &hex(
                "d9313225f88406e5a55909c5aff5269a 86a7a9531534f7da2e4c303d8a318a72
                 1c3c0c95956809532fcf0e2449a6b525 b16aedf5aa0de657ba637b39",
            ),
            "522dc1f099567d07f47f37a32a84427d 643a8cdcbfe5c0c97598a2bd2555d1aa
             8cb08e48590dbb3da7b08b1056828838 c5f61e6393ba7a0abcc9f662",
            "76fc6ece0f4e1768cddf8853bb2d551b",
        );
    }

    /// ChaCha20-Poly1305 known answer: RFC 8439 § 2.8.2 (the same cipher
    /// as the RustCrypto implementation it replaces: the wire is unchanged).
    #[test]
    fn chacha20_poly1305_known_answer() {
        known_answer(
            Cipher::ChaCha20Poly1305,
            "808182838485868788898a8b8c8d8e8f 909192939495969798999a9b9c9d9e9f",
            "070000004041424344454647",
            "50515253c0c1c2c3c4c5c6c7",
            b"Ladies and Gentlemen of the class of '99: If I could offer you \
only one tip for the future, sunscreen would be it.",
            "d31a8d34648e60db7b86afbc53ef7ec2",
            "1ae10b594f09e26a7e902ecbd0600691",
        );
    }

    /// For each cipher: round trip, and any change to tag, header (AAD),
    /// payload or nonce is refused; a key of the other cipher refuses too.
    #[test]
    fn round_trip_and_tamper_each_cipher() {
        for c in Cipher::ALL {
            let k = PacketKey::new(c, &[9u8; 32]);
            let hdr = [3u8; 24];
            let nonce = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42];
            let plain: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            let mut ct = plain.clone();
            let tag = k.seal(nonce, &hdr, &mut ct);
            assert_ne!(ct, plain, "{c}");
            let mut p = ct.clone();
            assert!(k.open(nonce, &hdr, &mut p, &tag), "{c}");
            assert_eq!(p, plain, "{c}");
            let mut bad_tag = tag;
            bad_tag[15] ^= 1;
            assert!(!k.open(nonce, &hdr, &mut ct.clone(), &bad_tag), "{c} tag");
            assert!(
                !k.open(nonce, &hdr, &mut ct.clone(), &tag[..15]),
                "{c} short"
            );
            let mut bad_hdr = hdr;
            bad_hdr[23] ^= 0x80;
            assert!(!k.open(nonce, &bad_hdr, &mut ct.clone(), &tag), "{c} hdr");
            let mut bad_ct = ct.clone();
            bad_ct[1000] ^= 4;
            assert!(!k.open(nonce, &hdr, &mut bad_ct, &tag), "{c} payload");
            assert!(
                !k.open(nonce, &hdr, &mut ct[..4095].to_vec(), &tag),
                "{c} cut"
            );
            let mut n2 = nonce;
            n2[11] ^= 1;
            assert!(!k.open(n2, &hdr, &mut ct.clone(), &tag), "{c} nonce");
            let other = Cipher::ALL.into_iter().find(|&o| o != c).unwrap();
            let ko = PacketKey::new(other, &[9u8; 32]);
            assert!(
                !ko.open(nonce, &hdr, &mut ct.clone(), &tag),
                "{c} as {other}"
            );
        }
    }

    /// The limits for the datagram sizes Sōya uses (docs/wan-protocol.md §
    /// Key updates quotes these figures).
    #[test]
    fn usage_limits_for_soya_datagrams() {
        let aes = Cipher::Aes256Gcm;
        assert_eq!(aes.confidentiality_limit(65_536), 1 << 23, "QUIC's 2^23");
        assert_eq!(aes.confidentiality_limit(2048), 1 << 28, "QUIC's 2^28");
        assert_eq!(aes.confidentiality_limit(8952), 61_356_675);
        assert_eq!(aes.confidentiality_limit(1452), 377_579_542);
        assert_eq!(aes.confidentiality_limit(65_000), 8_456_740);
        assert_eq!(aes.integrity_limit(65_536), (1 << 52) - 1);
        let cha = Cipher::ChaCha20Poly1305;
        assert_eq!(cha.confidentiality_limit(8952), 1 << 62);
        assert_eq!(cha.integrity_limit(8952), 1 << 36);
    }

    #[test]
    fn agreement_rule() {
        use CipherPolicy::*;
        let (aes, cha) = (Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305);
        let o = CipherOffer::new;
        let cases = [
            // (policy a, hw a, policy b, hw b, agreed)
            (Auto, true, Auto, true, Some(aes)),
            (Auto, true, Auto, false, Some(cha)),
            (Auto, false, Auto, false, Some(cha)),
            (Auto, false, Only(aes), true, Some(aes)),
            (Auto, true, Only(cha), true, Some(cha)),
            (Only(aes), true, Only(aes), false, Some(aes)),
            (Only(aes), true, Only(cha), true, None),
            (Only(cha), false, Only(aes), true, None),
        ];
        for (pa, ha, pb, hb, want) in cases {
            let (a, b) = (o(pa, ha), o(pb, hb));
            assert_eq!(agree(a, b), want, "{a} / {b}");
            assert_eq!(agree(b, a), want, "symmetric: {b} / {a}");
        }
        // Insecure offers and unknown bits/ids agree on nothing.
        assert_eq!(agree(CipherOffer::NONE, o(Auto, true)), None);
        let future = CipherOffer {
            accept: 0b100,
            prefer: 3,
        };
        assert_eq!(agree(future, o(Auto, true)), None);
        let mixed = CipherOffer {
            accept: 0b110,
            prefer: 3,
        };
        assert_eq!(agree(mixed, o(Auto, true)), Some(aes));
        assert_eq!(
            o(Auto, true).to_string(),
            "accepts aes-256-gcm, chacha20-poly1305, prefers aes-256-gcm"
        );
        assert_eq!(Cipher::from_id(2), Some(aes));
        assert_eq!(Cipher::from_id(0), None);
    }
}
