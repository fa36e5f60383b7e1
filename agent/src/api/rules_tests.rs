//! The CRD rules and the agent agree.
//!
//! Every `x-kubernetes-validations` rule of the rendered CRDs is compiled and evaluated, at its
//! place in the schema, with a CEL interpreter (as the API server would: `self` is the node's
//! value, absent and null values are not validated), together with the keywords the agent mirrors
//! (`pattern`, `maxItems`, `maxLength`, `maxProperties`, list-map keys). For each sample object
//! the verdict must equal the one of `validate::*`, and a rejection must carry the same path and
//! message. A rule that does not compile or does not return a bool, and a rule or pattern that no
//! sample breaks, fail the test.
//!
//! The patterns are also checked against what the agent enforces where it uses the value: file
//! paths against [`FilePath`], names against `is_dns_subdomain`, durations against Go's parser
//! (Kubernetes' `duration()`), which the agent uses too ([`duration`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};

use super::crd::render_all;
use super::duration;
use super::external_secret::{ExternalSecret, StoreKind};
use super::rules::{self, DNS_SUBDOMAIN, DURATION, FILE_PATH, SECRETS_STORE_PROVIDER};
use super::store::{ClusterSecretStore, SecretStore};
use super::validate::{self, Invalid};
use crate::volume::FilePath;
use crate::volume::path::Reason;

mod cluster_external_secret;
mod generators;
mod kubernetes;
mod providers;
mod push_secret;

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

/// The harness's stand-in for the API server's report of a rule that failed to evaluate
/// (`<error> evaluating rule: <rule>`), such as `duration()` on a value Go cannot represent.
const EVALUATION_ERROR: &str = "error evaluating rule";

/// What a sample should get.
#[derive(Debug, Clone)]
enum Expect {
    /// Both accept it.
    Valid,
    /// Both reject it, with this path and message.
    Rejected(String),
    /// The agent rejects it (starting with this text), the CRD admits it: a rule the schema
    /// cannot state cheaply, which only the agent enforces.
    AgentOnly(String),
    /// Both reject it, in their own words.
    RejectedAs {
        /// The start of the agent's error.
        agent: String,
        /// One of the API server's errors.
        crd: String,
    },
}

fn rejected(text: impl Into<String>) -> Expect {
    Expect::Rejected(text.into())
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
        // Kubernetes' `duration()`, as far as comparisons go: the nanoseconds of a Go duration.
        ctx.add_function(
            "duration",
            |text: Arc<String>| -> Result<cel::Value, cel::ExecutionError> {
                duration::go_nanos(&text)
                    .map(cel::Value::Int)
                    .ok_or_else(|| {
                        cel::ExecutionError::function_error("duration", "invalid duration")
                    })
            },
        )
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
            Err(cel::ExecutionError::FunctionError { function, .. }) if function == "duration" => {
                out.push(Failure {
                    path: path.to_string(),
                    message: EVALUATION_ERROR.to_string(),
                });
            }
            other => panic!("{path}: rule {text:?} gave {other:?}, not a bool"),
        }
    }
    if let (Some(regex), Some(s)) = (schema["pattern"].as_str(), value.as_str()) {
        let pattern = rules::PATTERNS
            .iter()
            .find(|p| p.regex == regex)
            .unwrap_or_else(|| {
                panic!("{schema_path}: pattern {regex:?} is not in rules::PATTERNS")
            });
        // The API server runs RE2, which reads the patterns' syntax as the `regex` crate does.
        if !Regex::new(regex).unwrap().is_match(s) {
            broken.insert((schema_path.to_string(), pattern_key(regex)));
            out.push(Failure {
                path: path.to_string(),
                message: pattern.message.to_string(),
            });
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
    // The generators' ranges (a Password's length and counts), in the agent's words.
    if let (Some(min), Some(v)) = (schema["minimum"].as_f64(), value.as_f64())
        && v < min
    {
        out.push(Failure {
            path: path.to_string(),
            message: rules::too_small(min as u64),
        });
    }
    if let (Some(max), Some(v)) = (schema["maximum"].as_f64(), value.as_f64())
        && v > max
    {
        out.push(Failure {
            path: path.to_string(),
            message: rules::too_large(max as u64),
        });
    }
    for keyword in ["minLength", "minItems", "enum"] {
        // The agent mirrors none of these: a sample that breaks one shows up as a disagreement.
        let broken_keyword = match (keyword, &schema[keyword]) {
            (_, Value::Null) => false,
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

/// How a `pattern` is recorded next to rule texts.
fn pattern_key(regex: &str) -> String {
    format!("pattern {regex}")
}

/// Every rule of a schema, as (schema path, rule text); with `patterns`, every `pattern` too (as
/// [`pattern_key`]).
fn all_rules(
    schema: &Value,
    schema_path: &str,
    patterns: bool,
    out: &mut BTreeSet<(String, String)>,
) {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = rule["rule"].as_str().unwrap().to_string();
        out.insert((schema_path.to_string(), text));
    }
    if let (true, Some(regex)) = (patterns, schema["pattern"].as_str()) {
        out.insert((schema_path.to_string(), pattern_key(regex)));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            all_rules(sub, &join(schema_path, name), patterns, out);
        }
    }
    if schema["additionalProperties"].is_object() {
        all_rules(
            &schema["additionalProperties"],
            &join(schema_path, "*"),
            patterns,
            out,
        );
    }
    if schema["items"].is_object() {
        all_rules(&schema["items"], &format!("{schema_path}[]"), patterns, out);
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
/// other and with `expect`.
fn agree<T>(
    schemas: &HashMap<String, Value>,
    kind: &str,
    name: &str,
    object: Value,
    agent: impl Fn(&T) -> Result<(), Invalid>,
    expect: &Expect,
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
    let (got, want_agent, want_crd) = match (agent(&typed), expect) {
        (Ok(()), Expect::Valid) => {
            assert!(
                failures.is_empty(),
                "{kind} {name}: the agent accepts what the CRD rejects: {texts:?}"
            );
            return;
        }
        (Ok(()), want) => panic!("{kind} {name}: the agent accepts it; expected {want:?}"),
        (Err(Invalid(got)), Expect::Valid) => {
            panic!("{kind} {name}: expected valid, the agent says {got:?} (CRD: {texts:?})")
        }
        (Err(Invalid(got)), Expect::AgentOnly(want)) => {
            assert!(
                got.starts_with(want.as_str()),
                "{kind} {name}: the agent says {got:?}, expected {want:?}"
            );
            assert!(
                failures.is_empty(),
                "{kind} {name}: only the agent should refuse it, the CRD says {texts:?}"
            );
            return;
        }
        (Err(Invalid(got)), Expect::Rejected(want)) => (got, want, want),
        (Err(Invalid(got)), Expect::RejectedAs { agent, crd }) => (got, agent, crd),
    };
    assert!(
        got.starts_with(want_agent.as_str()),
        "{kind} {name}: the agent says {got:?}, expected {want_agent:?}"
    );
    assert!(
        texts.iter().any(|t| t == want_crd),
        "{kind} {name}: the CRD does not report {want_crd:?}: {texts:?}"
    );
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

/// (name, merge patch over `external_secret_base`, expected verdict).
fn external_secret_samples() -> Vec<(&'static str, Value, Expect)> {
    let key = |k: &str| json!({"spec": {"data": [{"secretKey": k, "remoteRef": {"key": "r"}}]}});
    let keys = |ks: &[&str]| -> Value {
        ks.iter()
            .map(|k| json!({"secretKey": k, "remoteRef": {"key": "r"}}))
            .collect()
    };
    let bad_key = |what: &str| format!("spec.data[0].secretKey: {what}");
    let item_path = |p: &str| {
        json!({"spec": {"target": {"files": {"items": [
            {"key": "password", "path": p}
        ]}}}})
    };
    let refresh = |d: &str| json!({"spec": {"refreshInterval": d}});
    let not_a_duration = format!("spec.refreshInterval: {}", DURATION.message);
    let too_long_interval =
        "spec.refreshInterval: must be at most 8760h (one year); use 0 to fetch once";
    let sixteen = ["s"; 16].join("/");
    let mode_item = |mode: i64| {
        json!({"spec": {"target": {"files": {"items": [
            {"key": "password", "path": "db/password", "mode": mode}
        ]}}}})
    };
    let one_source = format!("spec.dataFrom[0]: {}", rules::EXTRACT_XOR_FIND.message);
    let mut samples = vec![
        ("base", json!({}), Expect::Valid),
        (
            "dataFrom only",
            json!({"spec": {"data": null, "dataFrom": [
                {"extract": {"key": "prod/app"}},
                {"find": {"name": {"regexp": "^prod/"}}},
                {"find": {"path": "prod/"}},
            ]}}),
            Expect::Valid,
        ),
        (
            "every policy pair that is allowed",
            json!({"spec": {"target": {"creationPolicy": "Owner", "deletionPolicy": "Delete"}}}),
            Expect::Valid,
        ),
        (
            "merge deletion with an orphan mirror",
            json!({"spec": {"target": {"creationPolicy": "Orphan", "deletionPolicy": "Merge"}}}),
            Expect::Valid,
        ),
        (
            "retain without a mirror",
            json!({"spec": {"target": {"deletionPolicy": "Retain"}}}),
            Expect::Valid,
        ),
        (
            "modes at the bounds",
            json!({"spec": {"target": {"files": {"defaultMode": 0, "items": [
                {"key": "password", "path": "p", "mode": 0o777}
            ]}}}}),
            Expect::Valid,
        ),
        (
            "the longest secretKey",
            json!({"spec": {"data": [{"secretKey": "k".repeat(253), "remoteRef": {"key": "r"}}]}}),
            Expect::Valid,
        ),
        (
            "the most data entries",
            json!({"spec": {"data": data_items(rules::MAX_ITEMS)}}),
            Expect::Valid,
        ),
        (
            "empty store name",
            json!({"spec": {"secretStoreRef": {"name": ""}}}),
            rejected("spec.secretStoreRef.name: must not be empty"),
        ),
        (
            "no data at all",
            json!({"spec": {"data": null}}),
            rejected("spec: data or dataFrom must have at least one entry"),
        ),
        (
            "empty data lists",
            json!({"spec": {"data": [], "dataFrom": []}}),
            rejected("spec: data or dataFrom must have at least one entry"),
        ),
        (
            "empty secretKey",
            json!({"spec": {"data": [{"secretKey": "", "remoteRef": {"key": "r"}}]}}),
            rejected("spec.data[0].secretKey: must not be empty"),
        ),
        (
            "secretKey too long",
            json!({"spec": {"data": [{"secretKey": "k".repeat(254), "remoteRef": {"key": "r"}}]}}),
            rejected("spec.data[0].secretKey: must be at most 253 characters long"),
        ),
        (
            "duplicate secretKey",
            json!({"spec": {"data": [
                {"secretKey": "a", "remoteRef": {"key": "r"}},
                {"secretKey": "b", "remoteRef": {"key": "r"}},
                {"secretKey": "a", "remoteRef": {"key": "s"}},
            ]}}),
            rejected("spec.data[2]: duplicates the secretKey of entry 0"),
        ),
        (
            "too many data entries",
            json!({"spec": {"data": data_items(rules::MAX_ITEMS + 1)}}),
            rejected("spec.data: must have at most 1000 items"),
        ),
        (
            "empty remote key",
            json!({"spec": {"data": [{"secretKey": "k", "remoteRef": {"key": ""}}]}}),
            rejected("spec.data[0].remoteRef.key: must not be empty"),
        ),
        (
            "extract and find together",
            json!({"spec": {"dataFrom": [
                {"extract": {"key": "a"}, "find": {"path": "p"}}
            ]}}),
            rejected(one_source.clone()),
        ),
        (
            "neither extract nor find",
            json!({"spec": {"dataFrom": [{"rewrite": []}]}}),
            rejected(one_source.clone()),
        ),
        (
            "empty extract key",
            json!({"spec": {"dataFrom": [{"extract": {"key": "a"}}, {"extract": {"key": ""}}]}}),
            rejected("spec.dataFrom[1].extract.key: must not be empty"),
        ),
        (
            "find without criteria",
            json!({"spec": {"dataFrom": [{"find": {"decodingStrategy": "Auto"}}]}}),
            rejected("spec.dataFrom[0].find: must set name, path or tags"),
        ),
        (
            "find by tags",
            json!({"spec": {"dataFrom": [{"find": {"tags": {"team": "shop"}}}]}}),
            Expect::Valid,
        ),
        (
            "find by too many tags",
            json!({"spec": {"dataFrom": [{"find": {"tags": (0..=rules::MAX_FIND_TAGS)
                .map(|i| (format!("t{i}"), json!("v")))
                .collect::<serde_json::Map<String, Value>>()}}]}}),
            rejected("spec.dataFrom[0].find.tags: must have at most 10 properties"),
        ),
        (
            "too many dataFrom entries",
            json!({"spec": {"dataFrom": (0..=rules::MAX_DATA_FROM)
                .map(|_| json!({"extract": {"key": "a"}}))
                .collect::<Value>()}}),
            rejected("spec.dataFrom: must have at most 50 items"),
        ),
        (
            "refresh interval of a year",
            json!({"spec": {"refreshInterval": "8760h"}}),
            Expect::Valid,
        ),
        (
            "refresh interval beyond a year",
            json!({"spec": {"refreshInterval": "8761h"}}),
            rejected("spec.refreshInterval: must be at most 8760h (one year); use 0 to fetch once"),
        ),
        (
            "too many rewrite steps",
            json!({"spec": {"dataFrom": [{"extract": {"key": "a"}, "rewrite": (0..=rules::MAX_REWRITES)
                .map(|_| json!({"regexp": {"source": "^(.*)$", "target": "$1$1"}}))
                .collect::<Value>()}]}}),
            rejected("spec.dataFrom[0].rewrite: must have at most 16 items"),
        ),
        (
            "too many template keys",
            json!({"spec": {"target": {"template": {"data": (0..=rules::MAX_TEMPLATE_KEYS)
                .map(|i| (format!("k{i}"), json!("'x'")))
                .collect::<serde_json::Map<String, Value>>()}}}}),
            rejected("spec.target.template.data: must have at most 100 properties"),
        ),
        (
            "delete without a mirror",
            json!({"spec": {"target": {"deletionPolicy": "Delete"}}}),
            rejected("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "delete with an orphan mirror",
            json!({"spec": {"target": {"creationPolicy": "Orphan", "deletionPolicy": "Delete"}}}),
            rejected("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "delete with a merged mirror",
            json!({"spec": {"target": {"creationPolicy": "Merge", "deletionPolicy": "Delete"}}}),
            rejected("spec.target: deletionPolicy Delete requires creationPolicy Owner"),
        ),
        (
            "merge deletion without a mirror",
            json!({"spec": {"target": {"creationPolicy": "None", "deletionPolicy": "Merge"}}}),
            rejected(
                "spec.target: deletionPolicy Merge requires a mirrored Secret \
                 (creationPolicy Owner, Orphan or Merge)",
            ),
        ),
        (
            "merge deletion with the default creation policy",
            json!({"spec": {"target": {"deletionPolicy": "Merge"}}}),
            rejected(
                "spec.target: deletionPolicy Merge requires a mirrored Secret \
                 (creationPolicy Owner, Orphan or Merge)",
            ),
        ),
        (
            "default mode above 0777",
            json!({"spec": {"target": {"files": {"defaultMode": 0o1000}}}}),
            rejected("spec.target.files.defaultMode: must be a file mode between 0 and 0777 (511)"),
        ),
        (
            "negative default mode",
            json!({"spec": {"target": {"files": {"defaultMode": -1}}}}),
            rejected("spec.target.files.defaultMode: must be a file mode between 0 and 0777 (511)"),
        ),
        (
            "item mode above 0777",
            mode_item(0o4755),
            rejected(
                "spec.target.files.items[0].mode: must be a file mode between 0 and 0777 (511)",
            ),
        ),
        (
            "too many file items",
            json!({"spec": {"target": {"files": {"items": (0..=rules::MAX_ITEMS)
                .map(|i| json!({"key": "password", "path": format!("p{i}")}))
                .collect::<Value>()}}}}),
            rejected("spec.target.files.items: must have at most 1000 items"),
        ),
        // File paths: `spec.data[].secretKey` and `spec.target.files.items[].path`.
        (
            "secretKeys that are nested, hidden or dotted",
            json!({"spec": {"data": keys(&[
                "db/url", ".hidden", "x..y", "a/.b", "ключ/値", &sixteen
            ])}}),
            Expect::Valid,
        ),
        (
            "secretKey climbing out",
            key("../x"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey climbing out further in",
            key("a/../../x"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "absolute secretKey",
            key("/etc/passwd"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with an empty segment",
            key("a//b"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with a trailing slash",
            key("a/"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey '.'",
            key("."),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with a '.' segment",
            key("a/./b"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey in the volume writer's names",
            key("..data"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with a backslash",
            key("a\\b"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with a newline",
            key("a\nb"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with a C1 control character",
            key("a\u{85}b"),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "secretKey with 17 segments",
            key(&format!("{sixteen}/s")),
            rejected(bad_key(FILE_PATH.message)),
        ),
        (
            "file item path climbing out",
            item_path("db/../../x"),
            rejected(format!(
                "spec.target.files.items[0].path: {}",
                FILE_PATH.message
            )),
        ),
        (
            "the longest file item path",
            item_path(&format!("{}/abcdefgh", vec!["p".repeat(253); 4].join("/"))),
            Expect::Valid,
        ),
        (
            "file item path too long",
            item_path(&"p".repeat(rules::MAX_FILE_PATH_LEN + 1)),
            rejected("spec.target.files.items[0].path: must be at most 1024 characters long"),
        ),
        // Durations: Go's and the agent's parser must both read them, alike.
        ("refresh once", refresh("0"), Expect::Valid),
        (
            "refresh in hours and minutes",
            refresh("1h30m"),
            Expect::Valid,
        ),
        (
            "refresh in a fraction of an hour",
            refresh("1.5h"),
            Expect::Valid,
        ),
        ("refresh in milliseconds", refresh("500ms"), Expect::Valid),
        (
            "refresh in micro signs",
            refresh("250\u{b5}s"),
            Expect::Valid,
        ),
        ("refresh in nanoseconds", refresh("100ns"), Expect::Valid),
        (
            "refresh bananas",
            refresh("banana"),
            rejected(&not_a_duration),
        ),
        ("refresh in days", refresh("1d"), rejected(&not_a_duration)),
        ("refresh in years", refresh("1y"), rejected(&not_a_duration)),
        (
            "refresh without a unit",
            refresh("30"),
            rejected(&not_a_duration),
        ),
        (
            "refresh with a space",
            refresh("1h 30m"),
            rejected(&not_a_duration),
        ),
        (
            "refresh with a sign",
            refresh("-1h"),
            rejected(&not_a_duration),
        ),
        (
            "refresh in Greek mu",
            refresh("250\u{3bc}s"),
            rejected(&not_a_duration),
        ),
        (
            "refresh from a bare fraction",
            refresh(".5h"),
            rejected(&not_a_duration),
        ),
        (
            "refresh in fractional nanoseconds",
            refresh("1.5ns"),
            rejected(&not_a_duration),
        ),
        (
            "refresh interval too long a text",
            refresh(&"1s".repeat(33)),
            rejected("spec.refreshInterval: must be at most 64 characters long"),
        ),
        (
            "refresh half a second beyond a year",
            refresh("8760h0.5s"),
            rejected(too_long_interval),
        ),
        (
            // Go's duration() overflows int64 nanoseconds; the agent's parser reads it.
            "refresh beyond what Go can count",
            refresh("9999999999h"),
            Expect::RejectedAs {
                agent: too_long_interval.to_string(),
                crd: format!("spec.refreshInterval: {EVALUATION_ERROR}"),
            },
        ),
        // Names of stores, Secrets and service accounts.
        (
            "names with dots and dashes",
            json!({"spec": {
                "secretStoreRef": {"name": "aws-prod.eu-1"},
                "serviceAccountName": "mirror",
                "target": {"name": "db-creds.v2", "creationPolicy": "Owner"},
            }}),
            Expect::Valid,
        ),
        (
            "store name with capitals",
            json!({"spec": {"secretStoreRef": {"name": "Aws_Prod"}}}),
            rejected(format!(
                "spec.secretStoreRef.name: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
        (
            "store name climbing out",
            json!({"spec": {"secretStoreRef": {"name": "../../secrets/x"}}}),
            rejected(format!(
                "spec.secretStoreRef.name: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
        (
            "store name too long",
            json!({"spec": {"secretStoreRef": {"name": "a".repeat(254)}}}),
            rejected("spec.secretStoreRef.name: must be at most 253 characters long"),
        ),
        (
            "mirrored Secret name with a space",
            json!({"spec": {"target": {"name": "db creds"}}}),
            rejected(format!("spec.target.name: {}", DNS_SUBDOMAIN.message)),
        ),
        (
            "service account name with a colon",
            json!({"spec": {"serviceAccountName": "system:admin"}}),
            rejected(format!(
                "spec.serviceAccountName: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
    ];
    samples.extend(generators::external_secret_samples());
    samples
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

/// (name, `spec.provider` merge patch over the fake provider, expected verdict).
fn provider_samples() -> Vec<(&'static str, Value, Expect)> {
    let secret = json!({"name": "creds", "key": "token"});
    let bad_secret = json!({"name": "../creds", "key": "token"});
    let bad_name = |at: &str| {
        rejected(format!(
            "spec.provider.{at}.name: {}",
            DNS_SUBDOMAIN.message
        ))
    };
    let vault = |auth: Value| json!({"fake": null, "vault": {"server": "https://vault:8200", "auth": auth}});
    let aws = |auth: Value| json!({"fake": null, "aws": {"region": "eu-west-1", "auth": auth}});
    vec![
        ("fake", json!({}), Expect::Valid),
        (
            "kubernetes",
            json!({"fake": null, "kubernetes": {}}),
            Expect::Valid,
        ),
        (
            "aws without auth",
            json!({"fake": null, "aws": {"region": "eu-west-1"}}),
            Expect::Valid,
        ),
        ("aws with empty auth", aws(json!({})), Expect::Valid),
        ("aws jwt", aws(json!({"jwt": {}})), Expect::Valid),
        (
            "aws agent identity",
            aws(json!({"agentIdentity": {}})),
            Expect::Valid,
        ),
        (
            "aws static keys",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": secret, "secretAccessKeySecretRef": secret
            }})),
            Expect::Valid,
        ),
        (
            "aws SecretsManager spelled out",
            json!({"fake": null, "aws": {"region": "eu-west-1", "service": "SecretsManager"}}),
            Expect::Valid,
        ),
        (
            "vault token",
            vault(json!({"tokenSecretRef": secret})),
            Expect::Valid,
        ),
        (
            "vault kubernetes",
            vault(json!({"kubernetes": {"role": "app"}})),
            Expect::Valid,
        ),
        (
            "vault jwt",
            vault(json!({"jwt": {"role": "app"}})),
            Expect::Valid,
        ),
        (
            "vault approle",
            vault(json!({"appRole": {"roleId": "id", "secretRef": secret}})),
            Expect::Valid,
        ),
        (
            "vault userpass",
            vault(json!({"userPass": {"username": "shop", "secretRef": secret}})),
            Expect::Valid,
        ),
        (
            "vault cert",
            vault(json!({"cert": {"clientCert": secret, "secretRef": secret}})),
            Expect::Valid,
        ),
        (
            "vault kv v1",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "version": "v1", "auth": {"jwt": {"role": "app"}}
            }}),
            Expect::Valid,
        ),
        (
            "plugin on a unix socket",
            json!({"fake": null, "plugin": {
                "endpoint": "unix:///var/run/latchkey/plugins/files.sock",
                "timeout": "2s",
                "configRef": {"apiVersion": "files.example/v1", "kind": "FileConfig", "name": "main"},
            }}),
            Expect::Valid,
        ),
        (
            "plugin over TCP",
            json!({"fake": null, "plugin": {"endpoint": "plugin.secrets.svc:4000"}}),
            Expect::Valid,
        ),
        (
            "plugin over TCP with mutual TLS and audiences",
            json!({"fake": null, "plugin": {
                "endpoint": "plugin.secrets.svc:4000",
                "audiences": ["plugin.example"],
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----", "clientCertSecretRef": {"name": "plugin-client"}},
            }}),
            Expect::Valid,
        ),
        (
            "plugin timeout that is no duration",
            json!({"fake": null, "plugin": {"endpoint": "p:4000", "timeout": "soon"}}),
            rejected(format!(
                "spec.provider.plugin.timeout: {}",
                DURATION.message
            )),
        ),
        (
            "secretsStoreCSI provider",
            json!({"fake": null, "secretsStoreCSI": {
                "provider": "azure",
                "parameters": {"keyvaultName": "kv", "objects": "array: []"},
                "audiences": ["api://AzureADTokenExchange"],
                "timeout": "20s",
            }}),
            Expect::Valid,
        ),
        (
            "secretsStoreCSI provider name that leaves the directory",
            json!({"fake": null, "secretsStoreCSI": {"provider": "../containerd/containerd"}}),
            rejected(format!(
                "spec.provider.secretsStoreCSI.provider: {}",
                SECRETS_STORE_PROVIDER.message
            )),
        ),
        (
            "secretsStoreCSI nodePublishSecretRef",
            json!({"fake": null, "secretsStoreCSI": {
                "provider": "azure", "nodePublishSecretRef": {"name": "azure-creds"},
            }}),
            Expect::Valid,
        ),
        (
            "secretsStoreCSI nodePublishSecretRef climbing out",
            json!({"fake": null, "secretsStoreCSI": {
                "provider": "azure", "nodePublishSecretRef": {"name": "../kube-system/x"},
            }}),
            rejected(format!(
                "spec.provider.secretsStoreCSI.nodePublishSecretRef.name: {}",
                DNS_SUBDOMAIN.message
            )),
        ),
        (
            "secretsStoreCSI timeout that is no duration",
            json!({"fake": null, "secretsStoreCSI": {"provider": "gcp", "timeout": "soon"}}),
            rejected(format!(
                "spec.provider.secretsStoreCSI.timeout: {}",
                DURATION.message
            )),
        ),
        (
            "secretsStoreCSI with too many audiences",
            json!({"fake": null, "secretsStoreCSI": {"provider": "gcp", "audiences": vec!["a"; 9]}}),
            rejected(format!(
                "spec.provider.secretsStoreCSI.audiences: {}",
                rules::too_many_items(rules::MAX_AUDIENCES)
            )),
        ),
        (
            "secretsStoreCSI provider name too long",
            json!({"fake": null, "secretsStoreCSI": {"provider": "a".repeat(31)}}),
            rejected(format!(
                "spec.provider.secretsStoreCSI.provider: {}",
                SECRETS_STORE_PROVIDER.message
            )),
        ),
        (
            "no provider",
            json!({"fake": null}),
            rejected("spec: must set exactly one of provider, providerRef"),
        ),
        (
            "two providers",
            json!({"kubernetes": {}}),
            rejected(
                "spec.provider: must set exactly one of aws, vault, kubernetes, fake, plugin, secretsStoreCSI",
            ),
        ),
        (
            "aws ParameterStore",
            json!({"fake": null, "aws": {"region": "eu-west-1", "service": "ParameterStore"}}),
            Expect::Valid,
        ),
        (
            "aws another service",
            json!({"fake": null, "aws": {"region": "eu-west-1", "service": "Vault"}}),
            rejected("spec.provider.aws.service: must be SecretsManager or ParameterStore"),
        ),
        (
            "aws with two auth methods",
            aws(json!({"jwt": {}, "agentIdentity": {}})),
            rejected(
                "spec.provider.aws.auth: must set at most one of secretRef, jwt, agentIdentity",
            ),
        ),
        (
            "vault without auth method",
            vault(json!({})),
            rejected(
                "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, \
                 jwt, appRole, userPass, cert, iam",
            ),
        ),
        (
            "vault iam",
            vault(json!({"iam": {"vaultRole": "shop", "role": "arn:aws:iam::1:role/r"}})),
            Expect::Valid,
        ),
        (
            "vault iam and jwt",
            vault(json!({"iam": {"vaultRole": "shop", "role": "r"}, "jwt": {"role": "a"}})),
            rejected(
                "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, \
                 jwt, appRole, userPass, cert, iam",
            ),
        ),
        (
            "vault with two auth methods",
            vault(json!({"kubernetes": {"role": "a"}, "tokenSecretRef": secret})),
            rejected(
                "spec.provider.vault.auth: must set exactly one of tokenSecretRef, kubernetes, \
                 jwt, appRole, userPass, cert, iam",
            ),
        ),
        (
            "vault kv v3",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "version": "v3", "auth": {"jwt": {"role": "app"}}
            }}),
            rejected("spec.provider.vault.version: must be v1 or v2"),
        ),
        (
            "aws static keys with a session token",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": secret, "secretAccessKeySecretRef": secret,
                "sessionTokenSecretRef": {"name": "aws.session-1", "key": "t"},
            }})),
            Expect::Valid,
        ),
        (
            "aws access key id in a badly named Secret",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": bad_secret, "secretAccessKeySecretRef": secret
            }})),
            bad_name("aws.auth.secretRef.accessKeyIDSecretRef"),
        ),
        (
            "aws secret access key in a badly named Secret",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": secret,
                "secretAccessKeySecretRef": {"name": "Creds", "key": "k"},
            }})),
            bad_name("aws.auth.secretRef.secretAccessKeySecretRef"),
        ),
        (
            "aws session token in a badly named Secret",
            aws(json!({"secretRef": {
                "accessKeyIDSecretRef": secret, "secretAccessKeySecretRef": secret,
                "sessionTokenSecretRef": {"name": "a_b", "key": "t"},
            }})),
            bad_name("aws.auth.secretRef.sessionTokenSecretRef"),
        ),
        (
            "vault token in a badly named Secret",
            vault(json!({"tokenSecretRef": {"name": "vault token", "key": "t"}})),
            bad_name("vault.auth.tokenSecretRef"),
        ),
        (
            "plugin TLS on a unix socket",
            json!({"fake": null, "plugin": {
                "endpoint": "unix:///var/run/latchkey/plugins/files.sock",
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----"},
            }}),
            rejected(
                "spec.provider.plugin: tls is only for a host:port endpoint; a unix socket needs \
                 no TLS",
            ),
        ),
        (
            "plugin client certificate in a badly named Secret",
            json!({"fake": null, "plugin": {
                "endpoint": "p:4000",
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----", "clientCertSecretRef": {"name": "Client"}},
            }}),
            bad_name("plugin.tls.clientCertSecretRef"),
        ),
        (
            "vault CA in a badly named ConfigMap",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "auth": {"jwt": {"role": "app"}},
                "caProvider": {"type": "ConfigMap", "name": "-x", "key": "ca.crt"},
            }}),
            bad_name("vault.caProvider"),
        ),
        (
            "vault CA in a Secret",
            json!({"fake": null, "vault": {
                "server": "https://vault:8200", "auth": {"jwt": {"role": "app"}},
                "caProvider": {"type": "Secret", "name": "ca", "key": "ca.crt"},
            }}),
            Expect::Valid,
        ),
        (
            "plugin CA from a ConfigMap",
            json!({"fake": null, "plugin": {
                "endpoint": "p:4000",
                "tls": {"caProvider": {"type": "ConfigMap", "name": "ca", "key": "ca.crt"}},
            }}),
            Expect::Valid,
        ),
        (
            "plugin CA in a badly named ConfigMap",
            json!({"fake": null, "plugin": {
                "endpoint": "p:4000",
                "tls": {"caProvider": {"type": "ConfigMap", "name": "-x", "key": "ca.crt"}},
            }}),
            bad_name("plugin.tls.caProvider"),
        ),
        (
            "plugin CA both inline and from a ConfigMap",
            json!({"fake": null, "plugin": {
                "endpoint": "p:4000",
                "tls": {
                    "caBundle": "-----BEGIN CERTIFICATE-----",
                    "caProvider": {"type": "ConfigMap", "name": "ca", "key": "ca.crt"},
                },
            }}),
            rejected("spec.provider.plugin.tls: must set exactly one of caBundle, caProvider"),
        ),
        (
            "plugin TLS without a CA",
            json!({"fake": null, "plugin": {"endpoint": "p:4000", "tls": {}}}),
            rejected("spec.provider.plugin.tls: must set exactly one of caBundle, caProvider"),
        ),
        (
            "vault approle secret id in a badly named Secret",
            vault(json!({"appRole": {"roleId": "id", "secretRef": {"name": "-x", "key": "k"}}})),
            bad_name("vault.auth.appRole.secretRef"),
        ),
        (
            "vault userpass password in a badly named Secret",
            vault(json!({"userPass": {"username": "u", "secretRef": {"name": "-x", "key": "k"}}})),
            bad_name("vault.auth.userPass.secretRef"),
        ),
        (
            "vault cert key in a badly named Secret",
            vault(json!({"cert": {
                "clientCert": {"name": "c", "key": "k"},
                "secretRef": {"name": "-x", "key": "k"},
            }})),
            bad_name("vault.auth.cert.secretRef"),
        ),
        (
            "vault cert client certificate in a badly named Secret",
            vault(json!({"cert": {
                "clientCert": {"name": "-x", "key": "k"},
                "secretRef": {"name": "k", "key": "k"},
            }})),
            bad_name("vault.auth.cert.clientCert"),
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
            &expect,
            &mut broken,
        );
    }
    for (name, patch, expect) in provider_samples()
        .into_iter()
        .chain(kubernetes::provider_samples())
    {
        for kind in ["SecretStore", "ClusterSecretStore"] {
            let expect = match (kind, name) {
                ("SecretStore", "aws agent identity") => rejected(
                    "spec: provider.aws.auth.agentIdentity (the node agent's own AWS identity) \
                     is only allowed on a ClusterSecretStore",
                ),
                _ => expect.clone(),
            };
            let mut object = store_base(kind);
            merge(&mut object["spec"]["provider"], &patch);
            if kind == "SecretStore" {
                agree::<SecretStore>(
                    &schemas,
                    kind,
                    name,
                    object,
                    |s| {
                        providers::store(
                            &s.spec.provider,
                            s.spec.provider_ref.as_ref(),
                            StoreKind::SecretStore,
                        )
                    },
                    &expect,
                    &mut broken,
                );
            } else {
                agree::<ClusterSecretStore>(
                    &schemas,
                    kind,
                    name,
                    object,
                    |s| {
                        providers::store(
                            &s.spec.provider,
                            s.spec.provider_ref.as_ref(),
                            StoreKind::ClusterSecretStore,
                        )
                    },
                    &expect,
                    &mut broken,
                );
            }
        }
    }
    generators::check_every_sample(&schemas, &mut broken);
    cluster_external_secret::check_every_sample(&schemas, external_secret_samples(), &mut broken);
    push_secret::check_every_sample(&schemas, &mut broken);
    providers::check_every_sample(&schemas, &mut broken);
    // Every rule and pattern of every CRD was broken by some sample (one nobody breaks is
    // untested).
    for (kind, schema) in &schemas {
        let mut every = BTreeSet::new();
        all_rules(schema, "", true, &mut every);
        // A GeneratorState is written by the agent and the controller, never by hand: its
        // fields are the agent's own records (kept as written), with nothing to check.
        const KINDS_WITHOUT_RULES: [&str; 1] = ["GeneratorState"];
        assert_eq!(
            every.is_empty(),
            KINDS_WITHOUT_RULES.contains(&kind.as_str()),
            "{kind}: rules {every:?}"
        );
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
        &rejected("spec.target.files.items[0].mode: must be a file mode between 0 and 0777 (511)"),
        &mut broken,
    );
    assert_eq!(broken.len(), 1, "{broken:?}");
}

/// The provider kinds' schemas (issue #41), named `Vault` or `Vault (cluster)`.
fn provider_schemas() -> Vec<(String, Value)> {
    crate::api::provider_kinds::crds()
        .into_iter()
        .map(|(kind, crd)| {
            let cluster = crd.spec.scope == "Cluster";
            let name = if cluster {
                format!("{} (cluster)", kind.name())
            } else {
                kind.name().to_string()
            };
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            (name, schema["openAPIV3Schema"].clone())
        })
        .collect()
}

#[test]
fn rules_stay_cheap_for_the_api_server() {
    // Rules test presence and sizes, a regular expression only runs over a short bounded string,
    // and no rule iterates a list: the API server's cost estimate then only grows with the bound
    // of the lists above a rule, which are all bounded. (`pattern`s cost no CEL budget.) The
    // provider kinds too, whose rules are the inline blocks' one level up, plus their own.
    let every_kind = schemas().into_iter().chain(provider_schemas());
    let mut provider_rules = 0;
    for (kind, schema) in every_kind {
        let mut every = BTreeSet::new();
        all_rules(&schema, "", false, &mut every);
        if kind.starts_with("Vault") {
            provider_rules += every.len();
        }
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
            if rule.contains(".matches(") {
                assert!(
                    node["maxLength"].as_u64().is_some_and(|max| max <= 256),
                    "{kind} {path}: {rule:?} runs a regular expression over an unbounded string"
                );
            }
        }
    }
    assert!(
        provider_rules > 0,
        "no rule of the Vault provider kinds was checked"
    )
}

#[test]
fn patterns_stay_in_the_syntax_every_reader_shares() {
    let text = render_all().unwrap();
    for pattern in rules::PATTERNS {
        let re = pattern.regex;
        assert!(Regex::new(re).is_ok(), "{re}: does not compile");
        assert!(
            pattern.is_match("0") || !pattern.is_match(""),
            "{re}: not compiled"
        );
        // `pattern` matches anywhere unless anchored.
        assert!(
            re.starts_with('^') && re.ends_with('$'),
            "{re}: not anchored"
        );
        assert!(
            text.contains(&format!("pattern: {re}\n"))
                || text.contains(&format!("pattern: '{re}'")),
            "{re}: not used by any CRD"
        );
        let mut counted = 0;
        let mut chars = re.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                // ECMA-262 and RE2 disagree on \d, \s, \w, \b, \p and friends.
                '\\' => match chars.next() {
                    Some('.' | '\\') => {}
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        assert!(
                            hex.len() == 2 && hex.chars().all(|h| h.is_ascii_hexdigit()),
                            "{re}: \\x needs two hex digits"
                        );
                    }
                    other => panic!("{re}: escape {other:?} is not read alike everywhere"),
                },
                // Lookaround, named and non-capturing groups and flags are not RE2 or not ECMA.
                '(' => assert_ne!(chars.peek(), Some(&'?'), "{re}: (? group"),
                '[' => assert_ne!(chars.peek(), Some(&':'), "{re}: POSIX class"),
                '{' => {
                    counted += 1;
                    let body: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let (min, max) = body.split_once(',').expect("{m,n}");
                    let (min, max): (u32, u32) = (min.parse().unwrap(), max.parse().unwrap());
                    assert!(min <= max && max <= 1000, "{re}: RE2 counts up to 1000");
                    assert_ne!(chars.peek(), Some(&'?'), "{re}: lazy repetition");
                }
                '*' | '+' | '?' => assert_ne!(chars.peek(), Some(&'?'), "{re}: lazy repetition"),
                _ => {}
            }
        }
        // RE2 refuses nested counts whose product exceeds 1000; one count cannot nest.
        assert!(counted <= 1, "{re}: more than one counted repetition");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The path pattern (with `maxLength`) admits exactly the shapes `FilePath` does; only its
    /// byte limits are beyond a regular expression, and the agent keeps them when it writes.
    #[test]
    fn the_path_pattern_is_what_file_path_admits(
        raw in prop_oneof![
            hostile_path(),
            "[a-z./]{0,40}",
            // Around the segment count limit, with and without broken segments.
            prop::collection::vec("[a-z][a-z.]{0,2}", 14..19).prop_map(|s| s.join("/")),
            prop::collection::vec("[a-z.]{0,3}", 1..20).prop_map(|s| s.join("/")),
            any::<String>(),
        ],
    ) {
        let schema = FILE_PATH.is_match(&raw) && raw.chars().count() <= rules::MAX_FILE_PATH_LEN;
        match FilePath::parse(&raw) {
            Ok(_) => prop_assert!(schema, "{:?}: FilePath admits what the schema refuses", raw),
            Err(e) if matches!(e.reason, Reason::SegmentTooLong(_) | Reason::TooLong(_)) => {}
            Err(e) => {
                prop_assert!(!schema, "{:?}: the schema admits what FilePath refuses: {}", raw, e)
            }
        }
    }

    /// The name pattern (with `maxLength`) is `is_dns_subdomain`, which the agent checks names
    /// with before they reach a request path.
    #[test]
    fn the_name_pattern_is_is_dns_subdomain(
        raw in prop_oneof![
            "[a-z0-9.-]{0,12}",
            "[a-zA-Z0-9._/ -]{0,8}",
            "[a-z.]{250,256}",
            any::<String>(),
        ],
    ) {
        let schema = DNS_SUBDOMAIN.is_match(&raw) && raw.chars().count() <= rules::MAX_NAME_LEN;
        prop_assert_eq!(schema, crate::identity::is_dns_subdomain(&raw), "{:?}", raw);
    }

    /// Everything the duration pattern admits, Go (the API server's `duration()`) parses as a
    /// non-negative duration, and so does the agent, with the same parser ([`duration::parse`]);
    /// what the pattern refuses beyond that are only Go's rarer forms (signs, `.5h`, `5.h`,
    /// Greek mu). The pieces are too short to overflow; beyond that the pattern admits more than
    /// Go can count, and the `duration()` rule fails on it (see the sample "refresh beyond what
    /// Go can count").
    #[test]
    fn the_duration_pattern_is_what_go_and_the_agent_read(text in duration_text()) {
        let agent = duration::parse(&text);
        let pattern = DURATION.is_match(&text);
        if pattern {
            prop_assert!(agent.is_some(), "{:?}: admitted, but the agent cannot read it", text);
        } else if agent.is_some() {
            // A sign, Greek mu, a fraction of a nanosecond, or a '.' without a digit on each side.
            let chars: Vec<char> = text.chars().collect();
            let bare_dot = chars.iter().enumerate().any(|(i, c)| {
                *c == '.'
                    && !(i > 0
                        && chars[i - 1].is_ascii_digit()
                        && chars.get(i + 1).is_some_and(char::is_ascii_digit))
            });
            let fractional_ns = Regex::new(r"\.[0-9]+ns").unwrap().is_match(&text);
            let rare = text.starts_with(['+', '-'])
                || text.contains('\u{3bc}')
                || bare_dot
                || fractional_ns;
            prop_assert!(rare, "{:?}: Go reads it ({:?}) but the pattern refuses it", text, agent);
        }
    }
}

/// Path-like strings built from pieces that hit every rule of [`FilePath`].
fn hostile_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("\0".to_owned()),
        Just("\\".to_owned()),
        Just("\n".to_owned()),
        Just("\u{7f}".to_owned()),
        Just("\u{85}".to_owned()),
        Just("\u{a0}".to_owned()),
        Just("\u{202e}".to_owned()),
        Just("é".to_owned()),
        Just("💥".to_owned()),
        "[a-z]{1,4}",
        "[a-z]{250,256}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// Duration-like strings: components (a number, a unit) from the forms where Go and other
/// parsers differ, sometimes with a sign or spaces.
fn duration_text() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        Just(""),
        Just("0"),
        Just("1"),
        Just("15"),
        Just("1.5"),
        Just(".5"),
        Just("5."),
        Just("0.25"),
    ];
    let unit = prop_oneof![
        Just(""),
        Just("h"),
        Just("m"),
        Just("s"),
        Just("ms"),
        Just("us"),
        Just("\u{b5}s"),
        Just("\u{3bc}s"),
        Just("ns"),
        Just("d"),
        Just("y"),
        Just("M"),
        Just("min"),
        Just(" "),
    ];
    let sign = prop_oneof![Just(""), Just(""), Just("-"), Just("+"), Just(" ")];
    (sign, prop::collection::vec((number, unit), 0..4)).prop_map(|(sign, parts)| {
        let body: String = parts.into_iter().map(|(n, u)| format!("{n}{u}")).collect();
        format!("{sign}{body}")
    })
}
