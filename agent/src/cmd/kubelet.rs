//! `latchkey publish` / `latchkey unpublish`: send the calls kubelet would send for an ephemeral
//! inline volume. For debugging on a node and for tests.

use std::path::PathBuf;

use anyhow::Context;
use csi_proto::v1::node_client::NodeClient;

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

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

async fn node_client(endpoint: &str) -> anyhow::Result<NodeClient<tonic::transport::Channel>> {
    let path = endpoint::socket_path(endpoint).map_err(anyhow::Error::msg)?;
    let channel = client::connect(&path)
        .await
        .with_context(|| format!("connecting to {}", path.display()))?;
    Ok(NodeClient::new(channel))
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
