//! `replicationLocations` on AWS Secrets Manager (moto): the regions a pushed secret is
//! replicated to, exactly those when set, left alone when unset, and removed before the secret
//! is deleted (Secrets Manager deletes no secret with replicas); counted as in the parent file.

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::Region;
use latchkey::api::push_metadata::PushMetadataSpec;
use latchkey::providers::push::{PushError, Pushed, Pusher};
use serde_json::json;

use super::{REPLACE, VALUE, counted, describe, meta, ops, versions, whole};
use crate::support::moto::Moto;

/// The regions `key` is replicated to, sorted.
async fn regions(admin: &Client, key: &str) -> Vec<String> {
    let mut out: Vec<String> = describe(admin, key)
        .await
        .replication_status()
        .iter()
        .filter_map(|r| r.region().map(String::from))
        .collect();
    out.sort();
    out
}

/// Whether the replica of `key` in `region` holds `value`.
async fn replica_holds(admin: &Client, region: &str, key: &str, value: &str) -> bool {
    let conf = admin
        .config()
        .to_builder()
        .region(Region::new(region.to_string()))
        .build();
    let got = Client::from_conf(conf)
        .get_secret_value()
        .secret_id(key)
        .send()
        .await;
    got.is_ok_and(|g| g.secret_string() == Some(value))
}

#[tokio::test]
async fn replicas_are_exactly_the_regions_listed_and_go_before_the_secret() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let two = meta(json!({"replicationLocations": ["eu-west-1", "us-west-2"]}));

    // Created with its replicas, in the one CreateSecret.
    let first = push
        .push_with("prod/replicated", &whole(VALUE.as_bytes()), REPLACE, &two)
        .await
        .unwrap();
    let Pushed::Written { version } = first else {
        panic!("{first:?}")
    };
    assert_eq!(calls.take(), ops(&["DescribeSecret", "CreateSecret"]));
    assert_eq!(
        regions(&admin, "prod/replicated").await,
        ["eu-west-1", "us-west-2"]
    );
    assert!(replica_holds(&admin, "eu-west-1", "prod/replicated", VALUE).await);

    // As they are: read, nothing written.
    let again = push
        .push_with("prod/replicated", &whole(VALUE.as_bytes()), REPLACE, &two)
        .await
        .unwrap();
    assert_eq!(
        again,
        Pushed::Unchanged {
            version: version.clone()
        }
    );
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));

    // One region swapped: removed, then added, no new version of the value.
    let swapped = meta(json!({"replicationLocations": ["us-west-2", "ap-south-1"]}));
    let pushed = push
        .push_with(
            "prod/replicated",
            &whole(VALUE.as_bytes()),
            REPLACE,
            &swapped,
        )
        .await
        .unwrap();
    assert_eq!(pushed, Pushed::Written { version });
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "RemoveRegionsFromReplication",
            "ReplicateSecretToRegions"
        ])
    );
    assert_eq!(
        regions(&admin, "prod/replicated").await,
        ["ap-south-1", "us-west-2"]
    );
    assert_eq!(versions(&admin, "prod/replicated").await, 1);

    // Unset: the replicas are left as they are.
    let pushed = push
        .push_with(
            "prod/replicated",
            &whole(VALUE.as_bytes()),
            REPLACE,
            &PushMetadataSpec::default(),
        )
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Unchanged { .. }), "{pushed:?}");
    assert_eq!(
        regions(&admin, "prod/replicated").await,
        ["ap-south-1", "us-west-2"]
    );
    calls.take();

    // The store's own region is refused before any call.
    let own = meta(json!({"replicationLocations": ["us-east-1"]}));
    let err = push
        .push_with("prod/replicated", &whole(VALUE.as_bytes()), REPLACE, &own)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PushError::BadMetadata { field: "replicationLocations", why } if why.contains("own region")),
        "{err:?}"
    );
    assert!(calls.take().is_empty());

    // Deleted: its replicas first, as Secrets Manager asks.
    push.delete("prod/replicated", &[]).await.unwrap();
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "RemoveRegionsFromReplication",
            "DeleteSecret"
        ])
    );
    let gone = admin
        .describe_secret()
        .secret_id("prod/replicated")
        .send()
        .await;
    assert!(gone.is_err(), "not deleted: {gone:?}");
}
