//! The control plane: one thread (`soya-control`) driving a current-thread
//! tokio runtime, off the data path. It serves `/metrics`
//! ([`super::metrics::http`]), the control socket ([`super::control`]) and,
//! for the daemon, the signals ([`super::signals`]).
//!
//! Nothing here touches a state machine: a scrape or a `status` asks the
//! device loops for a [`super::snapshot::Snapshot`] and waits for it on a
//! blocking-pool thread (the device loops answer between two turns).

use std::io;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

use super::signals::{Reload, Signals};
use super::{control, metrics, Control, Shared};

/// A runtime built (and the signal handlers installed, for the daemon)
/// before the gateway opens its sockets.
pub struct ControlPlane {
    rt: Runtime,
    signals: Option<Signals>,
}

/// What the control plane serves.
pub struct Listeners {
    pub metrics: Option<TcpListener>,
    pub control: UnixListener,
    /// Removed when the control plane stops.
    pub control_path: PathBuf,
}

impl ControlPlane {
    /// Builds the runtime; with `reload`, installs the signal handlers
    /// (SIGHUP runs `reload`).
    pub fn new(reload: Option<Reload>) -> io::Result<ControlPlane> {
        let rt = Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .thread_name("soya-control-pool")
            // Scrapes and `status` requests waiting for a snapshot.
            .max_blocking_threads(8)
            .build()?;
        let signals = match reload {
            Some(r) => {
                let _in = rt.enter();
                Some(Signals::install(r).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot install signal handlers: {e}"))
                })?)
            }
            None => None,
        };
        Ok(ControlPlane { rt, signals })
    }

    /// Serves until every device loop has ended, then removes the control
    /// socket file.
    pub fn start(self, listeners: Listeners, shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
        let ControlPlane { rt, signals } = self;
        std::thread::Builder::new()
            .name("soya-control".into())
            .spawn(move || {
                let mut stopped = shared.stopped_watch();
                rt.block_on(async {
                    let mut tasks = tokio::task::JoinSet::new();
                    if let Some(l) = listeners.metrics {
                        tasks.spawn(metrics::http::serve(l, shared.clone()));
                    }
                    tasks.spawn(control::serve(listeners.control, shared.clone()));
                    if let Some(s) = signals {
                        tasks.spawn(s.serve(Control(shared.clone())));
                    }
                    let _ = stopped.wait_for(|s| *s).await;
                    tasks.abort_all();
                });
                // Snapshot waits end as soon as the loops are gone.
                rt.shutdown_timeout(Duration::from_secs(1));
                let _ = std::fs::remove_file(&listeners.control_path);
            })
    }
}
