//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// The smallest valid config: every later test breaks exactly one thing.
pub const BASE: &str = r#"site = "t"
[dc]
local_prefixes = ["10.1.0.0/16"]
remote_prefixes = ["10.2.0.0/16"]
[wan]
key_file = "psk.key"
[[wan.paths]]
name = "p0"
remote = "192.0.2.1:7400"
rate = "10gbit"
rtt = "3ms"
"#;

/// BASE with one exact substring replaced (which must exist).
pub fn edit(find: &str, replace: &str) -> String {
    assert!(BASE.contains(find), "BASE has no {find:?}");
    BASE.replacen(find, replace, 1)
}

/// BASE with text appended (lands in the last [[wan.paths]] table unless it
/// starts a new table).
pub fn append(extra: &str) -> String {
    format!("{BASE}{extra}")
}

/// The full error text for a config that must be rejected.
pub fn error_of(text: &str) -> String {
    match soya_config::parse_str(text, "test.toml") {
        Ok(_) => panic!("config was accepted but should not be:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// 1-based number of the first line of `text` containing `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?}"))
        + 1
}

/// Asserts that `text` is rejected with a diagnostic about `key` on the line
/// containing `at_line` (the value, or for missing keys the table header),
/// whose message contains every string in `says`. Returns that diagnostic.
pub fn expect_error(text: &str, at_line: &str, key: &str, says: &[&str]) -> String {
    let err = error_of(text);
    let line = line_of(text, at_line);
    let prefix = format!("test.toml:{line}:");
    let hit = err
        .lines()
        .find(|l| {
            l.starts_with(&prefix)
                && (l.contains(&format!(" {key} = ")) || l.contains(&format!(" {key}: ")))
        })
        .unwrap_or_else(|| {
            panic!("no diagnostic for {key} at line {line}; got:\n{err}\nfor config:\n{text}")
        });
    for s in says {
        assert!(hit.contains(s), "diagnostic lacks {s:?}:\n{hit}");
    }
    hit.to_string()
}

pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// A scratch directory unique to this test, removed when dropped. (No
/// tempfile crate: the workspace does not carry it.)
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        // Tests run in parallel and may stage the same example: a counter
        // keeps their directories apart.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("soya-config-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies an example config and the sample key into a fresh directory, with
/// the key file at `key_mode` (git does not keep permission bits, so the
/// checked-out psk.key may be 0644).
#[cfg(unix)]
pub fn staged_example(name: &str, key_mode: u32) -> (TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new(&format!("{name}-{key_mode:o}"));
    let cfg = dir.path().join(format!("{name}.toml"));
    std::fs::copy(examples_dir().join(format!("{name}.toml")), &cfg).unwrap();
    let key = dir.path().join("psk.key");
    std::fs::copy(examples_dir().join("psk.key"), &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(key_mode)).unwrap();
    (dir, cfg)
}
