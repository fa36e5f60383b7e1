//! `latchkey node`: the per-node CSI agent kubelet talks to.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use tracing::info;

use crate::catalog::{Catalog, ManifestCatalog};
use crate::csi::{endpoint, server};
use crate::publish::Publisher;
use crate::volume::{Backend, VolumeConfig, Volumes};

/// Flags of `latchkey node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// CSI endpoint to serve (`unix:///path/csi.sock`).
    #[arg(long, env = "CSI_ENDPOINT", default_value = super::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Node name reported to kubelet (NodeGetInfo).
    #[arg(long, env = "NODE_NAME")]
    pub node_id: String,
    /// Read stores, ExternalSecrets and Secrets from the YAML files of this directory instead
    /// of the Kubernetes API (standalone mode).
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Largest payload one volume may hold (files rounded up to 4 KiB pages).
    #[arg(long, default_value = "4Mi", value_parser = super::parse_size)]
    pub volume_size_limit: u64,
}

/// Serves until SIGTERM or SIGINT.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let catalog: Arc<dyn Catalog> = match &args.manifests {
        Some(dir) => Arc::new(
            ManifestCatalog::load_dir(dir)
                .with_context(|| format!("loading manifests from {}", dir.display()))?,
        ),
        None => bail!(
            "reading the Kubernetes API is not available in this version yet; \
             run with --manifests DIR (standalone mode)"
        ),
    };
    let volumes = Volumes::new(VolumeConfig {
        backend: Backend::Tmpfs,
        size_limit: args.volume_size_limit,
    });
    let publisher = Arc::new(Publisher::new(catalog, volumes));
    let path = endpoint::socket_path(&args.endpoint).map_err(anyhow::Error::msg)?;
    let socket = server::bind(&path)?;
    info!(socket = %path.display(), node_id = %args.node_id, "serving CSI");
    server::serve(socket, publisher, args.node_id, shutdown_signal()).await?;
    info!("stopped");
    Ok(())
}

/// Completes on SIGTERM (kubelet/pod shutdown) or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process can still be killed; serve until then.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received, shutting down"),
        _ = int.recv() => info!("SIGINT received, shutting down"),
    }
}
