//! Lab and test tools for Sōya.
//!
//! - [`capture`]: read pcap files of RoCEv2 traffic into parsed packets
//!   (used by `soya-decode` and by the capture tests).

pub mod capture;
pub mod demo;
pub mod perf;
pub mod rc;
pub mod sim;
pub mod wanem;
