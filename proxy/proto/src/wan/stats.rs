//! Snapshots of the transport and of each path, for status and metrics.

use super::*;

/// Snapshot of one path.
#[derive(Clone, Debug, PartialEq)]
pub struct PathStats {
    pub name: String,
    pub state: PathState,
    pub srtt: Duration,
    pub min_rtt: Duration,
    pub rttvar: Duration,
    /// Recent fraction of packets lost (exponentially weighted).
    pub loss_rate: f64,
    pub cwnd: u64,
    pub pacing_rate_bps: u64,
    pub bytes_in_flight: u64,
    pub counters: PathCounters,
}

/// Snapshot of the connection.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnStats {
    pub generation: u64,
    pub peer_generation: Option<u64>,
    /// Largest datagram the twin says it sends (its `max_datagram`): a
    /// mismatch with ours hints at a path MTU misconfiguration.
    pub peer_max_datagram: Option<u16>,
    pub connected: bool,
    /// The session's packet AEAD (`None`: no session, or lab mode).
    pub cipher: Option<Cipher>,
    /// Flows this side sends on now (live and closing).
    pub flows: usize,
    /// Flows this side closed and forgot (FIN acknowledged).
    pub flows_retired: u64,
    /// Flows of the peer open here (receiving).
    pub recv_flows: usize,
    /// Flows of the peer closed here (FIN delivered).
    pub recv_flows_closed: u64,
    /// Ranges of closed peer flow ids remembered (bounded: `flow`).
    pub recv_closed_ranges: usize,
    /// Fragmented messages whose packet had to be moved once more in its
    /// reassembly buffer (fragment 0 came late and the header length was
    /// guessed wrong: `flow::recv`).
    pub recv_reassembly_moves: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_lost: u64,
    pub packets_retransmitted: u64,
    /// Protected packets that authenticated and parsed.
    pub packets_accepted: u64,
    pub hellos_accepted: u64,
    pub messages_queued: u64,
    pub messages_delivered: u64,
    pub bytes_delivered: u64,
    /// Messages dropped because the peer restarted before they were acked.
    pub messages_discarded: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub datagrams_dropped: u64,
    pub auth_failures: u64,
    pub replays_dropped: u64,
    pub malformed: u64,
    /// Protected packets of another generation than the peer's current one.
    pub stale_generation: u64,
    /// Protected packets before any session existed.
    pub no_session: u64,
    pub role_conflicts: u64,
    /// HELLOs refused because the twin offers no cipher we accept.
    pub cipher_mismatches: u64,
    /// Identity mode: handshake messages that did not authenticate
    /// (sealed to another static key, another PSK, forged) or HELLOs of a
    /// PSK-only twin.
    pub handshake_failures: u64,
    /// Identity mode: INITIATIONs from a static key other than the twin's.
    pub unknown_peer_keys: u64,
    /// Identity mode: handshake messages that changed nothing (copies).
    pub stale_handshakes: u64,
    /// Datagrams of another protocol version (a twin of another release;
    /// also counted in `malformed`).
    pub wrong_version: u64,
    /// Frames that broke the protocol after authenticating (credit overrun…).
    pub protocol_violations: u64,
    pub peer_restarts: u64,
    pub events_dropped: u64,
    /// Packets sealed under the current sending key (0 without a session).
    pub tx_key_packets: u64,
    /// Packets the sending key may seal at most (the AEAD's limit for our
    /// datagram size; `u64::MAX` in lab mode, 0 without a session).
    pub tx_key_limit: u64,
    /// Sending-key updates (`keyphase`), over the connection's life.
    pub tx_key_updates: u64,
    /// Updates of the twin's key seen, over the connection's life.
    pub rx_key_updates: u64,
    /// Packets of the twin opened with its key before the last update
    /// (sent before it, arrived after: reordering across the switch).
    pub rx_key_previous: u64,
    /// Identity mode: re-handshakes completed (a fresh DH inside the
    /// session: `session::rekey`).
    pub rekeys: u64,
    /// Protected packets that failed to authenticate under the twin's
    /// current key since its last update (the integrity limit counts them).
    pub rx_key_failures: u64,
    /// Sessions closed because the twin's key met the integrity limit.
    pub integrity_limit_closes: u64,
    /// Sends held back with the sending key at its limit (the update not
    /// allowed yet: the twin acknowledged nothing under the current key).
    pub key_exhausted: u64,
    /// Bytes held for sending or retransmission.
    pub send_buffered: u64,
    /// Bytes in receive reorder buffers.
    pub recv_buffered: u64,
    pub paths: Vec<PathStats>,
}

impl WanConnection {
    // ----- statistics -----

    pub fn stats(&self) -> ConnStats {
        let paths: Vec<PathStats> = self
            .paths
            .iter()
            .map(|p| PathStats {
                name: p.name.clone(),
                state: p.state,
                srtt: p.rtt.smoothed(),
                min_rtt: p.rtt.min(),
                rttvar: p.rtt.var(),
                loss_rate: p.loss_ewma,
                cwnd: p.cc.cwnd(),
                pacing_rate_bps: p.cc.pacing_rate(),
                bytes_in_flight: p.recovery.bytes_in_flight,
                counters: PathCounters {
                    spurious_losses: p.recovery.spurious_losses,
                    ..p.counters.clone()
                },
            })
            .collect();
        let sum = |f: fn(&PathCounters) -> u64| paths.iter().map(|p| f(&p.counters)).sum();
        let c = &self.counters;
        let keys = self.session.peer.as_ref().map(|p| &p.keys);
        ConnStats {
            generation: self.generation(),
            peer_generation: self.session.peer.as_ref().map(|p| p.generation),
            peer_max_datagram: self.session.peer.as_ref().map(|p| p.max_datagram),
            connected: self.is_connected(),
            cipher: self.session.peer.as_ref().and_then(|p| p.keys.cipher()),
            flows: self.send.flow_count(),
            flows_retired: self.send.flows_retired,
            recv_flows: self.recv.flow_count(),
            recv_flows_closed: self.recv.flows_closed,
            recv_closed_ranges: self.recv.closed_ranges(),
            recv_reassembly_moves: self.recv.misplaced,
            packets_sent: sum(|c| c.packets_sent),
            packets_received: sum(|c| c.packets_received),
            packets_lost: sum(|c| c.packets_lost),
            packets_retransmitted: sum(|c| c.packets_retransmitted),
            packets_accepted: c.packets_accepted,
            hellos_accepted: c.hellos_accepted,
            messages_queued: self.send.messages_queued,
            messages_delivered: c.messages_delivered,
            bytes_delivered: c.bytes_delivered,
            messages_discarded: self.send.messages_discarded,
            datagrams_sent: self.dsend.sent,
            datagrams_received: c.datagrams_received,
            datagrams_dropped: self.dsend.dropped + self.drecv.evicted + self.drecv.inconsistent,
            auth_failures: c.auth_failures,
            replays_dropped: c.replays_dropped,
            malformed: c.malformed,
            stale_generation: c.stale_generation,
            no_session: c.no_session,
            role_conflicts: c.role_conflicts,
            cipher_mismatches: c.cipher_mismatches,
            handshake_failures: c.handshake_failures,
            unknown_peer_keys: c.unknown_peer_keys,
            stale_handshakes: c.stale_handshakes,
            wrong_version: c.wrong_version,
            protocol_violations: c.protocol_violations
                + self.recv.offset_mismatches
                + self.recv.closed_overflow,
            peer_restarts: c.peer_restarts,
            events_dropped: c.events_dropped,
            tx_key_packets: keys.map_or(0, |k| k.tx.sealed),
            tx_key_limit: keys.map_or(0, |k| k.tx.policy().hard_limit),
            tx_key_updates: c.tx_key_updates,
            rx_key_updates: c.rx_key_updates,
            rx_key_previous: c.rx_key_previous,
            rekeys: self.session.rekeys_done(),
            rx_key_failures: keys.map_or(0, |k| k.rx.failures),
            integrity_limit_closes: c.integrity_limit_closes,
            key_exhausted: c.key_exhausted,
            send_buffered: self.send.buffered,
            recv_buffered: self.recv.buffered_bytes(),
            paths,
        }
    }
}
