//! Pushes to the `kubernetes` provider: keys of a Secret, written AS THE PUSHSECRET'S SERVICE
//! ACCOUNT with its own token (or the store's stored token for a remote server), on the server and
//! in the namespace the provider reads from ([`KubernetesSecrets::build`]). The agent's and the
//! controller's identities are never used, so a push writes only where that identity's RBAC lets
//! it (`get`, `create`, `update`, and `delete` for `deletionPolicy: Delete`, on Secrets).
//!
//! `remoteRef.remoteKey` names the Secret and `property` the key in it (a Secret is a map of
//! keys, so a push without `property` is refused). What Latchkey creates carries the label
//! `app.kubernetes.io/managed-by: latchkey`; a Secret without it is someone else's. Every write
//! is an update with the resourceVersion read, so a Secret changed in between is not written
//! over: the push fails and is made again from what is there then.
//!
//! An entry's `labels` and `annotations` go in that same write (`targetMergePolicy` says what
//! happens to those the Secret has); the source Secret's are never copied, so neither is
//! kubectl's last-applied copy of its values.

use crate::api::LAST_APPLIED_ANNOTATION;
use crate::api::push_metadata::{PushMetadataSpec, TargetMergePolicy};
use std::collections::BTreeMap;
use std::future::Future;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::remote::{self, Remote};
use super::{KubernetesSecrets, api_error};
use crate::api::store::KubernetesProvider;
use crate::providers::push::{
    MARK_VALUE, MAX_PUSH_BYTES, PushError, PushPolicy, PushValue, Pushed, Pusher,
};
use crate::providers::{BuildContext, ProviderError};
use crate::secret::SecretBytes;

pub use crate::api::push_metadata::MARK_LABEL;

/// Writes Secrets of one namespace with one service account's token.
pub struct KubernetesPush {
    secrets: Api<Secret>,
    namespace: String,
    /// The remote server, when the store names one: its URL for messages, its token scrubbed
    /// from its answers.
    remote: Option<Remote>,
}

impl KubernetesPush {
    /// A pusher into the store's namespace (`remoteNamespace`, default the account's own) on its
    /// server (default the agent's), authenticated as the account or the stored token.
    pub async fn new(
        spec: &KubernetesProvider,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, ProviderError> {
        let reader = KubernetesSecrets::build(spec, ctx).await?;
        let namespace = spec
            .remote_namespace
            .clone()
            .unwrap_or_else(|| ctx.pod.namespace.clone());
        Ok(Self {
            secrets: reader.secrets,
            namespace,
            remote: reader.remote,
        })
    }

    /// A pusher into `namespace` of the agent's API server through `client` (tests).
    pub fn from_client(client: Client, namespace: &str) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            remote: None,
        }
    }

    fn at(&self, remote_key: &str) -> String {
        match &self.remote {
            Some(r) => format!("Secret {}/{remote_key} on {}", self.namespace, r.url),
            None => format!("Secret {}/{remote_key}", self.namespace),
        }
    }

    /// `call`, bounded in time; its error names the Secret (see [`Self::failed`]). `what` is
    /// `create`, `read`, `delete`, or `update` of resourceVersion `read_version`.
    async fn send<T>(
        &self,
        remote_key: &str,
        (what, read_version): (&str, &str),
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, PushError> {
        match tokio::time::timeout(remote::REQUEST_TIMEOUT, call).await {
            Err(_) => {
                Err(remote::timed_out(self.remote.as_ref().map_or("", |r| r.url.as_str())).into())
            }
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(self.failed(remote_key, (what, read_version), e)),
        }
    }

    async fn current(&self, remote_key: &str) -> Result<Option<Secret>, PushError> {
        self.send(remote_key, ("read", ""), self.secrets.get_opt(remote_key))
            .await
    }

    /// The server's refusal, naming the Secret: a 409 on a create is someone else's Secret made
    /// meanwhile, on an update a change since it was read.
    fn failed(
        &self,
        remote_key: &str,
        (what, read_version): (&str, &str),
        e: kube::Error,
    ) -> PushError {
        if let kube::Error::Api(status) = &e
            && status.code == 409
        {
            return if what == "create" {
                PushError::Conflict {
                    remote_key: remote_key.to_string(),
                }
            } else {
                PushError::Changed {
                    remote_key: remote_key.to_string(),
                    version: read_version.to_string(),
                }
            };
        }
        let at = self.at(remote_key);
        let error = match &self.remote {
            Some(r) => remote::api_error(e, r),
            None => api_error(e),
        };
        match error {
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

/// The labels and annotations `metadata` sets, checked as the API server would (and bounded),
/// naming the key at fault and never a value.
fn check_labels(metadata: &PushMetadataSpec) -> Result<(), PushError> {
    let bad = |field, why| PushError::BadMetadata { field, why };
    for (key, value) in &metadata.labels {
        if !qualified_name(key) {
            return Err(bad("labels", not_a_key("label", key)));
        }
        if !(value.is_empty() || name_part(value)) {
            return Err(bad(
                "labels",
                format!(
                    "the value of label {key:?} is not a Kubernetes label value (empty, or at \
                     most 63 letters, digits, '-', '_' and '.', beginning and ending with a \
                     letter or digit)"
                ),
            ));
        }
    }
    for key in metadata.annotations.keys() {
        if !qualified_name(key) {
            return Err(bad("annotations", not_a_key("annotation", key)));
        }
        if key == LAST_APPLIED_ANNOTATION {
            return Err(bad(
                "annotations",
                format!(
                    "{key:?} is kubectl's copy of what was applied (for a Secret, its values) \
                     and is never written by Latchkey"
                ),
            ));
        }
    }
    let size: usize = metadata
        .annotations
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if size > MAX_PUSH_BYTES {
        return Err(bad(
            "annotations",
            format!("{size} bytes in all, over the limit of {MAX_PUSH_BYTES} for one push"),
        ));
    }
    Ok(())
}

fn not_a_key(what: &str, key: &str) -> String {
    let shown: String = key.chars().take(64).collect();
    format!(
        "{shown:?} is not a Kubernetes {what} key (an optional DNS subdomain and '/', then at \
         most 63 letters, digits, '-', '_' and '.', beginning and ending with a letter or digit)"
    )
}

/// A Kubernetes qualified name: label and annotation keys.
fn qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty() && crate::identity::is_dns_subdomain(prefix) && name_part(name)
        }
        None => name_part(key),
    }
}

/// The name part of a qualified name, and a non-empty label value.
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Sets the labels and annotations of `meta` (a Secret read, or a new one) as `metadata` and
/// `policy` say, and the mark in every case; whether that changed them. Compared in place: the
/// annotations read may hold kubectl's last-applied copy of the Secret's values.
fn set_metadata(
    meta: &mut ObjectMeta,
    metadata: &PushMetadataSpec,
    policy: TargetMergePolicy,
) -> bool {
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    match policy {
        TargetMergePolicy::Merge => {
            for (into, from) in [
                (&mut *labels, &metadata.labels),
                (&mut *annotations, &metadata.annotations),
            ] {
                for (k, v) in from {
                    changed |= into.insert(k.clone(), v.clone()).as_ref() != Some(v);
                }
            }
        }
        TargetMergePolicy::Replace => {
            let mut wanted = metadata.labels.clone();
            wanted.insert(MARK_LABEL.to_string(), MARK_VALUE.to_string());
            changed |= *labels != wanted || *annotations != metadata.annotations;
            *labels = wanted;
            annotations.clone_from(&metadata.annotations);
        }
        TargetMergePolicy::Ignore => {}
    }
    changed |= labels
        .insert(MARK_LABEL.to_string(), MARK_VALUE.to_string())
        .as_deref()
        != Some(MARK_VALUE);
    if annotations.is_empty() {
        meta.annotations = None;
    }
    changed
}

fn version(secret: &Secret) -> String {
    secret.metadata.resource_version.clone().unwrap_or_default()
}

#[async_trait]
impl Pusher for KubernetesPush {
    async fn push_with(
        &self,
        remote_key: &str,
        value: &PushValue,
        policy: PushPolicy,
        metadata: &PushMetadataSpec,
    ) -> Result<Pushed, PushError> {
        self.check_metadata(metadata)?;
        // The name goes into the request path: anything but a Kubernetes name is refused here.
        crate::api::validate::object_name("remoteRef.remoteKey (a Secret name)", remote_key)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        let properties = keys(remote_key, value)?;
        let Some(mut secret) = self.current(remote_key).await? else {
            let mut data = BTreeMap::new();
            set_keys(&mut data, properties);
            let mut secret = Secret {
                metadata: ObjectMeta {
                    name: Some(remote_key.to_string()),
                    ..Default::default()
                },
                data: Some(bounded(remote_key, data)?),
                ..Default::default()
            };
            // A new Secret has nothing to keep or leave: every policy gives it these.
            set_metadata(&mut secret.metadata, metadata, TargetMergePolicy::Replace);
            let created = self
                .send(
                    remote_key,
                    ("create", ""),
                    self.secrets.create(&PostParams::default(), &secret),
                )
                .await?;
            return Ok(Pushed::Written {
                version: version(&created),
            });
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
        // Compared in place: no second copy of the values read.
        let same_data = properties
            .iter()
            .all(|(k, v)| data.get(k).is_some_and(|b| b.0 == v.expose()));
        set_keys(&mut data, properties);
        secret.data = Some(bounded(remote_key, data)?);
        // Marked in the same write as the data, with the labels and annotations: one update,
        // all of it, or nothing.
        let target = metadata.target_merge_policy.unwrap_or_default();
        let changed = set_metadata(&mut secret.metadata, metadata, target);
        if same_data && !changed {
            // Already what would be written (a restarted controller): no new resourceVersion.
            return Ok(Pushed::Unchanged {
                version: version(&secret),
            });
        }
        // `replace` sends the resourceVersion read above: a Secret changed since fails with 409.
        let read = version(&secret);
        let written = self
            .send(
                remote_key,
                ("update", &read),
                self.secrets
                    .replace(remote_key, &PostParams::default(), &secret),
            )
            .await?;
        Ok(Pushed::Written {
            version: version(&written),
        })
    }

    fn metadata_fields(&self) -> &'static [&'static str] {
        &[
            "labels",
            "annotations",
            "sourceMergePolicy",
            "targetMergePolicy",
            "remoteNamespace",
        ]
    }

    /// `sourceMergePolicy` needs no check: validation lets only `Replace` through, which is
    /// what is done anyway (the source Secret's labels are never copied).
    fn check_metadata(&self, metadata: &PushMetadataSpec) -> Result<(), PushError> {
        if let Some(ns) = &metadata.remote_namespace
            && *ns != self.namespace
        {
            return Err(PushError::BadMetadata {
                field: "remoteNamespace",
                why: format!(
                    "this store writes namespace {:?}, not {ns:?}; a store's credential reaches \
                     only where its author pointed it, so push to {ns:?} with a store whose \
                     remoteNamespace is {ns:?}",
                    self.namespace
                ),
            });
        }
        check_labels(metadata)
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
            return match self
                .send(
                    remote_key,
                    ("delete", ""),
                    self.secrets.delete(remote_key, &params),
                )
                .await
            {
                Ok(_) | Err(PushError::Backend(ProviderError::NotFound)) => Ok(()),
                Err(e) => Err(e),
            };
        }
        secret.data = Some(data);
        let (params, read) = (PostParams::default(), version(&secret));
        let update = self.secrets.replace(remote_key, &params, &secret);
        match self.send(remote_key, ("update", &read), update).await {
            Ok(_) | Err(PushError::Backend(ProviderError::NotFound)) => Ok(()),
            Err(e) => Err(e),
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
