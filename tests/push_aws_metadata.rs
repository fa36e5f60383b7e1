//! PushSecret metadata on AWS Secrets Manager against a real `moto_server`: `tags`,
//! `description`, `kmsKeyId`, `secretPushFormat` and `replicationLocations` as ESO applies them, and the calls each push
//! costs. Calls are counted by an interceptor on the SDK client the pusher is given, which
//! records the `X-Amz-Target` operation of every request serialized (once per operation, however
//! often it is retried): moto cannot count them, and its `LastChangedDate` has whole seconds and
//! ignores tag changes, so it could not prove that nothing was sent.

mod support;

// The same through `latchkey controller`, in a file of its own.
#[path = "push_aws_metadata/controller.rs"]
mod controller;
// Pushes that would change nothing, in a file of their own.
#[path = "push_aws_metadata/unchanged.rs"]
mod unchanged;
// `replicationLocations`, in a file of its own.
#[path = "push_aws_metadata/replication.rs"]
mod replication;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_secretsmanager::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_secretsmanager::error::BoxError;
use aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput;
use aws_sdk_secretsmanager::types::Tag;
use latchkey::api::push_metadata::PushMetadataSpec;
use latchkey::providers::aws::push::AwsPush;
use latchkey::providers::push::{PushError, PushPolicy, PushValue, Pushed, Pusher};
use latchkey::secret::SecretBytes;
use serde_json::json;
use support::moto::{Moto, versions};

const VALUE: &str = "aws-metadata-value-7731";
const NEW_VALUE: &str = "aws-metadata-value-rotated-2208";
/// Not UTF-8, and recognisable if it leaked in hex or debug form.
const NOT_TEXT: &[u8] = &[0xff, 0xfe, b'l', b'e', b'a', b'k', 0x80, 0x81];

const REPLACE: PushPolicy = PushPolicy {
    if_not_exists: false,
    adopt: false,
};
const ADOPT: PushPolicy = PushPolicy {
    if_not_exists: false,
    adopt: true,
};
const IF_NOT_EXISTS: PushPolicy = PushPolicy {
    if_not_exists: true,
    adopt: false,
};

/// The operations sent through a client, in order.
#[derive(Debug, Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Intercept for Calls {
    fn name(&self) -> &'static str {
        "CountCalls"
    }

    fn read_after_serialization(
        &self,
        ctx: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = ctx.request().headers().get("x-amz-target").unwrap_or("?");
        let op = target.rsplit('.').next().unwrap_or(target).to_string();
        self.0.lock().unwrap().push(op);
        Ok(())
    }
}

impl Calls {
    /// The operations sent since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A pusher on moto whose calls are counted.
fn counted(moto: &Moto) -> (AwsPush, Calls) {
    let calls = Calls::default();
    let conf = moto
        .client()
        .config()
        .to_builder()
        .interceptor(calls.clone())
        .build();
    (AwsPush::from_client(Client::from_conf(conf)), calls)
}

fn meta(spec: serde_json::Value) -> PushMetadataSpec {
    serde_json::from_value(spec).unwrap()
}

fn whole(bytes: &[u8]) -> PushValue {
    PushValue::Whole(SecretBytes::new(bytes.to_vec()))
}

async fn describe(admin: &Client, key: &str) -> DescribeSecretOutput {
    admin.describe_secret().secret_id(key).send().await.unwrap()
}

fn tag_map(d: &DescribeSecretOutput) -> BTreeMap<String, String> {
    d.tags()
        .iter()
        .map(|t| {
            let (k, v) = (t.key().unwrap_or_default(), t.value().unwrap_or_default());
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn tags_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn assert_no_value(err: &PushError) {
    let text = format!("{err} {err:?}");
    let leaked = [VALUE, NEW_VALUE, "leak"]
        .iter()
        .find(|v| text.contains(*v));
    assert!(leaked.is_none(), "a value leaked: {text}");
}

fn ops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn create_carries_the_tags_description_key_and_format_with_the_mark() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    assert_eq!(
        push.metadata_fields(),
        [
            "tags",
            "description",
            "kmsKeyId",
            "secretPushFormat",
            "replicationLocations"
        ]
    );
    let m = meta(json!({"tags": {"team": "payments", "env": "prod"},
        "description": "the payments database", "kmsKeyId": "alias/latchkey-test",
        "secretPushFormat": "string"}));
    let pushed = push
        .push_with("prod/db", &whole(VALUE.as_bytes()), REPLACE, &m)
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Written { .. }), "{pushed:?}");
    assert_eq!(calls.take(), ops(&["DescribeSecret", "CreateSecret"]));
    let d = describe(&admin, "prod/db").await;
    assert_eq!(
        tag_map(&d),
        tags_of(&[
            ("team", "payments"),
            ("env", "prod"),
            ("managed-by", "latchkey")
        ])
    );
    assert_eq!(d.description(), Some("the payments database"));
    assert_eq!(d.kms_key_id(), Some("alias/latchkey-test"));
    let got = admin
        .get_secret_value()
        .secret_id("prod/db")
        .send()
        .await
        .unwrap();
    assert_eq!(got.secret_string(), Some(VALUE));
    assert!(got.secret_binary().is_none());

    // The same push again: read, and nothing written.
    push.push_with("prod/db", &whole(VALUE.as_bytes()), REPLACE, &m)
        .await
        .unwrap();
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));
}

#[tokio::test]
async fn tags_when_set_become_exactly_the_new_set_and_when_unset_are_left_alone() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let first = meta(json!({"tags": {"keep": "1", "change": "2", "drop": "3"}}));
    push.push_with("prod/tags", &whole(VALUE.as_bytes()), REPLACE, &first)
        .await
        .unwrap();
    calls.take();
    // Someone else tags the secret.
    admin
        .tag_resource()
        .secret_id("prod/tags")
        .tags(Tag::builder().key("theirs").value("x").build())
        .send()
        .await
        .unwrap();

    // No `tags` in the entry: metadata untouched (ESO: tags are patched only when set).
    let none = PushMetadataSpec::default();
    push.push_with("prod/tags", &whole(NEW_VALUE.as_bytes()), REPLACE, &none)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&["DescribeSecret", "GetSecretValue", "PutSecretValue"])
    );
    assert_eq!(
        tag_map(&describe(&admin, "prod/tags").await),
        tags_of(&[
            ("keep", "1"),
            ("change", "2"),
            ("drop", "3"),
            ("theirs", "x"),
            ("managed-by", "latchkey")
        ])
    );

    // One changed, one added, one removed; theirs goes too, the mark stays. The value is
    // already in place: no value write, no new version.
    let before = versions(&admin, "prod/tags").await;
    let second = meta(json!({"tags": {"keep": "1", "change": "20", "add": "4"}}));
    push.push_with("prod/tags", &whole(NEW_VALUE.as_bytes()), REPLACE, &second)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "TagResource",
            "UntagResource"
        ])
    );
    assert_eq!(versions(&admin, "prod/tags").await, before);
    assert_eq!(
        tag_map(&describe(&admin, "prod/tags").await),
        tags_of(&[
            ("keep", "1"),
            ("change", "20"),
            ("add", "4"),
            ("managed-by", "latchkey")
        ])
    );

    // Already so: read, no write, no tag call.
    push.push_with("prod/tags", &whole(NEW_VALUE.as_bytes()), REPLACE, &second)
        .await
        .unwrap();
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));

    // Only additions and changes, with a new value: the value, then no UntagResource.
    let third = meta(json!({"tags": {"keep": "1", "change": "21", "add": "4", "more": "5"}}));
    push.push_with("prod/tags", &whole(VALUE.as_bytes()), REPLACE, &third)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "PutSecretValue",
            "TagResource"
        ])
    );
}

#[tokio::test]
async fn description_or_key_changes_go_with_the_value_in_one_update_secret() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let first = meta(json!({"description": "first"}));
    push.push_with("prod/desc", &whole(VALUE.as_bytes()), REPLACE, &first)
        .await
        .unwrap();
    calls.take();
    push.push_with("prod/desc", &whole(VALUE.as_bytes()), REPLACE, &first)
        .await
        .unwrap();
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));

    let second = meta(json!({"description": "second", "kmsKeyId": "alias/rotated"}));
    let pushed = push
        .push_with("prod/desc", &whole(NEW_VALUE.as_bytes()), REPLACE, &second)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&["DescribeSecret", "GetSecretValue", "UpdateSecret"])
    );
    let Pushed::Written { version } = pushed else {
        panic!("{pushed:?}")
    };
    assert!(!version.is_empty(), "UpdateSecret answers the new version");
    let d = describe(&admin, "prod/desc").await;
    assert_eq!(d.description(), Some("second"));
    assert_eq!(d.kms_key_id(), Some("alias/rotated"));
    let got = admin
        .get_secret_value()
        .secret_id("prod/desc")
        .send()
        .await
        .unwrap();
    assert_eq!(got.secret_string(), Some(NEW_VALUE));
    assert_eq!(got.version_id(), Some(version.as_str()));

    // Unchanged since: read, nothing written.
    push.push_with("prod/desc", &whole(NEW_VALUE.as_bytes()), REPLACE, &second)
        .await
        .unwrap();
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));

    // The description alone: one UpdateSecret without the value, so no new version.
    let third = meta(json!({"description": "third", "kmsKeyId": "alias/rotated"}));
    let pushed = push
        .push_with("prod/desc", &whole(NEW_VALUE.as_bytes()), REPLACE, &third)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&["DescribeSecret", "GetSecretValue", "UpdateSecret"])
    );
    assert_eq!(pushed, Pushed::Written { version });
    assert_eq!(versions(&admin, "prod/desc").await, 2);
    assert_eq!(
        describe(&admin, "prod/desc").await.description(),
        Some("third")
    );

    // AWS's own key, named or not, is the key of a secret created without one.
    let default_key = meta(json!({"kmsKeyId": "alias/aws/secretsmanager"}));
    push.push_with(
        "prod/plain",
        &whole(VALUE.as_bytes()),
        REPLACE,
        &default_key,
    )
    .await
    .unwrap();
    calls.take();
    push.push_with(
        "prod/plain",
        &whole(VALUE.as_bytes()),
        REPLACE,
        &default_key,
    )
    .await
    .unwrap();
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));
}

#[tokio::test]
async fn secret_push_format_binary_string_and_unset() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let get = |key: &'static str| {
        let admin = admin.clone();
        async move {
            let out = admin
                .get_secret_value()
                .secret_id(key)
                .send()
                .await
                .unwrap();
            let binary = out.secret_binary().map(|b| b.as_ref().to_vec());
            (out.secret_string().map(String::from), binary)
        }
    };

    // binary: always SecretBinary, text included, on create and on update.
    let binary = meta(json!({"secretPushFormat": "binary"}));
    push.push_with("prod/bin", &whole(VALUE.as_bytes()), REPLACE, &binary)
        .await
        .unwrap();
    assert_eq!(
        get("prod/bin").await,
        (None, Some(VALUE.as_bytes().to_vec()))
    );
    push.push_with("prod/bin", &whole(NEW_VALUE.as_bytes()), REPLACE, &binary)
        .await
        .unwrap();
    let (text, bytes) = get("prod/bin").await;
    assert_eq!((text, bytes), (None, Some(NEW_VALUE.as_bytes().to_vec())));

    // unset: not text goes as binary, as before.
    push.push_with(
        "prod/auto",
        &whole(NOT_TEXT),
        REPLACE,
        &PushMetadataSpec::default(),
    )
    .await
    .unwrap();
    assert_eq!(get("prod/auto").await, (None, Some(NOT_TEXT.to_vec())));

    // string and not UTF-8: refused, nothing created, no value in the error.
    let string = meta(json!({"secretPushFormat": "string"}));
    calls.take();
    let err = push
        .push_with("prod/str", &whole(NOT_TEXT), REPLACE, &string)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::CannotPush { .. }), "{err:?}");
    assert_eq!(err.reason(), "Unsupported");
    let text = err.to_string();
    assert!(
        text.contains("\"prod/str\"") && text.contains("secretPushFormat"),
        "{text}"
    );
    assert_no_value(&err);
    assert_eq!(calls.take(), ops(&["DescribeSecret"]), "nothing written");
    assert!(
        admin
            .describe_secret()
            .secret_id("prod/str")
            .send()
            .await
            .is_err()
    );

    // ... and on an existing secret: no new version.
    push.push_with("prod/str", &whole(VALUE.as_bytes()), REPLACE, &string)
        .await
        .unwrap();
    let before = versions(&admin, "prod/str").await;
    calls.take();
    let err = push
        .push_with("prod/str", &whole(NOT_TEXT), REPLACE, &string)
        .await
        .unwrap_err();
    assert_no_value(&err);
    assert_eq!(calls.take(), ops(&["DescribeSecret"]), "nothing written");
    assert_eq!(versions(&admin, "prod/str").await, before);
    assert_eq!(get("prod/str").await.0.as_deref(), Some(VALUE));
}

#[tokio::test]
async fn if_not_exists_keeping_a_secret_touches_nothing_metadata_included() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let first = meta(json!({"tags": {"team": "a"}, "description": "first"}));
    push.push_with("prod/kept", &whole(VALUE.as_bytes()), REPLACE, &first)
        .await
        .unwrap();
    calls.take();
    let other = meta(json!({"tags": {"team": "b"}, "description": "second",
        "kmsKeyId": "alias/other", "secretPushFormat": "binary"}));
    let pushed = push
        .push_with(
            "prod/kept",
            &whole(NEW_VALUE.as_bytes()),
            IF_NOT_EXISTS,
            &other,
        )
        .await
        .unwrap();
    assert_eq!(pushed, Pushed::Kept);
    assert_eq!(calls.take(), ops(&["DescribeSecret"]));
    let d = describe(&admin, "prod/kept").await;
    assert_eq!(
        tag_map(&d),
        tags_of(&[("team", "a"), ("managed-by", "latchkey")])
    );
    assert_eq!(d.description(), Some("first"));
}

#[tokio::test]
async fn adoption_adds_the_mark_and_replaces_tags_only_when_set() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    const STACK: &str = "aws:cloudformation:stack-name";
    for key in ["theirs/plain", "theirs/tagged"] {
        admin
            .create_secret()
            .name(key)
            .secret_string("theirs")
            .description("theirs")
            .tags(Tag::builder().key("owner").value("ops").build())
            .tags(Tag::builder().key(STACK).value("db").build())
            .send()
            .await
            .unwrap();
    }
    let tagged = meta(json!({"tags": {"team": "a"}}));

    // Not adoptable: a conflict, nothing sent but the look.
    let err = push
        .push_with("theirs/tagged", &whole(VALUE.as_bytes()), REPLACE, &tagged)
        .await
        .unwrap_err();
    assert!(matches!(err, PushError::Conflict { .. }), "{err:?}");
    assert_eq!(calls.take(), ops(&["DescribeSecret"]));

    // Adopted without tags: theirs stay, the mark is added.
    push.push_with(
        "theirs/plain",
        &whole(VALUE.as_bytes()),
        ADOPT,
        &PushMetadataSpec::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "PutSecretValue",
            "TagResource"
        ])
    );
    let d = describe(&admin, "theirs/plain").await;
    assert_eq!(
        tag_map(&d),
        tags_of(&[("owner", "ops"), (STACK, "db"), ("managed-by", "latchkey")])
    );
    assert_eq!(d.description(), Some("theirs"));

    // Adopted with tags: exactly those and the mark, and AWS's own (which no one may remove).
    push.push_with("theirs/tagged", &whole(VALUE.as_bytes()), ADOPT, &tagged)
        .await
        .unwrap();
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "PutSecretValue",
            "TagResource",
            "UntagResource"
        ])
    );
    assert_eq!(
        tag_map(&describe(&admin, "theirs/tagged").await),
        tags_of(&[("team", "a"), (STACK, "db"), ("managed-by", "latchkey")])
    );
}

#[tokio::test]
async fn values_aws_cannot_take_are_refused_before_any_call() {
    let moto = Moto::start().await;
    let (push, calls) = counted(&moto);
    let long_key = "k".repeat(129);
    let many: BTreeMap<String, String> = (0..50).map(|i| (format!("t{i}"), "v".into())).collect();
    let cases = [
        (json!({"tags": {long_key.clone(): "v"}}), "tags", "128"),
        (json!({"tags": {"team": "v".repeat(257)}}), "tags", "256"),
        (json!({"tags": {"aws:owner": "x"}}), "tags", "aws:"),
        (json!({"tags": {"team": "a;leak"}}), "tags", "letters"),
        (json!({"tags": many}), "tags", "50"),
        (json!({"kmsKeyId": ""}), "kmsKeyId", "empty"),
    ];
    for (spec, field, says) in cases {
        let m = meta(spec);
        let err = push.check_metadata(&m).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("spec.data[].metadata.spec.{field}: "))
                && text.contains(says),
            "{text}"
        );
        assert_eq!(err.reason(), "Unsupported");
        assert_no_value(&err);
        assert!(!text.contains(&long_key), "the key is shortened: {text}");
        let err = push
            .push_with("prod/refused", &whole(VALUE.as_bytes()), REPLACE, &m)
            .await
            .unwrap_err();
        assert!(matches!(err, PushError::BadMetadata { .. }), "{err:?}");
    }
    assert!(calls.take().is_empty(), "nothing was sent");
    let fine = meta(json!({"tags": {"team": "a b:c/d=e+f-g@h_i.j", "ü": "ß"},
        "description": "any text; even this", "kmsKeyId": "alias/x"}));
    push.check_metadata(&fine).unwrap();
}
