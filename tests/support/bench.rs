//! What the controller benchmarks share: polling without panicking (a benchmark reports a miss
//! and exits non-zero rather than aborting), and the memory fields of `/proc/PID/status`.

use std::time::{Duration, Instant};

/// Polls the asynchronous `check` every 50 ms until it holds or `within` has passed.
pub async fn wait<F, Fut>(within: Duration, mut check: F) -> Option<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await.is_some() {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// One memory field of `/proc/PID/status` (`VmRSS:`, `VmHWM:`, `RssAnon:`, ...), in MiB.
pub fn status_mib(pid: u32, field: &str) -> Result<f64, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("no {field} in /proc/PID/status"))?;
    Ok(kib / 1024.0)
}
