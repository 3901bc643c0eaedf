//! Ciphers and keys: each cipher carries a transfer, mismatched offers or
//! keys never connect (and say why), lab peers talk plaintext.

use super::*;

#[test]
fn transfer_with_each_cipher() {
    use CipherPolicy::{Auto, Only};
    let (aes, cha) = (Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305);
    let auto = if aes_hardware() { aes } else { cha };
    for (pa, pb, want) in [
        (Only(aes), Only(aes), aes),
        (Only(cha), Only(cha), cha),
        (Auto, Auto, auto),
        (Auto, Only(cha), cha),
        (Only(aes), Auto, aes),
    ] {
        let mut a = wan_cfg(&[(GBPS, ms(3))], CcKind::FixedRate, Some(KEY));
        a.cipher = pa;
        let mut b = a.clone();
        b.is_client = false;
        b.cipher = pb;
        let mut l = LinkCfg::new(us(1500), GBPS);
        l.loss = 0.01;
        let mut sim = Sim::new(a, b, vec![l.clone()], vec![l], 31);
        transfer(&format!("cipher {pa:?} / {pb:?}"), &mut sim);
        for side in 0..2 {
            let s = sim.ends[side].stats();
            assert_eq!(s.cipher, Some(want), "{pa:?} / {pb:?}: side {side}");
            assert_eq!(s.cipher_mismatches, 0);
            assert_eq!(s.auth_failures, 0, "{pa:?} / {pb:?}: side {side}");
        }
    }
}

/// Twins that accept disjoint ciphers never connect, never exchange a
/// protected packet, and both report the mismatch once (not per HELLO).
#[test]
fn cipher_mismatch_is_reported_and_never_connects() {
    let mut a = wan_cfg(&[(GBPS, ms(3))], CcKind::FixedRate, Some(KEY));
    a.cipher = CipherPolicy::Only(Cipher::Aes256Gcm);
    let mut b = a.clone();
    b.is_client = false;
    b.cipher = CipherPolicy::Only(Cipher::ChaCha20Poly1305);
    let l = || vec![LinkCfg::new(us(1500), GBPS)];
    let mut sim = Sim::new(a, b, l(), l(), 32);
    let mut w = Workload::new(1, Some(5), (100, 100));
    run(&mut sim, &mut w, Time::from_millis(3000));
    for side in 0..2 {
        let s = sim.ends[side].stats();
        assert!(!s.connected && s.cipher.is_none(), "side {side} connected");
        assert_eq!(s.packets_accepted, 0);
        assert!(
            s.cipher_mismatches > 3,
            "side {side}: {}",
            s.cipher_mismatches
        );
        let reported: Vec<&Event> = sim
            .events(side)
            .filter(|e| matches!(e, Event::CipherMismatch { .. }))
            .collect();
        assert_eq!(reported.len(), 1, "side {side}: {reported:?}");
        let Event::CipherMismatch { ours, theirs, .. } = reported[0] else {
            unreachable!()
        };
        let (mine, other) = if side == 0 {
            (aes_only(), cha_only())
        } else {
            (cha_only(), aes_only())
        };
        assert_eq!((ours.to_string(), theirs.to_string()), (mine, other));
    }
    assert_eq!(w.delivered_msgs, 0);
}

fn aes_only() -> String {
    "accepts aes-256-gcm, prefers aes-256-gcm".into()
}

fn cha_only() -> String {
    "accepts chacha20-poly1305, prefers chacha20-poly1305".into()
}

#[test]
fn mismatched_security_never_connects() {
    // Keyed vs lab mode, and two different keys: nothing is accepted.
    let l = || vec![LinkCfg::new(us(1500), GBPS)];
    let keyed = wan_cfg(&[(GBPS, ms(3))], CcKind::FixedRate, Some(KEY));
    let mut lab = keyed.clone();
    lab.key = None;
    lab.is_client = false;
    let mut other = keyed.clone();
    other.key = Some([7; 32]);
    other.is_client = false;
    for (b, what) in [(lab, "lab mode"), (other, "other key")] {
        let mut sim = Sim::new(keyed.clone(), b, l(), l(), 99);
        let mut w = Workload::new(1, Some(5), (100, 100));
        run(&mut sim, &mut w, Time::from_millis(300));
        for side in 0..2 {
            let s = sim.ends[side].stats();
            assert!(!s.connected, "{what}: side {side} connected");
            assert_eq!(s.packets_accepted + s.hellos_accepted, 0, "{what}");
            assert!(s.auth_failures > 0, "{what}");
        }
    }
    // Two clients: refused as a role conflict.
    let mut sim = Sim::new(keyed.clone(), keyed, l(), l(), 98);
    let mut w = Workload::new(1, Some(5), (100, 100));
    run(&mut sim, &mut w, Time::from_millis(300));
    assert!(!sim.ends[0].stats().connected);
    assert!(sim.ends[0].stats().role_conflicts > 0);
}

#[test]
fn lab_mode_works_between_lab_peers() {
    let mut cfg = wan_cfg(&[(GBPS, ms(3))], CcKind::FixedRate, None);
    cfg.key = None;
    let mut b = cfg.clone();
    b.is_client = false;
    // Cipher settings mean nothing without a key: no mismatch.
    cfg.cipher = CipherPolicy::Only(Cipher::Aes256Gcm);
    b.cipher = CipherPolicy::Only(Cipher::ChaCha20Poly1305);
    let l = vec![LinkCfg::new(us(1500), GBPS)];
    let mut sim = Sim::new(cfg, b, l.clone(), l, 97);
    transfer("lab mode", &mut sim);
    assert_eq!(sim.ends[0].stats().cipher, None);
}
