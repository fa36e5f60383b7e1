//! PushSecrets: every rule of the kind broken by a sample, the fields not supported refused by
//! both the CRD and the agent, and the clashes only the agent sees.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use super::{Expect, agree, merge, rejected};
use crate::api::push_metadata::MAX_TAGS;
use crate::api::push_secret::PushSecret;
use crate::api::rules::{self, DNS_SUBDOMAIN, DURATION};
use crate::api::validate;

fn base() -> Value {
    json!({
        "apiVersion": "latchkey.dev/v1alpha1",
        "kind": "PushSecret",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {
            "secretStoreRefs": [{"name": "aws-prod", "kind": "ClusterSecretStore"}],
            "selector": {"secret": {"name": "db-credentials"}},
            "data": [{"match": {"secretKey": "password",
                                "remoteRef": {"remoteKey": "prod/db", "property": "password"}}}],
        }
    })
}

/// Checks every PushSecret sample.
pub(super) fn check_every_sample(
    schemas: &HashMap<String, Value>,
    broken: &mut BTreeSet<(String, String)>,
) {
    let rule = |path: &str, r: &rules::CelRule| rejected(format!("{path}: {}", r.message));
    let name_rule = |path: &str| rejected(format!("{path}: {}", DNS_SUBDOMAIN.message));
    let entry = |key: &str, remote: &str, property: Option<&str>| {
        json!({"match": {"secretKey": key,
                         "remoteRef": {"remoteKey": remote, "property": property}}})
    };
    let stores: Vec<Value> = (0..=rules::MAX_PUSH_STORES)
        .map(|i| json!({"name": format!("s{i}")}))
        .collect();
    let data: Vec<Value> = (0..=rules::MAX_PUSH_DATA)
        .map(|i| entry("k", "prod/db", Some(&format!("p{i}"))))
        .collect();
    let long = "k".repeat(rules::MAX_REMOTE_KEY_LEN + 1);
    let template_keys: serde_json::Map<String, Value> = (0..=rules::MAX_TEMPLATE_KEYS)
        .map(|i| (format!("k{i}"), json!("secret.password")))
        .collect();
    let big_selector: serde_json::Map<String, Value> = (0..=rules::MAX_PUSH_SELECTOR_TERMS)
        .map(|i| (format!("l{i}"), json!("x")))
        .collect();
    let with_meta_at = |key: &str, remote: &str, spec: Value| {
        json!({"match": {"secretKey": key, "remoteRef": {"remoteKey": remote, "property": key}},
               "metadata": {"apiVersion": "kubernetes.external-secrets.io/v1alpha1",
                            "kind": "PushSecretMetadata", "spec": spec}})
    };
    let with_meta = |spec: Value| with_meta_at("password", "prod/db", spec);
    let many_tags: serde_json::Map<String, Value> = (0..=MAX_TAGS)
        .map(|i| (format!("t{i}"), json!("x")))
        .collect();
    let samples = [
        (
            "every field set",
            json!({"spec": {"refreshInterval": "10m", "updatePolicy": "IfNotExists",
                            "deletionPolicy": "Delete", "serviceAccountName": "pusher",
                            "data": [entry("password", "prod/db", Some("password")),
                                     entry("user", "prod/db", Some("user")),
                                     entry("cert", "prod/cert", None)]}}),
            Expect::Valid,
        ),
        (
            "no store",
            json!({"spec": {"secretStoreRefs": []}}),
            rule("spec", &rules::PUSH_STORES_AND_DATA),
        ),
        (
            "no data",
            json!({"spec": {"data": []}}),
            rule("spec", &rules::PUSH_STORES_AND_DATA),
        ),
        (
            "a template",
            json!({"spec": {"template": {"mergePolicy": "Merge",
                                         "metadata": {"labels": {}, "annotations": {}},
                                         "data": {"url": "'db://%s'.format([secret.password])"}},
                            "data": [entry("url", "prod/db", Some("url"))]}}),
            Expect::Valid,
        ),
        (
            "a Go template engine",
            json!({"spec": {"template": {"engineVersion": "v2", "data": {"x": "{{ .p }}"}}}}),
            rule("spec.template", &rules::PUSH_TEMPLATE_CEL),
        ),
        (
            "templates from a ConfigMap",
            json!({"spec": {"template": {"templateFrom": [{"configMap": {"name": "t"}}]}}}),
            rule("spec.template", &rules::PUSH_TEMPLATE_CEL),
        ),
        (
            "a template with a Secret type",
            json!({"spec": {"template": {"type": "kubernetes.io/tls"}}}),
            rule("spec.template", &rules::PUSH_TEMPLATE_NO_SECRET_FIELDS),
        ),
        (
            "a template with labels",
            json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}}}}),
            rule("spec.template", &rules::PUSH_TEMPLATE_NO_SECRET_FIELDS),
        ),
        (
            "a template with annotations",
            json!({"spec": {"template": {"metadata": {"annotations": {"a": "b"}}}}}),
            rule("spec.template", &rules::PUSH_TEMPLATE_NO_SECRET_FIELDS),
        ),
        (
            "too many template keys",
            json!({"spec": {"template": {"data": template_keys}}}),
            rejected(format!(
                "spec.template.data: {}",
                rules::too_many_properties(rules::MAX_TEMPLATE_KEYS)
            )),
        ),
        (
            "a generator source",
            json!({"spec": {"selector": {"secret": null,
                                         "generatorRef": {"kind": "Password", "name": "pw"}}}}),
            Expect::Valid,
        ),
        (
            "a ClusterGenerator source",
            json!({"spec": {"selector": {"secret": null,
                "generatorRef": {"apiVersion": "generators.latchkey.dev/v1alpha1",
                                 "kind": "ClusterGenerator", "name": "pw"}}}}),
            Expect::Valid,
        ),
        (
            "a generator beside the secret",
            json!({"spec": {"selector": {"generatorRef": {"kind": "Password", "name": "pw"}}}}),
            rule("spec.selector", &rules::PUSH_ONE_SOURCE),
        ),
        (
            "no source",
            json!({"spec": {"selector": {"secret": null}}}),
            rule("spec.selector", &rules::PUSH_ONE_SOURCE),
        ),
        (
            "a generator of an unknown kind",
            json!({"spec": {"selector": {"secret": null,
                                         "generatorRef": {"kind": "Secret", "name": "pw"}}}}),
            rejected(format!(
                "spec.selector.generatorRef.kind: {}",
                rules::GENERATOR_KIND.message
            )),
        ),
        (
            "a generator with a bad name",
            json!({"spec": {"selector": {"secret": null,
                                         "generatorRef": {"kind": "Password", "name": "../pw"}}}}),
            name_rule("spec.selector.generatorRef.name"),
        ),
        (
            "stores by label",
            json!({"spec": {"secretStoreRefs": [
                {"name": "a"},
                {"labelSelector": {"matchLabels": {"push": "yes"}}},
                {"kind": "ClusterSecretStore", "labelSelector": {"matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a", "b"]},
                    {"key": "old", "operator": "DoesNotExist"}]}},
                {"kind": "ClusterSecretStore", "labelSelector": {}}]}}),
            Expect::Valid,
        ),
        (
            "a store by name and label",
            json!({"spec": {"secretStoreRefs": [
                {"name": "a", "labelSelector": {"matchLabels": {"push": "yes"}}}]}}),
            rule("spec.secretStoreRefs[0]", &rules::PUSH_STORE_BY_NAME),
        ),
        (
            "a store ref with neither name nor label",
            json!({"spec": {"secretStoreRefs": [{"kind": "SecretStore"}]}}),
            rule("spec.secretStoreRefs[0]", &rules::PUSH_STORE_BY_NAME),
        ),
        (
            "a selector with an unknown operator",
            json!({"spec": {"secretStoreRefs": [{"labelSelector": {"matchExpressions": [
                {"key": "tier", "operator": "Matches", "values": ["a"]}]}}]}}),
            Expect::AgentOnly(
                "spec.secretStoreRefs[0].labelSelector.matchExpressions[0].operator: must be"
                    .into(),
            ),
        ),
        (
            "a selector requirement without values",
            json!({"spec": {"secretStoreRefs": [{"labelSelector": {"matchExpressions": [
                {"key": "tier", "operator": "NotIn"}]}}]}}),
            Expect::AgentOnly(
                "spec.secretStoreRefs[0].labelSelector.matchExpressions[0]: In and NotIn need"
                    .into(),
            ),
        ),
        (
            "a selector too large to match cheaply",
            json!({"spec": {"secretStoreRefs": [{"labelSelector": {"matchLabels": big_selector}}]}}),
            Expect::AgentOnly("spec.secretStoreRefs[0].labelSelector: more than".into()),
        ),
        (
            "an empty store name",
            json!({"spec": {"secretStoreRefs": [{"name": ""}]}}),
            rule("spec.secretStoreRefs[0].name", &rules::NOT_EMPTY),
        ),
        (
            "a bad store name",
            json!({"spec": {"secretStoreRefs": [{"name": "Prod"}]}}),
            name_rule("spec.secretStoreRefs[0].name"),
        ),
        (
            "a bad source name",
            json!({"spec": {"selector": {"secret": {"name": "../db"}}}}),
            name_rule("spec.selector.secret.name"),
        ),
        (
            "a bad service account",
            json!({"spec": {"serviceAccountName": "A"}}),
            name_rule("spec.serviceAccountName"),
        ),
        (
            "an empty secret key",
            json!({"spec": {"data": [entry("", "prod/db", None)]}}),
            rule("spec.data[0].match.secretKey", &rules::NOT_EMPTY),
        ),
        (
            "an empty remote key",
            json!({"spec": {"data": [entry("k", "", None)]}}),
            rule("spec.data[0].match.remoteRef.remoteKey", &rules::NOT_EMPTY),
        ),
        (
            "an empty property",
            json!({"spec": {"data": [entry("k", "prod/db", Some(""))]}}),
            rule("spec.data[0].match.remoteRef.property", &rules::NOT_EMPTY),
        ),
        (
            "a remote key too long",
            json!({"spec": {"data": [entry("k", &long, None)]}}),
            rejected(format!(
                "spec.data[0].match.remoteRef.remoteKey: {}",
                rules::too_long(rules::MAX_REMOTE_KEY_LEN)
            )),
        ),
        (
            "a refreshInterval that is no duration",
            json!({"spec": {"refreshInterval": "1 hour"}}),
            rejected(format!("spec.refreshInterval: {}", DURATION.message)),
        ),
        (
            "a refreshInterval over a year",
            json!({"spec": {"refreshInterval": "8761h"}}),
            rule("spec.refreshInterval", &rules::REFRESH_INTERVAL_MAX),
        ),
        (
            "too many stores",
            json!({"spec": {"secretStoreRefs": stores}}),
            rejected(format!(
                "spec.secretStoreRefs: {}",
                rules::too_many_items(rules::MAX_PUSH_STORES)
            )),
        ),
        (
            "too many entries",
            json!({"spec": {"data": data}}),
            rejected(format!(
                "spec.data: {}",
                rules::too_many_items(rules::MAX_PUSH_DATA)
            )),
        ),
        (
            "one store twice",
            json!({"spec": {"secretStoreRefs": [{"name": "a"}, {"name": "a"}]}}),
            Expect::AgentOnly("spec.secretStoreRefs[1]: duplicates".into()),
        ),
        (
            "one property twice",
            json!({"spec": {"data": [entry("a", "prod/db", Some("p")),
                                     entry("b", "prod/db", Some("p"))]}}),
            Expect::AgentOnly("spec.data[1].match.remoteRef: writes the same remote key".into()),
        ),
        (
            "a whole secret and a property of it",
            json!({"spec": {"data": [entry("a", "prod/db", Some("p")),
                                     entry("b", "prod/db", None)]}}),
            Expect::AgentOnly("spec.data[1].match.remoteRef: writes the same remote key".into()),
        ),
        (
            "metadata for every provider",
            json!({"spec": {"data": [with_meta(json!({
                "tags": {"team": "shop"}, "description": "d", "kmsKeyId": "alias/k",
                "secretPushFormat": "string", "customMetadata": {"owner": "shop"},
                "mergePolicy": "Replace", "labels": {"app": "shop"}, "annotations": {"a": "b"},
                "sourceMergePolicy": "Replace", "targetMergePolicy": "Ignore",
                "remoteNamespace": "shop"}))]}}),
            Expect::Valid,
        ),
        (
            "too many tags",
            json!({"spec": {"data": [with_meta(json!({"tags": many_tags}))]}}),
            rejected(format!(
                "spec.data[0].metadata.spec.tags: {}",
                rules::too_many_properties(MAX_TAGS)
            )),
        ),
        (
            "a tag that is Latchkey's mark",
            json!({"spec": {"data": [with_meta(json!({"tags": {"managed-by": "me"}}))]}}),
            Expect::AgentOnly("spec.data[0].metadata.spec.tags: \"managed-by\" is Latchkey's mark".into()),
        ),
        (
            "a label that is Latchkey's mark",
            json!({"spec": {"data": [with_meta(json!({"labels": {"app.kubernetes.io/managed-by": "me"}}))]}}),
            Expect::AgentOnly("spec.data[0].metadata.spec.labels: \"app.kubernetes.io/managed-by\" is Latchkey's mark".into()),
        ),
        (
            "a resource policy",
            json!({"spec": {"data": [with_meta(json!({"resourcePolicy": {}}))]}}),
            Expect::AgentOnly("spec.data[0].metadata.spec.resourcePolicy is not supported".into()),
        ),
        (
            "copying the source Secret's labels",
            json!({"spec": {"data": [with_meta(json!({"sourceMergePolicy": "Merge"}))]}}),
            Expect::AgentOnly("spec.data[0].metadata.spec.sourceMergePolicy: Merge".into()),
        ),
        (
            "two settings for one remote secret",
            json!({"spec": {"data": [
                with_meta_at("a", "prod/db", json!({"tags": {"t": "1"}})),
                with_meta_at("b", "prod/db", json!({"tags": {"t": "2"}}))]}}),
            Expect::AgentOnly("spec.data[1].metadata: differs from spec.data[0].metadata".into()),
        ),
        (
            "settings on one entry of a remote secret",
            json!({"spec": {"data": [
                with_meta_at("a", "prod/db", json!({"tags": {"t": "1"}})),
                entry("b", "prod/db", Some("b"))]}}),
            Expect::Valid,
        ),
    ];
    for (name, patch, expect) in &samples {
        let mut object = base();
        merge(&mut object, patch);
        agree::<PushSecret>(
            schemas,
            "PushSecret",
            name,
            object,
            |p| validate::push_secret(&p.spec),
            expect,
            broken,
        );
    }
}
