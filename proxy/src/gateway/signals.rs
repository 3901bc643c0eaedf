//! SIGTERM, SIGINT and SIGHUP for the daemon: the handler writes the signal
//! number into a pipe (async-signal-safe); [`Signals::wait`] reads it on an
//! ordinary thread.

use std::fs::File;
use std::io::{self, Read};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::sys;

static PIPE_WR: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE_WR.load(Ordering::Relaxed);
    if fd >= 0 {
        sys::write_byte(fd, sig as u8);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM or SIGINT: drain and exit.
    Stop,
    /// SIGHUP: re-read the configuration.
    Reload,
}

pub struct Signals {
    rd: File,
}

impl Signals {
    /// Installs the handlers (once per process).
    pub fn install() -> io::Result<Signals> {
        let (rd, wr) = sys::pipe()?;
        use std::os::fd::IntoRawFd;
        // The write end lives as long as the process.
        PIPE_WR.store(wr.into_raw_fd(), Ordering::Relaxed);
        sys::install_signal_handler(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP], on_signal)?;
        Ok(Signals { rd: File::from(rd) })
    }

    /// Blocks until the next signal.
    pub fn wait(&mut self) -> Option<Signal> {
        let mut b = [0u8; 1];
        loop {
            match self.rd.read(&mut b) {
                Ok(1) => {
                    return Some(if i32::from(b[0]) == libc::SIGHUP {
                        Signal::Reload
                    } else {
                        Signal::Stop
                    })
                }
                Ok(_) => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }
}
