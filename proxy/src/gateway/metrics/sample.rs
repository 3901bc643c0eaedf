//! What the metric table is made of: a metric's declaration ([`Metric`]),
//! its samples, and the helpers the table's entries read a [`Snapshot`]
//! with (one value, one label over several counters, per shard, per path,
//! per flow).

use serde::Serialize;

use crate::gateway::snapshot::{FlowSnap, PathSnap, ShardSnap, Snapshot};

/// The metric's OpenMetrics type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Counter,
    Gauge,
}

/// A sample's value: integers print without a decimal point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Int(v as u64)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(u64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(u64::from(v))
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

/// One sample of a metric: its label values (in the order of the metric's
/// `labels`, optional ones left out) and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: Value,
}

/// One metric family.
#[derive(Serialize)]
pub struct Metric {
    /// The sample name as Prometheus stores it (counters end in `_total`).
    pub name: &'static str,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub help: &'static str,
    /// Label names the samples may carry. `shard` on per-path series
    /// appears only with several shards (path names repeat, one
    /// connection per shard).
    pub labels: &'static [&'static str],
    #[serde(skip)]
    pub samples: fn(&Snapshot) -> Vec<Sample>,
}

impl Metric {
    /// The family name (OpenMetrics: a counter's family has no `_total`).
    pub fn family(&self) -> &'static str {
        match self.kind {
            Kind::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            Kind::Gauge => self.name,
        }
    }
}

pub(super) fn one(v: impl Into<Value>) -> Vec<Sample> {
    vec![Sample {
        labels: Vec::new(),
        value: v.into(),
    }]
}

/// One label taking several values.
pub(super) fn by(label: &'static str, vals: &[(&str, u64)]) -> Vec<Sample> {
    vals.iter()
        .map(|(l, v)| Sample {
            labels: vec![(label, (*l).to_string())],
            value: Value::Int(*v),
        })
        .collect()
}

/// Per shard (label `shard`), then `label` taking the values `f` gives.
pub(super) fn shards_by(
    s: &Snapshot,
    label: &'static str,
    f: fn(&ShardSnap) -> [(&str, u64); 2],
) -> Vec<Sample> {
    let mut out = Vec::new();
    for sh in &s.shards {
        for (l, v) in f(sh) {
            out.push(Sample {
                labels: vec![("shard", sh.index.to_string()), (label, l.to_string())],
                value: Value::Int(v),
            });
        }
    }
    out
}

/// Per path: labels `path` (and `shard` with several shards), then
/// whatever `f` adds to each of its samples.
pub(super) fn paths_by(
    s: &Snapshot,
    f: impl Fn(&PathSnap) -> Vec<(Option<(&'static str, &'static str)>, Value)>,
) -> Vec<Sample> {
    let several = s.shards.len() > 1;
    let mut out = Vec::new();
    for p in &s.paths {
        for (extra, value) in f(p) {
            let mut labels = vec![("path", p.name.clone())];
            if several {
                labels.push(("shard", p.shard.to_string()));
            }
            if let Some((k, v)) = extra {
                labels.push((k, v.to_string()));
            }
            out.push(Sample { labels, value });
        }
    }
    out
}

pub(super) fn paths(s: &Snapshot, f: fn(&PathSnap) -> Value) -> Vec<Sample> {
    paths_by(s, |p| vec![(None, f(p))])
}

pub(super) fn path_dirs(s: &Snapshot, f: fn(&PathSnap) -> (u64, u64)) -> Vec<Sample> {
    paths_by(s, |p| {
        let (sent, received) = f(p);
        vec![
            (Some(("dir", "sent")), sent.into()),
            (Some(("dir", "received")), received.into()),
        ]
    })
}

pub(super) fn flows(s: &Snapshot, f: fn(&FlowSnap) -> u64) -> Vec<Sample> {
    s.flows
        .iter()
        .map(|fl| Sample {
            labels: vec![("half", fl.half.clone()), ("role", fl.role.clone())],
            value: Value::Int(f(fl)),
        })
        .collect()
}

/// Label sets of the per-path and per-flow families.
pub(super) const PATH: &[&str] = &["path", "shard"];
pub(super) const PATH_DIR: &[&str] = &["path", "shard", "dir"];
pub(super) const FLOW: &[&str] = &["half", "role"];
