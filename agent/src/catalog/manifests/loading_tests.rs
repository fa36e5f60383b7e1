//! Standalone loading as in cluster mode: other kinds skipped, a bad object reported while the
//! others are served (and named precisely to a pod that asks for it), duplicates naming both
//! places, type errors naming the field.

use super::*;
use crate::catalog::{BindingError, bind};

const STORE: &str = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
                     metadata: {name: demo, namespace: shop}\n\
                     spec: {provider: {fake: {data: [{key: db, value: hunter2-value}]}}}\n";

fn es(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
         metadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  secretStoreRef: {{name: demo}}\n{extra}  data: [{{secretKey: a, remoteRef: {{key: db}}}}]\n"
    )
}

/// A catalog of `files` (name, text), loaded as `load_dir` does.
fn load(files: &[(&str, &str)]) -> ManifestCatalog {
    let mut c = ManifestCatalog::default();
    for (name, text) in files {
        c.load_text(Path::new(name), text);
    }
    c
}

fn problems(c: &ManifestCatalog) -> Vec<String> {
    c.problems().iter().map(|p| p.to_string()).collect()
}

#[tokio::test]
async fn documents_of_other_kinds_are_skipped_one_line_each() {
    let app = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: app, namespace: shop}\n---\n\
               apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: app}\nspec: {replicas: 1}\n---\n\
               apiVersion: v1\nkind: Service\nmetadata: {name: cfg}\nspec: {ports: []}\n---\n\
               apiVersion: external-secrets.io/v1beta1\nkind: ExternalSecret\nmetadata: {name: old}\n";
    let c = load(&[("app.yaml", app), ("store.yaml", STORE)]);
    assert_eq!(problems(&c), Vec::<String>::new());
    let skipped: Vec<_> = c
        .skipped()
        .iter()
        .map(|s| (s.origin.index, s.kind.as_str(), s.name.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            (1, "ServiceAccount", "app"),
            (2, "Deployment", "app"),
            (3, "Service", "cfg"),
            (4, "ExternalSecret", "old"),
        ]
    );
    assert_eq!(c.skipped()[0].origin.path, Path::new("app.yaml"));
    assert_eq!(c.skipped()[1].hint, "");
    assert!(c.skipped()[3].hint.contains("latchkey convert"));
    assert!(c.secret_store("shop", "demo").await.unwrap().is_some());
}

#[tokio::test]
async fn a_bad_object_is_reported_and_the_others_are_served() {
    let docs = format!(
        "{}---\n{}---\n{STORE}",
        es("good", ""),
        es("bad", "  refreshInterval: 90\n")
    );
    let c = load(&[("apps.yaml", &docs)]);
    let problems = problems(&c);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("apps.yaml document 2 (ExternalSecret shop/bad): "),
        "{problems:?}"
    );
    assert!(bind(&c, "shop", "good").await.is_ok());
    // A pod naming the bad one gets why, not "not found".
    let err = bind(&c, "shop", "bad").await.unwrap_err();
    assert!(
        matches!(
            err,
            BindingError::Catalog {
                source: CatalogError::NotLoaded { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = err.to_string();
    assert!(
        err.contains("ExternalSecret \"shop/bad\" was not loaded from apps.yaml document 2: "),
        "{err}"
    );
    assert!(
        err.contains("spec.refreshInterval: invalid type: integer `90`, expected a string"),
        "{err}"
    );
}

#[tokio::test]
async fn a_bad_store_is_named_to_the_pods_that_use_it_without_its_values() {
    let bad = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
               metadata: {name: demo, namespace: shop}\n\
               spec: {provider: {fake: {data: [{key: db, value: [hunter2-value]}]}}}\n";
    let c = load(&[("a.yaml", &es("app", "")), ("b.yaml", bad)]);
    let err = bind(&c, "shop", "app").await.unwrap_err().to_string();
    assert_eq!(
        err,
        "namespace \"shop\", ExternalSecret \"app\": SecretStore \"shop/demo\" was not loaded \
         from b.yaml document 1: spec.provider.fake.data[0].value: invalid type, expected a \
         string; fix the manifest and restart the agent"
    );
    assert!(!problems(&c)[0].contains("hunter2"), "{:?}", problems(&c));
}

#[test]
fn type_errors_name_the_object_and_the_field_never_the_value() {
    let c = load(&[
        ("es.yaml", &es("creds", "  refreshInterval: 90\n")),
        (
            "secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: aws, namespace: shop}\n\
             data: {key: hunter2-not-base64!}\n",
        ),
        (
            "gen.yaml",
            "apiVersion: generators.latchkey.dev/v1alpha1\nkind: VaultDynamicSecret\n\
             metadata: {name: v}\nspec:\n  path: p\n  resultType: hunter2-variant\n  \
             provider: {server: 'https://v:8200', auth: {jwt: {role: r}}}\n",
        ),
        (
            "meta.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: [hunter2-name]}\n",
        ),
    ]);
    let problems = problems(&c);
    assert_eq!(
        problems[0],
        "es.yaml document 1 (ExternalSecret shop/creds): spec.refreshInterval: invalid type: \
         integer `90`, expected a string"
    );
    assert_eq!(
        problems[1],
        "secret.yaml document 1 (Secret shop/aws): data.key: does not match the schema"
    );
    assert!(
        problems[2].starts_with(
            "gen.yaml document 1 (VaultDynamicSecret default/v): spec.resultType: unknown \
             variant, expected one of"
        ),
        "{}",
        problems[2]
    );
    assert_eq!(
        problems[3],
        "meta.yaml document 1: metadata.name: invalid type, expected a string"
    );
    for p in &problems {
        assert!(!p.contains("hunter2"), "{p}");
    }
}

#[tokio::test]
async fn duplicates_name_both_places_and_neither_is_served() {
    let c = load(&[
        ("a.yaml", STORE),
        ("b.yaml", &format!("{STORE}---\n{STORE}")),
    ]);
    assert_eq!(
        problems(&c),
        [
            "SecretStore shop/demo is defined twice, in a.yaml document 1 and in b.yaml \
             document 1; neither is served",
            "SecretStore shop/demo is defined twice, in a.yaml document 1 and in b.yaml \
             document 2; neither is served",
        ]
    );
    let err = c
        .secret_store("shop", "demo")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "was not loaded from a.yaml document 1: defined twice, also in b.yaml document 1"
        ),
        "{err}"
    );
    // The same name in another namespace or kind is another object; a bad copy is a duplicate too.
    let other_ns = STORE.replace("namespace: shop", "namespace: ops");
    let cluster = "apiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\n\
                   metadata: {name: demo}\nspec: {provider: {fake: {data: []}}}\n";
    let c = load(&[
        ("a.yaml", STORE),
        ("b.yaml", &other_ns),
        ("c.yaml", cluster),
    ]);
    assert!(c.problems().is_empty(), "{:?}", problems(&c));
    let bad = STORE.replace("fake:", "faek:");
    let c = load(&[("a.yaml", STORE), ("b.yaml", &bad)]);
    assert_eq!(problems(&c).len(), 2, "{:?}", problems(&c));
    assert!(c.secret_store("shop", "demo").await.is_err());
}

#[tokio::test]
async fn a_wrong_api_version_of_a_known_kind_is_named_to_pods() {
    let old = es("creds", "").replace("latchkey.dev/v1alpha1", "latchkey.dev/v1beta1");
    let c = load(&[("old.yaml", &old)]);
    let err = bind(&c, "shop", "creds").await.unwrap_err().to_string();
    assert!(
        err.contains(
            "apiVersion latchkey.dev/v1beta1 is not one this agent reads; ExternalSecret is \
             latchkey.dev/v1alpha1"
        ),
        "{err}"
    );
}

#[test]
fn lists_and_headerless_documents_are_reported_not_skipped() {
    let c = load(&[
        (
            "list.yaml",
            "apiVersion: v1\nkind: List\nitems: []\n---\nmetadata: {name: x}\n",
        ),
        (
            "noname.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {}\n",
        ),
    ]);
    assert_eq!(
        problems(&c),
        [
            "list.yaml document 1 (List): a List: write its items as separate documents (`---`)",
            "list.yaml document 2 (x): apiVersion and kind are required",
            "noname.yaml document 1 (Secret): metadata.name is missing",
        ]
    );
    assert!(c.skipped().is_empty());
}

#[tokio::test]
async fn a_refused_or_unreadable_file_is_reported_and_the_others_served() {
    let dir = tempfile::tempdir().unwrap();
    let nested = format!("a: {}{}\n", "[".repeat(50_000), "]".repeat(50_000));
    std::fs::write(dir.path().join("a-deep.yaml"), nested).unwrap();
    std::fs::write(dir.path().join("b-store.yaml"), STORE).unwrap();
    std::fs::write(dir.path().join("c-broken.yml"), "a: [\n").unwrap();
    let c = ManifestCatalog::load_dir(dir.path()).unwrap();
    let problems = problems(&c);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("a-deep.yaml: "), "{problems:?}");
    assert!(
        problems[1].contains("c-broken.yml document 1: YAML syntax error"),
        "{problems:?}"
    );
    assert!(c.secret_store("shop", "demo").await.unwrap().is_some());
    // A directory that cannot be listed still fails the start.
    let err = ManifestCatalog::load_dir(&dir.path().join("missing"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("reading "), "{err}");
}

#[tokio::test]
async fn a_store_ref_of_the_wrong_kind_says_which_kind_exists() {
    let cluster = "apiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\n\
                   metadata: {name: shared}\nspec: {provider: {fake: {data: []}}}\n";
    let wrong = es("app", "").replace("{name: demo}", "{name: shared}");
    let c = load(&[("c.yaml", cluster), ("e.yaml", &wrong), ("s.yaml", STORE)]);
    let err = bind(&c, "shop", "app").await.unwrap_err().to_string();
    assert_eq!(
        err,
        "namespace \"shop\", ExternalSecret \"app\": SecretStore \"shared\" not found in this \
         namespace; a ClusterSecretStore named \"shared\" exists: set secretStoreRef.kind: \
         ClusterSecretStore"
    );
    // The converse, and the plain messages when neither exists.
    let wrong = es("app", "").replace("{name: demo}", "{name: demo, kind: ClusterSecretStore}");
    let c = load(&[("e.yaml", &wrong), ("s.yaml", STORE)]);
    let err = bind(&c, "shop", "app").await.unwrap_err().to_string();
    assert!(
        err.ends_with(
            "ClusterSecretStore \"demo\" not found; a SecretStore named \"demo\" exists in this \
             namespace: set secretStoreRef.kind: SecretStore (or leave kind out)"
        ),
        "{err}"
    );
    let c = load(&[("e.yaml", &es("app", ""))]);
    let err = bind(&c, "shop", "app").await.unwrap_err().to_string();
    assert!(
        err.ends_with(
            "SecretStore \"demo\" not found (a SecretStore must be in the ExternalSecret's \
             namespace)"
        ),
        "{err}"
    );
}

#[test]
fn control_characters_in_names_and_keys_are_escaped_in_messages() {
    let c = load(&[
        (
            "a.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: \"x\\nERROR forged\"}\n",
        ),
        (
            "b.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: \"s\\nERROR forged\"}\n\
             data: {\"k\\nERROR forged\": \"!!\"}\n",
        ),
    ]);
    assert_eq!(c.skipped()[0].name, "x\\nERROR forged");
    let problems = problems(&c);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(!problems[0].contains('\n'), "{}", problems[0]);
    assert!(
        problems[0].contains("data.k\\nERROR forged: "),
        "{}",
        problems[0]
    );
}
