//! The receive side of [`WanConnection`]: datagrams in, HELLOs, authenticated
//! frames, acknowledgements and losses.

use super::*;

impl WanConnection {
    // ----- receiving -----

    /// A datagram arrived on `path`. Anything that fails to parse,
    /// authenticate or pass the replay window is dropped and counted.
    ///
    /// Copies the datagram into a scratch buffer to decrypt it: an I/O
    /// layer that owns its receive buffer should call
    /// [`Self::handle_datagram_in_place`] instead.
    pub fn handle_datagram(&mut self, now: Time, path: usize, bytes: &[u8]) {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        crate::copies::note(bytes.len());
        buf.extend_from_slice(bytes);
        self.handle_datagram_in_place(now, path, &mut buf);
        self.scratch = buf;
    }

    /// [`Self::handle_datagram`] without the copy: a protected packet is
    /// decrypted where it lies, so `bytes` is left holding plaintext (or
    /// garbage, if it failed to authenticate).
    pub fn handle_datagram_in_place(&mut self, now: Time, path: usize, bytes: &mut [u8]) {
        self.last_now = self.last_now.max(now);
        if self.state == State::Closed {
            return;
        }
        let Some(p) = self.paths.get_mut(path) else {
            self.counters.malformed += 1;
            return;
        };
        if p.state == PathState::Retired {
            // Removed by a reload: the twin sends on it until it reloads
            // too; what it sent is retransmitted on the other paths.
            p.counters.retired_drops += 1;
            return;
        }
        let hdr = match Header::decode(bytes) {
            Ok(h) if usize::from(h.path) == path => h,
            Err(packet::HeaderError::Version(v)) => {
                // A twin of another release: say so once, clearly.
                if self.counters.wrong_version == 0 {
                    tracing::warn!(
                        twin = v,
                        ours = packet::VERSION,
                        "the twin speaks another WAN protocol version: run the same \
                         Sōya release on both gateways"
                    );
                }
                self.counters.wrong_version += 1;
                p.counters.malformed += 1;
                self.counters.malformed += 1;
                return;
            }
            other => {
                tracing::trace!(path, cause = ?other.err(), "malformed WAN datagram");
                p.counters.malformed += 1;
                self.counters.malformed += 1;
                return;
            }
        };
        if hdr.insecure != self.session.insecure() {
            // A lab-mode peer talking to a keyed one (or the reverse).
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        match hdr.kind {
            PacketKind::Hello => self.handle_hello(now, path, &hdr, bytes),
            PacketKind::Protected => self.handle_protected(now, path, &hdr, bytes),
        }
    }

    pub(super) fn handle_hello(&mut self, now: Time, path: usize, hdr: &Header, bytes: &[u8]) {
        if self.session.has_identity() {
            let verdict = self.session.on_noise_hello(hdr, bytes, now);
            if !matches!(
                verdict,
                HelloVerdict::HandshakeFailed
                    | HelloVerdict::UnknownPeer
                    | HelloVerdict::Malformed
                    | HelloVerdict::ModeMismatch
            ) {
                self.counters.hellos_accepted += 1;
            }
            self.on_hello_verdict(now, path, hdr, verdict);
            return;
        }
        if !self.session.verify_hello(bytes) {
            self.paths[path].counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        let hello = match Hello::decode(&bytes[HEADER_LEN..HELLO_LEN - TAG_LEN]) {
            Ok(h) => h,
            Err(e) => {
                tracing::trace!(path, cause = %e, "malformed HELLO");
                self.paths[path].counters.malformed += 1;
                self.counters.malformed += 1;
                return;
            }
        };
        self.counters.hellos_accepted += 1;
        let verdict = self.session.on_hello(hdr, &hello, now);
        self.on_hello_verdict(now, path, hdr, verdict);
    }

    fn on_hello_verdict(&mut self, now: Time, path: usize, hdr: &Header, verdict: HelloVerdict) {
        match verdict {
            HelloVerdict::RoleConflict => self.counters.role_conflicts += 1,
            HelloVerdict::Retired => self.counters.replays_dropped += 1,
            HelloVerdict::Known { needs_hello } => {
                // The peer has not seen a protected packet from us yet:
                // send one, and our HELLO if it has not committed. (Never
                // answer a committed peer's HELLO with a HELLO: two
                // committed sides would bounce HELLOs forever.)
                self.paths[path].ping_due = true;
                if needs_hello {
                    self.reply_hello(now, path);
                }
            }
            HelloVerdict::Candidate => {
                self.hello_interval = self.tuning.hello_interval;
                self.hello_next = self.hello_next.min(now + self.hello_interval);
                self.reply_hello(now, path);
            }
            HelloVerdict::Committed { previous } => self.on_commit(now, path, previous),
            HelloVerdict::CipherMismatch { theirs, first } => {
                self.counters.cipher_mismatches += 1;
                if first {
                    let ours = self.session.offer;
                    self.push_event(Event::CipherMismatch {
                        peer_generation: hdr.generation,
                        ours,
                        theirs,
                    });
                }
            }
            HelloVerdict::Answered | HelloVerdict::Probe => {
                self.hello_interval = self.tuning.hello_interval;
                self.hello_next = self.hello_next.min(now + self.hello_interval);
                self.reply_hello(now, path);
            }
            HelloVerdict::Stale => self.counters.stale_handshakes += 1,
            // The client's new keys are armed: its next packet moves to
            // them (`maybe_update_key`).
            HelloVerdict::Rekeyed => {}
            HelloVerdict::HandshakeFailed => {
                self.paths[path].counters.auth_failures += 1;
                self.counters.handshake_failures += 1;
            }
            HelloVerdict::UnknownPeer => {
                if self.counters.unknown_peer_keys == 0 {
                    tracing::warn!(
                        "WAN handshake from a static key other than the twin's public key \
                         (check twin_public_key): refused"
                    );
                }
                self.counters.unknown_peer_keys += 1;
            }
            HelloVerdict::ModeMismatch => {
                if self.counters.handshake_failures == 0 {
                    tracing::warn!(
                        "the twin sends PSK-only HELLOs but this side has identity keys: \
                         configure identity keys on both twins (or on neither)"
                    );
                }
                self.counters.handshake_failures += 1;
            }
            HelloVerdict::Malformed => {
                self.paths[path].counters.malformed += 1;
                self.counters.malformed += 1;
            }
        }
    }

    /// Answers a HELLO at once, at most once per millisecond per path.
    pub(super) fn reply_hello(&mut self, now: Time, path: usize) {
        let p = &mut self.paths[path];
        if p.last_hello_tx
            .is_none_or(|t| now.since(t) >= Duration::from_millis(1))
        {
            p.hello_due = true;
        }
    }

    pub(super) fn on_commit(&mut self, now: Time, path: usize, previous: Option<u64>) {
        let Some(peer) = self.session.peer.as_ref() else {
            return;
        };
        let (generation, window) = (peer.generation, peer.flow_window);
        match previous {
            Some(old) => {
                // Everything in flight belonged to the old peer's state.
                self.send.reset();
                self.recv.reset();
                self.drecv.clear();
                for p in &mut self.paths {
                    p.recovery.reset();
                    p.acks.reset();
                    p.replay = Default::default();
                }
                // The twin restarted with its configuration's paths: slots
                // removed by a reload are forgotten for good.
                self.drop_trailing_retired();
                self.counters.peer_restarts += 1;
                self.push_event(Event::PeerRestarted {
                    old_generation: old,
                    new_generation: generation,
                });
            }
            None => self.push_event(Event::Connected {
                peer_generation: generation,
            }),
        }
        self.send
            .set_initial_credit(window.max(2 * flow::MAX_MESSAGE as u64));
        for p in self
            .paths
            .iter_mut()
            .filter(|p| p.state != PathState::Retired)
        {
            p.ping_due = true;
            p.last_ack_rx = now;
        }
        self.hello_interval = self.tuning.hello_interval;
        self.hello_next = now + self.hello_interval;
        self.reply_hello(now, path);
        self.session.rekey_on_session(now);
    }

    pub(super) fn handle_protected(
        &mut self,
        now: Time,
        path: usize,
        hdr: &Header,
        bytes: &mut [u8],
    ) {
        if self.session.has_identity() && !self.session.is_client {
            self.try_confirm(now, path, hdr, bytes);
        }
        // Only a packet of the other phase can switch keys, and only then
        // is the retention period needed (it walks the paths).
        let retain = match self.session.peer.as_ref() {
            Some(peer) if peer.keys.rx.phase() != hdr.key_phase => self.key_retain(),
            _ => Duration::ZERO,
        };
        let Some(peer) = self.session.peer.as_mut() else {
            self.counters.no_session += 1;
            return;
        };
        if hdr.generation != peer.generation {
            self.counters.stale_generation += 1;
            return;
        }
        let p = &mut self.paths[path];
        if hdr.client == self.session.is_client || hdr.conn_id != peer.keys.conn_id {
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            return;
        }
        if bytes.len() < HEADER_LEN + TAG_LEN {
            p.counters.malformed += 1;
            self.counters.malformed += 1;
            return;
        }
        // Packet numbers run on across key updates, so one window refuses
        // a replay from any earlier phase as from this one.
        if p.replay.check(hdr.pn) != replay::Verdict::Fresh {
            p.counters.replays_dropped += 1;
            self.counters.replays_dropped += 1;
            return;
        }
        let len = bytes.len();
        // Decrypted in place: the payload is never copied before parsing.
        let (opened, plain) = peer.keys.open_packet(hdr, bytes, now, retain);
        if opened == Opened::Failed {
            p.counters.auth_failures += 1;
            self.counters.auth_failures += 1;
            if peer.keys.rx.failures >= peer.keys.integrity_limit() {
                // RFC 9001 §6.6: that many forgeries under one key and its
                // integrity is no longer assured. Only the peer can replace
                // it: end the session (the site starts a new one).
                tracing::warn!(
                    failures = peer.keys.rx.failures,
                    "WAN key met the AEAD integrity limit: closing the session"
                );
                self.counters.integrity_limit_closes += 1;
                self.close(now);
            }
            return;
        }
        match opened {
            Opened::Switched => self.counters.rx_key_updates += 1,
            Opened::Rekeyed => {
                self.counters.rx_key_updates += 1;
                self.session.on_rekeyed(now);
            }
            Opened::Previous => self.counters.rx_key_previous += 1,
            Opened::Current | Opened::Failed => {}
        }
        // Authentic from here on: only now may the packet move any state.
        p.replay.accept(hdr.pn);
        match check_frames(plain) {
            Ok((frames, eliciting)) => {
                let p = &mut self.paths[path];
                p.counters.packets_received += 1;
                p.counters.bytes_received += len as u64;
                self.counters.packets_accepted += 1;
                if !self.session.confirmed {
                    self.session.confirmed = true;
                    // Our packets may have been dropped before the peer
                    // committed: probe every path that is not Up yet.
                    for q in &mut self.paths {
                        if q.state != PathState::Up && q.state != PathState::Retired {
                            q.ping_due = true;
                        }
                    }
                }
                for f in frames {
                    self.on_frame(now, f);
                }
                let max_delay = self.tuning.max_ack_delay;
                self.paths[path]
                    .acks
                    .on_packet(hdr.pn, now, eliciting, max_delay);
            }
            Err(e) => {
                // Authentic but unparsable: a peer bug. Nothing was applied.
                tracing::debug!(path, cause = %e, "authentic WAN packet with malformed frames");
                self.paths[path].counters.malformed += 1;
                self.counters.malformed += 1;
            }
        }
    }

    /// Identity mode, server: a protected packet of a client generation
    /// whose handshake we answered. If it authenticates under the pending
    /// keys (tried on a copy), that session is confirmed and becomes the
    /// current one; the packet is then processed as any other.
    fn try_confirm(&mut self, now: Time, path: usize, hdr: &Header, bytes: &[u8]) {
        if bytes.len() < HEADER_LEN + TAG_LEN {
            return;
        }
        let Some(pending) = self.session.pending_mut(hdr.generation) else {
            return;
        };
        if hdr.conn_id != pending.keys.conn_id {
            return;
        }
        let mut copy = bytes.to_vec();
        let (opened, _) = pending
            .keys
            .open_packet(hdr, &mut copy, now, Duration::ZERO);
        if opened == Opened::Failed {
            self.session.pending_missed(hdr.generation);
            return;
        }
        if let Some(previous) = self.session.promote(hdr.generation) {
            self.on_commit(now, path, previous);
        }
    }

    pub(super) fn on_frame(&mut self, now: Time, f: Frame<'_>) {
        match f {
            Frame::Ping => {}
            Frame::Ack(a) => self.on_ack_frame(now, &a),
            Frame::Data(d) => {
                let (events, counters) = (&mut self.events, &mut self.counters);
                // (flow, len) of messages that did not decode (rare).
                let mut undecodable: Vec<(u64, u64)> = Vec::new();
                // The one copy of the payload on the receiving side: a
                // message whole in its datagram is decoded by copying the
                // packet into a pooled buffer; a fragmented one was
                // reassembled into such a buffer, which becomes the packet.
                let mut deliver = |flow, m: Message<'_>, pool: &mut PacketPool| {
                    let (len, decoded) = match m {
                        Message::InFrame(bytes) => (
                            bytes.len() as u64,
                            msg::decode_with(bytes, |b| pool.copy_of(b)),
                        ),
                        Message::Reassembled { head, body } => (
                            (head.len() + body.len()) as u64,
                            msg::decode_split(head, body, pool),
                        ),
                    };
                    match decoded {
                        Ok(msg) => events.push_back(Queued::Msg { flow, len, msg }),
                        Err(e) => {
                            tracing::debug!(flow, cause = %e, "undecodable twin message");
                            counters.malformed += 1;
                            undecodable.push((flow, len));
                        }
                    }
                };
                let outcome = self.recv.on_data(&d, &mut self.pool, &mut deliver);
                if outcome == DataOutcome::Violation {
                    self.counters.protocol_violations += 1;
                }
                for (flow, len) in undecodable {
                    // Keep the flow's credit flowing past it.
                    self.recv.on_consumed(flow, len);
                }
            }
            Frame::Credit { flow, max_offset } => self.send.on_credit(flow, max_offset),
            Frame::Fin { flow, seq } => {
                if self.recv.on_fin(flow, seq) == DataOutcome::Violation {
                    self.counters.protocol_violations += 1;
                }
            }
            Frame::Datagram(d) => {
                if let Some(dg) = self.drecv.on_frame(&d, &mut self.pool) {
                    self.counters.datagrams_received += 1;
                    self.push_event(Event::Datagram(dg));
                }
            }
            Frame::Close { code, .. } => {
                self.state = State::Closed;
                let restart = CloseWhy::from_code(code) == CloseWhy::Restart;
                self.push_event(Event::Closed { restart });
            }
        }
    }

    pub(super) fn on_ack_frame(&mut self, now: Time, a: &packet::AckFrame<'_>) {
        let i = usize::from(a.path);
        let max_ack_delay = self.tuning.max_ack_delay;
        let Some(p) = self.paths.get_mut(i) else {
            self.counters.protocol_violations += 1;
            return;
        };
        if p.state == PathState::Retired {
            // Its packets were declared lost when it was removed.
            return;
        }
        let acked = std::mem::take(&mut self.acked);
        let Some(mut res) = p.recovery.on_ack(now, a, &mut p.rtt, max_ack_delay, acked) else {
            self.counters.protocol_violations += 1;
            return;
        };
        if let Some(peer) = self.session.peer.as_mut() {
            // An ACK of a packet under our current key: the peer reads it.
            peer.keys.tx.on_acked(i, a.largest(), now);
        }
        if !res.acked.is_empty() {
            p.last_ack_rx = now;
            p.pto_count = 0;
            if p.state != PathState::Up {
                p.state = PathState::Up;
                self.push_event(Event::PathUp(i));
            }
        }
        let p = &mut self.paths[i];
        for sp in res.acked.drain(..) {
            p.note_loss_sample(false);
            for f in &sp.frames {
                match *f {
                    SentFrame::Data { flow, seq, frag } => {
                        self.send.on_acked(now, flow, seq, frag, &mut self.pool)
                    }
                    SentFrame::Fin { flow } => self.send.on_fin_acked(flow),
                    SentFrame::Credit { .. } => {}
                }
            }
            self.frame_lists.put(sp.frames);
        }
        self.acked = std::mem::take(&mut res.acked);
        if res.bytes_acked > 0 {
            let sample = AckSample {
                now,
                rtt: res.rtt_sample.unwrap_or(p.rtt.smoothed()),
                srtt: p.rtt.smoothed(),
                min_rtt: p.rtt.min(),
                bytes_acked: res.bytes_acked,
                delivery_rate: res.delivery_rate,
                app_limited: res.app_limited,
                prior_delivered: res.prior_delivered,
                delivered: p.recovery.delivered,
                bytes_in_flight: p.recovery.bytes_in_flight,
            };
            p.cc.on_ack(&sample);
        }
        self.on_lost(now, i, res.lost);
    }

    pub(super) fn on_lost(&mut self, now: Time, i: usize, lost: Vec<SentPacket>) {
        if lost.is_empty() {
            return;
        }
        let mut bytes = 0;
        for sp in lost {
            let p = &mut self.paths[i];
            p.counters.packets_lost += 1;
            p.counters.bytes_lost += u64::from(sp.size);
            p.note_loss_sample(true);
            bytes += u64::from(sp.size);
            self.requeue_frames(sp);
        }
        let p = &mut self.paths[i];
        p.cc.on_loss(now, bytes, p.recovery.bytes_in_flight);
    }

    /// Queues the data, credits and FIN a packet carried again (it was lost,
    /// or its path removed), and recycles its frame list.
    pub(super) fn requeue_frames(&mut self, sp: SentPacket) {
        for &f in &sp.frames {
            match f {
                SentFrame::Data { flow, seq, frag } => self.send.on_lost(flow, seq, frag),
                SentFrame::Credit { flow } => self.recv.requeue_credit(flow),
                SentFrame::Fin { flow } => self.send.on_fin_lost(flow),
            }
        }
        self.frame_lists.put(sp.frames);
    }
}
