//! The send side of [`WanConnection`]: which path carries the next datagram,
//! and building, framing and sealing it.

use super::*;

impl WanConnection {
    /// Produces the next datagram to send into `buf`. `buf` must hold
    /// `max_datagram` bytes: with less, only control packets go out (and
    /// `poll_timeout` keeps reporting the waiting data as due). Call until it
    /// returns `None` after every `handle_*` call and timeout.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        self.last_now = self.last_now.max(now);
        if self.state == State::Closed || self.paths.is_empty() {
            return None;
        }
        let n = self.paths.len();
        if self.state == State::Closing {
            return self.transmit_close(now, buf);
        }
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.paths[i].hello_due {
                self.paths[i].hello_due = false;
                self.paths[i].last_hello_tx = Some(now);
                let len = self.session.write_hello(i as u8, buf);
                if len == 0 {
                    // Nothing to say (identity mode: a server with a
                    // session), or `buf` too small: the rest may go.
                    continue;
                }
                self.paths[i].counters.packets_sent += 1;
                self.paths[i].counters.bytes_sent += len as u64;
                self.rr = (i + 1) % n;
                return Some(Transmit {
                    path: i,
                    len,
                    release_at: now,
                });
            }
        }
        self.session.peer.as_ref()?;
        self.maybe_update_key(now);
        if self.has_data() && buf.len() >= self.max_datagram {
            if let scheduler::Choice::Now(i) = self.choose_data_path(now) {
                return self.build_packet(now, i, true, buf);
            }
        } else {
            // Nothing to send: rate samples taken now underestimate paths.
            for p in &mut self.paths {
                p.recovery.mark_app_limited();
            }
        }
        // Control-only packets: ACKs, PINGs, credits.
        let credit_path = self.recv.has_credit_pending().then(|| self.control_path());
        for k in 0..n {
            let i = (self.rr + k) % n;
            let p = &self.paths[i];
            if p.state == PathState::Retired {
                continue;
            }
            if p.acks.wants_ack(now) || p.ping_due || credit_path == Some(i) {
                self.rr = (i + 1) % n;
                return self.build_packet(now, i, false, buf);
            }
        }
        None
    }

    /// Replaces the sending key when it is due and the peer is ready for it
    /// (`keyphase`). Runs before every packet: the common case is two
    /// comparisons.
    pub(super) fn maybe_update_key(&mut self, now: Time) {
        let Some(peer) = self.session.peer.as_ref() else {
            return;
        };
        let tx = &peer.keys.tx;
        if !tx.due(now) {
            return;
        }
        let retain = self.key_retain();
        let Some(peer) = self.session.peer.as_mut() else {
            return;
        };
        let tx = &mut peer.keys.tx;
        if !tx.may_update(now, retain) {
            if tx.exhausted() {
                self.counters.key_exhausted += 1;
            }
            return;
        }
        tx.update(now);
        tracing::debug!(updates = tx.updates, "WAN sending key updated");
        self.counters.tx_key_updates += 1;
        // A PING on every path, under the new key: its ACK tells that the
        // peer reads the new phase, which the next update waits for, even
        // when this side sends only ACKs (never acknowledged themselves).
        for p in &mut self.paths {
            if p.state != PathState::Retired {
                p.ping_due = true;
            }
        }
    }

    /// The Up path with the lowest RTT (path 0 when none is Up).
    pub(super) fn control_path(&self) -> usize {
        self.paths
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state == PathState::Up)
            .min_by_key(|(_, p)| p.rtt.smoothed())
            .or_else(|| {
                self.paths
                    .iter()
                    .enumerate()
                    .find(|(_, p)| p.state != PathState::Retired)
            })
            .map_or(0, |(i, _)| i)
    }

    pub(super) fn transmit_close(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let restart = self.close_why == CloseWhy::Restart;
        let Some(i) = self.close_pending.iter().position(|&c| c) else {
            self.state = State::Closed;
            self.push_event(Event::Closed { restart });
            return None;
        };
        let why = self.close_why;
        self.close_pending[i] = false;
        let max = self.max_datagram;
        let t = Self::seal_packet_on(
            &mut self.session,
            &mut self.paths[i],
            now,
            i,
            max,
            buf,
            &mut self.frame_lists,
            |w, _, _| {
                Frame::Close {
                    code: why.code(),
                    reason: why.reason(),
                }
                .encode(w)
            },
        );
        if !self.close_pending.iter().any(|&c| c) {
            self.state = State::Closed;
            self.push_event(Event::Closed { restart });
        }
        t
    }

    /// Builds one protected packet on path `i`: ACK, PING, credits and, for
    /// a data packet, retransmissions, datagrams and new data.
    pub(super) fn build_packet(
        &mut self,
        now: Time,
        i: usize,
        with_data: bool,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let (send, recv, dsend, pool) = (
            &mut self.send,
            &mut self.recv,
            &mut self.dsend,
            &mut self.pool,
        );
        let path = &mut self.paths[i];
        let mut retransmission = false;
        let t = Self::seal_packet_on(
            &mut self.session,
            path,
            now,
            i,
            self.max_datagram,
            buf,
            &mut self.frame_lists,
            |w, acks, sent| {
                let mut eliciting = false;
                // ACK and credits first, each bounded in a data packet so a
                // full-size fragment still fits (see CONTROL_RESERVE).
                if acks.has_news() {
                    if with_data {
                        let mut small = [0u8; 64];
                        let mut aw = Writer::new(&mut small);
                        if acks.write(i as u8, now, &mut aw) {
                            let n = aw.len();
                            w.bytes(&small[..n]);
                        }
                    } else {
                        acks.write(i as u8, now, w);
                    }
                }
                if with_data {
                    // (A data packet has at least MIN_MAX_DATAGRAM bytes, so
                    // these 64 + 32 bytes always fit.)
                    let mut small = [0u8; 32];
                    let mut cw = Writer::new(&mut small);
                    recv.write_credits(&mut cw, sent);
                    let n = cw.len();
                    w.bytes(&small[..n]);
                    let before = sent.len();
                    send.write_retransmissions(w, sent);
                    retransmission = sent.len() > before;
                    send.write_fins(w, sent);
                    eliciting |= dsend.write(w, pool);
                    send.write_new(w, sent);
                } else {
                    recv.write_credits(w, sent);
                }
                eliciting || !sent.is_empty()
            },
        );
        if t.is_some() && retransmission {
            self.paths[i].counters.packets_retransmitted += 1;
        }
        t
    }

    /// Header, frames from `fill` (which returns whether it wrote anything
    /// ack-eliciting), encryption, and the bookkeeping of a sent packet
    /// (recovery, congestion control, pacing, counters). A due PING goes
    /// first, whatever the packet carries.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn seal_packet_on(
        session: &mut Session,
        p: &mut Path,
        now: Time,
        i: usize,
        max_datagram: usize,
        buf: &mut [u8],
        frame_lists: &mut FrameLists,
        fill: impl FnOnce(&mut Writer<'_>, &mut ack::AckTracker, &mut Vec<SentFrame>) -> bool,
    ) -> Option<Transmit> {
        let (insecure, client, generation) =
            (session.insecure(), session.is_client, session.generation());
        let peer = session.peer.as_mut()?;
        let cap = buf.len().min(max_datagram);
        if cap < HEADER_LEN + TAG_LEN + 64 || peer.keys.tx.exhausted() {
            // (An exhausted key seals nothing more: `maybe_update_key`.)
            return None;
        }
        let pn = p.recovery.next_pn();
        let hdr = Header {
            kind: PacketKind::Protected,
            insecure,
            client,
            key_phase: peer.keys.tx.phase(),
            path: i as u8,
            conn_id: peer.keys.conn_id,
            generation,
            pn,
        };
        let mut head = [0u8; HEADER_LEN];
        hdr.encode(&mut head);
        let (hbuf, rest) = buf[..cap].split_at_mut(HEADER_LEN);
        hbuf.copy_from_slice(&head);
        let payload_cap = rest.len() - TAG_LEN;
        let mut sent = frame_lists.take();
        let (len, eliciting) = {
            let mut w = Writer::new(&mut rest[..payload_cap]);
            let mut eliciting = false;
            if p.ping_due && Frame::Ping.encode(&mut w) {
                p.ping_due = false;
                eliciting = true;
            }
            eliciting |= fill(&mut w, &mut p.acks, &mut sent);
            (w.len(), eliciting)
        };
        if len == 0 {
            frame_lists.put(sent);
            return None;
        }
        let tag = peer.keys.seal(i as u8, pn, &head, &mut rest[..len]);
        rest[len..len + TAG_LEN].copy_from_slice(&tag);
        let total = HEADER_LEN + len + TAG_LEN;
        let has_data = sent
            .iter()
            .any(|f| matches!(f, SentFrame::Data { .. } | SentFrame::Fin { .. }));
        let record = if eliciting {
            Some(SentPacket::new(now, total as u32, sent))
        } else {
            frame_lists.put(sent);
            None
        };
        p.recovery.on_sent(pn, record);
        p.counters.packets_sent += 1;
        p.counters.bytes_sent += total as u64;
        // Only data is paced; ACKs, PINGs and credits are small and late
        // control costs more than it saves.
        let release_at = if has_data {
            let rate = p.cc.pacing_rate();
            let burst = p.burst_allowance(rate);
            p.pacer.on_send(now, total as u64, rate, burst)
        } else {
            now
        };
        if eliciting {
            p.cc.on_sent(now, total as u64, p.recovery.bytes_in_flight);
        }
        Some(Transmit {
            path: i,
            len: total,
            release_at,
        })
    }
}
