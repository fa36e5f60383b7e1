//! Telemetry: logging setup, Prometheus metrics, and the HTTP endpoint that serves them with the
//! health checks. Log lines and metrics carry names and paths, never secret values or tokens.

pub mod http;
pub mod metrics;

use tracing_subscriber::EnvFilter;

pub use metrics::Metrics;

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields.
    Json,
}

/// Logs on stderr; `RUST_LOG` overrides `default_filter`.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}
