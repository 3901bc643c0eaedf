//! The one place where a site's configuration becomes protocol settings:
//! the engine's, the WAN transport's, the ACL and the twin timeout. The
//! daemon's shards and the simulator both build their [`super::Site`] from
//! a [`SiteParams`], so a rule that ties two settings together (the WAN
//! flow window covering a flow's buffer quota, say) holds in both.

use std::time::Duration;

use soya_config::{SiteConfig, WanCipher};

use crate::qp::EngineConfig;
use crate::wan::{CcKind, Cipher, CipherPolicy, PathConfig, WanConfig};

use super::acl::Acl;

/// Everything a [`super::Site`] is built from.
#[derive(Clone, Debug)]
pub struct SiteParams {
    pub engine: EngineConfig,
    pub wan: WanConfig,
    pub acl: Acl,
    /// Every path down this long and the twin is lost (`wan.twin_timeout`).
    pub twin_timeout: Duration,
}

impl SiteParams {
    /// Puts the parts together and applies the rules that bind them:
    /// a flow's WAN credit covers everything its buffer quota lets the twin
    /// hold in flight (with two 10 Gb/s paths at 300 km a fixed 8 MiB window
    /// gave 1.71× one path instead of 2×); the sender's deep buffer bounds
    /// the total across flows, so the larger window costs the receiver no
    /// memory. And which twin is the client follows from the prefixes
    /// ([`Acl::is_client`]): exactly one of two mirrored sites is.
    ///
    /// Likewise the WAN sender's cap on the bytes it holds for sending or
    /// retransmission over all flows covers the deep buffer, plus the
    /// default's room for what else it carries (responses, control): every
    /// request it holds is one the buffer still holds, so the buffer
    /// already bounds them, while a lower cap stops every flow's sends at
    /// once as soon as WAN losses keep data longer (16 QPs at 400 Gb/s,
    /// 0.1 % loss, a 565 MiB buffer against the fixed 256 MiB: 0.879 of
    /// the lossless goodput instead of 0.903, docs/benchmarks.md §8).
    pub fn new(engine: EngineConfig, mut wan: WanConfig, acl: Acl, twin_timeout: Duration) -> Self {
        wan.flow_window_bytes = wan.flow_window_bytes.max(engine.flow_bytes());
        wan.tuning.max_buffered_bytes += engine.buffer_bytes();
        wan.is_client = acl.is_client();
        SiteParams {
            engine,
            wan,
            acl,
            twin_timeout,
        }
    }

    /// The settings a site configuration asks for (one shard's copy of it
    /// when the gateway runs several: `gateway::shard::shard_site`).
    pub fn from_config(cfg: &SiteConfig, key: Option<[u8; 32]>) -> SiteParams {
        let acl = acl_of(cfg);
        let wan = wan_config(cfg, key);
        SiteParams::new(EngineConfig::from_site(cfg), wan, acl, cfg.wan.twin_timeout)
    }
}

/// The data-center ACL of a site.
pub fn acl_of(cfg: &SiteConfig) -> Acl {
    Acl {
        local: cfg.dc.local_prefixes.clone(),
        remote: cfg.dc.remote_prefixes.clone(),
    }
}

/// The transport settings a site asks for. Congestion control: FixedRate
/// when every path has a configured `rate` (provisioned circuits), Bbr
/// otherwise. (The client role is set by [`SiteParams::new`].)
fn wan_config(cfg: &SiteConfig, key: Option<[u8; 32]>) -> WanConfig {
    let paths = cfg
        .wan
        .paths
        .iter()
        .map(|p| PathConfig {
            name: p.name.clone(),
            rate_bps: p.rate_bps,
            weight: p.weight,
            rtt_hint: p.rtt,
        })
        .collect();
    let mut w = WanConfig::new(paths, key, false);
    w.max_datagram = cfg.wan.max_datagram();
    w.tuning.rekey_interval = cfg.wan.rekey_interval;
    w.cipher = match cfg.wan.cipher {
        WanCipher::Auto => CipherPolicy::Auto,
        WanCipher::Aes256Gcm => CipherPolicy::Only(Cipher::Aes256Gcm),
        WanCipher::ChaCha20Poly1305 => CipherPolicy::Only(Cipher::ChaCha20Poly1305),
    };
    w.cc = if cfg.wan.paths.iter().all(|p| p.rate_bps.is_some()) {
        CcKind::FixedRate
    } else {
        CcKind::Bbr
    };
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(buffer: &str) -> SiteConfig {
        let text = format!(
            "site = \"t\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:7000\"\n\
             local_prefixes = [\"10.1.0.0/16\"]\nremote_prefixes = [\"10.2.0.0/16\"]\n\
             [wan]\nbind = [\"127.0.0.1:7400\"]\ninsecure = true\n[[wan.paths]]\n\
             name = \"a\"\nremote = \"127.0.0.1:7401\"\nrate = \"10gbit\"\nrtt = \"3ms\"\n\
             [buffer]\n{buffer}\n"
        );
        soya_config::parse_str(&text, "test.toml").unwrap()
    }

    #[test]
    fn the_wan_senders_cap_covers_the_deep_buffer_and_keeps_its_own_room() {
        let default = crate::wan::Tuning::default().max_buffered_bytes;
        let cfg = site("size = \"4GiB\"");
        let w = SiteParams::from_config(&cfg, None).wan;
        let b = &cfg.buffer;
        assert_eq!(
            w.tuning.max_buffered_bytes,
            default + b.slots * u64::from(b.slot_bytes)
        );
        assert!(w.tuning.max_buffered_bytes > 4 << 30);
    }

    #[test]
    fn a_flows_wan_window_covers_its_buffer_quota() {
        // No quota: a flow may use the whole buffer.
        let cfg = site("size = \"64MiB\"");
        let w = SiteParams::from_config(&cfg, None).wan;
        let b = &cfg.buffer;
        assert_eq!(w.flow_window_bytes, b.slots * u64::from(b.slot_bytes));
        assert!(w.flow_window_bytes > 63 << 20);
        // A quota bounds it (the 8 MiB floor keeps small quotas workable).
        let cfg = site("size = \"64MiB\"\nper_flow_quota = \"16MiB\"");
        let w = SiteParams::from_config(&cfg, None).wan;
        let slot = u64::from(cfg.buffer.slot_bytes);
        assert_eq!(w.flow_window_bytes, (16 << 20) / slot * slot);
        let cfg = site("size = \"64MiB\"\nper_flow_quota = \"1MiB\"");
        assert_eq!(
            SiteParams::from_config(&cfg, None).wan.flow_window_bytes,
            8 << 20
        );
    }
}
