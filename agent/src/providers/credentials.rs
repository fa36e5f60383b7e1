//! Credentials referenced by a store (`secretRef`, `tokenSecretRef`, ...): which Secret may be
//! read, and how. A SecretStore's credentials live in the pod's namespace and, in a cluster, are
//! read AS THE POD (with its token), so a store can never reach further than its pods; an inline
//! ClusterSecretStore's credentials live in the agent's own namespace only. A ClusterSecretStore
//! naming a cluster-scoped provider object is referent ([`CredentialScope::Referent`]): a
//! reference naming no namespace is read like a SecretStore's, from the caller's namespace as
//! the caller. Standalone mode reads `v1` Secret manifests with the same namespace rules. The
//! rule is written down once, in docs/concepts.md (Identity, the credentials rows).

use k8s_openapi::api::core::v1::Secret;

use super::kubernetes::KubernetesSecrets;
use super::{BuildContext, Provider, ProviderError, RemoteKey};
use crate::api::CredentialScope;
use crate::api::store::SecretKeySelector;
use crate::secret::{SecretBytes, SecretString};

/// Where a credential lives, once checked: the namespace the store may read it from and a valid
/// Secret name. Checked before anything is cached under it or read from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// Namespace of the Secret (the pod's for a SecretStore and a referent read, the agent's
    /// for a ClusterSecretStore).
    pub namespace: String,
    /// Secret name.
    pub name: String,
    /// Key in the Secret's data.
    pub key: String,
    /// Read as the caller (the pod, or the account the controller acts as) rather than by the
    /// agent: what the caller's own RBAC allows decides, so whatever is cached from it (a login)
    /// belongs to that caller only.
    pub as_caller: bool,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}[{}]", self.namespace, self.name, self.key)
    }
}

/// Checks where the credential `selector` names may live for this store kind, failing closed:
/// a namespace other than the allowed one is refused, and so is a name that is not a valid
/// Kubernetes name.
pub fn locate(
    ctx: &BuildContext<'_>,
    selector: &SecretKeySelector,
) -> Result<Location, ProviderError> {
    let namespace = allowed_namespace(ctx, selector)?;
    crate::api::validate::object_name("credential Secret name", &selector.name)
        .map_err(|e| ProviderError::Config(e.to_string()))?;
    Ok(Location {
        namespace: namespace.to_string(),
        name: selector.name.clone(),
        key: selector.key.clone(),
        as_caller: ctx.scope.as_caller(selector.namespace.as_deref()),
    })
}

/// Who a login or session obtained with the credential at `location` is for, as a cache key
/// part: the caller's `namespace/serviceaccount` when the caller read it (a service account that
/// may not read the Secret must never reuse what another one obtained with it; for a referent
/// store this also keeps two tenants' logins apart), the agent otherwise.
pub fn reader(ctx: &BuildContext<'_>, location: &Location) -> String {
    if location.as_caller {
        format!(
            "{}/{}:{location}",
            ctx.pod.namespace, ctx.pod.service_account
        )
    } else {
        format!("agent:{location}")
    }
}

/// Reads the credential `selector` names, enforcing where it may live. Messages name the
/// Secret and key, never the value.
pub async fn read(
    ctx: &BuildContext<'_>,
    selector: &SecretKeySelector,
) -> Result<SecretString, ProviderError> {
    let location = locate(ctx, selector)?;
    let (namespace, name, key) = (&location.namespace, &location.name, &location.key);
    let bytes = match fetch(ctx, &location).await? {
        Fetched::AsPod(doc) => json_field(&doc, key),
        Fetched::Catalog(secret) => data_field(&secret, key),
    };
    let bytes = bytes.ok_or_else(|| {
        ProviderError::Config(format!(
            "credential Secret {namespace}/{name} has no key {key:?}"
        ))
    })?;
    String::from_utf8(bytes.expose().to_vec())
        .map(SecretString::new)
        .map_err(|_| {
            ProviderError::Config(format!("credential {namespace}/{name}[{key}] is not text"))
        })
}

/// Most bytes (keys and values) of a Secret read whole ([`read_all`]); a Kubernetes Secret holds
/// at most 1 MiB.
pub const MAX_SECRET_BYTES: usize = 1 << 20;

/// Every key of the credential Secret `name`, with the same namespace rules and reads as
/// [`read`] (a SecretStore's as the pod, a ClusterSecretStore's in the agent's namespace).
/// Values must be text. Messages name the Secret, never a value.
pub async fn read_all(
    ctx: &BuildContext<'_>,
    name: &str,
) -> Result<std::collections::BTreeMap<String, SecretString>, ProviderError> {
    let selector = SecretKeySelector {
        name: name.to_string(),
        ..Default::default()
    };
    let location = locate(ctx, &selector)?;
    let (namespace, name) = (&location.namespace, &location.name);
    let too_large = || {
        ProviderError::Config(format!(
            "credential Secret {namespace}/{name} is larger than {} KiB",
            MAX_SECRET_BYTES >> 10
        ))
    };
    let not_text =
        || ProviderError::Config(format!("credential Secret {namespace}/{name} is not text"));
    let pairs: Vec<(String, Vec<u8>)> = match fetch(ctx, &location).await? {
        Fetched::AsPod(doc) => {
            if doc.expose().len() > MAX_SECRET_BYTES * 2 {
                return Err(too_large());
            }
            let (map, _held): (std::collections::BTreeMap<String, String>, _) =
                crate::json::parse(doc.expose()).map_err(|_| not_text())?;
            map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
        }
        Fetched::Catalog(secret) => secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    };
    let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_SECRET_BYTES {
        return Err(too_large());
    }
    pairs
        .into_iter()
        .map(|(k, v)| {
            String::from_utf8(v)
                .map(|v| (k, SecretString::new(v)))
                .map_err(|_| not_text())
        })
        .collect()
}

/// A credential Secret as read: the pod's view of it (JSON of its data) or the catalog's object.
enum Fetched {
    AsPod(SecretBytes),
    Catalog(std::sync::Arc<Secret>),
}

/// Reads the Secret at `location`: in a cluster, one read as the caller with the caller's own
/// token; otherwise from the catalog (the agent's namespace, or standalone manifests).
async fn fetch(ctx: &BuildContext<'_>, location: &Location) -> Result<Fetched, ProviderError> {
    let (namespace, name) = (&location.namespace, &location.name);
    let missing =
        || ProviderError::Config(format!("credential Secret {namespace}/{name} not found"));
    match (location.as_caller, &ctx.env.kube) {
        (true, Some(kube)) => {
            let as_pod = KubernetesSecrets::local(Some(kube), ctx.pod)?;
            let doc = as_pod
                .get(&RemoteKey {
                    key: name.clone(),
                    version: None,
                })
                .await
                .map_err(|e| match e {
                    ProviderError::NotFound => missing(),
                    other => other,
                })?;
            Ok(Fetched::AsPod(doc))
        }
        _ => ctx
            .env
            .catalog
            .secret(namespace, name)
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?
            .map(Fetched::Catalog)
            .ok_or_else(missing),
    }
}

/// The namespace a store of this scope may read the credential `selector` names from.
fn allowed_namespace<'a>(
    ctx: &'a BuildContext<'_>,
    selector: &'a SecretKeySelector,
) -> Result<&'a str, ProviderError> {
    let (allowed, why) = match ctx.scope {
        CredentialScope::Namespaced => {
            (ctx.pod.namespace.as_str(), "a SecretStore's own namespace")
        }
        // Naming no namespace is what makes a read referent; a named one follows the rule of
        // every ClusterSecretStore, so naming the caller's own namespace is refused too.
        CredentialScope::Referent if selector.namespace.is_none() => {
            (ctx.pod.namespace.as_str(), "the caller's namespace")
        }
        CredentialScope::Cluster | CredentialScope::Referent => (
            ctx.env.agent_namespace.as_str(),
            "the agent's namespace (ClusterSecretStore)",
        ),
    };
    match selector.namespace.as_deref() {
        None => Ok(allowed),
        Some(ns) if ns == allowed => Ok(allowed),
        Some(ns) => Err(ProviderError::PermissionDenied(format!(
            "credential Secret {}/{} is outside {why}, {allowed:?}",
            crate::telemetry::escape::printable(ns, 80),
            crate::telemetry::escape::printable(&selector.name, 80)
        ))),
    }
}

fn data_field(secret: &Secret, key: &str) -> Option<SecretBytes> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| SecretBytes::new(v.0.clone()))
}

fn json_field(doc: &SecretBytes, key: &str) -> Option<SecretBytes> {
    // Tenant-written: keys counted before the map is built (past the bound: no such key).
    let (map, _held): (std::collections::BTreeMap<String, String>, _) =
        crate::json::parse(doc.expose()).ok()?;
    map.get(key).map(|v| SecretBytes::from(v.as_str()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::catalog::manifests::ManifestCatalog;
    use crate::identity::PodInfo;
    use crate::providers::Env;
    use crate::telemetry::Metrics;

    fn env() -> Env {
        Env {
            metrics: Arc::new(Metrics::new()),
            kube: None,
            catalog: Arc::new(ManifestCatalog::default()),
            agent_namespace: "latchkey".into(),
            aws_sessions: Default::default(),
            vault_tokens: Default::default(),
            plugins: Default::default(),
            secrets_store: Default::default(),
        }
    }

    fn pod(namespace: &str) -> PodInfo {
        PodInfo {
            namespace: namespace.into(),
            name: "web-0".into(),
            uid: String::new(),
            service_account: "web".into(),
            tokens: Default::default(),
        }
    }

    fn selector(namespace: Option<&str>) -> SecretKeySelector {
        SecretKeySelector {
            name: "vault-token".into(),
            key: "token".into(),
            namespace: namespace.map(str::to_string),
        }
    }

    /// Where `selector` is located for a pod of `namespace` under `scope`, and who a login made
    /// from it is for.
    fn located(
        scope: CredentialScope,
        namespace: &str,
        at: Option<&str>,
    ) -> Result<(String, bool, String), ProviderError> {
        let (env, pod) = (env(), pod(namespace));
        let ctx = BuildContext {
            env: &env,
            pod: &pod,
            scope,
            max_age: None,
        };
        let location = locate(&ctx, &selector(at))?;
        Ok((
            location.namespace.clone(),
            location.as_caller,
            reader(&ctx, &location),
        ))
    }

    #[test]
    fn a_referent_reference_without_namespace_is_the_caller_s_and_keyed_by_it() {
        let (ns, as_caller, who) = located(CredentialScope::Referent, "team-a", None).unwrap();
        assert_eq!((ns.as_str(), as_caller), ("team-a", true));
        assert_eq!(who, "team-a/web:team-a/vault-token[token]");
        let (_, _, other) = located(CredentialScope::Referent, "team-b", None).unwrap();
        assert_ne!(who, other, "two tenants never share a login");
    }

    #[test]
    fn a_referent_reference_naming_a_namespace_follows_the_cluster_store_rule() {
        let (ns, as_caller, who) =
            located(CredentialScope::Referent, "team-a", Some("latchkey")).unwrap();
        assert_eq!((ns.as_str(), as_caller), ("latchkey", false));
        assert_eq!(who, "agent:latchkey/vault-token[token]");
        for named in ["team-b", "team-a"] {
            let err = located(CredentialScope::Referent, "team-a", Some(named)).unwrap_err();
            assert!(matches!(err, ProviderError::PermissionDenied(_)), "{err}");
            assert!(
                err.to_string().contains("outside the agent's namespace"),
                "{err}"
            );
        }
    }

    #[test]
    fn inline_stores_keep_their_rules() {
        let (ns, as_caller, _) = located(CredentialScope::Cluster, "team-a", None).unwrap();
        assert_eq!((ns.as_str(), as_caller), ("latchkey", false));
        let (ns, as_caller, who) = located(CredentialScope::Namespaced, "team-a", None).unwrap();
        assert_eq!((ns.as_str(), as_caller), ("team-a", true));
        assert!(who.starts_with("team-a/web:"), "{who}");
        assert!(located(CredentialScope::Namespaced, "team-a", Some("latchkey")).is_err());
    }
}
