//! SIGTERM, SIGINT and SIGHUP for the daemon, on the control plane's tokio
//! runtime (tokio's signal driver does the async-signal-safe part).
//!
//! First SIGTERM/SIGINT: drain; a second: abort. SIGHUP: the daemon's
//! reload function (the `soya` binary's `reload`), run off the runtime's
//! thread.

use std::io;
use std::sync::{Arc, Mutex};

use tokio::signal::unix::{signal, Signal, SignalKind};

use super::Control;

/// What SIGHUP runs: re-read the configuration and apply what it can.
pub type Reload = Box<dyn FnMut() + Send>;

/// The handlers, installed (the process's dispositions changed) but not
/// yet serving.
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    reload: Arc<Mutex<Reload>>,
}

impl Signals {
    /// Installs the handlers. Must run inside the runtime (its signal
    /// driver); from then on SIGTERM no longer kills the process at once.
    pub fn install(reload: Reload) -> io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            reload: Arc::new(Mutex::new(reload)),
        })
    }

    /// Acts on signals until the task is dropped.
    pub async fn serve(mut self, ctl: Control) {
        let mut stops = 0;
        loop {
            tokio::select! {
                Some(()) = self.term.recv() => {}
                Some(()) = self.int.recv() => {}
                Some(()) = self.hup.recv() => {
                    let reload = self.reload.clone();
                    let done = tokio::task::spawn_blocking(move || {
                        if let Ok(mut f) = reload.lock() {
                            f();
                        }
                    });
                    if done.await.is_err() {
                        tracing::error!("SIGHUP: the reload panicked");
                    }
                    continue;
                }
                else => return,
            }
            stops += 1;
            if stops == 1 {
                tracing::info!("stop signal: draining (again to abort)");
                ctl.drain();
            } else {
                tracing::warn!("second stop signal: aborting without drain");
                ctl.abort();
            }
        }
    }
}
