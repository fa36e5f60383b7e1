//! `latchkey convert --provider-refs`: every converted store's `spec.provider` block becomes a
//! provider object of its own (issue #41), named like the store and in its namespace (a
//! ClusterSecretStore's is cluster-scoped), and the store names it by `spec.providerRef`.
//! The block moves as it is: a provider object's `spec` is the inline block's type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::notes::Notes;
use super::output::{Document, ProviderDoc};
use crate::api::provider_kinds::ProviderKind;
use crate::api::store::{ProviderRef, StoreProvider};
use crate::api::validate;

/// Replaces each store of `documents` that has an inline block by its provider object and the
/// store naming it; other documents stay as they are. Says so in `notes`, with the CRD to install.
pub fn split(documents: Vec<Document>, notes: &mut Notes) -> Vec<Document> {
    let mut out = Vec::with_capacity(documents.len() * 2);
    for doc in documents {
        match doc {
            Document::SecretStore(mut s) => {
                let moved = take(&mut s.spec.provider, &s.metadata, false, notes);
                if let Some((provider, reference)) = moved {
                    s.spec.provider_ref = Some(reference);
                    out.push(Document::Provider(Box::new(provider)));
                }
                out.push(Document::SecretStore(s));
            }
            Document::ClusterSecretStore(mut s) => {
                let moved = take(&mut s.spec.provider, &s.metadata, true, notes);
                if let Some((provider, reference)) = moved {
                    s.spec.provider_ref = Some(reference);
                    out.push(Document::Provider(Box::new(provider)));
                }
                out.push(Document::ClusterSecretStore(s));
            }
            other => out.push(other),
        }
    }
    out
}

/// Moves the one block out of `provider` into a provider object, and the reference to it.
/// Leaves a store without exactly one block as it is (validation then reports it).
fn take(
    provider: &mut StoreProvider,
    store: &ObjectMeta,
    cluster: bool,
    notes: &mut Notes,
) -> Option<(ProviderDoc, ProviderRef)> {
    let block = {
        let mut blocks = validate::provider_blocks(provider);
        match (blocks.next(), blocks.next()) {
            (Some(block), None) => block.name(),
            _ => return None,
        }
    };
    let kind = ProviderKind::ALL
        .into_iter()
        .find(|k| k.block_name() == block)?;
    let name = store.name.clone().unwrap_or_default();
    let doc = ProviderDoc {
        kind,
        cluster,
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: if cluster {
                None
            } else {
                store.namespace.clone()
            },
            labels: store.labels.clone(),
            annotations: store.annotations.clone(),
            ..Default::default()
        },
        provider: std::mem::take(provider),
    };
    notes.warn(
        format!("spec.provider.{}", kind.block_name()),
        format!(
            "moved to the {} provider object {name:?} that spec.providerRef names; its CRD \
             must be installed (kubectl apply -k crds/providers/{}, or the chart's providers \
             value)",
            if cluster {
                format!("cluster-scoped {}", kind.name())
            } else {
                kind.name().to_string()
            },
            kind.file_stem()
        ),
    );
    let reference = ProviderRef {
        api_version: doc.api_version().to_string(),
        kind,
        name,
    };
    Some((doc, reference))
}
