//! Errors that read like compiler diagnostics.
//!
//! An operator editing `/etc/soya/sapporo.toml` at 3 a.m. needs to know *where*
//! (file:line:col), *which key* (`wan.paths[1].dscp`), *what it holds* and *what
//! would be accepted* — in one line, greppable, stable for tests. Every problem
//! found in a config file therefore becomes a [`Diagnostic`], rendered as
//!
//! ```text
//! config/examples/bad.toml:14:8: wan.paths[1].dscp = 70: DSCP must be an integer 0..=63
//! ```

use std::fmt;
use std::path::PathBuf;

/// A 1-based line and column (columns count characters, not bytes, like rustc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    pub line: usize,
    pub col: usize,
}

impl Location {
    /// Converts a byte offset into `text` to a line and column. Offsets past the
    /// end or inside a multi-byte character are clamped rather than panicking,
    /// because spans come from a parser we do not control.
    pub fn from_offset(text: &str, offset: usize) -> Location {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        Location { line, col }
    }
}

/// One located problem in one config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file name as the user gave it (or the `origin` passed to `parse_str`).
    pub origin: String,
    /// Where the offending value (or, for a missing key, its enclosing table)
    /// is. `None` only when there is nothing to point at, e.g. a key missing
    /// from a file that has no such section at all.
    pub location: Option<Location>,
    /// Dotted key path such as `wan.paths[1].dscp`; `None` for pure syntax errors.
    pub key: Option<String>,
    /// The offending value exactly as written in the file (shortened if long).
    pub value: Option<String>,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.origin)?;
        if let Some(loc) = self.location {
            write!(f, "{}:{}:", loc.line, loc.col)?;
        }
        match (&self.key, &self.value) {
            (Some(key), Some(value)) => write!(f, " {key} = {value}:")?,
            (Some(key), None) => write!(f, " {key}:")?,
            (None, _) => {}
        }
        write!(f, " {}", self.message)
    }
}

/// Everything that can go wrong while loading a site configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file itself could not be read.
    #[error("{}: cannot read config file: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not a valid site config. Never empty; sorted by
    /// position so the first entry is the first problem in the file.
    #[error("{}", render(.0))]
    Invalid(Vec<Diagnostic>),
    /// A key file checked on its own (see [`crate::read_key_file`]); when the
    /// key file is checked as part of `load`, the problem is reported as an
    /// [`ConfigError::Invalid`] diagnostic pointing at `wan.key_file` instead.
    #[error("{}: {reason}", path.display())]
    KeyFile { path: PathBuf, reason: String },
}

impl ConfigError {
    /// The located problems, if this is a validation error.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ConfigError::Invalid(d) => d,
            _ => &[],
        }
    }
}

fn render(diagnostics: &[Diagnostic]) -> String {
    let lines: Vec<String> = diagnostics.iter().map(|d| d.to_string()).collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_one_based_char_columns() {
        let text = "a = 1\nsite = \"sō\"\nx";
        // (byte offset, line, column)
        for (offset, line, col) in [
            (0, 1, 1),
            (6, 2, 1),
            // "x" sits after a two-byte 'ō': byte 19, line 3 col 1.
            (19, 3, 1),
            // The closing quote is byte 17 but char column 11.
            (17, 2, 11),
            // Inside a multi-byte char or past the end: clamped, no panic.
            (16, 2, 10),
            (999, 3, 2),
        ] {
            assert_eq!(
                Location::from_offset(text, offset),
                Location { line, col },
                "offset {offset}"
            );
        }
    }

    #[test]
    fn display_is_compiler_like() {
        let d = Diagnostic {
            origin: "bad.toml".into(),
            location: Some(Location { line: 14, col: 8 }),
            key: Some("wan.paths[1].dscp".into()),
            value: Some("70".into()),
            message: "DSCP must be an integer 0..=63".into(),
        };
        assert_eq!(
            d.to_string(),
            "bad.toml:14:8: wan.paths[1].dscp = 70: DSCP must be an integer 0..=63"
        );
    }
}
