//! PushSecret benchmark: the real `latchkey controller` binary against the in-process fake API
//! server (tests/support) with the `fake` provider. Measures what issue #42 asks of it:
//!
//! 1. N PushSecrets (1,000) over 10 source Secrets of 1 KiB, one service account, each pushing
//!    its Secret's key to a remote key of its own: time from the controller becoming leader until
//!    every PushSecret reports its first version, and remote writes (one each);
//! 2. a refresh interval with nothing changed: remote writes (target: none);
//! 3. one source Secret changed: the PushSecrets that push it write again (target: exactly N/10),
//!    the others write nothing, and how long after the change the last of them was written;
//! 4. the controller's memory: peak RSS (`VmHWM`) over the whole run and settled at the end
//!    (target: 40 MiB at 1,000, as the mirror).
//!
//! Remote writes are counted from the versions each PushSecret's status reports: the fake
//! provider's version of a remote key goes up by one per write.
//!
//! ```text
//! cargo bench -p latchkey --bench push                          # 1,000, release build
//! LATCHKEY_BENCH_PUSH_COUNT=5000 cargo bench -p latchkey --bench push
//! LATCHKEY_BENCH_QUICK=1 cargo test -p latchkey --bench push    # 50 (CI: keeps it working)
//! ```
//!
//! Targets are reported as PASS/MISS and never enforced; in a quick or debug run the time and
//! memory targets are shown but not judged (`-`). The exit code is non-zero only when something
//! breaks. See docs/benchmarks.md.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{StreamExt, stream};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Identity};
use support::bench::{status_mib, wait};
use support::controller::ControllerProcess;

const API: &str = "latchkey.dev/v1alpha1";
const TOKEN: &str = "bench-controller-token";
const NAMESPACE: &str = "bench";
const SECRETS: usize = 10;
const VALUE_BYTES: usize = 1024;
/// Refresh interval of every PushSecret: the quiet round waits one of these (quick: 3 s).
const INTERVAL_SECS: u64 = 15;
const QUICK_INTERVAL_SECS: u64 = 3;

fn main() -> ExitCode {
    support::bench::main("push", || {
        let count = support::bench::count("LATCHKEY_BENCH_PUSH_COUNT", SECRETS, 50, 1000)?;
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
    for ns in [NAMESPACE, "latchkey"] {
        s.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    s.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "pusher", "namespace": NAMESPACE,
                     "annotations": {"latchkey.dev/allow-controller": "true"}}}));
    s.allow(
        Identity::service_account(NAMESPACE, "pusher"),
        "get",
        "",
        "secrets",
        Some(NAMESPACE),
    );
    s.apply(json!({"apiVersion": API, "kind": "SecretStore",
        "metadata": {"name": "fake", "namespace": NAMESPACE},
        "spec": {"provider": {"fake": {"data": []}}}}));
    for i in 0..SECRETS {
        source_secret(&s, i, 'a');
    }
    create_push_secrets(&s, count, interval).await?;

    let c = ControllerProcess::start(&s.kubeconfig_yaml(TOKEN), "bench", &[]).await;
    let leader = wait(Duration::from_secs(30), || async {
        (c.metric("latchkey_mirror_leader").await >= 1.0).then_some(())
    })
    .await
    .map(|_| Instant::now())
    .ok_or("the controller never became leader")?;
    let within = Duration::from_secs((count as u64 / 20).max(120));
    wait(within, || async {
        (versions(&s, count).iter().all(|v| *v >= 1)).then_some(())
    })
    .await
    .ok_or_else(|| {
        let done = versions(&s, count).iter().filter(|v| **v >= 1).count();
        format!("only {done} of {count} PushSecrets pushed")
    })?;
    let all_pushed = leader.elapsed();
    let first = versions(&s, count);
    let writes_first: u64 = first.iter().sum();
    let synced_rss = status_mib(c.pid(), "VmRSS:")?;

    // A refresh interval, nothing changed.
    s.clear_requests();
    tokio::time::sleep(Duration::from_secs(interval + interval / 5 + 2)).await;
    let quiet = versions(&s, count);
    let writes_quiet: u64 = quiet.iter().zip(&first).map(|(a, b)| a - b).sum();
    let source_reads = s
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/secrets/"))
        .count();

    // One source Secret changes: only the PushSecrets that push it write.
    let changed = Instant::now();
    source_secret(&s, 0, 'b');
    let expected = count.div_ceil(SECRETS);
    let moved = |now: &[u64]| now.iter().zip(&quiet).filter(|(a, b)| a > b).count();
    wait(within, || async {
        (moved(&versions(&s, count)) >= expected).then_some(())
    })
    .await
    .ok_or_else(|| {
        format!(
            "only {} of {expected} PushSecrets pushed the change",
            moved(&versions(&s, count))
        )
    })?;
    let change_pushed = changed.elapsed();
    // A moment for any stray write to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = versions(&s, count);
    let writes_change: u64 = after.iter().zip(&quiet).map(|(a, b)| a - b).sum();
    let wrong = after
        .iter()
        .zip(&quiet)
        .enumerate()
        .filter(|(i, (a, b))| (i % SECRETS == 0) != (a > b))
        .count();

    let settled_rss = status_mib(c.pid(), "VmRSS:")?;
    let peak_rss = status_mib(c.pid(), "VmHWM:")?;
    let settled_anon = status_mib(c.pid(), "RssAnon:")?;
    let settled_file = status_mib(c.pid(), "RssFile:")?;
    let target_mib = 40.0;

    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let meaningful = !quick && !cfg!(debug_assertions);
    let measured = |ok: bool| if meaningful { verdict(ok) } else { "-" };
    let mut out = String::new();
    out.push_str(&format!(
        "push benchmark: {count} PushSecrets over {SECRETS} Secrets of {VALUE_BYTES} B, one \
         service account, refresh {interval}s{}\n",
        if quick {
            " (QUICK, debug build: numbers mean nothing)"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "| first sync: remote writes | {writes_first} | = {count} | {} |\n",
        verdict(writes_first as usize == count)
    ));
    out.push_str(&format!(
        "| first sync: leader -> every PushSecret pushed | {:.2} s | <= 10 s | {} |\n",
        all_pushed.as_secs_f64(),
        measured(all_pushed <= Duration::from_secs(10))
    ));
    out.push_str(&format!(
        "| an interval, nothing changed: remote writes | {writes_quiet} | 0 | {} |\n",
        verdict(writes_quiet == 0)
    ));
    out.push_str(&format!(
        "| the same interval: source Secret reads (GET) | {source_reads} | | |\n"
    ));
    out.push_str(&format!(
        "| one Secret changed: remote writes / PushSecrets wrongly written or not | {writes_change} / {wrong} | = {expected} / 0 | {} |\n",
        verdict(writes_change as usize == expected && wrong == 0)
    ));
    out.push_str(&format!(
        "| one Secret changed -> its {expected} PushSecrets pushed | {:.2} s | | |\n",
        change_pushed.as_secs_f64()
    ));
    out.push_str(&format!(
        "| controller RSS, all pushed | {synced_rss:.1} MiB | <= {target_mib} MiB | {} |\n",
        measured(synced_rss <= target_mib)
    ));
    out.push_str(&format!(
        "| controller RSS, settled at the end | {settled_rss:.1} MiB | <= {target_mib} MiB | {} |\n",
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
    let report = json!({"count": count, "interval_seconds": interval, "quick": quick,
        "writes_first": writes_first, "all_pushed_seconds": all_pushed.as_secs_f64(),
        "writes_quiet": writes_quiet, "source_reads_quiet": source_reads,
        "writes_change": writes_change, "wrongly_written": wrong,
        "change_pushed_seconds": change_pushed.as_secs_f64(), "rss_mib": synced_rss,
        "settled_rss_mib": settled_rss, "peak_rss_mib": peak_rss,
        "settled_anon_mib": settled_anon, "settled_file_mib": settled_file});
    support::bench::write_report("push", &report)?;
    if writes_first as usize != count || writes_quiet != 0 || wrong != 0 {
        return Err("PushSecrets wrote what they should not have (see the table)".into());
    }
    Ok(())
}

/// Secret `src-{i}`, its `value` key `fill` repeated.
fn source_secret(s: &FakeApiServer, i: usize, fill: char) {
    let value = base64::engine::general_purpose::STANDARD
        .encode(format!("{i}{}", fill.to_string().repeat(VALUE_BYTES - 1)));
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("src-{i}"), "namespace": NAMESPACE},
        "data": {"value": value}}));
}

/// `count` PushSecrets, created as `kubectl apply --server-side` creates them.
async fn create_push_secrets(s: &FakeApiServer, count: usize, interval: u64) -> Result<(), String> {
    let client = s.client(TOKEN).await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "latchkey.dev",
        "v1alpha1",
        "PushSecret",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &resource);
    let apply = PatchParams::apply("kubectl");
    let created: Vec<Result<DynamicObject, kube::Error>> = stream::iter(0..count)
        .map(|i| {
            let (api, apply) = (&api, &apply);
            async move {
                let name = format!("ps-{i}");
                let object = json!({"apiVersion": API, "kind": "PushSecret",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"serviceAccountName": "pusher",
                             "refreshInterval": format!("{interval}s"),
                             "secretStoreRefs": [{"name": "fake", "kind": "SecretStore"}],
                             "selector": {"secret": {"name": format!("src-{}", i % SECRETS)}},
                             "data": [{"match": {"secretKey": "value",
                                                 "remoteRef": {"remoteKey": format!("remote-{i}")}}}]}});
                api.patch(&name, apply, &Patch::Apply(&object)).await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    match created.into_iter().find_map(Result::err) {
        Some(e) => Err(format!("creating the PushSecrets: {e}")),
        None => Ok(()),
    }
}

/// The version each PushSecret reports for its remote key (0: none yet), in name order.
fn versions(s: &FakeApiServer, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| {
            s.get(API, "PushSecret", Some(NAMESPACE), &format!("ps-{i}"))
                .and_then(|ps| {
                    let synced: &Value = &ps["status"]["syncedPushSecrets"]["SecretStore/fake"]
                        [format!("remote-{i}")];
                    synced["version"].as_str()?.parse().ok()
                })
                .unwrap_or(0)
        })
        .collect()
}
