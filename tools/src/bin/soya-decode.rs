//! `soya-decode`: print the RoCEv2 packets of a capture as Sōya parses them,
//! with ICRC verification and RDMA-CM decoding.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use soya::roce::{cm, is_roce, RocePacket};
use soya_tools::capture::{read_frames, Decoded};

/// Decode RoCEv2 packets in a pcap file and verify every ICRC.
#[derive(Parser)]
#[command(name = "soya-decode", version, about)]
struct Args {
    /// Capture file (pcap; Ethernet or raw IP).
    file: PathBuf,
    /// One JSON object per RoCE packet instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let frames = match read_frames(&args.file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("soya-decode: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut roce, mut bad) = (0, 0);
    for f in &frames {
        let Ok(ip) = &f.ip else { continue };
        if !is_roce(ip) {
            continue;
        }
        roce += 1;
        match RocePacket::parse(ip) {
            Ok(p) => {
                let d = Decoded::of(f.number, &p);
                if !d.icrc_ok {
                    bad += 1;
                }
                if args.json {
                    println!("{}", serde_json::to_string(&d).expect("serializable"));
                    continue;
                }
                let cm = cm::parse_packet(&p)
                    .map(|m| format!(" CM {m:?}"))
                    .unwrap_or_default();
                println!(
                    "{:5} {} -> {} {:<32} qp={:#08x} psn={:<8} {}{}{}{}",
                    f.number,
                    p.ip.src(),
                    p.ip.dst(),
                    p.info.name,
                    d.dest_qp,
                    d.psn,
                    if d.ack_req { "A " } else { "" },
                    d.reth_len.map(|l| format!("len={l} ")).unwrap_or_default(),
                    if d.icrc_ok { "icrc=ok" } else { "icrc=BAD" },
                    cm
                );
            }
            Err(e) => {
                bad += 1;
                println!("{:5} malformed: {e}", f.number);
            }
        }
    }
    eprintln!(
        "{}: {} frames, {roce} RoCEv2, {bad} malformed or bad ICRC",
        args.file.display(),
        frames.len()
    );
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
