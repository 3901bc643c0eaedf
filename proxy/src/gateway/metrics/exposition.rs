//! The OpenMetrics text of a [`Snapshot`], encoded by `prometheus-client`
//! from the metric table ([`super::table::METRICS`]).
//!
//! The gateway's counters live in the device threads' state machines, not
//! in client-library atomics: each scrape takes a snapshot and a
//! [`Collector`] hands its values to the library as constant metrics
//! (the library's documented pattern for exporters).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::table::{Kind, Sample, Value, METRICS};
use crate::gateway::snapshot::Snapshot;

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

/// A label value as the exposition formats require it: `\\`, `"` and line
/// feeds escaped. prometheus-client 0.24 writes label values verbatim
/// (matter-labs/vise#37 works around the same gap), and a path name or a
/// site name comes from the operator's file: one quote in it would make
/// Prometheus reject the whole scrape.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Encodes one sample's value as the metric's type.
fn encode_value(
    kind: Kind,
    v: Value,
    enc: prometheus_client::encoding::MetricEncoder<'_>,
) -> std::fmt::Result {
    match (kind, v) {
        (Kind::Counter, Value::Int(n)) => ConstCounter::new(n).encode(enc),
        (Kind::Counter, Value::Float(x)) => ConstCounter::new(x).encode(enc),
        (Kind::Gauge, Value::Int(n)) => ConstGauge::new(n).encode(enc),
        (Kind::Gauge, Value::Float(x)) => ConstGauge::new(x).encode(enc),
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        for m in METRICS {
            let kind = match m.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut family = encoder.encode_descriptor(m.family(), m.help, None, kind)?;
            for Sample { labels, value } in (m.samples)(&self.0) {
                if labels.is_empty() {
                    // An empty label set would print `{}`.
                    encode_value(m.kind, value, family)?;
                    break;
                }
                let labels: Vec<(&str, Escaped<'_>)> =
                    labels.iter().map(|(k, v)| (*k, Escaped(v))).collect();
                encode_value(m.kind, value, family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The snapshot in the OpenMetrics text format (ends with `# EOF`).
pub fn render(s: &Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(s.clone())));
    let mut out = String::with_capacity(16 << 10);
    // Writing into a String cannot fail; an encoder error would be a bug
    // in a label value, which the table never produces.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!("metrics encoding failed: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::snapshot::PathSnap;

    #[test]
    fn exposition_has_the_table_and_the_library_format() {
        let s = Snapshot {
            connected: true,
            dc: crate::gateway::snapshot::DcCounters {
                rx_acl_source: 3,
                ..Default::default()
            },
            paths: vec![PathSnap {
                name: "p\"0\\\n".into(),
                state: "up".into(),
                srtt_us: 1500,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&s);
        for want in [
            "# TYPE soya_dc_rx_packets counter\n",
            "soya_dc_rx_packets_total{result=\"acl_source\"} 3\n",
            "soya_wan_connected 1\n",
            "# TYPE soya_path_rtt_seconds gauge\n",
            "soya_path_rtt_seconds{path=\"p\\\"0\\\\\\n\"} 0.0015\n",
            "soya_path_state{path=\"p\\\"0\\\\\\n\",state=\"up\"} 1\n",
        ] {
            assert!(text.contains(want), "{want:?} missing:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        for m in METRICS {
            assert!(
                text.contains(&format!("# TYPE {} ", m.family())),
                "{} missing",
                m.name
            );
        }
    }
}
