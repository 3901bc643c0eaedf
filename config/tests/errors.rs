//! Every rule, broken once: the diagnostic must name the right line, the key
//! path and what would be accepted.

#![deny(unsafe_code)]

mod common;

use common::*;

#[test]
fn base_is_valid() {
    soya_config::parse_str(BASE, "test.toml").unwrap();
}

// ---- syntax, types, unknown keys (serde/toml errors) ----------------------

#[test]
fn syntax_error_has_position() {
    let text = edit("[wan]", "[wan");
    let err = error_of(&text);
    assert!(err.starts_with("test.toml:5:5: "), "{err}");
    assert!(err.contains("invalid table header"), "{err}");
}

#[test]
fn unknown_keys_are_rejected_with_the_alternatives() {
    let text = edit("[dc]\n", "[dc]\ncolour = \"blue\"\n");
    expect_error(
        &text,
        "colour",
        "dc.colour",
        &[
            "unknown field `colour`",
            "expected one of `backend`, `interface`",
        ],
    );
    let text = append("dsc = 46\n");
    let d = expect_error(
        &text,
        "dsc = 46",
        "wan.paths[0].dsc",
        &["unknown field `dsc`", "`dscp`"],
    );
    assert!(
        d.starts_with(&format!("test.toml:{}:1:", line_of(&text, "dsc = 46"))),
        "{d}"
    );
    let text = append("[extra]\n");
    expect_error(
        &text,
        "[extra]",
        "extra",
        &["unknown field `extra`", "`pseudo_ack`"],
    );
}

#[test]
fn wrong_types_say_what_is_accepted() {
    let text = append("dscp = \"46\"\n");
    expect_error(
        &text,
        "dscp = \"46\"",
        "wan.paths[0].dscp",
        &["invalid type: string \"46\"", "expected an integer 0..=63"],
    );
    let text = edit("[dc]\n", "[dc]\nlocal_prefixes = \"10.1.0.0/16\"\n").replacen(
        "local_prefixes = [\"10.1.0.0/16\"]\n",
        "",
        1,
    );
    expect_error(
        &text,
        "local_prefixes",
        "dc.local_prefixes",
        &["expected a non-empty array of CIDR prefixes"],
    );
    let text = edit("site = \"t\"\n", "site = \"t\"\nlog = 3\n");
    expect_error(
        &text,
        "log = 3",
        "log",
        &["invalid type: integer `3`, expected a table [log]"],
    );
    let text = append("[buffer]\nsize = 4.5\n");
    expect_error(
        &text,
        "size = 4.5",
        "buffer.size",
        &["floating point `4.5`", "\"auto\" or a byte size"],
    );
    let text = edit("site = \"t\"", "site = 1979-05-27T07:32:00Z");
    expect_error(
        &text,
        "site =",
        "site",
        &["invalid type: datetime", "like \"sapporo\""],
    );
}

#[test]
fn enums_list_their_variants() {
    let text = edit("[dc]\n", "[dc]\nbackend = \"tap\"\n");
    let d = expect_error(
        &text,
        "backend",
        "dc.backend",
        &["unknown variant `tap`", "`tun`, `udp`, `xdp`"],
    );
    assert!(
        d.starts_with("test.toml:3:11: dc.backend = \"tap\": "),
        "{d}"
    );
    let text = append("[pseudo_ack]\npolicy = \"eager\"\n");
    expect_error(
        &text,
        "policy",
        "pseudo_ack.policy",
        &["`edge`, `strict`, `off`"],
    );
    let text = append("[log]\nformat = \"xml\"\n");
    expect_error(
        &text,
        "format",
        "log.format",
        &["unknown variant `xml`, expected `human` or `json`"],
    );
    let text = append("[log]\nlevel = \"verbose\"\n");
    expect_error(
        &text,
        "level",
        "log.level",
        &["`trace`, `debug`, `info`, `warn`, `error`"],
    );
}

// ---- site ------------------------------------------------------------------

#[test]
fn site_name() {
    let text = edit("site = \"t\"\n", "");
    let err = error_of(&text);
    assert!(
        err.contains("test.toml: site: missing; every site config starts with site = \"<name>\""),
        "{err}"
    );
    let text = edit("site = \"t\"", "site = \"Sapporo DC\"");
    let d = expect_error(
        &text,
        "site =",
        "site",
        &["a-z, 0-9 and '-'", "(e.g. \"sapporo\")"],
    );
    assert!(
        d.starts_with("test.toml:1:8: site = \"Sapporo DC\": site name must be"),
        "{d}"
    );
}

// ---- [dc] ------------------------------------------------------------------

#[test]
fn dc_interface() {
    let text = edit("[dc]\n", "[dc]\ninterface = \"a/b\"\n");
    expect_error(
        &text,
        "interface",
        "dc.interface",
        &["1..=15 characters without '/'"],
    );
    let text = edit("[dc]\n", "[dc]\nbackend = \"xdp\"\n");
    expect_error(
        &text,
        "[dc]",
        "dc.interface",
        &["missing; backend = \"xdp\" needs the NIC (or veth) name"],
    );
    // The never-implemented afpacket backend is refused, naming what exists.
    let text = edit(
        "[dc]\n",
        "[dc]\nbackend = \"afpacket\"\ninterface = \"eth9\"\n",
    );
    expect_error(
        &text,
        "backend",
        "dc.backend",
        &["unknown variant `afpacket`", "`tun`, `udp`, `xdp`"],
    );
    let text = edit(
        "[dc]\n",
        "[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:4791\"\ninterface = \"eth0\"\n",
    );
    expect_error(
        &text,
        "interface",
        "dc.interface",
        &["not used with backend = \"udp\""],
    );
    let ok = edit(
        "[dc]\n",
        "[dc]\nbackend = \"xdp\"\ninterface = \"ens1f0\"\n",
    );
    let cfg = soya_config::parse_str(&ok, "t").unwrap();
    assert_eq!(
        cfg.dc.backend,
        soya_config::DcBackend::Xdp {
            interface: "ens1f0".into()
        }
    );
}

#[test]
fn dc_listen() {
    let text = edit("[dc]\n", "[dc]\nbackend = \"udp\"\n");
    expect_error(
        &text,
        "[dc]",
        "dc.listen",
        &[
            "missing; backend = \"udp\" needs",
            "listen = \"127.0.0.1:4791\"",
        ],
    );
    let text = edit("[dc]\n", "[dc]\nlisten = \"127.0.0.1:4791\"\n");
    expect_error(
        &text,
        "listen",
        "dc.listen",
        &["only used with backend = \"udp\""],
    );
    let text = edit(
        "[dc]\n",
        "[dc]\nbackend = \"udp\"\nlisten = \"localhost:4791\"\n",
    );
    expect_error(
        &text,
        "listen",
        "dc.listen",
        &[
            "not a socket address",
            "\"192.0.2.1:7400\"",
            "host names are not resolved",
        ],
    );
    let text = edit(
        "[dc]\n",
        "[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:0\"\n",
    );
    expect_error(&text, "listen", "dc.listen", &["port 0 is not allowed"]);
}

#[test]
fn dc_prefixes() {
    let text = edit("local_prefixes = [\"10.1.0.0/16\"]\n", "");
    expect_error(
        &text,
        "[dc]",
        "dc.local_prefixes",
        &[
            "missing; list the local data-center networks",
            "[\"10.1.0.0/16\"]",
        ],
    );
    let text = edit(
        "remote_prefixes = [\"10.2.0.0/16\"]",
        "remote_prefixes = []",
    );
    expect_error(
        &text,
        "remote_prefixes",
        "dc.remote_prefixes",
        &["must not be empty"],
    );
    let text = edit("[\"10.1.0.0/16\"]", "[\"10.1.0.1/16\"]");
    let d = expect_error(
        &text,
        "local_prefixes",
        "dc.local_prefixes[0]",
        &["10.1.0.1/16 has host bits set; did you mean 10.1.0.0/16?"],
    );
    assert!(
        d.starts_with("test.toml:3:19: dc.local_prefixes[0] = \"10.1.0.1/16\": "),
        "{d}"
    );
    let text = edit("[\"10.1.0.0/16\"]", "[\"10.1.0.0/16\", \"10.1.0.0/33\"]");
    expect_error(
        &text,
        "local_prefixes",
        "dc.local_prefixes[1]",
        &["out of range for IPv4 (0..=32)"],
    );
    let text = edit("[\"10.1.0.0/16\"]", "[\"10.1.0.0\"]");
    expect_error(
        &text,
        "local_prefixes",
        "dc.local_prefixes[0]",
        &["no /length", "\"10.1.0.0/16\""],
    );
    let text = edit("[\"10.1.0.0/16\"]", "[\"10.1.0.0/16\", \"10.1.0.0/16\"]");
    expect_error(
        &text,
        "local_prefixes",
        "dc.local_prefixes[1]",
        &["listed twice (also dc.local_prefixes[0])"],
    );
    let text = edit("[\"10.2.0.0/16\"]", "[\"10.0.0.0/8\"]");
    expect_error(
        &text,
        "remote_prefixes",
        "dc.remote_prefixes[0]",
        &[
            "10.0.0.0/8 overlaps dc.local_prefixes[0] = 10.1.0.0/16",
            "must be disjoint",
        ],
    );
}

// ---- [wan] -----------------------------------------------------------------

#[test]
fn wan_bind() {
    let text = edit("[wan]\n", "[wan]\nbind = []\n");
    expect_error(
        &text,
        "bind = []",
        "wan.bind",
        &["must not be empty", "0.0.0.0:7400"],
    );
    let text = edit("[wan]\n", "[wan]\nbind = [\"0.0.0.0:7400\", \"0.0.0.0\"]\n");
    expect_error(
        &text,
        "bind =",
        "wan.bind[1]",
        &["not a socket address", "IP:port"],
    );
    let text = edit(
        "[wan]\n",
        "[wan]\nbind = [\"0.0.0.0:7400\", \"0.0.0.0:7400\"]\n",
    );
    expect_error(
        &text,
        "bind =",
        "wan.bind[1]",
        &["listed twice (also wan.bind[0])"],
    );
    // Indices in messages are file indices even after an unparsable entry.
    let text = edit(
        "[wan]\n",
        "[wan]\nbind = [\"x\", \"0.0.0.0:7400\", \"0.0.0.0:7400\"]\n",
    );
    expect_error(
        &text,
        "bind =",
        "wan.bind[2]",
        &["listed twice (also wan.bind[1])"],
    );
}

#[test]
fn wan_key_file() {
    let text = edit("key_file = \"psk.key\"\n", "");
    expect_error(
        &text,
        "[wan]",
        "wan.key_file",
        &[
            "missing; set private_key_file and twin_public_key",
            "key_file = \"/etc/soya/psk\"",
            "insecure = true",
        ],
    );
    let text = edit("key_file = \"psk.key\"", "key_file = \"\"");
    expect_error(&text, "key_file", "wan.key_file", &["must not be empty"]);
    // insecure = true makes it optional, and a leftover key_file is flagged.
    let text = edit(
        "key_file = \"psk.key\"",
        "insecure = true\nkey_file = \"psk.key\"",
    );
    let cfg = soya_config::parse_str(&text, "t").unwrap();
    assert!(cfg
        .warnings()
        .iter()
        .any(|w| w.contains("is ignored because wan.insecure = true")));
}

#[test]
fn wan_cipher() {
    use soya_config::WanCipher;
    let cfg = soya_config::parse_str(BASE, "t").unwrap();
    assert_eq!(cfg.wan.cipher, WanCipher::Auto, "default");
    assert!(cfg.defaulted.iter().any(|k| k == "wan.cipher"));
    for (text, want) in [
        ("auto", WanCipher::Auto),
        ("aes-256-gcm", WanCipher::Aes256Gcm),
        ("chacha20-poly1305", WanCipher::ChaCha20Poly1305),
    ] {
        let t = edit(
            "key_file = \"psk.key\"",
            &format!("key_file = \"psk.key\"\ncipher = \"{text}\""),
        );
        let cfg = soya_config::parse_str(&t, "t").unwrap();
        assert_eq!(cfg.wan.cipher, want);
        assert_eq!(cfg.wan.cipher.as_str(), text);
        assert!(cfg.explain().contains("  cipher  "), "{}", cfg.explain());
    }
    let t = edit(
        "key_file = \"psk.key\"",
        "key_file = \"psk.key\"\ncipher = \"aes-128-gcm\"",
    );
    expect_error(
        &t,
        "cipher",
        "wan.cipher",
        &[
            "unknown variant `aes-128-gcm`",
            "`auto`, `aes-256-gcm`, `chacha20-poly1305`",
        ],
    );
}

#[test]
fn wan_path_count() {
    let text = BASE.split("[[wan.paths]]").next().unwrap().to_string();
    expect_error(
        &text,
        "[wan]",
        "wan.paths",
        &["missing; add at least one [[wan.paths]] table"],
    );
    let mut text = BASE.to_string();
    for i in 1..17 {
        text.push_str(&format!("[[wan.paths]]\nname = \"p{i}\"\nremote = \"192.0.2.1:{}\"\nrate = \"1gbit\"\nrtt = \"3ms\"\n", 7400 + i));
    }
    // Reported at the 17th [[wan.paths]] header, the line before its name.
    let header = line_of(&text, "name = \"p16\"") - 1;
    let err = error_of(&text);
    assert_eq!(err, format!("test.toml:{header}:1: wan.paths[16]: too many paths: 17 given, at most 16 are supported"));
}

#[test]
fn wan_path_name() {
    let text = edit("name = \"p0\"\n", "");
    expect_error(
        &text,
        "[[wan.paths]]",
        "wan.paths[0].name",
        &["missing; every path needs a name"],
    );
    let text = edit("name = \"p0\"", "name = \"Coast DWDM\"");
    expect_error(
        &text,
        "name =",
        "wan.paths[0].name",
        &["a-z, 0-9 and '-'", "\"coast-dwdm\""],
    );
    let text = append("[[wan.paths]]\nname = \"p0\"\nremote = \"192.0.2.2:7400\"\nrate = \"1gbit\"\nrtt = \"3ms\"\n");
    let line = line_of(&text, "192.0.2.2") - 1;
    let err = error_of(&text);
    assert!(
        err.contains(&format!("test.toml:{line}:8: wan.paths[1].name = \"p0\": duplicate path name \"p0\" (also wan.paths[0].name)")),
        "{err}"
    );
}

#[test]
fn wan_path_remote() {
    let text = edit("remote = \"192.0.2.1:7400\"\n", "");
    expect_error(
        &text,
        "[[wan.paths]]",
        "wan.paths[0].remote",
        &["missing; the twin gateway's address"],
    );
    let text = edit("192.0.2.1:7400", "twin.example:7400");
    expect_error(
        &text,
        "remote = ",
        "wan.paths[0].remote",
        &["not a socket address", "IP:port"],
    );
    let text = edit("192.0.2.1:7400", "0.0.0.0:7400");
    expect_error(
        &text,
        "remote = ",
        "wan.paths[0].remote",
        &["unicast address, not a wildcard"],
    );
    let text = edit("192.0.2.1:7400", "[2001:db8::1]:7400");
    expect_error(
        &text,
        "remote = ",
        "wan.paths[0].remote",
        &["remote is IPv6 but this path sends from IPv4 address 0.0.0.0:7400"],
    );
    // Two paths over the same socket pair cannot be told apart.
    let text = append("[[wan.paths]]\nname = \"p1\"\nremote = \"192.0.2.1:7400\"\nrate = \"1gbit\"\nrtt = \"3ms\"\n");
    let line = line_of(&text, "name = \"p1\"") + 1;
    let err = error_of(&text);
    assert!(err.contains(&format!("test.toml:{line}:10: wan.paths[1].remote = \"192.0.2.1:7400\": wan.paths[0] already uses bind 0.0.0.0:7400")), "{err}");
}

#[test]
fn wan_path_bind() {
    let text = append("bind = 2\n");
    expect_error(
        &text,
        "bind = 2",
        "wan.paths[0].bind",
        &["index 2 is out of range: wan.bind has 1 entry (0..=0)"],
    );
    let text = append("bind = -1\n");
    expect_error(&text, "bind = -1", "wan.paths[0].bind", &["out of range"]);
    let text = append("bind = \"192.0.2.9\"\n");
    expect_error(
        &text,
        "bind = ",
        "wan.paths[0].bind",
        &["not a socket address"],
    );
    let text = append("bind = true\n");
    expect_error(
        &text,
        "bind = true",
        "wan.paths[0].bind",
        &["an index into wan.bind (0, 1, ...) or a socket address"],
    );
    let ok = soya_config::parse_str(&append("bind = \"192.0.2.9:7401\"\n"), "t").unwrap();
    assert_eq!(ok.wan.paths[0].bind, "192.0.2.9:7401".parse().unwrap());
}

/// `wan.mtu`: the IP MTU of the WAN paths sizes the transport's
/// datagrams (the IPv6 and UDP headers off it); out of range is refused.
#[test]
fn wan_mtu() {
    let base = soya_config::parse_str(BASE, "t").unwrap();
    assert_eq!((base.wan.mtu, base.wan.max_datagram()), (9000, 8952));
    let text = edit("[wan]\n", "[wan]\nmtu = 1500\n");
    let c = soya_config::parse_str(&text, "t").unwrap();
    assert_eq!((c.wan.mtu, c.wan.max_datagram()), (1500, 1452));
    for bad in ["1279", "9217", "-1"] {
        let text = edit("[wan]\n", &format!("[wan]\nmtu = {bad}\n"));
        expect_error(
            &text,
            "mtu =",
            "wan.mtu",
            &["mtu must be an integer 1280..=9216"],
        );
    }
    let text = edit("[wan]\n", "[wan]\nmtu = \"1500\"\n");
    expect_error(&text, "mtu =", "wan.mtu", &["an integer 1280..=9216"]);
}

#[test]
fn wan_path_numbers() {
    let text = append("weight = 0\n");
    expect_error(
        &text,
        "weight",
        "wan.paths[0].weight",
        &["weight must be an integer 1..=100"],
    );
    let text = append("weight = 101\n");
    expect_error(&text, "weight", "wan.paths[0].weight", &["1..=100"]);
    let text = append("dscp = 64\n");
    let d = expect_error(
        &text,
        "dscp",
        "wan.paths[0].dscp",
        &["DSCP must be an integer 0..=63"],
    );
    assert_eq!(
        d,
        "test.toml:12:8: wan.paths[0].dscp = 64: DSCP must be an integer 0..=63"
    );
    let text = append("dscp = -1\n");
    expect_error(&text, "dscp", "wan.paths[0].dscp", &["0..=63"]);
}

#[test]
fn wan_path_rate() {
    let text = edit("\"10gbit\"", "\"10zbit\"");
    let d = expect_error(
        &text,
        "rate",
        "wan.paths[0].rate",
        &["unknown rate unit \"zbit\"", "k/m/g/t", "bit, bps or b/s"],
    );
    assert!(
        d.starts_with("test.toml:10:8: wan.paths[0].rate = \"10zbit\": "),
        "{d}"
    );
    let text = edit("\"10gbit\"", "\"10\"");
    expect_error(
        &text,
        "rate",
        "wan.paths[0].rate",
        &["has no unit", "\"100Mbit\""],
    );
    let text = edit("\"10gbit\"", "\"1.25GBps\"");
    expect_error(
        &text,
        "rate",
        "wan.paths[0].rate",
        &["capital B means bytes per second"],
    );
    let text = edit("\"10gbit\"", "\"100bit\"");
    expect_error(
        &text,
        "rate",
        "wan.paths[0].rate",
        &["between 1kbit and 10tbit"],
    );
    let text = edit("\"10gbit\"", "10");
    expect_error(
        &text,
        "rate",
        "wan.paths[0].rate",
        &["invalid type: integer `10`", "\"10gbit\""],
    );
}

#[test]
fn wan_path_rtt_and_distance() {
    let text = edit("\"3ms\"", "\"3 fortnights\"");
    expect_error(
        &text,
        "rtt",
        "wan.paths[0].rtt",
        &["unknown duration unit \"fortnights\"", "\"1500us\""],
    );
    let text = edit("\"3ms\"", "\"3\"");
    expect_error(&text, "rtt", "wan.paths[0].rtt", &["no unit"]);
    let text = edit("\"3ms\"", "\"11s\"");
    expect_error(&text, "rtt", "wan.paths[0].rtt", &["between 1us and 10s"]);
    let text = append("distance_km = 300\n");
    expect_error(
        &text,
        "distance_km",
        "wan.paths[0].distance_km",
        &["set either rtt or distance_km, not both"],
    );
    let text = edit("rtt = \"3ms\"", "distance_km = 0");
    expect_error(
        &text,
        "distance_km",
        "wan.paths[0].distance_km",
        &["0 < km <= 40000"],
    );
    let text = edit("rtt = \"3ms\"", "distance_km = nan");
    expect_error(
        &text,
        "distance_km",
        "wan.paths[0].distance_km",
        &["0 < km <= 40000"],
    );
    let text = edit("rtt = \"3ms\"", "distance_km = \"300km\"");
    expect_error(
        &text,
        "distance_km",
        "wan.paths[0].distance_km",
        &["a number of kilometres"],
    );
}

// ---- [pseudo_ack], [control] -----------------------------------------------

#[test]
fn pseudo_ack_ranges() {
    let text = append("[pseudo_ack]\ncoalesce_packets = 0\n");
    expect_error(
        &text,
        "coalesce_packets",
        "pseudo_ack.coalesce_packets",
        &["coalesce_packets must be an integer 1..=128"],
    );
    let text = append("[pseudo_ack]\ncoalesce_us = 10001\n");
    expect_error(
        &text,
        "coalesce_us",
        "pseudo_ack.coalesce_us",
        &["0..=10000"],
    );
    let text = append("[pseudo_ack]\ncnp_on_backpressure = \"yes\"\n");
    expect_error(
        &text,
        "cnp_on_backpressure",
        "pseudo_ack.cnp_on_backpressure",
        &["expected true or false"],
    );
}

#[test]
fn control_addresses() {
    let text = append("[control]\nmetrics = \"9464\"\n");
    expect_error(
        &text,
        "metrics",
        "control.metrics",
        &["not a socket address"],
    );
    let ok = soya_config::parse_str(&append("[control]\nmetrics = \"\"\n"), "t").unwrap();
    assert_eq!(ok.control.metrics, None);
    let text = append("[control]\nsocket = \"run/soya.sock\"\n");
    expect_error(
        &text,
        "socket",
        "control.socket",
        &["must be an absolute path"],
    );
    let long = format!("/{}", "x".repeat(107));
    let text = append(&format!("[control]\nsocket = \"{long}\"\n"));
    expect_error(&text, "socket", "control.socket", &["at most 107 bytes"]);
}

// ---- several problems at once ----------------------------------------------

#[test]
fn all_problems_are_reported_in_file_order() {
    let text =
        edit("[\"10.2.0.0/16\"]", "[\"10.0.0.0/8\"]").replacen("site = \"t\"", "site = \"T\"", 1)
            + "dscp = 99\n[log]\nlevel = \"info\"\n[pseudo_ack]\ncoalesce_packets = 500\n";
    let err = error_of(&text);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    assert!(lines[0].starts_with("test.toml:1:8: site = \"T\""), "{err}");
    assert!(
        lines[1].starts_with("test.toml:4:20: dc.remote_prefixes[0] = \"10.0.0.0/8\""),
        "{err}"
    );
    assert!(
        lines[2].starts_with("test.toml:12:8: wan.paths[0].dscp = 99"),
        "{err}"
    );
    assert!(
        lines[3].starts_with("test.toml:16:20: pseudo_ack.coalesce_packets = 500"),
        "{err}"
    );
    let e = soya_config::parse_str(&text, "test.toml").unwrap_err();
    assert_eq!(e.diagnostics().len(), 4);
    assert_eq!(e.diagnostics()[2].key.as_deref(), Some("wan.paths[0].dscp"));
    assert_eq!(
        e.diagnostics()[2].location,
        Some(soya_config::Location { line: 12, col: 8 })
    );
}

#[test]
fn gateway_shards_are_auto_or_a_small_count() {
    use soya_config::Shards;
    let cfg = soya_config::parse_str(BASE, "test.toml").unwrap();
    assert_eq!(cfg.gateway.shards, Shards::Fixed(1), "absent: one shard");
    let cfg = soya_config::parse_str(&append("[gateway]\nshards = 4\n"), "test.toml").unwrap();
    assert_eq!(cfg.gateway.shards, Shards::Fixed(4));
    let cfg =
        soya_config::parse_str(&append("[gateway]\nshards = \"auto\"\n"), "test.toml").unwrap();
    assert_eq!(cfg.gateway.shards, Shards::Auto);
    assert_eq!(Shards::Auto.resolve(1), 1);
    assert_eq!(Shards::Auto.resolve(2), 1);
    assert_eq!(Shards::Auto.resolve(4), 3);
    assert_eq!(Shards::Auto.resolve(64), 8);
    for bad in ["0", "17", "-1", "\"many\""] {
        let text = append(&format!("[gateway]\nshards = {bad}\n"));
        expect_error(
            &text,
            "shards",
            "gateway.shards",
            &["must be \"auto\" or an integer 1..=16", "both sites"],
        );
    }
}

#[test]
fn dc_retransmit_floor_and_give_up() {
    let cfg = soya_config::parse_str(BASE, "t").unwrap();
    assert_eq!(
        (cfg.dc.retransmit_floor, cfg.dc.give_up_after),
        (
            soya_config::DEFAULT_RETRANSMIT_FLOOR,
            soya_config::DEFAULT_GIVE_UP_AFTER
        )
    );
    assert!(cfg.defaulted.iter().any(|k| k == "dc.retransmit_floor"));
    let ok = edit(
        "[dc]\n",
        "[dc]\nretransmit_floor = \"5ms\"\ngive_up_after = \"1.5s\"\n",
    );
    let cfg = soya_config::parse_str(&ok, "t").unwrap();
    assert_eq!(
        (cfg.dc.retransmit_floor, cfg.dc.give_up_after),
        (
            std::time::Duration::from_millis(5),
            std::time::Duration::from_millis(1500)
        )
    );
    assert!(cfg.explain().contains("at least 5 ms"), "{}", cfg.explain());
    let text = edit("[dc]\n", "[dc]\nretransmit_floor = \"50\"\n");
    expect_error(
        &text,
        "retransmit_floor",
        "dc.retransmit_floor",
        &["has no unit", "\"3ms\""],
    );
    let text = edit("[dc]\n", "[dc]\nretransmit_floor = \"10us\"\n");
    expect_error(
        &text,
        "retransmit_floor",
        "dc.retransmit_floor",
        &["retransmit_floor must be between 100 µs and 1 s"],
    );
    let text = edit("[dc]\n", "[dc]\ngive_up_after = \"2min\"\n");
    expect_error(
        &text,
        "give_up_after",
        "dc.give_up_after",
        &["unknown duration unit"],
    );
    let text = edit("[dc]\n", "[dc]\ngive_up_after = \"90s\"\n");
    expect_error(
        &text,
        "give_up_after",
        "dc.give_up_after",
        &["give_up_after must be between 100 ms and 60 s"],
    );
    let text = edit(
        "[dc]\n",
        "[dc]\nretransmit_floor = \"200ms\"\ngive_up_after = \"500ms\"\n",
    );
    expect_error(
        &text,
        "give_up_after",
        "dc.give_up_after",
        &["at least 4 x dc.retransmit_floor (800 ms)"],
    );
    // Allowed, but less patient than the requesters it stands in for.
    let impatient = edit("[dc]\n", "[dc]\ngive_up_after = \"300ms\"\n");
    let cfg = soya_config::parse_str(&impatient, "t").unwrap();
    assert!(
        cfg.warnings()
            .iter()
            .any(|w| w.contains("dc.give_up_after = 300 ms is less patient")),
        "{:?}",
        cfg.warnings()
    );
}

#[test]
fn dc_rnr_give_up_is_a_validated_time() {
    let cfg = soya_config::parse_str(BASE, "t").unwrap();
    assert_eq!(cfg.dc.rnr_give_up, soya_config::DEFAULT_RNR_GIVE_UP);
    assert!(cfg.defaulted.iter().any(|k| k == "dc.rnr_give_up"));
    let ok = edit("[dc]\n", "[dc]\nrnr_give_up = \"90s\"\n");
    let cfg = soya_config::parse_str(&ok, "t").unwrap();
    assert_eq!(cfg.dc.rnr_give_up, std::time::Duration::from_secs(90));
    assert!(
        cfg.explain().contains("90 s of nothing but RNR NAKs"),
        "{}",
        cfg.explain()
    );
    let text = edit("[dc]\n", "[dc]\nrnr_give_up = \"500ms\"\n");
    expect_error(
        &text,
        "rnr_give_up",
        "dc.rnr_give_up",
        &["rnr_give_up must be between 1 s and 600 s"],
    );
    let text = edit("[dc]\n", "[dc]\nrnr_give_up = \"1000\"\n");
    expect_error(&text, "rnr_give_up", "dc.rnr_give_up", &["has no unit"]);
}
