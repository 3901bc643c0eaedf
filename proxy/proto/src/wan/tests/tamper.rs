//! Forged, mutated and replayed datagrams against a keyed session: none is
//! accepted, every one is counted.

use super::*;

/// A keyed session between A and B, then `n` mutated, forged or replayed
/// datagrams into B: none may be accepted, every one must be counted.
///
/// Mutations start from *fresh* packets (valid packets A produced that B has
/// not seen, so only the mutation can make B refuse them: they reach the
/// AEAD check rather than the replay window), from HELLOs, and from packets B
/// already accepted (replays). At the end the fresh originals are delivered
/// and must all be accepted.
fn tamper_sweep(n: usize, seed: u64, cipher: Cipher) {
    let mut cfg = wan_cfg(
        &[(GBPS, ms(3)), (GBPS, ms(3))],
        CcKind::FixedRate,
        Some(KEY),
    );
    cfg.max_datagram = 1452;
    cfg.cipher = CipherPolicy::Only(cipher);
    let links = vec![LinkCfg::new(us(1500), GBPS), LinkCfg::new(us(1500), GBPS)];
    let mut sim = Sim::symmetric(cfg, links, seed);
    sim.tap = Some([vec![], vec![]]);
    let mut w = Workload::new(4, Some(100), (16, 600));
    run(&mut sim, &mut w, Time::from_millis(5000));
    assert_done("tamper setup", &sim, &w);
    assert_eq!(sim.ends[1].stats().cipher, Some(cipher));
    let captured: Vec<(usize, Vec<u8>)> = sim.tap.take().unwrap()[1].clone();
    let is_hello = |b: &[u8]| b[1] & 3 == 1;
    let hellos: Vec<&(usize, Vec<u8>)> = captured.iter().filter(|(_, b)| is_hello(b)).collect();
    let accepted: Vec<&(usize, Vec<u8>)> = captured.iter().filter(|(_, b)| !is_hello(b)).collect();
    assert!(!hellos.is_empty() && accepted.len() > 50);
    // Fresh packets: A sends more, nothing is delivered.
    for f in 0..4 {
        for k in 0..40 {
            let m = TwinMsg::Response {
                packet: vec![k as u8; 16 + 37 * k].into(),
            };
            sim.ends[0].send(sim.now, flow_id(f), m).unwrap();
        }
    }
    let mut fresh: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut t = sim.now;
    while fresh.len() < 150 && t < sim.now + ms(20) {
        sim.ends[0].handle_timeout(t);
        while let Some(tx) = sim.ends[0].poll_transmit(t, &mut sim.buf) {
            fresh.push((tx.path, sim.buf[..tx.len].to_vec()));
        }
        t += us(20);
    }
    assert!(fresh.len() > 20, "{} fresh packets", fresh.len());
    let b = &mut sim.ends[1];
    while b.poll_event().is_some() {}
    let before = b.stats();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let now = sim.now;
    let mut kinds = [0u64; 12];
    for _ in 0..n {
        let (mut path, mut m) = if rng.random_bool(0.1) {
            hellos[rng.random_range(0..hellos.len())].clone()
        } else {
            fresh[rng.random_range(0..fresh.len())].clone()
        };
        let kind = rng.random_range(0..12usize);
        kinds[kind] += 1;
        match kind {
            0 => {
                let i = rng.random_range(0..m.len());
                m[i] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                for _ in 0..rng.random_range(2..9) {
                    let i = rng.random_range(0..m.len());
                    m[i] ^= rng.random_range(1..=255u8);
                }
            }
            2 => m.truncate(rng.random_range(0..m.len())),
            3 => m.extend((0..rng.random_range(1..64)).map(|_| rng.random::<u8>())),
            4 => {
                let a = rng.random_range(0..m.len());
                let b = rng.random_range(a..m.len().min(a + 64)) + 1;
                for x in &mut m[a..b] {
                    *x ^= rng.random_range(1..=255u8);
                }
            }
            5 => {
                // Replay of a packet B already accepted.
                (path, m) = accepted[rng.random_range(0..accepted.len())].clone();
            }
            6 => {
                // Another packet number (the header is authenticated).
                let pn: u64 = rng.random::<u64>() >> 2;
                if pn.to_be_bytes() != m[16..24] {
                    m[16..24].copy_from_slice(&pn.to_be_bytes());
                } else {
                    m[23] ^= 1;
                }
            }
            7 => {
                // Forgery: a valid-looking header, random ciphertext and tag.
                let len = HEADER_LEN + TAG_LEN + rng.random_range(0..1400);
                m.resize(len, 0);
                for x in &mut m[HEADER_LEN..] {
                    *x = rng.random();
                }
            }
            8 => {
                m = (0..rng.random_range(0..2000))
                    .map(|_| rng.random())
                    .collect();
                if !m.is_empty() && rng.random_bool(0.5) {
                    m[0] = crate::wan::PROTOCOL_VERSION;
                }
            }
            9 => {
                // Splice: this header, another packet's body.
                let (_, other) = &fresh[rng.random_range(0..fresh.len())];
                if other[HEADER_LEN..] != m[HEADER_LEN..] {
                    m.truncate(HEADER_LEN);
                    m.extend_from_slice(&other[HEADER_LEN..]);
                } else {
                    m[HEADER_LEN] ^= 1;
                }
            }
            10 => {
                // Wrong path: the header's path byte or the arrival path.
                if rng.random_bool(0.5) {
                    m[2] ^= 1;
                } else {
                    path ^= 1;
                }
            }
            _ => {
                // Another generation.
                let i = rng.random_range(8..16);
                m[i] ^= rng.random_range(1..=255u8);
            }
        }
        b.handle_datagram(now, path, &m);
    }
    let after = b.stats();
    let rejected = |s: &ConnStats| {
        s.auth_failures + s.replays_dropped + s.malformed + s.stale_generation + s.no_session
    };
    println!(
        "tamper sweep {n} ({cipher}): rejected as auth {} replay {} malformed {} stale {}; mutation kinds {kinds:?}",
        after.auth_failures - before.auth_failures,
        after.replays_dropped - before.replays_dropped,
        after.malformed - before.malformed,
        after.stale_generation - before.stale_generation
    );
    assert_eq!(
        after.packets_accepted, before.packets_accepted,
        "a forged packet was accepted"
    );
    assert_eq!(
        after.hellos_accepted, before.hellos_accepted,
        "a forged HELLO was accepted"
    );
    assert_eq!(
        rejected(&after) - rejected(&before),
        n as u64,
        "every datagram counted once"
    );
    assert_eq!(after.peer_generation, before.peer_generation);
    assert!(b.poll_event().is_none(), "no event from forged input");
    assert!(after.auth_failures - before.auth_failures > n as u64 / 3);
    assert!(after.replays_dropped > before.replays_dropped);
    // Control: the unmodified fresh packets are all good.
    for (path, p) in &fresh {
        b.handle_datagram(now, *path, p);
    }
    assert_eq!(
        b.stats().packets_accepted,
        after.packets_accepted + fresh.len() as u64
    );
}

#[test]
fn tamper_sweep_100k_aes_256_gcm() {
    tamper_sweep(100_000, 7, Cipher::Aes256Gcm);
}

#[test]
fn tamper_sweep_100k_chacha20_poly1305() {
    tamper_sweep(100_000, 9, Cipher::ChaCha20Poly1305);
}

#[test]
#[ignore = "long: 10^6 forged datagrams; run with --release -- --ignored"]
fn tamper_sweep_1m() {
    tamper_sweep(1_000_000, 8, Cipher::Aes256Gcm);
    tamper_sweep(1_000_000, 10, Cipher::ChaCha20Poly1305);
}
