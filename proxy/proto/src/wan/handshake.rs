//! The identity-key handshake: Noise IKpsk2 (the Noise Protocol Framework,
//! revision 34, §7.5 and §9; the pattern WireGuard uses), run by the `snow`
//! crate, with X25519, ChaCha20-Poly1305 and SHA-256:
//!
//! ```text
//! Noise_IKpsk2_25519_ChaChaPoly_SHA256, prologue "soya-wan/5" ‖ hello_context
//!   <- s                                   (the client knows the server's key)
//!   ...
//!   -> e, es, s, ss          INITIATION    payload: the client's HELLO body
//!   <- e, ee, se, psk        RESPONSE      payload: the server's HELLO body
//! ```
//!
//! The client (the twin with `client = true`) initiates; the server
//! responds. Without a configured PSK the psk token mixes 32 zero bytes, as
//! WireGuard does, so there is one pattern. The handshake's split gives one
//! 32-byte key per direction; those become the first traffic secrets of the
//! session (`crypto::SessionKeys::from_handshake`), from which key updates
//! proceed as with a PSK (`keyphase`).
//!
//! This module is pure: it turns bytes and keys into bytes and keys, and
//! never panics on what it reads. Which message is answered, retransmitted
//! or refused, and when, is `session`'s business. Randomness (the ephemeral
//! keys) comes from the operating system through snow's default resolver.

use snow::{Builder, HandshakeState};
use thiserror::Error;

use super::packet::HELLO_BODY_LEN;

/// The Noise protocol name (and so the primitives).
pub const PATTERN: &str = "Noise_IKpsk2_25519_ChaChaPoly_SHA256";
/// Bound into the handshake hash ahead of `hello_context`.
const PROLOGUE: &[u8] = b"soya-wan/5";
/// X25519 keys and DH outputs.
pub const KEY_LEN: usize = 32;
/// Poly1305 tags inside the handshake messages.
const MAC_LEN: usize = 16;
/// The INITIATION message: e, encrypted s, encrypted HELLO body.
pub const INIT_MSG_LEN: usize = KEY_LEN + (KEY_LEN + MAC_LEN) + (HELLO_BODY_LEN + MAC_LEN);
/// The RESPONSE message: e, encrypted HELLO body.
pub const RESP_MSG_LEN: usize = KEY_LEN + (HELLO_BODY_LEN + MAC_LEN);
/// A re-handshake's INITIATION (`session::rekey`): the payload is the
/// HELLO body and the rekey number (u64, rising per client generation).
pub const REKEY_INIT_MSG_LEN: usize = INIT_MSG_LEN + 8;

/// This gateway's static key pair and its twin's public key.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub private: [u8; KEY_LEN],
    pub peer_public: [u8; KEY_LEN],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("Identity")
            .field("public", &public_key(&self.private))
            .field("peer_public", &self.peer_public)
            .finish()
    }
}

/// The X25519 public key of `private` (clamped as X25519 does).
pub fn public_key(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    curve25519_dalek::MontgomeryPoint::mul_base_clamped(*private).to_bytes()
}

/// Why a handshake message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HandshakeError {
    /// Not the message's length.
    #[error("handshake message of {0} bytes")]
    Length(usize),
    /// It does not authenticate: sealed to another static key (the
    /// sender's idea of our public key is wrong), another PSK, forged, or
    /// an answer to an initiation we no longer hold.
    #[error("handshake message does not authenticate")]
    Auth,
    /// It authenticates, but the initiator's static key is not our twin's.
    #[error("initiator's static key is not the configured twin key")]
    UnknownPeer,
    /// snow refused to build a state (a bad key): configuration.
    #[error("handshake setup: {0}")]
    Setup(&'static str),
}

/// What a completed handshake yields: the Noise split (initiator to
/// responder, responder to initiator) and the handshake hash.
pub struct Secrets {
    pub c2s: [u8; KEY_LEN],
    pub s2c: [u8; KEY_LEN],
    pub hash: [u8; 32],
}

fn builder<'a>(
    id: &'a Identity,
    psk: &'a [u8; KEY_LEN],
    prologue: &'a [u8],
) -> Result<Builder<'a>, HandshakeError> {
    let params = PATTERN
        .parse()
        .map_err(|_| HandshakeError::Setup("pattern"))?;
    Ok(Builder::new(params)
        .local_private_key(&id.private)
        .psk(2, psk)
        .prologue(prologue))
}

fn prologue(context: &[u8]) -> Vec<u8> {
    let mut p = PROLOGUE.to_vec();
    p.extend_from_slice(context);
    p
}

fn finish(hs: &mut HandshakeState) -> Secrets {
    let (c2s, s2c) = hs.dangerously_get_raw_split();
    let mut hash = [0u8; 32];
    let h = hs.get_handshake_hash();
    let n = h.len().min(32);
    hash[..n].copy_from_slice(&h[..n]);
    Secrets { c2s, s2c, hash }
}

/// The client's handshake in flight: its INITIATION (sent again, byte for
/// byte, until answered) and the state that reads the RESPONSE.
pub struct Initiation {
    state: Option<HandshakeState>,
    pub message: Vec<u8>,
    /// The PSK the state mixes in (restored after a try with another).
    psk: [u8; KEY_LEN],
}

impl Initiation {
    /// A fresh ephemeral key and the INITIATION carrying `body`.
    pub fn new(
        id: &Identity,
        psk: &[u8; KEY_LEN],
        context: &[u8],
        body: &[u8; HELLO_BODY_LEN],
    ) -> Result<Initiation, HandshakeError> {
        Initiation::with_payload(id, psk, context, body)
    }

    /// A re-handshake's INITIATION: `body` and rekey number `number`.
    pub fn rekey(
        id: &Identity,
        psk: &[u8; KEY_LEN],
        context: &[u8],
        body: &[u8; HELLO_BODY_LEN],
        number: u64,
    ) -> Result<Initiation, HandshakeError> {
        let mut payload = [0u8; HELLO_BODY_LEN + 8];
        payload[..HELLO_BODY_LEN].copy_from_slice(body);
        payload[HELLO_BODY_LEN..].copy_from_slice(&number.to_be_bytes());
        Initiation::with_payload(id, psk, context, &payload)
    }

    fn with_payload(
        id: &Identity,
        psk: &[u8; KEY_LEN],
        context: &[u8],
        payload: &[u8],
    ) -> Result<Initiation, HandshakeError> {
        let prologue = prologue(context);
        let mut hs = builder(id, psk, &prologue)?
            .remote_public_key(&id.peer_public)
            .build_initiator()
            .map_err(|_| HandshakeError::Setup("initiator"))?;
        let mut message = vec![0u8; REKEY_INIT_MSG_LEN];
        let n = hs
            .write_message(payload, &mut message)
            .map_err(|_| HandshakeError::Setup("initiation"))?;
        message.truncate(n);
        Ok(Initiation {
            state: Some(hs),
            message,
            psk: *psk,
        })
    }

    /// Answered already (a RESPONSE was read; the state is gone).
    pub fn is_done(&self) -> bool {
        self.state.is_none()
    }

    /// [`Self::read_response`], and if the RESPONSE does not authenticate,
    /// again with `other` as the PSK (a key rotation: the twin may still
    /// answer under the PSK before).
    pub fn read_response_or(
        &mut self,
        msg: &[u8],
        other: Option<&[u8; KEY_LEN]>,
    ) -> Result<([u8; HELLO_BODY_LEN], Secrets), HandshakeError> {
        let first = self.read_response(msg);
        let (Err(HandshakeError::Auth), Some(other)) = (&first, other) else {
            return first;
        };
        let psk = self.psk;
        let set = |s: &mut Option<HandshakeState>, k: &[u8; KEY_LEN]| {
            s.as_mut().map(|hs| hs.set_psk(2, k).is_ok())
        };
        if set(&mut self.state, other) != Some(true) {
            return first;
        }
        let second = self.read_response(msg);
        if second.is_err() {
            set(&mut self.state, &psk);
        }
        second
    }

    /// Reads a RESPONSE: the server's HELLO body and the session secrets.
    /// A refused message leaves the initiation as it was (snow restores its
    /// state), so a forgery cannot spoil the genuine answer behind it.
    pub fn read_response(
        &mut self,
        msg: &[u8],
    ) -> Result<([u8; HELLO_BODY_LEN], Secrets), HandshakeError> {
        if msg.len() != RESP_MSG_LEN {
            return Err(HandshakeError::Length(msg.len()));
        }
        let hs = self.state.as_mut().ok_or(HandshakeError::Auth)?;
        let mut body = [0u8; RESP_MSG_LEN];
        let n = hs
            .read_message(msg, &mut body)
            .map_err(|_| HandshakeError::Auth)?;
        if n != HELLO_BODY_LEN || !hs.is_handshake_finished() {
            return Err(HandshakeError::Auth);
        }
        let mut out = [0u8; HELLO_BODY_LEN];
        out.copy_from_slice(&body[..HELLO_BODY_LEN]);
        let mut hs = self.state.take().ok_or(HandshakeError::Auth)?;
        Ok((out, finish(&mut hs)))
    }
}

/// The server's half: an INITIATION read (the client's static key checked),
/// waiting for the body to answer with.
pub struct Responder {
    state: HandshakeState,
    pub body: [u8; HELLO_BODY_LEN],
    /// A re-handshake's rekey number (`None`: a session's INITIATION).
    pub rekey: Option<u64>,
}

impl Responder {
    /// Reads an INITIATION (or a re-handshake's, [`REKEY_INIT_MSG_LEN`]
    /// bytes). Refuses one that does not authenticate and one from a
    /// static key other than `id.peer_public`.
    pub fn read(
        id: &Identity,
        psk: &[u8; KEY_LEN],
        context: &[u8],
        msg: &[u8],
    ) -> Result<Responder, HandshakeError> {
        let payload_len = match msg.len() {
            INIT_MSG_LEN => HELLO_BODY_LEN,
            REKEY_INIT_MSG_LEN => HELLO_BODY_LEN + 8,
            n => return Err(HandshakeError::Length(n)),
        };
        let prologue = prologue(context);
        let mut hs = builder(id, psk, &prologue)?
            .build_responder()
            .map_err(|_| HandshakeError::Setup("responder"))?;
        let mut body = [0u8; REKEY_INIT_MSG_LEN];
        let n = hs
            .read_message(msg, &mut body)
            .map_err(|_| HandshakeError::Auth)?;
        if n != payload_len {
            return Err(HandshakeError::Auth);
        }
        let rekey = (n > HELLO_BODY_LEN).then(|| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[HELLO_BODY_LEN..n]);
            u64::from_be_bytes(b)
        });
        // Constant time is not needed: the key is public.
        if hs.get_remote_static() != Some(&id.peer_public[..]) {
            return Err(HandshakeError::UnknownPeer);
        }
        let mut out = [0u8; HELLO_BODY_LEN];
        out.copy_from_slice(&body[..HELLO_BODY_LEN]);
        Ok(Responder {
            state: hs,
            body: out,
            rekey,
        })
    }

    /// Writes the RESPONSE carrying `body` (a fresh ephemeral key) and
    /// returns it with the session secrets.
    pub fn respond(
        mut self,
        body: &[u8; HELLO_BODY_LEN],
    ) -> Result<(Vec<u8>, Secrets), HandshakeError> {
        let mut message = vec![0u8; RESP_MSG_LEN];
        let n = self
            .state
            .write_message(body, &mut message)
            .map_err(|_| HandshakeError::Setup("response"))?;
        message.truncate(n);
        if !self.state.is_handshake_finished() {
            return Err(HandshakeError::Setup("response"));
        }
        Ok((message, finish(&mut self.state)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn pair() -> (Identity, Identity) {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        (
            Identity {
                private: a,
                peer_public: public_key(&b),
            },
            Identity {
                private: b,
                peer_public: public_key(&a),
            },
        )
    }

    #[test]
    fn lengths_and_agreement() {
        let (c, s) = pair();
        let psk = [9u8; 32];
        let mut init = Initiation::new(&c, &psk, b"", &[7u8; HELLO_BODY_LEN]).unwrap();
        assert_eq!(init.message.len(), INIT_MSG_LEN);
        let r = Responder::read(&s, &psk, b"", &init.message).unwrap();
        assert_eq!(r.body, [7u8; HELLO_BODY_LEN]);
        let (resp, ss) = r.respond(&[8u8; HELLO_BODY_LEN]).unwrap();
        assert_eq!(resp.len(), RESP_MSG_LEN);
        // A forged response first: refused, and the genuine one still reads.
        let mut forged = resp.clone();
        forged[40] ^= 1;
        assert_eq!(
            init.read_response(&forged).err(),
            Some(HandshakeError::Auth)
        );
        let (body, cs) = init.read_response(&resp).unwrap();
        assert_eq!(body, [8u8; HELLO_BODY_LEN]);
        assert!(init.is_done());
        assert_eq!((cs.c2s, cs.s2c, cs.hash), (ss.c2s, ss.s2c, ss.hash));
        assert_ne!(cs.c2s, cs.s2c);
        // Answered: a duplicate response is refused.
        assert!(init.read_response(&resp).is_err());
    }

    #[test]
    fn refusals() {
        let (c, s) = pair();
        let psk = [9u8; 32];
        let init = Initiation::new(&c, &psk, b"", &[7u8; HELLO_BODY_LEN]).unwrap();
        // An initiator with another static key (sealed to the right server).
        let stranger = Identity {
            private: [3u8; 32],
            peer_public: c.peer_public,
        };
        let m = Initiation::new(&stranger, &psk, b"", &[7u8; HELLO_BODY_LEN]).unwrap();
        assert_eq!(
            Responder::read(&s, &psk, b"", &m.message).err(),
            Some(HandshakeError::UnknownPeer)
        );
        // Sealed to another server key.
        let wrong = Identity {
            private: [4u8; 32],
            peer_public: s.peer_public,
        };
        assert_eq!(
            Responder::read(&wrong, &psk, b"", &init.message).err(),
            Some(HandshakeError::Auth)
        );
        // Another prologue (context).
        assert!(Responder::read(&s, &psk, b"shard 0/2", &init.message).is_err());
        // Truncated, garbage.
        assert!(Responder::read(&s, &psk, b"", &init.message[1..]).is_err());
        assert!(Responder::read(&s, &psk, b"", &[0u8; INIT_MSG_LEN]).is_err());
        // Another PSK: the initiation reads (psk2 is mixed in the
        // response), the response does not.
        let mut init = Initiation::new(&c, &psk, b"", &[7u8; HELLO_BODY_LEN]).unwrap();
        let r = Responder::read(&s, &[1u8; 32], b"", &init.message).unwrap();
        let (resp, _) = r.respond(&[8u8; HELLO_BODY_LEN]).unwrap();
        assert_eq!(init.read_response(&resp).err(), Some(HandshakeError::Auth));
    }

    #[test]
    fn public_key_matches_snow() {
        let kp = Builder::new(PATTERN.parse().unwrap())
            .generate_keypair()
            .unwrap();
        let mut private = [0u8; 32];
        private.copy_from_slice(&kp.private);
        assert_eq!(&public_key(&private)[..], &kp.public[..]);
    }
}
