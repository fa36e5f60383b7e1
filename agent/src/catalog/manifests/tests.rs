//! The manifest catalog: loading, strict schema errors, limits, and the example files.

use super::*;
use serde::Deserialize;

const DOCS: &str = r#"
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: demo, namespace: shop}
spec:
  provider:
    fake:
      data:
      - {key: db, value: '{"user":"app"}'}
---
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: creds}
spec:
  secretStoreRef: {name: demo}
  data:
  - secretKey: user
    remoteRef: {key: db, property: user}
---
apiVersion: v1
kind: Secret
metadata: {name: aws, namespace: shop}
stringData: {key: hunter2}
---
"#;

#[tokio::test]
async fn loads_every_kind_and_defaults_the_namespace() {
    let mut c = ManifestCatalog::default();
    c.add_documents(Path::new("x.yaml"), DOCS).unwrap();
    assert!(c.secret_store("shop", "demo").await.unwrap().is_some());
    assert!(
        c.external_secret("default", "creds")
            .await
            .unwrap()
            .is_some()
    );
    let s = c.secret("shop", "aws").await.unwrap().unwrap();
    assert_eq!(s.data.as_ref().unwrap()["key"].0, b"hunter2");
    let labels = c.namespace_labels("shop").await.unwrap();
    assert_eq!(labels[NAMESPACE_NAME_LABEL], "shop");
}

#[test]
fn rejects_duplicates_and_unknown_kinds_of_its_own_groups() {
    let mut c = ManifestCatalog::default();
    let twice = format!("{DOCS}\n---\n{DOCS}");
    let err = c.add_documents(Path::new("x.yaml"), &twice).unwrap_err();
    assert_eq!(
        err.to_string(),
        "SecretStore shop/demo is defined twice, in x.yaml document 1 and in x.yaml document 5; \
         neither is served"
    );

    let err = load_error(
        "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecrets\nmetadata: {name: p}\n",
    );
    assert!(
        err.contains("document 1 (ExternalSecrets p): unsupported kind ExternalSecrets"),
        "{err}"
    );
}

#[test]
fn schema_errors_do_not_quote_values() {
    let mut c = ManifestCatalog::default();
    let doc = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: s}\n\
                   spec: {provider: {fake: {data: [{key: k, value: [hunter2-secret]}]}}}\n";
    let err = c
        .add_documents(Path::new("z.yaml"), doc)
        .unwrap_err()
        .to_string();
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("SecretStore default/s"), "{err}");
}

/// The message of loading `doc` into an empty catalog, which must fail.
fn load_error(doc: &str) -> String {
    let mut c = ManifestCatalog::default();
    match c.add_documents(Path::new("m.yaml"), doc) {
        Ok(()) => panic!("loaded:\n{doc}"),
        Err(e) => e.to_string(),
    }
}

const ES_HEAD: &str = "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\n\
                           metadata: {name: creds, namespace: shop}\n";

#[test]
fn typo_in_remote_ref_names_the_path_and_suggests_property() {
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  data:\n  \
             - secretKey: password\n    remoteRef: {{key: shop/database, propery: password}}\n"
    );
    let err = load_error(&doc);
    assert!(err.contains("ExternalSecret shop/creds"), "{err}");
    assert!(
        err.contains("unknown field spec.data[0].remoteRef.propery"),
        "{err}"
    );
    assert!(err.contains("did you mean \"property\"?"), "{err}");
}

#[test]
fn unknown_top_level_spec_field_is_refused() {
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  refreshIntervall: 1h\n\
             \x20 data: [{{secretKey: a, remoteRef: {{key: a}}}}]\n"
    );
    let err = load_error(&doc);
    assert!(err.contains("unknown field spec.refreshIntervall"), "{err}");
    assert!(err.contains("did you mean \"refreshInterval\"?"), "{err}");

    // Nothing close: the known fields are listed instead.
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  priority: high\n\
             \x20 data: [{{secretKey: a, remoteRef: {{key: a}}}}]\n"
    );
    let err = load_error(&doc);
    assert!(err.contains("unknown field spec.priority"), "{err}");
    assert!(!err.contains("did you mean"), "{err}");
    assert!(err.contains("expected one of: data, dataFrom,"), "{err}");
}

#[test]
fn unknown_field_in_a_store_provider_is_refused() {
    let doc = "apiVersion: latchkey.dev/v1alpha1\nkind: ClusterSecretStore\nmetadata: {name: v}\n\
                   spec:\n  provider:\n    vault:\n      server: https://vault.example:8200\n\
                   \x20     auth: {kubernetes: {role: app, serviceAccountRef: {name: x}}}\n";
    let err = load_error(doc);
    assert!(err.contains("ClusterSecretStore"), "{err}");
    assert!(
        err.contains("unknown field spec.provider.vault.auth.kubernetes.serviceAccountRef"),
        "{err}"
    );

    let doc = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: a}\n\
                   spec: {provider: {aws: {regoin: eu-west-1, region: eu-west-1}}}\n";
    let err = load_error(doc);
    assert!(
        err.contains("unknown field spec.provider.aws.regoin"),
        "{err}"
    );
    assert!(err.contains("did you mean \"region\"?"), "{err}");
}

#[test]
fn nested_list_indices_are_in_the_path() {
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  dataFrom:\n\
             \x20 - extract: {{key: a}}\n\
             \x20 - find: {{name: {{regexp: x}}}}\n\
             \x20   rewrite:\n\
             \x20   - regexp: {{source: a, target: b}}\n\
             \x20   - regexp: {{source: a, target: b, targte: c}}\n"
    );
    let err = load_error(&doc);
    assert!(
        err.contains("unknown field spec.dataFrom[1].rewrite[1].regexp.targte"),
        "{err}"
    );
    assert!(err.contains("did you mean \"target\"?"), "{err}");

    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  target:\n    files:\n      defaultMode: 0440\n\
             \x20     items:\n      - {{key: a, path: a, mode: 0400}}\n      - {{key: b, path: b, mdoe: 0400}}\n"
    );
    let err = load_error(&doc);
    assert!(
        err.contains("unknown field spec.target.files.items[1].mdoe"),
        "{err}"
    );
    assert!(err.contains("did you mean \"mode\"?"), "{err}");
    assert!(
        !err.contains("items[0]") && !err.contains("defaultMode"),
        "{err}"
    );
}

#[test]
fn several_unknown_fields_are_all_named() {
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo, knd: SecretStore}}\n\
             \x20 data: [{{secretKey: a, remoteRef: {{key: a, verison: '2'}}}}]\n"
    );
    let err = load_error(&doc);
    assert!(
        err.contains("spec.secretStoreRef.knd: did you mean \"kind\"?"),
        "{err}"
    );
    assert!(
        err.contains("spec.data[0].remoteRef.verison: did you mean \"version\"?"),
        "{err}"
    );
}

#[test]
fn eso_template_options_get_the_cel_hint() {
    let doc = format!(
        "{ES_HEAD}spec:\n  secretStoreRef: {{name: demo}}\n  target:\n    template:\n\
             \x20     engineVersion: v2\n      data: {{url: '{{{{ .password }}}}'}}\n"
    );
    let err = load_error(&doc);
    assert!(err.contains("spec.target.template.engineVersion"), "{err}");
    assert!(err.contains("CEL"), "{err}");
}

#[tokio::test]
async fn metadata_and_status_fields_are_accepted() {
    let doc = "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata:\n\
             \x20 name: creds\n  namespace: shop\n  labels: {app: shop}\n  annotations: {note: x}\n  uid: 0b1c-42\n\
             \x20 resourceVersion: '42'\n  generation: 3\n  creationTimestamp: '2024-01-01T00:00:00Z'\n\
             \x20 managedFields: [{manager: kubectl, operation: Apply, apiVersion: v1}]\n\
             spec:\n  secretStoreRef: {name: demo}\n  data: [{secretKey: a, remoteRef: {key: a}}]\n\
             status:\n  refreshTime: '2024-01-01T00:00:00Z'\n  binding: {name: x}\n\
             \x20 conditions: [{type: Ready, status: 'True', observedGeneration: 3}]\n\
             ---\n\
             apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
             metadata: {name: demo, namespace: shop, labels: {a: b}}\n\
             spec: {provider: {fake: {data: []}}}\n\
             status: {conditions: [{type: Ready, status: 'True'}], capabilities: ReadOnly}\n\
             ---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {team: a}}\n\
             spec: {finalizers: [kubernetes]}\nstatus: {phase: Active}\n";
    let mut c = ManifestCatalog::default();
    c.add_documents(Path::new("m.yaml"), doc).unwrap();
    let es = c.external_secret("shop", "creds").await.unwrap().unwrap();
    assert_eq!(es.metadata.labels.as_ref().unwrap()["app"], "shop");
    assert!(c.secret_store("shop", "demo").await.unwrap().is_some());
    assert_eq!(c.namespace_labels("shop").await.unwrap()["team"], "a");
}

#[test]
fn metadata_typos_are_refused() {
    let err =
        load_error("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, lables: {a: b}}\n");
    assert!(err.contains("unknown field metadata.lables"), "{err}");
    assert!(err.contains("did you mean \"labels\"?"), "{err}");
}

#[test]
fn secret_with_an_unknown_top_level_field_is_refused() {
    let err = load_error(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: aws, namespace: shop}\n\
             stringdata: {key: hunter2}\n",
    );
    assert!(err.contains("Secret shop/aws"), "{err}");
    assert!(err.contains("unknown field stringdata"), "{err}");
    assert!(err.contains("did you mean \"stringData\"?"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // A value indented one level too little becomes a top-level field: named, never shown.
    let err = load_error(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: aws}\nstringData:\npassword: hunter2\n",
    );
    assert!(err.contains("unknown field password"), "{err}");
    assert!(err.contains("expected one of: apiVersion, data,"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn yaml_bombs_are_refused_before_parsing() {
    let mb = "x".repeat(1 << 20);
    let aliases = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\nstringData: {{a: &a \
             \"{mb}\"}}\nx: [{}]\n",
        vec!["*a"; 100].join(", ")
    );
    let nested = format!("a: {}{}\n", "[".repeat(50_000), "]".repeat(50_000));
    let start = std::time::Instant::now();
    for (name, text) in [("aliases", aliases), ("nested", nested)] {
        let err = ManifestCatalog::default()
            .add_documents(Path::new("m.yaml"), &text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("m.yaml: document 1: refused before parsing"),
            "{name}: {err}"
        );
    }
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
}

#[test]
fn an_oversized_file_is_not_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let big = format!("a: \"{}\"\n", "x".repeat(9 << 20));
    std::fs::write(dir.path().join("big.yaml"), big).unwrap();
    let c = ManifestCatalog::load_dir(dir.path()).unwrap();
    let err = c.problems()[0].to_string();
    assert!(
        err.contains("longer than the limit of 8388608 bytes"),
        "{err}"
    );
}

#[test]
fn syntax_errors_give_line_and_column() {
    let doc = format!(
        "{DOCS}apiVersion: v1\nkind: Secret\nmetadata: {{name: x}}\nstringData:\n  key: [hunter2\n"
    );
    let err = load_error(&doc);
    assert!(err.contains("document 4"), "{err}");
    assert!(err.contains("YAML syntax error at line"), "{err}");
    assert!(err.contains(", column "), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // Lines count from the start of the file, not of the document.
    let err = load_error(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\n\
             kind: Secret\nmetadata: {name: s}\nstringData:\n  key: hunter2\n key2: x\n",
    );
    assert!(
        err.ends_with(
            "document 2: YAML syntax error at line 10, column 2; the rest of the file is not read"
        ),
        "{err}"
    );
}

#[test]
fn no_message_quotes_a_secret_value() {
    let cases = [
        // Syntax errors around a value.
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {key: \"hunter2-secret}\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData:\n  key: hunter2-secret\n key2: x\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {key: hunter2-secret}}\n",
        // Unknown fields next to, and holding, a value.
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {key: hunter2-secret}\ntyp: x\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nsringData: {key: hunter2-secret}\n",
        "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\nmetadata: {name: s}\n\
             spec: {provider: {fake: {data: [{key: k, vaule: hunter2-secret, value: x}]}}}\n",
        // A schema mismatch on a value.
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {key: hunter2-secret!}\n",
    ];
    for doc in cases {
        let err = load_error(doc);
        assert!(!err.contains("hunter2"), "{err}");
    }
}

/// Every `*.yaml` file under examples/, recursively.
fn example_files() -> Vec<PathBuf> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_example_document_loads_strictly() {
    let mut loaded = 0;
    for path in example_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = serde_norway::Value::deserialize(doc).unwrap();
            let api = value.get("apiVersion").and_then(|v| v.as_str());
            let kind = value.get("kind").and_then(|v| v.as_str());
            let ours = matches!(
                (api, kind),
                (
                    Some("latchkey.dev/v1alpha1" | crate::api::GENERATOR_API_VERSION),
                    _
                ) | (Some("v1"), Some("Secret" | "Namespace"))
            );
            if !ours {
                continue;
            }
            // One catalog per document: examples reuse names across files.
            let mut c = ManifestCatalog::default();
            let one = serde_norway::to_string(&value).unwrap();
            if let Err(e) = c.add_documents(&path, &one) {
                panic!("{e}");
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 8, "only {loaded} example documents loaded");
}

// ---- generators ----

const GENERATORS: &str = r#"
apiVersion: generators.latchkey.dev/v1alpha1
kind: Password
metadata: {name: db-password, namespace: shop}
spec: {length: 32, digits: 5, symbols: 5, symbolCharacters: "-_", noUpper: true}
---
apiVersion: generators.latchkey.dev/v1alpha1
kind: VaultDynamicSecret
metadata: {name: pki}
spec:
  path: pki/issue/example-dot-com
  method: POST
  parameters:
    common_name: localhost
    alt_names: [a.example, b.example]
    extra: {nested: {ttl: 1h, any_field: 1}}
  resultType: Data
  provider:
    server: https://vault.example:8200
    auth: {kubernetes: {role: app}}
---
apiVersion: generators.latchkey.dev/v1alpha1
kind: PluginGenerator
metadata: {name: accounts, namespace: shop}
spec:
  provider: {endpoint: "unix:///var/run/latchkey/plugins/accounts.sock", timeout: 5s}
---
apiVersion: generators.latchkey.dev/v1alpha1
kind: ClusterGenerator
metadata: {name: shared-pki, namespace: ignored}
spec:
  kind: Password
  generator: {passwordSpec: {length: 12}}
  conditions: [{namespaces: [shop]}]
"#;

#[tokio::test]
async fn generators_of_every_kind_are_served() {
    let mut c = ManifestCatalog::default();
    c.add_documents(Path::new("g.yaml"), GENERATORS).unwrap();
    let Some(GeneratorObject::Password(p)) = c
        .generator("shop", "Password", "db-password")
        .await
        .unwrap()
    else {
        panic!("no Password");
    };
    assert_eq!((p.spec.length, p.spec.digits), (32, Some(5)));
    assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
    // No namespace in the document: the default one, as for the other namespaced kinds.
    let Some(GeneratorObject::VaultDynamicSecret(v)) = c
        .generator("default", "VaultDynamicSecret", "pki")
        .await
        .unwrap()
    else {
        panic!("no VaultDynamicSecret");
    };
    let parameters = v.spec.parameters.as_ref().unwrap();
    assert_eq!(parameters["extra"]["nested"]["ttl"], "1h");
    assert_eq!(v.metadata.namespace.as_deref(), Some("default"));
    assert!(matches!(
        c.generator("shop", "PluginGenerator", "accounts")
            .await
            .unwrap(),
        Some(GeneratorObject::Plugin(_))
    ));
    // A ClusterGenerator is found from any namespace; the document's namespace means nothing.
    for ns in ["shop", "default", "ignored"] {
        let Some(GeneratorObject::Cluster(g)) = c
            .generator(ns, "ClusterGenerator", "shared-pki")
            .await
            .unwrap()
        else {
            panic!("no ClusterGenerator from {ns}");
        };
        assert_eq!(g.spec.conditions[0].namespaces, ["shop"]);
    }
    // Each is found only under its own kind and namespace.
    for (ns, kind, name) in [
        ("default", "Password", "db-password"),
        ("shop", "VaultDynamicSecret", "pki"),
        ("shop", "Password", "accounts"),
        ("shop", "ClusterGenerator", "db-password"),
        ("shop", "Secret", "db-password"),
        ("", "Password", "db-password"),
    ] {
        assert!(
            c.generator(ns, kind, name).await.unwrap().is_none(),
            "{ns} {kind} {name}"
        );
    }
    // Every loaded generator passes the agent's validation.
    for (ns, kind, name) in [
        ("shop", "Password", "db-password"),
        ("default", "VaultDynamicSecret", "pki"),
        ("shop", "PluginGenerator", "accounts"),
        ("", "ClusterGenerator", "shared-pki"),
    ] {
        let g = c.generator(ns, kind, name).await.unwrap().unwrap();
        crate::api::validate::generator(&g).unwrap();
    }
}

#[test]
fn a_generator_defined_twice_is_refused() {
    let doc = "apiVersion: generators.latchkey.dev/v1alpha1\nkind: Password\n\
               metadata: {name: pw, namespace: shop}\nspec: {}\n";
    let err = load_error(&format!("{doc}---\n{doc}"));
    assert!(err.contains("Password shop/pw is defined twice"), "{err}");
    let doc = "apiVersion: generators.latchkey.dev/v1alpha1\nkind: ClusterGenerator\n\
               metadata: {name: pw}\nspec: {kind: Password, generator: {passwordSpec: {}}}\n";
    let err = load_error(&format!("{doc}---\n{doc}"));
    assert!(
        err.contains("ClusterGenerator pw is defined twice"),
        "{err}"
    );
    // The same name in another kind or namespace is another object.
    let mut c = ManifestCatalog::default();
    let docs = "apiVersion: generators.latchkey.dev/v1alpha1\nkind: Password\n\
                metadata: {name: pw, namespace: a}\nspec: {}\n---\n\
                apiVersion: generators.latchkey.dev/v1alpha1\nkind: Password\n\
                metadata: {name: pw, namespace: b}\nspec: {}\n---\n\
                apiVersion: generators.latchkey.dev/v1alpha1\nkind: ClusterGenerator\n\
                metadata: {name: pw}\nspec: {kind: Password, generator: {passwordSpec: {}}}\n";
    c.add_documents(Path::new("g.yaml"), docs).unwrap();
}

#[test]
fn unknown_fields_in_generators_are_refused_with_their_path() {
    const HEAD: &str = "apiVersion: generators.latchkey.dev/v1alpha1\n";
    for (doc, want, hint) in [
        (
            "kind: Password\nmetadata: {name: pw}\nspec: {lenght: 12}\n",
            "Password default/pw): unknown field spec.lenght",
            "did you mean \"length\"?",
        ),
        (
            // ESO's field name: Latchkey's is allowRepeat.
            "kind: Password\nmetadata: {name: pw}\nspec: {allowRepeats: true}\n",
            "unknown field spec.allowRepeats",
            "did you mean \"allowRepeat\"?",
        ),
        (
            "kind: VaultDynamicSecret\nmetadata: {name: v}\nspec:\n  path: p\n  \
             provider: {server: 'https://v:8200', auth: {kubernetes: {role: r, serviceAccountRef: {name: x}}}}\n",
            "unknown field spec.provider.auth.kubernetes.serviceAccountRef",
            "",
        ),
        (
            "kind: VaultDynamicSecret\nmetadata: {name: v}\nspec:\n  path: p\n  retryPolicy: {}\n  \
             provider: {server: 'https://v:8200', auth: {jwt: {role: r}}}\n",
            "unknown field spec.retryPolicy",
            "expected one of: allowEmptyResponse, method, parameters, path, provider, resultType",
        ),
        (
            "kind: PluginGenerator\nmetadata: {name: p}\nspec: {provider: {endpoint: 'p:4000', endpont: 'p:4001'}}\n",
            "unknown field spec.provider.endpont",
            "did you mean \"endpoint\"?",
        ),
        (
            "kind: ClusterGenerator\nmetadata: {name: c}\n\
             spec: {kind: Password, generator: {passwordSpec: {digts: 3}}}\n",
            "ClusterGenerator c): unknown field spec.generator.passwordSpec.digts",
            "did you mean \"digits\"?",
        ),
    ] {
        let err = load_error(&format!("{HEAD}{doc}"));
        assert!(err.contains(want), "{err}");
        assert!(err.contains(hint), "{err}");
    }
}

#[test]
fn generator_errors_do_not_quote_values() {
    const HEAD: &str = "apiVersion: generators.latchkey.dev/v1alpha1\n";
    for doc in [
        // A schema mismatch on a value (parameters must be an object).
        "kind: VaultDynamicSecret\nmetadata: {name: v}\nspec:\n  path: p\n  \
         parameters: [hunter2-secret]\n  provider: {server: 'https://v:8200', auth: {jwt: {role: r}}}\n",
        // An unknown field holding a value.
        "kind: PluginGenerator\nmetadata: {name: p}\n\
         spec: {provider: {endpoint: 'p:4000', token: hunter2-secret}}\n",
        // A wrong type where a number goes.
        "kind: Password\nmetadata: {name: pw}\nspec: {length: hunter2-secret}\n",
        // A kind ClusterGenerator cannot wrap.
        "kind: ClusterGenerator\nmetadata: {name: c}\n\
         spec: {kind: hunter2-secret, generator: {}}\n",
    ] {
        let err = load_error(&format!("{HEAD}{doc}"));
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("document 1 ("), "{err}");
    }
}

#[test]
fn generator_state_documents_are_not_read() {
    // States are the agent's own records, kept in memory in standalone mode: a manifest
    // directory does not hold them.
    let err = load_error(
        "apiVersion: generators.latchkey.dev/v1alpha1\nkind: GeneratorState\n\
         metadata: {name: s}\nspec: {resource: {}}\n",
    );
    assert!(err.contains("unsupported kind GeneratorState"), "{err}");
}

#[tokio::test]
async fn an_invalid_generator_is_refused_when_bound_not_when_loaded() {
    // Loading only reads (as for stores); binding, on every publish and mirror, validates.
    let mut c = ManifestCatalog::default();
    c.add_documents(
        Path::new("g.yaml"),
        "apiVersion: generators.latchkey.dev/v1alpha1\nkind: Password\n\
         metadata: {name: pw, namespace: shop}\nspec: {length: 8, digits: 5, symbols: 5}\n---\n\
         apiVersion: generators.latchkey.dev/v1alpha1\nkind: ClusterGenerator\n\
         metadata: {name: pki}\nspec: {kind: Password, generator: {passwordSpec: {symbolCharacters: ''}},\n\
         \x20 conditions: [{namespaces: [shop]}]}\n",
    )
    .unwrap();
    let reference = |kind: &str, name: &str| crate::api::external_secret::GeneratorRef {
        api_version: crate::api::GENERATOR_API_VERSION.into(),
        kind: kind.into(),
        name: name.into(),
    };
    let err = crate::catalog::bind_generator(&c, "shop", "creds", &reference("Password", "pw"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "namespace \"shop\", ExternalSecret \"creds\", generator Password \"pw\": invalid: \
         spec: digits + symbols must not exceed length"
    );
    let err =
        crate::catalog::bind_generator(&c, "shop", "creds", &reference("ClusterGenerator", "pki"))
            .await
            .unwrap_err()
            .to_string();
    assert!(
        err.ends_with("invalid: spec.generator.passwordSpec.symbolCharacters: must not be empty"),
        "{err}"
    );
}
