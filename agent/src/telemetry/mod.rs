//! Telemetry: logging setup, Prometheus metrics, and the HTTP endpoint that serves them with the
//! health checks. Log lines and metrics carry names and paths, never secret values or tokens.

pub mod escape;
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

/// Libraries that talk to backends and may log request details (the AWS SDK logs the access key
/// id at debug, HTTP clients log URLs and headers at trace). They never log below `info`,
/// whatever `RUST_LOG` says: a debug session must not turn the log into a credential store.
const QUIET_DEPENDENCIES: &[&str] = &[
    "aws_config",
    "aws_credential_types",
    "aws_runtime",
    "aws_sdk_secretsmanager",
    "aws_sdk_sts",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    // The request signer logs the access key id at trace.
    "aws_sigv4",
    "aws_smithy_http_client",
    "h2",
    "hyper",
    "hyper_util",
    "kube_client",
    "reqwest",
    "tonic",
    "tower",
];

/// Libraries that log errors with the backend's own text (a tenant-run Vault can answer anything):
/// silenced, as Latchkey reports every failure itself, escaped (see [`escape`]).
const MUTED_DEPENDENCIES: &[&str] = &["rustify", "vaultrs"];

/// Logs on stderr, each line in one `write(2)` before the code that logged it goes on, so no line
/// is lost when the process is killed; `RUST_LOG` overrides `default_filter` (except for
/// [`QUIET_DEPENDENCIES`]).
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = quiet_dependencies(
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
    );
    // Colour codes only for a person at a terminal: in a file or a log pipeline they are noise
    // (and make escape sequences from elsewhere harder to spot).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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

/// Caps every [`QUIET_DEPENDENCIES`] target at `info` and turns [`MUTED_DEPENDENCIES`] off. A
/// directive for a target replaces one the user gave for the same target, and the agent's own
/// `latchkey` target keeps the user's level.
fn quiet_dependencies(mut filter: EnvFilter) -> EnvFilter {
    let levels = QUIET_DEPENDENCIES
        .iter()
        .map(|t| (t, "info"))
        .chain(MUTED_DEPENDENCIES.iter().map(|t| (t, "off")));
    for (target, level) in levels {
        // The directive text is a constant target and level; it always parses.
        if let Ok(directive) = format!("{target}={level}").parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// What a test's subscriber wrote, for tests that check what is (not) logged: clones share it.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogBuffer {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for LogBuffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::EnvFilter;

    use super::LogBuffer;

    /// Each write the subscriber makes, kept apart.
    #[derive(Clone, Default)]
    struct Writes(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl std::io::Write for Writes {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            let text = String::from_utf8_lossy(data).into_owned();
            self.0.lock().unwrap().push(text);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_subscriber_writes_each_event_as_one_whole_line() {
        // One write per line: on an unbuffered stderr, one `write(2)`, so lines from several
        // threads never interleave and a line is out before the code that logged it goes on.
        let writes = Writes::default();
        let out = writes.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target_path = "/t", "volume mounted");
            tracing::warn!("second");
        });
        let written = writes.0.lock().unwrap().clone();
        assert_eq!(written.len(), 2, "{written:?}");
        assert!(
            written
                .iter()
                .all(|w| w.ends_with('\n') && w.lines().count() == 1)
        );
        assert!(written[0].contains("volume mounted") && written[0].contains("target_path=\"/t\""));
        assert!(written[1].contains("second"));
    }

    #[test]
    fn dependencies_never_log_below_info_even_when_asked() {
        let filter = super::quiet_dependencies(EnvFilter::new(
            "trace,aws_smithy_runtime=trace,vaultrs=trace,aws_sigv4=trace",
        ));
        let buffer = LogBuffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "aws_smithy_runtime::client::orchestrator", "AKID-debug");
            tracing::trace!(target: "vaultrs::api", "token-trace");
            tracing::error!(target: "rustify::clients::reqwest", "backend-text-error");
            tracing::trace!(target: "aws_sigv4::http_request::sign", "AKID-signer");
            tracing::info!(target: "aws_smithy_runtime::client", "sdk-info");
            tracing::debug!(target: "latchkey::publish", "own-debug");
        });
        let text = buffer.text();
        assert!(
            !text.contains("AKID-debug")
                && !text.contains("token-trace")
                && !text.contains("backend-text-error")
                && !text.contains("AKID-signer"),
            "{text}"
        );
        assert!(
            text.contains("sdk-info") && text.contains("own-debug"),
            "{text}"
        );
    }
}
