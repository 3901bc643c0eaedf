//! SIGHUP: what changed between the running configuration and the file as
//! it is now, and which of it applies without a restart.

use soya_config::SiteConfig;

/// The outcome of a reload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Keys applied live (today: `log.level`).
    pub applied: Vec<String>,
    /// Keys that changed but take effect only after a restart.
    pub need_restart: Vec<String>,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.need_restart.is_empty()
    }
}

/// Compares `old` (running) with `new` (just read).
pub fn diff(old: &SiteConfig, new: &SiteConfig) -> ReloadReport {
    let mut r = ReloadReport::default();
    let mut restart = |changed: bool, key: &str| {
        if changed {
            r.need_restart.push(key.to_string());
        }
    };
    restart(old.site != new.site, "site");
    restart(old.dc.backend != new.dc.backend, "dc.backend");
    restart(
        old.dc.local_prefixes != new.dc.local_prefixes,
        "dc.local_prefixes",
    );
    restart(
        old.dc.remote_prefixes != new.dc.remote_prefixes,
        "dc.remote_prefixes",
    );
    restart(old.wan.bind != new.wan.bind, "wan.bind");
    restart(
        old.wan.security != new.wan.security,
        "wan.insecure / wan.key_file",
    );
    if old.wan.paths.len() != new.wan.paths.len() {
        restart(true, "wan.paths");
    } else {
        for (i, (a, b)) in old.wan.paths.iter().zip(&new.wan.paths).enumerate() {
            let at = |k: &str| format!("wan.paths[{i}].{k}");
            restart(a.name != b.name, &at("name"));
            restart(a.remote != b.remote, &at("remote"));
            restart(a.bind != b.bind, &at("bind"));
            restart(a.weight != b.weight, &at("weight"));
            restart(a.rate_bps != b.rate_bps, &at("rate"));
            restart(a.dscp != b.dscp, &at("dscp"));
            restart(a.rtt != b.rtt, &at("rtt"));
        }
    }
    restart(old.buffer != new.buffer, "buffer");
    restart(old.pseudo_ack != new.pseudo_ack, "pseudo_ack");
    restart(
        old.control.metrics != new.control.metrics,
        "control.metrics",
    );
    restart(old.control.socket != new.control.socket, "control.socket");
    restart(old.log.format != new.log.format, "log.format");
    restart(old.gateway != new.gateway, "gateway.shards");
    if old.log.level != new.log.level {
        r.applied.push("log.level".into());
    }
    r
}
