//! A standby for a gateway (issue 38), by replaying its inputs.
//!
//! A [`Site`] is a sans-IO state machine: what it sends depends only on
//! the calls it was given, in order, with their `now` (the differential
//! test checks this against the daemon's own turn). So a second `Site`,
//! built with the same parameters and the same nonce source, and given the
//! same calls, is in the same state and would send the same bytes. The
//! standby is that second site: every call the active gateway gets (a DC
//! packet, a WAN datagram, its timers, a send pass) is mirrored to it over
//! a link of one-way delay `delay`, and it replays them with the active's
//! own `now`, discarding what it would send.
//!
//! **Output commit.** The active lets nothing leave (no pseudo-ACK, no
//! re-injected request, no WAN datagram) until the standby has every input
//! that led to it: what it sends at `t` leaves at `t + 2 × delay`, when the
//! standby's acknowledgement of the inputs up to `t` is back
//! ([`Standby::commit_at`]). This is what makes a pseudo-ACK survive the
//! active's death (the packet it answers is at the standby), and what
//! makes a WAN datagram safe to send: the standby, replaying, seals the
//! same packet number over the same bytes, so the twin never sees one
//! AES-GCM nonce used for two plaintexts.
//!
//! **Takeover.** When the active dies at `T`, what it had sent but not yet
//! released dies with it, and so do the calls that had not reached the
//! standby (taken as lost with the host). The standby replays what it
//! has, then becomes the gateway and
//! sends again what it made whose release time is after `T` (what the
//! active never let out): byte for byte what the active would have sent,
//! so the twin sees the same WAN session, no restart, and each requester
//! the pseudo-ACKs it was owed.

use std::collections::VecDeque;
use std::time::Duration;

use soya_proto::site::{DcSent, Site};
use soya_proto::time::Time;

/// One call given to the active gateway, as mirrored to the standby.
#[derive(Debug)]
pub enum Mirrored {
    /// `handle_dc_owned(now, packet)`.
    Dc(Time, Vec<u8>),
    /// `handle_wan(now, path, datagram)`, the datagram as received.
    Wan(Time, usize, Vec<u8>),
    /// The timer check: `handle_timeout(now)` if one is due.
    Timers(Time),
    /// A send pass: `transmit_dc`, `poll_wan_transmit`, `poll_event`.
    Drain(Time),
}

/// Something the standby would have sent.
#[derive(Debug)]
pub enum Output {
    Dc(Vec<u8>),
    Wan(usize, Vec<u8>),
}

/// What the standby did, for the run's summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandbyStats {
    /// Calls mirrored to it, and the packet bytes they carried (what the
    /// mirror link carries, headers aside: the DC bandwidth a standby
    /// costs).
    pub mirrored: u64,
    pub mirrored_bytes: u64,
    /// Sends it made again at takeover (the active had not released them).
    pub resent_at_takeover: u64,
    /// Calls on their way to it when the active died (lost).
    pub lost_on_the_mirror: u64,
}

pub struct Standby {
    site: Site,
    /// The mirror link's one-way delay.
    delay: Duration,
    /// Calls on their way to it, with when each arrives.
    queue: VecDeque<(Time, Mirrored)>,
    /// What it made lately, with the time the active would release it;
    /// kept until the active surely did.
    recent: VecDeque<(Time, Output)>,
    scratch: Vec<u8>,
    pub stats: StandbyStats,
}

impl Standby {
    /// A standby built as the active was: same parameters, same nonces.
    pub fn new(site: Site, delay: Duration) -> Standby {
        Standby {
            site,
            delay,
            queue: VecDeque::new(),
            recent: VecDeque::new(),
            scratch: vec![0; 64 * 1024],
            stats: StandbyStats::default(),
        }
    }

    /// When what the active makes at `now` may leave: the standby has the
    /// inputs up to `now` at `now + delay`, and its acknowledgement is back
    /// at the active a `delay` later.
    pub fn commit_at(&self, now: Time) -> Time {
        now + self.delay * 2
    }

    /// The active was given `m` at `now`: on its way to the standby.
    pub fn mirror(&mut self, now: Time, m: Mirrored) {
        self.stats.mirrored += 1;
        self.stats.mirrored_bytes += match &m {
            Mirrored::Dc(_, v) | Mirrored::Wan(_, _, v) => v.len() as u64,
            Mirrored::Timers(_) | Mirrored::Drain(_) => 0,
        };
        self.queue.push_back((now + self.delay, m));
    }

    /// Replays every call that has arrived by `until`.
    pub fn catch_up(&mut self, until: Time) {
        while self.queue.front().is_some_and(|(at, _)| *at <= until) {
            let (_, m) = self.queue.pop_front().expect("just seen");
            self.apply(m);
        }
    }

    fn apply(&mut self, m: Mirrored) {
        let site = &mut self.site;
        match m {
            Mirrored::Dc(now, v) => {
                let mut buf = site.rx_buffer();
                buf.extend_from_slice(&v);
                site.handle_dc_owned(now, buf);
            }
            Mirrored::Wan(now, path, mut d) => site.handle_wan(now, path, &mut d),
            Mirrored::Timers(now) => {
                if site.poll_timeout().is_some_and(|d| d <= now) {
                    site.handle_timeout(now);
                }
            }
            Mirrored::Drain(now) => {
                // What the active released by now is out: forget it.
                while self.recent.front().is_some_and(|(r, _)| *r <= now) {
                    self.recent.pop_front();
                }
                let commit = now + self.delay * 2;
                let recent = &mut self.recent;
                site.transmit_dc(|packet, _dst| {
                    recent.push_back((commit, Output::Dc(packet.to_vec())));
                    DcSent::Sent
                });
                while let Some(t) = site.poll_wan_transmit(now, &mut self.scratch) {
                    let d = self.scratch[..t.len].to_vec();
                    recent.push_back((t.release_at.max(commit), Output::Wan(t.path, d)));
                }
                while site.poll_event().is_some() {}
            }
        }
    }

    /// The active died at `died`: the standby replays what had reached it
    /// by then (what was still in the dead host or on the mirror link is
    /// taken as lost: a crash takes its transmit queue with it), and
    /// returns its site, now the gateway, with what the active had made but
    /// not released, each with its release time. Output commit is what
    /// makes the lost calls harmless: nothing they led to was let out.
    pub fn take_over(mut self, died: Time) -> (Site, Vec<(Time, Output)>, StandbyStats) {
        self.catch_up(died);
        self.stats.lost_on_the_mirror = self.queue.len() as u64;
        let owed: Vec<(Time, Output)> = self
            .recent
            .into_iter()
            .filter(|(release, _)| *release > died)
            .collect();
        let mut stats = self.stats;
        stats.resent_at_takeover = owed.len() as u64;
        (self.site, owed, stats)
    }
}
