//! Which Secrets the controller may write and delete, decided from a Secret's metadata alone
//! before any backend call. Pure: no API calls.
//!
//! A Secret is the controller's only when its own create made it for this ExternalSecret: the
//! ExternalSecret's ownerReference (Owner) or the [`CREATED_FOR_ANNOTATION`] with its uid, which
//! only that create sets. Marks a Merge leaves (the managed label, the ExternalSecret
//! annotation, the data hash) prove nothing. A Secret that is not the controller's is written
//! only by a Merge it opted in to with [`MERGE_FROM_ANNOTATION`], and never deleted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::desired::{CREATED_FOR_ANNOTATION, FIELD_MANAGER, MERGE_FROM_ANNOTATION};
use super::status::Reason;
use crate::api::external_secret::CreationPolicy;

/// Annotation the API server requires on every `kubernetes.io/service-account-token` Secret:
/// seen in metadata, it marks a token Secret without reading the Secret's values.
const SERVICE_ACCOUNT_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";

/// How the controller may write the target Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Absent: created with a create, which fails when someone created it meanwhile.
    Create,
    /// Created by this controller for this ExternalSecret: updated only at this version.
    Own {
        /// The resourceVersion ownership was checked at.
        resource_version: String,
        /// The Secret's uid, for a delete's precondition.
        uid: String,
    },
    /// Someone else's, opted in to this ExternalSecret's Merge: written only at this version.
    Merge {
        /// The resourceVersion the opt-in was checked at.
        resource_version: String,
    },
}

impl Access {
    /// The resourceVersion a write must find, `None` for a create.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Access::Create => None,
            Access::Own {
                resource_version, ..
            }
            | Access::Merge { resource_version } => Some(resource_version),
        }
    }
}

/// Whether this controller's create made `secret` for the ExternalSecret with `uid`.
pub fn created_for(secret: &ObjectMeta, uid: &str) -> bool {
    if uid.is_empty() {
        return false;
    }
    let owned = secret.owner_references.iter().flatten().any(|r| {
        r.uid == uid
            && r.kind == "ExternalSecret"
            && r.api_version.starts_with("latchkey.dev/")
            && r.controller == Some(true)
    });
    let marked = secret
        .annotations
        .as_ref()
        .and_then(|a| a.get(CREATED_FOR_ANNOTATION))
        .is_some_and(|v| v == uid);
    owned || marked
}

/// How the ExternalSecret `name` (uid `uid`) may write its target `existing` under `policy`,
/// or the reason and message (without the namespace/ExternalSecret prefix) of a refusal.
pub fn access(
    existing: Option<&ObjectMeta>,
    name: &str,
    uid: &str,
    policy: CreationPolicy,
    target: &str,
) -> Result<Access, (Reason, String)> {
    let Some(secret) = existing else {
        return match policy {
            CreationPolicy::Merge => Err((
                Reason::SecretMissing,
                format!(
                    "creationPolicy Merge needs an existing Secret {target:?} to merge into; \
                     create it with the annotation {MERGE_FROM_ANNOTATION}: {name}, or use \
                     creationPolicy Owner"
                ),
            )),
            _ => Ok(Access::Create),
        };
    };
    let resource_version = secret.resource_version.clone().unwrap_or_default();
    let annotations = secret.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(SERVICE_ACCOUNT_NAME_ANNOTATION)) {
        return Err((
            Reason::SecretConflict,
            format!(
                "Secret {target:?} is a service-account token Secret; Latchkey never writes \
                 one, whatever its annotations: choose another target name"
            ),
        ));
    }
    match policy {
        CreationPolicy::Merge => {
            let opted_in = annotations.and_then(|a| a.get(MERGE_FROM_ANNOTATION));
            match opted_in {
                Some(from) if from == name => Ok(Access::Merge { resource_version }),
                Some(from) => Err((
                    Reason::SecretConflict,
                    format!(
                        "Secret {target:?} accepts a Merge only from ExternalSecret {from:?} \
                         (annotation {MERGE_FROM_ANNOTATION}){}; it is left untouched",
                        owner_hint(secret)
                    ),
                )),
                None => Err((
                    Reason::SecretConflict,
                    format!(
                        "Secret {target:?} has not opted in to a Merge{}; it is left \
                         untouched. Whoever may edit it can allow this one with `kubectl \
                         annotate secret {target} {MERGE_FROM_ANNOTATION}={name}`",
                        owner_hint(secret)
                    ),
                )),
            }
        }
        _ if created_for(secret, uid) => Ok(Access::Own {
            resource_version,
            uid: secret.uid.clone().unwrap_or_default(),
        }),
        _ => Err((
            Reason::SecretConflict,
            format!(
                "Secret {target:?} exists and was not created by Latchkey for this \
                 ExternalSecret{}; it is left untouched (delete it to let Latchkey create it, \
                 or opt it in to creationPolicy Merge with the annotation \
                 {MERGE_FROM_ANNOTATION}: {name})",
                owner_hint(secret)
            ),
        )),
    }
}

/// Who else manages a Secret, for conflict messages.
fn owner_hint(secret: &ObjectMeta) -> String {
    let managers: Vec<&str> = secret
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .filter(|m| *m != FIELD_MANAGER)
        .collect();
    if managers.is_empty() {
        String::new()
    } else {
        format!(" (managed by {})", managers.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::desired::{EXTERNAL_SECRET_ANNOTATION, MANAGED_LABEL};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("app".into()),
            resource_version: Some("7".into()),
            uid: Some("secret-uid".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn marks_a_merge_leaves_give_no_ownership() {
        let mut merged = meta(&[
            (EXTERNAL_SECRET_ANNOTATION, "db"),
            (MERGE_FROM_ANNOTATION, "db"),
        ]);
        merged.labels = Some([(MANAGED_LABEL.to_string(), "true".to_string())].into());
        for policy in [CreationPolicy::Owner, CreationPolicy::Orphan] {
            let (reason, message) =
                access(Some(&merged), "db", "es-uid", policy, "app").unwrap_err();
            assert_eq!(reason, Reason::SecretConflict);
            assert!(message.contains("not created by Latchkey"), "{message}");
        }
        assert!(!created_for(&merged, "es-uid"));
    }

    #[test]
    fn only_its_own_create_makes_a_secret_the_controller_s() {
        let marked = meta(&[(CREATED_FOR_ANNOTATION, "es-uid")]);
        assert_eq!(
            access(Some(&marked), "db", "es-uid", CreationPolicy::Orphan, "app"),
            Ok(Access::Own {
                resource_version: "7".into(),
                uid: "secret-uid".into()
            })
        );
        // Another ExternalSecret of the same name (deleted and created again): not its.
        assert!(access(Some(&marked), "db", "new-uid", CreationPolicy::Owner, "app").is_err());
        let mut owned = meta(&[]);
        owned.owner_references = Some(vec![OwnerReference {
            api_version: "latchkey.dev/v1alpha1".into(),
            kind: "ExternalSecret".into(),
            name: "db".into(),
            uid: "es-uid".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        assert!(created_for(&owned, "es-uid"));
        assert!(!created_for(&owned, ""));
        assert_eq!(
            access(None, "db", "es-uid", CreationPolicy::Owner, "app"),
            Ok(Access::Create)
        );
    }

    #[test]
    fn merge_needs_the_secret_s_opt_in_for_this_external_secret() {
        let plain = meta(&[]);
        let (reason, message) =
            access(Some(&plain), "db", "u", CreationPolicy::Merge, "app").unwrap_err();
        assert_eq!(reason, Reason::SecretConflict);
        assert!(message.contains("latchkey.dev/merge-from=db"), "{message}");
        let other = meta(&[(MERGE_FROM_ANNOTATION, "other")]);
        assert!(access(Some(&other), "db", "u", CreationPolicy::Merge, "app").is_err());
        let opted = meta(&[(MERGE_FROM_ANNOTATION, "db")]);
        assert_eq!(
            access(Some(&opted), "db", "u", CreationPolicy::Merge, "app"),
            Ok(Access::Merge {
                resource_version: "7".into()
            })
        );
        assert_eq!(
            access(None, "db", "u", CreationPolicy::Merge, "app")
                .unwrap_err()
                .0,
            Reason::SecretMissing
        );
    }

    #[test]
    fn a_service_account_token_secret_is_never_written() {
        let token = meta(&[
            (SERVICE_ACCOUNT_NAME_ANNOTATION, "deployer"),
            (MERGE_FROM_ANNOTATION, "db"),
            (CREATED_FOR_ANNOTATION, "u"),
        ]);
        for policy in [
            CreationPolicy::Merge,
            CreationPolicy::Owner,
            CreationPolicy::Orphan,
        ] {
            let (reason, message) = access(Some(&token), "db", "u", policy, "app").unwrap_err();
            assert_eq!(reason, Reason::SecretConflict);
            assert!(message.contains("service-account token"), "{message}");
        }
    }
}
