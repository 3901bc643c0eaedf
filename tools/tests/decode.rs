//! soya-decode on captures taken with a snap length (`tcpdump -s 128`): a
//! frame whose original length exceeds what was kept has its headers
//! decoded, is marked truncated, and skips the ICRC check; whole frames of
//! the same capture are still checked. The captures are generated here.

#![deny(unsafe_code)]

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use soya_proto::roce::builders::{ack, request, ReplyTo};
use soya_proto::roce::{IpHeader, Opcode, Psn, Reth, RocePacket};

const BIN: &str = env!("CARGO_BIN_EXE_soya-decode");
const SNAP: usize = 128;

fn ip() -> IpHeader {
    IpHeader::v4(Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 2, 1))
}

/// An Ethernet frame around an IP packet.
fn ether(ip_packet: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(ip_packet);
    f
}

/// The frames of a small RC exchange: a 1 KiB WRITE ONLY (cut by the snap
/// length), a 16 B SEND ONLY (shorter than the snap length: whole), the
/// responder's ACK (whole), and a WRITE ONLY cut inside its RETH (`headers`).
fn frames() -> Vec<Vec<u8>> {
    let reth = Reth {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        len: 1024,
    };
    let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    let write = request(ip(), 0x11, Opcode::RC_WRITE_ONLY, Psn::new(100), true, reth)
        .to_vec(&payload)
        .unwrap();
    let send = request(
        ip(),
        0x11,
        Opcode::RC_SEND_ONLY,
        Psn::new(101),
        true,
        Reth::default(),
    )
    .to_vec(&[0xab; 16])
    .unwrap();
    let req = RocePacket::parse(&write).unwrap();
    let ackp = ack(&ReplyTo::answering(&req, 0x22), Psn::new(101), 2)
        .to_vec(&[])
        .unwrap();
    let write2 = request(ip(), 0x11, Opcode::RC_WRITE_ONLY, Psn::new(102), true, reth)
        .to_vec(&payload)
        .unwrap();
    vec![ether(&write), ether(&send), ether(&ackp), ether(&write2)]
}

/// Writes `frames` as a capture, each cut at `snap[i]` bytes (as tcpdump
/// does: orig_len stays the frame's length).
fn write_pcap(path: &Path, frames: &[Vec<u8>], snap: &[usize]) {
    let header = PcapHeader {
        snaplen: SNAP as u32,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(File::create(path).unwrap(), header).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let kept = &f[..f.len().min(snap[i])];
        let pkt = PcapPacket::new(Duration::from_millis(i as u64), f.len() as u32, kept);
        w.write_packet(&pkt).unwrap();
    }
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("soya-decode-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(path: &Path, json: bool) -> (bool, String, String) {
    let mut c = Command::new(BIN);
    c.arg(path);
    if json {
        c.arg("--json");
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn snaplen_capture_decodes_headers_and_skips_the_icrc_of_cut_frames() {
    let path = tmp("snap128.pcap");
    // the last frame is cut inside its RETH (14 + 20 + 8 + 12 + 4 bytes)
    write_pcap(&path, &frames(), &[SNAP, SNAP, SNAP, 58]);
    let (ok, out, err) = run(&path, true);
    assert!(ok, "soya-decode failed on a snaplen capture:\n{out}\n{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "one row per RoCE frame:\n{out}");

    // 1: WRITE ONLY cut at 128 B: headers decoded, payload marked cut
    let w = &rows[0];
    assert_eq!(w["frame"], 1);
    assert_eq!(w["opcode"], Opcode::RC_WRITE_ONLY.0);
    assert_eq!(w["dest_qp"], 0x11);
    assert_eq!(w["psn"], 100);
    assert_eq!(w["ack_req"], true);
    assert_eq!(w["reth_len"], 1024);
    assert_eq!(w["payload_len"], 1024, "the wire length, not the kept one");
    assert_eq!(w["truncated"], true);
    assert_eq!(w["captured_payload_len"], SNAP - 14 - 20 - 8 - 12 - 16);
    assert!(w["icrc_ok"].is_null(), "ICRC of a cut frame is not checked");

    // 2, 3: whole frames (shorter than the snap length): ICRC checked
    for (r, op, psn) in [
        (&rows[1], Opcode::RC_SEND_ONLY, 101),
        (&rows[2], Opcode::RC_ACK, 101),
    ] {
        assert_eq!(r["opcode"], op.0);
        assert_eq!(r["psn"], psn);
        assert_eq!(r["truncated"], false);
        assert_eq!(r["icrc_ok"], true, "{r}");
    }

    // 4: cut inside the RETH: reported, not decoded from zero fill
    assert_eq!(rows[3]["frame"], 4);
    assert_eq!(rows[3]["headers_cut"]["kept"], 58 - 14);
    assert_eq!(rows[3]["headers_cut"]["needed"], 20 + 8 + 12 + 16);

    let (ok, table, err) = run(&path, false);
    assert!(ok);
    assert!(
        table.contains("cut payload=58/1024 icrc=unchecked"),
        "{table}"
    );
    assert!(err.contains("1 cut by the snap length"), "{err}");
    assert!(err.contains("1 cut inside their headers"), "{err}");
}

#[test]
fn a_whole_frame_with_a_bad_icrc_still_fails_in_a_snaplen_capture() {
    let path = tmp("snap128-bad.pcap");
    let mut f = frames();
    // corrupt the SEND's payload: it is whole, so its ICRC must be checked
    let n = f[1].len();
    f[1][n - 10] ^= 0xff;
    write_pcap(&path, &f, &[SNAP, SNAP, SNAP, SNAP]);
    let (ok, out, err) = run(&path, false);
    assert!(!ok, "a bad ICRC on a whole frame must fail:\n{out}\n{err}");
    assert!(out.contains("icrc=BAD"), "{out}");
    assert!(err.contains("1 malformed or bad ICRC"), "{err}");
}
