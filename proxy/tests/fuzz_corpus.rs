//! Fuzz smoke without cargo-fuzz: every checked-in seed of every fuzz target
//! (`proxy/fuzz/seeds/<target>/`), plus deterministic mutations of them (bit
//! flips, byte overwrites, truncations, insertions, splices), through the very
//! functions the libFuzzer targets call (`proxy/fuzz/entries/`). Any panic,
//! including a failed assertion inside a target, fails the test and names the
//! input, which is also written out so `cargo fuzz run TARGET FILE` can
//! replay it.
//!
//! It is no campaign (that is `proxy/fuzz/run.sh`): a regression net for CI,
//! where installing and building cargo-fuzz would take too long.

#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../fuzz/entries/cm_mad.rs"]
mod cm_mad;
#[path = "../fuzz/entries/roce_packet.rs"]
mod roce_packet;
#[path = "../fuzz/entries/site_config.rs"]
mod site_config;
#[path = "../fuzz/entries/wan_connection.rs"]
mod wan_connection;
#[path = "../fuzz/entries/wan_frames.rs"]
mod wan_frames;
#[path = "../fuzz/entries/wan_handshake.rs"]
mod wan_handshake;

/// Mutated inputs per target (on top of every seed as it is). Overridable
/// with `SOYA_FUZZ_MUTATIONS` for a longer local run.
const MUTATIONS: usize = 3000;

/// The inputs libFuzzer would start from: a target's checked-in seeds.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, bytes)
        })
        .collect()
}

/// xorshift64*: deterministic, so a failure reproduces from its number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four libFuzzer-like edits of `base`; `other` is for splices.
fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 | 1 if !d.is_empty() => {
                let at = rng.below(d.len());
                d[at] ^= 1 << rng.below(8);
            }
            2 if !d.is_empty() => {
                let at = rng.below(d.len());
                d[at] = [0, 0xff, 0x7f, 0x80, rng.next() as u8][rng.below(5)];
            }
            3 => {
                let cut = rng.below(d.len() + 1);
                d.truncate(cut);
            }
            4 => {
                let at = rng.below(d.len() + 1);
                let n = 1 + rng.below(16);
                let fill: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                d.splice(at..at, fill);
            }
            5 if !d.is_empty() => {
                let at = rng.below(d.len());
                let n = 1 + rng.below((d.len() - at).min(8));
                d.drain(at..at + n);
            }
            _ => {
                let at = rng.below(d.len() + 1);
                let from = rng.below(other.len() + 1);
                d.truncate(at);
                d.extend_from_slice(&other[from..]);
            }
        }
    }
    d
}

fn mutations() -> usize {
    std::env::var("SOYA_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MUTATIONS)
}

/// Runs the seeds and their mutations; panics listing the inputs that
/// panicked, each saved under the test's temporary directory.
fn smoke(target: &str, entry: fn(&[u8])) {
    let seeds = seeds(target);
    assert!(!seeds.is_empty(), "{target}: no seeds checked in");
    let mut rng = Rng(0x5017_a000 ^ target.len() as u64 ^ (seeds.len() as u64) << 32);
    let mut inputs: Vec<(String, Vec<u8>)> = seeds.clone();
    for k in 0..mutations() {
        let (name, base) = &seeds[k % seeds.len()];
        let other = &seeds[rng.below(seeds.len())].1;
        inputs.push((
            format!("{name} mutation {k}"),
            mutate(&mut rng, base, other),
        ));
    }
    let mut failed = Vec::new();
    for (name, input) in &inputs {
        if catch_unwind(AssertUnwindSafe(|| entry(input))).is_err() {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
            std::fs::create_dir_all(&dir).ok();
            let file = dir.join(format!("{target}-{}", name.replace(' ', "-")));
            std::fs::write(&file, input).ok();
            failed.push(format!("{name} (saved as {})", file.display()));
        }
    }
    println!(
        "{target}: {} seeds + {} mutations, {} panicked",
        seeds.len(),
        inputs.len() - seeds.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs panicked; first: {:?}",
        failed.len(),
        inputs.len(),
        &failed[..failed.len().min(5)]
    );
}

/// One smoke test per fuzz target (`never_panic::<target>`), each through
/// the entry of the same name declared above.
macro_rules! smoke_tests {
    ($($target:ident),* $(,)?) => {
        mod never_panic {
            $(
                #[test]
                fn $target() {
                    super::smoke(stringify!($target), super::$target::run);
                }
            )*
        }
    };
}

smoke_tests!(
    cm_mad,
    roce_packet,
    site_config,
    wan_frames,
    wan_connection,
    wan_handshake
);

#[test]
fn a_panicking_entry_fails_the_smoke() {
    // The net has to be able to catch something: an entry that panics on one
    // byte pattern, reached by the mutations of the cm_mad seeds.
    let caught = catch_unwind(|| {
        smoke("cm_mad", |d| {
            assert!(!d.is_empty() && d.len() % 7 != 3, "planted")
        })
    });
    assert!(caught.is_err(), "a planted panic went unnoticed");
}
