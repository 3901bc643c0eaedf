//! The out-of-band exchange, over TCP as perftest does it (default port
//! 18515), one JSON object per line:
//!
//! ```text
//! client -> server  {"type":"hello", op, size, qps, tx_depth, mtu, ip, port, qp:[{qpn,psn,rkey,vaddr,len}]}
//! server -> client  {"type":"accept", ip, port, qp:[...]}   or {"type":"error", message}
//!                   ... RoCEv2 traffic between ip:port and ip:port ...
//! client -> server  {"type":"done"}
//! server -> client  {"type":"summary", report:{...}}          (then both close)
//! ```
//!
//! perftest's own format (`%04x:%04x:%06x:%06x:%08x:%016llx:%08x` + GID)
//! is not spoken yet.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::report::PerfReport;
use super::Shape;

/// Protocol version in the hello.
pub const VERSION: u32 = 1;
/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Longest control line accepted.
const MAX_LINE: usize = 1 << 20;

/// What one side tells the other about one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    pub qpn: u32,
    /// The first PSN this QP sends.
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub len: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    Hello {
        version: u32,
        #[serde(flatten)]
        shape: Shape,
        /// The client's RoCE address and UDP port.
        ip: IpAddr,
        port: u16,
        qp: Vec<QpInfo>,
        /// `wait-send`: how long the server waits between its first SEND
        /// and the second (ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        send_after_ms: Option<u64>,
    },
    Accept {
        ip: IpAddr,
        port: u16,
        qp: Vec<QpInfo>,
    },
    Error {
        message: String,
    },
    Done,
    /// Like `Done`, but the server first waits (at most its drain timeout,
    /// [`DRAIN_MAX`] by default)
    /// until it has placed `bytes` of WRITE/SEND payload: behind a Sōya
    /// gateway's pseudo-ACKs, the client's completions run ahead of
    /// placement at the server.
    DoneAfter {
        bytes: u64,
    },
    Summary {
        report: Box<PerfReport>,
    },
    /// `--verbs`: the hello of a session between two RDMA devices. The QPs
    /// are the devices' own; `gid` is the client's (hex, 32 digits); `vaddr`
    /// is the real address of each QP's region in the client's registered
    /// buffer. A server without the verbs transport answers `Error`.
    VerbsHello {
        version: u32,
        #[serde(flatten)]
        shape: Shape,
        gid: String,
        qp: Vec<QpInfo>,
    },
    VerbsAccept {
        gid: String,
        /// The path MTU the server's device runs (the smaller one wins).
        mtu: usize,
        qp: Vec<QpInfo>,
    },
    /// `--verbs`: the client is done; `messages[i]` WRs of QP i completed
    /// successfully (in posting order), so the server knows what its memory
    /// must hold.
    VerbsDone {
        messages: Vec<u64>,
    },
}

/// Longest a server waits for the data a `DoneAfter` announces (the
/// default of `ServerConfig::drain_timeout`, `--drain-timeout`).
pub const DRAIN_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A control connection: JSON lines, read with a deadline or without
/// blocking.
pub struct Control {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Control {
    pub fn new(stream: TcpStream) -> Control {
        let _ = stream.set_nodelay(true);
        Control {
            stream,
            buf: Vec::new(),
            eof: false,
        }
    }

    pub fn peer(&self) -> String {
        self.stream
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string())
    }

    pub fn send(&mut self, m: &Msg) -> io::Result<()> {
        let mut line = serde_json::to_vec(m).map_err(io::Error::other)?;
        line.push(b'\n');
        self.stream.set_nonblocking(false)?;
        self.stream.write_all(&line)
    }

    /// A complete line already buffered, parsed.
    fn take_line(&mut self) -> io::Result<Option<Msg>> {
        let Some(i) = self.buf.iter().position(|&b| b == b'\n') else {
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "control line too long",
                ));
            }
            return Ok(None);
        };
        let line: Vec<u8> = self.buf.drain(..=i).collect();
        serde_json::from_slice(&line[..i])
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad message: {e}")))
    }

    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 4096];
        match self.stream.read(&mut chunk) {
            Ok(0) => {
                self.eof = true;
                Ok(0)
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }

    /// The next message, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Msg> {
        let deadline = Instant::now() + timeout;
        self.stream.set_nonblocking(false)?;
        loop {
            if let Some(m) = self.take_line()? {
                return Ok(m);
            }
            if self.eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the control connection",
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer on the control connection",
                ));
            }
            self.stream.set_read_timeout(Some(left))?;
            // A read timeout (the deadline check above decides) or an
            // interrupted read: loop.
            match soya_io::sys::nonblocking(|| self.fill()) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A message if one has arrived, without blocking. `Err` on EOF.
    pub fn try_recv(&mut self) -> io::Result<Option<Msg>> {
        if let Some(m) = self.take_line()? {
            return Ok(Some(m));
        }
        if !self.eof {
            self.stream.set_nonblocking(true)?;
            // Until the socket is drained (or closed).
            while let Some(n) = soya_io::sys::nonblocking(|| self.fill())? {
                if n == 0 {
                    break;
                }
            }
        }
        if let Some(m) = self.take_line()? {
            return Ok(Some(m));
        }
        if self.eof {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed the control connection",
            ));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::Op;

    #[test]
    fn messages_round_trip_as_json_lines() {
        let m = Msg::Hello {
            version: VERSION,
            shape: Shape {
                op: Op::Read,
                size: 4096,
                qps: 1,
                tx_depth: 8,
                mtu: 4096,
            },
            ip: "127.0.0.2".parse().unwrap(),
            port: 4791,
            qp: vec![QpInfo {
                qpn: 0x11,
                psn: 0x123456,
                rkey: 0xdead,
                vaddr: 0x10_0000,
                len: 65536,
            }],
            send_after_ms: None,
        };
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.starts_with(r#"{"type":"hello""#), "{s}");
        assert!(s.contains(r#""op":"read""#));
        assert_eq!(serde_json::from_str::<Msg>(&s).unwrap(), m);
        assert!(!s.contains("send_after_ms"), "absent unless wait-send");
        // The shape's fields are the hello's own keys, as peers built
        // before `Shape` existed send them.
        let flat = r#"{"type":"hello","version":1,"op":"read","size":4096,"qps":1,"tx_depth":8,
            "mtu":4096,"ip":"127.0.0.2","port":4791,"qp":[{"qpn":17,"psn":1193046,
            "rkey":57005,"vaddr":1048576,"len":65536}]}"#;
        assert_eq!(serde_json::from_str::<Msg>(flat).unwrap(), m);
        assert!(!s.contains("shape"), "{s}");
        let d = serde_json::to_string(&Msg::Done).unwrap();
        assert_eq!(d, r#"{"type":"done"}"#);
    }
}
