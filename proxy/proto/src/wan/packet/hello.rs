//! The HELLO body: the cleartext part of session setup (nonces, credit,
//! datagram size, cipher offer), and why one is refused.

use thiserror::Error;

use super::super::cipher::CipherOffer;
use super::HELLO_BODY_LEN;

/// Why a HELLO body was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HelloError {
    #[error("HELLO body of {0} bytes, not {HELLO_BODY_LEN}")]
    Length(usize),
    #[error("unknown HELLO flags {0:#06x}")]
    Flags(u16),
    #[error("HELLO nonce is 0")]
    ZeroNonce,
}

/// The cleartext body of a HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Sender's session nonce (never 0).
    pub nonce: u64,
    /// The peer nonce the sender saw last (0: none yet). Echoing the
    /// receiver's current nonce proves the HELLO is fresh.
    pub echo: u64,
    /// Initial per-flow credit the sender grants (bytes).
    pub flow_window: u64,
    /// Largest datagram the sender sends.
    pub max_datagram: u16,
    /// The sender has committed to the session of (its nonce, `echo`): it
    /// only needs a protected packet from the receiver, not another HELLO.
    pub committed: bool,
    /// The ciphers the sender accepts and prefers ([`CipherOffer::NONE`] in
    /// lab mode). Not checked here: bits unknown to this version are allowed
    /// (see [`super::super::cipher::agree`]).
    pub offer: CipherOffer,
}

impl Hello {
    pub fn encode(&self, out: &mut [u8; HELLO_BODY_LEN]) {
        out[0..8].copy_from_slice(&self.nonce.to_be_bytes());
        out[8..16].copy_from_slice(&self.echo.to_be_bytes());
        out[16..24].copy_from_slice(&self.flow_window.to_be_bytes());
        out[24..26].copy_from_slice(&self.max_datagram.to_be_bytes());
        out[26..28].copy_from_slice(&u16::from(self.committed).to_be_bytes());
        out[28] = self.offer.accept;
        out[29] = self.offer.prefer;
    }

    pub fn decode(b: &[u8]) -> Result<Hello, HelloError> {
        let bytes: &[u8; HELLO_BODY_LEN] = b.try_into().map_err(|_| HelloError::Length(b.len()))?;
        let u64_at = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(v)
        };
        let (nonce, echo, flow_window) = (u64_at(0), u64_at(8), u64_at(16));
        let max_datagram = u16::from_be_bytes([bytes[24], bytes[25]]);
        let flags = u16::from_be_bytes([bytes[26], bytes[27]]);
        let (accept, prefer) = (bytes[28], bytes[29]);
        if flags > 1 {
            return Err(HelloError::Flags(flags));
        }
        if nonce == 0 {
            return Err(HelloError::ZeroNonce);
        }
        Ok(Hello {
            nonce,
            echo,
            flow_window,
            max_datagram,
            committed: flags == 1,
            offer: CipherOffer { accept, prefer },
        })
    }
}
