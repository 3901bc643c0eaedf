//! Operator key rotation without a restart (identity mode): a reload gives
//! the running session a new identity key pair, a new twin public key
//! and/or a new PSK ([`Session::rotate_keys`]). They are used from the
//! next handshake on: the client starts a re-handshake at once; the
//! server's new keys take effect at the client's next one.
//!
//! For [`ROTATION_WINDOW`] after the reload the keys before are accepted
//! too, so the twins can be reloaded one after the other in either order:
//!
//! - the server reads an INITIATION with its current keys, then with the
//!   keys before (its private key and the twin public key it expected);
//! - the server answers under the PSK before (the one the running session
//!   was set up with, which the not-yet-reloaded client still has), the
//!   new one once the window is over;
//! - the client reads a RESPONSE under its current PSK, then under the one
//!   before.
//!
//! A client reloaded with keys its twin does not know yet (its own new key
//! pair, or the server's new public key, before the server's reload) sends
//! re-handshakes the server refuses (counted): the running session goes on
//! under its current keys, with its key updates, and the re-handshake
//! succeeds as soon as the server is reloaded. Nothing is torn down.

use super::*;
use crate::wan::handshake::Identity;

/// How long the keys before a rotation are still accepted: the time an
/// operator has to reload the twin.
pub const ROTATION_WINDOW: Duration = Duration::from_secs(600);

/// The keys before a rotation, and until when they are accepted.
#[derive(Clone)]
pub struct Previous {
    pub identity: Identity,
    pub psk: [u8; 32],
    pub until: Time,
}

impl Session {
    /// Identity mode: new keys from a reload (`psk` `None`: no PSK mixed
    /// in). Returns false (nothing changed) in PSK-only or lab mode, or
    /// when the keys are the ones in use.
    pub fn rotate_keys(&mut self, identity: Identity, psk: Option<[u8; 32]>, now: Time) -> bool {
        let context = self.context.clone();
        let Some(n) = self.noise.as_mut() else {
            return false;
        };
        let new_psk = psk.unwrap_or([0; 32]);
        if n.identity == identity && *n.psk() == new_psk {
            return false;
        }
        let old = n.replace_keys(identity, new_psk);
        n.previous = Some(Previous {
            identity: old.0,
            psk: old.1,
            until: now + ROTATION_WINDOW,
        });
        // Probes (a restarted server's HELLO) are MACed with the new PSK.
        self.psk = psk;
        self.auth = HelloAuth::with_context(self.psk.as_ref(), &context);
        if self.is_client && self.confirmed && self.peer.is_some() {
            // Effective at once: a re-handshake under the new keys (after
            // the one in flight, whose keys the server may hold already).
            self.rekey_soon();
        }
        true
    }

    /// The PSK before a rotation, while still accepted (a RESPONSE is read
    /// under it when it does not read under the current one).
    pub(super) fn previous_keys_psk(&self, now: Time) -> Option<[u8; 32]> {
        self.previous_keys(now).map(|p| p.psk)
    }

    /// The keys before a rotation, while still accepted.
    pub(super) fn previous_keys(&self, now: Time) -> Option<&Previous> {
        self.noise
            .as_ref()?
            .previous
            .as_ref()
            .filter(|p| now < p.until)
    }
}
