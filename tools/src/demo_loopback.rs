//! The demo on loopback (no root): the hosts are soya-perf endpoints that
//! carry each RoCE packet inside a UDP datagram (IP-in-UDP), the gateways
//! run the lab `udp` backend, and each WAN path is a `soya-wanem udp`
//! relay.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::demo_common::{demo_gateway_env, flow_quota, path_rate, DemoOptions, US_PER_KM};
use crate::demo_report::Outcome;
use crate::demo_session::{addr, free_udp, log_file, settle, Children, Ctx, Route, Runs, Step, LO};

/// One gateway's part of the lab.
pub(crate) struct GwSide<'a> {
    site: &'a str,
    dc: u16,
    local: &'a str,
    remote: &'a str,
    binds: &'a [u16],
    remotes: &'a [u16],
    socket: PathBuf,
}

pub(crate) fn gateway_config(g: &GwSide, rtt_us: f64, o: &DemoOptions) -> String {
    let rate = path_rate(o);
    let quota = flow_quota(o);
    let GwSide {
        site,
        dc,
        local,
        remote,
        binds,
        remotes,
        socket,
    } = g;
    let mut s = format!(
        "site = \"{site}\"\n[dc]\nbackend = \"udp\"\nlisten = \"{LO}:{dc}\"\n\
         local_prefixes = [\"{local}\"]\nremote_prefixes = [\"{remote}\"]\n[wan]\nbind = [{}]\n\
         insecure = true\n",
        binds
            .iter()
            .map(|p| format!("\"{LO}:{p}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (i, r) in remotes.iter().enumerate() {
        let _ = write!(
            s,
            "[[wan.paths]]\nname = \"p{i}\"\nremote = \"{LO}:{r}\"\nbind = {i}\nweight = 1\n\
             rate = \"{rate}\"\nrtt = \"{}us\"\n",
            rtt_us.max(1.0).round() as u64
        );
    }
    let _ = write!(
        s,
        "[buffer]\nsize = \"256MiB\"\nper_flow_quota = \"{quota}\"\n[pseudo_ack]\npolicy = \"edge\"\n\
         [control]\nmetrics = \"\"\nsocket = \"{}\"\n[log]\nformat = \"human\"\nlevel = \"warn\"\n",
        socket.display()
    );
    s
}

/// The three runs on loopback (udp backend, IP-in-UDP hosts).
pub(crate) fn run_loopback(o: &DemoOptions, ctx: &Ctx) -> Result<Runs, String> {
    let r0 = direct_0km_loopback(o, ctx, Step::Run(1), "direct, 0 km")?;
    let mut kids = Children::default();

    // 2. Direct through a relay.
    let s2 = free_udp()?;
    let relay = free_udp()?;
    ctx.spawn_wanem(&mut kids, o, "direct", false, &[(relay, s2)])?;
    settle(&mut kids)?;
    let rd = ctx.scenario(
        Step::Run(2),
        &format!("direct, {} km", o.distance_km),
        &Route::Direct {
            client_to: addr(relay),
        },
        s2,
        o,
    );
    kids.stop();

    let (ra_, gw_alive) = soya_loopback(
        o,
        ctx,
        Step::Run(3),
        &format!("through Sōya, {} km", o.distance_km),
    )?;
    Ok(([r0, rd, ra_], gw_alive))
}

/// Direct on loopback at 0 km: no relay; or with a rate, through a relay
/// of that rate at 0 km (the same link, no distance).
pub(crate) fn direct_0km_loopback(
    o: &DemoOptions,
    ctx: &Ctx,
    step: Step,
    title: &str,
) -> Result<Outcome, String> {
    let s1 = free_udp()?;
    let mut kids = Children::default();
    let to = match o.rate_bps {
        None => s1,
        Some(_) => {
            let relay = free_udp()?;
            ctx.spawn_wanem(&mut kids, o, "0 km", true, &[(relay, s1)])?;
            settle(&mut kids)?;
            relay
        }
    };
    let client_to = addr(to);
    Ok(ctx.scenario(step, title, &Route::Direct { client_to }, s1, o))
}

/// Through two gateways and one relay process per path on loopback (both
/// directions: A's path remote is relay a->b, B's is relay b->a): run
/// run 3/3 or calibration 2/2.
pub(crate) fn soya_loopback(
    o: &DemoOptions,
    ctx: &Ctx,
    step: Step,
    title: &str,
) -> Result<(Outcome, Result<(), String>), String> {
    let mut kids = Children::default();
    let n = o.paths as usize;
    let ports = |k| {
        (0..k)
            .map(|_| free_udp())
            .collect::<Result<Vec<u16>, String>>()
    };
    let (wa, wb, ra, rb) = (ports(n)?, ports(n)?, ports(n)?, ports(n)?);
    let (dca, dcb) = (free_udp()?, free_udp()?);
    let rtt_us = 2.0 * o.distance_km * US_PER_KM;
    let fa = ctx.dir.join("gateway-a.toml");
    let fb = ctx.dir.join("gateway-b.toml");
    let write = |f: &Path, s: String| {
        std::fs::write(f, s).map_err(|e| format!("cannot write {}: {e}", f.display()))
    };
    write(
        &fa,
        gateway_config(
            &GwSide {
                site: "demo-a",
                dc: dca,
                local: "10.1.0.0/16",
                remote: "10.2.0.0/16",
                binds: &wa,
                remotes: &ra,
                socket: ctx.dir.join("a.sock"),
            },
            rtt_us,
            o,
        ),
    )?;
    write(
        &fb,
        gateway_config(
            &GwSide {
                site: "demo-b",
                dc: dcb,
                local: "10.2.0.0/16",
                remote: "10.1.0.0/16",
                binds: &wb,
                remotes: &rb,
                socket: ctx.dir.join("b.sock"),
            },
            rtt_us,
            o,
        ),
    )?;
    for i in 0..n {
        let pairs = [(ra[i], wb[i]), (rb[i], wa[i])];
        ctx.spawn_wanem(&mut kids, o, &format!("path {i}"), false, &pairs)?;
    }
    for (name, f) in [("gateway-a", &fa), ("gateway-b", &fb)] {
        let mut c = Command::new(&ctx.bins.soya);
        c.arg("gateway")
            .arg("--config")
            .arg(f)
            .stdout(log_file(&ctx.dir, &format!("{name}.out")))
            .stderr(log_file(&ctx.dir, name));
        demo_gateway_env(&mut c);
        kids.spawn(name, &mut c)?;
    }
    settle(&mut kids)?;
    let route = Route::Gateways {
        a: addr(dca),
        b: addr(dcb),
    };
    let out = ctx.scenario(step, title, &route, 0, o);
    let gw_alive = kids.check();
    kids.stop();
    Ok((out, gw_alive))
}
