//! Mirror controller benchmark: the real `latchkey controller` binary against the in-process fake
//! API server (tests/support) with the `fake` provider. Measures what the issue asks of it:
//!
//! 1. N ExternalSecrets (1,000) over 10 remote secrets of 1 KiB, one service account: backend
//!    reads for the first sync (target: exactly 10), and the time from the controller becoming
//!    leader until every Secret is written (target: 10 s);
//! 2. a second refresh interval with unchanged data: backend reads (target: 10) and Secret writes
//!    (target: none);
//! 3. the controller's memory: peak RSS (`VmHWM`) over the whole run, and RSS settled after the
//!    second interval (targets: 40 MiB at 1,000, 64 MiB at 10,000; ESO: about 220 MiB for 1,800).
//!
//! The ExternalSecrets are created through the API with server-side apply (field manager
//! `kubectl`, as `kubectl apply --server-side` does), so each carries the `managedFields` a real
//! API server records and sends in every list and watch event.
//!
//! ```text
//! cargo bench -p latchkey --bench mirror                          # 1,000, release build
//! LATCHKEY_BENCH_MIRROR_COUNT=10000 cargo bench -p latchkey --bench mirror
//! LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --bench mirror    # 50 (CI: keeps it working)
//! ```
//!
//! Targets are reported as PASS/MISS and never enforced; in a quick or debug run the time and
//! memory targets are shown but not judged (`-`), as those numbers mean nothing there. The exit
//! code is non-zero only when something breaks. See docs/benchmarks.md.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::bench::{status_mib, wait};
use support::controller::ControllerProcess;

const TOKEN: &str = "bench-controller-token";
const REMOTE_SECRETS: usize = 10;
const VALUE_BYTES: usize = 1024;
/// Refresh interval of every ExternalSecret: the second round waits one of these (quick: 3 s).
const INTERVAL_SECS: u64 = 15;
const QUICK_INTERVAL_SECS: u64 = 3;

fn main() -> ExitCode {
    support::bench::main("mirror", || {
        let count = support::bench::count("LATCHKEY_BENCH_MIRROR_COUNT", 1, 50, 1000)?;
        Ok(run(count, support::bench::quick()))
    })
}

async fn run(count: usize, quick: bool) -> Result<(), String> {
    let interval = if quick {
        QUICK_INTERVAL_SECS
    } else {
        INTERVAL_SECS
    };
    let s = FakeApiServer::start().await;
    let controller = Identity::service_account("latchkey", "latchkey-controller");
    s.add_identity(TOKEN, controller.clone());
    s.allow(controller, "*", "*", "*", None);
    for ns in ["bench", "latchkey"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    let data: Vec<Value> = (0..REMOTE_SECRETS)
        .map(|i| json!({"key": format!("remote-{i}"), "value": format!("{i}").repeat(VALUE_BYTES)}))
        .collect();
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "SecretStore",
        "metadata": {"name": "fake", "namespace": "bench"},
        "spec": {"provider": {"fake": {"data": data}}}}),
    );
    create_external_secrets(&s, count, interval).await?;

    let c = ControllerProcess::start(&s.kubeconfig_yaml(TOKEN), "bench", &[]).await;
    let leader = wait(Duration::from_secs(30), || async {
        (c.metric("latchkey_mirror_leader").await >= 1.0).then_some(())
    })
    .await
    .map(|_| Instant::now())
    .ok_or("the controller never became leader")?;
    // Written: holding its values (a Secret is created first, its values applied after).
    let secrets = || {
        s.objects("v1", "Secret")
            .iter()
            .filter(|x| x["data"].as_object().is_some_and(|d| !d.is_empty()))
            .count()
    };
    // Scaled with the count: 10,000 take minutes on a loaded machine.
    let within = Duration::from_secs((count as u64 / 20).max(120));
    wait(within, || async { (secrets() >= count).then_some(()) })
        .await
        .ok_or_else(|| format!("only {} of {count} Secrets written", secrets()))?;
    let all_written = leader.elapsed();
    let reads_first = backend_reads(&c).await;
    let synced_rss = status_mib(c.pid(), "VmRSS:")?;

    // A second interval, nothing changed.
    let versions = resource_versions(&s);
    s.clear_requests();
    tokio::time::sleep(Duration::from_secs(interval + interval / 5 + 2)).await;
    let reads_second = backend_reads(&c).await - reads_first;
    let rewritten = resource_versions(&s)
        .iter()
        .zip(&versions)
        .filter(|(a, b)| a != b)
        .count();
    let write_calls = s
        .requests()
        .iter()
        .filter(|r| r.path.contains("/secrets") && matches!(r.method.as_str(), "PATCH" | "POST"))
        .count();
    let settled_rss = status_mib(c.pid(), "VmRSS:")?;
    let peak_rss = status_mib(c.pid(), "VmHWM:")?;
    // What scales with the count is the heap; the rest is mostly the binary's own pages.
    let settled_anon = status_mib(c.pid(), "RssAnon:")?;
    let settled_file = status_mib(c.pid(), "RssFile:")?;
    let target_mib = if count > 1000 { 64.0 } else { 40.0 };

    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    // As in the publish benchmark: time and memory of a quick or debug run say nothing, so their
    // targets are shown but not judged (call and write counts are judged in every run).
    let meaningful = !quick && !cfg!(debug_assertions);
    let measured = |ok: bool| if meaningful { verdict(ok) } else { "-" };
    let mut out = String::new();
    out.push_str(&format!(
        "mirror benchmark: {count} ExternalSecrets over {REMOTE_SECRETS} remote secrets of \
         {VALUE_BYTES} B, one service account, refresh {interval}s{}\n",
        if quick {
            " (QUICK, debug build: numbers mean nothing)"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "| first sync: backend reads | {reads_first} | = {REMOTE_SECRETS} | {} |\n",
        verdict(reads_first as usize == REMOTE_SECRETS)
    ));
    out.push_str(&format!(
        "| first sync: leader -> all Secrets written | {:.2} s | <= 10 s | {} |\n",
        all_written.as_secs_f64(),
        measured(all_written <= Duration::from_secs(10))
    ));
    out.push_str(&format!(
        "| second interval: backend reads | {reads_second} | = {REMOTE_SECRETS} | {} |\n",
        verdict(reads_second as usize == REMOTE_SECRETS)
    ));
    out.push_str(&format!(
        "| second interval: Secrets rewritten / apply calls | {rewritten} / {write_calls} | 0 | {} |\n",
        verdict(rewritten == 0 && write_calls == 0)
    ));
    out.push_str(&format!(
        "| controller RSS, all synced | {synced_rss:.1} MiB | <= {target_mib} MiB | {} |\n",
        measured(synced_rss <= target_mib)
    ));
    out.push_str(&format!(
        "| controller RSS, settled after the second interval | {settled_rss:.1} MiB | <= {target_mib} MiB | {} |\n",
        measured(settled_rss <= target_mib)
    ));
    out.push_str(&format!(
        "| controller peak RSS (VmHWM) | {peak_rss:.1} MiB | <= {target_mib} MiB | {} |\n",
        measured(peak_rss <= target_mib)
    ));
    out.push_str(&format!(
        "| of the settled RSS: anonymous (heap) / file (binary, libraries) | {settled_anon:.1} / {settled_file:.1} MiB | | |\n"
    ));
    print!("{out}");
    let report = json!({"count": count, "interval_seconds": interval, "quick": quick, "reads_first": reads_first,
        "all_written_seconds": all_written.as_secs_f64(), "reads_second": reads_second,
        "rewritten": rewritten, "write_calls": write_calls, "rss_mib": synced_rss,
        "settled_rss_mib": settled_rss, "peak_rss_mib": peak_rss,
        "settled_anon_mib": settled_anon, "settled_file_mib": settled_file});
    support::bench::write_report("mirror", &report)?;
    Ok(())
}

/// `count` ExternalSecrets, created as `kubectl apply --server-side` creates them, so that the
/// server records their `managedFields` as a real one does.
async fn create_external_secrets(
    s: &FakeApiServer,
    count: usize,
    interval: u64,
) -> Result<(), String> {
    let client = s.client(TOKEN).await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "latchkey.dev",
        "v1alpha1",
        "ExternalSecret",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(client, "bench", &resource);
    let apply = PatchParams::apply("kubectl");
    let created: Vec<Result<DynamicObject, kube::Error>> = stream::iter(0..count)
        .map(|i| {
            let (api, apply) = (&api, &apply);
            async move {
                let name = format!("es-{i}");
                let object = json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "ExternalSecret",
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {"secretStoreRef": {"name": "fake"},
                             "refreshInterval": format!("{interval}s"),
                             "data": [{"secretKey": "value",
                                       "remoteRef": {"key": format!("remote-{}", i % REMOTE_SECRETS)}}],
                             "target": {"creationPolicy": "Owner"}}});
                api.patch(&name, apply, &Patch::Apply(&object)).await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    match created.into_iter().find_map(Result::err) {
        Some(e) => Err(format!("creating the ExternalSecrets: {e}")),
        None => Ok(()),
    }
}

/// Every `get` of the fake provider so far.
async fn backend_reads(c: &ControllerProcess) -> u64 {
    c.metrics()
        .await
        .lines()
        .filter(|l| {
            l.starts_with("latchkey_backend_requests_total{provider=\"fake\",operation=\"get\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn resource_versions(s: &FakeApiServer) -> Vec<String> {
    let mut v: Vec<(String, String)> = s
        .objects("v1", "Secret")
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, rv)| rv).collect()
}
