//! CSI Node service: publish and unpublish ephemeral inline volumes; node info.

use std::sync::Arc;

use csi_proto::v1::node_server::Node;
use csi_proto::v1::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use tonic::{Request, Response, Status};
use tracing::{Instrument, info, info_span, warn};

use super::{request, status};
use crate::publish::{Outcome, Publisher};

/// Serves the Node service.
pub struct NodeService {
    publisher: Arc<Publisher>,
    node_id: String,
}

impl NodeService {
    /// Node service for `node_id` (the Kubernetes node name).
    pub fn new(publisher: Arc<Publisher>, node_id: String) -> Self {
        Self { publisher, node_id }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let parsed = request::publish(&req).map_err(|e| {
            warn!(volume_id = %req.volume_id, error = %e, "publish rejected");
            status::from_request(&e)
        })?;
        let span = info_span!(
            "publish",
            volume_id = %parsed.volume_id,
            pod_namespace = %parsed.pod.namespace,
            pod = %parsed.pod.name,
            external_secret = %parsed.external_secret,
        );
        async {
            match self.publisher.publish(&parsed).await {
                Ok(outcome) => {
                    match outcome {
                        Outcome::Mounted => info!("published"),
                        Outcome::Refreshed { changed } => info!(changed, "republished"),
                        Outcome::RefreshFailed => warn!("republished with previous content"),
                    }
                    Ok(Response::new(NodePublishVolumeResponse {}))
                }
                Err(e) => {
                    warn!(error = %e, "publish failed");
                    Err(status::from_publish(&e))
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let target = request::unpublish(&req).map_err(|e| status::from_request(&e))?;
        let span = info_span!("unpublish", volume_id = %req.volume_id);
        async {
            self.publisher.unpublish(&target).await.map_err(|e| {
                warn!(error = %e, "unpublish failed");
                status::from_publish(&e)
            })?;
            Ok(Response::new(NodeUnpublishVolumeResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // No staging, no stats, no expansion: ephemeral volumes need none of them.
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
