//! Cross-check the decoder against Wireshark's: for every RoCE frame of the
//! vectors and lab captures, opcode, destination QP, PSN, AckReq and RETH
//! length must agree with what `tshark` prints.
//!
//! Runs where tshark is installed (`.ci/run` installs it). Without tshark
//! the test fails under CI (CI=true or SOYA_REQUIRE_TSHARK=1) and otherwise
//! says it skipped.

#![deny(unsafe_code)]

use std::path::Path;
use std::process::Command;

use soya::roce::{is_roce, RocePacket};
use soya_integration_tests::{lab_captures, shared_dir};
use soya_tools::capture::{read_frames, Decoded};

const FIELDS: [&str; 6] = [
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.reth.dmalen",
];

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// (frame, opcode, destqp, psn, ackreq, reth len) as tshark decodes them.
fn tshark_rows(path: &Path) -> Vec<(usize, u8, u32, u32, bool, Option<u32>)> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(path)
        .args(["-Y", "infiniband", "-T", "fields", "-E", "separator=,"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            let num = |s: &str| -> u32 {
                let s = s.trim();
                match s.strip_prefix("0x") {
                    Some(h) => u32::from_str_radix(h, 16).unwrap(),
                    None => s.parse().unwrap(),
                }
            };
            (
                num(c[0]) as usize,
                num(c[1]) as u8,
                num(c[2]),
                num(c[3]),
                num(c[4]) != 0,
                (!c[5].is_empty()).then(|| num(c[5])),
            )
        })
        .collect()
}

#[test]
fn decoder_agrees_with_tshark_on_every_frame() {
    if !tshark_available() {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var_os("SOYA_REQUIRE_TSHARK").is_some();
        assert!(
            !required,
            "tshark is required here but not installed (apt-get install tshark)"
        );
        eprintln!("SKIPPED: tshark not installed; the tshark cross-check did not run");
        return;
    }
    let mut files = lab_captures();
    files.push(shared_dir().join("protocol/vectors.pcap"));
    let mut compared = 0;
    for path in files {
        let theirs = tshark_rows(&path);
        let ours: Vec<_> = read_frames(&path)
            .unwrap()
            .into_iter()
            .filter_map(|f| {
                let ip = f.ip.ok()?;
                if !is_roce(&ip) {
                    return None;
                }
                let p = RocePacket::parse(&ip).expect("parses");
                let d = Decoded::of(f.number, &p);
                Some((d.frame, d.opcode, d.dest_qp, d.psn, d.ack_req, d.reth_len))
            })
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{}: frame count", path.display());
        for (o, t) in ours.iter().zip(&theirs) {
            assert_eq!(
                o,
                t,
                "{}: (frame, opcode, qp, psn, ackreq, reth_len)",
                path.display()
            );
        }
        compared += ours.len();
    }
    assert!(compared > 1000, "{compared}");
    eprintln!("compared {compared} frames with tshark");
}
