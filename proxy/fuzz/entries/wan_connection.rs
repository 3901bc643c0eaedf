//! Raw datagrams into a `WanConnection` that has a session with its twin,
//! in lab mode (no key: CRC tags, so the fuzzer also reaches the frame
//! parsers through forged protected packets) and keyed (AES-GCM or
//! ChaCha20-Poly1305: forgeries stop at authentication, HELLOs at their MAC),
//! with keys updated every few packets.
//! Never a panic; a keyed connection never accepts a datagram its twin did
//! not produce.
//!
//! Input: byte 0 picks the mode; then operations, each an opcode byte and
//! its arguments: a raw datagram, a mutated copy of one the twin sent, a
//! packet with a valid lab-mode tag around fuzzed frames, or time passing.
//!
//! The body of the fuzz target `wan_connection`, shared with the corpus smoke test
//! (`proxy/tests/fuzz_corpus.rs`), so both run the same code.

use soya_proto::qp::TwinMsg;
use soya_proto::time::Time;
use soya_proto::wan::{Cipher, CipherPolicy, PathConfig, WanConfig, WanConnection};
use std::time::Duration;

const HEADER_LEN: usize = 24;
const TAG_LEN: usize = 16;

struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()? % 2048).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
}

fn config(key: Option<[u8; 32]>, client: bool, cipher: CipherPolicy) -> WanConfig {
    let mut c = WanConfig::new(
        vec![PathConfig::new("p0"), PathConfig::new("p1")],
        key,
        client,
    );
    c.cipher = cipher;
    c.max_datagram = 1452;
    // Keys replaced every few packets, so that inputs reach both key
    // phases, the key before and the next one (`wan::keyphase`).
    c.tuning.key_update_packets = 4;
    c.tuning.key_update_interval = Duration::from_millis(2);
    c
}

/// Everything `from` wants to send now, delivered to `to`; returns copies.
fn flush(
    from: &mut WanConnection,
    to: &mut WanConnection,
    now: Time,
    buf: &mut [u8],
) -> Vec<(usize, Vec<u8>)> {
    from.handle_timeout(now);
    let mut out = Vec::new();
    while let Some(tx) = from.poll_transmit(now, buf) {
        out.push((tx.path, buf[..tx.len].to_vec()));
        to.handle_datagram(now, tx.path, &buf[..tx.len]);
        if out.len() > 256 {
            break;
        }
    }
    while from.poll_event().is_some() {}
    out
}

fn lab_tag(datagram: &mut [u8]) {
    let n = datagram.len() - TAG_LEN;
    let mut h = crc32fast::Hasher::new();
    h.update(&datagram[..n]);
    let crc = h.finalize();
    datagram[n..].fill(0);
    datagram[n..n + 4].copy_from_slice(&crc.to_be_bytes());
}

pub fn run(data: &[u8]) {
    let mut inp = Input(data);
    let Some(mode) = inp.u8() else { return };
    let (key, cipher) = match mode % 3 {
        0 => (None, CipherPolicy::Auto),
        1 => (Some([7u8; 32]), CipherPolicy::Only(Cipher::Aes256Gcm)),
        _ => (
            Some([7u8; 32]),
            CipherPolicy::Only(Cipher::ChaCha20Poly1305),
        ),
    };
    let keyed = key.is_some();
    let mut now = Time::from_millis(1);
    let mut a = WanConnection::new(config(key, true, cipher), now, 0x1111);
    let mut b = WanConnection::new(config(key, false, cipher), now, 0x2222);
    let mut buf = vec![0u8; 2048];
    for _ in 0..50 {
        if a.is_connected() && b.is_connected() {
            break;
        }
        flush(&mut a, &mut b, now, &mut buf);
        flush(&mut b, &mut a, now, &mut buf);
        now += Duration::from_millis(1);
    }
    assert!(a.is_connected() && b.is_connected(), "no session");
    // Templates: packets A sent that B has not seen (fresh), and its HELLO.
    for k in 0..4u8 {
        let _ = a.send(
            now,
            3 + u64::from(k),
            TwinMsg::Response {
                packet: vec![k; 100 + 300 * usize::from(k)].into(),
            },
        );
    }
    a.handle_timeout(now);
    let mut templates: Vec<(usize, Vec<u8>)> = Vec::new();
    while let Some(tx) = a.poll_transmit(now, &mut buf) {
        templates.push((tx.path, buf[..tx.len].to_vec()));
    }
    assert!(!templates.is_empty());
    let protected = templates.iter().find(|(_, t)| t[1] & 3 == 0).cloned();
    let mut forged_pn: u64 = 1 << 40;
    let mut ops = 0;
    while let Some(op) = inp.u8() {
        ops += 1;
        if ops > 64 {
            break;
        }
        let accepted = b.stats().packets_accepted;
        let hellos = b.stats().hellos_accepted;
        let path = usize::from(op >> 7);
        let mut foreign = false;
        match op % 4 {
            0 => {
                let Some(d) = inp.bytes() else { break };
                b.handle_datagram(now, path, d);
                foreign = true;
            }
            1 => {
                let Some(i) = inp.u8() else { break };
                let (p, t) = &templates[usize::from(i) % templates.len()];
                let mut t = t.clone();
                let Some(n) = inp.u8() else { break };
                for _ in 0..(n % 4) + 1 {
                    let (Some(at), Some(x)) = (inp.u16(), inp.u8()) else {
                        break;
                    };
                    let at = usize::from(at) % t.len();
                    t[at] ^= x.max(1);
                }
                if inp.u8().is_some_and(|c| c & 1 == 1) {
                    let cut = t.len() / 2;
                    t.truncate(cut);
                }
                foreign = t != templates[usize::from(i) % templates.len()].1;
                b.handle_datagram(now, *p, &t);
            }
            2 => {
                // Lab mode: fuzzed frames in a packet with a valid tag and a
                // fresh packet number. Keyed: a template as it was sent.
                let Some(frames) = inp.bytes() else { break };
                match (&protected, keyed) {
                    (Some((p, t)), false) => {
                        let mut d = t[..HEADER_LEN].to_vec();
                        forged_pn += 1;
                        d[16..24].copy_from_slice(&forged_pn.to_be_bytes());
                        d.extend_from_slice(frames);
                        d.extend_from_slice(&[0u8; TAG_LEN]);
                        lab_tag(&mut d);
                        b.handle_datagram(now, *p, &d);
                    }
                    _ => {
                        let (p, t) = &templates[frames.len() % templates.len()];
                        b.handle_datagram(now, *p, t);
                    }
                }
            }
            _ => {
                let Some(ms) = inp.u8() else { break };
                now += Duration::from_micros(u64::from(ms) * 250);
                b.handle_timeout(now);
            }
        }
        if keyed && foreign {
            // Random or changed bytes never authenticate under a key (every
            // byte of a datagram is covered by its tag or MAC).
            assert_eq!(b.stats().packets_accepted, accepted, "forgery accepted");
            assert_eq!(b.stats().hellos_accepted, hellos, "forged HELLO accepted");
        }
        while b.poll_event().is_some() {}
        flush(&mut b, &mut a, now, &mut buf);
    }
}
