//! Logging setup. Log lines carry names and paths, never secret values or tokens.

use tracing_subscriber::EnvFilter;

/// Human-readable logs on stderr; `RUST_LOG` overrides `default_filter`.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
