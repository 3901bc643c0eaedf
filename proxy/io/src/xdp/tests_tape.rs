//! The RX tape ([`super::tape`]) on real AF_XDP sockets (a veth pair in a
//! network namespace of its own, as in `tests_copies`): frames of one,
//! two and three buffers mixed; a small tape taken through its wrap and
//! past its budget while buffers are held and given back out of order,
//! every packet's bytes checked (also those held while the tape wrapped
//! past them). Needs root; skipped with a printed reason otherwise, unless
//! SOYA_REQUIRE_NETNS=1.

use super::tape::STRIDE;
use super::tests_copies::{
    frame, in_netns, mac, packet_of, required, setup_with_hold, wait_readable, Peer, FAR, HOST,
    INNER,
};
use super::XdpDc;
use crate::dcrx::DcRx;
use soya_proto::buffer::pool::PACKET_BUF_BYTES;
use soya_proto::buffer::PacketBuf;
use soya_proto::copies;

fn outer(test: &str) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 && !required() {
        eprintln!("skipped: needs root (network namespace, AF_XDP)");
        return;
    }
    let ns = format!("soya-xdp-{test}-{}", std::process::id());
    in_netns(&ns, &format!("xdp::tests_tape::{test}_in_namespace"));
}

/// Whether this is the child `in_netns` started (else the ignored half
/// does nothing when run by hand).
fn inner() -> bool {
    std::env::var_os(INNER).is_some()
}

/// Reads `n` packets, calling `f` with each (waiting for the socket when
/// the ring is empty: the verdict is what arrives).
fn read(dc: &mut XdpDc, n: usize, mut f: impl FnMut(DcRx<'_>)) {
    let mut lent: Vec<PacketBuf> = Vec::new();
    let mut scratch = vec![0u8; 9000];
    let mut got = 0;
    while got < n {
        while lent.len() < 64 {
            lent.push(PacketBuf::with_capacity(9000.max(PACKET_BUF_BYTES)));
        }
        let (k, _) = dc.recv_batch(&mut scratch, &mut lent, |rx| {
            got += 1;
            f(rx)
        });
        if k == 0 {
            assert!(
                wait_readable(dc.fd()),
                "{got} of {n} frames read: {:?}, kernel drops {}",
                dc.stats,
                dc.kernel_drops()
            );
        }
    }
}

/// Frames of one buffer (borrowed), of two and of three buffers (lent in
/// place), and the edges: 3840 bytes of frame (one full buffer), 3841 (a
/// second buffer of one byte).
#[test]
fn mixed_frames_on_the_tape() {
    outer("mixed");
}

#[test]
#[ignore = "run by mixed_frames_on_the_tape inside a network namespace"]
fn mixed_in_namespace() {
    if !inner() {
        return;
    }
    let Some(mut dc) = setup_with_hold(super::TAPE_HOLD) else {
        return;
    };
    let peer = Peer::open("xb");
    let (xa, xb) = (mac("xa"), mac("xb"));
    let sizes = [64, 4176, 1400, 8000, STRIDE - 14, STRIDE - 13, 4176, 28];
    let sent: Vec<Vec<u8>> = (0..64)
        .map(|n| packet_of(HOST, FAR, n, sizes[n % sizes.len()]))
        .collect();
    for p in &sent {
        peer.send(&frame(xa, xb, p));
    }
    let multi = sent.iter().filter(|p| p.len() + 14 > STRIDE).count() as u64;
    let (mut got, mut in_place, mut borrowed) = (Vec::new(), 0, 0);
    let before = copies::so_far();
    read(&mut dc, sent.len(), |rx| {
        match &rx {
            DcRx::Lent(b) if b.is_lent() => in_place += 1,
            DcRx::Borrowed(_) => borrowed += 1,
            DcRx::Lent(_) => {}
        }
        got.push(rx.bytes().to_vec());
    });
    let rx = copies::so_far() - before;
    assert_eq!(got, sent, "the packets as sent");
    assert_eq!(dc.stats.rx_multi_buffer, multi, "{:?}", dc.stats);
    assert_eq!((dc.stats.rx_in_place, in_place), (multi, multi));
    assert_eq!(borrowed, sent.len() as u64 - multi);
    if copies::COUNTED {
        assert_eq!(rx.bytes, 0, "copies from the DC");
    }
    assert_eq!(dc.shared.slots.held(), 0, "every lent frame given back");
    println!("mixed: {:?}", dc.stats);
}

/// Held slots out of the fill ring for this long (tape slots): a small
/// budget (32 two-buffer frames) so that it runs out.
const HOLD: usize = 64;
/// Frames sent, of two buffers but one in five of one (which shifts the
/// frames' parity on the tape, so that some straddle a skipped held slot):
/// the tape (FILL + RING + HOLD = 6208 slots) is written over more than
/// once and a half.
const FRAMES: usize = 6000;

fn size(i: usize) -> usize {
    if i % 5 == 4 {
        200
    } else {
        4176
    }
}
/// Sent, then read, at a time (well within the fill and RX rings).
const BURST: usize = 128;

/// A small tape through its wrap and past its budget, buffers held and
/// given back out of order: every packet as sent (the held ones also when
/// given back, after the kernel wrote the tape around them), none dropped,
/// and each frame either lent in place or gathered with one copy, counted.
#[test]
fn the_tape_wraps_around_held_frames() {
    outer("wrap");
}

#[test]
#[ignore = "run by the_tape_wraps_around_held_frames inside a network namespace"]
fn wrap_in_namespace() {
    if !inner() {
        return;
    }
    let Some(mut dc) = setup_with_hold(HOLD) else {
        return;
    };
    let slots = dc.shared.slots.count();
    let multi = (0..FRAMES).filter(|&i| size(i) + 14 > STRIDE).count() as u64;
    let used = multi as usize * 2 + (FRAMES - multi as usize);
    assert!(used > slots * 3 / 2, "the tape wraps: {used} of {slots}");
    let peer = Peer::open("xb");
    let (xa, xb) = (mac("xa"), mac("xb"));
    // Held frames: most given back soon, in no particular order; a few
    // (`long`) kept until the end, so that every later round of the tape
    // steps over them; and for two bursts none given back, so that the
    // budget runs out. Each is checked when given back: the kernel has not
    // written over it.
    let mut held: Vec<(usize, PacketBuf)> = Vec::new();
    let mut long: Vec<(usize, PacketBuf)> = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let (mut n, mut checked_held) = (0, 0);
    let check = |(i, b): (usize, PacketBuf)| {
        assert!(
            b == packet_of(HOST, FAR, i, size(i)),
            "held packet {i} written over"
        );
    };
    let before = copies::so_far();
    while n < FRAMES {
        let burst = BURST.min(FRAMES - n);
        for i in n..n + burst {
            peer.send(&frame(xa, xb, &packet_of(HOST, FAR, i, size(i))));
        }
        let hoard = (10..12).contains(&(n / BURST));
        let mut i = n;
        read(&mut dc, burst, |rx| {
            assert!(rx.bytes() == packet_of(HOST, FAR, i, size(i)), "packet {i}");
            match rx {
                DcRx::Lent(b) if b.is_lent() && i % 97 == 0 && long.len() < 8 => long.push((i, b)),
                DcRx::Lent(b) if b.is_lent() => held.push((i, b)),
                _ => {}
            }
            i += 1;
            if held.len() >= 16 && !hoard {
                let mut k = 0;
                while k < held.len() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if rng & 1 == 0 {
                        check(held.swap_remove(k));
                        checked_held += 1;
                    } else {
                        k += 1;
                    }
                }
            }
        });
        n += burst;
    }
    let rx = copies::so_far() - before;
    for h in held.drain(..).chain(long.drain(..).rev()) {
        check(h);
        checked_held += 1;
    }
    let s = dc.stats;
    let skipped = super::lock(&dc.shared.umem).tape.skipped;
    println!("wrap: {s:?}, {skipped} held slots skipped, {checked_held} held frames checked");
    assert_eq!(s.rx_multi_buffer, multi);
    assert_eq!(
        s.rx_in_place + s.rx_gathered_break + s.rx_gathered_full,
        multi
    );
    assert!(s.rx_in_place > multi / 2, "{s:?}");
    assert!(s.rx_gathered_full > 0, "the budget ran out: {s:?}");
    assert!(
        s.rx_gathered_break > 0 && skipped > 0,
        "the tape broke: {s:?}"
    );
    assert_eq!(checked_held, s.rx_in_place);
    assert_eq!((s.rx_dropped, dc.kernel_drops()), (0, 0), "never a drop");
    if copies::COUNTED {
        let gathered = s.rx_gathered_break + s.rx_gathered_full;
        assert_eq!(rx.large, gathered, "one copy per gathered frame only");
        assert_eq!(rx.bytes, gathered * 4176);
    }
    assert_eq!(dc.shared.slots.held(), 0, "every lent frame given back");
}
