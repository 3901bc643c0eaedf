//! Sender side of one path's packet-number space: loss detection (RFC 9002
//! §6) and delivery-rate sampling for the congestion controller.
//!
//! Every path has its own packet numbers, so "three later packets were acked"
//! and "acked packets were sent 9/8 RTT later" are judged per path, where
//! packet order reflects send order: mixing paths of different RTTs would
//! declare every packet on the slow path lost.
//!
//! Lost packets are never retransmitted as such: their frames go back to the
//! connection, which re-sends the data in new packets (new packet numbers,
//! possibly another path).

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Time;

use super::packet::AckFrame;
use super::rtt::RttEstimator;

/// RFC 9002 kPacketThreshold (the starting value: see [`Recovery`]).
pub const PACKET_THRESHOLD: u64 = 3;
/// Adaptive packet threshold never exceeds this.
const MAX_PACKET_THRESHOLD: u64 = 256;
/// Packets declared lost that are remembered to recognise spurious losses.
const RECENTLY_LOST: usize = 512;
/// Without spurious losses for this long, thresholds return to RFC values.
const REORDER_MEMORY: Duration = Duration::from_secs(10);

/// What a sent packet carried that needs action if it is acked or lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SentFrame {
    /// Fragment `frag` of message `seq` of `flow`.
    Data { flow: u64, seq: u64, frag: u8 },
    /// A FLOW_CREDIT for `flow` (re-sent with the latest value if lost).
    Credit { flow: u64 },
    /// The FIN of `flow` (re-sent if lost; the flow is forgotten once acked).
    Fin { flow: u64 },
}

/// Recycled frame lists: every packet sent records its frames in a
/// vector until it is acknowledged or lost; the vectors are reused rather
/// than allocated per packet (see `buffer::pool` for why). At most
/// [`FrameLists::CAP`] are kept idle. It starts with [`FrameLists::READY`]
/// lists, so that the packets in flight can grow that far without an
/// allocation (about 100 KiB per connection).
pub struct FrameLists(Vec<Vec<SentFrame>>);

impl Default for FrameLists {
    fn default() -> FrameLists {
        let mut lists = Vec::with_capacity(Self::CAP);
        lists.extend((0..Self::READY).map(|_| Vec::with_capacity(Self::FRAMES)));
        FrameLists(lists)
    }
}

impl FrameLists {
    pub const CAP: usize = 1024;
    pub const READY: usize = 256;
    pub const FRAMES: usize = 16;

    /// A list with room for [`Self::FRAMES`] frames: a datagram rarely
    /// holds more, so a list taken back from the pool does not grow
    /// (allocate) while the packet is built.
    pub fn take(&mut self) -> Vec<SentFrame> {
        self.0
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(Self::FRAMES))
    }

    pub fn put(&mut self, mut v: Vec<SentFrame>) {
        if v.capacity() > 0 && self.0.len() < Self::CAP {
            v.clear();
            self.0.push(v);
        }
    }
}

#[derive(Clone, Debug)]
pub struct SentPacket {
    pub time_sent: Time,
    pub size: u32,
    /// Counts toward bytes in flight and the congestion window.
    pub in_flight: bool,
    pub frames: Vec<SentFrame>,
    // Delivery-rate state when sent.
    delivered: u64,
    delivered_time: Time,
    first_sent_time: Time,
    app_limited: bool,
}

impl SentPacket {
    pub fn new(time_sent: Time, size: u32, frames: Vec<SentFrame>) -> SentPacket {
        SentPacket {
            time_sent,
            size,
            in_flight: true,
            frames,
            delivered: 0,
            delivered_time: time_sent,
            first_sent_time: time_sent,
            app_limited: false,
        }
    }
}

/// Delivery-rate state of a packet when it was sent.
#[derive(Clone, Copy)]
struct RateState {
    time_sent: Time,
    delivered: u64,
    delivered_time: Time,
    first_sent_time: Time,
    app_limited: bool,
}

impl RateState {
    fn of(p: &SentPacket) -> RateState {
        RateState {
            time_sent: p.time_sent,
            delivered: p.delivered,
            delivered_time: p.delivered_time,
            first_sent_time: p.first_sent_time,
            app_limited: p.app_limited,
        }
    }
}

/// Result of processing one ACK frame.
#[derive(Default)]
pub struct AckResult {
    /// The packets acknowledged now, in the vector the caller lent to
    /// [`Recovery::on_ack`] (given back for reuse once processed).
    pub acked: Vec<SentPacket>,
    pub lost: Vec<SentPacket>,
    /// Latest RTT sample, when the largest acknowledged packet was new.
    pub rtt_sample: Option<Duration>,
    pub bytes_acked: u64,
    pub delivery_rate: Option<u64>,
    pub app_limited: bool,
    pub prior_delivered: u64,
}

pub struct Recovery {
    /// Outstanding packets, index = pn - `base`; `None` for packets already
    /// acked or lost and for packets that were never tracked (ACK-only).
    sent: VecDeque<Option<SentPacket>>,
    base: u64,
    pub bytes_in_flight: u64,
    /// In-flight packets (all in-flight packets are ack-eliciting).
    pub packets_in_flight: u64,
    pub largest_acked: Option<u64>,
    loss_time: Option<Time>,
    pub last_sent_time: Option<Time>,
    // Delivery-rate estimation (draft-cheng-iccrg-delivery-rate-estimation).
    pub delivered: u64,
    delivered_time: Time,
    first_sent_time: Time,
    app_limited_until: u64,
    // Adaptive reordering tolerance. RFC 9002's thresholds (3 packets, 9/8
    // RTT) assume little reordering; a path that reorders (jitter, ECMP
    // over links of different delay) would see most packets "lost" and
    // retransmitted for nothing. When an ACK arrives for a packet already
    // declared lost, the loss was spurious: raise the packet threshold to
    // the observed reordering distance and double the time slack (9/8 up to
    // 2 × RTT), as RACK's reordering window does.
    /// `(pn, largest acked when declared lost)`, ascending pn.
    recently_lost: VecDeque<(u64, u64)>,
    packet_threshold: u64,
    /// Time threshold is `(8 + reorder_eighths) / 8 × RTT`.
    reorder_eighths: u32,
    last_spurious: Option<Time>,
    pub spurious_losses: u64,
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery {
            sent: VecDeque::new(),
            base: 0,
            bytes_in_flight: 0,
            packets_in_flight: 0,
            largest_acked: None,
            loss_time: None,
            last_sent_time: None,
            delivered: 0,
            delivered_time: Time::ZERO,
            first_sent_time: Time::ZERO,
            app_limited_until: 0,
            recently_lost: VecDeque::new(),
            packet_threshold: PACKET_THRESHOLD,
            reorder_eighths: 1,
            last_spurious: None,
            spurious_losses: 0,
        }
    }
}

impl Recovery {
    /// Packet number the next packet sent on this path gets.
    pub fn next_pn(&self) -> u64 {
        self.base + self.sent.len() as u64
    }

    /// Records packet `pn` (which must be [`Self::next_pn`]); `None` for a
    /// packet that needs no acknowledgement (ACK-only).
    pub fn on_sent(&mut self, pn: u64, packet: Option<SentPacket>) {
        debug_assert_eq!(pn, self.next_pn());
        if self.sent.is_empty() {
            self.base = pn;
        }
        let Some(mut p) = packet else {
            if !self.sent.is_empty() {
                self.sent.push_back(None);
            } else {
                self.base = pn + 1;
            }
            return;
        };
        if self.bytes_in_flight == 0 {
            self.first_sent_time = p.time_sent;
            self.delivered_time = p.time_sent;
        }
        p.delivered = self.delivered;
        p.delivered_time = self.delivered_time;
        p.first_sent_time = self.first_sent_time;
        p.app_limited = self.app_limited_until != 0;
        self.bytes_in_flight += u64::from(p.size);
        self.packets_in_flight += 1;
        self.last_sent_time = Some(p.time_sent);
        self.sent.push_back(Some(p));
    }

    /// The sender ran out of data with room to send: samples taken until
    /// what is in flight now is delivered underestimate the path.
    pub fn mark_app_limited(&mut self) {
        self.app_limited_until = (self.delivered + self.bytes_in_flight).max(1);
    }

    /// Time the oldest outstanding packet was sent.
    pub fn oldest_outstanding(&self) -> Option<Time> {
        self.sent.iter().flatten().next().map(|p| p.time_sent)
    }

    pub fn loss_time(&self) -> Option<Time> {
        self.loss_time
    }

    /// Processes an ACK frame; `None` if it acknowledges a packet number that
    /// was never sent (a protocol violation: the frame is ignored). The
    /// packets it acknowledges are put in `acked` (empty; a vector reused
    /// from one ACK to the next).
    pub fn on_ack(
        &mut self,
        now: Time,
        ack: &AckFrame<'_>,
        rtt: &mut RttEstimator,
        max_ack_delay: Duration,
        acked: Vec<SentPacket>,
    ) -> Option<AckResult> {
        let next = self.next_pn();
        if ack.largest() >= next {
            return None;
        }
        self.detect_spurious(now, ack);
        let mut res = AckResult {
            acked,
            ..AckResult::default()
        };
        let mut newest: Option<RateState> = None;
        let mut largest_newly_acked = None;
        for (lo, hi) in ack.ranges() {
            // Clamp to what is still tracked: the loop is bounded by the
            // queue length whatever the peer claims.
            let lo = lo.max(self.base);
            if hi < lo {
                continue;
            }
            for pn in lo..=hi {
                let i = (pn - self.base) as usize;
                let Some(p) = self.sent.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                largest_newly_acked = largest_newly_acked.max(Some(pn));
                self.on_removed(&p);
                self.delivered += u64::from(p.size);
                self.delivered_time = now;
                res.bytes_acked += u64::from(p.size);
                if newest.is_none_or(|n| p.delivered >= n.delivered) {
                    newest = Some(RateState::of(&p));
                }
                res.acked.push(p);
            }
        }
        // RTT sample: only when the largest acknowledged packet is new, so the
        // delay the peer reports applies to it.
        if largest_newly_acked == Some(ack.largest()) {
            let sent_at = res.acked.iter().map(|p| p.time_sent).max().unwrap_or(now);
            let latest = now.since(sent_at);
            let delay = Duration::from_micros(ack.delay_us).min(max_ack_delay);
            rtt.update(latest, delay);
            res.rtt_sample = Some(rtt.latest());
        }
        self.largest_acked = self.largest_acked.max(Some(ack.largest()));
        if let Some(p) = newest {
            self.first_sent_time = p.time_sent;
            let send_elapsed = p.time_sent.since(p.first_sent_time);
            let ack_elapsed = self.delivered_time.since(p.delivered_time);
            let interval = send_elapsed.max(ack_elapsed);
            // Shorter than the path's min RTT: ACK compression, not a rate.
            if interval >= rtt.min() && !interval.is_zero() {
                let bytes = self.delivered - p.delivered;
                res.delivery_rate =
                    Some((u128::from(bytes) * 1_000_000_000 / interval.as_nanos()) as u64);
            }
            res.app_limited = p.app_limited;
            res.prior_delivered = p.delivered;
        }
        if self.app_limited_until != 0 && self.delivered > self.app_limited_until {
            self.app_limited_until = 0;
        }
        res.lost = self.detect_lost(now, rtt);
        self.trim();
        Some(res)
    }

    /// Acknowledged packets that were declared lost: widen the thresholds.
    fn detect_spurious(&mut self, now: Time, ack: &AckFrame<'_>) {
        if self
            .last_spurious
            .is_some_and(|t| now.since(t) > REORDER_MEMORY)
        {
            self.packet_threshold = PACKET_THRESHOLD;
            self.reorder_eighths = 1;
            self.last_spurious = None;
        }
        for (lo, hi) in ack.ranges() {
            let start = self.recently_lost.partition_point(|&(pn, _)| pn < lo);
            let end = self.recently_lost.partition_point(|&(pn, _)| pn <= hi);
            if start >= end {
                continue;
            }
            for (pn, largest) in self.recently_lost.drain(start..end) {
                self.spurious_losses += 1;
                self.packet_threshold = self
                    .packet_threshold
                    .max(largest - pn + 1)
                    .min(MAX_PACKET_THRESHOLD);
                self.reorder_eighths = (self.reorder_eighths * 2).min(8);
                self.last_spurious = Some(now);
            }
        }
    }

    fn loss_delay(&self, rtt: &RttEstimator) -> Duration {
        rtt.loss_delay() * (8 + self.reorder_eighths) / 9
    }

    fn on_removed(&mut self, p: &SentPacket) {
        if p.in_flight {
            self.bytes_in_flight -= u64::from(p.size);
            self.packets_in_flight -= 1;
        }
    }

    /// Declares lost what is [`PACKET_THRESHOLD`] packets or 9/8 RTT older
    /// than the largest acknowledged packet; arms the loss timer for the rest.
    pub fn detect_lost(&mut self, now: Time, rtt: &RttEstimator) -> Vec<SentPacket> {
        self.loss_time = None;
        let mut lost = Vec::new();
        let Some(largest) = self.largest_acked else {
            return lost;
        };
        let loss_delay = self.loss_delay(rtt);
        let end = largest.min(self.next_pn().saturating_sub(1));
        let mut pn = self.base;
        while pn < end {
            let i = (pn - self.base) as usize;
            if let Some(Some(p)) = self.sent.get(i) {
                let too_old = p.time_sent + loss_delay <= now;
                if too_old || largest - pn >= self.packet_threshold {
                    if let Some(p) = self.sent[i].take() {
                        self.on_removed(&p);
                        lost.push(p);
                        if self.recently_lost.len() >= RECENTLY_LOST {
                            self.recently_lost.pop_front();
                        }
                        self.recently_lost.push_back((pn, largest));
                    }
                } else {
                    let t = p.time_sent + loss_delay;
                    self.loss_time = Some(self.loss_time.map_or(t, |l| l.min(t)));
                }
            }
            pn += 1;
        }
        self.trim();
        lost
    }

    /// Everything outstanding, declared lost (the path went down).
    pub fn drain_all(&mut self) -> Vec<SentPacket> {
        let next = self.next_pn();
        let out: Vec<SentPacket> = self.sent.drain(..).flatten().collect();
        self.base = next;
        // A late ACK for these says nothing about reordering.
        self.recently_lost.clear();
        self.bytes_in_flight = 0;
        self.packets_in_flight = 0;
        self.loss_time = None;
        out
    }

    /// Forgets everything (the peer's session changed: those packets can
    /// never be acknowledged). Packet numbers keep increasing.
    pub fn reset(&mut self) {
        let next = self.next_pn();
        self.sent.clear();
        self.recently_lost.clear();
        self.base = next;
        self.bytes_in_flight = 0;
        self.packets_in_flight = 0;
        self.largest_acked = None;
        self.loss_time = None;
    }

    fn trim(&mut self) {
        while let Some(None) = self.sent.front() {
            self.sent.pop_front();
            self.base += 1;
        }
    }
}
