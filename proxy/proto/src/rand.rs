//! Randomness from the operating system's CSPRNG (`getrandom(2)` on Linux,
//! through the `getrandom` crate): session nonces and generated keys. No
//! hand-opened `/dev/urandom`.

use std::io;

fn os_error(e: getrandom::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::other(format!("getrandom: {e}")),
    }
}

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(os_error)
}

/// A fresh, never-zero 64-bit session nonce (a gateway's session
/// generation: see [`crate::wan::WanConnection::new`]).
pub fn session_nonce() -> io::Result<u64> {
    loop {
        let n = getrandom::u64().map_err(os_error)?;
        if n != 0 {
            return Ok(n);
        }
    }
}

/// A fresh 256-bit key (a WAN pre-shared key for a lab or a test).
pub fn key() -> io::Result<[u8; 32]> {
    let mut k = [0u8; 32];
    fill(&mut k)?;
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_and_keys_are_fresh() {
        let (a, b) = (session_nonce().unwrap(), session_nonce().unwrap());
        assert!(a != 0 && b != 0 && a != b);
        let (k1, k2) = (key().unwrap(), key().unwrap());
        assert_ne!(k1, k2);
        assert_ne!(k1, [0u8; 32]);
    }
}
