//! tracing setup: human or JSON lines on stderr, the level changeable at
//! run time (SIGHUP applies `log.level` live).

use std::sync::OnceLock;

use soya_config::{LogFormat, LogLevel};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

type Handle = reload::Handle<LevelFilter, tracing_subscriber::Registry>;

static HANDLE: OnceLock<Handle> = OnceLock::new();

pub fn level_filter(l: LogLevel) -> LevelFilter {
    match l {
        LogLevel::Trace => LevelFilter::TRACE,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Error => LevelFilter::ERROR,
    }
}

/// Installs the global subscriber (once per process; later calls only set
/// the level). `SOYA_LOG=<level>` overrides the configured level.
pub fn init(format: LogFormat, level: LogLevel) {
    if HANDLE.get().is_some() {
        set_level(level);
        return;
    }
    let lvl = std::env::var("SOYA_LOG")
        .ok()
        .and_then(|s| s.parse::<LevelFilter>().ok())
        .unwrap_or_else(|| level_filter(level));
    let (filter, handle) = reload::Layer::new(lvl);
    let fmt = match format {
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(false)
            .boxed(),
    };
    if tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init()
        .is_ok()
    {
        let _ = HANDLE.set(handle);
    }
}

/// Changes the level live (no-op before [`init`]).
pub fn set_level(level: LogLevel) {
    if let Some(h) = HANDLE.get() {
        let _ = h.modify(|f| *f = level_filter(level));
    }
}
