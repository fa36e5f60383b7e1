//! The writes and deletes of a target Secret, each one step with the check that allowed it: a
//! missing Secret is made with a create (which fails when someone made it meanwhile), and a
//! Secret found to be the controller's own or opted in to a Merge is written or deleted only at
//! the resourceVersion (and uid) it was checked at. Two ExternalSecrets racing for one name
//! therefore never both write it: the loser's create or write fails and it reports
//! `SecretConflict` or retries from a fresh check.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tracing::info;

use super::{MirrorError, Reconciler, describe};
use crate::api::ExternalSecret;
use crate::api::external_secret::{CreationPolicy, DeletionPolicy};
use crate::mirror::desired::{self, FIELD_MANAGER};
use crate::mirror::ownership::Access;
use crate::mirror::status::{Outcome, Reason};

impl Reconciler {
    /// The backend says a remote value does not exist: apply `deletionPolicy`, to a Secret the
    /// controller created (Delete) or one it may write (Merge) only.
    pub(super) async fn remote_gone(
        &self,
        es: &ExternalSecret,
        policy: CreationPolicy,
        secrets: &Api<Secret>,
        access: &Access,
        target: &str,
        what: &str,
    ) -> Result<Outcome, MirrorError> {
        let namespace = es.metadata.namespace.clone().unwrap_or_default();
        let name = es.metadata.name.clone().unwrap_or_default();
        let outcome = |reason, message| Outcome {
            reason,
            message,
            refreshed: false,
            synced_generation: None,
            secret: target.to_string(),
        };
        let deletion = es
            .spec
            .target
            .as_ref()
            .and_then(|t| t.deletion_policy)
            .unwrap_or_default();
        match (deletion, access) {
            (DeletionPolicy::Retain, _) => Ok(outcome(
                Reason::SecretSyncedError,
                format!(
                    "{what}: not found in the backend; the Secret is kept (deletionPolicy Retain)"
                ),
            )),
            (DeletionPolicy::Delete, Access::Merge { .. }) => Ok(outcome(
                Reason::SecretSyncedError,
                format!(
                    "{what}: not found in the backend; Secret {target:?} is kept: deletionPolicy \
                     Delete deletes only Secrets Latchkey created, and this one was merged into"
                ),
            )),
            (
                DeletionPolicy::Delete,
                Access::Own {
                    resource_version,
                    uid,
                },
            ) => {
                if self.may_write() {
                    if self.dry_run {
                        info!(%namespace, external_secret = %name, secret = %target, "dry run: would delete the Secret");
                    } else {
                        // Only the object checked, as it was checked: not one created since
                        // under the same name, nor one whose marks changed meanwhile.
                        let params = DeleteParams {
                            preconditions: Some(Preconditions {
                                uid: Some(uid.clone()),
                                resource_version: Some(resource_version.clone()),
                            }),
                            ..DeleteParams::default()
                        };
                        match secrets.delete(target, &params).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(s)) if s.code == 404 => {}
                            Err(kube::Error::Api(s)) if s.code == 409 => {
                                return Ok(outcome(
                                    Reason::SecretSyncedError,
                                    format!(
                                        "{what}: not found in the backend; Secret {target:?} \
                                         changed since it was checked and is checked again \
                                         before it is deleted"
                                    ),
                                ));
                            }
                            Err(e) => {
                                return Err(self.api_error(
                                    &namespace,
                                    &name,
                                    "deleting the Secret",
                                    e,
                                ));
                            }
                        }
                        self.forget_written(&namespace, target);
                    }
                }
                Ok(outcome(
                    Reason::SecretDeleted,
                    format!(
                        "{what}: not found in the backend; Secret {target:?} deleted (deletionPolicy Delete)"
                    ),
                ))
            }
            (DeletionPolicy::Delete, Access::Create) => Ok(outcome(
                Reason::SecretDeleted,
                format!("{what}: not found in the backend; Secret {target:?} does not exist"),
            )),
            (DeletionPolicy::Merge, access) => {
                if *access != Access::Create {
                    let wanted =
                        desired::secret(es, policy, None).map_err(|e| MirrorError::Api {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            reason: e.to_string(),
                        })?;
                    let key = (namespace.clone(), target.to_string());
                    if let Err((reason, message)) =
                        self.write(secrets, &key, &name, &wanted, access).await
                    {
                        return Ok(outcome(reason, format!("{what}: {message}")));
                    }
                }
                Ok(outcome(
                    Reason::SecretDeleted,
                    format!(
                        "{what}: not found in the backend; the keys Latchkey wrote were removed \
                         from Secret {target:?} (deletionPolicy Merge)"
                    ),
                ))
            }
        }
    }

    /// Writes `wanted` as `access` allows: creates a missing Secret, then applies its values at
    /// exactly the resourceVersion checked (or just created), taking back fields others changed
    /// (drift repair) on a Secret that is the controller's or opted in.
    pub(super) async fn write(
        &self,
        secrets: &Api<Secret>,
        key: &(String, String),
        external_secret: &str,
        wanted: &desired::Desired,
        access: &Access,
    ) -> Result<(), (Reason, String)> {
        if !self.may_write() {
            return Err((
                Reason::SecretSyncedError,
                "this replica lost leadership before writing; the leader will".into(),
            ));
        }
        if self.dry_run {
            info!(namespace = %key.0, secret = %wanted.name, keys = ?wanted.keys, "dry run: would apply the Secret");
            return Ok(());
        }
        let resource_version = match access {
            Access::Create => self.create(secrets, wanted).await?,
            checked => checked.resource_version().unwrap_or_default().to_string(),
        };
        let mut body = wanted.body.clone();
        // A precondition: the apply fails with 409 when the Secret changed since the check.
        body["metadata"]["resourceVersion"] = json!(resource_version);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match secrets
            .patch(&wanted.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(written) => {
                if let Some(rv) = written.metadata.resource_version {
                    self.remember_written(key.clone(), external_secret, rv);
                }
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Err((
                Reason::SecretSyncedError,
                format!(
                    "Secret {:?} changed while it was being written; it is checked again and \
                     written on the next attempt",
                    wanted.name
                ),
            )),
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("immutable") => Err((
                Reason::SecretImmutable,
                format!(
                    "Secret {:?} is immutable and its values changed; delete it to let Latchkey \
                     write the new values",
                    wanted.name
                ),
            )),
            Err(kube::Error::Api(s)) if s.code == 422 => Err((
                Reason::InvalidTarget,
                format!(
                    "the API server refused Secret {:?}: {}",
                    wanted.name, s.message
                ),
            )),
            Err(e) => Err((
                Reason::SecretSyncedError,
                format!("cannot write Secret {:?}: {}", wanted.name, describe(&e)),
            )),
        }
    }

    /// Creates the missing Secret with its marks, owner and type (no values); its
    /// resourceVersion. Fails, touching nothing, when a Secret of that name exists by now.
    async fn create(
        &self,
        secrets: &Api<Secret>,
        wanted: &desired::Desired,
    ) -> Result<String, (Reason, String)> {
        let body: Secret = serde_json::from_value(desired::creation_body(wanted)).map_err(|e| {
            (
                Reason::InvalidTarget,
                format!("Secret {:?} cannot be built: {e}", wanted.name),
            )
        })?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match secrets.create(&params, &body).await {
            Ok(created) => Ok(created.metadata.resource_version.unwrap_or_default()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err((
                Reason::SecretConflict,
                format!(
                    "Secret {:?} was created by someone else while this ExternalSecret was \
                     creating it (another ExternalSecret naming the same target?); it is left \
                     untouched",
                    wanted.name
                ),
            )),
            Err(kube::Error::Api(s)) if s.code == 422 => Err((
                Reason::InvalidTarget,
                format!(
                    "the API server refused Secret {:?}: {}",
                    wanted.name, s.message
                ),
            )),
            Err(e) => Err((
                Reason::SecretSyncedError,
                format!("cannot create Secret {:?}: {}", wanted.name, describe(&e)),
            )),
        }
    }
}
