//! CSI Node service: publish and unpublish ephemeral inline volumes; node info. Records the
//! publish metrics, since only here is the final status code known.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use csi_proto::v1::node_server::Node;
use csi_proto::v1::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use csi_proto::v1::{NodeServiceCapability, node_service_capability};
use tonic::{Request, Response, Status};
use tracing::{Level, debug, info, info_span, warn};

use super::{request, status};
use crate::memory::Bursts;
use crate::publish::{Outcome, PublishError, PublishRequest, Publisher, Report};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{NamespaceLabel, PublishLabels, ResultLabel};

/// Serves the Node service.
pub struct NodeService {
    publisher: Arc<Publisher>,
    metrics: Arc<Metrics>,
    node_id: String,
    /// Publishes and unpublishes in flight, to give a storm's memory back once it is over.
    bursts: Arc<Bursts>,
    /// Namespaces exported in `latchkey_volume_bytes`, so that one whose volumes are all gone
    /// drops out of it.
    exported: Mutex<BTreeSet<String>>,
}

impl NodeService {
    /// Node service for `node_id` (the Kubernetes node name).
    pub fn new(publisher: Arc<Publisher>, metrics: Arc<Metrics>, node_id: String) -> Self {
        let service = Self {
            publisher,
            metrics,
            node_id,
            bursts: Arc::default(),
            exported: Mutex::default(),
        };
        // Volumes counted at start are exported before the first publish.
        service.export_volume_bytes();
        service
    }

    /// Copies what the volumes of each namespace hold into `latchkey_volume_bytes`. Called
    /// after the calls that change it, not per scrape: the set is small and changes rarely.
    fn export_volume_bytes(&self) {
        let (usage, _) = self.publisher.volume_usage();
        let family = &self.metrics.volume_bytes;
        // A panic elsewhere while holding this lock cannot leave the set wrong for long: the
        // next export rebuilds it from the budget.
        let mut exported = self.exported.lock().unwrap_or_else(PoisonError::into_inner);
        let now: BTreeSet<String> = usage.iter().map(|(ns, _)| ns.clone()).collect();
        for gone in exported.difference(&now) {
            family.remove(&NamespaceLabel {
                namespace: gone.clone(),
            });
        }
        for (namespace, bytes) in usage {
            family
                .get_or_create(&NamespaceLabel { namespace })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        *exported = now;
    }

    async fn publish(&self, req: &NodePublishVolumeRequest) -> Result<Outcome, Status> {
        let parsed = request::publish(req).map_err(|e| {
            warn!(volume_id = %req.volume_id, error = %e, "publish rejected");
            status::from_request(&e)
        })?;
        let result = self.publisher.publish(&parsed).await;
        // Most calls are kubelet's periodic republishes, which log at debug: unless that shows,
        // they need no span at all.
        if let Ok(Report {
            outcome: outcome @ (Outcome::NotDue | Outcome::Refreshed { changed: false }),
            ..
        }) = result
            && !tracing::enabled!(Level::DEBUG)
        {
            return Ok(outcome);
        }
        let answer = match &result {
            Ok(report) => Ok(report.outcome),
            Err(e) => Err(status::from_publish(e)),
        };
        // Written before the answer: a line about a mount must survive a SIGKILL right after it.
        log_publish(&parsed, &result);
        answer
    }

    fn record_publish(&self, result: &Result<Outcome, Status>, seconds: f64) {
        let m = &self.metrics;
        let (result, reason) = match result {
            Ok(Outcome::Mounted) => ("success", "mounted"),
            Ok(Outcome::Refreshed { changed: true }) => ("success", "refreshed"),
            Ok(Outcome::Refreshed { changed: false }) => ("success", "unchanged"),
            Ok(Outcome::RefreshFailed) => ("success", "refresh_failed"),
            Ok(Outcome::NotDue) => ("success", "not_due"),
            Err(s) => ("error", crate::grpc_code::label(s.code())),
        };
        m.publish_duration
            .get_or_create(&PublishLabels { result, reason })
            .observe(seconds);
        m.publishes.get_or_create(&ResultLabel { result }).inc();
        // Counted, not incremented: a volume mounted before a restart is refreshed, not
        // mounted, yet unpublished like any other (the gauge once went negative that way).
        m.volumes_active.set(self.publisher.volumes() as i64);
        let refresh = match reason {
            "refreshed" => Some("changed"),
            "unchanged" => Some("unchanged"),
            "refresh_failed" => Some("failed"),
            "not_due" => Some("not_due"),
            _ => None,
        };
        if let Some(result) = refresh {
            m.refreshes.get_or_create(&ResultLabel { result }).inc();
        }
        if matches!(reason, "mounted" | "refreshed") {
            self.export_volume_bytes();
        }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let _in_flight = self.bursts.enter();
        let start = Instant::now();
        let result = self.publish(req.get_ref()).await;
        self.record_publish(&result, start.elapsed().as_secs_f64());
        result.map(|_| Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let _in_flight = self.bursts.enter();
        let req = req.into_inner();
        let target = request::unpublish(&req).map_err(|e| status::from_request(&e))?;
        let result = self.publisher.unpublish(&target).await;
        let label = if result.is_ok() { "success" } else { "error" };
        self.metrics
            .unpublishes
            .get_or_create(&ResultLabel { result: label })
            .inc();
        let answer = match &result {
            Ok(removed) => {
                self.metrics
                    .volumes_active
                    .set(self.publisher.volumes() as i64);
                if *removed {
                    self.export_volume_bytes();
                }
                Ok(Response::new(NodeUnpublishVolumeResponse {}))
            }
            Err(e) => Err(status::from_publish(e)),
        };
        // Before the answer, as for publish; the span is made after the work, as for publish:
        // no registry slot held across the unmount.
        let span = info_span!(parent: None, "unpublish", volume_id = %req.volume_id);
        span.in_scope(|| match &result {
            Ok(true) => info!(target_path = %target.display(), "volume unmounted"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "unpublish failed"),
        });
        answer
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // VOLUME_MOUNT_GROUP: kubelet passes the pod's fsGroup and leaves ownership to us (no
        // recursive chown). No staging, stats or expansion: ephemeral volumes need none.
        let mount_group = NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc {
                    r#type: node_service_capability::rpc::Type::VolumeMountGroup as i32,
                },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![mount_group],
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

/// Logs what a publish did, in a span naming the request. The span is made once the publish
/// is over, not held across it: each live span takes a slot in tracing's registry, and the
/// slots a mount storm fills stay, each with a small table allocated among the storm's garbage
/// that keeps its page resident (~2 MiB after 500 concurrent publishes; docs/benchmarks.md at
/// c9d4b4e).
fn log_publish(parsed: &PublishRequest, result: &Result<Report, PublishError>) {
    let span = info_span!(
        parent: None,
        "publish",
        volume_id = %parsed.volume_id,
        pod_namespace = %parsed.pod.namespace,
        pod = %parsed.pod.name,
        external_secret = %parsed.external_secret,
        // Left out when nothing was resolved (a failure before binding, a republish not due).
        store = result.as_ref().ok().and_then(|r| r.store.as_deref()),
    );
    let _entered = span.enter();
    match result {
        Ok(report) => match report.outcome {
            Outcome::Mounted => info!("published"),
            Outcome::Refreshed { changed: true } => info!("refreshed with new content"),
            // Periodic republishes of 1,000s of volumes must not flood the log.
            Outcome::Refreshed { changed: false } => debug!("refreshed, unchanged"),
            Outcome::NotDue => debug!("republished, refresh not due"),
            Outcome::RefreshFailed => warn!("republished with previous content"),
        },
        Err(e) => warn!(error = %e, "publish failed"),
    }
}
