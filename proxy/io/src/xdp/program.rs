//! The steering program (proxy/io/xdp/steer.bpf.c, built by proxy/io/build.rs
//! with clang, or without clang its checked-in build proxy/io/xdp/steer.bpf.o):
//! loading it with `aya`, filling its prefix and shard maps, attaching it
//! to the interface, and running it on crafted frames (BPF_PROG_TEST_RUN)
//! for the tests.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;
use soya_config::Prefix;

/// The compiled program.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// Shards the program's XSKMAP holds (MAX_SHARDS in steer.bpf.c).
pub const MAX_SHARDS: usize = 64;

const PROGRAM: &str = "soya_steer";

/// XDP verdicts (linux/bpf.h `enum xdp_action`).
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

/// The loaded program with its maps; detached and unloaded on drop.
pub struct Steering {
    ebpf: Ebpf,
    /// How it is attached: "native" (driver) or "generic" (skb), or
    /// "not attached" (tests).
    pub attach_mode: &'static str,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("attach_mode", &self.attach_mode)
            .finish()
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl Steering {
    /// Loads the program and fills its maps (prefixes, shard count).
    /// Needs CAP_BPF (and CAP_NET_ADMIN to attach).
    pub fn load(local: &[Prefix], remote: &[Prefix], shards: usize) -> io::Result<Steering> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the xdp backend supports 1..={MAX_SHARDS} shards, not {shards}"),
            ));
        }
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| {
            let hint = if is_permission(&e) {
                " (needs root, or CAP_BPF and CAP_NET_ADMIN)"
            } else {
                " (a kernel without BPF LPM tries, XSKMAP or BTF? Linux >= 6.6 is needed)"
            };
            err(&format!("loading the XDP steering program{hint}"), e)
        })?;
        {
            let prog: &mut Xdp = ebpf
                .program_mut(PROGRAM)
                .ok_or_else(|| err("steering program", "not in the object"))?
                .try_into()
                .map_err(|e| err("steering program", e))?;
            prog.load().map_err(|e| {
                err(
                    "the kernel's verifier refused the XDP steering program (Linux >= 6.6 \
                     needed for multi-buffer XDP)",
                    e,
                )
            })?;
        }
        let mut s = Steering {
            ebpf,
            attach_mode: "not attached",
        };
        for p in local {
            s.insert_prefix("LOCAL", p)?;
        }
        for p in remote {
            s.insert_prefix("REMOTE", p)?;
        }
        let mut count: Array<_, u32> =
            Array::try_from(s.map("SHARDS")?).map_err(|e| err("SHARDS map", e))?;
        count
            .set(0, shards as u32, 0)
            .map_err(|e| err("SHARDS map", e))?;
        Ok(s)
    }

    fn map(&mut self, name: &str) -> io::Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| err(name, "map missing from the object"))
    }

    fn insert_prefix(&mut self, side: &str, p: &Prefix) -> io::Result<()> {
        match p.addr {
            std::net::IpAddr::V4(a) => self.insert_lpm(&format!("{side}4"), p.len, a.octets()),
            std::net::IpAddr::V6(a) => self.insert_lpm(&format!("{side}6"), p.len, a.octets()),
        }
    }

    /// Marks `addr/len` in the LPM trie `name` (keys of `N` address bytes).
    fn insert_lpm<const N: usize>(&mut self, name: &str, len: u8, addr: [u8; N]) -> io::Result<()> {
        let mut t: LpmTrie<_, [u8; N], u8> =
            LpmTrie::try_from(self.map(name)?).map_err(|e| err(name, e))?;
        t.insert(&Key::new(u32::from(len), addr), 1, 0)
            .map_err(|e| err(name, e))
    }

    /// Puts shard `shard`'s AF_XDP socket in the XSKMAP.
    pub fn set_socket(&mut self, shard: usize, fd: &impl AsRawFd) -> io::Result<()> {
        let mut m = XskMap::try_from(self.map("XSKS")?).map_err(|e| err("XSKS map", e))?;
        m.set(shard as u32, fd.as_raw_fd(), 0)
            .map_err(|e| err("XSKS map", e))
    }

    /// The steering program, which `load` checked is there and an XDP one.
    fn program(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM)
            .expect("loaded above")
            .try_into()
            .expect("an XDP program")
    }

    /// Attaches to interface `ifname`: native (driver) mode, else generic.
    pub fn attach(&mut self, ifname: &str) -> io::Result<()> {
        let prog = self.program();
        match prog.attach(ifname, XdpFlags::DRV_MODE) {
            Ok(_) => {
                self.attach_mode = "native";
                return Ok(());
            }
            Err(e) => tracing::info!(
                interface = ifname,
                error = %e,
                "xdp: native attach refused; trying generic (skb) mode"
            ),
        }
        prog.attach(ifname, XdpFlags::SKB_MODE).map_err(|e| {
            err(
                &format!(
                    "attaching the XDP program to {ifname} was refused (another XDP program \
                     attached? MTU too large for XDP on this driver?)"
                ),
                e,
            )
        })?;
        self.attach_mode = "generic";
        Ok(())
    }

    /// Packets the program steered to each shard so far (summed over CPUs).
    pub fn steered(&mut self, shards: usize) -> Vec<u64> {
        let Ok(map) = self.map("STEERED") else {
            return vec![0; shards];
        };
        let Ok(m) = PerCpuArray::<_, u64>::try_from(map) else {
            return vec![0; shards];
        };
        (0..shards as u32)
            .map(|i| m.get(&i, 0).map_or(0, |v| v.iter().sum()))
            .collect()
    }

    /// Runs the program once on `frame` (BPF_PROG_TEST_RUN); its verdict.
    pub fn test_run(&mut self, frame: &[u8]) -> io::Result<u32> {
        let prog = self.program();
        let fd = prog.fd().map_err(|e| err("program fd", e))?;
        let fd = fd.as_fd().as_raw_fd();
        let mut out = vec![0u8; frame.len() + 256];
        let mut attr = TestRunAttr {
            prog_fd: fd as u32,
            data_size_in: frame.len() as u32,
            data_size_out: out.len() as u32,
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat: 1,
            ..TestRunAttr::default()
        };
        // SAFETY: bpf(BPF_PROG_TEST_RUN) with a zero-padded attribute
        // whose pointers refer to live buffers of the sizes given; the
        // kernel writes at most data_size_out bytes into `out`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut TestRunAttr,
                std::mem::size_of::<TestRunAttr>(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(attr.retval)
    }
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr` (linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

fn is_permission(e: &aya::EbpfError) -> bool {
    let text = format!("{e:?}");
    text.contains("PermissionDenied") || text.contains("EPERM") || text.contains("os error 1)")
}

#[cfg(test)]
mod tests {
    /// The object checked in beside the source.
    static CHECKED_IN: &[u8] = include_bytes!("../../xdp/steer.bpf.o");

    /// A machine without clang builds the gateway with the checked-in
    /// object, so it must be what the source builds to: CI (which has
    /// clang and sets SOYA_REQUIRE_BPF=1, so OBJECT is the source's build)
    /// fails here when steer.bpf.c changed without proxy/io/xdp/build.sh.
    #[test]
    fn the_checked_in_object_is_the_sources_build() {
        assert!(super::OBJECT.starts_with(b"\x7fELF"), "not an ELF object");
        if super::OBJECT != CHECKED_IN {
            panic!(
                "proxy/io/xdp/steer.bpf.o ({} bytes) is not what clang builds from \
                 proxy/io/xdp/steer.bpf.c ({} bytes): run proxy/io/xdp/build.sh and commit both",
                CHECKED_IN.len(),
                super::OBJECT.len()
            );
        }
    }
}
