//! Identity keys in the configuration: `wan.private_key_file` and
//! `wan.twin_public_key` (the Noise IKpsk2 handshake), checked together,
//! with clear errors; PSK-only mode still loads, with a warning.

#![deny(unsafe_code)]

mod common;

use common::*;
use soya_config::*;

const TWIN: &str = "GTIhwYzVq26YJtCt1Q3p1RSjuyUXuBISuZvPQF8uWS4=";

fn with_identity(extra: &str) -> String {
    edit(
        "key_file = \"psk.key\"\n",
        &format!("private_key_file = \"a.key\"\ntwin_public_key = \"{TWIN}\"\n{extra}"),
    )
}

#[test]
fn identity_keys_parse_with_and_without_a_psk() {
    let cfg = parse_str(&with_identity(""), "test.toml").unwrap();
    let id = cfg.wan.identity.as_ref().unwrap();
    assert_eq!(id.private_key_file, std::path::Path::new("a.key"));
    assert_eq!(encode_key_base64(&id.twin_public_key), TWIN);
    assert_eq!(cfg.wan.security, WanSecurity::Identity);
    assert!(!cfg.warnings().iter().any(|w| w.contains("PSK-only")));
    assert!(cfg.explain().contains("Noise IKpsk2"), "{}", cfg.explain());
    let cfg = parse_str(&with_identity("key_file = \"psk.key\"\n"), "test.toml").unwrap();
    assert!(matches!(cfg.wan.security, WanSecurity::PreSharedKey { .. }));
    assert!(cfg.wan.identity.is_some());
    assert!(cfg.explain().contains("mixed in"), "{}", cfg.explain());
}

#[test]
fn psk_only_mode_loads_with_a_warning() {
    let cfg = parse_str(BASE, "test.toml").unwrap();
    assert!(cfg.wan.identity.is_none());
    let w = cfg.warnings();
    let psk = w.iter().find(|w| w.contains("PSK-only")).expect("warned");
    assert!(
        psk.contains("forward secrecy") && psk.contains("soya genkey"),
        "{psk}"
    );
    assert!(cfg.explain().contains("PSK-only"));
}

#[test]
fn half_an_identity_and_bad_keys_are_refused() {
    let only_private = edit("key_file = \"psk.key\"\n", "private_key_file = \"a.key\"\n");
    expect_error(
        &only_private,
        "[wan]",
        "wan.twin_public_key",
        &["missing", "soya pubkey"],
    );
    let only_public = edit(
        "key_file = \"psk.key\"\n",
        &format!("twin_public_key = \"{TWIN}\"\n"),
    );
    expect_error(
        &only_public,
        "[wan]",
        "wan.private_key_file",
        &["missing", "soya genkey"],
    );
    let short = with_identity("").replace(TWIN, "abc=");
    expect_error(
        &short,
        "twin_public_key",
        "wan.twin_public_key",
        &["4 characters", "44 base64"],
    );
    let bad = with_identity("").replace(TWIN, &TWIN.replace('G', "!"));
    expect_error(
        &bad,
        "twin_public_key",
        "wan.twin_public_key",
        &["'!' at character 0"],
    );
    let insecure = with_identity("insecure = true\n");
    expect_error(&insecure, "insecure", "wan.insecure", &["identity keys"]);
    // Nothing at all: the error names the identity keys first.
    let none = edit("key_file = \"psk.key\"\n", "");
    expect_error(
        &none,
        "[wan]",
        "wan.key_file",
        &["private_key_file", "soya genkey"],
    );
}

/// `load` checks the private key file as it checks `key_file`: exists,
/// not world-readable, one base64 key; a relative path is resolved.
#[cfg(unix)]
#[test]
fn load_checks_the_private_key_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("identity");
    let cfg_path = dir.path().join("t.toml");
    std::fs::write(&cfg_path, with_identity("")).unwrap();
    let key = dir.path().join("a.key");
    let e = load(&cfg_path).unwrap_err().to_string();
    assert!(
        e.contains("does not exist") && e.contains("soya genkey"),
        "{e}"
    );
    std::fs::write(&key, format!("{TWIN}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = load(&cfg_path).unwrap_err().to_string();
    assert!(
        e.contains("world-readable") && e.contains("chmod 600"),
        "{e}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = load(&cfg_path).unwrap();
    assert_eq!(cfg.wan.identity.unwrap().private_key_file, key);
    std::fs::write(&key, "not a key\n").unwrap();
    let e = load(&cfg_path).unwrap_err().to_string();
    assert!(
        e.contains("wan.private_key_file") && e.contains("44 base64"),
        "{e}"
    );
    assert!(read_private_key_file(&key).is_err());
}

/// The example with identity keys parses and names its twin.
#[test]
fn identity_example_parses() {
    let text = std::fs::read_to_string(examples_dir().join("identity.toml")).unwrap();
    let cfg = parse_str(&text, "identity.toml").unwrap();
    assert!(cfg.wan.identity.is_some());
    assert!(matches!(cfg.wan.security, WanSecurity::PreSharedKey { .. }));
}

/// `wan.rekey_interval`: two minutes by default, a humane duration in
/// 1 s..=1 h, shown by `explain` (check-config); zero, absurd and
/// malformed values are refused with a message naming the key and the
/// range, never a panic.
#[test]
fn rekey_interval_is_a_validated_duration() {
    use std::time::Duration;
    let cfg = parse_str(&with_identity(""), "test.toml").unwrap();
    assert_eq!(cfg.wan.rekey_interval, Duration::from_secs(120));
    assert_eq!(
        soya_config::DEFAULT_REKEY_INTERVAL,
        Duration::from_secs(120)
    );
    assert!(cfg.defaulted.iter().any(|k| k == "wan.rekey_interval"));
    let e = cfg.explain();
    assert!(
        e.contains("rekey_interval   a fresh handshake (ephemeral DH) inside the session every 120 s  (default)"),
        "{e}"
    );
    let cfg = parse_str(&with_identity("rekey_interval = \"2s\"\n"), "test.toml").unwrap();
    assert_eq!(cfg.wan.rekey_interval, Duration::from_secs(2));
    assert!(!cfg.defaulted.iter().any(|k| k == "wan.rekey_interval"));
    assert!(cfg.explain().contains("every 2 s\n"), "{}", cfg.explain());
    // PSK-only mode: accepted, said to be unused.
    let psk_only = edit("[wan]\n", "[wan]\nrekey_interval = \"30s\"\n");
    let cfg = parse_str(&psk_only, "test.toml").unwrap();
    assert!(
        cfg.explain().contains("rekey_interval   unused"),
        "{}",
        cfg.explain()
    );
    for (value, says) in [
        ("\"0s\"", "rekey_interval must be between 1 s and 3600 s"),
        ("\"0\"", "unit"),
        ("\"500ms\"", "rekey_interval must be between 1 s and 3600 s"),
        ("\"2h\"", "unit"),
        ("\"7200s\"", "rekey_interval must be between 1 s and 3600 s"),
        ("\"99999999999999999999s\"", ""),
        ("\"-5s\"", ""),
        ("\"soon\"", ""),
        ("120", "a duration 1s..=1h"),
    ] {
        let text = with_identity(&format!("rekey_interval = {value}\n"));
        expect_error(&text, "rekey_interval", "wan.rekey_interval", &[says]);
    }
}

/// `load` keeps a digest of each key it read (never the key): the same
/// content gives the same digest, a key rewritten in place another, and
/// `Debug` shows neither key nor digest. `parse_str` reads no file.
#[cfg(unix)]
#[test]
fn load_keeps_digests_of_the_keys_not_the_keys() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("digests");
    let cfg_path = dir.path().join("t.toml");
    std::fs::write(&cfg_path, with_identity("key_file = \"psk.key\"\n")).unwrap();
    let key = dir.path().join("a.key");
    let psk = dir.path().join("psk.key");
    let other = "ZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY=";
    for (f, text) in [(&key, TWIN.to_string()), (&psk, "ab".repeat(32))] {
        std::fs::write(f, text + "\n").unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let first = load(&cfg_path).unwrap().wan.key_digests;
    assert!(first.private_key.is_some() && first.psk.is_some());
    assert_eq!(load(&cfg_path).unwrap().wan.key_digests, first);
    assert_eq!(
        parse_str(&with_identity(""), "t.toml")
            .unwrap()
            .wan
            .key_digests,
        KeyDigests::default()
    );
    let shown = format!("{:?}", load(&cfg_path).unwrap());
    assert!(shown.contains("private_key: \"read\""), "{shown}");
    assert!(
        !shown.contains(&"ab".repeat(32)) && !shown.contains(TWIN),
        "{shown}"
    );
    std::fs::write(&key, format!("{other}\n")).unwrap();
    let second = load(&cfg_path).unwrap().wan.key_digests;
    assert_ne!(second.private_key, first.private_key);
    assert_eq!(second.psk, first.psk);
    std::fs::write(&psk, "cd".repeat(32) + "\n").unwrap();
    let third = load(&cfg_path).unwrap().wan.key_digests;
    assert_eq!(third.private_key, second.private_key);
    assert_ne!(third.psk, second.psk);
    let hex = KeyDigests::hex(&third.psk).unwrap();
    assert_eq!(KeyDigests::from_hex(&hex), third.psk);
    assert_eq!(KeyDigests::from_hex("zz"), None);
}
