//! Validation of kubelet's requests into domain types. Every rejection is INVALID_ARGUMENT and
//! says which field is wrong and what to do about it.

use std::path::{Component, Path, PathBuf};

use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};

use crate::api::ATTR_EXTERNAL_SECRET;
use crate::identity::{IdentityError, POD_INFO_PREFIX, PodInfo, is_dns_subdomain};
use crate::publish::PublishRequest;

/// A request kubelet should not have sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// A required field is empty.
    #[error("{0} is required")]
    Missing(&'static str),
    /// The target path is not a clean absolute path.
    #[error("target_path must be an absolute path without '.' or '..' components")]
    BadTargetPath,
    /// A raw block volume was requested.
    #[error("block volumes are not supported: Latchkey volumes are filesystems of secret files")]
    Block,
    /// No access type at all.
    #[error("volume_capability.access_type must be mount")]
    NoAccessType,
    /// The volume would be writable by the pod.
    #[error(
        "Latchkey volumes are read-only: set readOnly: true on the pod's csi volume \
         (pod.spec.volumes[].csi.readOnly)"
    )]
    NotReadOnly,
    /// The pod fields are missing or wrong.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The fsGroup is not a number.
    #[error("volume_capability.mount.volume_mount_group {0:?} is not a numeric group id")]
    BadMountGroup(String),
    /// The ExternalSecret name is not a Kubernetes name.
    #[error("volume attribute {ATTR_EXTERNAL_SECRET} {0:?} is not a valid Kubernetes name")]
    BadExternalSecretName(String),
    /// An attribute Latchkey does not know (most likely a typo).
    #[error("unknown volume attribute {0:?}; supported: {ATTR_EXTERNAL_SECRET}")]
    UnknownAttribute(String),
}

/// Parses NodePublishVolume into a [`PublishRequest`].
pub fn publish(req: &NodePublishVolumeRequest) -> Result<PublishRequest, RequestError> {
    if req.volume_id.is_empty() {
        return Err(RequestError::Missing("volume_id"));
    }
    let target = target_path(&req.target_path)?;
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or(RequestError::Missing("volume_capability"))?;
    let group = match &cap.access_type {
        Some(AccessType::Mount(m)) if m.volume_mount_group.is_empty() => None,
        Some(AccessType::Mount(m)) => Some(
            m.volume_mount_group
                .parse::<u32>()
                .map_err(|_| RequestError::BadMountGroup(m.volume_mount_group.clone()))?,
        ),
        Some(AccessType::Block(_)) => return Err(RequestError::Block),
        None => return Err(RequestError::NoAccessType),
    };
    if !req.readonly {
        return Err(RequestError::NotReadOnly);
    }
    let ctx = &req.volume_context;
    let mut external_secret = None;
    for (k, v) in ctx {
        if k == ATTR_EXTERNAL_SECRET {
            external_secret = Some(v.clone());
        } else if !k.starts_with(POD_INFO_PREFIX) {
            return Err(RequestError::UnknownAttribute(k.clone()));
        }
    }
    let external_secret = external_secret
        .filter(|v| !v.is_empty())
        .ok_or(RequestError::Missing("volume attribute externalSecret"))?;
    if !is_dns_subdomain(&external_secret) {
        return Err(RequestError::BadExternalSecretName(external_secret));
    }
    let pod = PodInfo::from_request(ctx, &req.secrets)?;
    Ok(PublishRequest {
        volume_id: req.volume_id.clone(),
        target,
        pod,
        external_secret,
        group,
    })
}

/// Parses NodeUnpublishVolume into its target path.
pub fn unpublish(req: &NodeUnpublishVolumeRequest) -> Result<PathBuf, RequestError> {
    if req.volume_id.is_empty() {
        return Err(RequestError::Missing("volume_id"));
    }
    target_path(&req.target_path)
}

fn target_path(raw: &str) -> Result<PathBuf, RequestError> {
    if raw.is_empty() {
        return Err(RequestError::Missing("target_path"));
    }
    let path = Path::new(raw);
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean {
        return Err(RequestError::BadTargetPath);
    }
    Ok(path.to_path_buf())
}
