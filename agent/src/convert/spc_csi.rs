//! A SecretProviderClass of a provider Latchkey has no native conversion for (azure, gcp,
//! akeyless, conjur, ...) -> a `secretsStoreCSI` store that calls the provider pod already
//! running on each node, with the class's parameters unchanged, and an ExternalSecret mounting
//! every file the provider returns.

use std::collections::BTreeMap;

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::spc_objects::{Converted, class_external_secret, class_store, volume_snippet};
use crate::api::external_secret::{DataFrom, FindName, FindRef};
use crate::api::store::{SecretsStoreCsiProvider, StoreProvider};

/// Matches every file: the driver mounts everything the provider returns.
const EVERY_FILE: &str = ".*";

/// Converts a class of provider `provider` (a valid provider name); `params` are its
/// `spec.parameters`, `spec` the rest of its spec.
pub fn convert(
    provider: &str,
    spec: &mut Fields<'_>,
    params: &mut Fields<'_>,
    meta: &Meta,
    notes: &mut Notes,
) -> Result<Converted, String> {
    let mut parameters = BTreeMap::new();
    for key in params.keys() {
        if key.starts_with(crate::identity::POD_INFO_PREFIX) {
            params.drop_field(
                &key,
                notes,
                "is one of the pod's attributes, which Latchkey sets itself; not carried over",
            );
        } else if let Some(value) = params.string(&key, notes) {
            parameters.insert(key, value);
        }
    }
    params.finish(notes);
    spec.drop_field(
        "secretObjects",
        notes,
        "Latchkey's mirror controller cannot call a Secrets Store CSI Driver provider (its pods \
         serve the volumes of their own node), so no Secret is synced; not carried over",
    );
    spec.finish(notes);

    let csi = SecretsStoreCsiProvider {
        provider: provider.to_string(),
        parameters,
        audiences: Vec::new(),
        timeout: None,
        node_publish_secret_ref: None,
    };
    crate::api::validate::plugin::secrets_store_csi(&csi).map_err(|e| e.to_string())?;
    notes.warn(
        "spec.provider",
        format!(
            "no native conversion: the store calls the {} provider pod already running on each \
             node, on its socket {provider}.sock in the agent's --secrets-store-provider-dir \
             (docs/providers.md#secretsstorecsi); it must return its files in the Mount response \
             rather than write them itself (current providers do; one that writes them is refused)",
            quoted(provider)
        ),
    );
    notes.warn(
        "",
        "spec.provider.secretsStoreCSI.audiences is left empty: the driver takes the token \
         audiences from its CSIDriver's tokenRequests, not from the class; list in it those your \
         provider needs (Azure workload identity: api://AzureADTokenExchange) and add each to the \
         csi.latchkey.dev CSIDriver's tokenRequests",
    );
    notes.warn(
        "",
        "a SecretProviderClass does not show whether pods set nodePublishSecretRef (it is on \
         the pod's CSI volume): if they do, the provider needs that Secret's credentials: set \
         spec.provider.secretsStoreCSI.nodePublishSecretRef: {name: <the Secret>} on the store \
         (a Secret in the store's namespace, read as the pod)",
    );

    let name = meta.name.as_str();
    let store = class_store(
        meta,
        name,
        StoreProvider {
            secrets_store_csi: Some(csi),
            ..Default::default()
        },
    );
    let every_file = DataFrom {
        source_ref: None,
        find: Some(FindRef {
            name: Some(FindName {
                regexp: EVERY_FILE.to_string(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let es = class_external_secret(meta, name, name, Vec::new(), vec![every_file], None);
    Ok(Converted {
        documents: vec![
            Document::SecretStore(Box::new(store)),
            Document::ExternalSecret(Box::new(es)),
        ],
        trailer: volume_snippet(name, &[name.to_string()], true),
    })
}
