//! The `soya` command as a user runs it.

#![deny(unsafe_code)]

use std::process::Command;

fn soya() -> Command {
    Command::new(env!("CARGO_BIN_EXE_soya"))
}

#[test]
fn help_lists_the_subcommands() {
    let out = soya().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for cmd in ["check-config", "plan", "demo"] {
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

/// Copies the example configs and key to a temp dir with the key at mode
/// 0600 (git does not keep permission bits).
fn examples_in_tempdir(test: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples");
    let dir = std::env::temp_dir().join(format!("soya-cli-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    // Key files are refused when others may read them; git keeps 0644.
    for key in ["psk.key", "identity-a.key", "identity-b.key"] {
        std::fs::set_permissions(dir.join(key), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    dir
}

#[test]
fn check_config_accepts_every_example() {
    let dir = examples_in_tempdir("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 5, "{files:?}");
    let out = soya().arg("check-config").args(&files).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches(": OK").count(), 5, "{stdout}");
    assert!(
        stdout.contains("sapporo") && stdout.contains("wakkanai") && stdout.contains("identity")
    );
}

#[test]
fn check_config_names_file_line_key_and_what_is_accepted() {
    let dir = examples_in_tempdir("broken");
    let good = std::fs::read_to_string(dir.join("sapporo.toml")).unwrap();
    let bad = good.replacen("dscp = 46", "dscp = 99", 1);
    assert_ne!(good, bad, "example changed: update this test");
    let line = bad.lines().position(|l| l.contains("dscp = 99")).unwrap() + 1;
    let path = dir.join("broken.toml");
    std::fs::write(&path, bad).unwrap();
    let out = soya().arg("check-config").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("{}:{line}:", path.display());
    assert!(err.contains(&want), "{err} lacks {want}");
    assert!(err.contains("wan.paths[0].dscp"), "{err}");
    assert!(err.contains("0..=63"), "{err}");
}

#[test]
fn check_config_refuses_a_world_readable_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = examples_in_tempdir("world");
    std::fs::set_permissions(dir.join("psk.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = soya()
        .arg("check-config")
        .arg(dir.join("wakkanai.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("world-readable") && err.contains("chmod 600"),
        "{err}"
    );
}
