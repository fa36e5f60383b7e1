//! Pushes to the `kubernetes` provider: keys of a Secret, written AS THE PUSHSECRET'S SERVICE
//! ACCOUNT with its own token, exactly as the provider reads as the pod. The agent's and the
//! controller's identities are never used, so a push writes only where the account's RBAC lets
//! it (`get`, `create`, `update`, and `delete` for `deletionPolicy: Delete`, on Secrets).
//!
//! `remoteRef.remoteKey` names the Secret and `property` the key in it (a Secret is a map of
//! keys, so a push without `property` is refused). What Latchkey creates carries the label
//! `app.kubernetes.io/managed-by: latchkey`; a Secret without it is someone else's. Every write
//! is an update with the resourceVersion read, so a Secret changed in between is not written
//! over: the push fails and is made again from what is there then.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::kubernetes::{api_error, pod_client};
use super::push::{MARK_VALUE, MAX_PUSH_BYTES, PushError, PushPolicy, PushValue, Pushed, Pusher};
use super::{BuildContext, ProviderError};
use crate::api::store::KubernetesProvider;
use crate::secret::SecretBytes;

/// The label marking a Secret Latchkey created (Kubernetes' recommended `managed-by` label).
pub const MARK_LABEL: &str = "app.kubernetes.io/managed-by";

/// Writes Secrets of one namespace with one service account's token.
pub struct KubernetesPush {
    secrets: Api<Secret>,
    namespace: String,
}

impl KubernetesPush {
    /// A pusher into the account's own namespace, authenticated as the account.
    pub fn new(spec: &KubernetesProvider, ctx: &BuildContext<'_>) -> Result<Self, ProviderError> {
        let audience = spec.audience.as_deref().unwrap_or("");
        let client = pod_client(ctx.env.kube.as_ref(), ctx.pod, audience)?;
        Ok(Self::from_client(client, &ctx.pod.namespace))
    }

    /// A pusher into `namespace` through `client` (tests, and [`Self::new`]).
    pub fn from_client(client: Client, namespace: &str) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    fn at(&self, remote_key: &str) -> String {
        format!("Secret {}/{remote_key}", self.namespace)
    }

    async fn current(&self, remote_key: &str) -> Result<Option<Secret>, PushError> {
        self.secrets
            .get_opt(remote_key)
            .await
            .map_err(|e| self.failed(remote_key, "read", e))
    }

    /// The API server's refusal, naming the Secret; a 409 means it changed since it was read.
    fn failed(&self, remote_key: &str, what: &str, e: kube::Error) -> PushError {
        if let kube::Error::Api(status) = &e
            && status.code == 409
        {
            return ProviderError::Unavailable(format!(
                "{} changed while it was being written; it is pushed again from what it \
                 holds then",
                self.at(remote_key)
            ))
            .into();
        }
        let at = self.at(remote_key);
        match api_error(e) {
            ProviderError::PermissionDenied(why) => {
                ProviderError::PermissionDenied(format!("cannot {what} {at}: {why}"))
            }
            ProviderError::NotFound => ProviderError::NotFound,
            other => ProviderError::Unavailable(format!("cannot {what} {at}: {other}")),
        }
        .into()
    }
}

fn marked(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MARK_LABEL))
        .is_some_and(|v| v == MARK_VALUE)
}

/// The keys to write, checked: a Secret's keys, within the push size limit.
fn keys<'a>(
    remote_key: &str,
    value: &'a PushValue,
) -> Result<&'a BTreeMap<String, SecretBytes>, PushError> {
    let PushValue::Properties(properties) = value else {
        return Err(ProviderError::Config(format!(
            "the kubernetes provider writes keys of Secret {remote_key:?}: set \
             remoteRef.property to the key to write"
        ))
        .into());
    };
    for property in properties.keys() {
        let valid = !property.is_empty()
            && property.len() <= 253
            && property
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(ProviderError::Config(format!(
                "property {property:?} is not a valid Secret key (letters, digits, '-', '_', \
                 '.'; at most 253)"
            ))
            .into());
        }
    }
    Ok(properties)
}

/// `data` as it is written, if within [`MAX_PUSH_BYTES`].
fn bounded(
    remote_key: &str,
    data: BTreeMap<String, ByteString>,
) -> Result<BTreeMap<String, ByteString>, PushError> {
    let size: usize = data.iter().map(|(k, v)| k.len() + v.0.len()).sum();
    if size > MAX_PUSH_BYTES {
        return Err(PushError::TooLarge {
            remote_key: remote_key.to_string(),
            size,
            max: MAX_PUSH_BYTES,
        });
    }
    Ok(data)
}

fn set_keys(data: &mut BTreeMap<String, ByteString>, properties: &BTreeMap<String, SecretBytes>) {
    for (k, v) in properties {
        data.insert(k.clone(), ByteString(v.expose().to_vec()));
    }
}

fn version(secret: &Secret) -> String {
    secret.metadata.resource_version.clone().unwrap_or_default()
}

#[async_trait]
impl Pusher for KubernetesPush {
    async fn push(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
    ) -> Result<Pushed, PushError> {
        // The name goes into the request path: anything but a Kubernetes name is refused here.
        crate::api::validate::object_name("remoteRef.remoteKey (a Secret name)", remote_key)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let properties = keys(remote_key, value)?;
        let Some(mut secret) = self.current(remote_key).await? else {
            let mut data = BTreeMap::new();
            set_keys(&mut data, properties);
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(remote_key.to_string()),
                    labels: Some([(MARK_LABEL.to_string(), MARK_VALUE.to_string())].into()),
                    ..Default::default()
                },
                data: Some(bounded(remote_key, data)?),
                ..Default::default()
            };
            return match self.secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => Ok(Pushed::Written {
                    version: version(&created),
                }),
                // Created by someone else since it was looked at: theirs.
                Err(kube::Error::Api(s)) if s.code == 409 => Err(PushError::Conflict {
                    remote_key: remote_key.to_string(),
                }),
                Err(e) => Err(self.failed(remote_key, "create", e)),
            };
        };
        if policy.if_not_exists {
            return Ok(Pushed::Kept);
        }
        if !marked(&secret) && !policy.adopt {
            return Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            });
        }
        let mut data = secret.data.take().unwrap_or_default();
        set_keys(&mut data, properties);
        secret.data = Some(bounded(remote_key, data)?);
        // Marked in the same write as the data: one update, all keys and the mark, or nothing.
        secret
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(MARK_LABEL.to_string(), MARK_VALUE.to_string());
        // `replace` sends the resourceVersion read above: a Secret changed since fails with 409.
        let written = self
            .secrets
            .replace(remote_key, &PostParams::default(), &secret)
            .await
            .map_err(|e| self.failed(remote_key, "update", e))?;
        Ok(Pushed::Written {
            version: version(&written),
        })
    }

    async fn delete(&self, remote_key: &str, properties: &[String]) -> Result<(), PushError> {
        crate::api::validate::object_name("remoteRef.remoteKey (a Secret name)", remote_key)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let Some(mut secret) = self.current(remote_key).await? else {
            return Ok(());
        };
        let ours = marked(&secret);
        let mut data = secret.data.take().unwrap_or_default();
        for property in properties {
            data.remove(property);
        }
        let whole = properties.is_empty();
        if whole && !ours {
            return Err(PushError::Conflict {
                remote_key: remote_key.to_string(),
            });
        }
        if ours && (whole || data.is_empty()) {
            // Only the Secret as read: one changed or recreated since is not deleted.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: secret.metadata.resource_version.clone(),
                    uid: secret.metadata.uid.clone(),
                }),
                ..Default::default()
            };
            return match self.secrets.delete(remote_key, &params).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(self.failed(remote_key, "delete", e)),
            };
        }
        secret.data = Some(data);
        match self
            .secrets
            .replace(remote_key, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.failed(remote_key, "update", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_needs_a_property_that_is_a_secret_key() {
        let whole = PushValue::Whole(SecretBytes::from("hunter2"));
        let err = keys("db", &whole).unwrap_err().to_string();
        assert!(err.contains("set remoteRef.property"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        for bad in ["", "a/b", "a b", &"k".repeat(254)] {
            let value =
                PushValue::Properties([(bad.to_string(), SecretBytes::from("hunter2"))].into());
            let err = keys("db", &value).unwrap_err().to_string();
            assert!(err.contains("not a valid Secret key"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let good = PushValue::Properties([("tls.crt".to_string(), SecretBytes::from("x"))].into());
        assert!(keys("db", &good).is_ok());
    }

    #[test]
    fn a_secret_over_the_limit_is_not_written() {
        let data = [("big".to_string(), ByteString(vec![b'x'; MAX_PUSH_BYTES]))].into();
        let err = bounded("db", data).unwrap_err();
        assert!(matches!(err, PushError::TooLarge { .. }), "{err}");
    }
}
