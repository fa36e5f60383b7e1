//! External Secrets Operator `SecretStore` / `ClusterSecretStore` (v1, v1beta1) -> Latchkey
//! stores, for the providers Latchkey has (aws, vault in [`super::eso_vault`], kubernetes, fake).
//! ESO reads with its controller's identity or a fixed service account; Latchkey always reads as
//! the pod (or the ExternalSecret's service account), so those references become notes.

use super::eso_refs::{selector, service_account_ref};
use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::spc_aws::{REGION_PLACEHOLDER, ROLE_PLACEHOLDER};
use crate::api::store::{
    AwsAuth, AwsJwtAuth, AwsProvider, AwsSecretRef, ClusterSecretStoreSpec, ClusterStoreCondition,
    Empty, FakeEntry, FakeProvider, KubernetesAuth, KubernetesProvider, KubernetesServer,
    KubernetesTokenAuth, LabelSelector, LabelSelectorRequirement, SecretStoreSpec, StoreProvider,
};
use crate::api::{ClusterSecretStore, SecretStore, StoreKind};

/// Converts the store whose top-level fields are `top`.
pub fn store(
    top: &mut Fields<'_>,
    meta: &Meta,
    kind: StoreKind,
    notes: &mut Notes,
) -> Result<Vec<Document>, String> {
    let mut spec = top
        .object("spec", notes)
        .ok_or("spec is missing or not an object")?;
    let mut provider = spec
        .object("provider", notes)
        .ok_or("spec.provider is missing")?;
    let keys = provider.keys();
    let [name] = keys.as_slice() else {
        return Err(format!(
            "spec.provider must name exactly one provider (found {})",
            keys.len()
        ));
    };
    let mut block = provider
        .object(name, notes)
        .ok_or_else(|| format!("spec.provider.{name} is not an object"))?;
    let mut out = StoreProvider::default();
    match name.as_str() {
        "aws" => out.aws = Some(aws(&mut block, meta, kind, notes)?),
        "vault" => out.vault = Some(super::eso_vault::vault(&mut block, notes)?),
        "kubernetes" => out.kubernetes = Some(kubernetes(&mut block, notes)?),
        "fake" => out.fake = Some(fake(&mut block, notes)),
        other => {
            return Err(format!(
                "spec.provider.{other}: provider {} has no Latchkey equivalent (Latchkey has \
                 aws, vault, kubernetes and fake)",
                quoted(other)
            ));
        }
    }
    block.finish(notes);
    provider.finish(notes);
    spec.drop_field(
        "controller",
        notes,
        "Latchkey has no controller classes; not carried over",
    );
    spec.drop_field(
        "retrySettings",
        notes,
        "Latchkey retries with its own backoff (1s doubling to 5m); not carried over",
    );
    spec.drop_field(
        "refreshInterval",
        notes,
        "Latchkey does not poll stores; not carried over",
    );
    let doc = match kind {
        StoreKind::SecretStore => {
            let mut s = SecretStore::new(
                &meta.name,
                SecretStoreSpec {
                    provider: out,
                    provider_ref: None,
                    push: None,
                },
            );
            s.metadata = meta.object_meta(&meta.name, true);
            Document::SecretStore(Box::new(s))
        }
        StoreKind::ClusterSecretStore => {
            let mut conditions = Vec::new();
            for (path, item) in spec.list("conditions", notes) {
                if let Some(mut f) = Fields::of(item, &path, notes) {
                    conditions.push(condition(&mut f, notes));
                }
            }
            let mut s = ClusterSecretStore::new(
                &meta.name,
                ClusterSecretStoreSpec {
                    provider: out,
                    provider_ref: None,
                    push: None,
                    conditions,
                },
            );
            s.metadata = meta.object_meta(&meta.name, false);
            Document::ClusterSecretStore(Box::new(s))
        }
    };
    spec.finish(notes);
    Ok(vec![doc])
}

/// One `spec.conditions` item of a ClusterSecretStore.
fn condition(f: &mut Fields<'_>, notes: &mut Notes) -> ClusterStoreCondition {
    let namespaces = f.string_list("namespaces", notes);
    let namespace_regexes = f.string_list("namespaceRegexes", notes);
    let namespace_selector = f.object("namespaceSelector", notes).map(|mut s| {
        let match_labels = s.strings("matchLabels", notes);
        let mut match_expressions = Vec::new();
        for (path, item) in s.list("matchExpressions", notes) {
            let Some(mut e) = Fields::of(item, &path, notes) else {
                continue;
            };
            let key = e.string("key", notes);
            let operator = e.string("operator", notes);
            let values = e.string_list("values", notes);
            e.finish(notes);
            match (key, operator) {
                (Some(key), Some(operator)) => match_expressions.push(LabelSelectorRequirement {
                    key,
                    operator,
                    values,
                }),
                _ => notes.warn(path, "needs key and operator; not carried over"),
            }
        }
        s.finish(notes);
        LabelSelector {
            match_labels,
            match_expressions,
        }
    });
    f.finish(notes);
    ClusterStoreCondition {
        namespaces,
        namespace_selector,
        namespace_regexes,
    }
}

/// `provider.aws`.
fn aws(
    f: &mut Fields<'_>,
    meta: &Meta,
    kind: StoreKind,
    notes: &mut Notes,
) -> Result<AwsProvider, String> {
    let service = match f.string("service", notes).as_deref() {
        None | Some("SecretsManager") => "SecretsManager",
        Some("ParameterStore") => "ParameterStore",
        Some(other) => {
            return Err(format!(
                "spec.provider.aws.service: {} has no Latchkey equivalent (Latchkey reads AWS \
                 SecretsManager and ParameterStore)",
                quoted(other)
            ));
        }
    };
    let region = f.string("region", notes).unwrap_or_else(|| {
        notes.warn(
            f.at("region"),
            format!("is missing: replace the placeholder region {REGION_PLACEHOLDER}"),
        );
        REGION_PLACEHOLDER.into()
    });
    let mut role = f.string("role", notes);
    let role_path = f.at("role");
    let mut placeholder_role = |why: &str, notes: &mut Notes| {
        if role.is_none() {
            notes.warn(
                &role_path,
                format!(
                    "is not set: {why}; replace the placeholder role {ROLE_PLACEHOLDER} in \
                     {} {} with the role to assume with the pod's token",
                    kind, meta.name
                ),
            );
            role = Some(ROLE_PLACEHOLDER.into());
        }
    };
    let auth = match f.object("auth", notes) {
        Some(mut a) => {
            let secret_ref = match a.object("secretRef", notes) {
                Some(mut s) => {
                    let id = selector(&mut s, "accessKeyIDSecretRef", notes);
                    let key = selector(&mut s, "secretAccessKeySecretRef", notes);
                    let token = selector(&mut s, "sessionTokenSecretRef", notes);
                    s.finish(notes);
                    match (id, key) {
                        (Some(id), Some(key)) => Some(AwsSecretRef {
                            access_key_id_secret_ref: id,
                            secret_access_key_secret_ref: key,
                            session_token_secret_ref: token,
                        }),
                        _ => {
                            return Err("spec.provider.aws.auth.secretRef needs \
                                        accessKeyIDSecretRef and secretAccessKeySecretRef"
                                .into());
                        }
                    }
                }
                None => None,
            };
            let jwt = match a.object("jwt", notes) {
                Some(mut j) => {
                    let audience = service_account_ref(&mut j, "serviceAccountRef", notes);
                    j.finish(notes);
                    placeholder_role(
                        "ESO's jwt auth takes the role from the service account's \
                         eks.amazonaws.com/role-arn annotation",
                        notes,
                    );
                    Some(AwsJwtAuth { audience })
                }
                None => None,
            };
            a.finish(notes);
            AwsAuth {
                secret_ref,
                jwt,
                agent_identity: None,
            }
        }
        None if kind == StoreKind::ClusterSecretStore => {
            notes.warn(
                f.at("auth"),
                "is not set, so ESO used its controller's own AWS identity; the closest Latchkey \
                 equivalent is the node agent's own identity (auth.agentIdentity), which must \
                 then be allowed to read these secrets; auth.jwt with a role is narrower",
            );
            AwsAuth {
                agent_identity: Some(Empty {}),
                ..Default::default()
            }
        }
        None => {
            notes.warn(
                f.at("auth"),
                "is not set, so ESO used its controller's own AWS identity, which a Latchkey \
                 SecretStore may not: converted to auth.jwt (the pod's token)",
            );
            placeholder_role("auth.jwt needs a role", notes);
            AwsAuth {
                jwt: Some(AwsJwtAuth::default()),
                ..Default::default()
            }
        }
    };
    f.drop_field(
        "additionalRoles",
        notes,
        "Latchkey assumes one role; role chaining is not carried over",
    );
    for key in ["externalID", "sessionTags", "transitiveTagKeys"] {
        f.drop_field(
            key,
            notes,
            "Latchkey's role assumption takes no external id or session tags; not carried over",
        );
    }
    f.drop_field(
        "prefix",
        notes,
        "Latchkey prepends nothing to remote keys: add the prefix to each remoteRef.key; not \
         carried over",
    );
    f.drop_field(
        "secretsManager",
        notes,
        "settings for writing secrets (PushSecret) have no Latchkey equivalent; not carried over",
    );
    Ok(AwsProvider {
        service: service.into(),
        region,
        endpoint: None,
        role,
        auth: Some(auth),
    })
}

/// `provider.kubernetes`: Latchkey reads as the pod, from `remoteNamespace` (ESO's default,
/// `default`, when absent) on `server` when it names another cluster.
fn kubernetes(f: &mut Fields<'_>, notes: &mut Notes) -> Result<KubernetesProvider, String> {
    let at = f.at("remoteNamespace");
    let remote_namespace = f.string("remoteNamespace", notes).or_else(|| {
        notes.warn(
            at,
            "is not set, so ESO read namespace \"default\" (its default): written as \
             remoteNamespace: default; remove it to read the pod's own namespace",
        );
        Some("default".into())
    });
    let server = server(f, notes)?;
    f.drop_field(
        "authRef",
        notes,
        "Latchkey reads with the pod's own token, not a kubeconfig; not carried over",
    );
    let mut audience = None;
    let mut auth = None;
    if let Some(mut a) = f.object("auth", notes) {
        audience = service_account_ref(&mut a, "serviceAccount", notes);
        if server.is_some() {
            auth = bearer_token(&mut a, notes);
        } else {
            a.drop_field(
                "token",
                notes,
                "Latchkey reads this cluster's Secrets with the pod's own token (a bearer token \
                 is for a remote server only); not carried over",
            );
        }
        a.drop_field(
            "cert",
            notes,
            "Latchkey has no client certificates for the kubernetes provider; not carried over",
        );
        a.finish(notes);
    }
    if auth.is_some() && audience.take().is_some() {
        notes.warn(
            f.at("auth.serviceAccount"),
            "auth.token is used for the remote server; the audience is not carried over",
        );
    }
    if server.is_some() && audience.is_none() && auth.is_none() {
        notes.warn(
            f.at("server"),
            format!(
                "Latchkey calls another cluster with the pod's own token for an audience that \
                 cluster checks (it must trust this cluster's service-account issuer): \
                 audience is the placeholder {AUDIENCE_PLACEHOLDER}; set it, and add it to the \
                 CSIDriver's tokenRequests"
            ),
        );
        audience = Some(AUDIENCE_PLACEHOLDER.into());
    }
    Ok(KubernetesProvider {
        audience,
        server,
        remote_namespace,
        auth,
    })
}

/// `auth.token.bearerToken` of a store with a remote server: the same selector.
fn bearer_token(a: &mut Fields<'_>, notes: &mut Notes) -> Option<KubernetesAuth> {
    let mut t = a.object("token", notes)?;
    let bearer_token = selector(&mut t, "bearerToken", notes);
    t.finish(notes);
    bearer_token.map(|bearer_token| KubernetesAuth {
        token: KubernetesTokenAuth { bearer_token },
    })
}

/// Written as the audience of a remote server's token when the ESO store names none.
const AUDIENCE_PLACEHOLDER: &str = "REPLACE_ME";

/// `provider.kubernetes.server`: kept when it names another cluster; this cluster's own API
/// server (ESO's default `kubernetes.default`) is the one the agent reads anyway.
fn server(f: &mut Fields<'_>, notes: &mut Notes) -> Result<Option<KubernetesServer>, String> {
    let at = f.at("server");
    let Some(mut s) = f.object("server", notes) else {
        return Ok(None);
    };
    let url = s.string("url", notes);
    let remote = url.as_deref().filter(|u| !in_cluster(u));
    let Some(url) = remote else {
        // Its CA is the one the agent's connection already trusts.
        let _ = (s.value("caBundle"), s.value("caProvider"));
        s.finish(notes);
        notes.warn(
            at,
            "names this cluster's own API server (ESO's default kubernetes.default), which \
             Latchkey reads through the agent's connection; not carried over",
        );
        return Ok(None);
    };
    let url = match url.strip_prefix("http://") {
        Some(_) => {
            return Err(format!(
                "{}: Latchkey calls a remote API server over https only",
                s.at("url")
            ));
        }
        None if url.starts_with("https://") => url.to_string(),
        None => format!("https://{url}"),
    };
    let ca_bundle = s.string("caBundle", notes);
    let ca_provider = super::eso_vault::ca_provider(&mut s, notes)?;
    s.finish(notes);
    if ca_bundle.is_some() == ca_provider.is_some() {
        return Err(format!(
            "{}: Latchkey verifies a remote API server with exactly one of caBundle and \
             caProvider",
            s.path()
        ));
    }
    Ok(Some(KubernetesServer {
        url,
        ca_bundle,
        ca_provider,
    }))
}

/// True when `url` names the API server of the cluster it is used in (the in-cluster Service).
fn in_cluster(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url);
    let host = rest.split(['/', ':']).next().unwrap_or_default();
    matches!(
        host.trim_end_matches('.'),
        "kubernetes"
            | "kubernetes.default"
            | "kubernetes.default.svc"
            | "kubernetes.default.svc.cluster.local"
    )
}

/// `provider.fake`. Values are carried into the output but never into notes.
fn fake(f: &mut Fields<'_>, notes: &mut Notes) -> FakeProvider {
    let mut data = Vec::new();
    for (path, item) in f.list("data", notes) {
        let Some(mut e) = Fields::of(item, &path, notes) else {
            continue;
        };
        let key = e.string("key", notes);
        let version = e.string("version", notes);
        let mut value = e.string("value", notes);
        if value.is_none()
            && let Some(map) = e.value("valueMap")
        {
            // ESO's deprecated valueMap served the map as JSON; the fake provider takes JSON text.
            match serde_json::to_string(map) {
                Ok(json) => value = Some(json),
                Err(_) => notes.warn(
                    e.at("valueMap"),
                    "cannot be written as JSON; not carried over",
                ),
            }
        }
        e.finish(notes);
        match (key, value) {
            (Some(key), Some(value)) => data.push(FakeEntry {
                key,
                value,
                version,
            }),
            _ => notes.warn(path, "needs key and value; not carried over"),
        }
    }
    FakeProvider {
        data,
        latency: None,
    }
}
