//! ESO `provider.vault` -> Latchkey's `vault` store block: server, KV mount and version, CA, and
//! the login methods Latchkey has (token, AppRole, kubernetes, jwt, userPass, cert, iam).

use super::eso_refs::{audience, selector, service_account_ref};
use super::fields::Fields;
use super::notes::Notes;
use super::spc_aws::ROLE_PLACEHOLDER;
use crate::api::store::{
    AwsJwtAuth, CaProvider, CaProviderKind, VaultAppRole, VaultAuth, VaultCert, VaultIamAuth,
    VaultProvider, VaultRoleAuth, VaultUserPass,
};

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

/// `caProvider` (of a Vault store, or a kubernetes store's `server`): the same fields in
/// Latchkey.
pub(super) fn ca_provider(
    f: &mut Fields<'_>,
    notes: &mut Notes,
) -> Result<Option<CaProvider>, String> {
    let at = f.at("caProvider");
    let Some(mut c) = f.object("caProvider", notes) else {
        return Ok(None);
    };
    let kind = match c.string("type", notes).as_deref() {
        Some("Secret") => CaProviderKind::Secret,
        Some("ConfigMap") => CaProviderKind::ConfigMap,
        _ => return Err(format!("{at}.type must be Secret or ConfigMap")),
    };
    let (name, key) = (c.string("name", notes), c.string("key", notes));
    let namespace_at = c.at("namespace");
    let namespace = c.string("namespace", notes);
    if namespace.is_some() {
        notes.warn(
            namespace_at,
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
        _ => Err(format!("{at} needs name and key")),
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
