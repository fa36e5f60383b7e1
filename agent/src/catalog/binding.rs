//! Tenancy: finds the ExternalSecret a pod names and the one store it may use. An ExternalSecret
//! is looked up only in the pod's namespace; a SecretStore must be in that same namespace; a
//! ClusterSecretStore must admit the namespace through its `conditions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use regex::Regex;

use super::{Catalog, CatalogError};
use crate::api::store::{
    ClusterSecretStore, ClusterStoreCondition, LabelSelector, SecretStore, StoreProvider,
};
use crate::api::validate::{self, Invalid};
use crate::api::{ExternalSecret, StoreKind};

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
}

impl Binding {
    /// The store's provider block (validated: exactly one provider).
    pub fn provider(&self) -> &StoreProvider {
        self.store.provider()
    }

    /// The store's provider block, which [`bind`] validated (so a binding made there always
    /// has one); found again rather than validated again, on every publish.
    pub fn spec(&self) -> Option<validate::ProviderSpec<'_>> {
        validate::provider_blocks(self.provider()).next()
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
    /// The store's provider block.
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
        hint: &'static str,
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
            let store = catalog
                .secret_store(namespace, &store_ref.name)
                .await
                .map_err(catalog_err)?
                .ok_or_else(|| {
                    not_found(" (a SecretStore must be in the ExternalSecret's namespace)")
                })?;
            BoundStore::Namespaced(store)
        }
        StoreKind::ClusterSecretStore => {
            let store = catalog
                .cluster_secret_store(&store_ref.name)
                .await
                .map_err(catalog_err)?
                .ok_or_else(|| not_found(""))?;
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
    validate::provider(store.provider(), store_ref.kind).map_err(|reason| {
        BindingError::InvalidStore {
            namespace: namespace.into(),
            external_secret: name.into(),
            kind: store_ref.kind,
            store: store_ref.name.clone(),
            reason,
        }
    })?;
    Ok(Binding {
        namespace: namespace.into(),
        store_name: store_ref.name.clone(),
        external_secret: es,
        store,
    })
}

/// ESO semantics: no conditions admit every namespace; otherwise any one condition must match,
/// and a condition matches when each of its set criteria matches. Errors say which rule refused.
pub(super) fn admits(
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

fn condition_matches(
    c: &ClusterStoreCondition,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    if c.namespaces.is_empty() && c.namespace_regexes.is_empty() && c.namespace_selector.is_none() {
        return Err("empty condition admits nothing".into());
    }
    if !c.namespaces.is_empty() && !c.namespaces.iter().any(|n| n == namespace) {
        return Err("namespace not in namespaces".into());
    }
    if !c.namespace_regexes.is_empty() {
        let mut matched = false;
        for r in &c.namespace_regexes {
            let re = Regex::new(r).map_err(|_| format!("invalid namespaceRegexes entry {r:?}"))?;
            matched |= re.is_match(namespace);
        }
        if !matched {
            return Err("namespace matches none of namespaceRegexes".into());
        }
    }
    if let Some(sel) = &c.namespace_selector {
        selector_matches(sel, labels)
            .map_err(|why| format!("namespaceSelector does not match: {why}"))?;
    }
    Ok(())
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
mod tests {
    use super::*;
    use crate::api::store::LabelSelectorRequirement;
    use crate::catalog::ManifestCatalog;
    use std::path::Path;

    const OBJECTS: &str = r#"
apiVersion: latchkey.dev/v1alpha1
kind: SecretStore
metadata: {name: local, namespace: team-b}
spec: {provider: {fake: {data: []}}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: only-prod}
spec:
  provider: {fake: {data: []}}
  conditions: [{namespaceRegexes: ["^prod-"]}, {namespaces: [billing]}]
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: open}
spec: {provider: {fake: {data: []}}}
---
apiVersion: v1
kind: Namespace
metadata: {name: labelled, labels: {tier: gold}}
---
apiVersion: latchkey.dev/v1alpha1
kind: ClusterSecretStore
metadata: {name: gold}
spec:
  provider: {fake: {data: []}}
  conditions: [{namespaceSelector: {matchLabels: {tier: gold}}}]
"#;

    fn es(ns: &str, store: &str, kind: &str) -> String {
        format!(
            "apiVersion: latchkey.dev/v1alpha1\nkind: ExternalSecret\nmetadata: {{name: es, namespace: {ns}}}\n\
             spec: {{secretStoreRef: {{name: {store}, kind: {kind}}}, data: [{{secretKey: a, remoteRef: {{key: a}}}}]}}\n"
        )
    }

    fn catalog(extra: &[String]) -> ManifestCatalog {
        let mut c = ManifestCatalog::default();
        c.add_documents(Path::new("objects.yaml"), OBJECTS).unwrap();
        for (i, doc) in extra.iter().enumerate() {
            c.add_documents(Path::new(&format!("es{i}.yaml")), doc)
                .unwrap();
        }
        c
    }

    #[tokio::test]
    async fn a_binding_shares_the_catalog_store_and_its_debug_shows_no_value() {
        let store = "apiVersion: latchkey.dev/v1alpha1\nkind: SecretStore\n\
                     metadata: {name: inline, namespace: team-c}\n\
                     spec: {provider: {fake: {data: [{key: a, value: hunter2-inline}]}}}\n";
        let c = catalog(&[store.to_string(), es("team-c", "inline", "SecretStore")]);
        let binding = bind(&c, "team-c", "es").await.unwrap();
        let held = c.secret_store("team-c", "inline").await.unwrap().unwrap();
        match &binding.store {
            BoundStore::Namespaced(store) => assert!(Arc::ptr_eq(store, &held)),
            other => panic!("{other:?}"),
        }
        assert_eq!(binding.provider(), &held.spec.provider);
        let debug = format!("{binding:?}");
        assert!(
            debug.contains("inline") && !debug.contains("hunter2"),
            "{debug}"
        );
    }

    #[tokio::test]
    async fn secret_store_of_another_namespace_is_never_used() {
        let c = catalog(&[es("team-a", "local", "SecretStore")]);
        let err = bind(&c, "team-a", "es").await.unwrap_err();
        assert!(matches!(err, BindingError::StoreNotFound { .. }), "{err}");
        assert!(
            err.to_string().contains("SecretStore \"local\" not found"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn external_secret_is_only_looked_up_in_the_pod_namespace() {
        let c = catalog(&[es("team-b", "local", "SecretStore")]);
        assert!(bind(&c, "team-b", "es").await.is_ok());
        let err = bind(&c, "team-a", "es").await.unwrap_err();
        assert!(
            matches!(err, BindingError::ExternalSecretNotFound { .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn cluster_store_conditions_admit_or_refuse_with_the_rule() {
        let c = catalog(&[
            es("prod-eu", "only-prod", "ClusterSecretStore"),
            es("billing", "only-prod", "ClusterSecretStore"),
            es("dev", "only-prod", "ClusterSecretStore"),
            es("dev2", "open", "ClusterSecretStore"),
            es("labelled", "gold", "ClusterSecretStore"),
            es("plain", "gold", "ClusterSecretStore"),
        ]);
        assert!(bind(&c, "prod-eu", "es").await.is_ok());
        assert!(bind(&c, "billing", "es").await.is_ok());
        assert!(bind(&c, "dev2", "es").await.is_ok());
        assert!(bind(&c, "labelled", "es").await.is_ok());
        let err = bind(&c, "dev", "es").await.unwrap_err().to_string();
        assert!(err.contains("does not admit"), "{err}");
        assert!(
            err.contains("namespaceRegexes") && err.contains("not in namespaces"),
            "{err}"
        );
        let err = bind(&c, "plain", "es").await.unwrap_err().to_string();
        assert!(err.contains("label tier=gold required"), "{err}");
    }

    /// A selector with one requirement on the label `env`.
    fn req(op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: op.into(),
                values: values.iter().map(|s| s.to_string()).collect(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn selector_expressions() {
        let labels = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        assert!(selector_matches(&req("In", &["prod"]), &labels).is_ok());
        assert!(selector_matches(&req("NotIn", &["prod"]), &labels).is_err());
        assert!(selector_matches(&req("Exists", &[]), &labels).is_ok());
        assert!(selector_matches(&req("DoesNotExist", &[]), &labels).is_err());
        assert!(selector_matches(&req("Bogus", &[]), &labels).is_err());
    }

    #[test]
    fn invalid_selector_requirements_admit_nothing() {
        // `NotIn` with no values would match every namespace; Kubernetes calls it invalid.
        let none = BTreeMap::new();
        for (op, values) in [
            ("NotIn", &[][..]),
            ("In", &[][..]),
            ("Exists", &["x"][..]),
            ("DoesNotExist", &["x"][..]),
        ] {
            let err = selector_matches(&req(op, values), &none).unwrap_err();
            assert!(err.contains("invalid requirement"), "{op}: {err}");
        }
    }
}
