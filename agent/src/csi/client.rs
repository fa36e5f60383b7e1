//! A kubelet-like CSI client over the unix socket: what `latchkey publish`, the demo, the tests
//! and the benchmarks use to talk to a node agent.

use std::collections::BTreeMap;
use std::path::Path;

use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use csi_proto::v1::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

use crate::api::ATTR_EXTERNAL_SECRET;

/// Opens a gRPC channel to the agent's socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// The pod side of an ephemeral inline volume, as kubelet describes it.
#[derive(Debug, Clone)]
pub struct PodVolume {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Pod service account.
    pub service_account: String,
    /// The `externalSecret` volume attribute.
    pub external_secret: String,
    /// Further volume attributes.
    pub extra_attributes: Vec<(String, String)>,
    /// kubelet's `csi.storage.k8s.io/serviceAccount.tokens` JSON, if the driver requests tokens.
    pub tokens_json: Option<String>,
}

impl PodVolume {
    /// A pod `name` in `namespace` with the `default` service account.
    pub fn new(namespace: &str, pod_name: &str, external_secret: &str) -> Self {
        Self {
            namespace: namespace.into(),
            pod_name: pod_name.into(),
            pod_uid: format!(
                "{:016x}",
                fnv1a(format!("{namespace}/{pod_name}").as_bytes())
            ),
            service_account: "default".into(),
            external_secret: external_secret.into(),
            extra_attributes: vec![],
            tokens_json: None,
        }
    }

    /// The NodePublishVolume request kubelet sends for this pod's volume at `target`.
    pub fn publish_request(&self, volume_id: &str, target: &Path) -> NodePublishVolumeRequest {
        let mut ctx: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/pod.name", self.pod_name.as_str()),
            ("csi.storage.k8s.io/pod.namespace", &self.namespace),
            ("csi.storage.k8s.io/pod.uid", &self.pod_uid),
            (
                "csi.storage.k8s.io/serviceAccount.name",
                &self.service_account,
            ),
            ("csi.storage.k8s.io/ephemeral", "true"),
            (ATTR_EXTERNAL_SECRET, &self.external_secret),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        ctx.extend(self.extra_attributes.iter().cloned());
        if let Some(tokens) = &self.tokens_json {
            ctx.insert(crate::identity::tokens::TOKENS_KEY.into(), tokens.clone());
        }
        NodePublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(mount_capability()),
            readonly: true,
            volume_context: ctx,
            ..Default::default()
        }
    }
}

/// What kubelet asks for an inline volume: a mount, single-node writer access (kubelet's
/// choice for ephemeral volumes; read-only is carried by `readonly`).
pub fn mount_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

/// The NodeUnpublishVolume request for a target.
pub fn unpublish_request(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

/// A stable volume id derived from the target path, so publish and unpublish agree without
/// the caller remembering it (kubelet derives its own from the pod UID and volume name).
pub fn volume_id_for(target: &Path) -> String {
    format!("csi-{:016x}", fnv1a(target.as_os_str().as_encoded_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
