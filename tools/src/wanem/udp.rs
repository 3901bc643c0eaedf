//! UDP relay mode.
//!
//! ```text
//! client ──▶ listen ══ A→B profile ══▶ upstream ──▶ forward
//! client ◀── listen ◀══ B→A profile ══ upstream ◀── forward
//! ```
//!
//! Per path: a `listen` socket for clients, and an `upstream` socket
//! connected to `forward` (so only the far side's replies are accepted).
//! Datagrams from a client go, impaired by the A→B profile, to `forward`;
//! replies from `forward` go, impaired by the B→A profile, to the most
//! recent client. One engine thread per direction.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::engine::{self, DirectionFn, Emulator, EngineOptions, PacketIo};
use crate::sim::link::LinkProfile;
use soya_io::sys::batch::{RecvBatch, RxMeta, SendBatch, SendOutcome};
use soya_io::sys::{self, RawAddr};

/// One listen/forward pair and its two profiles.
#[derive(Clone, Debug)]
pub struct PathSpec {
    pub name: String,
    pub listen: SocketAddr,
    pub forward: SocketAddr,
    pub a_to_b: LinkProfile,
    pub b_to_a: LinkProfile,
}

/// The most recent client of a path, written by A→B, read by B→A.
#[derive(Default)]
struct ClientSlot {
    generation: AtomicU64,
    addr: Mutex<Option<RawAddr>>,
}

/// What a direction does with its path's most recent client.
enum Role {
    /// A→B: publishes the source of what it reads (the client) for B→A.
    ToForward { last: Option<RawAddr> },
    /// B→A: sends to the client A→B saw last.
    ToClient { seen: u64, dest: Option<RawAddr> },
}

/// One direction of a path: reads `rx`, sends on `tx`.
struct UdpDir {
    rx: Arc<UdpSocket>,
    tx: Arc<UdpSocket>,
    rb: RecvBatch,
    sb: SendBatch,
    client: Arc<ClientSlot>,
    role: Role,
}

impl PacketIo for UdpDir {
    fn rx_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    fn recv(&mut self, bufs: &mut [&mut [u8]], meta: &mut [RxMeta]) -> io::Result<usize> {
        let n = self.rb.recv_into(self.rx.as_raw_fd(), bufs, meta)?;
        if let Role::ToForward { last } = &mut self.role {
            if n > 0 {
                let src = self.rb.source(n - 1);
                if !last.is_some_and(|l| l.same(&src)) {
                    *last = Some(src);
                    *self.client.addr.lock().unwrap() = Some(src);
                    self.client.generation.fetch_add(1, Ordering::Release);
                }
            }
        }
        Ok(n)
    }

    fn landing(&self, i: usize) -> &[u8] {
        self.rb.landing(i)
    }

    fn kernel_timestamps(&self) -> bool {
        true
    }

    fn kernel_drops(&self) -> u64 {
        self.rb.kernel_drops
    }

    fn send(&mut self, pkts: &[&[u8]]) -> SendOutcome {
        let fd = self.tx.as_raw_fd();
        match &mut self.role {
            // Connected to `forward`.
            Role::ToForward { .. } => self.sb.send_slices(fd, pkts, None),
            Role::ToClient { seen, dest } => {
                let g = self.client.generation.load(Ordering::Acquire);
                if g != *seen {
                    *seen = g;
                    *dest = *self.client.addr.lock().unwrap();
                }
                match dest {
                    Some(d) => self.sb.send_slices(fd, pkts, Some(d)),
                    // No client has spoken yet: nobody to reply to.
                    None => SendOutcome {
                        failed: pkts.len(),
                        ..Default::default()
                    },
                }
            }
        }
    }
}

/// A direction's engine thread: builds its I/O state there (batch headers
/// and scratch are per thread), then runs the engine.
fn direction(
    (rx, tx): (Arc<UdpSocket>, Arc<UdpSocket>),
    client: Arc<ClientSlot>,
    role: Role,
    opts: &EngineOptions,
) -> DirectionFn {
    let (batch, gso) = (opts.batch, opts.offload);
    let landing = if opts.offload {
        soya_io::sys::batch::MAX_UDP_PAYLOAD
            .saturating_sub(opts.max_datagram.min(soya_io::sys::batch::MAX_UDP_PAYLOAD))
    } else {
        0
    };
    engine::direction(move || UdpDir {
        rx,
        tx,
        rb: RecvBatch::new(batch, landing),
        sb: SendBatch::new(batch, gso),
        client,
        role,
    })
}

fn bind(addr: SocketAddr, what: &str) -> io::Result<UdpSocket> {
    UdpSocket::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {what} {addr}: {e}")))
}

/// Binds every path's sockets (all errors before any thread starts),
/// then starts two engine threads per path.
pub fn start(paths: Vec<PathSpec>, opts: &EngineOptions) -> io::Result<Emulator> {
    let mut socks = Vec::new();
    for p in &paths {
        let listen = bind(p.listen, &format!("path {} listen", p.name))?;
        let any: SocketAddr = if p.forward.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let up = bind(any, &format!("path {} upstream", p.name))?;
        up.connect(p.forward).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("path {}: cannot reach forward {}: {e}", p.name, p.forward),
            )
        })?;
        for s in [&listen, &up] {
            s.set_nonblocking(true)?;
            sys::tune_udp_socket(s.as_raw_fd(), opts.socket_buffer);
            if opts.offload {
                sys::enable_gro(s.as_raw_fd());
            }
        }
        socks.push((Arc::new(listen), Arc::new(up)));
    }
    let mut emu = Emulator::new();
    for (i, (p, (listen, up))) in paths.into_iter().zip(socks).enumerate() {
        let client = Arc::new(ClientSlot::default());
        let listen_addr = listen.local_addr()?;
        let to_forward = Role::ToForward { last: None };
        let to_client = Role::ToClient {
            seen: 0,
            dest: None,
        };
        emu.add_path(
            &p.name,
            listen_addr.to_string(),
            p.forward.to_string(),
            [
                (
                    p.a_to_b,
                    direction(
                        (listen.clone(), up.clone()),
                        client.clone(),
                        to_forward,
                        opts,
                    ),
                ),
                (p.b_to_a, direction((up, listen), client, to_client, opts)),
            ],
            opts,
            i,
        )?;
    }
    Ok(emu)
}
