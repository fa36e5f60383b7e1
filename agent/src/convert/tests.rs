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
    for value in [
        "hunter2", "hunter3", "hunter4", "hunter5", "hunter6", "hunter7",
    ] {
        assert!(!messages.contains(value), "{value} in {messages}");
    }
    assert!(
        messages.contains(
            "SecretStore demo/typo: not converted: unknown field spec.provider.fake.data[0].bogus"
        ),
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
    let line = "SecretProviderClass shop/db: spec.parameters.objects: the objects live in 2 \
                different KV mounts or AWS services";
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
    assert!(c.yaml.contains("service: ParameterStore"), "{}", c.yaml);
    assert!(c.yaml.contains("secretKey: _prod_flag"), "{}", c.yaml);
    assert!(
        c.yaml
            .contains("SecretProviderClass shop/db: metadata: uid: set by the API server"),
        "{}",
        c.yaml
    );
    assert_eq!(c.documents, 4, "two stores, two ExternalSecrets");
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
    assert!(
        messages.contains("metadata.finalizers: set by the controllers"),
        "{messages}"
    );
}

/// Every mapping of `value`, as a path of keys and indexes from the root.
fn mapping_paths(
    value: &serde_norway::Value,
    at: Vec<serde_norway::Value>,
    out: &mut Vec<Vec<serde_norway::Value>>,
) {
    use serde_norway::Value;
    match value {
        Value::Mapping(m) => {
            out.push(at.clone());
            for (k, v) in m {
                let mut next = at.clone();
                next.push(k.clone());
                mapping_paths(v, next, out);
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                let mut next = at.clone();
                next.push(Value::from(i as u64));
                mapping_paths(v, next, out);
            }
        }
        _ => {}
    }
}

fn at_path<'v>(
    value: &'v mut serde_norway::Value,
    path: &[serde_norway::Value],
) -> &'v mut serde_norway::Value {
    use serde_norway::Value;
    path.iter().fold(value, |v, step| match (v, step) {
        (Value::Sequence(items), Value::Number(n)) => &mut items[n.as_u64().unwrap() as usize],
        (Value::Mapping(m), k) => m.get_mut(k).unwrap(),
        _ => unreachable!("a path of this value"),
    })
}

/// A path of keys and indexes as notes write it (`spec.data[0].remoteRef`).
fn dotted_path(path: &[serde_norway::Value]) -> String {
    use serde_norway::Value;
    let mut out = String::new();
    for step in path {
        match step {
            Value::Number(n) => out.push_str(&format!("[{n}]")),
            Value::String(k) if out.is_empty() => out.push_str(k),
            Value::String(k) => out.push_str(&format!(".{k}")),
            _ => {}
        }
    }
    out
}

/// The documents of a conversion, comments left out.
fn converted_documents(c: &Conversion) -> Vec<serde_norway::Value> {
    serde_norway::Deserializer::from_str(&c.yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_norway::Value| !v.is_null())
        .collect()
}

/// Copies of a SecretProviderClass `value` with `zzTypo` added to one mapping of its
/// `spec.parameters.objects` YAML each, and the path of that mapping as notes write it.
fn objects_yaml_variants(value: &serde_norway::Value) -> Vec<(serde_norway::Value, String)> {
    let Some(text) = value["spec"]["parameters"]["objects"].as_str() else {
        return Vec::new();
    };
    let Ok(objects) = serde_norway::from_str::<serde_norway::Value>(text) else {
        return Vec::new();
    };
    if !objects.is_sequence() {
        return Vec::new();
    }
    let mut paths = Vec::new();
    mapping_paths(&objects, Vec::new(), &mut paths);
    paths
        .into_iter()
        // Free-form: the request body the provider sent to Vault.
        .filter(|p| !p.iter().any(|step| step.as_str() == Some("secretArgs")))
        .map(|p| {
            let mut changed_objects = objects.clone();
            at_path(&mut changed_objects, &p)
                .as_mapping_mut()
                .unwrap()
                .insert("zzTypo".into(), "x".into());
            let mut changed = value.clone();
            changed["spec"]["parameters"]["objects"] =
                serde_norway::to_string(&changed_objects).unwrap().into();
            (
                changed,
                format!("spec.parameters.objects{}", dotted_path(&p)),
            )
        })
        .collect()
}

/// A field added anywhere in any example object fails that object (named as unknown), is carried
/// over, or changes nothing in what is written: no field is ever dropped without a word.
#[test]
fn an_unknown_field_anywhere_is_never_silently_dropped() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/convert");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".input.yaml") || path.ends_with("bad-yaml.input.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut objects = Vec::new();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
            match value["items"].as_sequence() {
                Some(items) => objects.extend(items.iter().cloned()),
                None if !value.is_null() => objects.push(value),
                None => {}
            }
        }
        // Each object on its own, so that what it converts to is its own; a SecretProviderClass
        // also with a field added to each mapping of its `objects` YAML.
        for value in objects {
            for (changed, at) in objects_yaml_variants(&value) {
                let after = run(&serde_norway::to_string(&changed).unwrap()).unwrap();
                // An error, unless the mapping is in a part dropped whole (noted).
                let dropped_whole = after.messages.iter().any(|m| {
                    let note_path = m.split(": ").nth(2).unwrap_or_default();
                    m.starts_with("warning:")
                        && m.contains("not carried over")
                        && !note_path.is_empty()
                        && at.starts_with(note_path)
                });
                assert!(
                    dropped_whole
                        || after.messages.iter().any(|m| m.starts_with("error:")
                            && m.contains("unknown field")
                            && m.contains(&format!("{at}.zzTypo"))),
                    "{}: zzTypo at {at} was not an error:\n{}",
                    path.display(),
                    after.messages.join("\n")
                );
                checked += 1;
            }
            let one = serde_norway::to_string(&value).unwrap();
            let before = run(&one).unwrap();
            let mut paths = Vec::new();
            mapping_paths(&value, Vec::new(), &mut paths);
            for p in paths {
                let mut changed = value.clone();
                at_path(&mut changed, &p)
                    .as_mapping_mut()
                    .unwrap()
                    .insert("zzTypo".into(), "x".into());
                let after = run(&serde_norway::to_string(&changed).unwrap()).unwrap();
                let messages = after.messages.join("\n");
                let failed = after
                    .messages
                    .iter()
                    .any(|m| m.starts_with("error:") && m.contains("zzTypo"))
                    || (after.failed > before.failed && messages.contains("found 2"));
                let same = converted_documents(&after) == converted_documents(&before);
                // Passed on as it is (a provider pod's parameters).
                let carried = converted_documents(&after)
                    .iter()
                    .any(|d| serde_norway::to_string(d).unwrap().contains("zzTypo"));
                // Unchanged output is right only where nothing of the object was converted, or
                // where a note says the part holding the field (an entry dropped for one of its
                // fields, or a block dropped whole) was not carried over.
                let dotted = dotted_path(&p);
                let dropped_whole = before.documents == 0
                    || after.messages.iter().any(|m| {
                        let note_path = m.split(": ").nth(2).unwrap_or_default();
                        m.starts_with("warning:")
                            && m.contains("not carried over")
                            && !m.contains("zzTypo")
                            && !note_path.is_empty()
                            && !dotted.is_empty()
                            && dotted.starts_with(note_path)
                    });
                assert!(
                    failed || carried || (same && dropped_whole),
                    "{}: zzTypo at {p:?} was dropped silently:\n{messages}",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} mappings checked");
}

/// `--provider-refs`: each store's block moves, unchanged, into a provider object the store
/// names, and the standalone agent resolves the reference to what the inline store held.
#[tokio::test]
async fn provider_refs_resolve_to_the_inline_block() {
    use crate::api::provider_kinds::ProviderKind;
    use crate::catalog::{Catalog, ManifestCatalog};
    let input = r#"
apiVersion: external-secrets.io/v1
kind: SecretStore
metadata: {name: shop-fake, namespace: shop, labels: {team: shop}}
spec:
  provider:
    fake:
      data:
      - {key: db, value: not-a-real-password}
---
apiVersion: external-secrets.io/v1
kind: ClusterSecretStore
metadata: {name: shared-vault}
spec:
  provider:
    vault:
      server: https://vault.example:8200
      path: secret
      version: v2
      auth:
        tokenSecretRef: {name: vault-token, key: token, namespace: latchkey}
"#;
    let inputs = [Input {
        name: "in.yaml".into(),
        text: input.into(),
    }];
    let inline = convert(&inputs).unwrap();
    let by_ref = convert_with(
        &inputs,
        Options {
            provider_refs: true,
        },
    )
    .unwrap();
    assert_eq!((inline.documents, by_ref.documents), (2, 4));
    assert_eq!(by_ref.failed, 0, "{:?}", by_ref.messages);

    let load = |yaml: &str| {
        let mut catalog = ManifestCatalog::default();
        catalog
            .add_documents(std::path::Path::new("out.yaml"), yaml)
            .unwrap();
        catalog
    };
    let (inline, by_ref) = (load(&inline.yaml), load(&by_ref.yaml));
    let store = by_ref
        .secret_store("shop", "shop-fake")
        .await
        .unwrap()
        .unwrap();
    let r = store.spec.provider_ref.as_ref().unwrap();
    assert!(store.spec.provider.is_empty());
    assert_eq!(r.kind, ProviderKind::Fake);
    let object = by_ref
        .provider(r.kind, Some("shop"), &r.name)
        .await
        .unwrap()
        .unwrap();
    let want = inline
        .secret_store("shop", "shop-fake")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(object.provider, want.spec.provider);

    let cluster = by_ref
        .cluster_secret_store("shared-vault")
        .await
        .unwrap()
        .unwrap();
    let r = cluster.spec.provider_ref.as_ref().unwrap();
    assert_eq!(
        r.api_version,
        crate::api::provider_kinds::CLUSTER_PROVIDER_API_VERSION
    );
    let object = by_ref
        .provider(r.kind, None, &r.name)
        .await
        .unwrap()
        .unwrap();
    let want = inline
        .cluster_secret_store("shared-vault")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(object.provider, want.spec.provider);
}
