//! One direction's impairments as the operator writes them (TOML keys or
//! CLI flags), layered, validated and turned into a [`LinkProfile`].

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use soya_config::units::{format_bytes, format_rate, parse_bytes, parse_rate};
use soya_proto::time::Time;

use crate::sim::link::{GilbertElliott, LinkProfile};

/// One-way delay of light in fibre, µs per km (as [`LinkProfile::fibre`]).
pub const FIBRE_US_PER_KM: f64 = 4.9;

/// Bottleneck queue when a rate is set and no queue is given.
pub const DEFAULT_QUEUE: &str = "4MiB";

/// A rate or byte size: a string with a unit, or a bare number.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Quantity {
    Number(u64),
    Text(String),
}

/// Every field optional: a layer only sets what it names.
/// Keys are the same in TOML (`snake_case`) and on the command line
/// (`--kebab-case`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// Delay as fibre length: 4.9 µs per km. Exclusive with `delay_ms`.
    pub distance_km: Option<f64>,
    /// Delay in milliseconds. Exclusive with `distance_km`.
    pub delay_ms: Option<f64>,
    /// Uniform extra delay in [0, jitter_us).
    pub jitter_us: Option<f64>,
    /// Random loss probability.
    pub loss: Option<f64>,
    /// Gilbert-Elliott: [p_enter_bad, p_leave_bad, loss_in_bad].
    pub ge: Option<[f64; 3]>,
    /// Probability a packet is held back by `reorder_delay_us`.
    pub reorder: Option<f64>,
    pub reorder_delay_us: Option<f64>,
    /// Duplication probability.
    pub duplicate: Option<f64>,
    /// Bottleneck rate, e.g. "10gbit"; "none" or 0 for unlimited.
    pub rate: Option<Quantity>,
    /// Bottleneck queue bound, e.g. "4MiB".
    pub queue: Option<Quantity>,
    /// Link-down intervals, seconds since start: [[down, up], ...].
    pub down: Option<Vec<[f64; 2]>>,
}

/// Names a key for error messages: "--a2b-loss", "path[0].a_to_b.loss".
pub type Namer<'a> = &'a dyn Fn(&str) -> String;

fn prob(v: Option<f64>, key: &str, name: Namer) -> Result<(), String> {
    match v {
        Some(p) if !(0.0..=1.0).contains(&p) || p.is_nan() => Err(format!(
            "{}: must be a probability between 0 and 1, got {p}",
            name(key)
        )),
        _ => Ok(()),
    }
}

fn non_negative(v: Option<f64>, key: &str, name: Namer) -> Result<(), String> {
    match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => Err(format!(
            "{}: must be a non-negative number, got {x}",
            name(key)
        )),
        Some(x) if x > 1e9 => Err(format!("{}: {x} is too large", name(key))),
        _ => Ok(()),
    }
}

/// Bits per second; `None` = unlimited.
pub fn rate_of(q: &Quantity) -> Result<Option<u64>, String> {
    match q {
        Quantity::Number(0) => Ok(None),
        Quantity::Number(n) => Ok(Some(*n)),
        Quantity::Text(s) if matches!(s.trim(), "none" | "unlimited" | "0") => Ok(None),
        Quantity::Text(s) => parse_rate(s).map(|r| (r > 0).then_some(r)).map_err(|e| e.0),
    }
}

pub fn bytes_of(q: &Quantity) -> Result<u64, String> {
    match q {
        Quantity::Number(n) => Ok(*n),
        Quantity::Text(s) => parse_bytes(s).map_err(|e| e.0),
    }
}

impl ProfileSpec {
    /// Checks every field this layer sets; errors name the key via `name`.
    pub fn validate(&self, name: Namer) -> Result<(), String> {
        if self.distance_km.is_some() && self.delay_ms.is_some() {
            return Err(format!(
                "{} and {} both set the delay: give one",
                name("distance_km"),
                name("delay_ms")
            ));
        }
        non_negative(self.distance_km, "distance_km", name)?;
        non_negative(self.delay_ms, "delay_ms", name)?;
        non_negative(self.jitter_us, "jitter_us", name)?;
        non_negative(self.reorder_delay_us, "reorder_delay_us", name)?;
        prob(self.loss, "loss", name)?;
        prob(self.reorder, "reorder", name)?;
        prob(self.duplicate, "duplicate", name)?;
        if let Some(ge) = self.ge {
            for v in ge {
                if !(0.0..=1.0).contains(&v) || v.is_nan() {
                    return Err(format!(
                        "{}: p_enter,p_leave,loss_bad must each be a probability between 0 and 1, got {v}",
                        name("ge")
                    ));
                }
            }
        }
        if let Some(r) = &self.rate {
            rate_of(r).map_err(|e| format!("{}: {e}", name("rate")))?;
        }
        if let Some(q) = &self.queue {
            let b = bytes_of(q).map_err(|e| format!("{}: {e}", name("queue")))?;
            if b == 0 {
                return Err(format!("{}: must be at least one byte", name("queue")));
            }
        }
        if let Some(d) = &self.down {
            for &[a, b] in d {
                if !(a.is_finite() && b.is_finite() && a >= 0.0 && b > a) {
                    return Err(format!(
                        "{}: interval [{a}, {b}] must have 0 <= down < up (seconds since start)",
                        name("down")
                    ));
                }
            }
        }
        Ok(())
    }

    /// `other` on top of `self`: fields `other` sets win. The delay is one
    /// setting, whichever way it is written.
    pub fn overlay(&mut self, other: &ProfileSpec) {
        if other.distance_km.is_some() || other.delay_ms.is_some() {
            self.distance_km = other.distance_km;
            self.delay_ms = other.delay_ms;
        }
        macro_rules! take {
            ($($f:ident),*) => {$( if other.$f.is_some() { self.$f = other.$f.clone(); } )*};
        }
        take!(
            jitter_us,
            loss,
            ge,
            reorder,
            reorder_delay_us,
            duplicate,
            rate,
            queue,
            down
        );
    }

    pub fn delay(&self) -> Duration {
        if let Some(km) = self.distance_km {
            LinkProfile::fibre(km)
        } else {
            Duration::from_nanos((self.delay_ms.unwrap_or(0.0) * 1e6).round() as u64)
        }
    }

    /// The link model's profile, times relative to the emulator's start.
    /// Call on a validated spec.
    pub fn to_link(&self) -> LinkProfile {
        let us = |v: Option<f64>| Duration::from_nanos((v.unwrap_or(0.0) * 1e3).round() as u64);
        let rate_bps = self.rate.as_ref().and_then(|r| rate_of(r).ok().flatten());
        let mut p = LinkProfile::new(self.delay(), rate_bps);
        p.jitter = us(self.jitter_us);
        p.loss = self.loss.unwrap_or(0.0);
        p.burst = self.ge.map(|[a, b, c]| GilbertElliott {
            p_enter_bad: a,
            p_leave_bad: b,
            loss_in_bad: c,
        });
        p.reorder = self.reorder.unwrap_or(0.0);
        p.reorder_delay = us(self.reorder_delay_us);
        p.duplicate = self.duplicate.unwrap_or(0.0);
        if rate_bps.is_some() {
            let q = self
                .queue
                .clone()
                .unwrap_or(Quantity::Text(DEFAULT_QUEUE.into()));
            p.queue_bytes = bytes_of(&q).unwrap_or(4 << 20) as usize;
        }
        let at = |s: f64| Time::from_nanos((s * 1e9).round() as u64);
        p.down = self
            .down
            .iter()
            .flatten()
            .map(|&[a, b]| (at(a), at(b)))
            .collect();
        p
    }
}

/// One line for humans: "delay 1.47 ms (300 km), loss 0.1 %, rate 10 Gbit/s, queue 4 MiB".
pub fn describe(p: &LinkProfile) -> String {
    let mut s = format!("delay {:.3} ms", p.delay.as_secs_f64() * 1e3);
    if !p.jitter.is_zero() {
        let _ = write!(s, ", jitter {} us", p.jitter.as_micros());
    }
    if p.loss > 0.0 {
        let _ = write!(s, ", loss {}", p.loss);
    }
    if let Some(ge) = p.burst {
        let _ = write!(
            s,
            ", ge {},{},{}",
            ge.p_enter_bad, ge.p_leave_bad, ge.loss_in_bad
        );
    }
    if p.reorder > 0.0 {
        let _ = write!(
            s,
            ", reorder {} by {} us",
            p.reorder,
            p.reorder_delay.as_micros()
        );
    }
    if p.duplicate > 0.0 {
        let _ = write!(s, ", duplicate {}", p.duplicate);
    }
    if let Some(r) = p.rate_bps {
        let _ = write!(
            s,
            ", rate {}, queue {}",
            format_rate(r),
            format_bytes(p.queue_bytes as u64)
        );
    }
    for (a, b) in &p.down {
        let _ = write!(s, ", down {:.3}-{:.3} s", a.as_secs_f64(), b.as_secs_f64());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_sets_delay_and_layers_override() {
        let mut base = ProfileSpec {
            distance_km: Some(300.0),
            loss: Some(0.01),
            ..Default::default()
        };
        assert_eq!(base.to_link().delay, Duration::from_micros(1470));
        base.overlay(&ProfileSpec {
            delay_ms: Some(3.0),
            ..Default::default()
        });
        let p = base.to_link();
        assert_eq!(p.delay, Duration::from_millis(3));
        assert_eq!(p.loss, 0.01);
    }

    #[test]
    fn errors_name_the_key() {
        let n = |k: &str| format!("--{}", k.replace('_', "-"));
        let e = ProfileSpec {
            loss: Some(1.5),
            ..Default::default()
        }
        .validate(&n)
        .unwrap_err();
        assert!(e.starts_with("--loss:"), "{e}");
        let e = ProfileSpec {
            rate: Some(Quantity::Text("10GBps".into())),
            ..Default::default()
        }
        .validate(&n)
        .unwrap_err();
        assert!(e.starts_with("--rate:"), "{e}");
    }
}
