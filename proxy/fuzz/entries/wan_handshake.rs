//! Handshake messages (identity keys: Noise IKpsk2, `wan::session_noise`)
//! into a client or a server: raw datagrams, mutated and replayed copies of
//! the genuine INITIATION, RESPONSE, probe and re-handshake (REKEY
//! INITIATION and its RESPONSE: both pairs re-handshake every 20 ms), and
//! time passing. Never a
//! panic; the victim never commits to a generation other than its genuine
//! twin's; and once the injections stop, the genuine twins connect to each
//! other.
//!
//! Input: byte 0 picks the PSK (none or one) and the victim (client or
//! server); then operations, each an opcode byte and its arguments.
//!
//! The body of the fuzz target `wan_handshake`, shared with the corpus
//! smoke test (`proxy/tests/fuzz_corpus.rs`).

use soya_proto::time::Time;
use soya_proto::wan::{public_key, Identity, PathConfig, WanConfig, WanConnection};
use std::time::Duration;

struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?) * 2;
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
}

fn config(psk: Option<[u8; 32]>, client: bool) -> WanConfig {
    let (c, s) = ([0x11u8; 32], [0x22u8; 32]);
    let mut w = WanConfig::new(vec![PathConfig::new("p0")], psk, client);
    w.max_datagram = 1452;
    w.tuning.rekey_interval = Duration::from_millis(20);
    w.identity = Some(if client {
        Identity {
            private: c,
            peer_public: public_key(&s),
        }
    } else {
        Identity {
            private: s,
            peer_public: public_key(&c),
        }
    });
    w
}

/// Everything `from` sends now, delivered to `to` (if any); returns copies.
fn flush(
    from: &mut WanConnection,
    to: Option<&mut WanConnection>,
    now: Time,
    buf: &mut [u8],
) -> Vec<Vec<u8>> {
    from.handle_timeout(now);
    let mut out = Vec::new();
    while let Some(tx) = from.poll_transmit(now, buf) {
        out.push(buf[..tx.len].to_vec());
        if out.len() > 64 {
            break;
        }
    }
    if let Some(to) = to {
        for d in &out {
            to.handle_datagram(now, 0, d);
        }
    }
    while from.poll_event().is_some() {}
    out
}

pub fn run(data: &[u8]) {
    let mut inp = Input(data);
    let Some(mode) = inp.u8() else { return };
    let psk = (mode & 1 == 1).then_some([7u8; 32]);
    let victim_is_server = mode & 2 == 2;
    let mut now = Time::from_millis(1);
    let mut buf = vec![0u8; 2048];
    // Templates from a genuine pair: INITIATION, RESPONSE, probe.
    let mut templates: Vec<Vec<u8>> = Vec::new();
    {
        let mut a = WanConnection::new(config(psk, true), now, 0x1111);
        let mut b = WanConnection::new(config(psk, false), now, 0x2222);
        // Long enough for a re-handshake (20 ms) and its answer.
        for _ in 0..30 {
            templates.extend(flush(&mut b, Some(&mut a), now, &mut buf));
            templates.extend(flush(&mut a, Some(&mut b), now, &mut buf));
            now += Duration::from_millis(1);
        }
    }
    templates.retain(|t| t.len() > 1 && t[1] & 3 == 1);
    assert!(templates.len() >= 2, "no handshake templates");
    // The genuine pair under attack: new generations.
    let mut a = WanConnection::new(config(psk, true), now, 0x3333);
    let mut b = WanConnection::new(config(psk, false), now, 0x4444);
    let genuine = [b.generation(), a.generation()];
    let mut ops = 0;
    while let Some(op) = inp.u8() {
        ops += 1;
        if ops > 64 {
            break;
        }
        let victim = if victim_is_server { &mut b } else { &mut a };
        match op % 5 {
            0 => {
                let Some(d) = inp.bytes() else { break };
                victim.handle_datagram(now, 0, d);
            }
            1 => {
                let (Some(i), Some(at), Some(v)) = (inp.u8(), inp.u8(), inp.u8()) else {
                    break;
                };
                let mut t = templates[usize::from(i) % templates.len()].clone();
                let at = usize::from(at) % t.len();
                t[at] ^= v.max(1);
                victim.handle_datagram(now, 0, &t);
            }
            2 => {
                let Some(i) = inp.u8() else { break };
                let t = &templates[usize::from(i) % templates.len()];
                victim.handle_datagram(now, 0, t);
            }
            3 => {
                // The genuine twins exchange what they have.
                flush(&mut a, Some(&mut b), now, &mut buf);
                flush(&mut b, Some(&mut a), now, &mut buf);
            }
            _ => {
                let Some(ms) = inp.u8() else { break };
                now += Duration::from_millis(u64::from(ms % 50));
            }
        }
        for (side, e) in [&a, &b].into_iter().enumerate() {
            let g = e.stats().peer_generation;
            assert!(
                g.is_none() || g == Some(genuine[side]),
                "side {side} committed to {g:?}, not its twin {}",
                genuine[side]
            );
        }
    }
    // Left alone, the genuine twins connect.
    for _ in 0..400 {
        if a.is_connected()
            && b.is_connected()
            && a.stats().peer_generation == Some(genuine[0])
            && b.stats().peer_generation == Some(genuine[1])
        {
            break;
        }
        flush(&mut a, Some(&mut b), now, &mut buf);
        flush(&mut b, Some(&mut a), now, &mut buf);
        now += Duration::from_millis(5);
    }
    assert!(
        a.is_connected() && b.is_connected(),
        "the twins never connected"
    );
    assert_eq!(a.stats().peer_generation, Some(genuine[0]));
    assert_eq!(b.stats().peer_generation, Some(genuine[1]));
    // And re-handshake (within 30 s: the switch waits for twice the key
    // retention, three PTOs, which the time jumps above can stretch to
    // over a second).
    let rekeys = a.stats().rekeys;
    for _ in 0..1500 {
        if a.stats().rekeys > rekeys {
            break;
        }
        flush(&mut a, Some(&mut b), now, &mut buf);
        flush(&mut b, Some(&mut a), now, &mut buf);
        now += Duration::from_millis(20);
    }
    assert!(
        a.stats().rekeys > rekeys,
        "the twins never re-handshook: A {:?}\nB {:?}",
        a.stats(),
        b.stats()
    );
    assert_eq!(a.stats().peer_generation, Some(genuine[0]));
}
