//! Reassembly in place: a fragmented message's body stays in the buffer
//! its fragments were written into, its head kept apart, whatever order
//! the fragments come in (see `recv`'s module documentation).

use super::*;
use crate::buffer::pool::PACKET_BUF_BYTES;
use crate::buffer::{PacketBuf, PacketPool};
use crate::wan::packet::DataFrame;

/// A test codec: a message's byte 0 is the length of its head (0: none).
fn head_in_byte_0(first: &[u8]) -> Option<usize> {
    first.first().filter(|&&n| n > 0).map(|&n| usize::from(n))
}

/// A message of `total` bytes whose head is `head` bytes long.
fn message(head: u8, total: usize, salt: u8) -> Vec<u8> {
    let mut m: Vec<u8> = (0..total)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect();
    m[0] = head;
    m
}

/// Every order of `n` items (Heap's algorithm).
fn orders(n: usize) -> Vec<Vec<usize>> {
    fn go(k: usize, a: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k <= 1 {
            out.push(a.clone());
            return;
        }
        for i in 0..k {
            go(k - 1, a, out);
            let j = if k % 2 == 0 { i } else { 0 };
            a.swap(j, k - 1);
        }
    }
    let mut out = Vec::new();
    go(n, &mut (0..n).collect(), &mut out);
    out
}

/// What a delivery looked like.
struct Got {
    head: Vec<u8>,
    bytes: Vec<u8>,
    /// Where the body's bytes are (to tell it is the pool's buffer).
    body_at: *const u8,
}

/// Feeds message `seq` of flow 1 as fragments of `frag` bytes in `order`;
/// returns what was delivered.
fn feed(
    r: &mut RecvFlows,
    pool: &mut PacketPool,
    seq: u64,
    offset: u64,
    m: &[u8],
    frag: usize,
    order: &[usize],
) -> Vec<Got> {
    let mut got = Vec::new();
    let mut deliver = |_, m: Message<'_>, _: &mut PacketPool| {
        let Message::Reassembled { head, body } = &m else {
            panic!("fragments are reassembled");
        };
        got.push(Got {
            head: head.to_vec(),
            bytes: m.to_vec(),
            body_at: body.as_ptr(),
        });
    };
    for &i in order {
        let start = i * frag;
        let d = DataFrame {
            flow: 1,
            seq,
            offset,
            total: m.len() as u32,
            frag_off: start as u32,
            bytes: &m[start..(start + frag).min(m.len())],
        };
        assert_eq!(r.on_data(&d, pool, &mut deliver), DataOutcome::Accepted);
    }
    got
}

/// A pool holding one idle buffer, and where that buffer's bytes are.
fn pool_of_one() -> (PacketPool, *const u8) {
    let mut pool = PacketPool::new(4);
    let buf = PacketBuf::with_capacity(PACKET_BUF_BYTES);
    let at = buf.as_ptr();
    pool.put(buf);
    (pool, at)
}

/// For every head length before and now (0, 1, 2, 3), fragment size, and
/// order of four fragments: the message arrives byte for byte, its head
/// apart at the length the codec says, its body in the pool's buffer; the
/// bytes moved a second time only when the head's length had to be
/// guessed (fragment 0 not first) and the guess, the flow's previous
/// head, was wrong.
#[test]
fn head_apart_and_body_in_place_in_every_order() {
    let mut cases = 0;
    for prev in [0u8, 1, 2, 3] {
        for head in [0u8, 1, 2, 3] {
            for frag in [1usize, 2, 5] {
                for order in orders(4) {
                    let mut r = RecvFlows::new(1 << 20, 4).with_body_at(head_in_byte_0);
                    let (mut pool, _) = pool_of_one();
                    // The previous message, in order: sets the guess.
                    let m0 = message(prev, 4 * frag, 7);
                    let got = feed(&mut r, &mut pool, 0, 0, &m0, frag, &[0, 1, 2, 3]);
                    assert_eq!(got.len(), 1);
                    assert_eq!(got[0].bytes, m0);
                    assert_eq!(r.misplaced, 0, "fragment 0 first: no guess");
                    drop(got);

                    let (mut pool, buf) = pool_of_one();
                    let m1 = message(head, 4 * frag, 9);
                    let got = feed(&mut r, &mut pool, 1, m0.len() as u64, &m1, frag, &order);
                    let why = format!("prev {prev} head {head} frag {frag} order {order:?}");
                    assert_eq!(got.len(), 1, "{why}");
                    let g = &got[0];
                    assert_eq!(g.bytes, m1, "{why}");
                    assert_eq!(g.head, m1[..usize::from(head)], "{why}");
                    assert_eq!(g.body_at, buf, "{why}: the body is the buffer written into");
                    let guessed_wrong = order[0] != 0 && prev != head;
                    assert_eq!(r.misplaced, u64::from(guessed_wrong), "{why}");
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 4 * 4 * 3 * 24);
}

/// Without a codec (`RecvFlows::new` alone) the whole message is the body.
#[test]
fn without_a_codec_the_message_is_all_body() {
    let mut r = RecvFlows::new(1 << 20, 4);
    let (mut pool, buf) = pool_of_one();
    let m = message(3, 12, 1);
    let got = feed(&mut r, &mut pool, 0, 0, &m, 4, &[2, 0, 1]);
    assert_eq!((got[0].head.len(), &got[0].bytes), (0, &m));
    assert_eq!(got[0].body_at, buf);
}

/// A codec's answer past what a head may be (or past the message) is
/// taken as "no head": delivered whole, never cut wrong.
#[test]
fn an_oversized_head_is_ignored() {
    let mut r = RecvFlows::new(1 << 20, 4).with_body_at(head_in_byte_0);
    let (mut pool, _) = pool_of_one();
    let m = message(200, 12, 3);
    let got = feed(&mut r, &mut pool, 0, 0, &m, 4, &[0, 1, 2]);
    assert_eq!((got[0].head.len(), &got[0].bytes), (0, &m));
    let m = message(7, 6, 3);
    let got = feed(&mut r, &mut pool, 1, 12, &m, 2, &[1, 0, 2]);
    assert_eq!((got[0].head.len(), &got[0].bytes), (0, &m));
}
