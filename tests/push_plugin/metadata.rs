//! `spec.data[].metadata` on plugin stores: `customMetadata` set on the secret's metadata beside
//! the mark, merged into what is there or (`mergePolicy: Replace`) replacing it, through
//! latchkey.plugin.v1 PushSecret and through ESS ApplySecret alike; and a push that would change
//! nothing writes nothing, even from a restarted controller.

use std::collections::BTreeMap;
use std::time::Duration;

use latchkey::api::push_metadata::{MetadataMergePolicy, PushMetadataSpec};
use latchkey::providers::push::{Pushed, Pusher};
use serde_json::json;

use super::support::{self, controller::ControllerProcess};
use super::{CONTROLLER_TOKEN, PASSWORD, Plugin, REPLACE, assert_clean, plugin_cluster, props};

fn custom(pairs: &[(&str, &str)], merge: Option<MetadataMergePolicy>) -> PushMetadataSpec {
    PushMetadataSpec {
        custom_metadata: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        merge_policy: merge,
        ..Default::default()
    }
}

#[tokio::test]
async fn custom_metadata_is_merged_or_replaced_beside_the_mark_over_both_protocols() {
    for flags in [&["--writable"][..], &["--ess-only", "--writable"][..]] {
        let plugin = Plugin::start(flags).await;
        let push = plugin.pusher(&[]).await.unwrap();
        assert_eq!(push.metadata_fields(), ["customMetadata", "mergePolicy"]);
        let value = props(&[("password", PASSWORD)]);

        let first = custom(&[("owner", "shop"), ("tier", "gold")], None);
        push.push_with("db", &value, REPLACE, &first).await.unwrap();
        assert_eq!(
            plugin.metadata("db").unwrap(),
            json!({"managed-by": "latchkey", "owner": "shop", "tier": "gold"}),
            "{flags:?}"
        );
        // Merge (the default): what is there stays, these are set.
        let merged = custom(&[("owner", "billing")], Some(MetadataMergePolicy::Merge));
        push.push_with("db", &value, REPLACE, &merged)
            .await
            .unwrap();
        assert_eq!(
            plugin.metadata("db").unwrap(),
            json!({"managed-by": "latchkey", "owner": "billing", "tier": "gold"}),
            "{flags:?}"
        );
        // No settings: the metadata is left as it is.
        push.push("db", &value, REPLACE).await.unwrap();
        assert_eq!(plugin.metadata("db").unwrap()["tier"], "gold", "{flags:?}");
        // The same again: nothing written (ESS: the read shows it; latchkey.plugin.v1: the
        // plugin's call).
        let again = push
            .push_with("db", &value, REPLACE, &merged)
            .await
            .unwrap();
        if flags.contains(&"--ess-only") {
            assert!(matches!(again, Pushed::Unchanged { .. }), "{again:?}");
            // Two writes: the first push and the merge; the push without settings changed
            // nothing either.
            assert_eq!(plugin.calls().matches("ApplySecret db").count(), 2);
        }
        // Replace: exactly these, and the mark.
        let replaced = custom(&[("owner", "shop")], Some(MetadataMergePolicy::Replace));
        push.push_with("db", &value, REPLACE, &replaced)
            .await
            .unwrap();
        assert_eq!(
            plugin.metadata("db").unwrap(),
            json!({"managed-by": "latchkey", "owner": "shop"}),
            "{flags:?}"
        );
        assert_eq!(plugin.entries("db").unwrap()["password"], PASSWORD);
        assert_clean(&plugin.calls());
    }
}

/// The real controller: an entry's settings reach the plugin, a change of them alone is pushed
/// again, and a field no store of the PushSecret uses fails it before anything is written.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_pushes_the_settings_and_refuses_those_no_store_uses() {
    let plugin = Plugin::start(&["--writable"]).await;
    let s = plugin_cluster(&plugin).await;
    let push_secret = |name: &str, remote: &str, spec: serde_json::Value| {
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"serviceAccountName": "writer", "secretStoreRefs": [{"name": "files"}],
                     "selector": {"secret": {"name": "db"}},
                     "data": [{"match": {"secretKey": "password",
                                         "remoteRef": {"remoteKey": remote, "property": "password"}},
                               "metadata": {"apiVersion": "kubernetes.external-secrets.io/v1alpha1",
                                            "kind": "PushSecretMetadata", "spec": spec}}]}})
    };
    s.apply(push_secret(
        "labelled",
        "labelled",
        json!({"customMetadata": {"owner": "shop"}}),
    ));
    s.apply(push_secret(
        "tagged",
        "tagged",
        json!({"tags": {"team": "shop"}}),
    ));
    let socket_dir = plugin.socket_dir.display().to_string();
    let c = ControllerProcess::start(
        &s.kubeconfig_yaml(CONTROLLER_TOKEN),
        "plugin-push-metadata",
        &["--plugin-socket-dir", &socket_dir],
    )
    .await;
    let within = Duration::from_secs(15);
    let meta = |name: &str| plugin.metadata(name).unwrap_or_default();
    support::eventually(within, "the settings pushed", || async {
        meta("labelled") == json!({"managed-by": "latchkey", "owner": "shop"})
    })
    .await;
    // Only the settings change: pushed again.
    s.apply(push_secret(
        "labelled",
        "labelled",
        json!({"customMetadata": {"owner": "billing"}}),
    ));
    support::eventually(within, "the new settings pushed", || async {
        meta("labelled")["owner"] == "billing"
    })
    .await;

    let ready = || {
        let ps = s.get(
            "latchkey.dev/v1alpha1",
            "PushSecret",
            Some("shop"),
            "tagged",
        )?;
        let conditions = ps["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Ready")
    };
    support::eventually(within, "tags refused", || async {
        ready().is_some_and(|c| c["reason"] == "Unsupported")
    })
    .await;
    let message = ready().unwrap()["message"].to_string();
    for part in [
        "PushSecret shop/tagged",
        "\\\"tagged\\\"",
        "sets tags",
        "customMetadata, mergePolicy",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(plugin.file("tagged").is_none(), "nothing written");
    assert!(!plugin.calls().contains("PushSecret tagged"));
    assert_clean(&c.log_text());
}

/// A restarted controller has no fingerprints: it reads the ESS secret, finds it as it would
/// write it, and writes nothing (no new version for whoever consumes it elsewhere).
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_controller_writes_nothing_that_is_already_there() {
    let plugin = Plugin::start(&["--ess-only", "--writable"]).await;
    let s = plugin_cluster(&plugin).await;
    // ESS carries no identity: a store without audiences.
    let mut store = super::plugin_store(&plugin, "ess", "files.sock");
    store["spec"]["provider"]["plugin"]
        .as_object_mut()
        .unwrap()
        .remove("audiences");
    s.apply(store);
    s.apply(
        json!({"apiVersion": "latchkey.dev/v1alpha1", "kind": "PushSecret",
        "metadata": {"name": "to-ess", "namespace": "shop"},
        "spec": {"serviceAccountName": "writer", "secretStoreRefs": [{"name": "ess"}],
                 "selector": {"secret": {"name": "db"}},
                 "data": [{"match": {"secretKey": "password",
                                     "remoteRef": {"remoteKey": "db", "property": "password"}}}]}}),
    );
    let socket_dir = plugin.socket_dir.display().to_string();
    let args = ["--plugin-socket-dir", socket_dir.as_str()];
    let kubeconfig = s.kubeconfig_yaml(CONTROLLER_TOKEN);
    let within = Duration::from_secs(15);
    let mut c = ControllerProcess::start(&kubeconfig, "plugin-push-restart", &args).await;
    support::eventually(within, "pushed", || async {
        plugin
            .entries("db")
            .is_some_and(|e| e["password"] == PASSWORD)
    })
    .await;
    c.stop();
    let applies = |calls: &str| calls.matches("ApplySecret db").count();
    let reads = |calls: &str| calls.matches("GetSecret db").count();
    let before = plugin.calls();
    assert_eq!(applies(&before), 1, "{before}");

    let c = ControllerProcess::start(&kubeconfig, "plugin-push-restart-2", &args).await;
    support::eventually(within, "read again", || async {
        reads(&plugin.calls()) > reads(&before)
    })
    .await;
    // Time for a write, had one been made.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = plugin.calls();
    assert_eq!(applies(&after), 1, "{after}");
    assert_clean(&c.log_text());
}
