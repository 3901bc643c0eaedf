//! What the lab tools (soya-tools: the demo, the soak) may ask of a running
//! `soya` daemon, without reaching into the gateway's modules: the public,
//! documented surface they build on.

use std::io;
use std::path::Path;

/// A gateway's state as its control socket reports it (`soya status`).
pub use crate::gateway::Snapshot;

/// Set (to anything) in a gateway's environment to keep its device threads
/// at normal priority (the demo and the soak run many gateways on few
/// cores; a real gateway raises them).
pub const NORMAL_PRIORITY_ENV: &str = crate::gateway::device::NORMAL_PRIORITY_ENV;

/// Asks the gateway whose control socket is at `socket` (its
/// `control.socket` setting) for its [`Snapshot`]; waits at most 5 s for
/// the answer.
pub fn query(socket: &Path) -> io::Result<Snapshot> {
    crate::gateway::control::query(socket)
}
