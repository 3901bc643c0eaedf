//! Every `[buffer]` rule, broken once (split from `errors.rs`, same
//! helpers): the diagnostic must name the right line, the key path and
//! what would be accepted.

#![deny(unsafe_code)]

mod common;

use common::*;

#[test]
fn buffer_auto_needs_rate_and_rtt() {
    let text = edit("rate = \"10gbit\"\nrtt = \"3ms\"\n", "");
    let err = error_of(&text);
    let header = line_of(&text, "[[wan.paths]]");
    for key in ["wan.paths[0].rate", "wan.paths[0].rtt"] {
        assert!(
            err.contains(&format!("test.toml:{header}:1: {key}: missing; buffer.size = \"auto\" (the default) needs rate and rtt (or distance_km) on every WAN path; set them, or give an explicit buffer.size like \"512MiB\"")),
            "{err}"
        );
    }
    // An explicit size makes rate and rtt optional.
    let ok = format!("{text}[buffer]\nsize = \"512MiB\"\n");
    assert_eq!(
        soya_config::parse_str(&ok, "t").unwrap().buffer.bytes,
        512 << 20
    );
}

#[test]
fn buffer_size_units_and_bounds() {
    let text = append("[buffer]\nsize = \"4G\"\n");
    expect_error(
        &text,
        "size",
        "buffer.size",
        &["unknown size unit \"G\"", "KiB/MiB/GiB/TiB"],
    );
    let text = append("[buffer]\nsize = 65535\n");
    expect_error(
        &text,
        "size",
        "buffer.size",
        &["below the minimum of 16 slots x 4608 bytes = 73728 bytes"],
    );
    let text = append("[buffer]\nsize = \"2TiB\"\n");
    expect_error(
        &text,
        "size",
        "buffer.size",
        &["exceeds the maximum of 1 TiB"],
    );
    let text = append("[buffer]\nsize = -5\n");
    expect_error(&text, "size", "buffer.size", &["must not be negative"]);
    // Auto sizes are bounded too: 10 Tbit/s × 10 s × 16 is petabytes.
    let text = edit(
        "rate = \"10gbit\"\nrtt = \"3ms\"",
        "rate = \"10tbit\"\nrtt = \"10s\"",
    ) + "[buffer]\nsize = \"auto\"\nsafety_factor = 16\n";
    expect_error(
        &text,
        "size = \"auto\"",
        "buffer.size",
        &[
            "auto size",
            "exceeds the maximum of 1 TiB",
            "lower safety_factor",
        ],
    );
}

#[test]
fn buffer_tunables() {
    let text = append("[buffer]\nsafety_factor = 0.5\n");
    expect_error(
        &text,
        "safety_factor",
        "buffer.safety_factor",
        &["safety_factor must be a number 1.0..=16.0"],
    );
    let text = append("[buffer]\nslot_bytes = 512\n");
    expect_error(
        &text,
        "slot_bytes",
        "buffer.slot_bytes",
        &["slot_bytes must be an integer 1024..=16384"],
    );
    // Above what a packet slab slot can hold (65535): refused here, never
    // silently capped by the slab.
    for big in ["16385", "65536", "70000"] {
        let text = append(&format!("[buffer]\nslot_bytes = {big}\n"));
        expect_error(
            &text,
            "slot_bytes",
            "buffer.slot_bytes",
            &["slot_bytes must be an integer 1024..=16384"],
        );
    }
    let text = append("[buffer]\nsize = \"64MiB\"\nper_flow_quota = \"1GiB\"\n");
    expect_error(
        &text,
        "per_flow_quota",
        "buffer.per_flow_quota",
        &["per_flow_quota 1 GiB (1073741824 bytes) exceeds the buffer size 64 MiB"],
    );
    let text = append("[buffer]\nper_flow_quota = 100\n");
    expect_error(
        &text,
        "per_flow_quota",
        "buffer.per_flow_quota",
        &["at least one slot (4608 bytes)"],
    );
    let text = append("[buffer]\nper_flow_quota = \"lots\"\n");
    expect_error(
        &text,
        "per_flow_quota",
        "buffer.per_flow_quota",
        &["cannot read \"lots\"", "\"512MiB\""],
    );
}

#[test]
fn buffer_requester_reserve() {
    for (line, why) in [
        ("requester_window = 0", "0 bytes is out of range"),
        (
            "requester_window = \"2GiB\"",
            "2 GiB (2147483648 bytes) is out of range",
        ),
        ("requester_window = -1", "must not be negative"),
        (
            "requester_window = \"8 megs\"",
            "unknown size unit \"megs\"",
        ),
    ] {
        let text = append(&format!("[buffer]\n{line}\n"));
        expect_error(&text, "requester_window", "buffer.requester_window", &[why]);
    }
    let text = append("[buffer]\nrequester_window = 0\n");
    expect_error(
        &text,
        "requester_window",
        "buffer.requester_window",
        &["send-queue depth x message size", "must be 1 byte to 1 GiB"],
    );
    for n in ["-1", "65537"] {
        let text = append(&format!("[buffer]\nrequesters = {n}\n"));
        expect_error(
            &text,
            "requesters",
            "buffer.requesters",
            &["requesters must be an integer 0..=65536 (the QPs expected at their full window at once)"],
        );
    }
    let text = append("[buffer]\nrequesters = \"16\"\n");
    expect_error(
        &text,
        "requesters",
        "buffer.requesters",
        &["an integer 0..=65536"],
    );
    // The reserve counts toward the 1 TiB ceiling of an auto size:
    // 65,536 × 1 GiB windows.
    let text =
        append("[buffer]\nsize = \"auto\"\nrequesters = 65536\nrequester_window = \"1GiB\"\n");
    expect_error(
        &text,
        "size = \"auto\"",
        "buffer.size",
        &[
            "exceeds the maximum of 1 TiB",
            "buffer.requesters x requester_window",
        ],
    );
}
