//! CSI Controller service stub. Latchkey is node-only, but conformance tools ask
//! ControllerGetCapabilities of every driver and reject an empty list (it decodes as absent), so
//! it answers one capability of type UNKNOWN; every other RPC is UNIMPLEMENTED.

use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::controller_service_capability::{Rpc, Type, rpc};
use csi_proto::v1::{
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerServiceCapability,
};
use tonic::{Request, Response, Status};

/// The Controller stub.
pub struct ControllerService;

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let unknown = ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: rpc::Type::Unknown as i32,
            })),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![unknown],
        }))
    }
}
