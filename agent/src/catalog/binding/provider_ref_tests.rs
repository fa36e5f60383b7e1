//! Stores by `spec.providerRef` (issue #41), from a manifest directory: the store binds to the
//! referenced object's spec, found where the store may look (its own namespace, or the cluster
//! group), and that spec is checked as the inline block it stands for.

use std::path::Path;

use super::*;
use crate::catalog::ManifestCatalog;

const OBJECTS: &str = r#"
apiVersion: providers.latchkey.dev/v1alpha1
kind: Fake
metadata: {name: values, namespace: team-a}
spec: {data: [{key: a, value: hunter2-by-ref}]}
---
apiVersion: providers.latchkey.dev/v1alpha1
kind: Fake
metadata: {name: elsewhere, namespace: team-b}
spec: {data: [{key: a, value: team-b-only}]}
---
apiVersion: cluster.providers.latchkey.dev/v1alpha1
kind: Fake
metadata: {name: values}
spec: {data: [{key: a, value: cluster-wide}]}
---
apiVersion: providers.latchkey.dev/v1alpha1
kind: Vault
metadata: {name: two-logins, namespace: team-a}
spec:
  server: https://vault.example
  auth:
    tokenSecretRef: {name: t, key: token}
    kubernetes: {role: r}
---
apiVersion: providers.latchkey.dev/v1alpha1
kind: AWS
metadata: {name: node-identity, namespace: team-a}
spec: {region: eu-west-1, auth: {agentIdentity: {}}}
"#;

fn store(kind: &str, name: &str, reference: &str) -> String {
    let ns = if kind == "SecretStore" {
        "namespace: team-a, "
    } else {
        ""
    };
    format!(
        "apiVersion: latchkey.dev/v1alpha1\nkind: {kind}\nmetadata: {{{ns}name: {name}}}\n\
         spec: {{providerRef: {reference}}}\n---\n\
         apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
         metadata: {{name: {name}, namespace: team-a}}\n\
         spec: {{secretStoreRef: {{name: {name}, kind: {kind}}}, data: [{{secretKey: a, remoteRef: {{key: a}}}}]}}\n"
    )
}

fn catalog() -> ManifestCatalog {
    let mut c = ManifestCatalog::default();
    c.add_documents(Path::new("objects.yaml"), OBJECTS).unwrap();
    let ns = "{apiVersion: providers.latchkey.dev/v1alpha1";
    let cluster = "{apiVersion: cluster.providers.latchkey.dev/v1alpha1";
    for (i, doc) in [
        store(
            "SecretStore",
            "by-ref",
            &format!("{ns}, kind: Fake, name: values}}"),
        ),
        store(
            "SecretStore",
            "other-ns",
            &format!("{ns}, kind: Fake, name: elsewhere}}"),
        ),
        store(
            "SecretStore",
            "wrong-group",
            &format!("{cluster}, kind: Fake, name: values}}"),
        ),
        store(
            "SecretStore",
            "invalid",
            &format!("{ns}, kind: Vault, name: two-logins}}"),
        ),
        store(
            "SecretStore",
            "node",
            &format!("{ns}, kind: AWS, name: node-identity}}"),
        ),
        store(
            "ClusterSecretStore",
            "cluster",
            &format!("{cluster}, kind: Fake, name: values}}"),
        ),
    ]
    .iter()
    .enumerate()
    {
        c.add_documents(Path::new(&format!("s{i}.yaml")), doc)
            .unwrap();
    }
    c
}

fn value(binding: &Binding) -> &str {
    &binding.provider().fake.as_ref().unwrap().data[0].value
}

#[tokio::test]
async fn a_store_by_reference_binds_to_the_object_of_its_own_namespace_or_the_cluster() {
    let c = catalog();
    let b = bind(&c, "team-a", "by-ref").await.unwrap();
    assert_eq!(value(&b), "hunter2-by-ref");
    let object = b.provider_object.as_ref().unwrap();
    assert_eq!(object.shown(), "Fake \"team-a/values\"");
    assert!(!format!("{b:?}").contains("hunter2"), "{b:?}");
    let b = bind(&c, "team-a", "cluster").await.unwrap();
    assert_eq!(value(&b), "cluster-wide");
    assert!(b.provider_object.as_ref().unwrap().cluster);
}

#[tokio::test]
async fn a_missing_or_foreign_object_is_a_precise_failed_precondition() {
    let c = catalog();
    let e = bind(&c, "team-a", "other-ns").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "namespace \"team-a\", ExternalSecret \"other-ns\", SecretStore \"other-ns\": \
         spec.providerRef names Fake \"elsewhere\", which does not exist in the store's namespace"
    );
    assert!(matches!(e, BindingError::ProviderNotFound { .. }), "{e}");
}

#[tokio::test]
async fn the_referenced_spec_is_checked_as_the_inline_block_in_its_own_paths() {
    let c = catalog();
    for (es, want) in [
        (
            "wrong-group",
            "spec: providerRef.apiVersion must be providers.latchkey.dev/v1alpha1",
        ),
        (
            "invalid",
            "spec.providerRef: Vault \"team-a/two-logins\": spec.auth: must set exactly one of",
        ),
        (
            "node",
            "spec.providerRef: AWS \"team-a/node-identity\": spec: auth.agentIdentity (the node \
             agent's own AWS identity) is only allowed on a cluster-scoped AWS provider",
        ),
    ] {
        let e = bind(&c, "team-a", es).await.unwrap_err();
        assert!(matches!(e, BindingError::InvalidStore { .. }), "{es}: {e}");
        assert!(e.to_string().contains(want), "{es}: {e}");
    }
}
