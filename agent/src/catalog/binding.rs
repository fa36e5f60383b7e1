//! Tenancy: finds the ExternalSecret a pod names and the one store it may use. An ExternalSecret
//! is looked up only in the pod's namespace; a SecretStore must be in that same namespace; a
//! ClusterSecretStore must admit the namespace through its `conditions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use regex::Regex;

use super::{Catalog, CatalogError};
use crate::api::provider_kinds::{self, ProviderObject};
use crate::api::store::{
    ClusterSecretStore, ClusterStoreCondition, LabelSelector, ProviderRef, SecretStore,
    StoreProvider,
};
use crate::api::validate::{self, Invalid};
use crate::api::{CredentialScope, ExternalSecret, StoreKind};

/// An ExternalSecret together with the store it is allowed to use.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The pod's namespace (also the ExternalSecret's).
    pub namespace: String,
    /// The ExternalSecret.
    pub external_secret: Arc<ExternalSecret>,
    /// Name of the referenced store.
    pub store_name: String,
    /// The store, as the catalog holds it (shared, not copied on every publish).
    pub store: BoundStore,
    /// The provider object the store names in `spec.providerRef`, as the catalog found it;
    /// `None` for a store with an inline `spec.provider`.
    pub provider_object: Option<Arc<ProviderObject>>,
}

impl Binding {
    /// The store's provider block (validated: exactly one provider): the inline one, or the
    /// spec of the provider object its `providerRef` names.
    pub fn provider(&self) -> &StoreProvider {
        match &self.provider_object {
            Some(object) => &object.provider,
            None => self.store.provider(),
        }
    }

    /// The store's provider block, which [`bind`] validated (so a binding made there always
    /// has one); found again rather than validated again, on every publish.
    pub fn spec(&self) -> Option<validate::ProviderSpec<'_>> {
        validate::provider_blocks(self.provider()).next()
    }

    /// Where the store's credential references may point and who reads them: referent for a
    /// ClusterSecretStore naming a cluster-scoped provider object.
    pub fn credential_scope(&self) -> CredentialScope {
        CredentialScope::of(self.store_kind(), self.provider_object.as_deref())
    }

    /// Kind of the referenced store.
    pub fn store_kind(&self) -> StoreKind {
        match self.store {
            BoundStore::Namespaced(_) | BoundStore::None => StoreKind::SecretStore,
            BoundStore::Cluster(_) => StoreKind::ClusterSecretStore,
        }
    }
}

/// The store object a [`Binding`] uses.
#[derive(Debug, Clone)]
pub enum BoundStore {
    /// A SecretStore of the ExternalSecret's namespace.
    Namespaced(Arc<SecretStore>),
    /// A ClusterSecretStore that admits the namespace.
    Cluster(Arc<ClusterSecretStore>),
    /// No store: every entry of the ExternalSecret names a generator.
    None,
}

/// The provider of [`BoundStore::None`]: an empty `fake` store, which a plan without store
/// entries never calls.
static NO_PROVIDER: std::sync::LazyLock<StoreProvider> =
    std::sync::LazyLock::new(|| StoreProvider {
        fake: Some(crate::api::store::FakeProvider::default()),
        ..StoreProvider::default()
    });

impl BoundStore {
    /// The store's `spec.providerRef`, if it names its provider that way.
    pub fn provider_ref(&self) -> Option<&ProviderRef> {
        match self {
            Self::Namespaced(store) => store.spec.provider_ref.as_ref(),
            Self::Cluster(store) => store.spec.provider_ref.as_ref(),
            Self::None => None,
        }
    }

    /// The store's inline provider block (empty for a store with a `providerRef`).
    pub fn provider(&self) -> &StoreProvider {
        match self {
            Self::Namespaced(store) => &store.spec.provider,
            Self::Cluster(store) => &store.spec.provider,
            Self::None => &NO_PROVIDER,
        }
    }
}

/// Why no usable (ExternalSecret, store) pair was found.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// No ExternalSecret of that name in the pod's namespace.
    #[error("namespace \"{namespace}\": ExternalSecret \"{name}\" not found")]
    ExternalSecretNotFound {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        name: String,
    },
    /// The ExternalSecret breaks a validation rule.
    #[error("namespace \"{namespace}\", ExternalSecret \"{name}\": invalid: {reason}")]
    InvalidExternalSecret {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        name: String,
        /// Which rule.
        reason: Invalid,
    },
    /// The referenced store does not exist (where the pod may see it).
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\": {kind} \"{store}\" not found{hint}"
    )]
    StoreNotFound {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Store kind.
        kind: StoreKind,
        /// Store name.
        store: String,
        /// Extra guidance, possibly empty.
        hint: String,
    },
    /// The store breaks a validation rule.
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\", {kind} \"{store}\": invalid: {reason}"
    )]
    InvalidStore {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Store kind.
        kind: StoreKind,
        /// Store name.
        store: String,
        /// Which rule.
        reason: Invalid,
    },
    /// The provider object a store's `providerRef` names does not exist.
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\", {kind} \"{store}\": \
         spec.providerRef names {provider}, which does not exist{}",
        provider_hint(*kind)
    )]
    ProviderNotFound {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Store kind.
        kind: StoreKind,
        /// Store name.
        store: String,
        /// `Vault "shop/name"` or `cluster-scoped Vault "name"`.
        provider: String,
    },
    /// A ClusterSecretStore does not admit the pod's namespace.
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\": ClusterSecretStore \"{store}\" does not admit this namespace: {rule}"
    )]
    NotAdmitted {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Store name.
        store: String,
        /// Which rule refused.
        rule: String,
    },
    /// The generator an entry names does not exist (where the pod may see it).
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\": generator {generator} not found{hint}"
    )]
    GeneratorNotFound {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// `Kind "name"` of the generator.
        generator: String,
        /// Extra guidance, possibly empty.
        hint: &'static str,
    },
    /// A ClusterGenerator does not admit the pod's namespace.
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\": ClusterGenerator \"{generator}\" does not admit this namespace: {rule}"
    )]
    GeneratorNotAdmitted {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Generator name.
        generator: String,
        /// Which rule refused.
        rule: String,
    },
    /// The generator breaks a validation rule.
    #[error(
        "namespace \"{namespace}\", ExternalSecret \"{external_secret}\", generator {generator}: invalid: {reason}"
    )]
    InvalidGenerator {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// `Kind "name"` of the generator.
        generator: String,
        /// Which rule.
        reason: Invalid,
    },
    /// The catalog could not answer.
    #[error("namespace \"{namespace}\", ExternalSecret \"{external_secret}\": {source}")]
    Catalog {
        /// Pod namespace.
        namespace: String,
        /// ExternalSecret name.
        external_secret: String,
        /// Cause.
        source: CatalogError,
    },
}

/// Where the provider object of a store of `kind` must be, for [`BindingError::ProviderNotFound`].
fn provider_hint(kind: StoreKind) -> &'static str {
    match kind {
        StoreKind::SecretStore => " in the store's namespace",
        StoreKind::ClusterSecretStore => {
            " (a ClusterSecretStore names a cluster-scoped provider object)"
        }
    }
}

/// Finds ExternalSecret `name` in `namespace` and the store it may use.
pub async fn bind(
    catalog: &dyn Catalog,
    namespace: &str,
    name: &str,
) -> Result<Binding, BindingError> {
    let catalog_err = |source| BindingError::Catalog {
        namespace: namespace.into(),
        external_secret: name.into(),
        source,
    };
    let es = catalog
        .external_secret(namespace, name)
        .await
        .map_err(catalog_err)?
        .ok_or_else(|| BindingError::ExternalSecretNotFound {
            namespace: namespace.into(),
            name: name.into(),
        })?;
    validate::external_secret(&es.spec).map_err(|reason| BindingError::InvalidExternalSecret {
        namespace: namespace.into(),
        name: name.into(),
        reason,
    })?;
    let Some(store_ref) = &es.spec.secret_store_ref else {
        // Validation admitted it: every entry names a generator, so no store is read.
        return Ok(Binding {
            namespace: namespace.into(),
            store_name: String::new(),
            external_secret: es,
            store: BoundStore::None,
            provider_object: None,
        });
    };
    // The name may reach an API request path (a GET on a cache miss).
    validate::object_name("spec.secretStoreRef.name", &store_ref.name).map_err(|reason| {
        BindingError::InvalidExternalSecret {
            namespace: namespace.into(),
            name: name.into(),
            reason,
        }
    })?;
    let not_found = |hint| BindingError::StoreNotFound {
        namespace: namespace.into(),
        external_secret: name.into(),
        kind: store_ref.kind,
        store: store_ref.name.clone(),
        hint,
    };
    let store = match store_ref.kind {
        StoreKind::SecretStore => {
            let found = catalog
                .secret_store(namespace, &store_ref.name)
                .await
                .map_err(catalog_err)?;
            let Some(store) = found else {
                return Err(not_found(secret_store_hint(catalog, &store_ref.name).await));
            };
            BoundStore::Namespaced(store)
        }
        StoreKind::ClusterSecretStore => {
            let found = catalog
                .cluster_secret_store(&store_ref.name)
                .await
                .map_err(catalog_err)?;
            let Some(store) = found else {
                let hint = cluster_store_hint(catalog, namespace, &store_ref.name).await;
                return Err(not_found(hint));
            };
            let labels = catalog
                .namespace_labels(namespace)
                .await
                .map_err(catalog_err)?;
            admits(&store.spec.conditions, namespace, &labels).map_err(|rule| {
                BindingError::NotAdmitted {
                    namespace: namespace.into(),
                    external_secret: name.into(),
                    store: store_ref.name.clone(),
                    rule,
                }
            })?;
            BoundStore::Cluster(store)
        }
    };
    let invalid = |reason| BindingError::InvalidStore {
        namespace: namespace.into(),
        external_secret: name.into(),
        kind: store_ref.kind,
        store: store_ref.name.clone(),
        reason,
    };
    let provider_object = match resolve_provider(catalog, &store, store_ref.kind, namespace).await {
        Ok(object) => object,
        Err(ProviderResolution::Invalid(reason)) => return Err(invalid(reason)),
        Err(ProviderResolution::Catalog(source)) => return Err(catalog_err(source)),
        Err(ProviderResolution::Missing(provider)) => {
            return Err(BindingError::ProviderNotFound {
                namespace: namespace.into(),
                external_secret: name.into(),
                kind: store_ref.kind,
                store: store_ref.name.clone(),
                provider,
            });
        }
    };
    provider_spec(&store, provider_object.as_deref(), store_ref.kind).map_err(invalid)?;
    Ok(Binding {
        namespace: namespace.into(),
        store_name: store_ref.name.clone(),
        external_secret: es,
        store,
        provider_object,
    })
}

/// Why a store's provider could not be resolved (the callers name the store their own way).
#[derive(Debug)]
pub enum ProviderResolution {
    /// Neither or both of `provider` and `providerRef`, or a reference to the wrong group.
    Invalid(Invalid),
    /// The provider object does not exist: `Vault "name"` or `cluster-scoped Vault "name"`.
    Missing(String),
    /// The catalog could not answer.
    Catalog(CatalogError),
}

/// The provider object `store`'s `providerRef` names (a SecretStore's in `namespace`, a
/// ClusterSecretStore's cluster-scoped), or `None` for an inline `spec.provider`. Shared by
/// publishes, the mirror and PushSecrets, so a store is resolved the same way everywhere.
pub async fn resolve_provider(
    catalog: &dyn Catalog,
    store: &BoundStore,
    kind: StoreKind,
    namespace: &str,
) -> Result<Option<Arc<ProviderObject>>, ProviderResolution> {
    let provider_ref = validate::provider_or_ref(store.provider(), store.provider_ref(), kind)
        .map_err(ProviderResolution::Invalid)?;
    let Some(r) = provider_ref else {
        return Ok(None);
    };
    // A SecretStore's provider object is in its own (the pod's) namespace.
    let scope = match kind {
        StoreKind::SecretStore => Some(namespace),
        StoreKind::ClusterSecretStore => None,
    };
    match catalog.provider(r.kind, scope, &r.name).await {
        Ok(Some(object)) => Ok(Some(object)),
        Ok(None) => Err(ProviderResolution::Missing(provider_kinds::shown(
            r.kind,
            scope.is_none(),
            &r.name,
        ))),
        Err(e) => Err(ProviderResolution::Catalog(e)),
    }
}

/// The checked provider of `store`: its inline block, or `object` (what [`resolve_provider`]
/// found), whose errors name the object.
pub fn provider_spec<'a>(
    store: &'a BoundStore,
    object: Option<&'a ProviderObject>,
    kind: StoreKind,
) -> Result<validate::ProviderSpec<'a>, Invalid> {
    match object {
        None => validate::provider(store.provider(), kind),
        Some(o) => validate::provider_object(o)
            .map_err(|reason| Invalid(format!("spec.providerRef: {}: {reason}", o.shown()))),
    }
}

/// Why a SecretStore was not found, and the likely fix: ESO users often move a store to a
/// ClusterSecretStore and keep the ref's default kind.
///
/// Naming the ClusterSecretStore tells the tenant nothing it could not see already: the hint
/// only confirms a name the tenant wrote in its own ref, and ClusterSecretStores are
/// cluster-scoped objects every service account may list under the agent's RBAC (and ESO's).
/// Whether the store would admit the namespace is not said here: binding it says so.
async fn secret_store_hint(catalog: &dyn Catalog, store: &str) -> String {
    match catalog.cluster_secret_store(store).await {
        Ok(Some(_)) | Err(CatalogError::Unusable { .. } | CatalogError::NotLoaded { .. }) => {
            format!(
                " in this namespace; a ClusterSecretStore named \"{store}\" exists: set \
                 secretStoreRef.kind: ClusterSecretStore"
            )
        }
        // Not found, or the catalog cannot answer now: the plain rule.
        _ => " (a SecretStore must be in the ExternalSecret's namespace)".to_string(),
    }
}

/// The converse of [`secret_store_hint`]: a SecretStore of that name in the pod's own namespace,
/// which the pod may use anyway.
async fn cluster_store_hint(catalog: &dyn Catalog, namespace: &str, store: &str) -> String {
    match catalog.secret_store(namespace, store).await {
        Ok(Some(_)) | Err(CatalogError::Unusable { .. } | CatalogError::NotLoaded { .. }) => {
            format!(
                "; a SecretStore named \"{store}\" exists in this namespace: set \
                 secretStoreRef.kind: SecretStore (or leave kind out)"
            )
        }
        _ => String::new(),
    }
}

/// ESO's rule (`ShouldProcessStore` in external-secrets): no conditions admit every namespace;
/// otherwise a namespace is admitted when ANY criterion of ANY condition matches it: its name is
/// in `namespaces`, OR a `namespaceRegexes` entry matches its name, OR `namespaceSelector`
/// matches its labels. Several criteria in one condition therefore admit the union of what each
/// admits, not the intersection. Errors say which criterion of which condition refused.
///
/// An invalid criterion (a regex that does not compile, a selector with an invalid requirement)
/// admits nothing by itself and never makes another criterion admit less or more: under a union
/// the smallest safe reading of a criterion the agent cannot evaluate is the empty set, so a
/// broken entry can only narrow who is admitted, never widen it. (ESO refuses the whole store on
/// an invalid selector; here the other, valid criteria still admit what they say.)
pub fn admits(
    conditions: &[ClusterStoreCondition],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    if conditions.is_empty() {
        return Ok(());
    }
    let mut refusals = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        match condition_matches(c, namespace, labels) {
            Ok(()) => return Ok(()),
            Err(why) => refusals.push(format!("conditions[{i}]: {why}")),
        }
    }
    Err(refusals.join("; "))
}

/// One condition: `Ok` when any of its criteria admits the namespace, else why each refused.
fn condition_matches(
    c: &ClusterStoreCondition,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    if c.namespaces.is_empty() && c.namespace_regexes.is_empty() && c.namespace_selector.is_none() {
        return Err("empty condition admits nothing".into());
    }
    let mut refusals = Vec::new();
    if !c.namespaces.is_empty() {
        if c.namespaces.iter().any(|n| n == namespace) {
            return Ok(());
        }
        refusals.push("namespace not in namespaces".to_string());
    }
    if !c.namespace_regexes.is_empty() {
        let mut invalid = Vec::new();
        for (j, r) in c.namespace_regexes.iter().enumerate() {
            // A regex that does not compile admits nothing (see `admits`); the others still count.
            match Regex::new(r) {
                Ok(re) if re.is_match(namespace) => return Ok(()),
                Ok(_) => {}
                Err(_) => invalid.push(format!("namespaceRegexes[{j}] is invalid")),
            }
        }
        refusals.push("namespace matches none of namespaceRegexes".to_string());
        refusals.extend(invalid);
    }
    if let Some(sel) = &c.namespace_selector {
        match selector_matches(sel, labels) {
            Ok(()) => return Ok(()),
            Err(why) => refusals.push(format!("namespaceSelector does not match: {why}")),
        }
    }
    Err(refusals.join(", "))
}

/// Kubernetes label-selector semantics (matchLabels AND every matchExpression); `Err` says why
/// not (an invalid requirement admits nothing).
pub fn selector_matches(
    sel: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    for (k, v) in &sel.match_labels {
        if labels.get(k) != Some(v) {
            return Err(format!("label {k}={v} required"));
        }
    }
    for e in &sel.match_expressions {
        let value = labels.get(&e.key);
        // As the API server validates selectors: an invalid requirement admits nothing (a
        // `NotIn` without values would otherwise admit every namespace).
        let ok = match (e.operator.as_str(), e.values.is_empty()) {
            ("In" | "NotIn", true) => {
                return Err(format!(
                    "invalid requirement on {:?}: {} needs values",
                    e.key, e.operator
                ));
            }
            ("Exists" | "DoesNotExist", false) => {
                return Err(format!(
                    "invalid requirement on {:?}: {} takes no values",
                    e.key, e.operator
                ));
            }
            ("In", _) => value.is_some_and(|v| e.values.contains(v)),
            ("NotIn", _) => value.is_none_or(|v| !e.values.contains(v)),
            ("Exists", _) => value.is_some(),
            ("DoesNotExist", _) => value.is_none(),
            (other, _) => return Err(format!("unknown operator {other:?}")),
        };
        if !ok {
            return Err(format!("{} {} {:?}", e.key, e.operator, e.values));
        }
    }
    Ok(())
}

#[cfg(test)]
mod provider_ref_tests;
#[cfg(test)]
mod tests;
