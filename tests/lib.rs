//! Helpers shared by the integration tests.

#![deny(unsafe_code)]

use std::path::PathBuf;

/// The `shared/` folder that sits beside the checkout (protocol vectors and
/// lab captures). `SOYA_SHARED` overrides it.
pub fn shared_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SOYA_SHARED") {
        return PathBuf::from(p);
    }
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    assert!(
        d.join("protocol").is_dir(),
        "shared/ not found at {} (it sits beside the checkout; set SOYA_SHARED to override)",
        d.display()
    );
    d
}

/// The sample captures of real kernel Soft-RoCE traffic.
pub fn lab_captures() -> Vec<PathBuf> {
    [
        "sample.pcap",
        "sample-read_bw.pcap",
        "sample-send_bw.pcap",
        "sample-rping.pcap",
    ]
    .iter()
    .map(|f| shared_dir().join("lab").join(f))
    .collect()
}

/// The workspace root.
pub fn workspace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}
