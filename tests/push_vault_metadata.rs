//! `spec.data[].metadata` pushed to Vault / OpenBao KV v2 against a real OpenBao dev server:
//! `customMetadata` written beside Latchkey's mark, `mergePolicy: Merge` keeping what someone
//! else added and `Replace` dropping it, no metadata write when nothing changed (counted on the
//! wire), Vault's own bounds refused before anything is written, and a KV v1 store, which keeps
//! no metadata, refusing the PushSecret by the field's name through the real controller.

mod support;

use base64::Engine as _;
use latchkey::api::push_metadata::{MetadataMergePolicy, PushMetadataSpec};
use latchkey::providers::push::{PushError, Pushed, Pusher};
use serde_json::{Value, json};
use support::controller::ControllerProcess;
use support::openbao::{JwtIssuer, OpenBao};
use support::push::{REPLACE, props};
use support::tee_proxy::TeeProxy;
use support::vault_push::vault_pusher;

const PASSWORD: &str = "vault-meta-password-5120";
const NEW_PASSWORD: &str = "vault-meta-password-rotated-9931";
const AUDIENCE: &str = "vault";
const API: &str = "latchkey.dev/v1alpha1";
const CONTROLLER_TOKEN: &str = "vault-meta-controller-token";

const PUSH_POLICY: &str = r#"
path "secret/data/*" { capabilities = ["create", "read", "update", "delete"] }
path "secret/metadata/*" { capabilities = ["create", "read", "update", "delete"] }
path "kv1/*" { capabilities = ["create", "read", "update", "delete"] }
"#;

fn custom(pairs: &[(&str, &str)], merge: Option<MetadataMergePolicy>) -> PushMetadataSpec {
    PushMetadataSpec {
        custom_metadata: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        merge_policy: merge,
        ..Default::default()
    }
}

/// A dev server whose jwt role `push` may write `secret/` (KV v2) and `kv1/`.
async fn bao(issuer: &JwtIssuer) -> OpenBao {
    let bao = OpenBao::start().await;
    bao.policy("push", PUSH_POLICY).await;
    bao.jwt(issuer, "push", AUDIENCE, &["push"]).await;
    bao
}

/// A KV v2 pusher for `secret/` at `server`, logged in with jwt role `push`.
async fn pusher(server: &str, issuer: &JwtIssuer) -> Box<dyn Pusher> {
    vault_pusher(server, issuer, (AUDIENCE, "push"), "secret", "v2")
        .await
        .unwrap()
}

fn assert_no_secret(text: &str, bao: &OpenBao) {
    for value in [PASSWORD, NEW_PASSWORD, bao.root_token.as_str()] {
        assert!(!text.contains(value), "leaked: {text}");
    }
}

#[tokio::test]
async fn custom_metadata_goes_beside_the_mark_merged_or_replaced() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let push = pusher(&bao.url, &issuer).await;
    let value = props(&[("password", PASSWORD)]);
    let first = custom(&[("team", "shop"), ("contact", "ops@example.com")], None);
    push.push_with("prod/db", &value, REPLACE, &first)
        .await
        .unwrap();
    assert_eq!(
        bao.kv_metadata("prod/db").await["custom_metadata"],
        json!({"team": "shop", "contact": "ops@example.com", "managed-by": "latchkey"})
    );

    // Someone else adds a key of their own.
    let theirs = json!({"team": "shop", "contact": "ops@example.com", "managed-by": "latchkey",
                        "audited": "2026-11"});
    bao.api(
        "POST",
        "secret/metadata/prod/db",
        Some(json!({"custom_metadata": theirs})),
    )
    .await;

    // Merge (the default): theirs kept, ours changed and added.
    let merged = custom(&[("team", "payments"), ("tier", "gold")], None);
    let pushed = push
        .push_with("prod/db", &value, REPLACE, &merged)
        .await
        .unwrap();
    assert_eq!(
        pushed,
        Pushed::Written {
            version: "2".into()
        }
    );
    assert_eq!(
        bao.kv_metadata("prod/db").await["custom_metadata"],
        json!({"team": "payments", "tier": "gold", "contact": "ops@example.com",
               "audited": "2026-11", "managed-by": "latchkey"})
    );

    // Replace: exactly ours and the mark.
    let replaced = custom(&[("team", "payments")], Some(MetadataMergePolicy::Replace));
    push.push_with("prod/db", &value, REPLACE, &replaced)
        .await
        .unwrap();
    assert_eq!(
        bao.kv_metadata("prod/db").await["custom_metadata"],
        json!({"team": "payments", "managed-by": "latchkey"})
    );

    // A push without metadata leaves it as it is (Merge of nothing).
    push.push("prod/db", &value, REPLACE).await.unwrap();
    assert_eq!(
        bao.kv_metadata("prod/db").await["custom_metadata"],
        json!({"team": "payments", "managed-by": "latchkey"})
    );
}

/// Counted on the wire: OpenBao's `updated_time` of the metadata moves with every data version,
/// so it cannot tell a metadata write apart.
#[tokio::test]
async fn an_unchanged_push_writes_no_metadata() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let backend: std::net::SocketAddr = bao.url.trim_start_matches("http://").parse().unwrap();
    let wire = TeeProxy::start(backend).await;
    let push = pusher(&format!("http://{}", wire.addr), &issuer).await;
    let metadata_writes = || {
        wire.sent_text()
            .matches("POST /v1/secret/metadata/prod/same ")
            .count()
    };
    let data_writes = || {
        wire.sent_text()
            .matches("POST /v1/secret/data/prod/same ")
            .count()
    };
    let settings = custom(&[("team", "shop")], None);
    let value = props(&[("password", PASSWORD)]);
    push.push_with("prod/same", &value, REPLACE, &settings)
        .await
        .unwrap();
    assert_eq!((data_writes(), metadata_writes()), (1, 1));

    // Same settings, new value: a data version, no metadata write.
    let value = props(&[("password", NEW_PASSWORD)]);
    push.push_with("prod/same", &value, REPLACE, &settings)
        .await
        .unwrap();
    assert_eq!((data_writes(), metadata_writes()), (2, 1));
    let meta = bao.kv_metadata("prod/same").await;
    assert_eq!(meta["current_version"], 2);
    assert_eq!(
        meta["custom_metadata"],
        json!({"team": "shop", "managed-by": "latchkey"})
    );

    // Changed settings: one metadata write.
    let settings = custom(&[("team", "payments")], None);
    push.push_with("prod/same", &value, REPLACE, &settings)
        .await
        .unwrap();
    assert_eq!((data_writes(), metadata_writes()), (3, 2));
    assert_eq!(
        bao.kv_metadata("prod/same").await["custom_metadata"]["team"],
        "payments"
    );
}

#[tokio::test]
async fn vaults_bounds_are_refused_before_anything_is_written() {
    let issuer = JwtIssuer::new();
    let bao = bao(&issuer).await;
    let push = pusher(&bao.url, &issuer).await;
    let value = props(&[("password", PASSWORD)]);

    // At Vault's limits exactly (63 keys and the mark, 128-byte keys, 512-byte values): taken,
    // by Latchkey and by OpenBao.
    let long_key = "k".repeat(128);
    let long_value = "v".repeat(512);
    let mut at_limit: Vec<(String, String)> = (0..62)
        .map(|i| (format!("key-{i}"), "x".to_string()))
        .collect();
    at_limit.push((long_key.clone(), long_value.clone()));
    let at_limit = PushMetadataSpec {
        custom_metadata: at_limit.into_iter().collect(),
        ..Default::default()
    };
    push.check_metadata(&at_limit).unwrap();
    push.push_with("prod/full", &value, REPLACE, &at_limit)
        .await
        .unwrap();
    let meta = bao.kv_metadata("prod/full").await;
    assert_eq!(meta["custom_metadata"].as_object().unwrap().len(), 64);
    assert_eq!(meta["custom_metadata"][&long_key], long_value.as_str());

    // One past each: refused by field and key, never showing the value, before any write.
    let mut too_many = at_limit.clone();
    too_many
        .custom_metadata
        .insert("one-more".into(), "x".into());
    let long_value_key = PushMetadataSpec {
        custom_metadata: [("cert".to_string(), format!("{PASSWORD}{}", "v".repeat(512)))].into(),
        ..Default::default()
    };
    let unprintable = PushMetadataSpec {
        custom_metadata: [("note".to_string(), format!("{PASSWORD}\n"))].into(),
        ..Default::default()
    };
    let long_key = custom(&[(&"k".repeat(129), "x")], None);
    for (settings, says) in [
        (
            &too_many,
            "64 keys and Latchkey's \"managed-by\" mark are over Vault's limit of 64",
        ),
        (
            &long_value_key,
            "the value of key \"cert\" is not a Vault custom metadata value",
        ),
        (&unprintable, "the value of key \"note\""),
        (
            &long_key,
            "is not a Vault custom metadata key (at most 128 bytes",
        ),
    ] {
        let err = push.check_metadata(settings).unwrap_err();
        assert!(matches!(err, PushError::BadMetadata { .. }), "{err}");
        assert_eq!(err.reason(), "Unsupported");
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("spec.data[].metadata.spec.customMetadata: "),
            "{text}"
        );
        assert!(text.contains(says), "{says}: {text}");
        assert_no_secret(&text, &bao);
        // The push checks too: nothing written.
        let err = push
            .push_with("prod/refused", &value, REPLACE, settings)
            .await
            .unwrap_err();
        assert!(matches!(err, PushError::BadMetadata { .. }), "{err}");
        assert_eq!(bao.kv_metadata("prod/refused").await, Value::Null);
    }

    // Printable text beyond ASCII is taken by both; what Latchkey refuses as unprintable,
    // OpenBao refuses too (so it is never found out after the data was written).
    let unicode = custom(&[("note", "café 日本 🔑 a-b_c.d:e/f \"q\"")], None);
    push.check_metadata(&unicode).unwrap();
    push.push_with("prod/unicode", &value, REPLACE, &unicode)
        .await
        .unwrap();
    assert_eq!(
        bao.kv_metadata("prod/unicode").await["custom_metadata"]["note"],
        "café 日本 🔑 a-b_c.d:e/f \"q\""
    );
    for odd in [
        "zero\u{200b}width",
        "private\u{e000}",
        "tab\there",
        "nbsp\u{a0}",
    ] {
        let settings = custom(&[("note", odd)], None);
        assert!(push.check_metadata(&settings).is_err(), "{odd:?}");
        let (code, answer) = bao
            .request(
                "POST",
                "secret/metadata/prod/unicode",
                Some(json!({"custom_metadata": {"note": odd}})),
            )
            .await;
        assert_eq!(code, 400, "OpenBao took {odd:?}: {answer}");
    }

    // Merge would make 65 with the keys already there: refused naming the remote key, and the
    // data is not written either (still version 1).
    let err = push
        .push_with("prod/full", &value, REPLACE, &custom(&[("new", "x")], None))
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        text.contains(
            "remote key \"prod/full\" cannot be pushed: its custom metadata would hold 65 keys"
        ),
        "{text}"
    );
    assert!(text.contains("mergePolicy: Replace"), "{text}");
    assert_no_secret(&text, &bao);
    assert_eq!(bao.kv_metadata("prod/full").await["current_version"], 1);
    // Replace makes room.
    let replaced = custom(&[("new", "x")], Some(MetadataMergePolicy::Replace));
    push.push_with("prod/full", &value, REPLACE, &replaced)
        .await
        .unwrap();
    assert_eq!(
        bao.kv_metadata("prod/full").await["custom_metadata"],
        json!({"new": "x", "managed-by": "latchkey"})
    );
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn push_secret(name: &str, store: &str, remote: &str, meta: Value) -> Value {
    json!({"apiVersion": API, "kind": "PushSecret",
    "metadata": {"name": name, "namespace": "shop"},
    "spec": {
        "serviceAccountName": "pusher",
        "refreshInterval": "1h",
        "deletionPolicy": "None",
        "secretStoreRefs": [{"name": store, "kind": "SecretStore"}],
        "selector": {"secret": {"name": "db"}},
        "data": [
            {"match": {"secretKey": "password",
                       "remoteRef": {"remoteKey": remote, "property": "password"}},
             "metadata": {"apiVersion": "kubernetes.external-secrets.io/v1alpha1",
                          "kind": "PushSecretMetadata", "spec": meta}},
        ]}})
}

/// The controller end to end: a KV v2 store takes `customMetadata`; a KV v1 store, which has
/// no metadata, fails the PushSecret naming the field, with nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn the_controller_writes_custom_metadata_and_a_kv_v1_store_refuses_it_by_name() {
    let s = support::push::controller_cluster(CONTROLLER_TOKEN, &["pusher"]).await;
    s.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(PASSWORD)}}));

    let bao = OpenBao::start().await;
    bao.policy("push", PUSH_POLICY).await;
    bao.enable_kv("kv1", 1).await;
    let reviewer = s.token_reviewer();
    bao.kubernetes(
        &s.url(),
        &reviewer,
        "push",
        ("shop", "pusher"),
        AUDIENCE,
        &["push"],
    )
    .await;
    for (store, mount, version) in [("vault", "secret", "v2"), ("vault-v1", "kv1", "v1")] {
        s.apply(json!({"apiVersion": API, "kind": "SecretStore",
            "metadata": {"name": store, "namespace": "shop"},
            "spec": {"provider": {"vault": {"server": bao.url, "path": mount,
                "version": version,
                "auth": {"kubernetes": {"mountPath": "kubernetes", "role": "push",
                                        "audience": AUDIENCE}}}}}}));
    }
    let meta = json!({"customMetadata": {"team": "shop"}, "mergePolicy": "Replace"});
    s.apply(push_secret("v2", "vault", "prod/meta", meta.clone()));
    s.apply(push_secret("v1", "vault-v1", "prod/meta", meta));
    let c = ControllerProcess::start(&s.kubeconfig_yaml(CONTROLLER_TOKEN), "vault-meta", &[]).await;

    c.until("the KV v2 push", || async {
        let meta = bao.kv_metadata("prod/meta").await;
        (meta["custom_metadata"] == json!({"team": "shop", "managed-by": "latchkey"})).then_some(())
    })
    .await;

    let failed = c
        .until("the KV v1 refusal", || async {
            support::push::failed_ready(&s, "v1")
        })
        .await;
    assert_eq!(failed["reason"], "Unsupported", "{failed}");
    let message = failed["message"].as_str().unwrap();
    for part in [
        "PushSecret shop/v1",
        "SecretStore/vault-v1",
        "remote key \"prod/meta\" sets customMetadata, mergePolicy",
        "are Vault KV v2's and plugins', KV v1 keeps no metadata",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let (code, v1) = bao.request("GET", "kv1/prod/meta", None).await;
    assert_eq!(code, 404, "nothing written to KV v1: {v1}");

    let shown = support::push::shown(&s, &c, &["v1", "v2"]);
    assert_no_secret(&shown, &bao);
    assert!(!shown.contains(&b64(PASSWORD)), "{shown}");
    assert!(!shown.contains(&reviewer), "{shown}");
}
