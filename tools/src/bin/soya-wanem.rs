//! `soya-wanem`: WAN emulator in user space (UDP relay, TUN/TAP), and a
//! self-test that measures its accuracy and capacity. See
//! `soya_tools::wanem::cli` for the synopsis.

#![deny(unsafe_code)]

fn main() {
    std::process::exit(soya_tools::wanem::cli::main_with_args(
        std::env::args().collect(),
    ));
}
