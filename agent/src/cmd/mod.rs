//! The `latchkey` subcommands. Each file parses its flags and wires library pieces together;
//! no domain logic lives here.

pub mod controller;
pub mod convert;
pub mod demo;
pub mod kubelet;
pub mod node;

/// A stop signal for the long-running subcommands: SIGTERM or SIGINT flips it; each call of the
/// returned function gives a future that completes once it has.
pub fn stop_on_signal()
-> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Clone {
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        node::shutdown_signal().await;
        let _ = stop.send(true);
    });
    move || {
        let mut rx = stopping.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|s| *s).await;
        })
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` (`none`: not at all) until `stopped`.
pub async fn serve_metrics(
    addr: &str,
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
    readiness: std::sync::Arc<crate::telemetry::http::Readiness>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<tokio::task::JoinHandle<std::io::Result<()>>>> {
    use anyhow::Context as _;
    if addr == "none" {
        return Ok(None);
    }
    let addr = crate::telemetry::http::parse_addr(addr).map_err(anyhow::Error::msg)?;
    let (bound, serve) = crate::telemetry::http::bind(addr, metrics, readiness, stopped)
        .await
        .with_context(|| format!("binding the metrics endpoint {addr}"))?;
    tracing::info!(%bound, "serving /metrics, /healthz, /readyz");
    Ok(Some(tokio::spawn(serve)))
}

/// Default socket: where kubelet looks for the `csi.latchkey.dev` plugin.
pub const DEFAULT_ENDPOINT: &str = "unix:///var/lib/kubelet/plugins/csi.latchkey.dev/csi.sock";

/// Parses a byte size: a plain number or a Kubernetes quantity with a binary suffix (`Ki`, `Mi`, `Gi`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 4Mi or 65536"))?;
    let mult = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(format!("{s:?}: unit must be Ki, Mi or Gi")),
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(super::parse_size("65536"), Ok(65536));
        assert!(super::parse_size("4MB").is_err());
        assert!(super::parse_size("0").is_err());
        assert!(super::parse_size("Mi").is_err());
    }
}
