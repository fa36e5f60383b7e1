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

/// Whether `LATCHKEY_BENCH_QUICK` asks for a quick run (small counts, a debug build).
pub fn quick() -> bool {
    std::env::var("LATCHKEY_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The count `var` asks for (at least `min`), else `quick_default` or `default`.
pub fn count(var: &str, min: usize, quick_default: usize, default: usize) -> Result<usize, String> {
    match std::env::var(var) {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{var}={v:?} is not a count >= {min}")),
        },
        Err(_) if quick() => Ok(quick_default),
        Err(_) => Ok(default),
    }
}

/// Runs benchmark `name`'s `run` on a new runtime; its error is printed and the exit code says
/// it failed.
pub fn main<F>(name: &str, run: impl FnOnce() -> Result<F, String>) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let result = run().and_then(|future| {
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(future)
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} bench failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes `report` to `target/bench/<name>.json`.
pub fn write_report(name: &str, report: &serde_json::Value) -> Result<(), String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(format!("{dir}/{name}.json"), report.to_string()).map_err(|e| e.to_string())
}
