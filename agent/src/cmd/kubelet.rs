//! `latchkey publish` / `latchkey unpublish`: send the calls kubelet would send for an ephemeral
//! inline volume; `latchkey probe`: the calls of kubelet's plugin registration and of the
//! livenessprobe sidecar. For debugging on a node and for tests.

use std::path::PathBuf;

use anyhow::Context;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::{GetPluginInfoRequest, NodeGetInfoRequest, ProbeRequest};

use crate::csi::client::{self, PodVolume};
use crate::csi::endpoint;

/// Flags of `latchkey publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// CSI endpoint of the node agent.
    #[arg(long, env = "CSI_ENDPOINT", default_value = super::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Directory to mount the volume at.
    #[arg(long)]
    pub target: PathBuf,
    /// The ExternalSecret (volume attribute `externalSecret`).
    #[arg(long)]
    pub external_secret: String,
    /// Pod namespace.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Pod name.
    #[arg(long, default_value = "latchkey-cli")]
    pub pod_name: String,
    /// Pod service account.
    #[arg(long, default_value = "default")]
    pub service_account: String,
    /// Volume id (default: derived from the target path).
    #[arg(long)]
    pub volume_id: Option<String>,
    /// Extra volume attribute `KEY=VALUE` (repeatable).
    #[arg(long = "attribute", value_parser = key_value)]
    pub attributes: Vec<(String, String)>,
}

/// Flags of `latchkey unpublish`.
#[derive(Debug, clap::Args)]
pub struct UnpublishArgs {
    /// CSI endpoint of the node agent.
    #[arg(long, env = "CSI_ENDPOINT", default_value = super::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// The mounted directory.
    #[arg(long)]
    pub target: PathBuf,
    /// Volume id (default: derived from the target path).
    #[arg(long)]
    pub volume_id: Option<String>,
}

/// Flags of `latchkey probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// CSI endpoint of the node agent.
    #[arg(long, env = "CSI_ENDPOINT", default_value = super::DEFAULT_ENDPOINT)]
    pub endpoint: String,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

async fn channel(endpoint: &str) -> anyhow::Result<tonic::transport::Channel> {
    let path = endpoint::socket_path(endpoint).map_err(anyhow::Error::msg)?;
    client::connect(&path)
        .await
        .with_context(|| format!("connecting to {}", path.display()))
}

async fn node_client(endpoint: &str) -> anyhow::Result<NodeClient<tonic::transport::Channel>> {
    Ok(NodeClient::new(channel(endpoint).await?))
}

/// Sends GetPluginInfo, Probe and NodeGetInfo, as kubelet's registration and the livenessprobe
/// sidecar do; fails when the agent is not ready.
pub async fn probe(args: ProbeArgs) -> anyhow::Result<()> {
    let channel = channel(&args.endpoint).await?;
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(status_error("GetPluginInfo"))?
        .into_inner();
    // The spec reads an unset `ready` as ready.
    let ready = identity
        .probe(ProbeRequest {})
        .await
        .map_err(status_error("Probe"))?
        .into_inner()
        .ready
        .unwrap_or(true);
    let node = NodeClient::new(channel)
        .node_get_info(NodeGetInfoRequest {})
        .await
        .map_err(status_error("NodeGetInfo"))?
        .into_inner();
    let state = if ready { "ready" } else { "not ready" };
    println!(
        "{} {} on node {}: {state}",
        info.name, info.vendor_version, node.node_id
    );
    anyhow::ensure!(
        ready,
        "Probe: the agent is not ready (catalog not synced yet)"
    );
    Ok(())
}

/// Sends NodePublishVolume.
pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let target = std::path::absolute(&args.target)?;
    let volume_id = args
        .volume_id
        .unwrap_or_else(|| client::volume_id_for(&target));
    let mut pod = PodVolume::new(&args.namespace, &args.pod_name, &args.external_secret);
    pod.service_account = args.service_account;
    pod.extra_attributes = args.attributes;
    node_client(&args.endpoint)
        .await?
        .node_publish_volume(pod.publish_request(&volume_id, &target))
        .await
        .map_err(status_error("NodePublishVolume"))?;
    println!("published {} (volume id {volume_id})", target.display());
    Ok(())
}

/// Sends NodeUnpublishVolume.
pub async fn unpublish(args: UnpublishArgs) -> anyhow::Result<()> {
    let target = std::path::absolute(&args.target)?;
    let volume_id = args
        .volume_id
        .unwrap_or_else(|| client::volume_id_for(&target));
    node_client(&args.endpoint)
        .await?
        .node_unpublish_volume(client::unpublish_request(&volume_id, &target))
        .await
        .map_err(status_error("NodeUnpublishVolume"))?;
    println!("unpublished {}", target.display());
    Ok(())
}

/// Formats a gRPC failure as `RPC: CODE: message`.
pub fn status_error(rpc: &'static str) -> impl Fn(tonic::Status) -> anyhow::Error {
    move |s| anyhow::anyhow!("{rpc}: {:?}: {}", s.code(), s.message())
}
