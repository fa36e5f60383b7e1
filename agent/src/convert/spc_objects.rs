//! What the SecretProviderClass converters emit: the SecretStore and ExternalSecret of a class,
//! labelled as the class was, and the commented pod volume that replaces the CSI driver's.

use super::output::{Document, Meta};
use crate::api::external_secret::{DataFrom, ExternalSecretData, SecretStoreRef, Target};
use crate::api::store::{SecretStoreSpec, StoreProvider};
use crate::api::{ExternalSecret, ExternalSecretSpec, SecretStore, StoreKind};

/// What a SecretProviderClass becomes.
pub struct Converted {
    /// Stores and ExternalSecrets.
    pub documents: Vec<Document>,
    /// The commented pod volume to use instead of the CSI driver's.
    pub trailer: Vec<String>,
}

/// A SecretStore `name` converted from a class, labelled as the class was.
pub fn class_store(meta: &Meta, name: &str, provider: StoreProvider) -> SecretStore {
    let mut store = SecretStore::new(
        name,
        SecretStoreSpec {
            provider,
            provider_ref: None,
            push: None,
        },
    );
    store.metadata = meta.object_meta(name, true);
    store
}

/// An ExternalSecret `name` converted from a class, reading SecretStore `store`, labelled as the
/// class was.
pub fn class_external_secret(
    meta: &Meta,
    name: &str,
    store: &str,
    data: Vec<ExternalSecretData>,
    data_from: Vec<DataFrom>,
    target: Option<Target>,
) -> ExternalSecret {
    let mut es = ExternalSecret::new(
        name,
        ExternalSecretSpec {
            secret_store_ref: Some(SecretStoreRef {
                name: store.to_string(),
                kind: StoreKind::SecretStore,
            }),
            refresh_interval: None,
            data,
            data_from,
            target,
            service_account_name: None,
            refresh_policy: None,
        },
    );
    es.metadata = meta.object_meta(name, true);
    es
}

/// The commented pod volume(s) replacing `csi: {driver: secrets-store.csi.k8s.io, ...}`;
/// `provider_pod`: the store calls the class's provider pod (which may need the volume's
/// `nodePublishSecretRef`).
pub fn volume_snippet(class: &str, names: &[String], provider_pod: bool) -> Vec<String> {
    let c = super::output::COMMENT;
    let mut lines = vec![
        format!(
            "{c}in pods, replace the CSI volume with volumeAttributes.secretProviderClass: {class} by:"
        ),
        "#   volumes:".to_string(),
    ];
    for (i, name) in names.iter().enumerate() {
        let volume = if i == 0 {
            "secrets-store          # keep your volume's name and volumeMounts".to_string()
        } else {
            format!(
                "secrets-store-{}        # mount this one at its own path too",
                i + 1
            )
        };
        lines.extend([
            format!("#   - name: {volume}"),
            "#     csi:".to_string(),
            format!("#       driver: {}", crate::api::DRIVER_NAME),
            "#       readOnly: true                 # required: Latchkey volumes are read-only"
                .to_string(),
            "#       volumeAttributes:".to_string(),
            format!("#         {}: {name}", crate::api::ATTR_EXTERNAL_SECRET),
        ]);
    }
    lines.push(if provider_pod {
        "#   (no nodePublishSecretRef on the volume: set it on the store, \
         spec.provider.secretsStoreCSI.nodePublishSecretRef)"
            .to_string()
    } else {
        "#   (no nodePublishSecretRef: Latchkey authenticates with the pod's service account)"
            .to_string()
    });
    lines
}
