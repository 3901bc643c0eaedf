//! SIGHUP: what changed between the running configuration and the file as
//! it is now, what of it applies live, and applying it.
//!
//! [`apply`] is the one entry point (the SIGHUP handler and the control
//! socket's `reload` call it): it hands every device loop its shard's new
//! [`SiteParams`] (and the WAN paths for its sockets), waits for their
//! answers and says what applied and what needs a restart. The protocol
//! side of it is [`soya_proto::site::Site::reconfigure`]; what it applies and
//! why is documented there and in docs/operations.md.
//!
//! [`diff`] is the same verdict without a gateway (`soya check-config
//! --diff RUNNING NEW`).

use std::time::{Duration, Instant};

use soya_config::{DcBackend, SiteConfig, WanSecurity};

use soya_proto::site::{ReconfigureReport, SiteParams};

use super::{shard, Shared};

/// The outcome of a reload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Keys applied live.
    pub applied: Vec<String>,
    /// Keys that changed but take effect only after a restart.
    pub need_restart: Vec<String>,
    /// What happened to the WAN paths (shard 0's view: every shard has the
    /// same paths).
    pub paths: Vec<String>,
    /// Why something could not be applied (nothing was, then).
    pub errors: Vec<String>,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.need_restart.is_empty() && self.errors.is_empty()
    }

    /// One line for the log and the control reply.
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "configuration unchanged".into();
        }
        let list = |v: &[String]| {
            if v.is_empty() {
                "nothing".to_string()
            } else {
                v.join(", ")
            }
        };
        let mut s = format!("applied: {}", list(&self.applied));
        if !self.paths.is_empty() {
            s += &format!(" ({})", self.paths.join("; "));
        }
        s += &format!("; need a restart: {}", list(&self.need_restart));
        if !self.errors.is_empty() {
            s += &format!("; NOT applied: {}", self.errors.join("; "));
        }
        s
    }
}

/// Identity keys before and after, and a new key pair, twin public key or
/// PSK (not lab mode): rotated live (`wan::WanConnection::rotate_keys`).
/// A key file rewritten in place counts as a new key: the digests of what
/// the files held when each configuration was loaded differ.
fn key_rotation(old: &SiteConfig, new: &SiteConfig) -> bool {
    let insecure = |c: &SiteConfig| matches!(c.wan.security, WanSecurity::Insecure { .. });
    old.wan.identity.is_some()
        && new.wan.identity.is_some()
        && !insecure(old)
        && !insecure(new)
        && (old.wan.identity != new.wan.identity
            || old.wan.security != new.wan.security
            || old.wan.key_digests != new.wan.key_digests)
}

/// Compares `old` (running) with `new` (just read): which changed keys a
/// reload applies and which need a restart.
pub fn diff(old: &SiteConfig, new: &SiteConfig) -> ReloadReport {
    let mut r = ReloadReport::default();
    let mut restart = |changed: bool, key: &str| {
        if changed {
            r.need_restart.push(key.to_string());
        }
    };
    restart(old.site != new.site, "site");
    restart(old.dc.backend != new.dc.backend, "dc.backend");
    let prefixes = old.dc.local_prefixes != new.dc.local_prefixes
        || old.dc.remote_prefixes != new.dc.remote_prefixes;
    // The XDP program steers on the prefixes it was loaded with.
    let xdp = matches!(old.dc.backend, DcBackend::Xdp { .. });
    restart(
        prefixes && xdp,
        "dc.local_prefixes / dc.remote_prefixes (the xdp program)",
    );
    restart(old.wan.bind != new.wan.bind, "wan.bind");
    let rotate = key_rotation(old, new);
    let (od, nd) = (&old.wan.key_digests, &new.wan.key_digests);
    restart(
        !rotate && (old.wan.security != new.wan.security || od.psk != nd.psk),
        "wan.insecure / wan.key_file",
    );
    restart(
        !rotate && (old.wan.identity != new.wan.identity || od.private_key != nd.private_key),
        "wan.private_key_file / wan.twin_public_key",
    );
    restart(old.wan.cipher != new.wan.cipher, "wan.cipher");
    restart(old.wan.mtu != new.wan.mtu, "wan.mtu");
    for (i, p) in new.wan.paths.iter().enumerate() {
        restart(
            !old.wan.bind.contains(&p.bind),
            &format!("wan.paths[{i}].bind (not a running wan.bind)"),
        );
    }
    restart(
        old.buffer.bytes != new.buffer.bytes || old.buffer.slot_bytes != new.buffer.slot_bytes,
        "buffer.size / buffer.slot_bytes",
    );
    restart(
        old.control.metrics != new.control.metrics,
        "control.metrics",
    );
    restart(old.control.socket != new.control.socket, "control.socket");
    restart(old.log.format != new.log.format, "log.format");
    restart(old.gateway != new.gateway, "gateway.shards");
    let mut live = |changed: bool, key: &str| {
        if changed {
            r.applied.push(key.to_string());
        }
    };
    live(old.log.level != new.log.level, "log.level");
    live(prefixes && !xdp, "dc.local_prefixes / dc.remote_prefixes");
    live(
        old.dc.retransmit_floor != new.dc.retransmit_floor
            || old.dc.give_up_after != new.dc.give_up_after
            || old.dc.rnr_give_up != new.dc.rnr_give_up,
        "dc.retransmit_floor / dc.give_up_after / dc.rnr_give_up (new QPs)",
    );
    live(
        old.wan.twin_timeout != new.wan.twin_timeout,
        "wan.twin_timeout",
    );
    live(
        old.wan.rekey_interval != new.wan.rekey_interval,
        "wan.rekey_interval",
    );
    live(old.wan.paths != new.wan.paths, "wan.paths");
    live(
        rotate,
        "wan.private_key_file / wan.twin_public_key / wan.key_file (identity keys: from the \
         next handshake; the keys before accepted for 10 minutes)",
    );
    live(old.pseudo_ack != new.pseudo_ack, "pseudo_ack (new QPs)");
    live(
        old.buffer.per_flow_quota != new.buffer.per_flow_quota,
        "buffer.per_flow_quota",
    );
    r
}

/// Per shard: the reload waiting for its device loop, and its answer.
pub struct Slots {
    ticket: u64,
    pending: Vec<Option<(u64, ShardReload)>>,
    done: Vec<(u64, Result<ReconfigureReport, String>)>,
}

impl Slots {
    pub fn new(shards: usize) -> Slots {
        Slots {
            ticket: 0,
            pending: (0..shards).map(|_| None).collect(),
            done: (0..shards).map(|_| (0, Ok(Default::default()))).collect(),
        }
    }
}

/// What one device loop applies.
pub struct ShardReload {
    pub params: SiteParams,
    /// The shard's WAN section (its sockets' paths, DSCP).
    pub wan: soya_config::WanConfig,
}

impl Shared {
    /// The reload waiting for shard `shard`, if any.
    pub(crate) fn take_reload(&self, shard: usize) -> Option<(u64, ShardReload)> {
        self.reloads.lock().ok()?.pending.get_mut(shard)?.take()
    }

    pub(crate) fn reload_done(
        &self,
        shard: usize,
        ticket: u64,
        r: Result<ReconfigureReport, String>,
    ) {
        if let Ok(mut g) = self.reloads.lock() {
            if let Some(slot) = g.done.get_mut(shard) {
                *slot = (ticket, r);
            }
        }
        self.cv.notify_all();
    }
}

/// How long [`apply`] waits for the device loops.
const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Applies `new` to the running gateway: what can be applied live is, on
/// every shard, without failing a flow; the report says what needs a
/// restart. The running configuration becomes `new` less what still needs
/// a restart (so a later reload compares with what runs).
pub fn apply(shared: &Shared, new: &SiteConfig) -> ReloadReport {
    let r = apply_inner(shared, new);
    if let Ok(mut last) = shared.last_reload.lock() {
        *last = Some(r.clone());
    }
    r
}

impl ReloadReport {
    /// The control socket's answer to `last-reload`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "applied": self.applied,
            "need_restart": self.need_restart,
            "paths": self.paths,
            "errors": self.errors,
            "summary": self.summary(),
        })
    }
}

fn apply_inner(shared: &Shared, new: &SiteConfig) -> ReloadReport {
    let Some(old) = shared.config.lock().ok().and_then(|g| g.clone()) else {
        return ReloadReport {
            errors: vec!["no running configuration".into()],
            ..Default::default()
        };
    };
    let mut r = diff(&old, new);
    if r.is_empty() {
        return r;
    }
    if r.applied.iter().any(|k| k == "log.level") {
        super::logging::set_level(new.log.level);
    }
    // What runs: the new file, less what needs a restart.
    let mut run = new.clone();
    run.site = old.site.clone();
    run.dc.backend = old.dc.backend.clone();
    if matches!(old.dc.backend, DcBackend::Xdp { .. }) {
        run.dc.local_prefixes = old.dc.local_prefixes.clone();
        run.dc.remote_prefixes = old.dc.remote_prefixes.clone();
    }
    run.wan.bind = old.wan.bind.clone();
    if !key_rotation(&old, new) {
        run.wan.security = old.wan.security.clone();
        run.wan.identity = old.wan.identity.clone();
        run.wan.key_digests = old.wan.key_digests;
    }
    run.wan.cipher = old.wan.cipher;
    run.control = old.control.clone();
    run.log.format = old.log.format;
    run.gateway = old.gateway;
    let per_flow_quota = run.buffer.per_flow_quota;
    run.buffer = old.buffer.clone();
    run.buffer.per_flow_quota = per_flow_quota;
    if run
        .wan
        .paths
        .iter()
        .any(|p| !run.wan.bind.contains(&p.bind))
    {
        // A path on a new address: the whole path set waits for a restart.
        run.wan.paths = old.wan.paths.clone();
        r.applied.retain(|k| k != "wan.paths");
    }
    let key = match super::wan_key(&run) {
        Ok(k) => k,
        Err(e) => {
            r.errors.push(format!("{e}"));
            return r;
        }
    };
    let identity = match super::wan_identity(&run) {
        Ok(k) => k,
        Err(e) => {
            r.errors.push(format!("{e}"));
            return r;
        }
    };
    let shards = shared.shards();
    let ticket = {
        let Ok(mut g) = shared.reloads.lock() else {
            r.errors.push("reload state poisoned".into());
            return r;
        };
        g.ticket += 1;
        let t = g.ticket;
        for i in 0..shards {
            let scfg = shard::shard_site(&run, i as u16, shards as u16);
            let mut params = SiteParams::from_config(&scfg, key);
            params.wan.identity = identity.clone();
            params.wan.hello_context = shard::hello_context(i as u16, shards as u16);
            g.pending[i] = Some((
                t,
                ShardReload {
                    params,
                    wan: scfg.wan.clone(),
                },
            ));
        }
        t
    };
    shared.wake_all();
    let deadline = Instant::now() + APPLY_TIMEOUT;
    let mut g = match shared.reloads.lock() {
        Ok(g) => g,
        Err(_) => return r,
    };
    while g.done.iter().any(|(t, _)| *t < ticket) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || shared.stopping.load(std::sync::atomic::Ordering::Acquire) {
            r.errors
                .push("a device loop did not answer (stopping?)".into());
            return r;
        }
        // The snapshot condvar: device loops notify it after a reload too.
        g = match shared
            .cv
            .wait_timeout(g, left.min(Duration::from_millis(100)))
        {
            Ok((g, _)) => g,
            Err(_) => return r,
        };
    }
    for (i, (_, res)) in g.done.iter().enumerate() {
        match res {
            Ok(rep) => {
                for k in &rep.need_restart {
                    if !r.need_restart.iter().any(|x| x == k) {
                        r.need_restart.push((*k).to_string());
                    }
                }
                if i == 0 {
                    r.paths = rep.paths.iter().map(ToString::to_string).collect();
                }
            }
            Err(e) => r.errors.push(format!("shard {i}: {e}")),
        }
    }
    drop(g);
    if r.errors.is_empty() {
        if let Ok(mut c) = shared.config.lock() {
            *c = Some(run);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra_path: bool, rate: &str, prefix: &str) -> SiteConfig {
        let mut text = format!(
            "site = \"t\"\n[dc]\nbackend = \"udp\"\nlisten = \"127.0.0.1:7000\"\n\
             local_prefixes = [\"{prefix}\"]\nremote_prefixes = [\"10.2.0.0/16\"]\n\
             [wan]\nbind = [\"127.0.0.1:7400\"]\ninsecure = true\n[[wan.paths]]\n\
             name = \"a\"\nremote = \"127.0.0.1:7401\"\nrate = \"{rate}\"\nrtt = \"3ms\"\n"
        );
        if extra_path {
            text += "[[wan.paths]]\nname = \"b\"\nremote = \"127.0.0.1:7402\"\nrate = \"1gbit\"\nrtt = \"3ms\"\n";
        }
        text += "[buffer]\nsize = \"64MiB\"\n";
        soya_config::parse_str(&text, "test.toml").unwrap()
    }

    #[test]
    fn paths_rates_and_prefixes_apply_live() {
        let old = cfg(false, "1gbit", "10.1.0.0/16");
        let new = cfg(true, "2gbit", "10.0.0.0/15");
        let r = diff(&old, &new);
        assert!(r.need_restart.is_empty(), "{r:?}");
        assert!(r.applied.contains(&"wan.paths".to_string()));
        assert!(r
            .applied
            .contains(&"dc.local_prefixes / dc.remote_prefixes".to_string()));
        assert!(diff(&old, &old).is_empty());
    }

    #[test]
    fn the_rekey_interval_applies_live() {
        let old = cfg(false, "1gbit", "10.1.0.0/16");
        let mut new = old.clone();
        new.wan.rekey_interval = Duration::from_secs(2);
        let r = diff(&old, &new);
        assert_eq!(r.applied, ["wan.rekey_interval"], "{r:?}");
        assert!(r.need_restart.is_empty(), "{r:?}");
    }

    /// `wan` section with identity keys (`psk`: a `key_file` too).
    fn identity(private: &str, twin: &str, psk: Option<&str>) -> SiteConfig {
        let mut text = cfg(false, "1gbit", "10.1.0.0/16");
        text.wan.security = match psk {
            Some(f) => WanSecurity::PreSharedKey { key_file: f.into() },
            None => WanSecurity::Identity,
        };
        text.wan.identity = Some(soya_config::WanIdentity {
            private_key_file: private.into(),
            twin_public_key: [twin.as_bytes()[0]; 32],
        });
        text
    }

    /// With identity keys before and after, a new key pair, twin public
    /// key or PSK is rotated live (the keys before accepted for a
    /// window); leaving or entering identity mode, or lab mode, needs a
    /// restart.
    #[test]
    fn identity_keys_and_psk_rotate_live() {
        let old = identity("a.key", "x", Some("psk"));
        for new in [
            identity("a2.key", "x", Some("psk")),
            identity("a.key", "y", Some("psk")),
            identity("a.key", "x", Some("psk2")),
            identity("a.key", "x", None),
        ] {
            let r = diff(&old, &new);
            assert!(r.need_restart.is_empty(), "{r:?}");
            assert_eq!(r.applied.len(), 1, "{r:?}");
            assert!(r.applied[0].starts_with("wan.private_key_file"), "{r:?}");
        }
        let mut psk_only = identity("a.key", "x", Some("psk2"));
        psk_only.wan.identity = None;
        for (a, b) in [(&old, &psk_only), (&psk_only, &old)] {
            let r = diff(a, b);
            assert!(!r.need_restart.is_empty(), "{r:?}");
            assert!(r.applied.is_empty(), "{r:?}");
        }
        // A key file rewritten in place (same paths, new content: the
        // digests of what the files held differ): rotated live too.
        let mut old_d = old.clone();
        old_d.wan.key_digests.private_key = Some([1; 32]);
        old_d.wan.key_digests.psk = Some([2; 32]);
        assert!(diff(&old_d, &old_d).is_empty());
        for (private_key, psk) in [([3; 32], [2; 32]), ([1; 32], [4; 32])] {
            let mut new = old_d.clone();
            new.wan.key_digests.private_key = Some(private_key);
            new.wan.key_digests.psk = Some(psk);
            let r = diff(&old_d, &new);
            assert!(r.need_restart.is_empty(), "{r:?}");
            assert_eq!(r.applied.len(), 1, "{r:?}");
            assert!(r.applied[0].starts_with("wan.private_key_file"), "{r:?}");
        }
        // PSK-only mode, the PSK file rewritten in place: a restart, as for
        // a new path.
        let mut a = psk_only.clone();
        a.wan.key_digests.psk = Some([2; 32]);
        let mut b = a.clone();
        b.wan.key_digests.psk = Some([4; 32]);
        assert_eq!(
            diff(&a, &b).need_restart,
            ["wan.insecure / wan.key_file"],
            "{:?}",
            diff(&a, &b)
        );
        // PSK-only mode, a new PSK: a restart, as before.
        let mut psk_only_2 = psk_only.clone();
        psk_only_2.wan.security = WanSecurity::PreSharedKey {
            key_file: "psk3".into(),
        };
        assert!(!diff(&psk_only, &psk_only_2).need_restart.is_empty());
    }
}
