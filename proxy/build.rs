//! Builds the XDP steering program of the `xdp` DC backend
//! (proxy/xdp/steer.bpf.c) with `clang -target bpf -O2 -g` into OUT_DIR.
//! No object file is checked in.
//!
//! Without clang (or without the libbpf headers) the build goes on with an
//! empty object and a warning: every other backend works, and starting a
//! gateway with `dc.backend = "xdp"` fails with a message saying the
//! program was not built and to install clang, llvm and libbpf-dev (or use
//! `tun`). `.ci/run` installs them; set SOYA_REQUIRE_BPF=1 to make a
//! missing clang a build error.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "xdp/steer.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=SOYA_REQUIRE_BPF");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("steer.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let mut cmd = Command::new(&clang);
    cmd.args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"]);
    // <asm/types.h> of the build machine's architecture (Debian's multiarch
    // include directory), which linux/bpf.h needs.
    if let Ok(triple) = multiarch() {
        cmd.arg(format!("-I/usr/include/{triple}"));
    }
    cmd.arg("-c").arg(src).arg("-o").arg(&out);
    let result = cmd.output();
    let failure = match result {
        Ok(o) if o.status.success() => return,
        Ok(o) => format!(
            "{clang} could not build {src}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("{clang} not found ({e})"),
    };
    if std::env::var_os("SOYA_REQUIRE_BPF").is_some_and(|v| v == "1") {
        panic!("{failure} (SOYA_REQUIRE_BPF=1); install clang, llvm and libbpf-dev");
    }
    println!(
        "cargo:warning=the xdp DC backend is not built: {}; install clang, llvm and libbpf-dev",
        failure.lines().next().unwrap_or_default()
    );
    std::fs::write(&out, b"").expect("write an empty steer.bpf.o");
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
