//! The problem collector every resolver of the configuration shares
//! ([`crate::validate`], [`crate::buffer`]).

use std::net::SocketAddr;
use std::ops::RangeInclusive;

/// One problem, by key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub path: String,
    pub message: String,
}

const SOCKET_ACCEPTED: &str = "an IP:port socket address like \"192.0.2.1:7400\" \
     (IPv6 in brackets: \"[2001:db8::1]:7400\"; host names are not resolved)";

/// Collects problems while resolving.
#[derive(Default)]
pub(crate) struct Checker {
    pub problems: Vec<Problem>,
}

impl Checker {
    pub fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// An optional integer with a default and an inclusive range.
    pub fn int<T: TryFrom<i64> + Copy>(
        &mut self,
        path: &str,
        value: Option<i64>,
        default: T,
        range: RangeInclusive<i64>,
        what: &str,
    ) -> Option<T> {
        let Some(v) = value else { return Some(default) };
        match T::try_from(v) {
            Ok(t) if range.contains(&v) => Some(t),
            _ => {
                self.err(
                    path,
                    format!(
                        "{what} must be an integer {}..={}",
                        range.start(),
                        range.end()
                    ),
                );
                None
            }
        }
    }

    /// A required value: reports `missing; <hint>` if absent.
    pub fn required<'a, T>(
        &mut self,
        path: &str,
        value: &'a Option<T>,
        hint: &str,
    ) -> Option<&'a T> {
        if value.is_none() {
            self.err(path, format!("missing; {hint}"));
        }
        value.as_ref()
    }

    /// Parses `IP:port`; port 0 is refused because every address in this file
    /// is one that something else must be able to reach.
    pub fn socket(&mut self, path: &str, s: &str) -> Option<SocketAddr> {
        match s.trim().parse::<SocketAddr>() {
            Ok(a) if a.port() == 0 => {
                self.err(
                    path,
                    "port 0 is not allowed here: the other side needs a fixed port",
                );
                None
            }
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    path,
                    format!("not a socket address; expected {SOCKET_ACCEPTED}"),
                );
                None
            }
        }
    }
}
