//! `soya-decode`: print the RoCEv2 packets of a capture as Sōya parses them,
//! with ICRC verification and RDMA-CM decoding. Captures taken with a snap
//! length (`tcpdump -s 128`) are decoded as far as their bytes go: frames
//! the snap length cut are marked `cut`, their ICRC is not checked.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use soya_proto::roce::{cm, is_roce};
use soya_tools::capture::{decode, read_frames, Decoded, RoceFrame};

/// Decode RoCEv2 packets in a pcap file and verify every ICRC.
///
/// A capture taken with a snap length (tcpdump -s N) is fine: a frame it cut
/// has its headers decoded, is marked "cut" (payload kept/length), and its
/// ICRC is not checked (the bytes it covers are gone). Exit status 1 when a
/// whole frame is malformed or fails its ICRC.
#[derive(Parser)]
#[command(name = "soya-decode", version, about, long_about)]
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
    let (mut roce, mut bad, mut truncated, mut headers_cut) = (0, 0, 0, 0);
    for f in &frames {
        let Some(ip) = f.restored() else { continue };
        if !is_roce(&ip) {
            continue;
        }
        roce += 1;
        match decode(&ip, f.cut) {
            RoceFrame::Decoded {
                packet: p,
                truncated: cut,
                kept_payload,
            } => {
                let d = Decoded::cut(f.number, &p, cut, kept_payload);
                if cut {
                    truncated += 1;
                }
                if d.icrc_ok == Some(false) {
                    bad += 1;
                }
                if args.json {
                    println!("{}", serde_json::to_string(&d).expect("serializable"));
                    continue;
                }
                // A cut MAD would decode its zero fill: only whole payloads.
                let cm = (!cut)
                    .then(|| cm::parse_packet(&p).ok())
                    .flatten()
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
                    match d.icrc_ok {
                        Some(true) => "icrc=ok".to_string(),
                        Some(false) => "icrc=BAD".to_string(),
                        None => format!(
                            "cut payload={}/{} icrc=unchecked",
                            d.captured_payload_len, d.payload_len
                        ),
                    },
                    cm
                );
            }
            RoceFrame::HeadersCut { kept, needed } => {
                headers_cut += 1;
                if args.json {
                    let v = serde_json::json!({
                        "frame": f.number, "truncated": true,
                        "headers_cut": {"kept": kept, "needed": needed},
                    });
                    println!("{v}");
                } else {
                    println!(
                        "{:5} headers cut by the snap length: {kept} of {needed} header bytes kept",
                        f.number
                    );
                }
            }
            RoceFrame::Malformed(e) => {
                bad += 1;
                println!("{:5} malformed: {e}", f.number);
            }
        }
    }
    eprintln!(
        "{}: {} frames, {roce} RoCEv2, {bad} malformed or bad ICRC, \
         {truncated} cut by the snap length (ICRC not checked){}",
        args.file.display(),
        frames.len(),
        if headers_cut > 0 {
            format!(", {headers_cut} cut inside their headers (not decoded)")
        } else {
            String::new()
        }
    );
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
