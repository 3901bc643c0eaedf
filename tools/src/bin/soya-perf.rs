//! `soya-perf`: a RoCEv2 RC endpoint in software (UDP port 4791, modelled on
//! Linux rxe), driven like perftest. See `soya_tools::perf_cli` for the
//! synopsis.

#![deny(unsafe_code)]

fn main() {
    std::process::exit(soya_tools::perf_cli::main_with_args(
        std::env::args().collect(),
    ));
}
