//! The `soya` command as a user runs it.

use std::process::Command;

fn soya() -> Command {
    Command::new(env!("CARGO_BIN_EXE_soya"))
}

#[test]
fn help_lists_the_subcommands() {
    let out = soya().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for cmd in ["check-config", "demo"] {
        assert!(text.contains(cmd), "{cmd} missing from --help:\n{text}");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = soya().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("soya {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    let out = soya().arg("frobnicate").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}
