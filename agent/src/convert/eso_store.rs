//! External Secrets Operator `SecretStore` / `ClusterSecretStore` (v1, v1beta1) -> Latchkey
//! stores, for the providers Latchkey has (aws Secrets Manager, vault KV, kubernetes, fake).
//! ESO reads with its controller's identity or a fixed service account; Latchkey always reads as
//! the pod (or the ExternalSecret's service account), so those references become notes.

use super::fields::Fields;
use super::notes::{Notes, quoted};
use super::output::{Document, Meta};
use super::spc_aws::{REGION_PLACEHOLDER, ROLE_PLACEHOLDER};
use crate::api::store::{
    AwsAuth, AwsJwtAuth, AwsProvider, AwsSecretRef, ClusterSecretStoreSpec, ClusterStoreCondition,
    Empty, FakeEntry, FakeProvider, KubernetesProvider, LabelSelector, LabelSelectorRequirement,
    SecretKeySelector, SecretStoreSpec, StoreProvider, VaultAppRole, VaultAuth, VaultIamAuth,
    VaultProvider, VaultRoleAuth,
};
use crate::api::store::{CaProvider, CaProviderKind, VaultCert, VaultUserPass};
use crate::api::{ClusterSecretStore, SecretStore, StoreKind};

/// Why a fixed service account is not carried over.
const SERVICE_ACCOUNT_WHY: &str = "Latchkey authenticates as the pod's own service account \
     (mounts) or the ExternalSecret's spec.serviceAccountName (mirrored Secrets), never a fixed \
     one; not carried over";

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
        "vault" => out.vault = Some(vault(&mut block, notes)?),
        "kubernetes" => out.kubernetes = Some(kubernetes(&mut block, meta, kind, notes)),
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
            let mut s = SecretStore::new(&meta.name, SecretStoreSpec { provider: out });
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

/// A reference to a key of a Secret (`name`, `key`, `namespace`).
fn selector(f: &mut Fields<'_>, key: &str, notes: &mut Notes) -> Option<SecretKeySelector> {
    let path = f.at(key);
    let mut s = f.object(key, notes)?;
    let name = s.string("name", notes);
    let k = s.string("key", notes);
    let namespace = s.string("namespace", notes);
    s.finish(notes);
    match (name, k) {
        (Some(name), Some(key)) => Some(SecretKeySelector {
            name,
            key,
            namespace,
        }),
        _ => {
            notes.warn(path, "needs name and key; not carried over");
            None
        }
    }
}

/// The token audience of a `serviceAccountRef` (`audiences`, at most one is kept); its `name`
/// (and `namespace`) become a note.
fn service_account_ref(f: &mut Fields<'_>, key: &str, notes: &mut Notes) -> Option<String> {
    let mut s = f.object(key, notes)?;
    s.drop_field("name", notes, SERVICE_ACCOUNT_WHY);
    s.drop_field("namespace", notes, SERVICE_ACCOUNT_WHY);
    let audience = audience(&mut s, notes);
    s.finish(notes);
    audience
}

/// `audiences`: Latchkey requests one token audience per store.
fn audience(f: &mut Fields<'_>, notes: &mut Notes) -> Option<String> {
    let path = f.at("audiences");
    let mut audiences = f.string_list("audiences", notes);
    if audiences.len() > 1 {
        notes.warn(
            path,
            "Latchkey requests a token for one audience: the first is kept, the others are not \
             carried over",
        );
    }
    (!audiences.is_empty()).then(|| audiences.remove(0))
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

/// `provider.vault`.
pub(super) fn vault(f: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultProvider, String> {
    let server = f
        .string("server", notes)
        .ok_or("spec.provider.vault.server is missing")?;
    let path = f.string("path", notes);
    if path.is_none() {
        notes.warn(
            f.at("path"),
            "is not set, so ESO read remoteRef keys as <mount>/<secret>; Latchkey's keys are \
             relative to path (default \"secret\"): set path to the KV mount and remove it from \
             the keys of the ExternalSecrets that use this store",
        );
    }
    let version = f.string("version", notes);
    let namespace = f.string("namespace", notes);
    let ca_bundle = f.string("caBundle", notes);
    let ca_provider = ca_provider(f, notes)?;
    f.drop_field(
        "tls",
        notes,
        "Latchkey has no TLS client certificates for Vault; not carried over",
    );
    for key in ["readYourWrites", "forwardInconsistent"] {
        f.drop_field(
            key,
            notes,
            "Latchkey has no Vault consistency options; not carried over",
        );
    }
    f.drop_field(
        "headers",
        notes,
        "Latchkey sends no custom headers; not carried over",
    );
    let mut a = f
        .object("auth", notes)
        .ok_or("spec.provider.vault.auth is missing")?;
    let mut auth = VaultAuth::default();
    for method in a.keys() {
        match method.as_str() {
            "tokenSecretRef" => auth.token_secret_ref = selector(&mut a, "tokenSecretRef", notes),
            "appRole" => auth.app_role = Some(app_role(&mut a, notes)?),
            "kubernetes" => auth.kubernetes = Some(kubernetes_login(&mut a, notes)?),
            "jwt" => auth.jwt = Some(jwt_login(&mut a, notes)?),
            "userPass" => auth.user_pass = Some(user_pass(&mut a, notes)?),
            "cert" => auth.cert = Some(cert_login(&mut a, notes)?),
            "iam" => auth.iam = Some(iam_login(&mut a, notes)?),
            "namespace" => a.drop_field(
                "namespace",
                notes,
                "Latchkey logs in within the store's namespace; a separate auth namespace is \
                 not carried over",
            ),
            other => {
                return Err(format!(
                    "spec.provider.vault.auth.{other}: this login method has no Latchkey \
                     equivalent (Latchkey has tokenSecretRef, appRole, kubernetes, jwt, userPass, \
                     cert and iam)"
                ));
            }
        }
    }
    a.finish(notes);
    Ok(VaultProvider {
        server,
        path,
        version,
        namespace,
        ca_bundle,
        ca_provider,
        auth,
    })
}

/// `caProvider` of a Vault store: the same fields in Latchkey.
fn ca_provider(f: &mut Fields<'_>, notes: &mut Notes) -> Result<Option<CaProvider>, String> {
    let Some(mut c) = f.object("caProvider", notes) else {
        return Ok(None);
    };
    let kind = match c.string("type", notes).as_deref() {
        Some("Secret") => CaProviderKind::Secret,
        Some("ConfigMap") => CaProviderKind::ConfigMap,
        _ => return Err("spec.provider.vault.caProvider.type must be Secret or ConfigMap".into()),
    };
    let (name, key) = (c.string("name", notes), c.string("key", notes));
    let at = c.at("namespace");
    let namespace = c.string("namespace", notes);
    if namespace.is_some() {
        notes.warn(
            at,
            "Latchkey reads the CA bundle as a credential Secret: from a SecretStore's own \
             namespace, or from the agent's namespace for a ClusterSecretStore; any other \
             namespace is refused when the store is used",
        );
    }
    c.finish(notes);
    match (name, key) {
        (Some(name), Some(key)) => Ok(Some(CaProvider {
            kind,
            name,
            key,
            namespace,
        })),
        _ => Err("spec.provider.vault.caProvider needs name and key".into()),
    }
}

/// `auth.userPass`.
fn user_pass(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultUserPass, String> {
    let mut f = a
        .object("userPass", notes)
        .ok_or("spec.provider.vault.auth.userPass is not an object")?;
    let path = f.string("path", notes);
    let username = f
        .string("username", notes)
        .ok_or("spec.provider.vault.auth.userPass.username is missing")?;
    let secret_ref = selector(&mut f, "secretRef", notes)
        .ok_or("spec.provider.vault.auth.userPass.secretRef is missing or incomplete")?;
    f.finish(notes);
    Ok(VaultUserPass {
        path,
        username,
        secret_ref,
    })
}

/// `auth.cert`.
fn cert_login(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultCert, String> {
    let mut f = a
        .object("cert", notes)
        .ok_or("spec.provider.vault.auth.cert is not an object")?;
    let path = f.string("path", notes);
    let client_cert = selector(&mut f, "clientCert", notes)
        .ok_or("spec.provider.vault.auth.cert.clientCert is missing or incomplete")?;
    let secret_ref = selector(&mut f, "secretRef", notes)
        .ok_or("spec.provider.vault.auth.cert.secretRef is missing or incomplete")?;
    f.finish(notes);
    Ok(VaultCert {
        path,
        client_cert,
        secret_ref,
    })
}

/// `auth.appRole`.
fn app_role(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultAppRole, String> {
    let mut f = a
        .object("appRole", notes)
        .ok_or("spec.provider.vault.auth.appRole is not an object")?;
    let path = f.string("path", notes);
    let role_id = f.string("roleId", notes).ok_or(
        "spec.provider.vault.auth.appRole.roleId is missing (Latchkey takes the role id inline; \
         roleRef has no equivalent)",
    )?;
    let secret_ref = selector(&mut f, "secretRef", notes)
        .ok_or("spec.provider.vault.auth.appRole.secretRef is missing or incomplete")?;
    f.finish(notes);
    Ok(VaultAppRole {
        path,
        role_id,
        secret_ref,
    })
}

/// `auth.kubernetes`: login with the pod's token.
fn kubernetes_login(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultRoleAuth, String> {
    let mut f = a
        .object("kubernetes", notes)
        .ok_or("spec.provider.vault.auth.kubernetes is not an object")?;
    let mount_path = f.string("mountPath", notes);
    let role = f
        .string("role", notes)
        .ok_or("spec.provider.vault.auth.kubernetes.role is missing")?;
    let audience = service_account_ref(&mut f, "serviceAccountRef", notes);
    f.drop_field(
        "secretRef",
        notes,
        "Latchkey logs in with the pod's own token, not one stored in a Secret; not carried over",
    );
    f.finish(notes);
    Ok(VaultRoleAuth {
        mount_path,
        role,
        audience,
    })
}

/// `auth.iam`: Vault's AWS IAM login, always signed with the pod's web identity.
fn iam_login(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultIamAuth, String> {
    let mut f = a
        .object("iam", notes)
        .ok_or("spec.provider.vault.auth.iam is not an object")?;
    if f.has("secretRef") {
        return Err(
            "spec.provider.vault.auth.iam.secretRef: Latchkey signs the IAM login with \
                    the pod's web identity (auth.iam.jwt), not static keys from a Secret"
                .into(),
        );
    }
    let vault_role = f
        .string("vaultRole", notes)
        .ok_or("spec.provider.vault.auth.iam.vaultRole is missing")?;
    let role = f.string("role", notes).unwrap_or_else(|| {
        notes.warn(
            f.at("role"),
            format!(
                "is not set (ESO took the role from a service account's \
                 eks.amazonaws.com/role-arn annotation): replace the placeholder role \
                 {ROLE_PLACEHOLDER} with the role the pod's token assumes"
            ),
        );
        ROLE_PLACEHOLDER.into()
    });
    let jwt = match f.object("jwt", notes) {
        Some(mut j) => {
            let audience = service_account_ref(&mut j, "serviceAccountRef", notes);
            j.finish(notes);
            AwsJwtAuth { audience }
        }
        None => {
            notes.warn(
                f.at("jwt"),
                "is not set, so ESO signed with its controller's own AWS identity; Latchkey \
                 signs with the pod's web identity (auth.iam.jwt): give the role a trust \
                 policy for the pod's service account",
            );
            AwsJwtAuth::default()
        }
    };
    f.drop_field(
        "externalID",
        notes,
        "Latchkey assumes the role with the pod's token, which takes no external id; not \
         carried over",
    );
    let out = VaultIamAuth {
        path: f.string("path", notes),
        vault_role,
        role,
        region: f.string("region", notes),
        endpoint: None,
        vault_aws_iam_server_id: f.string("vaultAwsIamServerID", notes),
        jwt: Some(jwt),
    };
    f.finish(notes);
    Ok(out)
}

/// `auth.jwt`: login with the pod's token.
fn jwt_login(a: &mut Fields<'_>, notes: &mut Notes) -> Result<VaultRoleAuth, String> {
    let mut f = a
        .object("jwt", notes)
        .ok_or("spec.provider.vault.auth.jwt is not an object")?;
    let mount_path = f.string("path", notes);
    let role = f
        .string("role", notes)
        .ok_or("spec.provider.vault.auth.jwt.role is missing (Latchkey needs a role)")?;
    f.drop_field(
        "secretRef",
        notes,
        "Latchkey logs in with the pod's own service-account token, not a JWT stored in a \
         Secret; not carried over",
    );
    let mut audience = None;
    if let Some(mut t) = f.object("kubernetesServiceAccountToken", notes) {
        let from_ref = service_account_ref(&mut t, "serviceAccountRef", notes);
        audience = audience_or(&mut t, notes, from_ref);
        t.drop_field(
            "expirationSeconds",
            notes,
            "kubelet decides the lifetime of the pod's token; not carried over",
        );
        t.finish(notes);
    }
    f.finish(notes);
    Ok(VaultRoleAuth {
        mount_path,
        role,
        audience,
    })
}

/// `audiences` of `f`, else `fallback`.
fn audience_or(f: &mut Fields<'_>, notes: &mut Notes, fallback: Option<String>) -> Option<String> {
    audience(f, notes).or(fallback)
}

/// `provider.kubernetes`: Latchkey reads the pod's own namespace, as the pod.
fn kubernetes(
    f: &mut Fields<'_>,
    meta: &Meta,
    kind: StoreKind,
    notes: &mut Notes,
) -> KubernetesProvider {
    let remote = f.string("remoteNamespace", notes);
    let same = kind == StoreKind::SecretStore && remote.is_some() && remote == meta.namespace;
    if remote.is_some() && !same {
        notes.warn(
            f.at("remoteNamespace"),
            "Latchkey reads Secrets of the pod's own namespace only (as the pod); not carried \
             over",
        );
    }
    f.drop_field(
        "server",
        notes,
        "Latchkey reads from the cluster it runs in; not carried over",
    );
    f.drop_field(
        "authRef",
        notes,
        "Latchkey reads with the pod's own token, not a kubeconfig; not carried over",
    );
    let mut audience = None;
    if let Some(mut a) = f.object("auth", notes) {
        audience = service_account_ref(&mut a, "serviceAccount", notes);
        for key in ["token", "cert"] {
            a.drop_field(
                key,
                notes,
                "Latchkey reads with the pod's own token, not stored credentials; not carried over",
            );
        }
        a.finish(notes);
    }
    KubernetesProvider { audience }
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
