//! The `soya` command: gateway daemon, config checker and demo.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sōya — long-distance RoCEv2 WAN accelerator.
///
/// One gateway per site terminates the RoCE ACK loop at the edge (pseudo-ACKs),
/// buffers deeply and carries the traffic to its twin over several WAN paths.
#[derive(Parser)]
#[command(name = "soya", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a site configuration file and explain the effective settings.
    CheckConfig {
        /// Site configuration files (TOML) to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only report errors; print nothing for valid files.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Plan capacity: WAN delay, BDP, deep-buffer size, goodput direct vs. through
    /// Sōya, and whether a data-parallel job's AllReduce hides behind backward.
    Plan(soya::plan::PlanArgs),
    /// Run the two-site demo on loopback (direct vs. through Sōya at 300 km).
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { files, quiet } => check_config(&files, quiet),
        Command::Plan(args) => soya::plan::run(&args),
        Command::Demo => {
            eprintln!(
                "soya demo: not built yet. The two-site demo needs the gateway daemon \
                 (pseudo-ACK engine, WAN transport, lab tools); this build has the RoCEv2 \
                 wire codec and the site configuration only."
            );
            ExitCode::from(2)
        }
    }
}

fn check_config(files: &[PathBuf], quiet: bool) -> ExitCode {
    let mut failed = 0;
    let mut out = std::io::stdout().lock();
    for f in files {
        match soya_config::load(f) {
            Ok(cfg) => {
                // A closed pipe (`| head`) ends the listing quietly.
                if !quiet && writeln!(out, "{}: OK\n{}", f.display(), cfg.explain()).is_err() {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => {
                eprintln!("{e}");
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed} of {} file(s) invalid", files.len());
        ExitCode::FAILURE
    }
}
