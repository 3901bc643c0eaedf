//! When the ingress may acknowledge, and backpressure: a pseudo-ACK
//! moves the requester's window, so it is only sent while the deep buffer
//! has room for everything that window then lets the requester send.
//!
//! The buffer is one slab shared by every flow of the gateway, and each
//! requester may send its whole window past its last pseudo-ACK before it
//! stops: a reserve per flow, checked against the shared free slots, lets
//! N flows overrun it N-fold at once (16 hardware QPs x 2,048 packets
//! against a 256-slot reserve: requests dropped at the hard limit, each a
//! go-back-N of a window — docs/benchmarks.md §8). So each flow promises
//! the buffer what its requester may still send without a new ACK — the
//! window it was seen to use, less the packets already here past the last
//! pseudo-ACK — and a pseudo-ACK waits until the free slots cover the sum
//! of the promises once this flow's is back to its whole window.
//!
//! Not the sum of whole windows: while ACKs are withheld the requesters
//! use their windows, and what they sent is already in the buffer. Summing
//! whole windows counted it twice: after a hold no flow got an ACK until
//! every flow's withheld packets were delivered, and the reserve looked
//! eaten into, so CNPs went out, each halving a hardware requester's
//! DCQCN rate (16 QPs at 400 Gb/s, 0.1 % WAN loss, a buffer of 2 × BDP
//! plus their windows: 181 CNPs and 0.34 of the lossless goodput; 0 CNPs
//! and 0.80 with this rule, docs/benchmarks.md §8).

use std::time::Duration;

use soya_config::AckPolicy;

use crate::buffer::DeepBuffer;
use crate::roce::builders;
use crate::roce::Psn;
use crate::time::Time;

use super::{Mode, PseudoAcker};
use crate::qp::outbox::Outbox;

/// Coalescing and backpressure knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckTuning {
    pub policy: AckPolicy,
    /// Acknowledge at least every this many packets...
    pub coalesce_packets: u32,
    /// ...or this long after the oldest unacknowledged one.
    pub coalesce: Duration,
    /// Stop acknowledging when fewer slots than this are left for the flow:
    /// the requester can send at most its window (128 PSNs in rxe) past our
    /// last ACK, so this reserve means backpressure never has to drop. It is
    /// a floor: the reserve grows with the window each requester is seen to
    /// use (a hardware send queue: depth x message size, e.g. 2,048
    /// packets), see [`PseudoAcker::room_to_ack`].
    pub ack_reserve_slots: usize,
    /// The window assumed for a requester until it is seen to use a larger
    /// one: a hardware send queue of 128 x 64 KiB at a 4 KiB MTU is 2,048
    /// packets (rxe's is 128 PSNs; over-reserving for it costs buffer, not
    /// drops).
    pub assumed_window_slots: usize,
    /// Most packets forwarded to the twin and not yet delivered.
    pub egress_window: u32,
    /// Send CNPs to the requester while withholding ACKs.
    pub cnp_on_backpressure: bool,
}

/// Whether a pseudo-ACK has room ([`PseudoAcker::room_to_ack`]), and if
/// not, what it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Room {
    Yes,
    /// The flow's own quota: its own deliveries free it.
    Quota,
    /// The shared slab, or the turn of a flow waiting longer for it.
    Shared,
}

/// While pseudo-ACKs are withheld (backpressure), whether one may go out
/// is checked again this often, and if not the last one is repeated. The
/// check is what matters: a flow is otherwise re-checked only on its own
/// events, and a requester stopped at its window whose packets wait behind
/// a WAN loss has none for a WAN round trip or more, while other flows'
/// deliveries free the room it waits for. So it is below the first 2 ms
/// step of the adaptive timer of ConnectX-class requesters, which only an
/// ACK that moves restarts (with 10 ms, 16 QPs at 400 Gb/s and 0.1 % WAN
/// loss timed out twice and resent 800 packets; none with 1 ms,
/// docs/benchmarks.md §8). The repeat (rxe restarts its timer on
/// any response) then comes well below the shortest ACK timeout requesters
/// commonly use (4.096 µs × 2^13 = 34 ms; perftest's default is 67 ms).
pub const HOLD_ACK_INTERVAL: Duration = Duration::from_millis(1);
/// ...for at most this long: backpressure is a transient the requester need
/// not see; a longer wait (every WAN path down) is left to its own retry
/// settings (docs/semantics.md).
pub const HOLD_ACK_FOR: Duration = Duration::from_secs(4);

impl PseudoAcker {
    /// An admitted request is `past_ack` packets past the last pseudo-ACK:
    /// the requester's window is at least that. Promise the buffer the
    /// window seen so far (it only grows: a send queue does not shrink).
    pub(super) fn note_window(&mut self, past_ack: usize, now: Time, buf: &mut DeepBuffer) {
        self.window = self.window.max(past_ack);
        buf.promise(
            self.flow_id,
            self.expected_window().saturating_sub(past_ack),
            now,
        );
    }

    /// A request at `psn` was dropped (at the hard limit, or out of order
    /// behind such a drop), `expected` being the first PSN not admitted.
    /// The requester sent it, so its window reaches that far: the packets
    /// admitted past the last pseudo-ACK, and every PSN from `expected` to
    /// `psn`. Counting only what was admitted, a requester whose packets
    /// were dropped from the 65th on looked stopped at a window of 64
    /// (`note_stopped`), was promised half of its real window of 128
    /// after its NAK, and its resend overran the room promised to the
    /// other flows' resends, which were dropped in turn: the over-subscribed
    /// sweep's least fair runs (seed 240: one QP at 0.05 of an equal
    /// share). PSNs, not slots, beyond `expected`: a dropped READ's span
    /// is not known, and rxe's window is counted in PSNs too. At most the
    /// flow's quota, as the admitted packets alone could ever show: a
    /// packet with a bogus PSN far ahead would otherwise make the flow
    /// promise itself millions of slots, and every other flow's pseudo-ACK
    /// wait for room that is never coming.
    pub(super) fn note_dropped(
        &mut self,
        psn: Psn,
        expected: Psn,
        now: Time,
        buf: &mut DeepBuffer,
    ) {
        let beyond = psn.diff(expected);
        if beyond >= 0 {
            let used = (self.past_ack() + beyond as usize + 1).min(buf.per_flow_slots());
            self.note_window(used, now, buf);
        }
    }

    /// Packets admitted past the last pseudo-ACK: part of the requester's
    /// window it has used.
    fn past_ack(&self) -> usize {
        self.entries.len().saturating_sub(self.first_unacked)
    }

    /// Re-promises what the requester may still send, after an ACK moved
    /// its window. A flow whose packets have all left the buffer is
    /// promised it too, for a short while (`buffer::PROMISE_WITHOUT_SLOTS_FOR`):
    /// the next flow's check must count the window this grant opened.
    pub(super) fn renew_promise(&self, now: Time, buf: &mut DeepBuffer) {
        buf.promise(
            self.flow_id,
            self.expected_window().saturating_sub(self.past_ack()),
            now,
        );
    }

    /// The window to reserve for: the assumed one until the requester was
    /// seen stopped at its own (a requester shows its window only once it
    /// is withheld, and the first overrun must not drop either), then that
    /// one. Each requester's promise counts in every other flow's check,
    /// so an rxe QP (128 PSNs) that went on promising an assumed hardware
    /// window of 2,048 packets made 16 of them promise more than a small
    /// buffer holds.
    /// A paced requester is promised less (`pacing`).
    fn expected_window(&self) -> usize {
        let window = if self.window_seen {
            self.window.max(1)
        } else {
            self.window.max(self.tuning.assumed_window_slots)
        };
        self.paced_window(window)
    }

    /// A hold interval passed with pseudo-ACKs withheld: if nothing more
    /// came from the requester since the last one, it is stopped at its
    /// window (or its application sent all it has: either way it sends no
    /// more until acknowledged), and that is its window from now on. It
    /// only grows after that (`note_window`), so an application that
    /// merely paused costs an overrun later, dropped and resent, never a
    /// loss.
    pub(super) fn note_stopped(&mut self, now: Time, buf: &mut DeepBuffer) {
        let past = self.past_ack();
        if past > 0 && past == self.past_ack_at_hold && !self.window_seen {
            self.window_seen = true;
            self.window = self.window.max(past);
            self.renew_promise(now, buf);
        }
        self.past_ack_at_hold = past;
    }

    /// Whether the buffer can take what a pseudo-ACK lets requesters send:
    /// this flow's window within its quota, and every flow's window within
    /// the shared slab. Each bound is at least `ack_reserve_slots` and at
    /// most half of the quota or slab it protects: a window as large as the
    /// buffer cannot be covered, and reserving it all would stop the flow.
    /// Room in the shared slab also goes in turn: while other flows wait
    /// for it, only the first of them may take it (`buffer::room`).
    pub(super) fn room_to_ack(&self, buf: &DeepBuffer) -> Room {
        let (own, all) = self.reserve(buf);
        let flow_left = buf
            .per_flow_slots()
            .saturating_sub(buf.flow_slots(self.flow_id));
        if flow_left < own {
            Room::Quota
        } else if buf.free_slots() < own.max(all) || !buf.is_turn_of(self.flow_id) {
            Room::Shared
        } else {
            Room::Yes
        }
    }

    /// Whether a pseudo-ACK could go out now as far as room goes: the
    /// engine asks this of the first flow waiting for room before it
    /// offers it the room (`QpEngine::serve_room_waiters`), a cheap
    /// question where `maybe_ack` walks the unacknowledged entries.
    pub fn has_room_to_ack(&self, buf: &DeepBuffer) -> bool {
        self.room_to_ack(buf) == Room::Yes
    }

    /// The slots to keep free for this flow's window within its quota, and
    /// for what every flow may send within the shared slab once this one
    /// is acknowledged: the others' promises, and this one's whole window.
    fn reserve(&self, buf: &DeepBuffer) -> (usize, usize) {
        let floor = self.tuning.ack_reserve_slots;
        let window = self.expected_window();
        let own = floor.max(window.min(buf.per_flow_slots() / 2));
        // This flow's promise is its window less what it used (note_window,
        // renew_promise); none while it holds no slot. The others' promises
        // count in full: room they may use without notice is not room for
        // this flow. (Capping the sum at half the buffer, as before, let
        // every flow waiting for room be acknowledged at once as soon as
        // half the buffer was free; their windows then overran it, the
        // requests past it were dropped, and the QPs whose requests were
        // dropped lost their share of the WAN to a go-back-N and a
        // timeout, again and again: the over-subscribed sweep's unfair
        // runs.) Only this flow's own window is capped, so that a window
        // larger than the buffer still waits for half of it, not for more
        // than there is; the others' promises shrink as they send, and
        // those of flows holding nothing are forgotten, so the sum always
        // comes down.
        let after_ack =
            buf.promised() - buf.promise_of(self.flow_id) + window.min(buf.capacity() / 2);
        let all = floor.max(after_ack);
        (own, all)
    }

    /// Whether requesters have used more than half of the reserve while
    /// pseudo-ACKs are withheld: more flows at their windows at once, or a
    /// window larger than promised, than the reserve was sized for. Only
    /// then is a CNP worth its cost: within the reserve the withheld
    /// window stops the requester by itself, while DCQCN halves a hardware
    /// requester's rate per CNP and takes ~0.3 s to recover from 25 Gb/s
    /// (lossy 400 Gb/s run: 167 CNPs, 126 Gb/s instead of ~350 with none,
    /// docs/benchmarks.md §8).
    fn reserve_eaten(&self, buf: &DeepBuffer) -> bool {
        let (own, all) = self.reserve(buf);
        buf.headroom(self.flow_id) < own / 2 || buf.free_slots() < all / 2
    }

    /// How far the requester may be told its requests are done.
    pub(super) fn ack_limit(&self) -> Option<(Psn, u32, bool, Time)> {
        if self.mode != Mode::Accelerated || self.tuning.policy == AckPolicy::Off {
            return None;
        }
        let mut limit = None;
        let mut ack_req = false;
        let mut oldest = None;
        for e in self.entries.iter().skip(self.first_unacked) {
            if e.needs_response && !e.answered {
                break; // never at or past an outstanding READ/atomic
            }
            if self.tuning.policy == AckPolicy::Strict
                && e.ends_message
                && self.delivered.is_none_or(|d| e.last().after(d))
            {
                break; // strict: the last packet waits for the real ACK
            }
            if e.needs_response {
                // Answered READ: the response already acknowledged it.
                continue;
            }
            limit = Some((e.last(), self.msn_at(e.msgs_after)));
            ack_req |= e.ack_req;
            oldest.get_or_insert(e.accepted_at);
        }
        let (psn, msn) = limit?;
        Some((psn, msn, ack_req, oldest.unwrap_or(Time::ZERO)))
    }

    pub(super) fn count_unacked_ackable(&self, limit: Psn) -> u32 {
        self.entries
            .iter()
            .skip(self.first_unacked)
            .take_while(|e| !e.psn.after(limit))
            .count() as u32
    }

    /// Sends a pseudo-ACK if policy, coalescing and backpressure allow,
    /// then a NAK owed since a request was dropped at the hard limit.
    pub(super) fn maybe_ack(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        self.ack_if_room(now, buf, out);
        if self.nak_owed {
            self.pay_owed_nak(now, buf, out);
        }
    }

    /// **An owed NAK.** A request dropped at the buffer's hard limit (the
    /// requesters' windows together overran it: each QP's first window
    /// after the tunnel phase was granted by the real responder's ACKs,
    /// with no promise behind it) leaves a gap, and everything the
    /// requester sends after it is dropped as out of order. The NAK that
    /// makes it resend goes out when (1) everything before the gap is
    /// acknowledged, so that the NAK, which acknowledges every PSN before
    /// it, tells the requester nothing a pseudo-ACK would not (strict
    /// message ends, READs still waiting for their answers); and (2) the
    /// buffer has room for the window the resend may use, in turn with the
    /// flows waiting for room, exactly as for a pseudo-ACK. Until then the
    /// flow waits like a withheld pseudo-ACK (its last ACK repeated every
    /// hold interval). Before, the NAK went out at once, its resend was
    /// dropped again while the buffer was still full, and the requester
    /// then heard nothing until its ACK timeout: a QP idle for 67 ms while
    /// the others took the WAN (over-subscribed sweep seed 60; issue 33).
    fn pay_owed_nak(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        if self.failed.is_some() {
            self.nak_owed = false;
            return;
        }
        let Some(expected) = self.expected else {
            return;
        };
        if self.past_ack() > 0 {
            return; // (1): the pseudo-ACK before the gap comes first
        }
        match self.room_to_ack(buf) {
            Room::Yes => {
                self.nak_owed = false;
                self.stats.seq_naks_owed += 1;
                self.send_gap_nak(expected, out);
                // The resend may use the whole window: promised now, so
                // that the next flow's check counts it.
                self.renew_promise(now, buf);
                self.hold_deadline = None;
                self.hold_since = None;
                buf.stop_waiting(self.flow_id);
            }
            room => {
                // As for a withheld pseudo-ACK (`ack_if_room`).
                if room == Room::Shared {
                    buf.wait_for_room(self.flow_id);
                } else {
                    buf.stop_waiting(self.flow_id);
                }
                let since = *self.hold_since.get_or_insert(now);
                if now.since(since) < HOLD_ACK_FOR {
                    self.hold_deadline.get_or_insert(now + HOLD_ACK_INTERVAL);
                }
            }
        }
    }

    fn ack_if_room(&mut self, now: Time, buf: &mut DeepBuffer, out: &mut Outbox) {
        self.ack_deadline = None;
        // Nothing to acknowledge: no room needed, unless for an owed NAK,
        // which keeps the flow's place in the queue for room.
        let Some((psn, msn, ack_req, oldest)) = self.ack_limit() else {
            if !self.nak_owed {
                buf.stop_waiting(self.flow_id);
            }
            return;
        };
        if self.acked.is_some_and(|(a, _)| !psn.after(a)) {
            if !self.nak_owed {
                buf.stop_waiting(self.flow_id);
            }
            return;
        }
        let room = self.room_to_ack(buf);
        if room != Room::Yes {
            // Backpressure: let the requester's window stop it instead of
            // dropping. What frees the room wakes this flow: its own
            // deliveries (its quota), or, for the shared slab, the engine
            // offering the room to the flows waiting for it in turn, with
            // no event of this flow's needed (`buffer::room`). Never only
            // the hold timer below, which stops after HOLD_ACK_FOR.
            if room == Room::Shared {
                buf.wait_for_room(self.flow_id);
            } else {
                // Held by its own quota: its deliveries re-check it, and
                // it must not keep others waiting behind it.
                buf.stop_waiting(self.flow_id);
            }
            self.stats.withheld_acks += 1;
            buf.note_pushback();
            // A paced requester is asked again to slow down each time it
            // is withheld; the others once they ate into the reserve.
            if self.reserve_eaten(buf) || self.is_paced() {
                self.maybe_cnp(now, out);
            }
            let since = *self.hold_since.get_or_insert(now);
            if self.pace_when_held(now.since(since), buf) {
                self.pace(now, buf, out);
                return;
            }
            if now.since(since) < HOLD_ACK_FOR {
                self.hold_deadline.get_or_insert(now + HOLD_ACK_INTERVAL);
            }
            return;
        }
        self.hold_deadline = None;
        self.hold_since = None;
        let due = oldest + self.tuning.coalesce;
        if ack_req || self.count_unacked_ackable(psn) >= self.tuning.coalesce_packets || now >= due
        {
            self.stats.pseudo_acks += 1;
            self.send_ack(psn, msn, out);
            self.set_acked(psn, msn);
            self.renew_promise(now, buf);
            // Served: the next waiting flow's turn (it rejoins at the back
            // if it must wait again).
            buf.stop_waiting(self.flow_id);
        } else {
            // Coalescing: it keeps its turn until the ACK goes out.
            self.ack_deadline = Some(due);
        }
    }

    pub(super) fn set_acked(&mut self, psn: Psn, msn: u32) {
        if self.acked.is_none_or(|(a, _)| psn.after(a)) {
            self.acked = Some((psn, msn));
        }
        while let Some(e) = self.entries.get(self.first_unacked) {
            if e.last().after(psn) {
                break;
            }
            self.first_unacked += 1;
        }
        // Delivered and now acknowledged (`strict` acknowledges only after
        // delivery): done. Left in place, the last message of a stream
        // would count as owed until the next delivery, and a drain with no
        // next delivery would never end.
        self.pop_done();
    }

    pub(super) fn maybe_cnp(&mut self, now: Time, out: &mut Outbox) {
        const CNP_INTERVAL: Duration = Duration::from_micros(50);
        if !self.tuning.cnp_on_backpressure {
            return;
        }
        let Some(reply) = self.reply else { return };
        if self.last_cnp.is_some_and(|t| now < t + CNP_INTERVAL) {
            return;
        }
        self.last_cnp = Some(now);
        self.stats.cnps_sent += 1;
        out.dc_repr(&builders::cnp(&reply));
    }

    pub(super) fn send_ack(&self, psn: Psn, msn: u32, out: &mut Outbox) {
        if let Some(reply) = self.reply {
            out.dc_repr(&builders::ack(&reply, psn, msn));
        }
    }
}
