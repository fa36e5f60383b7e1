//! AWS push metadata end to end: `latchkey controller` against the fake API server with the
//! deploy files' RBAC, pushing to moto as the PushSecret's service account.

use serde_json::json;

use super::{describe, tag_map, tags_of, versions};
use crate::support::apiserver::FakeApiServer;
use crate::support::controller::ControllerProcess;
use crate::support::moto::Moto;
use crate::support::push::{
    API, LOOP_TOKEN, PASSWORD, aws_store, eventually, push_cluster, push_secret_to,
};

/// The Ready condition of the PushSecret `name` of `shop`.
fn ready(s: &FakeApiServer, name: &str) -> Option<serde_json::Value> {
    let ps = s.get(API, "PushSecret", Some("shop"), name)?;
    let conditions = ps["status"]["conditions"].as_array()?.clone();
    conditions.into_iter().find(|c| c["type"] == "Ready")
}

#[tokio::test]
async fn the_controller_pushes_metadata_and_a_change_of_it_alone() {
    let moto = Moto::start().await;
    let admin = moto.client();
    let s = push_cluster().await;
    aws_store(&s, &moto.endpoint);
    let envelope = |spec: serde_json::Value| {
        json!({"apiVersion": "kubernetes.external-secrets.io/v1alpha1",
               "kind": "PushSecretMetadata", "spec": spec})
    };
    let store = json!({"name": "aws", "kind": "SecretStore"});
    let mut ps = push_secret_to("meta", "pusher", "prod/meta", "None", store);
    ps["spec"]["data"][0]["metadata"] = envelope(json!({"tags": {"team": "shop"},
        "description": "the shop's database", "secretPushFormat": "string"}));
    s.apply(ps);
    let c = ControllerProcess::start(&s.kubeconfig_yaml(LOOP_TOKEN), "push-aws-meta", &[]).await;
    let within = std::time::Duration::from_secs(15);
    eventually(&c, within, "the push to Secrets Manager", || {
        let ps = s.get(API, "PushSecret", Some("shop"), "meta")?;
        ps["status"]["syncedPushSecrets"]["SecretStore/aws"]["prod/meta"]["version"]
            .as_str()
            .map(String::from)
    })
    .await;
    let d = describe(&admin, "prod/meta").await;
    assert_eq!(
        tag_map(&d),
        tags_of(&[("team", "shop"), ("managed-by", "latchkey")])
    );
    assert_eq!(d.description(), Some("the shop's database"));
    let got = admin
        .get_secret_value()
        .secret_id("prod/meta")
        .send()
        .await
        .unwrap();
    let pushed: serde_json::Value = serde_json::from_str(got.secret_string().unwrap()).unwrap();
    assert_eq!(pushed, json!({"password": PASSWORD, "username": "app"}));

    // The settings alone change: pushed again, tags replaced, no new version of the value.
    let unchanged = versions(&admin, "prod/meta").await;
    let mut edited = s.get(API, "PushSecret", Some("shop"), "meta").unwrap();
    edited["spec"]["data"][0]["metadata"] = envelope(json!({"tags": {"team": "checkout"},
        "description": "moved to checkout"}));
    s.apply(edited);
    let deadline = std::time::Instant::now() + within;
    loop {
        // The tags follow the description's UpdateSecret: both.
        let d = describe(&admin, "prod/meta").await;
        let tags = tags_of(&[("team", "checkout"), ("managed-by", "latchkey")]);
        if d.description() == Some("moved to checkout") && tag_map(&d) == tags {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not pushed again:\n{}",
            c.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    assert_eq!(versions(&admin, "prod/meta").await, unchanged);

    // A tag Secrets Manager would refuse: the PushSecret fails, naming the remote key and
    // the field, and nothing is written.
    let before = versions(&admin, "prod/meta").await;
    let mut edited = s.get(API, "PushSecret", Some("shop"), "meta").unwrap();
    edited["spec"]["data"][0]["metadata"] = envelope(json!({"tags": {"aws:team": "x"}}));
    s.apply(edited);
    let condition = eventually(&c, within, "the refusal", || {
        ready(&s, "meta").filter(|r| r["message"].as_str().is_some_and(|m| m.contains("aws:")))
    })
    .await;
    assert_eq!(condition["status"], "False", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("remote key \"prod/meta\"")
            && message.contains("spec.data[].metadata.spec.tags")
            && message.contains("aws:"),
        "{message}"
    );
    assert_eq!(versions(&admin, "prod/meta").await, before);
    assert_eq!(
        tag_map(&describe(&admin, "prod/meta").await),
        tags_of(&[("team", "checkout"), ("managed-by", "latchkey")])
    );
    let log = c.log_text();
    for value in [PASSWORD, "testing"] {
        assert!(!log.contains(value), "{value} in the log");
    }
}
