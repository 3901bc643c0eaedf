//! One `--verbs` session, client side and server side (see the module doc
//! of [`super`] for the memory layout and what is checked where).

use std::collections::VecDeque;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::device::{Completion, Connect, Post, Rdma};
use super::{gid_hex, gid_parse, gid_show, VerbsOptions};
use crate::perf::client::{ClientConfig, RunLimit};
use crate::perf::exchange::{Control, Msg, QpInfo, VERSION};
use crate::perf::report::{LatencyReport, PerfReport};
use crate::perf::server::ServerConfig;
use crate::perf::workload::{Layout, Op};
use crate::perf::{PerfError, Shape, MEM_BASE};
use crate::rc::memory::{pattern_check_as, pattern_fill};

/// Offsets of one QP's memory in the registered buffer.
#[derive(Clone, Copy)]
struct Regions {
    layout: Layout,
    depth: usize,
}

impl Regions {
    fn per_qp(&self) -> usize {
        self.layout.mem_size() + self.depth * self.layout.slot() as usize
    }
    fn base(&self, qp: usize) -> usize {
        qp * self.per_qp()
    }
    /// Offset of a target-region VA of QP `qp`.
    fn target(&self, qp: usize, va_off: u64) -> usize {
        self.base(qp) + va_off as usize
    }
    fn ring(&self, qp: usize, n: u64) -> usize {
        self.base(qp)
            + self.layout.mem_size()
            + (n % self.depth as u64) as usize * self.layout.slot() as usize
    }
    fn slot(&self) -> u64 {
        self.layout.slot()
    }
}

fn failed(m: impl Into<String>) -> PerfError {
    PerfError::Failed(m.into())
}

fn shape_ok(shape: &Shape) -> Result<(), String> {
    shape.validate()?;
    let Shape {
        op,
        size,
        qps,
        tx_depth,
        ..
    } = *shape;
    if op == Op::WaitSend {
        return Err("--op wait-send is not available with --verbs".into());
    }
    let ring = u64::from(tx_depth) * Layout::new(MEM_BASE, size).slot() * u64::from(qps);
    if ring > crate::perf::MAX_MEMORY {
        return Err(format!(
            "--tx-depth {tx_depth} x --size {size} x --qps {qps}: {} MiB of message slots (limit {} MiB)",
            ring >> 20,
            crate::perf::MAX_MEMORY >> 20
        ));
    }
    Ok(())
}

fn open(o: &VerbsOptions, regions: Regions, qps: u32) -> Result<Rdma, String> {
    Rdma::open(
        o.device.as_deref(),
        o.gid_index,
        regions.per_qp() * qps as usize,
        qps as usize,
        regions.depth as u32,
    )
}

fn qp_infos(r: &Rdma, regions: Regions, qps: u32, psns: &[u32]) -> Vec<QpInfo> {
    (0..qps as usize)
        .map(|i| QpInfo {
            qpn: r.qpn(i),
            psn: psns[i],
            rkey: r.rkey(),
            vaddr: r.addr() + regions.base(i) as u64,
            len: regions.layout.mem_size() as u64,
        })
        .collect()
}

fn connect_all(
    r: &mut Rdma,
    o: &VerbsOptions,
    mine: &[QpInfo],
    theirs: &[QpInfo],
    gid: [u8; 16],
    mtu: usize,
) -> Result<(), String> {
    for (i, (m, t)) in mine.iter().zip(theirs).enumerate() {
        r.connect(
            i,
            &Connect {
                remote_qpn: t.qpn,
                remote_psn: t.psn,
                local_psn: m.psn,
                remote_gid: gid,
                mtu,
                timeout: o.qp_timeout,
            },
        )?;
    }
    Ok(())
}

/// Fills the target regions as a fresh QP's memory is: every slot with the
/// pattern of `msg_seq` 0 at its VA, the counters zero.
fn init_targets(r: &mut Rdma, regions: Regions, qps: u32) -> Result<(), String> {
    let mut buf = vec![0u8; 3 * regions.slot() as usize];
    pattern_fill(&mut buf, MEM_BASE, 0);
    for q in 0..qps as usize {
        r.write(regions.target(q, 0), &buf)?;
    }
    Ok(())
}

/// A `--verbs` report of a run of `shape` at the negotiated `mtu`.
fn report(role: &str, shape: Shape, mtu: usize) -> PerfReport {
    PerfReport {
        mtu,
        ..PerfReport::of(role, "verbs", shape)
    }
}

fn finish(rep: &mut PerfReport, elapsed: Duration) {
    rep.elapsed_s = elapsed.as_secs_f64();
    if rep.elapsed_s > 0.0 {
        rep.goodput_gbps = rep.bytes as f64 * 8.0 / rep.elapsed_s / 1e9;
        rep.msg_rate_mpps = rep.messages as f64 / rep.elapsed_s / 1e6;
    }
    rep.data_errors = rep.local_data_errors + rep.remote_data_errors.unwrap_or(0);
    rep.ok = rep.errors.is_empty()
        && rep.data_errors == 0
        && rep.failed_completions == 0
        && rep.incomplete == 0;
    rep.error = (!rep.ok).then(|| {
        rep.errors
            .first()
            .cloned()
            .unwrap_or_else(|| "data errors".into())
    });
}

fn note_error(rep: &mut PerfReport, e: String) {
    if rep.errors.len() < 8 {
        rep.errors.push(e);
    }
}

/// Per-QP state of the client's workload.
#[derive(Default)]
struct Driver {
    posted: u64,
    ok: u64,
    failed: u64,
    /// (n, posted at) of outstanding WRs, in posting order.
    inflight: VecDeque<(u64, Instant)>,
}

/// The client's message `n` on QP `q`: prepare the ring slot, then post.
fn post_one(
    r: &mut Rdma,
    regions: Regions,
    op: Op,
    q: usize,
    n: u64,
    remote: &QpInfo,
    scratch: &mut [u8],
) -> Result<(), String> {
    let size = regions.layout.size;
    let local = regions.ring(q, n);
    let seq = (n + 1) as u32;
    let p = match op {
        Op::Write => {
            let va_off = (n % 2) * regions.slot();
            pattern_fill(scratch, MEM_BASE + va_off, seq);
            r.write(local, scratch)?;
            Post::Write {
                local,
                len: size,
                remote_addr: remote.vaddr + va_off,
                rkey: remote.rkey,
            }
        }
        Op::Send | Op::WaitSend => {
            pattern_fill(scratch, MEM_BASE, seq);
            r.write(local, scratch)?;
            Post::Send { local, len: size }
        }
        Op::Read => {
            scratch.fill(0);
            r.write(local, scratch)?;
            Post::Read {
                local,
                len: size,
                remote_addr: remote.vaddr + 2 * regions.slot(),
                rkey: remote.rkey,
            }
        }
        Op::Atomic => {
            r.write(local, &[0; 8])?;
            Post::FetchAdd {
                local,
                remote_addr: remote.vaddr + 3 * regions.slot() + (n % 64) * 8,
                rkey: remote.rkey,
                add: 1,
            }
        }
    };
    r.post(q, (q as u64) << 48 | n, p)
}

/// Checks what the client's message `n` brought back (READ, atomics).
fn check_one(
    r: &Rdma,
    regions: Regions,
    op: Op,
    q: usize,
    n: u64,
    scratch: &mut [u8],
) -> Result<u64, String> {
    let local = regions.ring(q, n);
    match op {
        Op::Read => {
            r.read(local, scratch)?;
            pattern_check_as(scratch, MEM_BASE + 2 * regions.slot(), 0)
                .map_err(|e| format!("QP {q} READ {n}: {e}"))?;
            Ok(scratch.len() as u64)
        }
        Op::Atomic => {
            let mut v = [0u8; 8];
            r.read(local, &mut v)?;
            let got = u64::from_ne_bytes(v);
            if got != n / 64 {
                return Err(format!(
                    "QP {q} fetch-and-add {n}: fetched {got}, expected {}",
                    n / 64
                ));
            }
            Ok(8)
        }
        _ => Ok(0),
    }
}

fn connect_control(cfg: &ClientConfig) -> Result<Control, PerfError> {
    let deadline = Instant::now() + cfg.connect_timeout;
    loop {
        match TcpStream::connect_timeout(&cfg.server, Duration::from_secs(1)) {
            Ok(s) => return Ok(Control::new(s)),
            Err(e) if Instant::now() >= deadline => {
                return Err(failed(format!(
                    "cannot reach the soya-perf server at {}: {e}",
                    cfg.server
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Runs one `--verbs` client session.
pub fn run_client(cfg: &ClientConfig, o: &VerbsOptions) -> Result<PerfReport, PerfError> {
    shape_ok(&cfg.shape()).map_err(PerfError::Usage)?;
    if matches!(cfg.limit, RunLimit::Iters(0)) {
        return Err(PerfError::Usage("--iters must be at least 1".into()));
    }
    let regions = Regions {
        layout: Layout::new(MEM_BASE, cfg.size),
        depth: cfg.tx_depth as usize,
    };
    let mut r = open(o, regions, cfg.qps).map_err(failed)?;
    init_targets(&mut r, regions, cfg.qps).map_err(failed)?;
    let psns: Vec<u32> = (0..cfg.qps)
        .map(|_| rand::random::<u32>() & 0xff_ffff)
        .collect();
    let mine = qp_infos(&r, regions, cfg.qps, &psns);
    let mut ctrl = connect_control(cfg)?;
    ctrl.send(&Msg::VerbsHello {
        version: VERSION,
        shape: cfg.shape(),
        gid: gid_hex(r.gid()),
        qp: mine.clone(),
    })
    .map_err(|e| failed(format!("sending the hello: {e}")))?;
    let (gid, mtu, theirs) = match ctrl.recv(Duration::from_secs(30)) {
        Ok(Msg::VerbsAccept { gid, mtu, qp }) if qp.len() == mine.len() => (gid, mtu, qp),
        Ok(Msg::Error { message }) => return Err(failed(format!("the server refused: {message}"))),
        Ok(m) => {
            return Err(failed(format!(
                "expected the server's verbs accept, got {m:?}"
            )))
        }
        Err(e) => return Err(failed(format!("waiting for the server's accept: {e}"))),
    };
    let peer_gid = gid_parse(&gid).map_err(failed)?;
    let mtu = mtu.min(cfg.mtu).min(r.active_mtu());
    connect_all(&mut r, o, &mine, &theirs, peer_gid, mtu).map_err(failed)?;

    let mut rep = report("client", cfg.shape(), mtu);
    rep.local = format!("{} {}", r.name(), gid_show(r.gid()));
    rep.peer = gid_show(peer_gid);
    let qps = cfg.qps as usize;
    let mut drivers: Vec<Driver> = (0..qps).map(|_| Driver::default()).collect();
    let mut scratch = vec![0u8; cfg.size as usize];
    let mut done: Vec<Completion> = Vec::new();
    let mut lat = Vec::new();
    let start = Instant::now();
    let (limit, stop_at) = match cfg.limit {
        RunLimit::Iters(n) => (n, None),
        RunLimit::Duration(d) => (u64::MAX, Some(start + d)),
    };
    let mut last_progress = start;
    let mut last_completion = start;
    let mut next_line = start + Duration::from_secs(1);
    loop {
        let now = Instant::now();
        let posting = stop_at.is_none_or(|t| now < t) && rep.errors.is_empty();
        for (q, d) in drivers.iter_mut().enumerate() {
            while posting && d.failed == 0 && d.posted < limit && d.inflight.len() < regions.depth {
                if let Err(e) = post_one(
                    &mut r,
                    regions,
                    cfg.op,
                    q,
                    d.posted,
                    &theirs[q],
                    &mut scratch,
                ) {
                    note_error(&mut rep, e);
                    break;
                }
                d.inflight.push_back((d.posted, now));
                d.posted += 1;
            }
        }
        done.clear();
        if let Err(e) = r.poll(&mut done) {
            note_error(&mut rep, e);
            break;
        }
        let now = Instant::now();
        for c in &done {
            let (q, n) = ((c.wr_id >> 48) as usize, c.wr_id & ((1 << 48) - 1));
            let Some(d) = drivers.get_mut(q) else {
                continue;
            };
            let posted_at = loop {
                match d.inflight.pop_front() {
                    Some((m, t)) if m == n => break Some(t),
                    Some(_) => {}
                    None => break None,
                }
            };
            last_progress = now;
            last_completion = now;
            if let Some(e) = &c.error {
                d.failed += 1;
                rep.failed_completions += 1;
                note_error(&mut rep, format!("QP {q} message {n}: {e}"));
                continue;
            }
            d.ok += 1;
            rep.messages += 1;
            rep.bytes += if cfg.op == Op::Atomic {
                8
            } else {
                u64::from(cfg.size)
            };
            if cfg.latency {
                if let Some(t) = posted_at {
                    lat.push((now - t).as_nanos() as u64);
                }
            }
            match check_one(&r, regions, cfg.op, q, n, &mut scratch) {
                Ok(b) => rep.bytes_verified += b,
                Err(e) => {
                    rep.local_data_errors += 1;
                    note_error(&mut rep, e);
                }
            }
        }
        let outstanding: usize = drivers.iter().map(|d| d.inflight.len()).sum();
        let finished = drivers
            .iter()
            .all(|d| d.posted >= limit || d.failed > 0 || !posting);
        if finished && outstanding == 0 {
            break;
        }
        if outstanding > 0 && now.duration_since(last_progress) >= cfg.stall_timeout {
            rep.incomplete = outstanding as u64;
            note_error(
                &mut rep,
                format!(
                    "stalled: {outstanding} work requests outstanding, no completion for {:?}",
                    cfg.stall_timeout
                ),
            );
            break;
        }
        if now >= next_line {
            next_line = now + Duration::from_secs(1);
            let s = now.duration_since(start).as_secs_f64();
            cfg.progress.line(&format!(
                "soya-perf verbs: {:.0} s, {} messages, {:.3} Gb/s",
                s,
                rep.messages,
                rep.bytes as f64 * 8.0 / s / 1e9
            ));
        }
        if done.is_empty() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let elapsed = last_completion.duration_since(start);
    rep.latency = LatencyReport::from_nanos(&mut lat);
    let messages = drivers.iter().map(|d| d.ok).collect();
    match ctrl
        .send(&Msg::VerbsDone { messages })
        .and_then(|()| ctrl.recv(Duration::from_secs(60)))
    {
        Ok(Msg::Summary { report: s }) => {
            rep.remote_data_errors = Some(s.data_errors);
            rep.bytes_verified += s.bytes_verified;
            for e in &s.errors {
                note_error(&mut rep, format!("server: {e}"));
            }
            rep.server = Some(s);
        }
        Ok(m) => note_error(
            &mut rep,
            format!("expected the server's summary, got {m:?}"),
        ),
        Err(e) => note_error(&mut rep, format!("waiting for the server's summary: {e}")),
    }
    finish(&mut rep, elapsed);
    rep.set_client_goodput();
    Ok(rep)
}

/// Serves one `--verbs` session on `listener`.
pub fn serve(
    cfg: &ServerConfig,
    o: &VerbsOptions,
    listener: &TcpListener,
) -> Result<PerfReport, PerfError> {
    listener
        .set_nonblocking(cfg.accept_timeout.is_some())
        .map_err(|e| failed(format!("listener: {e}")))?;
    let deadline = cfg.accept_timeout.map(|t| Instant::now() + t);
    let stream = loop {
        match soya_io::sys::nonblocking(|| listener.accept()) {
            Ok(Some((s, _))) => break s,
            Ok(None) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(failed("no client came"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(failed(format!("accept: {e}"))),
        }
    };
    let _ = stream.set_nonblocking(false);
    let mut ctrl = Control::new(stream);
    let hello = ctrl
        .recv(Duration::from_secs(10))
        .map_err(|e| failed(format!("waiting for the hello: {e}")))?;
    let Msg::VerbsHello {
        shape,
        gid,
        qp: theirs,
        ..
    } = hello
    else {
        let m = "this server runs --verbs (an RDMA device); run the client with --verbs too"
            .to_string();
        let _ = ctrl.send(&Msg::Error { message: m.clone() });
        return Err(failed(m));
    };
    let refuse = |ctrl: &mut Control, m: String| {
        let _ = ctrl.send(&Msg::Error { message: m.clone() });
        Err(failed(m))
    };
    if let Err(m) = shape_ok(&shape) {
        return refuse(&mut ctrl, m);
    }
    let Shape {
        op,
        size,
        qps,
        tx_depth,
        ..
    } = shape;
    if theirs.len() != qps as usize {
        return refuse(
            &mut ctrl,
            format!("{} QPs announced for --qps {qps}", theirs.len()),
        );
    }
    let peer_gid = match gid_parse(&gid) {
        Ok(g) => g,
        Err(m) => return refuse(&mut ctrl, m),
    };
    let regions = Regions {
        layout: Layout::new(MEM_BASE, size),
        depth: tx_depth as usize,
    };
    let mut r = match open(o, regions, qps).and_then(|mut r| {
        init_targets(&mut r, regions, qps)?;
        Ok(r)
    }) {
        Ok(r) => r,
        Err(m) => return refuse(&mut ctrl, m),
    };
    let psns: Vec<u32> = (0..qps)
        .map(|_| rand::random::<u32>() & 0xff_ffff)
        .collect();
    let mine = qp_infos(&r, regions, qps, &psns);
    // The smaller of the two devices' path MTUs wins.
    let mtu = shape.mtu.min(r.active_mtu());
    if let Err(m) = connect_all(&mut r, o, &mine, &theirs, peer_gid, mtu) {
        return refuse(&mut ctrl, m);
    }
    // SENDs need receives posted before the client may send.
    if op == Op::Send {
        for q in 0..qps as usize {
            for k in 0..tx_depth as u64 {
                if let Err(m) = r.post_recv(q, (q as u64) << 48 | k, regions.ring(q, k), size) {
                    return refuse(&mut ctrl, m);
                }
            }
        }
    }
    ctrl.send(&Msg::VerbsAccept {
        gid: gid_hex(r.gid()),
        mtu,
        qp: mine,
    })
    .map_err(|e| failed(format!("sending the accept: {e}")))?;
    let start = Instant::now();
    let mut rep = report("server", shape, mtu);
    rep.local = format!("{} {}", r.name(), gid_show(r.gid()));
    rep.peer = gid_show(peer_gid);
    let mut received = vec![0u64; qps as usize];
    let mut scratch = vec![0u8; size as usize];
    let mut done = Vec::new();
    let mut done_msg: Option<(Vec<u64>, Instant)> = None;
    loop {
        done.clear();
        if let Err(e) = r.poll(&mut done) {
            note_error(&mut rep, e);
            break;
        }
        for c in &done {
            let (q, k) = ((c.wr_id >> 48) as usize, c.wr_id & ((1 << 48) - 1));
            if q >= received.len() {
                continue;
            }
            if let Some(e) = &c.error {
                rep.failed_completions += 1;
                note_error(&mut rep, format!("QP {q} receive: {e}"));
                continue;
            }
            received[q] += 1;
            rep.messages += 1;
            rep.bytes += u64::from(c.byte_len);
            let checked = if c.byte_len != size {
                Err(format!(
                    "QP {q} SEND {}: {} bytes, expected {size}",
                    received[q], c.byte_len
                ))
            } else {
                r.read(regions.ring(q, k), &mut scratch).and_then(|()| {
                    pattern_check_as(&scratch, MEM_BASE, received[q] as u32)
                        .map_err(|e| format!("QP {q} SEND {}: {e}", received[q]))
                })
            };
            match checked {
                Ok(()) => rep.bytes_verified += u64::from(size),
                Err(e) => {
                    rep.local_data_errors += 1;
                    note_error(&mut rep, e);
                }
            }
            if let Err(e) = r.post_recv(q, c.wr_id, regions.ring(q, k), size) {
                note_error(&mut rep, e);
            }
        }
        if done_msg.is_none() {
            match ctrl.try_recv() {
                Ok(Some(Msg::VerbsDone { messages })) if messages.len() == qps as usize => {
                    done_msg = Some((messages, Instant::now() + cfg.drain_timeout));
                }
                Ok(Some(m)) => {
                    note_error(&mut rep, format!("expected done, got {m:?}"));
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    note_error(&mut rep, format!("control connection: {e}"));
                    break;
                }
            }
        }
        if let Some((messages, until)) = &done_msg {
            let settled = match op {
                Op::Send => received == *messages,
                _ => final_state(&r, regions, op, messages).is_ok(),
            };
            let now = Instant::now();
            if settled || now >= *until {
                if op == Op::Send && received != *messages {
                    note_error(
                        &mut rep,
                        format!("received {received:?} SENDs of {messages:?} the client completed"),
                    );
                }
                if op != Op::Send {
                    match final_state(&r, regions, op, messages) {
                        Ok(()) => rep.bytes_verified += verified_bytes(op, size, messages),
                        Err(e) => {
                            rep.local_data_errors += 1;
                            note_error(&mut rep, e);
                        }
                    }
                    rep.messages = messages.iter().sum();
                    let each = if op == Op::Atomic { 8 } else { u64::from(size) };
                    rep.bytes = rep.messages * each;
                }
                break;
            }
        } else if done.is_empty() {
            // A client that goes away closes the control connection, which
            // try_recv reports.
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    finish(&mut rep, start.elapsed());
    let _ = ctrl.send(&Msg::Summary {
        report: Box::new(rep.clone()),
    });
    Ok(rep)
}

/// Bytes the end-of-run check covers.
fn verified_bytes(op: Op, size: u32, messages: &[u64]) -> u64 {
    messages
        .iter()
        .map(|&m| match op {
            Op::Write => m.min(2) * u64::from(size),
            Op::Read => u64::from(size),
            Op::Atomic => 64 * 8,
            _ => 0,
        })
        .sum()
}

/// What the target regions must hold once the client's `messages` are
/// placed: the last WRITE of each slot, the READ slot untouched, each
/// counter incremented once per fetch-and-add aimed at it.
fn final_state(r: &Rdma, regions: Regions, op: Op, messages: &[u64]) -> Result<(), String> {
    let slot = regions.slot();
    let mut buf = vec![0u8; regions.layout.size as usize];
    for (q, &m) in messages.iter().enumerate() {
        match op {
            Op::Write => {
                for s in 0..2u64.min(m) {
                    // the last n < m with n % 2 == s
                    let n = if (m - 1) % 2 == s { m - 1 } else { m - 2 };
                    r.read(regions.target(q, s * slot), &mut buf)?;
                    pattern_check_as(&buf, MEM_BASE + s * slot, (n + 1) as u32)
                        .map_err(|e| format!("QP {q} WRITE slot {s} after {m} WRITEs: {e}"))?;
                }
            }
            Op::Read => {
                r.read(regions.target(q, 2 * slot), &mut buf)?;
                pattern_check_as(&buf, MEM_BASE + 2 * slot, 0)
                    .map_err(|e| format!("QP {q} READ slot changed: {e}"))?;
            }
            Op::Atomic => {
                let mut c = [0u8; 8 * 64];
                r.read(regions.target(q, 3 * slot), &mut c)?;
                for (k, v) in c.chunks(8).enumerate() {
                    let got = u64::from_ne_bytes(v.try_into().unwrap_or([0; 8]));
                    let want = m / 64 + u64::from((k as u64) < m % 64);
                    if got != want {
                        return Err(format!(
                            "QP {q} counter {k} is {got} after {m} fetch-and-adds (expected {want})"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_slots_follow_the_target_region() {
        let r = Regions {
            layout: Layout::new(MEM_BASE, 4096),
            depth: 4,
        };
        assert_eq!(r.per_qp(), 3 * 4096 + 4096 + 4 * 4096);
        assert_eq!(r.ring(0, 0), r.layout.mem_size());
        assert_eq!(r.ring(0, 5), r.ring(0, 1));
        assert_eq!(r.ring(1, 0), r.per_qp() + r.layout.mem_size());
        assert_eq!(verified_bytes(Op::Write, 4096, &[1, 5]), 4096 + 2 * 4096);
    }

    #[test]
    fn wait_send_and_oversized_rings_are_refused() {
        let shape = |op, size, tx_depth| Shape {
            op,
            size,
            qps: 1,
            tx_depth,
            mtu: 4096,
        };
        assert!(shape_ok(&shape(Op::WaitSend, 64, 1)).is_err());
        assert!(shape_ok(&shape(Op::Write, 64 << 20, 128)).is_err());
        assert!(shape_ok(&shape(Op::Write, 65536, 128)).is_ok());
    }
}
