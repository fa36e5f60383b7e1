//! Restart safety: the agent keeps no state a restart could lose or corrupt. Whether a volume is
//! published comes from the kernel's mount table, and a volume's content becomes visible in one
//! rename (`..data`). SIGKILL during a storm of publishes, then restart: every target must be
//! either complete or not visibly there, and republish and unpublish must then work for all.

mod support;

use std::path::Path;
use std::time::Duration;

use latchkey::csi::client::{PodVolume, unpublish_request, volume_id_for};
use support::{Agent, mounts_at};

const FILES: usize = 20;
const FILE_BYTES: usize = 64 * 1024;
const PODS: usize = 150;

fn content(i: usize) -> String {
    format!("{i:02}").repeat(FILE_BYTES / 2)
}

fn manifests() -> String {
    let mut out = String::from(
        "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: big, namespace: shop}\n\
         spec:\n  provider:\n    fake:\n      data:\n",
    );
    for i in 0..FILES {
        out += &format!("      - {{key: k{i}, value: '{}'}}\n", content(i));
    }
    out += "---\napiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
            metadata: {name: many, namespace: shop}\nspec:\n  secretStoreRef: {name: big}\n  data:\n";
    for i in 0..FILES {
        out += &format!("  - {{secretKey: f{i}, remoteRef: {{key: k{i}}}}}\n");
    }
    out
}

/// What a reader in the pod would see at `target`.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Nothing readable: no target, an empty directory or mount, or links not yet committed.
    Nothing,
    /// Every file, complete.
    Complete,
}

fn seen(target: &Path) -> Seen {
    let readable: Vec<bool> = (0..FILES)
        .map(
            |i| match std::fs::read_to_string(target.join(format!("f{i}"))) {
                Ok(text) => {
                    assert_eq!(
                        text,
                        content(i),
                        "{}: f{i} is half-written",
                        target.display()
                    );
                    true
                }
                Err(_) => false,
            },
        )
        .collect();
    match readable.iter().filter(|r| **r).count() {
        0 => Seen::Nothing,
        n if n == FILES => Seen::Complete,
        n => panic!(
            "{}: {n} of {FILES} files visible: a mixed volume",
            target.display()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_publish_storm_leaves_no_half_written_volume() {
    // 150 volumes of 1.3 MiB in one namespace: far beyond the default volume budget.
    let mut agent = Agent::start(
        &[("big.yaml", &manifests())],
        &["--volume-budget=1Gi", "--namespace-volume-share=1"],
    )
    .await;
    let requests: Vec<_> = (0..PODS)
        .map(|i| {
            let target = agent.target(&format!("pod-{i}"));
            PodVolume::new("shop", &format!("pod-{i}"), "many")
                .publish_request(&volume_id_for(&target), &target)
        })
        .collect();

    let mut storm = Vec::new();
    for req in requests.clone() {
        let mut node = agent.node().await;
        storm.push(tokio::spawn(
            async move { node.node_publish_volume(req).await },
        ));
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    agent.kill9();
    let mut completed = 0;
    for call in storm {
        completed += usize::from(call.await.unwrap().is_ok());
    }
    assert!(
        completed < PODS,
        "the kill came too late to interrupt anything"
    );

    let mut complete_before = 0;
    for req in &requests {
        complete_before += usize::from(seen(Path::new(&req.target_path)) == Seen::Complete);
    }
    assert!(
        complete_before >= completed,
        "an acknowledged publish lost its content"
    );

    agent.restart().await;
    let mut node = agent.node().await;
    for req in &requests {
        node.node_publish_volume(req.clone()).await.unwrap();
        let target = Path::new(&req.target_path);
        assert_eq!(seen(target), Seen::Complete, "{}", target.display());
        assert_eq!(
            mounts_at(target),
            1,
            "{}: exactly one tmpfs",
            target.display()
        );
    }
    // Volumes mounted before the restart are counted once republished, and unpublishing them
    // brings the gauge to zero, not below.
    assert_eq!(agent.metric("latchkey_volumes_active").await, PODS as f64);
    for req in &requests {
        let target = Path::new(&req.target_path);
        node.node_unpublish_volume(unpublish_request(&req.volume_id, target))
            .await
            .unwrap();
        assert_eq!(mounts_at(target), 0);
        assert!(!target.exists(), "{} left behind", target.display());
    }
    assert_eq!(agent.metric("latchkey_volumes_active").await, 0.0);
    eprintln!(
        "storm: {completed} of {PODS} acknowledged before SIGKILL, {complete_before} complete"
    );
}
