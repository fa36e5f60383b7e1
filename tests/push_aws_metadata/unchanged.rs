//! Values (properties or whole) already in place with their settings are not written again:
//! what a restarted controller's pushes cost on AWS Secrets Manager (moto), counted as in the
//! parent file.

use latchkey::providers::push::{PushValue, Pushed, Pusher};
use latchkey::secret::SecretBytes;
use serde_json::json;

use super::{REPLACE, VALUE, counted, meta, ops, versions, whole};
use crate::support::moto::Moto;

#[tokio::test]
async fn properties_already_in_place_with_their_settings_are_not_written_again() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let (push, calls) = counted(&moto);
    let props = PushValue::Properties(
        [("user", "app"), ("password", VALUE)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), SecretBytes::from(v)))
            .collect(),
    );
    let team_a = meta(json!({"tags": {"team": "a"}}));
    let first = push
        .push_with("prod/props", &props, REPLACE, &team_a)
        .await
        .unwrap();
    let Pushed::Written { version } = first else {
        panic!("{first:?}")
    };
    calls.take();

    // As a restarted controller would push it: read, compared, nothing written.
    let again = push
        .push_with("prod/props", &props, REPLACE, &team_a)
        .await
        .unwrap();
    assert_eq!(again, Pushed::Unchanged { version });
    assert_eq!(calls.take(), ops(&["DescribeSecret", "GetSecretValue"]));
    assert_eq!(versions(&admin, "prod/props").await, 1);

    // Settings that differ are written, without the value; another form, with it.
    let team_b = meta(json!({"tags": {"team": "b"}}));
    let pushed = push
        .push_with("prod/props", &props, REPLACE, &team_b)
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Written { .. }), "{pushed:?}");
    assert_eq!(
        calls.take(),
        ops(&["DescribeSecret", "GetSecretValue", "TagResource"])
    );
    assert_eq!(versions(&admin, "prod/props").await, 1);
    let binary = meta(json!({"tags": {"team": "b"}, "secretPushFormat": "binary"}));
    let pushed = push
        .push_with("prod/props", &props, REPLACE, &binary)
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Written { .. }), "{pushed:?}");
    let pushed = push
        .push_with("prod/props", &props, REPLACE, &binary)
        .await
        .unwrap();
    assert!(matches!(pushed, Pushed::Unchanged { .. }), "{pushed:?}");
    assert_eq!(versions(&admin, "prod/props").await, 2);

    // A whole value is read too: written once, then found in place.
    calls.take();
    let mut got = Vec::new();
    for _ in 0..2 {
        let pushed = push
            .push_with("prod/props", &whole(VALUE.as_bytes()), REPLACE, &team_b)
            .await
            .unwrap();
        got.push(matches!(pushed, Pushed::Written { .. }));
    }
    assert_eq!(got, [true, false], "written, then unchanged");
    assert_eq!(
        calls.take(),
        ops(&[
            "DescribeSecret",
            "GetSecretValue",
            "PutSecretValue",
            "DescribeSecret",
            "GetSecretValue"
        ])
    );
}
