//! The metrics and health endpoint: `/metrics` (OpenMetrics text), `/healthz` (the process is
//! up) and `/readyz` (the CSI socket is served and the catalog is synced).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::Metrics;

/// What `/readyz` reports on.
pub struct Readiness {
    serving: AtomicBool,
    synced: Box<dyn Fn() -> bool + Send + Sync>,
}

impl Readiness {
    /// Readiness that also requires `synced()` (the catalog's view is complete).
    pub fn new(synced: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            serving: AtomicBool::new(false),
            synced: Box::new(synced),
        }
    }

    /// Marks the CSI socket as served (or not).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    /// Why the agent is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if !self.serving.load(Ordering::Acquire) {
            Some("CSI socket not served yet")
        } else if !(self.synced)() {
            Some("catalog not synced yet")
        } else {
            None
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

/// Parses `--metrics-addr`: `host:port`, or `:port` for every interface, as Go tools write it.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|_| format!("{s:?} is not an address like :9808 or 127.0.0.1:9808"))
}

/// Binds the endpoint; returns the bound address (useful with port 0) and the serving future.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz_handler))
        .with_state(AppState { metrics, readiness });
    let serve = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    };
    Ok((local, serve))
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn readyz_handler(State(s): State<AppState>) -> impl IntoResponse {
    match s.readiness.not_ready_reason() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr(":9808").unwrap(),
            "0.0.0.0:9808".parse().unwrap()
        );
        assert_eq!(
            parse_addr("127.0.0.1:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert!(parse_addr("localhost").is_err());
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out[9..12].parse().unwrap();
        (code, out)
    }

    #[tokio::test]
    async fn readyz_flips_when_serving_and_synced() {
        let synced = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&synced);
        let readiness = Arc::new(Readiness::new(move || flag.load(Ordering::Acquire)));
        let (addr, serve) = bind(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Metrics::new()),
            Arc::clone(&readiness),
            std::future::pending(),
        )
        .await
        .unwrap();
        tokio::spawn(serve);
        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("CSI socket not served yet"), "{body}");
        readiness.set_serving(true);
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("catalog not synced yet"), "{body}");
        synced.store(true, Ordering::Release);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("latchkey_volumes_active"), "{body}");
    }
}
