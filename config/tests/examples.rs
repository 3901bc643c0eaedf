//! The shipped example configs: they load, they describe a consistent pair of
//! twins, and their derived values match numbers computed by hand.

#![deny(unsafe_code)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use soya_config::*;

fn example_text(name: &str) -> String {
    std::fs::read_to_string(examples_dir().join(format!("{name}.toml"))).unwrap()
}

fn parse_example(name: &str) -> SiteConfig {
    parse_str(&example_text(name), &format!("config/examples/{name}.toml"))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Loads example `name` from disk with its key at `key_mode`: the config,
/// and the folder that holds the files while it lives. Each example names
/// its site after its file.
#[cfg(unix)]
fn load_example(name: &str, key_mode: u32) -> (TempDir, SiteConfig) {
    let (dir, path) = staged_example(name, key_mode);
    let cfg = load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(cfg.site, name);
    (dir, cfg)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[cfg(unix)]
#[test]
fn sapporo_loads_with_everything_resolved() {
    let (dir, cfg) = load_example("sapporo", 0o600);
    assert_eq!(
        cfg.dc.backend,
        DcBackend::Tun {
            interface: "soya0".into()
        }
    );
    let p = |s: &str| s.parse::<Prefix>().unwrap();
    assert_eq!(
        cfg.dc.local_prefixes,
        vec![p("10.1.0.0/16"), p("fd00:1::/48")]
    );
    assert_eq!(
        cfg.dc.remote_prefixes,
        vec![p("10.2.0.0/16"), p("fd00:2::/48")]
    );
    // The relative key_file is resolved against the config file's directory.
    assert_eq!(
        cfg.wan.security,
        WanSecurity::PreSharedKey {
            key_file: dir.path().join("psk.key")
        }
    );
    assert_eq!(
        cfg.wan.bind,
        vec![addr("192.0.2.10:7400"), addr("192.0.2.20:7400")]
    );

    let coast = &cfg.wan.paths[0];
    assert_eq!(coast.name, "coast-dwdm");
    assert_eq!(
        (coast.bind, coast.remote),
        (addr("192.0.2.10:7400"), addr("198.51.100.10:7400"))
    );
    assert_eq!(coast.rate_bps, Some(100_000_000_000));
    assert_eq!((coast.dscp, coast.weight), (46, 10));
    // 2 × 4.9 µs × 300 km = 2940 µs.
    assert_eq!(coast.rtt, Some(Duration::from_micros(2_940)));

    let inland = &cfg.wan.paths[1];
    assert_eq!(inland.name, "inland-backup");
    assert_eq!(inland.bind, addr("192.0.2.20:7400"));
    assert_eq!(inland.rate_bps, Some(10_000_000_000));
    // 2 × 4.9 µs × 380 km = 3724 µs.
    assert_eq!(inland.rtt, Some(Duration::from_micros(3_724)));

    // auto = (100 + 10) Gbit/s × 3.724 ms (the larger RTT) × 3.0 / 8
    //      = 110e9 × 3.724e-3 × 3 / 8 = 153_615_000 bytes (data in flight)
    //      + 16 requesters × (8 MiB / 4096 B = 2048 packets) × 4608 B
    //      = 150_994_944 bytes (their windows)
    //      = 304_609_944 → rounded up to MiB: ceil(/ 1_048_576) = 291 MiB.
    assert_eq!(cfg.buffer.bytes, 291 * 1_048_576);
    assert_eq!(cfg.buffer.bytes, 305_135_616);
    assert_eq!(
        cfg.buffer.sizing,
        BufferSizing::Auto {
            total_rate_bps: 110_000_000_000,
            max_rtt: Duration::from_micros(3_724),
            bdp_part_bytes: 153_615_000,
            reserve_bytes: 150_994_944,
            unrounded_bytes: 304_609_944,
        }
    );
    assert_eq!(cfg.buffer.slot_bytes, 4608);
    assert_eq!(cfg.buffer.slots, 66_218); // floor(305_135_616 / 4608)
    assert_eq!(cfg.buffer.requester_window, 8 * 1_048_576);
    assert_eq!(cfg.buffer.requester_window_slots, 2048);
    assert_eq!(cfg.buffer.requesters, 16);
    assert_eq!(cfg.buffer.per_flow_quota, Some(32 * 1_048_576));

    assert_eq!(cfg.pseudo_ack.policy, AckPolicy::Edge);
    assert_eq!(cfg.pseudo_ack.coalesce_packets, 16);
    assert_eq!(cfg.pseudo_ack.coalesce, Duration::from_micros(20));
    assert!(cfg.pseudo_ack.cnp_on_backpressure);
    assert_eq!(cfg.control.metrics, Some(addr("127.0.0.1:9464")));
    assert_eq!(cfg.control.socket, Path::new("/run/soya/sapporo.sock"));
    assert_eq!(
        cfg.log,
        LogConfig {
            format: LogFormat::Human,
            level: LogLevel::Info
        }
    );
    // The shipped pair still runs PSK-only (packaging generates a PSK):
    // that is the one warning.
    let w = cfg.warnings();
    assert!(w.len() == 1 && w[0].starts_with("PSK-only"), "{w:?}");
}

#[cfg(unix)]
#[test]
fn wakkanai_loads() {
    let (_dir, cfg) = load_example("wakkanai", 0o600);
    assert_eq!(cfg.buffer.bytes, 305_135_616); // symmetric links, same auto size
    assert_eq!(cfg.log.format, LogFormat::Json);
    // A group-readable key (root:soya 0640) is fine; only "other" is refused.
    load_example("wakkanai", 0o640);
}

/// The two production files describe one link seen from both ends.
#[test]
fn sapporo_and_wakkanai_are_twins() {
    let (s, w) = (parse_example("sapporo"), parse_example("wakkanai"));
    assert_eq!(s.dc.local_prefixes, w.dc.remote_prefixes);
    assert_eq!(s.dc.remote_prefixes, w.dc.local_prefixes);
    assert_eq!(s.wan.paths.len(), w.wan.paths.len());
    for sp in &s.wan.paths {
        let wp = w
            .wan
            .paths
            .iter()
            .find(|p| p.name == sp.name)
            .expect("same path names");
        assert_eq!(
            sp.remote, wp.bind,
            "{}: Sapporo must send to Wakkanai's socket",
            sp.name
        );
        assert_eq!(
            wp.remote, sp.bind,
            "{}: Wakkanai must send to Sapporo's socket",
            sp.name
        );
        assert_eq!(
            (sp.rate_bps, sp.rtt, sp.dscp),
            (wp.rate_bps, wp.rtt, wp.dscp)
        );
    }
}

#[test]
fn lab_pair_loads_and_is_consistent() {
    let (a, b) = (parse_example("lab-udp-a"), parse_example("lab-udp-b"));
    assert_eq!(
        a.dc.backend,
        DcBackend::Udp {
            listen: addr("127.0.0.10:4791")
        }
    );
    assert_eq!(
        b.dc.backend,
        DcBackend::Udp {
            listen: addr("127.0.0.20:4791")
        }
    );
    assert_eq!(
        a.wan.security,
        WanSecurity::Insecure {
            ignored_key_file: None
        }
    );
    assert_eq!(a.dc.local_prefixes, b.dc.remote_prefixes);
    for (pa, pb) in a.wan.paths.iter().zip(&b.wan.paths) {
        assert_eq!(pa.name, pb.name);
        assert_eq!((pa.remote, pb.remote), (pb.bind, pa.bind));
        assert!(pa.bind.ip().is_loopback() && pa.remote.ip().is_loopback());
    }
    assert_eq!(a.wan.paths[1].rtt, Some(Duration::from_micros(4_500)));
    assert_eq!(a.buffer.bytes, 64 * 1_048_576);
    assert_eq!(a.buffer.sizing, BufferSizing::Explicit);
    assert_ne!(a.control.metrics, b.control.metrics);
    assert_ne!(a.control.socket, b.control.socket);
    // Insecure configs need no key file, so `load` works straight from the repo.
    load(&examples_dir().join("lab-udp-a.toml")).unwrap_or_else(|e| panic!("{e}"));
    load(&examples_dir().join("lab-udp-b.toml")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn insecure_is_loud_in_explain() {
    let a = parse_example("lab-udp-a");
    let text = a.explain();
    assert!(text.starts_with("!!!!"), "{text}");
    assert!(
        text.contains("INSECURE WAN") && text.contains("PLAINTEXT"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("!!!!"),
        "banner repeated at the end:\n{text}"
    );
    assert!(a.warnings().iter().any(|w| w.contains("Lab use only")));
    assert!(!parse_example("sapporo").explain().contains("INSECURE"));
}

#[test]
fn explain_shows_derivations_and_defaults() {
    let text = parse_example("sapporo").explain();
    for want in [
        "Sōya site \"sapporo\"",
        "291 MiB (305135616 bytes)",
        "110 Gbit/s total rate x 3.724 ms max RTT x safety factor 3.0",
        "= 153615000 bytes",
        "+ 16 requesters x 2048 slots x 4608 bytes (their windows)",
        "= 150994944 bytes",
        "= 304609944 bytes, rounded up to a whole MiB",
        "requester_window 8 MiB (8388608 bytes) = 2048 packets of 4096 B",
        "2.94 ms (2 x 4.9 us/km x 300 km of fibre)",
        "198.51.100.10:7400",
        "dscp 46 (EF",
        "http://127.0.0.1:9464/metrics",
    ] {
        assert!(text.contains(want), "explain lacks {want:?}:\n{text}");
    }
    let minimal = parse_str(BASE, "t.toml").unwrap();
    assert_eq!(minimal.control.socket, Path::new("/run/soya/t.sock"));
    let text = minimal.explain();
    for want in [
        "tun device soya0  (default)",
        "bind[0]          0.0.0.0:7400  (default)",
        "metrics          disabled  (default)",
        "socket           /run/soya/t.sock  (default)",
        "level            info  (default)",
        "safety_factor    3.0  (default)",
        "requesters       16  (default)",
    ] {
        assert!(text.contains(want), "explain lacks {want:?}:\n{text}");
    }
}

/// Hand-computed auto sizes for other shapes than the examples.
#[test]
fn auto_buffer_size_by_hand() {
    // One path: 100 Gbit/s × 2·300 km·4.9 µs × 3.0 (the default) / 8
    //   = 1e11 × 2.94e-3 × 3 / 8 = 110_250_000 B, + the 16 windows'
    //   150_994_944 B = 261_244_944 B → ceil(/1 MiB) = 250 MiB.
    let one = edit(
        "rate = \"10gbit\"\nrtt = \"3ms\"",
        "rate = \"100gbit\"\ndistance_km = 300",
    );
    let cfg = parse_str(&one, "t.toml").unwrap();
    assert_eq!(cfg.buffer.bytes, 250 * 1_048_576);
    assert!(matches!(
        cfg.buffer.sizing,
        BufferSizing::Auto {
            bdp_part_bytes: 110_250_000,
            unrounded_bytes: 261_244_944,
            ..
        }
    ));

    // The lab pair with auto sizing: (800 + 200) Mbit/s × 4.5 ms × 3.0 / 8
    //   = 1_687_500 B, + 150_994_944 B = 152_682_444 B → 146 MiB.
    let lab = example_text("lab-udp-a").replace("size = \"64MiB\"", "size = \"auto\"");
    assert_eq!(
        parse_str(&lab, "lab.toml").unwrap().buffer.bytes,
        146 * 1_048_576
    );
    // Without the reserve (rxe requesters, whose 128-PSN windows the
    // engine sees and reserves for anyway): 1_687_500 B → 2 MiB, and its
    // 16MiB per-flow quota no longer fits.
    let lab = lab.replace("[buffer]\n", "[buffer]\nrequesters = 0\n");
    let err = parse_str(&lab, "lab.toml").unwrap_err().to_string();
    assert!(
        err.contains("buffer.per_flow_quota = \"16MiB\": per_flow_quota 16 MiB (16777216 bytes) exceeds the buffer size 2 MiB (2097152 bytes) (auto)"),
        "{err}"
    );
    let lab = lab.replace("per_flow_quota = \"16MiB\"", "");
    let cfg = parse_str(&lab, "lab.toml").unwrap();
    assert_eq!(cfg.buffer.bytes, 2 * 1_048_576);

    // safety_factor 1.0 and 10 Gbit/s × 3 ms: 3_750_000 B, + 150_994_944 B
    // = 154_744_944 B → 148 MiB.
    let cfg = parse_str(&append("[buffer]\nsafety_factor = 1.0\n"), "t.toml").unwrap();
    assert_eq!(cfg.buffer.bytes, 148 * 1_048_576);
    // Two requesters of a 1 MiB window at a 2 KiB MTU (slot 2,304 B):
    // 2 × 512 packets × 2,304 B = 2_359_296 B, + 3_750_000 → 6_109_296 B → 6 MiB.
    let cfg = parse_str(
        &append(
            "[buffer]\nsafety_factor = 1.0\nslot_bytes = 2304\nrequesters = 2\n\
             requester_window = \"1MiB\"\n",
        ),
        "t.toml",
    )
    .unwrap();
    assert_eq!(cfg.buffer.requester_window_slots, 512);
    assert_eq!(cfg.buffer.bytes, 6 * 1_048_576);
}

/// The example from the crate's brief, reproduced on a real file.
#[test]
fn bad_dscp_in_sapporo_is_pinpointed() {
    let text = example_text("sapporo").replacen("dscp = 10", "dscp = 70", 1);
    let line = line_of(&text, "dscp = 70");
    let err = parse_str(&text, "config/examples/sapporo.toml").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("config/examples/sapporo.toml:{line}:8: wan.paths[1].dscp = 70: DSCP must be an integer 0..=63")
    );
    assert_eq!(line, 114, "hand-checked position in sapporo.toml");
}

#[cfg(unix)]
#[test]
fn world_readable_key_is_rejected() {
    let (dir, path) = staged_example("sapporo", 0o644);
    let err = load(&path).unwrap_err().to_string();
    let key = dir.path().join("psk.key");
    let line = line_of(&example_text("sapporo"), "key_file = \"psk.key\"");
    let expected = format!(
        "{}:{line}:12: wan.key_file = \"psk.key\": key file {k} is world-readable (mode 0644); run chmod 600 {k}",
        path.display(),
        k = key.display()
    );
    assert_eq!(err, expected);
    // read_key_file on its own says the same, naming the file.
    let err = read_key_file(&key).unwrap_err().to_string();
    assert!(
        err.contains("world-readable (mode 0644); run chmod 600"),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn key_file_problems_point_at_wan_key_file() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, path) = staged_example("sapporo", 0o600);
    let key = dir.path().join("psk.key");

    // Exactly 32 bytes of hex key material, as the example ships.
    let bytes = read_key_file(&key).unwrap();
    assert_eq!(bytes.len(), 32);

    // Too short.
    std::fs::write(&key, "00112233445566778899aabbccddeeff\n").unwrap();
    let err = load(&path).unwrap_err().to_string();
    assert!(
        err.contains("wan.key_file = \"psk.key\": key file"),
        "{err}"
    );
    assert!(err.contains("holds only 16 bytes (32 hex digits)"), "{err}");
    assert!(err.contains("at least 64 hex digits"), "{err}");

    // Missing.
    std::fs::remove_file(&key).unwrap();
    let err = load(&path).unwrap_err().to_string();
    assert!(
        err.contains(&format!("key file {} does not exist", key.display())),
        "{err}"
    );

    // Raw binary key material is fine.
    let mut raw: Vec<u8> = (0u8..40).collect();
    raw[0] = 0xfe;
    std::fs::write(&key, &raw).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(read_key_file(&key).unwrap(), raw);
    load(&path).unwrap();
}

#[test]
fn unreadable_config_file_is_named() {
    let err = load(Path::new("/nonexistent/soya.toml")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err
        .to_string()
        .starts_with("/nonexistent/soya.toml: cannot read config file"));
}
