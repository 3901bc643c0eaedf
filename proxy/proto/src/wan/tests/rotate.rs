//! Operator key rotation without a restart (`session::rotate`), at packet
//! level in virtual time: a new identity key pair on either twin, and a
//! new PSK, reloaded on one twin and then the other, in both orders. The
//! session never restarts, the new keys are in use after the second
//! reload (a re-handshake under them completes), and once the window is
//! over the keys before are refused.

use super::super::handshake::{self, Identity};
use super::noise::{configs, ids, Pair, ONE_WAY};
use super::*;
use crate::wan::ROTATION_WINDOW;

const NEW_CLIENT_KEY: [u8; 32] = [0x55; 32];
const NEW_SERVER_KEY: [u8; 32] = [0x66; 32];
const NEW_PSK: [u8; 32] = [0x77; 32];

/// Connected identity-keyed twins (PSK `KEY` mixed in), re-handshaking
/// only when told to (a rotation) or every 10 s.
fn connected() -> Pair {
    let (mut a, mut b) = configs(Some(KEY), 1);
    a.tuning.rekey_interval = Duration::from_secs(10);
    b.tuning.rekey_interval = Duration::from_secs(10);
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
    assert!(pair.connected());
    pair
}

fn run_for(pair: &mut Pair, d: Duration) {
    let until = pair.now + d;
    pair.run(until, &mut |_, _| vec![ONE_WAY]);
}

/// The new keys of each case: (client identity, server identity, PSK).
fn rotated(case: &str) -> (Identity, Identity, [u8; 32]) {
    let (mut c, mut s) = ids();
    let mut psk = KEY;
    match case {
        "client key pair" => {
            c.private = NEW_CLIENT_KEY;
            s.peer_public = handshake::public_key(&NEW_CLIENT_KEY);
        }
        "server key pair" => {
            s.private = NEW_SERVER_KEY;
            c.peer_public = handshake::public_key(&NEW_SERVER_KEY);
        }
        "psk" => psk = NEW_PSK,
        _ => unreachable!(),
    }
    (c, s, psk)
}

/// Each rotation, server reloaded first and client first: no restart, no
/// message lost; after both reloads a re-handshake under the new keys
/// completes (the client's starts at its reload, or right after the
/// server's when the client went first and its twin refused it until
/// then).
#[test]
fn rotation_in_either_order_keeps_the_session() {
    for case in ["client key pair", "server key pair", "psk"] {
        for server_first in [true, false] {
            let name = format!("{case}, server first: {server_first}");
            let mut pair = connected();
            let (c, s, psk) = rotated(case);
            let mut rekeys = vec![pair.ends[0].stats().rekeys];
            let order = if server_first { [1, 0] } else { [0, 1] };
            for side in order {
                let id = if side == 0 { c.clone() } else { s.clone() };
                let now = pair.now;
                assert!(pair.ends[side].rotate_keys(now, id, Some(psk)), "{name}");
                // Past the client's periodic re-handshake (10 s).
                run_for(&mut pair, Duration::from_secs(11));
                pair.exchange_a_message();
                rekeys.push(pair.ends[0].stats().rekeys);
            }
            let (sa, sb) = (pair.ends[0].stats(), pair.ends[1].stats());
            if server_first || case == "psk" {
                // The twin not reloaded yet re-handshakes with the keys
                // before (identity), or reads the answer under the PSK
                // before.
                assert!(rekeys[1] > rekeys[0], "{name}: between the reloads");
            } else {
                // The client's new keys are unknown to the server until its
                // reload: refused and counted, the session goes on.
                assert_eq!(rekeys[1], rekeys[0], "{name}: between the reloads");
                assert!(sb.unknown_peer_keys + sb.handshake_failures > 0, "{name}");
            }
            assert!(rekeys[2] > rekeys[1], "{name}: under the new keys");
            assert_eq!(sb.rekeys, sa.rekeys, "{name}");
            for s in [&sa, &sb] {
                assert_eq!(s.peer_restarts, 0, "{name}");
                assert_eq!(s.auth_failures, 0, "{name}");
            }
            // The same keys again: nothing to do.
            let now = pair.now;
            assert!(!pair.ends[0].rotate_keys(now, c.clone(), Some(psk)));
            // Past the window, a client restarted with the keys before is
            // refused, one with the new keys gets a session.
            run_for(&mut pair, ROTATION_WINDOW);
            let (old_cfg, _) = configs(Some(KEY), 1);
            let now = pair.now;
            pair.ends[0] = WanConnection::new(old_cfg.clone(), now, 0xD0);
            run_for(&mut pair, ms(300));
            assert!(!pair.ends[0].stats().connected, "{name}: old keys refused");
            let mut new_cfg = old_cfg;
            new_cfg.identity = Some(c.clone());
            new_cfg.key = Some(psk);
            let now = pair.now;
            pair.ends[0] = WanConnection::new(new_cfg, now, 0xD1);
            run_for(&mut pair, ms(300));
            assert!(pair.connected(), "{name}: new keys accepted");
            pair.exchange_a_message();
        }
    }
}

/// A rotated server keeps accepting the keys before only for the window:
/// a client that was never reloaded re-handshakes fine within it, and its
/// re-handshakes are refused after it (counted), while the session it has
/// goes on under its current keys.
#[test]
fn the_window_ends() {
    let mut pair = connected();
    let (_, s, psk) = rotated("client key pair");
    let now = pair.now;
    assert!(pair.ends[1].rotate_keys(now, s, Some(psk)));
    // Within the window: the client's periodic re-handshake (old keys)
    // is accepted.
    run_for(&mut pair, Duration::from_secs(11));
    let sa = pair.ends[0].stats();
    assert!(sa.rekeys >= 1, "{}", sa.rekeys);
    run_for(&mut pair, ROTATION_WINDOW);
    let before = (
        pair.ends[0].stats().rekeys,
        pair.ends[1].stats().unknown_peer_keys,
    );
    run_for(&mut pair, Duration::from_secs(21));
    let after = (
        pair.ends[0].stats().rekeys,
        pair.ends[1].stats().unknown_peer_keys,
    );
    assert_eq!(after.0, before.0, "no re-handshake with the keys before");
    assert!(after.1 > before.1, "refused and counted");
    pair.exchange_a_message();
    assert_eq!(pair.ends[0].stats().peer_restarts, 0);
}

/// PSK-only and lab mode have nothing to rotate live: refused (the reload
/// reports a restart).
#[test]
fn psk_only_mode_does_not_rotate() {
    let (mut a, mut b) = configs(Some(KEY), 1);
    a.identity = None;
    b.identity = None;
    let mut pair = Pair::new(a, b);
    pair.run(Time::from_millis(30), &mut |_, _| vec![ONE_WAY]);
    let now = pair.now;
    assert!(!pair.ends[0].rotate_keys(now, ids().0, Some(NEW_PSK)));
}
