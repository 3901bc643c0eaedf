//! The WAN pre-shared key file.
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

#[cfg(test)]
mod tests {
    use super::*;

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
