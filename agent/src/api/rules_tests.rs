//! The CRD rules and the agent agree.
//!
//! Every `x-kubernetes-validations` rule of the rendered CRDs is compiled and evaluated, at its
//! place in the schema, with a CEL interpreter (as the API server would: `self` is the node's
//! value, absent and null values are not validated), together with the structural keywords the
//! agent mirrors (`maxItems`, `maxLength`, list-map keys). For each sample object the verdict must
//! equal the one of `validate::*`, and a rejection must carry the same path and message. A rule
//! that does not compile, does not return a bool, or is never broken by a sample fails the test.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::crd::render_all;
use super::external_secret::{ExternalSecret, StoreKind};
use super::rules;
use super::store::{ClusterSecretStore, SecretStore};
use super::validate::{self, Invalid};

/// One failed check: the instance path (`spec.data[0].secretKey`) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    path: String,
    message: String,
}

impl Failure {
    fn text(&self) -> String {
        format!("{}: {}", self.path, self.message)
    }
}

/// The `openAPIV3Schema` of each kind, read back from the rendered YAML (so quoting counts too).
fn schemas() -> HashMap<String, Value> {
    let text = render_all().unwrap();
    let mut out = HashMap::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let crd = Value::deserialize(doc).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1, "{kind}: one served version");
        out.insert(kind, versions[0]["schema"]["openAPIV3Schema"].clone());
    }
    out
}

/// JSON as the API server hands it to CEL: integers are `int`, objects are maps.
fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => cel::Value::from(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), to_cel(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// Evaluates `schema` against `value`; records failures and which rules were broken (by schema
/// path and rule text) in `broken`.
fn evaluate(
    schema: &Value,
    value: &Value,
    path: &str,
    schema_path: &str,
    broken: &mut BTreeSet<(String, String)>,
    out: &mut Vec<Failure>,
) {
    if value.is_null() {
        return;
    }
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = rule["rule"].as_str().unwrap();
        let message = rule["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{schema_path}: rule {text:?} has no message"));
        let program = cel::Program::compile(text)
            .unwrap_or_else(|e| panic!("{schema_path}: rule {text:?} does not compile: {e}"));
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("self", to_cel(value));
        // Kubernetes' `duration()`, as far as comparisons go: the seconds of a Go duration.
        ctx.add_function("duration", |text: Arc<String>| -> i64 {
            humantime::parse_duration(&text)
                .unwrap_or_else(|e| panic!("duration({text:?}): {e}"))
                .as_secs() as i64
        })
        .unwrap();
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => {
                broken.insert((schema_path.to_string(), text.to_string()));
                out.push(Failure {
                    path: path.to_string(),
                    message: message.to_string(),
                });
            }
            other => panic!("{path}: rule {text:?} gave {other:?}, not a bool"),
        }
    }
    if let (Some(max), Some(s)) = (schema["maxLength"].as_u64(), value.as_str())
        && s.chars().count() as u64 > max
    {
        out.push(Failure {
            path: path.to_string(),
            message: rules::too_long(max as usize),
        });
    }
    if let (Some(max), Some(fields)) = (schema["maxProperties"].as_u64(), value.as_object())
        && fields.len() as u64 > max
    {
        out.push(Failure {
            path: path.to_string(),
            message: rules::too_many_properties(max as usize),
        });
    }
    if let Some(items) = value.as_array() {
        if let Some(max) = schema["maxItems"].as_u64()
            && items.len() as u64 > max
        {
            out.push(Failure {
                path: path.to_string(),
                message: rules::too_many_items(max as usize),
            });
        }
        if schema["x-kubernetes-list-type"] == "map" {
            let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap())
                .collect();
            let mut seen = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                let id: Vec<&Value> = keys.iter().map(|k| &item[k]).collect();
                if let Some(first) = seen.insert(id, i) {
                    out.push(Failure {
                        path: format!("{path}[{i}]"),
                        message: rules::duplicate_key(&keys.join(", "), first),
                    });
                }
            }
        }
        for (i, item) in items.iter().enumerate() {
            evaluate(
                &schema["items"],
                item,
                &format!("{path}[{i}]"),
                &format!("{schema_path}[]"),
                broken,
                out,
            );
        }
    }
    for keyword in [
        "minimum",
        "maximum",
        "minLength",
        "minItems",
        "enum",
        "pattern",
    ] {
        // The agent mirrors none of these: a sample that breaks one shows up as a disagreement.
        let broken_keyword = match (keyword, &schema[keyword]) {
            (_, Value::Null) => false,
            ("minimum", Value::Number(m)) => {
                value.as_f64().is_some_and(|v| v < m.as_f64().unwrap())
            }
            ("maximum", Value::Number(m)) => {
                value.as_f64().is_some_and(|v| v > m.as_f64().unwrap())
            }
            ("minLength", Value::Number(m)) => value
                .as_str()
                .is_some_and(|s| (s.chars().count() as u64) < m.as_u64().unwrap()),
            ("minItems", Value::Number(m)) => value
                .as_array()
                .is_some_and(|a| (a.len() as u64) < m.as_u64().unwrap()),
            ("enum", Value::Array(allowed)) => !allowed.contains(value),
            (k, v) => panic!("{schema_path}: {k}: {v} is not handled by this test"),
        };
        if broken_keyword {
            out.push(Failure {
                path: path.to_string(),
                message: format!("breaks {keyword}"),
            });
        }
    }
    if let Some(fields) = value.as_object() {
        for (name, v) in fields {
            if let Some(sub) = schema["properties"].get(name) {
                evaluate(
                    sub,
                    v,
                    &join(path, name),
                    &join(schema_path, name),
                    broken,
                    out,
                );
            } else if schema["additionalProperties"].is_object() {
                evaluate(
                    &schema["additionalProperties"],
                    v,
                    &join(path, name),
                    &join(schema_path, "*"),
                    broken,
                    out,
                );
            }
        }
    }
}

/// Every rule of a schema, as (schema path, rule text).
fn all_rules(schema: &Value, schema_path: &str, out: &mut BTreeSet<(String, String)>) {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = rule["rule"].as_str().unwrap().to_string();
        out.insert((schema_path.to_string(), text));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            all_rules(sub, &join(schema_path, name), out);
        }
    }
    if schema["additionalProperties"].is_object() {
        all_rules(
            &schema["additionalProperties"],
            &join(schema_path, "*"),
            out,
        );
    }
    if schema["items"].is_object() {
        all_rules(&schema["items"], &format!("{schema_path}[]"), out);
    }
}

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Checks one sample against the CRD rules of `kind` and the agent, which must agree with each
/// other and with `expect` (`None`: valid; `Some(text)`: rejected with this path and message).
fn agree<T>(
    schemas: &HashMap<String, Value>,
    kind: &str,
    name: &str,
    object: Value,
    agent: impl Fn(&T) -> Result<(), Invalid>,
    expect: Option<&str>,
    broken: &mut BTreeSet<(String, String)>,
) where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    // The agent sees the typed object; the API server sees it as stored (serde's defaults and
    // mode conversions applied, as the API server applies schema defaults).
    let typed: T = serde_json::from_value(object)
        .unwrap_or_else(|e| panic!("{kind} {name}: sample does not deserialize: {e}"));
    let stored = serde_json::to_value(&typed).unwrap();
    let mut failures = Vec::new();
    evaluate(&schemas[kind], &stored, "", "", broken, &mut failures);
    let texts: Vec<String> = failures.iter().map(Failure::text).collect();
    match (agent(&typed), expect) {
        (Ok(()), None) => assert!(
            failures.is_empty(),
            "{kind} {name}: the agent accepts what the CRD rejects: {texts:?}"
        ),
        (Ok(()), Some(want)) => panic!("{kind} {name}: the agent accepts it; expected {want:?}"),
        (Err(Invalid(got)), None) => {
            panic!("{kind} {name}: expected valid, the agent says {got:?} (CRD: {texts:?})")
        }
        (Err(Invalid(got)), Some(want)) => {
            assert!(
                got.starts_with(want),
                "{kind} {name}: the agent says {got:?}, expected {want:?}"
            );
            assert!(
                texts.iter().any(|t| t == want),
                "{kind} {name}: the CRD does not report {want:?}: {texts:?}"
            );
        }
    }
}

fn external_secret_base() -> Value {
    json!({
        "apiVersion": "latchkey.dev/v1alpha1",
        "kind": "ExternalSecret",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {
            "secretStoreRef": {"name": "aws-prod", "kind": "ClusterSecretStore"},
            "data": [{"secretKey": "password", "remoteRef": {"key": "prod/db"}}],
        }
    })
}

fn data_items(n: usize) -> Value {
    (0..n)
        .map(|i| json!({"secretKey": format!("k{i}"), "remoteRef": {"key": "r"}}))
        .collect()
}

/// (name, merge patch over `external_secret_base`, expected rejection).
fn external_secret_samples() -> Vec<(&'static str, Value, Option<String>)> {
    let some = |s: &str| Some(s.to_string());
    let mode_item = |mode: i64| {
        json!({"spec": {"target": {"files": {"items": [
            {"key": "password", "path": "db/password", "mode": mode}
        ]}}}})
    };
    vec![
        ("base", json!({}), None),
        (
            "dataFrom only",
            json!({"spec": {"data": null, "dataFrom": [
                {"extract": {"key": "prod/app"}},
                {"find": {"name": {"regexp": "^prod/"}}},
                {"find": {"path": "prod/"}},
            ]}}),
            None,
        ),
        (
            "every policy pair that is allowed",
            json!({"spec": {"target": {"creationPolicy": "Owner", "deletionPolicy": "Delete"}}}),
            None,
        ),
        (
            "merge deletion with an orphan mirror",
            json!({"spec": {"target": {"creationPolicy": "Orphan", "deletionPolicy": "Merge"}}}),
            None,
        ),
        (
            "retain without a mirror",
            json!({"spec": {"target": {"deletionPolicy": "Retain"}}}),
            None,
        ),
        (
            "modes at the bounds",
            json!({"spec": {"target": {"files": {"defaultMode": 0, "items": [
                {"key": "password", "path": "p", "mode": 0o777}
            ]}}}}),
            None,
        ),
        (
            "the longest secretKey",
            json!({"spec": {"data": [{"secretKey": "k".repeat(253), "remoteRef": {"key": "r"}}]}}),
            None,
        ),
        (
            "the most data entries",
            json!({"spec": {"data": data_items(rules::MAX_ITEMS)}}),
            None,
        ),
        (
            "empty store name",
            json!({"spec": {"secretStoreRef": {"name": ""}}}),
            some("spec.secretStoreRef.name: must not be empty"),
        ),
        (
            "no data at all",
            json!({"spec": {"data": null}}),
            some("spec: data or dataFrom must have at least one entry"),
        ),
        (
            "empty data lists",
            json!({"spec": {"data": [], "dataFrom": []}}),
            some("spec: data or dataFrom must have at least one entry"),
        ),
        (
            "empty secretKey",
            json!({"spec": {"data": [{"secretKey": "", "remoteRef": {"key": "r"}}]}}),
            some("spec.data[0].secretKey: must not be empty"),
        ),
        (
            "secretKey too long",
            json!({"spec": {"data": [{"secretKey": "k".repeat(254), "remoteRef": {"key": "r"}}]}}),
            some("spec.data[0].secretKey: must be at most 253 characters long"),
        ),
        (
            "duplicate secretKey",
            json!({"spec": {"data": [
                {"secretKey": "a", "remoteRef": {"key": "r"}},
                {"secretKey": "b", "remoteRef": {"key": "r"}},
                {"secretKey": "a", "remoteRef": {"key": "s"}},
            ]}}),
            some("spec.data[2]: duplicates the secretKey of entry 0"),
        ),
        (
            "too many data entries",
            json!({"spec": {"data": data_items(rules::MAX_ITEMS + 1)}}),
            some("spec.data: must have at most 1000 items"),
        ),
        (
            "empty remote key",
            json!({"spec": {"data": [{"secretKey": "k", "remoteRef": {"key": ""}}]}}),
            some("spec.data[0].remoteRef.key: must not be empty"),
        ),
        (
            "extract and find together",
            json!({"spec": {"dataFrom": [
                {"extract": {"key": "a"}, "find": {"path": "p"}}
            ]}}),
            some("spec.dataFrom[0]: must set exactly one of extract, find"),
        ),
        (
            "neither extract nor find",
            json!({"spec": {"dataFrom": [{"rewrite": []}]}}),
            some("spec.dataFrom[0]: must set exactly one of extract, find"),
        ),
        (
            "empty extract key",
            json!({"spec": {"dataFrom": [{"extract": {"key": "a"}}, {"extract": {"key": ""}}]}}),
            some("spec.dataFrom[1].extract.key: must not be empty"),
        ),
        (
            "find without criteria",
            json!({"spec": {"dataFrom": [{"find": {"decodingStrategy": "Auto"}}]}}),
            some("spec.dataFrom[0].find: must set name or path"),
        ),
        (
            "too many dataFrom entries",
            json!({"spec": {"dataFrom": (0..=rules::MAX_DATA_FROM)
                .map(|_| json!({"extract": {"key": "a"}}))
                .collect::<Value>()}}),
            some("spec.dataFrom: must have at most 50 items"),
        ),
        (
            "refresh interval of a year",
            json!({"spec": {"refreshInterval": "8760h"}}),
            None,
        ),
        (
            "refresh interval beyond a year",
            json!({"spec": {"refreshInterval": "8761h"}}),
            some("spec.refreshInterval: must be at most 8760h (one year); use 0 to fetch once"),
        ),
        (
            "too many rewrite steps",
            json!({"spec": {"dataFrom": [{"extract": {"key": "a"}, "rewrite": (0..=rules::MAX_REWRITES)
                .map(|_| json!({"regexp": {"source": "^(.*)$", "target": "$1$1"}}))
                .collect::<Value>()}]}}),
            some("spec.dataFrom[0].rewrite: must have at most 16 items"),
        ),
        (
            "too many template keys",
            json!({"spec": {"target": {"template": {"data": (0..=rules::MAX_TEMPLATE_KEYS)
                .map(|i| (format!("k{i}"), json!("'x'")))
                .collect::<serde_json::Map<String, Value>>()}}}}),
            some("spec.target.template.data: must have at most 100 properties"),
        ),
        (
            "delete without a mirror",
            json!({"spec": {"target": {"deletionPolicy": "Delete"}}}),
            some("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "delete with an orphan mirror",
            json!({"spec": {"target": {"creationPolicy": "Orphan", "deletionPolicy": "Delete"}}}),
            some("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "delete with a merged mirror",
            json!({"spec": {"target": {"creationPolicy": "Merge", "deletionPolicy": "Delete"}}}),
            some("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "merge deletion without a mirror",
            json!({"spec": {"target": {"creationPolicy": "None", "deletionPolicy": "Merge"}}}),
            some(
                "spec.target: deletionPolicy Merge requires a mirrored Secret \
                 (creationPolicy Owner, Orphan or Merge)",
            ),
        ),
        (
            "merge deletion with the default creation policy",
            json!({"spec": {"target": {"deletionPolicy": "Merge"}}}),
            some(
                "spec.target: deletionPolicy Merge requires a mirrored Secret \
                 (creationPolicy Owner, Orphan or Merge)",
            ),
        ),
        (
            "default mode above 0777",
            json!({"spec": {"target": {"files": {"defaultMode": 0o1000}}}}),
            some("spec.target.files.defaultMode: must be a file mode between 0 and 0777 (511)"),
        ),
        (
            "negative default mode",
            json!({"spec": {"target": {"files": {"defaultMode": -1}}}}),
            some("spec.target.files.defaultMode: must be a file mode between 0 and 0777 (511)"),
        ),
        (
            "item mode above 0777",
            mode_item(0o4755),
            some("spec.target.files.items[0].mode: must be a file mode between 0 and 0777 (511)"),
        ),
        (
            "too many file items",
            json!({"spec": {"target": {"files": {"items": (0..=rules::MAX_ITEMS)
                .map(|i| json!({"key": "password", "path": format!("p{i}")}))
                .collect::<Value>()}}}}),
            some("spec.target.files.items: must have at most 1000 items"),
        ),
    ]
}

fn store_base(kind: &str) -> Value {
    let mut metadata = json!({"name": "store"});
    if kind == "SecretStore" {
        metadata["namespace"] = json!("shop");
    }
    json!({
        "apiVersion": "latchkey.dev/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": {"provider": {"fake": {"data": [{"key": "k", "value": "v"}]}}}
    })
}

/// (name, `spec.provider` merge patch over the fake provider, expected rejection).
fn provider_samples() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let secret = json!({"name": "creds", "key": "token"});
    let vault = |auth: Value| json!({"fake": null, "vault": {"server": "https://vault:8200", "auth": auth}});
    let aws = |auth: Value| json!({"fake": null, "aws": {"region": "eu-west-1", "auth": auth}});
    vec![
        ("fake", json!({}), None),
        ("kubernetes", json!({"fake": null, "kubernetes": {}}), None),
        (
            "aws without auth",
            json!({"fake": null, "aws": {"region": "eu-west-1"}}),
            None,
        ),
        ("aws with empty auth", aws(json!({})), None),
        ("aws jwt", aws(json!({"jwt": {}})), None),
        (
            "aws agent identity",
            aws(json!({"agentIdentity": {}})),
            None,
        ),
        (
            "aws static keys",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": secret, "secretAccessKeySecretRef": secret
            }})),
            None,
        ),
        (
            "aws SecretsManager spelled out",
            json!({"fake": null, "aws": {"region": "eu-west-1", "service": "SecretsManager"}}),
            None,
        ),
        (
            "vault token",
            vault(json!({"tokenSecretRef": secret})),
            None,
        ),
        (
            "vault kubernetes",
            vault(json!({"kubernetes": {"role": "app"}})),
            None,
        ),
        ("vault jwt", vault(json!({"jwt": {"role": "app"}})), None),
        (
            "vault approle",
            vault(json!({"appRole": {"roleId": "id", "secretRef": secret}})),
            None,
        ),
        (
            "vault kv v1",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "version": "v1", "auth": {"jwt": {"role": "app"}}
            }}),
            None,
        ),
        (
            "no provider",
            json!({"fake": null}),
            Some("spec.provider: must set exactly one of aws, vault, kubernetes, fake"),
        ),
        (
            "two providers",
            json!({"kubernetes": {}}),
            Some("spec.provider: must set exactly one of aws, vault, kubernetes, fake"),
        ),
        (
            "aws ParameterStore",
            json!({"fake": null, "aws": {"region": "eu-west-1", "service": "ParameterStore"}}),
            Some("spec.provider.aws.service: must be SecretsManager (the only supported service)"),
        ),
        (
            "aws with two auth methods",
            aws(json!({"jwt": {}, "agentIdentity": {}})),
            Some("spec.provider.aws.auth: must set at most one of secretRef, jwt, agentIdentity"),
        ),
        (
            "vault without auth method",
            vault(json!({})),
            Some(
                "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, \
                 jwt, appRole",
            ),
        ),
        (
            "vault with two auth methods",
            vault(json!({"kubernetes": {"role": "a"}, "tokenSecretRef": secret})),
            Some(
                "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, \
                 jwt, appRole",
            ),
        ),
        (
            "vault kv v3",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "version": "v3", "auth": {"jwt": {"role": "app"}}
            }}),
            Some("spec.provider.vault.version: must be v1 or v2"),
        ),
    ]
}

#[test]
fn crd_rules_and_agent_agree_on_every_sample() {
    let schemas = schemas();
    let mut broken = BTreeSet::new();
    for (name, patch, expect) in external_secret_samples() {
        let mut object = external_secret_base();
        merge(&mut object, &patch);
        agree::<ExternalSecret>(
            &schemas,
            "ExternalSecret",
            name,
            object,
            |es| validate::external_secret(&es.spec),
            expect.as_deref(),
            &mut broken,
        );
    }
    for (name, patch, expect) in provider_samples() {
        for kind in ["SecretStore", "ClusterSecretStore"] {
            let expect = match (kind, name) {
                ("SecretStore", "aws agent identity") => Some(
                    "spec: provider.aws.auth.agentIdentity (the node agent's own AWS identity) \
                     is only allowed on a ClusterSecretStore",
                ),
                _ => expect,
            };
            let mut object = store_base(kind);
            merge(&mut object["spec"]["provider"], &patch);
            if kind == "SecretStore" {
                agree::<SecretStore>(
                    &schemas,
                    kind,
                    name,
                    object,
                    |s| validate::provider(&s.spec.provider, StoreKind::SecretStore).map(|_| ()),
                    expect,
                    &mut broken,
                );
            } else {
                agree::<ClusterSecretStore>(
                    &schemas,
                    kind,
                    name,
                    object,
                    |s| {
                        validate::provider(&s.spec.provider, StoreKind::ClusterSecretStore)
                            .map(|_| ())
                    },
                    expect,
                    &mut broken,
                );
            }
        }
    }
    // Every rule of every CRD was broken by some sample (a rule nobody breaks is untested).
    for (kind, schema) in &schemas {
        let mut every = BTreeSet::new();
        all_rules(schema, "", &mut every);
        assert!(!every.is_empty(), "{kind} has no rules");
        let untested: Vec<_> = every.difference(&broken).collect();
        assert!(untested.is_empty(), "{kind}: no sample breaks {untested:?}");
    }
}

#[test]
fn yaml_octal_modes_are_checked_like_integers() {
    // kubectl reads `0o1000` as 512 before the API server evaluates the rule; standalone mode
    // reads the string and `mode::deserialize` converts it: both must reject it.
    let yaml = r#"
apiVersion: latchkey.dev/v1alpha1
kind: ExternalSecret
metadata: {name: db, namespace: shop}
spec:
  secretStoreRef: {name: s}
  data: [{secretKey: k, remoteRef: {key: r}}]
  target: {files: {defaultMode: 0440, items: [{key: k, path: p, mode: "01000"}]}}
"#;
    let es: ExternalSecret = serde_norway::from_str(yaml).unwrap();
    let files = es.spec.target.as_ref().unwrap().files.as_ref().unwrap();
    assert_eq!(
        (files.default_mode, files.items[0].mode),
        (Some(0o440), Some(0o1000))
    );
    let mut broken = BTreeSet::new();
    agree::<ExternalSecret>(
        &schemas(),
        "ExternalSecret",
        "octal string mode",
        serde_json::to_value(&es).unwrap(),
        |es| validate::external_secret(&es.spec),
        Some("spec.target.files.items[0].mode: must be a file mode between 0 and 0777 (511)"),
        &mut broken,
    );
    assert_eq!(broken.len(), 1, "{broken:?}");
}

#[test]
fn rules_stay_cheap_for_the_api_server() {
    // Rules only test presence and sizes, and no rule iterates a list: the API server's cost
    // estimate then only grows with the bound of the lists above a rule, which are all bounded.
    for (kind, schema) in schemas() {
        let mut every = BTreeSet::new();
        all_rules(&schema, "", &mut every);
        for (path, rule) in every {
            for macro_ in [".all(", ".exists(", ".exists_one(", ".map(", ".filter("] {
                assert!(
                    !rule.contains(macro_),
                    "{kind} {path}: {rule:?} iterates; bound it"
                );
            }
            let mut node = &schema;
            let mut lists = 0;
            for part in path.split('.').filter(|p| !p.is_empty()) {
                let field = part.trim_end_matches("[]");
                node = &node["properties"][field];
                if part.ends_with("[]") {
                    lists += 1;
                    assert!(
                        node["maxItems"].is_u64(),
                        "{kind} {path}: list {field} above a rule has no maxItems"
                    );
                    node = &node["items"];
                }
            }
            assert!(lists <= 1, "{kind} {path}: nested lists multiply the cost");
        }
    }
}
