//! Tenancy for generators: a namespaced generator is looked up only in the ExternalSecret's
//! namespace; a ClusterGenerator must admit the namespace through its `conditions`, with the
//! same rule as a ClusterSecretStore.

use super::binding::admits;
use super::{BindingError, Catalog};
use crate::api::external_secret::GeneratorRef;
use crate::api::generator::GeneratorObject;

/// The generator `reference` names, as the pod of `namespace` (mounting `external_secret`) may
/// use it.
pub async fn bind_generator(
    catalog: &dyn Catalog,
    namespace: &str,
    external_secret: &str,
    reference: &GeneratorRef,
) -> Result<GeneratorObject, BindingError> {
    let catalog_err = |source| BindingError::Catalog {
        namespace: namespace.into(),
        external_secret: external_secret.into(),
        source,
    };
    let cluster = reference.kind == "ClusterGenerator";
    let found = catalog
        .generator(namespace, &reference.kind, &reference.name)
        .await
        .map_err(catalog_err)?
        .ok_or_else(|| BindingError::GeneratorNotFound {
            namespace: namespace.into(),
            external_secret: external_secret.into(),
            generator: reference.to_string(),
            hint: if cluster {
                ""
            } else {
                " (a generator must be in the ExternalSecret's namespace; a ClusterGenerator \
                 serves several)"
            },
        })?;
    if let GeneratorObject::Cluster(g) = &found {
        let labels = catalog
            .namespace_labels(namespace)
            .await
            .map_err(catalog_err)?;
        admits(&g.spec.conditions, namespace, &labels).map_err(|rule| {
            BindingError::GeneratorNotAdmitted {
                namespace: namespace.into(),
                external_secret: external_secret.into(),
                generator: reference.name.clone(),
                rule,
            }
        })?;
    }
    // A CRD rule is not a security boundary: the agent checks the generator as it reads it
    // (after admission, so a namespace it does not serve learns nothing of its fields).
    crate::api::validate::generator(&found).map_err(|reason| BindingError::InvalidGenerator {
        namespace: namespace.into(),
        external_secret: external_secret.into(),
        generator: reference.to_string(),
        reason,
    })?;
    Ok(found)
}
