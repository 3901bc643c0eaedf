//! The periodic re-handshake (`session::rekey`) at packet level, in
//! virtual time: transfers across many re-handshakes under loss,
//! reordering and duplication; lost, duplicated and reordered REKEY
//! INITIATIONs and RESPONSEs; a datagram of the old keys after the switch;
//! replays of an earlier re-handshake and of old datagrams refused and
//! counted.

use super::noise::{configs, is_hello, message, Fates, Pair, ONE_WAY};
use super::*;
use crate::wan::session::{REKEY_INIT_LEN, RESP_LEN};

/// Bit 2 of the flags byte: the key phase (`packet::header`).
fn phase(b: &[u8]) -> bool {
    b[1] & 0b100 != 0
}

/// Identity-keyed twins (PSK mixed in) re-handshaking every `interval`.
fn rekeying(paths: usize, interval: Duration) -> (WanConfig, WanConfig) {
    let (mut a, mut b) = configs(Some(KEY), paths);
    a.tuning.rekey_interval = interval;
    b.tuning.rekey_interval = interval;
    (a, b)
}

/// The standard transfer (8 flows, every message once and in order, which
/// `transfer` checks) over two lossy, reordering, duplicating paths, with
/// a re-handshake every 20 ms and the ratchet's updates every 15 ms in
/// between: both kinds of switch race each other and retransmissions. The
/// session stays one session (no restart, same generations), nothing fails
/// to authenticate, and the transfer takes no longer than without
/// re-handshakes (no pause).
#[test]
fn transfer_across_many_rekeys_with_loss_reordering_duplication() {
    for cipher in Cipher::ALL {
        let mut done_at = Vec::new();
        for interval in [Duration::ZERO, ms(20)] {
            let (mut a, mut b) = rekeying(2, interval);
            for c in [&mut a, &mut b] {
                c.cipher = CipherPolicy::Only(cipher);
                c.tuning.key_update_packets = 300;
                c.tuning.key_update_interval = ms(15);
            }
            let l = LinkCfg::rough();
            let mut sim = Sim::new(a, b, vec![l.clone(), l.clone()], vec![l.clone(), l], 362);
            let name = format!("rekey every {interval:?}, {cipher}");
            // Three times the standard transfer: ~400 ms of virtual time.
            let per_flow = if cfg!(debug_assertions) { 600 } else { 6000 };
            let mut w = Workload::new(8, Some(per_flow), (40, 4200));
            run(&mut sim, &mut w, Time::from_millis(20_000));
            assert_done(&name, &sim, &w);
            done_at.push(sim.now);
            let (sa, sb) = (sim.ends[0].stats(), sim.ends[1].stats());
            println!(
                "{name}: rekeys A {} B {}, updates A {} B {}, previous-key packets B {}",
                sa.rekeys, sb.rekeys, sa.tx_key_updates, sb.tx_key_updates, sb.rx_key_previous
            );
            if interval.is_zero() {
                assert_eq!(sa.rekeys + sb.rekeys, 0);
                continue;
            }
            assert!(sa.rekeys >= 4, "{name}: {} re-handshakes", sa.rekeys);
            assert!(sb.rekeys >= sa.rekeys, "{name}: the server confirms first");
            assert!(sb.rekeys <= sa.rekeys + 1, "{name}");
            assert_eq!(sb.rx_key_updates, sa.tx_key_updates, "{name}");
            assert_eq!(sa.rx_key_updates, sb.tx_key_updates, "{name}");
            for (side, s) in [&sa, &sb].into_iter().enumerate() {
                assert_eq!(s.peer_restarts, 0, "{name}: side {side}");
                assert_eq!(
                    s.auth_failures + s.handshake_failures,
                    0,
                    "{name}: side {side}"
                );
                assert_eq!(s.peer_generation, Some(sim.ends[1 - side].generation()));
            }
            assert!(sim.log.iter().flatten().all(|(_, e)| !matches!(
                e,
                Event::PeerRestarted { .. } | Event::Closed { .. } | Event::PathDown(_)
            )));
        }
        // Virtual time: the same workload, seed and links.
        let (base, rekeyed) = (done_at[0].as_nanos(), done_at[1].as_nanos());
        assert!(
            rekeyed * 100 <= base * 102,
            "{cipher}: {rekeyed} ns with re-handshakes against {base} ns without"
        );
    }
}

/// REKEY INITIATIONs lost, delayed behind their copies and duplicated;
/// RESPONSEs lost, duplicated and reordered. The re-handshakes complete,
/// copies are stale (never failures), and a REKEY INITIATION of an earlier
/// re-handshake replayed later is refused and counted, changing nothing.
#[test]
fn rekey_messages_lost_duplicated_and_reordered() {
    let (a, b) = rekeying(1, ms(40));
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
    assert!(pair.connected());
    let mut f = Fates::default();
    let mut recorded: Vec<Vec<u8>> = Vec::new();
    pair.run(Time::from_millis(400), &mut |from, bytes| {
        if from == 0 && bytes.len() == REKEY_INIT_LEN {
            recorded.push(bytes.to_vec());
        }
        f.delays(from, bytes, REKEY_INIT_LEN)
    });
    let (sa, sb) = (pair.ends[0].stats(), pair.ends[1].stats());
    assert!(f.inits >= 5 && f.resps >= 2, "{} / {}", f.inits, f.resps);
    assert!(sa.rekeys >= 3, "{} re-handshakes", sa.rekeys);
    assert!(sb.rekeys >= sa.rekeys);
    assert!(sa.stale_handshakes > 0, "copies of RESPONSEs seen");
    for s in [&sa, &sb] {
        assert_eq!(s.peer_restarts, 0);
        assert_eq!(
            s.handshake_failures + s.auth_failures + s.replays_dropped,
            0
        );
    }
    // The first re-handshake's INITIATION, replayed.
    let before = pair.ends[1].stats();
    let now = pair.now;
    pair.ends[1].handle_datagram(now, 0, &recorded[0]);
    let after = pair.ends[1].stats();
    assert_eq!(after.replays_dropped, before.replays_dropped + 1);
    assert_eq!(after.rekeys, before.rekeys);
    pair.exchange_a_message();
    let s = pair.ends[1].stats();
    assert_eq!((s.peer_restarts, s.auth_failures), (0, 0));
}

/// Around one re-handshake, the client's packets of the old keys are held
/// back (a message's first copy among them: it is retransmitted under the
/// new keys). Delivered right after the server switched, the last one
/// opens under the key before; the same datagram again is a replay; one
/// delivered after the old key is gone fails to authenticate. Each
/// refusal is counted and the message arrives exactly once.
#[test]
fn old_key_datagrams_after_the_switch() {
    let (a, b) = rekeying(1, ms(100));
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
    assert!(pair.connected());
    let mut held: Vec<Vec<u8>> = Vec::new();
    let holding = std::cell::Cell::new(false);
    let mut sent = 0;
    let new_phase_seen = std::cell::Cell::new(false);
    let fate = |from: usize, bytes: &[u8], held: &mut Vec<Vec<u8>>| {
        if from == 0 && bytes.len() == REKEY_INIT_LEN {
            holding.set(true);
        }
        if from == 0 && !is_hello(bytes) {
            if phase(bytes) {
                new_phase_seen.set(true);
            } else if holding.get() && !new_phase_seen.get() {
                held.push(bytes.to_vec());
                return vec![];
            }
        }
        vec![ONE_WAY]
    };
    while pair.ends[1].stats().rekeys == 0 {
        let until = pair.now + ms(1);
        pair.run(until, &mut |f, b| fate(f, b, &mut held));
        if holding.get() && !new_phase_seen.get() {
            // The re-handshake started: messages go out under the old
            // keys and are held back.
            pair.ends[0].send(pair.now, 1, message()).unwrap();
            sent += 1;
        }
        assert!(pair.now < Time::from_millis(400), "no re-handshake");
    }
    assert!(held.len() >= 2, "{} held", held.len());
    let s0 = pair.ends[1].stats();
    let now = pair.now;
    let last = held.last().unwrap().clone();
    pair.ends[1].handle_datagram(now, 0, &last);
    let s1 = pair.ends[1].stats();
    assert_eq!(
        s1.rx_key_previous,
        s0.rx_key_previous + 1,
        "opened, key before"
    );
    assert_eq!(s1.packets_accepted, s0.packets_accepted + 1);
    pair.ends[1].handle_datagram(now, 0, &last);
    let s2 = pair.ends[1].stats();
    assert_eq!(s2.replays_dropped, s1.replays_dropped + 1, "a replay");
    assert_eq!(s2.packets_accepted, s1.packets_accepted);
    // Long after the switch the key before is gone.
    let until = pair.now + ms(50);
    pair.run(until, &mut |_, _| vec![ONE_WAY]);
    let s3 = pair.ends[1].stats();
    let now = pair.now;
    pair.ends[1].handle_datagram(now, 0, &held[0]);
    let s4 = pair.ends[1].stats();
    assert_eq!(
        s4.auth_failures,
        s3.auth_failures + 1,
        "the old key is gone"
    );
    assert_eq!(s4.packets_accepted, s3.packets_accepted);
    let mut got = 0;
    while let Some(e) = pair.ends[1].poll_event() {
        if let Event::Message(_) = e {
            got += 1;
        }
    }
    assert_eq!(
        got, sent,
        "the held messages, retransmitted under the new keys"
    );
    assert!(pair.ends[0].stats().packets_retransmitted > 0);
    assert_eq!(pair.ends[0].stats().peer_restarts, 0);
    pair.exchange_a_message();
}

/// PSK-only mode has no Diffie–Hellman to run again: no re-handshake
/// (key updates go on).
#[test]
fn psk_only_mode_does_not_rekey() {
    let (mut a, mut b) = rekeying(1, ms(10));
    a.identity = None;
    b.identity = None;
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(100), &mut |_, _| vec![ONE_WAY]);
    assert!(pair.connected());
    assert_eq!(pair.ends[0].stats().rekeys + pair.ends[1].stats().rekeys, 0);
}

/// A probe of another server generation (forgeable without a PSK: a CRC)
/// reaching the client while a re-handshake is in flight, before and after
/// its RESPONSE: the client's handshake for the probe is stale, the
/// session stands, and the re-handshakes go on (found by the
/// `wan_handshake` fuzz target: the unanswered one was dropped and none
/// was ever started again). An answered one is never dropped: the server
/// holds its keys, and a new one would replace them.
#[test]
fn a_forged_probe_during_a_rekey_stops_nothing() {
    // A probe from another generation of the server.
    let mut probe = Vec::new();
    {
        let mut b = configs(None, 1).1;
        b.tuning.rekey_interval = ms(40);
        let mut other = WanConnection::new(b, Time::ZERO, 0xEE);
        let mut buf = vec![0u8; 2048];
        other.handle_timeout(Time::ZERO);
        while let Some(t) = other.poll_transmit(Time::ZERO, &mut buf) {
            probe = buf[..t.len].to_vec();
        }
    }
    for after_response in [false, true] {
        let (mut a, mut b) = configs(None, 1);
        a.tuning.rekey_interval = ms(40);
        b.tuning.rekey_interval = ms(40);
        let mut pair = Pair::new(a, b);
        pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
        assert!(pair.connected());
        let (init_seen, resp_seen) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
        while !(if after_response {
            resp_seen.get()
        } else {
            init_seen.get()
        }) {
            let until = pair.now + us(100);
            pair.run(until, &mut |from, bytes| {
                if from == 0 && bytes.len() == REKEY_INIT_LEN {
                    init_seen.set(true);
                }
                if from == 1 && bytes.len() == RESP_LEN && init_seen.get() {
                    resp_seen.set(true);
                }
                vec![ONE_WAY]
            });
            assert!(pair.now < Time::from_millis(200));
        }
        if after_response {
            // Delivered by now (one way after it left).
            let until = pair.now + ONE_WAY + us(100);
            pair.run(until, &mut |_, _| vec![ONE_WAY]);
        }
        let now = pair.now;
        pair.ends[0].handle_datagram(now, 0, &probe);
        run_for_rekeys(&mut pair, 3);
        let (sa, sb) = (pair.ends[0].stats(), pair.ends[1].stats());
        assert!(sa.stale_handshakes > 0, "after response {after_response}");
        for s in [&sa, &sb] {
            assert_eq!(s.peer_restarts + s.auth_failures, 0, "{after_response}");
        }
        pair.exchange_a_message();
    }
}

/// Runs `pair` until the client completed `n` more re-handshakes (at most
/// a virtual second).
fn run_for_rekeys(pair: &mut Pair, n: u64) {
    let want = pair.ends[0].stats().rekeys + n;
    let limit = pair.now + Duration::from_secs(1);
    while pair.ends[0].stats().rekeys < want {
        let until = pair.now + ms(5);
        pair.run(until, &mut |_, _| vec![ONE_WAY]);
        assert!(pair.now < limit, "re-handshakes stopped");
    }
}

/// `wan.rekey_interval` from a site's configuration paces the session's
/// re-handshakes (`SiteParams::from_config` carries it into the tuning),
/// and a reload's new interval (`WanConnection::set_rekey_interval`)
/// brings the next one forward. Virtual time: none before the interval,
/// one just after it, then one each interval.
#[test]
fn the_configured_interval_paces_the_rehandshakes() {
    let text = "site = \"t\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:7000\"\n\
                local_prefixes = [\"10.1.0.0/16\"]\nremote_prefixes = [\"10.2.0.0/16\"]\n\
                [wan]\nbind = [\"127.0.0.1:7400\"]\nkey_file = \"psk\"\n\
                rekey_interval = \"3s\"\n[[wan.paths]]\nname = \"a\"\n\
                remote = \"127.0.0.1:7401\"\nrate = \"1gbit\"\nrtt = \"3ms\"\n";
    let site = soya_config::parse_str(text, "t.toml").unwrap();
    let interval = crate::site::SiteParams::from_config(&site, Some(KEY))
        .wan
        .tuning
        .rekey_interval;
    assert_eq!(interval, Duration::from_secs(3));
    let (a, b) = rekeying(1, interval);
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
    assert!(pair.connected());
    let rekeys = |p: &Pair| (p.ends[0].stats().rekeys, p.ends[1].stats().rekeys);
    // The session started within the first 30 ms: the first re-handshake
    // is due 3 s later, and takes about a round trip and a key update.
    pair.run(Time::from_millis(2990), &mut |_, _| vec![ONE_WAY]);
    assert_eq!(rekeys(&pair), (0, 0));
    pair.run(Time::from_millis(3200), &mut |_, _| vec![ONE_WAY]);
    assert_eq!(rekeys(&pair), (1, 1));
    pair.run(Time::from_millis(5990), &mut |_, _| vec![ONE_WAY]);
    assert_eq!(rekeys(&pair), (1, 1));
    pair.run(Time::from_millis(6300), &mut |_, _| vec![ONE_WAY]);
    assert_eq!(rekeys(&pair), (2, 2));
    // A reload to 1 s: the next one a second from now, not 3 s.
    let now = pair.now;
    pair.ends[0].set_rekey_interval(now, Duration::from_secs(1));
    pair.run(now + ms(1300), &mut |_, _| vec![ONE_WAY]);
    assert_eq!(rekeys(&pair), (3, 3));
    pair.exchange_a_message();
}
