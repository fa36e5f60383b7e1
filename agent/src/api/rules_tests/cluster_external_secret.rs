//! ClusterExternalSecrets: every ExternalSecret sample again, wrapped at
//! `spec.externalSecretSpec` where the same rules sit deeper, then the kind's own fields.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use super::{Expect, agree, merge, rejected};
use crate::api::cluster_external_secret::ClusterExternalSecret;
use crate::api::rules::{self, DNS_SUBDOMAIN, DURATION};
use crate::api::validate;

fn base() -> Value {
    json!({
        "apiVersion": "latchkey.dev/v1alpha1",
        "kind": "ClusterExternalSecret",
        "metadata": {"name": "db"},
        "spec": {
            "externalSecretSpec": {
                "secretStoreRef": {"name": "aws-prod", "kind": "ClusterSecretStore"},
                "data": [{"secretKey": "password", "remoteRef": {"key": "prod/db"}}],
            },
            "namespaceSelectors": [{"matchLabels": {"team": "shop"}}],
            "namespaces": ["shop-legacy"],
        }
    })
}

/// An ExternalSecret's verdict, with its paths moved under `spec.externalSecretSpec`.
fn deeper(expect: &Expect) -> Expect {
    let move_ = |text: &String| match text.strip_prefix("spec") {
        Some(rest) => format!("spec.externalSecretSpec{rest}"),
        None => text.clone(),
    };
    match expect {
        Expect::Valid => Expect::Valid,
        Expect::Rejected(t) => Expect::Rejected(move_(t)),
        Expect::AgentOnly(t) => Expect::AgentOnly(move_(t)),
        Expect::RejectedAs { agent, crd } => Expect::RejectedAs {
            agent: move_(agent),
            crd: move_(crd),
        },
    }
}

fn check(
    schemas: &HashMap<String, Value>,
    name: &str,
    patch: &Value,
    expect: &Expect,
    broken: &mut BTreeSet<(String, String)>,
) {
    let mut object = base();
    merge(&mut object, patch);
    agree::<ClusterExternalSecret>(
        schemas,
        "ClusterExternalSecret",
        name,
        object,
        |c| validate::cluster_external_secret(&c.spec),
        expect,
        broken,
    );
}

/// Every ExternalSecret sample (name, merge patch over the base ExternalSecret, verdict) as a
/// ClusterExternalSecret's spec, then the samples of the kind's own fields.
pub(super) fn check_every_sample(
    schemas: &HashMap<String, Value>,
    external_secret_samples: Vec<(&'static str, Value, Expect)>,
    broken: &mut BTreeSet<(String, String)>,
) {
    for (name, patch, expect) in external_secret_samples {
        // Samples that patch more than the spec (metadata) say nothing about the embedded spec.
        let Some(spec) = patch
            .as_object()
            .filter(|p| p.len() == 1)
            .and_then(|p| p.get("spec"))
        else {
            continue;
        };
        let wrapped = json!({"spec": {"externalSecretSpec": spec}});
        check(schemas, name, &wrapped, &deeper(&expect), broken);
    }
    let name_rule = |path: &str| rejected(format!("{path}: {}", DNS_SUBDOMAIN.message));
    let too_many =
        |path: &str, max: usize| rejected(format!("{path}: {}", rules::too_many_items(max)));
    let namespaces: Vec<String> = (0..=rules::MAX_CES_NAMESPACES)
        .map(|i| format!("ns-{i}"))
        .collect();
    let selectors: Vec<Value> = (0..=rules::MAX_NAMESPACE_SELECTORS)
        .map(|i| json!({"matchLabels": {"team": format!("t{i}")}}))
        .collect();
    let samples = [
        (
            "every field set",
            json!({"spec": {"externalSecretName": "db-es", "refreshTime": "30s",
                            "externalSecretMetadata": {"labels": {"a": "b"}}}}),
            Expect::Valid,
        ),
        (
            "a bad ExternalSecret name",
            json!({"spec": {"externalSecretName": "../db"}}),
            name_rule("spec.externalSecretName"),
        ),
        (
            "a bad namespace name",
            json!({"spec": {"namespaces": ["Shop"]}}),
            name_rule("spec.namespaces[0]"),
        ),
        (
            "a refreshTime that is no duration",
            json!({"spec": {"refreshTime": "1 minute"}}),
            rejected(format!("spec.refreshTime: {}", DURATION.message)),
        ),
        (
            "too many namespaces",
            json!({"spec": {"namespaces": namespaces}}),
            too_many("spec.namespaces", rules::MAX_CES_NAMESPACES),
        ),
        (
            "too many selectors",
            json!({"spec": {"namespaceSelectors": selectors}}),
            too_many("spec.namespaceSelectors", rules::MAX_NAMESPACE_SELECTORS),
        ),
    ];
    for (name, patch, expect) in &samples {
        check(schemas, name, patch, expect, broken);
    }
}
