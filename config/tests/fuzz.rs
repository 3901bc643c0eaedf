//! `parse_str` must never panic, whatever it is fed — and whatever it returns
//! must be usable: a config that `explain()`s, or a non-empty list of
//! diagnostics whose positions lie inside the text. (A cargo-fuzz target can
//! reuse `parse_str` directly; this keeps a cheap version in every test run.)

#![deny(unsafe_code)]

use proptest::prelude::*;
use soya_config::{parse_str, ConfigError};

const EXAMPLES: [&str; 4] = [
    include_str!("../examples/sapporo.toml"),
    include_str!("../examples/wakkanai.toml"),
    include_str!("../examples/lab-udp-a.toml"),
    include_str!("../examples/lab-udp-b.toml"),
];

/// Values that have broken parsers before: extremes, wrong types, odd units.
const NASTY: &[&str] = &[
    "-1",
    "0",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "0.0",
    "\"\"",
    "[]",
    "{}",
    "[[]]",
    "{ a = 1 }",
    "1979-05-27T07:32:00Z",
    "07:32:00",
    "true",
    "\"auto\"",
    "\"0/0\"",
    "\"::/0\"",
    "\"0.0.0.0/0\"",
    "\"255.255.255.255/32\"",
    "\"10.1.0.0/255\"",
    "\"1.5\"",
    "\"99999999999999999999tbit\"",
    "\"0.000000000000000000000000000001s\"",
    "\"1TiB\"",
    "\"1.0000000000000000000001GiB\"",
    "\"[::]:0\"",
    "\"127.0.0.1:65535\"",
    "\"ゆき\"",
    "\"a\\u0000b\"",
    "'''\nmulti\nline'''",
    "\"µs\"",
    "\"-0ms\"",
];

fn check(text: &str) -> Result<(), TestCaseError> {
    match parse_str(text, "fuzz.toml") {
        Ok(cfg) => {
            let _ = cfg.explain();
        }
        Err(ConfigError::Invalid(diagnostics)) => {
            prop_assert!(!diagnostics.is_empty());
            let lines = text.split('\n').count();
            for d in &diagnostics {
                if let Some(loc) = d.location {
                    prop_assert!(
                        loc.line >= 1 && loc.line <= lines,
                        "{d} (text has {lines} lines)"
                    );
                    prop_assert!(loc.col >= 1);
                }
                prop_assert!(d.to_string().starts_with("fuzz.toml:"));
            }
        }
        Err(other) => prop_assert!(false, "parse_str returned a non-parse error: {other}"),
    }
    Ok(())
}

/// Nearest char boundary at or before `i`.
fn boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_text(s in ".{0,300}") {
        check(&s)?;
    }

    #[test]
    fn random_toml_shaped_text(s in "[a-z_\\[\\]=\"'.,:{}#0-9/ \\n-]{0,400}") {
        check(&s)?;
    }

    /// Splice random text into an example at a random place.
    #[test]
    fn mutated_examples(
        which in 0..EXAMPLES.len(),
        at in any::<prop::sample::Index>(),
        delete in 0usize..40,
        insert in "[a-z_\\[\\]=\"'.,:{}#0-9/ \\n-]{0,20}",
    ) {
        let base = EXAMPLES[which];
        let start = boundary(base, at.index(base.len() + 1));
        let end = boundary(base, start + delete);
        let text = format!("{}{}{}", &base[..start], insert, &base[end..]);
        check(&text)?;
    }

    /// Replace the value of a random `key = value` line with a nasty value.
    #[test]
    fn nasty_values_in_examples(
        which in 0..EXAMPLES.len(),
        line in any::<prop::sample::Index>(),
        value in prop::sample::select(NASTY),
    ) {
        let base = EXAMPLES[which];
        let assignments: Vec<usize> = base
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.starts_with('#') && l.contains(" = "))
            .map(|(i, _)| i)
            .collect();
        let target = assignments[line.index(assignments.len())];
        let text: Vec<String> = base
            .lines()
            .enumerate()
            .map(|(i, l)| match (i == target, l.split_once(" = ")) {
                (true, Some((key, _))) => format!("{key} = {value}"),
                _ => l.to_string(),
            })
            .collect();
        check(&text.join("\n"))?;
    }
}

/// Every nasty value in every assignment of one example, exhaustively.
#[test]
fn every_nasty_value_everywhere() {
    let base = EXAMPLES[0];
    let lines: Vec<&str> = base.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some((key, _)) = l.split_once(" = ") else {
            continue;
        };
        if l.starts_with('#') {
            continue;
        }
        for value in NASTY {
            let mut copy: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            copy[i] = format!("{key} = {value}");
            check(&copy.join("\n")).unwrap_or_else(|e| panic!("line {}: {value}: {e}", i + 1));
        }
    }
}
