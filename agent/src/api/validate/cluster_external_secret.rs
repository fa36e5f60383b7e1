//! A ClusterExternalSecret: its ExternalSecret spec (checked as an ExternalSecret's, reported at
//! `spec.externalSecretSpec`), the name it gives, and the bounds of its namespace lists.

use super::Invalid;
use super::fields::{max_items, name, shaped};
use crate::api::cluster_external_secret::ClusterExternalSecretSpec;
use crate::api::rules;

/// Where the embedded ExternalSecret spec sits.
const SPEC: &str = "spec.externalSecretSpec";

/// Checks a ClusterExternalSecret spec for the rules the CRD schema also enforces.
pub fn cluster_external_secret(spec: &ClusterExternalSecretSpec) -> Result<(), Invalid> {
    super::external_secret(&spec.external_secret_spec).map_err(|Invalid(text)| {
        // The ExternalSecret's checks name paths from its own `spec`.
        Invalid(match text.strip_prefix("spec") {
            Some(rest) => format!("{SPEC}{rest}"),
            None => text,
        })
    })?;
    if let Some(es_name) = &spec.external_secret_name {
        name("spec.externalSecretName", es_name)?;
    }
    if let Some(meta) = &spec.external_secret_metadata {
        for (field, map) in [("labels", &meta.labels), ("annotations", &meta.annotations)] {
            if map.len() > rules::MAX_CES_METADATA {
                return Err(Invalid::schema(
                    format_args!("spec.externalSecretMetadata.{field}"),
                    rules::too_many_properties(rules::MAX_CES_METADATA),
                ));
            }
        }
    }
    max_items(
        "spec.namespaceSelectors",
        spec.namespace_selectors.len(),
        rules::MAX_NAMESPACE_SELECTORS,
    )?;
    max_items(
        "spec.namespaces",
        spec.namespaces.len(),
        rules::MAX_CES_NAMESPACES,
    )?;
    for (i, namespace) in spec.namespaces.iter().enumerate() {
        shaped(
            format_args!("spec.namespaces[{i}]"),
            namespace,
            rules::MAX_NAMESPACE_LEN,
            &rules::DNS_SUBDOMAIN,
        )?;
    }
    if let Some(text) = &spec.refresh_time {
        shaped(
            "spec.refreshTime",
            text,
            rules::MAX_DURATION_LEN,
            &rules::DURATION,
        )?;
    }
    Ok(())
}
