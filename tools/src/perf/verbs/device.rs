//! The only unsafe code of `soya-perf --verbs`: one RDMA device context and
//! everything a session allocates on it (protection domain, one completion
//! queue, one registered buffer, RC queue pairs), through libibverbs.
//!
//! Why `ibverbs-sys` and not the safe `ibverbs` API: `ibverbs` 0.9 posts
//! only SENDs (`QueuePair::post_send` hard-codes `IBV_WR_SEND`) and keeps its
//! handles (QP, MR, PD pointers, the MR's lkey) private, so a WRITE, READ or
//! atomic cannot be posted on a QP it built. `ibverbs-sys` is `ibverbs`'s own
//! FFI layer (same project, same build); `rdma-sys` would be a second
//! binding of the same library whose types cannot mix with it, and would
//! also need librdmacm, which this tool does not use (QPs are connected
//! through soya-perf's TCP exchange, as perftest does).
//!
//! Everything here is a plain resource with bounds-checked accessors: the
//! safe session code never sees a pointer.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::ptr;

use ibverbs_sys as ffi;

/// One work request, with offsets into the registered buffer.
#[derive(Clone, Copy, Debug)]
pub enum Post {
    Write {
        local: usize,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    },
    Read {
        local: usize,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    },
    Send {
        local: usize,
        len: u32,
    },
    /// 8-byte fetch-and-add; the old value lands at `local`.
    FetchAdd {
        local: usize,
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

/// A completion, as the session needs it.
#[derive(Clone, Debug)]
pub struct Completion {
    pub wr_id: u64,
    /// `None` on success, else libibverbs' name of the status.
    pub error: Option<String>,
    pub byte_len: u32,
}

/// How a QP is connected to its peer.
#[derive(Clone, Copy, Debug)]
pub struct Connect {
    pub remote_qpn: u32,
    pub remote_psn: u32,
    pub local_psn: u32,
    pub remote_gid: [u8; 16],
    /// Path MTU in bytes (1024, 2048, 4096).
    pub mtu: usize,
    /// Local ACK timeout exponent (4.096 µs × 2^n), as perftest's `-u`.
    pub timeout: u8,
}

/// A device context with one PD, CQ, buffer and MR, and the session's QPs.
pub struct Rdma {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    mr: *mut ffi::ibv_mr,
    buf: *mut u8,
    buf_layout: std::alloc::Layout,
    qps: Vec<*mut ffi::ibv_qp>,
    port: u8,
    gid_index: u8,
    gid: [u8; 16],
    active_mtu: usize,
    max_rd_atomic: u8,
    name: String,
}

/// Calls a provider's `post_send`/`post_recv` with one work request:
/// `ibv_post_send` and `ibv_post_recv` are inline functions in verbs.h, so
/// the bindings have no symbol for them and go through the context's ops as
/// they do.
///
/// # Safety
/// `q` is a live QP, `post` its context's entry for `wr`'s queue, and `wr`
/// (with its SGEs) valid for the call.
unsafe fn provider_post<W>(
    q: *mut ffi::ibv_qp,
    post: Option<unsafe extern "C" fn(*mut ffi::ibv_qp, *mut W, *mut *mut W) -> i32>,
    wr: &mut W,
    what: &str,
) -> Result<(), String> {
    let post = post.ok_or_else(|| format!("the provider has no {what}"))?;
    let mut bad = ptr::null_mut();
    match post(q, wr, &mut bad) {
        0 => Ok(()),
        rc => Err(format!("ibv_{what}: {}", io::Error::from_raw_os_error(rc))),
    }
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn mtu_bytes(m: ffi::ibv_mtu) -> usize {
    match m {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

fn mtu_enum(bytes: usize) -> ffi::ibv_mtu {
    match bytes {
        0..=1024 => ffi::IBV_MTU_1024,
        1025..=2048 => ffi::IBV_MTU_2048,
        _ => ffi::IBV_MTU_4096,
    }
}

/// Names of the RDMA devices present (empty when there are none), from
/// the safe `ibverbs` API: listing needs nothing it keeps private.
pub fn device_names() -> Vec<String> {
    let Ok(list) = ibverbs::devices() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

impl Rdma {
    /// Opens `device` (default: the first one) on port 1, registers a
    /// zeroed buffer of `mem_len` bytes (local write, remote read/write/
    /// atomic) and creates `qps` RC QPs of `depth` send and receive WRs
    /// sharing one CQ.
    pub fn open(
        device: Option<&str>,
        gid_index: u8,
        mem_len: usize,
        qps: usize,
        depth: u32,
    ) -> Result<Rdma, String> {
        let mut r = Rdma {
            ctx: ptr::null_mut(),
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            mr: ptr::null_mut(),
            buf: ptr::null_mut(),
            buf_layout: std::alloc::Layout::from_size_align(mem_len.max(4096), 4096)
                .map_err(|e| format!("buffer of {mem_len} bytes: {e}"))?,
            qps: Vec::new(),
            port: 1,
            gid_index,
            gid: [0; 16],
            active_mtu: 1024,
            max_rd_atomic: 1,
            name: String::new(),
        };
        // Every early return drops `r`, which frees what was set up so far.
        // SAFETY: plain libibverbs calls; every pointer is checked before use
        // and owned by `r` from then on.
        unsafe {
            let mut n = 0;
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() {
                // ENOSYS: no RDMA support in the kernel (no ib_uverbs).
                return Err(os_err(
                    "no RDMA device found: cannot list RDMA devices (is ib_uverbs loaded? \
                     for Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev ETH)",
                ));
            }
            let mut names = Vec::new();
            let mut chosen: *mut ffi::ibv_device = ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let dev = *list.add(i);
                let name = CStr::from_ptr(ffi::ibv_get_device_name(dev))
                    .to_string_lossy()
                    .into_owned();
                if chosen.is_null() && device.is_none_or(|d| d == name) {
                    chosen = dev;
                    r.name.clone_from(&name);
                }
                names.push(name);
            }
            if !chosen.is_null() {
                r.ctx = ffi::ibv_open_device(chosen);
            }
            ffi::ibv_free_device_list(list);
            if chosen.is_null() {
                return Err(match (device, names.is_empty()) {
                    (_, true) => "no RDMA device found (for Soft-RoCE: modprobe rdma_rxe; \
                                  rdma link add rxe0 type rxe netdev ETH)"
                        .into(),
                    (Some(d), false) => {
                        format!("no RDMA device {d:?}; present: {}", names.join(", "))
                    }
                    (None, false) => unreachable_none(),
                });
            }
            if r.ctx.is_null() {
                return Err(os_err(&format!("cannot open RDMA device {}", r.name)));
            }
            let mut pa: ffi::ibv_port_attr = std::mem::zeroed();
            if ffi::ibv_query_port(r.ctx, r.port, &mut pa as *mut ffi::ibv_port_attr as *mut _) != 0
            {
                return Err(os_err(&format!("{}: ibv_query_port", r.name)));
            }
            if pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
                return Err(format!(
                    "{} port {}: not active (state {}); is its network interface up?",
                    r.name, r.port, pa.state
                ));
            }
            r.active_mtu = mtu_bytes(pa.active_mtu);
            if i32::from(gid_index) >= pa.gid_tbl_len {
                return Err(format!(
                    "--gid-index {gid_index}: {} has {} GIDs",
                    r.name, pa.gid_tbl_len
                ));
            }
            let mut gid: ffi::ibv_gid = std::mem::zeroed();
            if ffi::ibv_query_gid(r.ctx, r.port, i32::from(gid_index), &mut gid) != 0 {
                return Err(os_err(&format!("{}: GID {gid_index}", r.name)));
            }
            r.gid = gid.raw;
            if r.gid == [0; 16] {
                return Err(format!(
                    "{} GID index {gid_index} is empty (no address on its interface? see \
                     `ibv_devinfo -v` or `show_gids`)",
                    r.name
                ));
            }
            let mut da: ffi::ibv_device_attr = std::mem::zeroed();
            if ffi::ibv_query_device(r.ctx, &mut da) == 0 {
                r.max_rd_atomic = da.max_qp_rd_atom.clamp(1, 16) as u8;
            }
            r.pd = ffi::ibv_alloc_pd(r.ctx);
            if r.pd.is_null() {
                return Err(os_err("ibv_alloc_pd"));
            }
            let cqe = (depth as usize * 2 * qps).clamp(16, 65_536) as i32;
            r.cq = ffi::ibv_create_cq(r.ctx, cqe, ptr::null_mut(), ptr::null_mut(), 0);
            if r.cq.is_null() {
                return Err(os_err(&format!("ibv_create_cq ({cqe} entries)")));
            }
            r.buf = std::alloc::alloc_zeroed(r.buf_layout);
            if r.buf.is_null() {
                return Err(format!("cannot allocate {mem_len} bytes"));
            }
            let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
            r.mr = ffi::ibv_reg_mr(r.pd, r.buf.cast(), r.buf_layout.size(), access.0 as i32);
            if r.mr.is_null() {
                return Err(os_err(&format!(
                    "ibv_reg_mr of {} bytes (ulimit -l?)",
                    r.buf_layout.size()
                )));
            }
            for _ in 0..qps {
                let mut init = ffi::ibv_qp_init_attr {
                    qp_context: ptr::null_mut(),
                    send_cq: r.cq,
                    recv_cq: r.cq,
                    srq: ptr::null_mut(),
                    cap: ffi::ibv_qp_cap {
                        max_send_wr: depth,
                        max_recv_wr: depth,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                    sq_sig_all: 1,
                };
                let qp = ffi::ibv_create_qp(r.pd, &mut init);
                if qp.is_null() {
                    return Err(os_err(&format!("ibv_create_qp (depth {depth})")));
                }
                r.qps.push(qp);
            }
        }
        Ok(r)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }
    pub fn active_mtu(&self) -> usize {
        self.active_mtu
    }
    pub fn len(&self) -> usize {
        self.buf_layout.size()
    }
    /// The buffer's address as the peer's RDMA operations name it.
    pub fn addr(&self) -> u64 {
        self.buf as u64
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is valid for the life of `self` (set in `open`).
        unsafe { (*self.mr).rkey }
    }
    pub fn qpn(&self, qp: usize) -> u32 {
        // SAFETY: every entry of `qps` is a live QP.
        unsafe { (*self.qps[qp]).qp_num }
    }

    fn range(&self, off: usize, len: usize) -> Result<(), String> {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(format!(
                "buffer range {off}+{len} outside {} bytes",
                self.len()
            )),
        }
    }

    /// Copies out of the registered buffer (the device may write it at any
    /// time; these are byte copies, never Rust references into it).
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<(), String> {
        self.range(off, out.len())?;
        // SAFETY: in bounds (checked); `out` is a distinct Rust buffer.
        unsafe { ptr::copy_nonoverlapping(self.buf.add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    pub fn write(&mut self, off: usize, data: &[u8]) -> Result<(), String> {
        self.range(off, data.len())?;
        // SAFETY: in bounds (checked); `data` is a distinct Rust buffer.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.buf.add(off), data.len()) };
        Ok(())
    }

    /// INIT -> RTR -> RTS against the peer QP.
    pub fn connect(&mut self, qp: usize, c: &Connect) -> Result<(), String> {
        let q = self.qps[qp];
        let mtu = mtu_enum(c.mtu.min(self.active_mtu));
        // SAFETY: `q` is a live QP; the attribute structs are fully initialised.
        unsafe {
            let mut a: ffi::ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = self.port;
            a.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
                .0;
            use ffi::ibv_qp_attr_mask as M;
            let m =
                M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
            if ffi::ibv_modify_qp(q, &mut a, m.0 as i32) != 0 {
                return Err(os_err("QP to INIT"));
            }
            let mut a: ffi::ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
            a.path_mtu = mtu;
            a.dest_qp_num = c.remote_qpn;
            a.rq_psn = c.remote_psn & 0xff_ffff;
            a.max_dest_rd_atomic = self.max_rd_atomic;
            a.min_rnr_timer = 12; // 0.64 ms
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = c.remote_gid;
            a.ah_attr.grh.sgid_index = self.gid_index;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.port_num = self.port;
            let m = M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER;
            if ffi::ibv_modify_qp(q, &mut a, m.0 as i32) != 0 {
                return Err(os_err(
                    "QP to RTR (wrong --gid-index, or the peer's GID unreachable?)",
                ));
            }
            let mut a: ffi::ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
            a.timeout = c.timeout;
            a.retry_cnt = 7;
            a.rnr_retry = 7; // infinite: a receiver re-posting late is not an error
            a.sq_psn = c.local_psn & 0xff_ffff;
            a.max_rd_atomic = self.max_rd_atomic;
            let m = M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC;
            if ffi::ibv_modify_qp(q, &mut a, m.0 as i32) != 0 {
                return Err(os_err("QP to RTS"));
            }
        }
        Ok(())
    }

    /// Posts one signalled work request on `qp`'s send queue.
    pub fn post(&mut self, qp: usize, wr_id: u64, p: Post) -> Result<(), String> {
        let (local, len) = match p {
            Post::Write { local, len, .. }
            | Post::Read { local, len, .. }
            | Post::Send { local, len } => (local, len),
            Post::FetchAdd { local, .. } => (local, 8),
        };
        let mut sge = self.sge(local, len)?;
        // SAFETY: the WR and its SGE live until ibv_post_send returns, which
        // copies them.
        unsafe {
            let mut wr: ffi::ibv_send_wr = std::mem::zeroed();
            wr.wr_id = wr_id;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            match p {
                Post::Write {
                    remote_addr, rkey, ..
                }
                | Post::Read {
                    remote_addr, rkey, ..
                } => {
                    wr.opcode = if matches!(p, Post::Write { .. }) {
                        ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                    } else {
                        ffi::ibv_wr_opcode::IBV_WR_RDMA_READ
                    };
                    wr.wr.rdma.remote_addr = remote_addr;
                    wr.wr.rdma.rkey = rkey;
                }
                Post::Send { .. } => wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND,
                Post::FetchAdd {
                    remote_addr,
                    rkey,
                    add,
                    ..
                } => {
                    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                    wr.wr.atomic.remote_addr = remote_addr;
                    wr.wr.atomic.rkey = rkey;
                    wr.wr.atomic.compare_add = add;
                }
            }
            let q = self.qps[qp];
            provider_post(q, (*(*q).context).ops.post_send, &mut wr, "post_send")
        }
    }

    /// Posts a receive of `len` bytes at `local` on `qp`.
    pub fn post_recv(
        &mut self,
        qp: usize,
        wr_id: u64,
        local: usize,
        len: u32,
    ) -> Result<(), String> {
        let mut sge = self.sge(local, len)?;
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: as in `post`.
        unsafe {
            let q = self.qps[qp];
            provider_post(q, (*(*q).context).ops.post_recv, &mut wr, "post_recv")
        }
    }

    /// The scatter/gather entry of `len` bytes at `local` in the registered
    /// buffer, checked to lie inside it.
    fn sge(&self, local: usize, len: u32) -> Result<ffi::ibv_sge, String> {
        self.range(local, len as usize)?;
        // SAFETY: `local` is inside the buffer (checked); `mr` is live as
        // long as `self`.
        unsafe {
            Ok(ffi::ibv_sge {
                addr: self.buf.add(local) as u64,
                length: len,
                lkey: (*self.mr).lkey,
            })
        }
    }

    /// Appends up to 32 completions to `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, String> {
        // SAFETY: `cq` is live; `wc` has room for the 32 entries asked for.
        unsafe {
            let mut wc: [ffi::ibv_wc; 32] = std::mem::zeroed();
            let poll = (*(*self.cq).context)
                .ops
                .poll_cq
                .ok_or("the provider has no poll_cq")?;
            let n = poll(self.cq, wc.len() as i32, wc.as_mut_ptr());
            if n < 0 {
                return Err("ibv_poll_cq failed".into());
            }
            for w in &wc[..n as usize] {
                out.push(Completion {
                    wr_id: w.wr_id(),
                    error: w.error().map(|(status, vendor)| {
                        let s = CStr::from_ptr(ffi::ibv_wc_status_str(status)).to_string_lossy();
                        format!("{s} (status {status}, vendor error {vendor:#x})")
                    }),
                    byte_len: w.len() as u32,
                });
            }
            Ok(n as usize)
        }
    }
}

fn unreachable_none() -> String {
    // The first device is always chosen when no name was given.
    "no RDMA device could be chosen".into()
}

impl Drop for Rdma {
    fn drop(&mut self) {
        // SAFETY: each handle is destroyed once, children before parents.
        unsafe {
            for &q in &self.qps {
                ffi::ibv_destroy_qp(q);
            }
            if !self.mr.is_null() {
                ffi::ibv_dereg_mr(self.mr);
            }
            if !self.buf.is_null() {
                std::alloc::dealloc(self.buf, self.buf_layout);
            }
            if !self.cq.is_null() {
                ffi::ibv_destroy_cq(self.cq);
            }
            if !self.pd.is_null() {
                ffi::ibv_dealloc_pd(self.pd);
            }
            if !self.ctx.is_null() {
                ffi::ibv_close_device(self.ctx);
            }
        }
    }
}
