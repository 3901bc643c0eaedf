//! Puts the XDP steering program of the `xdp` DC backend into OUT_DIR as
//! `steer.bpf.o`, for `soya_io::xdp::program` to embed.
//!
//! Its source is proxy/io/xdp/steer.bpf.c. The object built from it is
//! checked in beside it (proxy/io/xdp/steer.bpf.o, made by
//! proxy/io/xdp/build.sh) so that a machine with only the Rust toolchain
//! (no clang, no libbpf headers: a fresh Debian) still gets the xdp
//! backend from `cargo build`. The build is reproducible: the same clang
//! (Debian 12's clang 14) gives the same bytes in any checkout, since the
//! debug info names the source relative to proxy/ (`-fdebug-prefix-map`).
//!
//! - With clang and the libbpf headers, the program is built from the
//!   source, so an edit of steer.bpf.c takes effect at once; when the
//!   result differs from the checked-in object, the build says so
//!   (warning), and the test `xdp::program::tests` fails under CI until
//!   proxy/io/xdp/build.sh has refreshed it.
//! - Without them, the checked-in object is used.
//! - SOYA_REQUIRE_BPF=1 makes a failed clang build an error instead of a
//!   fall-back (CI builds from the source).

use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "xdp/steer.bpf.c";
const CHECKED_IN: &str = "xdp/steer.bpf.o";

fn main() {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed={CHECKED_IN}");
    println!("cargo:rerun-if-env-changed=SOYA_REQUIRE_BPF");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("steer.bpf.o");
    let failure = match build(&out) {
        Ok(()) => {
            let same = std::fs::read(&out).ok() == std::fs::read(CHECKED_IN).ok();
            if !same {
                println!(
                    "cargo:warning=proxy/io/{CHECKED_IN} differs from what clang builds from proxy/io/{SRC}; \
                     refresh it with proxy/io/xdp/build.sh (or install Debian 12's clang 14)"
                );
            }
            return;
        }
        Err(e) => e,
    };
    if std::env::var_os("SOYA_REQUIRE_BPF").is_some_and(|v| v == "1") {
        panic!("{failure} (SOYA_REQUIRE_BPF=1); install clang, llvm and libbpf-dev");
    }
    // No clang (a fresh machine): the object built from the same source
    // with proxy/io/xdp/build.sh.
    std::fs::copy(CHECKED_IN, &out).unwrap_or_else(|e| panic!("copy {CHECKED_IN}: {e}"));
}

/// `clang -target bpf` with the flags of proxy/io/xdp/build.sh, run in the
/// package directory (cargo's working directory for build scripts).
fn build(out: &Path) -> Result<(), String> {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let mut cmd = Command::new(&clang);
    cmd.args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"]);
    cmd.arg(format!("-fdebug-prefix-map={}=.", here.display()));
    // <asm/types.h> of the build machine's architecture (Debian's multiarch
    // include directory), which linux/bpf.h needs.
    if let Ok(triple) = multiarch() {
        cmd.arg(format!("-I/usr/include/{triple}"));
    }
    cmd.arg("-c").arg(SRC).arg("-o").arg(out);
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{clang} could not build {SRC}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{clang} not found ({e})")),
    }
}

/// Debian's multiarch triple of the target, e.g. x86_64-linux-gnu.
fn multiarch() -> Result<String, std::env::VarError> {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let env = std::env::var("CARGO_CFG_TARGET_ENV")?;
    let arch = match arch.as_str() {
        "x86" => "i386".to_string(),
        other => other.to_string(),
    };
    Ok(format!("{arch}-linux-{env}"))
}
