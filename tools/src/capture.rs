//! Reading RoCEv2 captures (pcap, Ethernet or raw-IP link types).

use std::fs::File;
use std::path::Path;

use pcap_file::pcap::PcapReader;
use pcap_file::DataLink;
use serde::Serialize;
use soya::roce::{ethernet_payload, RocePacket, WireError};

/// One frame of a capture: its number (1-based, as tshark counts) and IP bytes.
pub struct Frame {
    pub number: usize,
    /// The IP packet (link-layer header removed), or why there is none.
    pub ip: Result<Vec<u8>, WireError>,
}

/// Reads every frame of a pcap file.
pub fn read_frames(path: &Path) -> Result<Vec<Frame>, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reader = PcapReader::new(file).map_err(|e| format!("{}: {e}", path.display()))?;
    let link = reader.header().datalink;
    let mut frames = Vec::new();
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.map_err(|e| format!("{}: {e}", path.display()))?;
        let ip = match link {
            DataLink::ETHERNET => ethernet_payload(&pkt.data).map(<[u8]>::to_vec),
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Ok(pkt.data.to_vec()),
            other => {
                return Err(format!(
                    "{}: unsupported link type {other:?}",
                    path.display()
                ))
            }
        };
        frames.push(Frame {
            number: frames.len() + 1,
            ip,
        });
    }
    Ok(frames)
}

/// The fields tshark also shows, for comparing decoders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decoded {
    pub frame: usize,
    pub opcode: u8,
    pub opcode_name: &'static str,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub reth_len: Option<u32>,
    pub payload_len: usize,
    pub icrc_ok: bool,
}

impl Decoded {
    pub fn of(frame: usize, p: &RocePacket<'_>) -> Decoded {
        Decoded {
            frame,
            opcode: p.bth.opcode.0,
            opcode_name: p.info.name,
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            reth_len: p
                .ext
                .present
                .contains(soya::roce::Headers::RETH)
                .then_some(p.ext.reth.len),
            payload_len: p.payload().len(),
            icrc_ok: p.verify_icrc().is_ok(),
        }
    }
}
