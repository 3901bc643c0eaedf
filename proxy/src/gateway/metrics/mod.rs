//! `/metrics` on `control.metrics`: the metric table ([`table`], made of
//! the declarations and sample helpers of `sample`), its OpenMetrics
//! encoding by `prometheus-client` ([`exposition`]) and the HTTP endpoint
//! on hyper ([`http`]), run by the control plane's runtime
//! ([`crate::gateway::control_plane`]).

pub mod exposition;
pub mod http;
mod sample;
pub mod table;

pub use exposition::render;
pub use http::bind;
pub use table::{spec_json, Kind, Metric, METRICS};
