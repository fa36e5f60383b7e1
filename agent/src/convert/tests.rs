//! Whole-conversion tests on small inputs; the golden files in `tests/convert/` cover the rest.

use super::*;

fn run(text: &str) -> Result<Conversion, ConvertError> {
    convert(&[Input {
        name: "in.yaml".into(),
        text: text.into(),
    }])
}

#[test]
fn fake_values_never_reach_the_messages() {
    let c = run(r#"
apiVersion: external-secrets.io/v1
kind: SecretStore
metadata: {name: fake, namespace: demo}
spec:
  provider:
    fake:
      data:
      - {key: a, value: hunter2}
      - {key: b, valueMap: {x: hunter4}}
      - {value: hunter5}
---
apiVersion: external-secrets.io/v1
kind: SecretStore
metadata: {name: typo, namespace: demo}
spec:
  provider:
    fake:
      data:
      - {key: a, value: hunter7, bogus: hunter3}
---
apiVersion: v1
kind: Secret
metadata: {name: s}
stringData: {password: hunter6}
"#)
    .unwrap();
    let messages = c.messages.join("\n");
    for value in ["hunter2", "hunter3", "hunter4", "hunter5", "hunter6", "hunter7"] {
        assert!(!messages.contains(value), "{value} in {messages}");
    }
    assert!(
        messages.contains("SecretStore demo/typo: not converted: unknown field spec.provider.fake.data[0].bogus"),
        "{messages}"
    );
    assert_eq!(c.failed, 1);
    assert!(
        messages.contains("skipped: v1 Secret s: not a"),
        "{messages}"
    );
    // The converted store itself carries the values, the JSON of valueMap included.
    assert!(c.yaml.contains("value: hunter2"), "{}", c.yaml);
    assert!(c.yaml.contains(r#"'{"x":"hunter4"}'"#), "{}", c.yaml);
    assert!(!c.yaml.contains("hunter6"));
    assert!(!c.yaml.contains("hunter7"), "{}", c.yaml);
}

#[test]
fn nothing_convertible_yields_no_document() {
    let c = run("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n").unwrap();
    assert_eq!((c.documents, c.objects), (0, 1));
    let c = run(
        "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\nmetadata: {name: \
         a}\nspec: {provider: \"\"}\n",
    )
    .unwrap();
    assert_eq!(c.documents, 0);
    assert!(
        c.messages
            .iter()
            .any(|m| m.contains("unknown provider \"\""))
    );
    // A provider name the driver could not have used (it names a socket) is refused too.
    let c = run(
        "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\nmetadata: {name: \
         a}\nspec: {provider: ../azure}\n",
    )
    .unwrap();
    assert_eq!(c.documents, 0);
    assert!(
        c.messages
            .iter()
            .any(|m| m.contains("secretsStoreCSI.provider")),
        "{:?}",
        c.messages
    );
}

#[test]
fn other_providers_become_secrets_store_csi_stores_mounting_every_file() {
    let c = run(
        "apiVersion: secrets-store.csi.x-k8s.io/v1\nkind: SecretProviderClass\nmetadata: {name: \
         a, namespace: shop}\nspec: {provider: akeyless, parameters: {akeylessGatewayURL: \
         https://gw, objects: x}}\n",
    )
    .unwrap();
    assert_eq!(c.documents, 2);
    for want in [
        "secretsStoreCSI:",
        "provider: akeyless",
        "akeylessGatewayURL: https://gw",
        "regexp: .*",
        "externalSecret: a",
    ] {
        assert!(c.yaml.contains(want), "{want}: {}", c.yaml);
    }
    assert!(
        c.messages.iter().any(|m| m.contains("audiences")),
        "{:?}",
        c.messages
    );
}

#[test]
fn every_note_is_a_comment_and_a_message() {
    let c = run(r#"
apiVersion: secrets-store.csi.x-k8s.io/v1
kind: SecretProviderClass
metadata: {name: db, namespace: shop, uid: "1234"}
spec:
  provider: aws
  parameters:
    region: eu-west-1
    objects: |
      - objectName: prod/db
        objectType: secretsmanager
      - objectName: /prod/flag
        objectType: ssmparameter
"#)
    .unwrap();
    let line = "SecretProviderClass shop/db: spec.parameters.objects[1].objectType: ssmparameter \
                has no Latchkey equivalent";
    assert!(
        c.yaml.contains(&format!("# latchkey convert: {line}")),
        "{}",
        c.yaml
    );
    assert!(
        c.messages
            .iter()
            .any(|m| m.starts_with(&format!("warning: {line}")))
    );
    assert!(c.yaml.contains("secretKey: prod_db"), "{}", c.yaml);
    assert!(
        c.yaml
            .contains("SecretProviderClass shop/db: metadata: uid: set by the API server"),
        "{}",
        c.yaml
    );
    assert_eq!(c.documents, 2);
}

#[test]
fn an_invalid_conversion_is_not_written() {
    // deletionPolicy Delete with creationPolicy Orphan breaks a Latchkey rule (and an ESO one).
    let c = run(r#"
apiVersion: external-secrets.io/v1
kind: ExternalSecret
metadata: {name: a}
spec:
  secretStoreRef: {name: s}
  data: [{secretKey: k, remoteRef: {key: r}}]
  target: {creationPolicy: Orphan, deletionPolicy: Delete}
---
apiVersion: external-secrets.io/v1
kind: ExternalSecret
metadata: {name: b}
spec:
  secretStoreRef: {name: s}
  data: [{secretKey: k, remoteRef: {key: r}}]
"#)
    .unwrap();
    assert_eq!(c.documents, 1);
    let messages = c.messages.join("\n");
    assert!(
        messages.contains("fails Latchkey's validation"),
        "{messages}"
    );
    assert!(
        messages.contains("error: ExternalSecret a: not converted"),
        "{messages}"
    );
}

#[test]
fn an_unknown_field_fails_the_object_naming_its_path() {
    // `proprety` instead of `property`: converted, the ExternalSecret would mount the whole
    // secret's JSON instead of one property.
    let c = run(r#"
apiVersion: external-secrets.io/v1
kind: ExternalSecret
metadata: {name: db, namespace: shop, ownerReferences: [{kind: ClusterExternalSecret}]}
spec:
  secretStoreRef: {name: vault}
  data: [{secretKey: password, remoteRef: {key: db, proprety: password}}]
---
apiVersion: external-secrets.io/v1
kind: ExternalSecret
metadata: {name: ok, namespace: shop, finalizers: [x]}
spec:
  secretStoreRef: {name: vault}
  data: [{secretKey: password, remoteRef: {key: db, property: password}}]
"#)
    .unwrap();
    assert_eq!((c.documents, c.failed, c.objects), (1, 1, 2));
    let messages = c.messages.join("\n");
    assert!(
        messages.contains(
            "error: ExternalSecret shop/db: not converted: unknown field \
             spec.data[0].remoteRef.proprety: latchkey convert does not know it"
        ),
        "{messages}"
    );
    assert!(!messages.contains("no Latchkey equivalent"), "{messages}");
    assert!(!c.yaml.contains("name: db\n"), "{}", c.yaml);
    assert!(c.yaml.contains("property: password"), "{}", c.yaml);
    // Metadata an object may have is noted, not unknown.
    assert!(messages.contains("metadata.finalizers: set by the controllers"), "{messages}");
}
