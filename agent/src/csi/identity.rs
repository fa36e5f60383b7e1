//! CSI Identity service: name, version, capabilities, readiness.

use std::sync::Arc;

use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use super::DRIVER_VERSION;
use crate::api::DRIVER_NAME;
use crate::publish::Publisher;

/// Serves Identity; ready when the catalog is synced.
pub struct IdentityService {
    publisher: Arc<Publisher>,
}

impl IdentityService {
    /// Identity for a publisher.
    pub fn new(publisher: Arc<Publisher>) -> Self {
        Self { publisher }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: DRIVER_VERSION.into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // Node-only driver: no CONTROLLER_SERVICE, no topology constraints. (The Node service
        // needs no plugin capability; kubelet always uses it.)
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.publisher.catalog().is_synced()),
        }))
    }
}
