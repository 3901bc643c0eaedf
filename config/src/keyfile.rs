//! The WAN pre-shared key file, and the identity key files (base64
//! X25519 keys, [`read_private_key_file`]).
//!
//! Accepted formats, chosen so that the common mistakes are caught:
//! * text: at least 64 hex digits (32 bytes), whitespace and newlines ignored
//!   — what `head -c 32 /dev/urandom | xxd -p -c 64` produces;
//! * raw binary: at least 32 bytes — what `head -c 32 /dev/urandom` produces.
//!
//! A file that is entirely printable text is always read as hex. Otherwise a
//! passphrase typed into the file ("correct horse battery staple…") would be
//! taken as 30-odd "random" bytes; a hex file with a typo would silently
//! become a different key than the twin's.

use std::io::Read;
use std::path::Path;

use crate::error::ConfigError;

/// Minimum key material, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

const ACCEPTED: &str =
    "accepted: at least 64 hex digits (whitespace ignored) or at least 32 bytes \
                        of raw binary; generate one with `head -c 32 /dev/urandom | xxd -p -c 64`";

/// Reads and checks a key file: exists, is a regular file, is not
/// world-readable (Unix), and holds at least 32 bytes of key material.
/// Returns the decoded key bytes.
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    let fail = |reason: String| ConfigError::KeyFile {
        path: path.to_path_buf(),
        reason,
    };
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => fail(format!("key file {shown} does not exist")),
        _ => fail(format!("cannot read key file {shown}: {e}")),
    })?;
    if !meta.is_file() {
        return Err(fail(format!("key file {shown} is not a regular file")));
    }
    check_permissions(path, &meta).map_err(fail)?;
    // Bounded read: a key file is tiny; refusing huge files avoids reading
    // e.g. a mistakenly configured disk image into memory.
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024 + 1).read_to_end(&mut data))
        .map_err(|e| fail(format!("cannot read key file {shown}: {e}")))?;
    if data.len() > 64 * 1024 {
        return Err(fail(format!(
            "key file {shown} is larger than 64 KiB; {ACCEPTED}"
        )));
    }
    decode_key(&data).map_err(|e| fail(format!("key file {shown} {e}")))
}

#[cfg(unix)]
fn check_permissions(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o004 != 0 {
        let p = path.display();
        return Err(format!(
            "key file {p} is world-readable (mode {mode:04o}); run chmod 600 {p}"
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_permissions(_: &Path, _: &std::fs::Metadata) -> Result<(), String> {
    Ok(())
}

/// Decodes key material; the error completes "key file X …".
pub fn decode_key(data: &[u8]) -> Result<Vec<u8>, String> {
    let is_text = data
        .iter()
        .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace());
    if !is_text {
        if data.len() < MIN_KEY_BYTES {
            return Err(format!(
                "holds only {} bytes of raw key material; {ACCEPTED}",
                data.len()
            ));
        }
        return Ok(data.to_vec());
    }
    let mut digits = Vec::with_capacity(data.len());
    for (i, &b) in data.iter().enumerate() {
        if b.is_ascii_whitespace() {
            continue;
        }
        match (b as char).to_digit(16) {
            Some(d) => digits.push(d as u8),
            None => {
                return Err(format!(
                    "is text but not hex: {:?} at byte {i}; {ACCEPTED}",
                    b as char
                ))
            }
        }
    }
    if digits.len() % 2 != 0 {
        return Err(format!(
            "has an odd number of hex digits ({}); {ACCEPTED}",
            digits.len()
        ));
    }
    let key: Vec<u8> = digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect();
    if key.len() < MIN_KEY_BYTES {
        return Err(format!(
            "holds only {} bytes ({} hex digits) of key material; {ACCEPTED}",
            key.len(),
            digits.len()
        ));
    }
    Ok(key)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A 32-byte key as standard base64 (44 characters, one `=`), the form
/// `soya genkey` writes and `soya pubkey` prints (WireGuard's form too).
pub fn encode_key_base64(key: &[u8; 32]) -> String {
    let mut out = String::with_capacity(44);
    for chunk in key.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes a base64 32-byte key (surrounding whitespace ignored); the
/// error says what was wrong and what is accepted.
pub fn decode_key_base64(text: &str) -> Result<[u8; 32], String> {
    const WANT: &str = "expected 44 base64 characters ending in '=' (a 32-byte X25519 key, \
                        as `soya genkey` writes and `soya pubkey` prints)";
    let t = text.trim();
    if t.len() != 44 || !t.ends_with('=') || t[..43].contains('=') {
        return Err(format!("is {} characters long; {WANT}", t.len()));
    }
    let mut bits: u32 = 0;
    let mut nbits = 0;
    let mut out = Vec::with_capacity(33);
    for (i, c) in t[..43].bytes().enumerate() {
        let Some(v) = B64.iter().position(|&x| x == c) else {
            return Err(format!("has {:?} at character {i}; {WANT}", c as char));
        };
        bits = (bits << 6) | v as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    if bits != 0 {
        return Err(format!("has stray bits in its last character; {WANT}"));
    }
    let key: [u8; 32] = out
        .get(..32)
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| WANT.to_string())?;
    Ok(key)
}

/// Reads and checks a private key file (`wan.private_key_file`): exists,
/// is a regular file, is not world-readable (Unix), and holds one base64
/// 32-byte key.
pub fn read_private_key_file(path: &Path) -> Result<[u8; 32], ConfigError> {
    let fail = |reason: String| ConfigError::KeyFile {
        path: path.to_path_buf(),
        reason,
    };
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => fail(format!(
            "private key file {shown} does not exist; create it with `soya genkey {shown}`"
        )),
        _ => fail(format!("cannot read private key file {shown}: {e}")),
    })?;
    if !meta.is_file() {
        return Err(fail(format!(
            "private key file {shown} is not a regular file"
        )));
    }
    check_permissions(path, &meta).map_err(fail)?;
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(1024).read_to_end(&mut data))
        .map_err(|e| fail(format!("cannot read private key file {shown}: {e}")))?;
    let text = std::str::from_utf8(&data).map_err(|_| {
        fail(format!(
            "private key file {shown} is not text; write it with `soya genkey`"
        ))
    })?;
    decode_key_base64(text).map_err(|e| fail(format!("private key file {shown} {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_keys() {
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let t = encode_key_base64(&k);
        assert_eq!(t.len(), 44);
        assert!(t.ends_with('='));
        assert_eq!(decode_key_base64(&format!("  {t}\n")), Ok(k));
        // A known value: 32 zero bytes.
        assert_eq!(
            encode_key_base64(&[0; 32]),
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
        );
        assert_eq!(
            encode_key_base64(&[0xff; 32]),
            "//////////////////////////////////////////8="
        );
        assert!(decode_key_base64("").unwrap_err().contains("44 base64"));
        assert!(decode_key_base64(&t[..43]).is_err());
        let bad = format!("{}*{}", &t[..5], &t[6..]);
        assert!(decode_key_base64(&bad)
            .unwrap_err()
            .contains("'*' at character 5"));
        // Stray bits in the last character (not a canonical encoding).
        let last = format!("{}B=", &t[..42]);
        if last != t {
            assert!(decode_key_base64(&last).is_err() || decode_key_base64(&last) != Ok(k));
        }
    }

    #[test]
    fn hex_and_raw() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
        let key = decode_key(hex.as_bytes()).unwrap();
        assert_eq!(key.len(), 32);
        assert_eq!(&key[..3], &[0x00, 0x11, 0x22]);
        assert_eq!(key[31], 0xff);
        // Split over lines, as `xxd -p` does by default.
        let split = "00112233445566778899aabbccddeeff0011\n2233445566778899aabbccddeeff\n";
        assert_eq!(decode_key(split.as_bytes()).unwrap().len(), 32);
        let mut raw = vec![0u8; 32];
        raw[5] = 0x80;
        assert_eq!(decode_key(&raw).unwrap(), raw);
    }

    #[test]
    fn short_or_mistyped_keys_are_refused() {
        let e = decode_key(b"0011223344").unwrap_err();
        assert!(
            e.contains("only 5 bytes (10 hex digits)") && e.contains("64 hex digits"),
            "{e}"
        );
        let e = decode_key(b"correct horse battery staple is a fine passphrase").unwrap_err();
        assert!(e.contains("not hex: 'o' at byte 1"), "{e}");
        let e = decode_key(b"abc").unwrap_err();
        assert!(e.contains("odd number"), "{e}");
        let e = decode_key(&[0u8; 31]).unwrap_err();
        assert!(e.contains("only 31 bytes of raw"), "{e}");
        assert!(decode_key(b"").is_err());
    }
}
