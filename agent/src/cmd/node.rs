//! `latchkey node`: the per-node CSI agent kubelet talks to, plus its metrics and health endpoint.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tracing::info;

use crate::cache::CacheLimits;
use crate::catalog::{Catalog, KubernetesCatalog, ManifestCatalog};
use crate::csi::{endpoint, server};
use crate::events::{KubeEvents, NoEvents, PodEvents};
use crate::generators::states::{KubeStates, MemoryStates, StateStore};
use crate::providers;
use crate::publish::{GeneratorConfig, Publisher};
use crate::telemetry::Metrics;
use crate::telemetry::http::Readiness;
use crate::volume::{Backend, BudgetLimits, VolumeConfig, Volumes};

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
    /// Most memory all volumes on this node together may hold (tmpfs pages plus 1 KiB per file,
    /// directory and link; during a refresh old and new content both count). The tmpfs pages
    /// are charged to the agent's memory cgroup: its memory limit must be the agent's own
    /// headroom plus this. A publish past it fails with RESOURCE_EXHAUSTED.
    #[arg(long, default_value = "64Mi", value_parser = super::parse_size)]
    pub volume_budget: u64,
    /// The fraction of --volume-budget the volumes of one namespace may hold (0 < share <= 1),
    /// so one namespace cannot take the whole node.
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub namespace_volume_share: f64,
    /// At start, the volumes already mounted below this directory are counted in the budget.
    /// The default counts every Latchkey volume the agent can see, which in its container is
    /// kubelet's pods directory; narrow it only where other agents' volumes are visible too
    /// (tests on one machine).
    #[arg(long, default_value = "/")]
    pub count_volumes_below: PathBuf,
    /// Address of the `/metrics`, `/healthz` and `/readyz` endpoint (`:9808` = every
    /// interface); `none` disables it.
    #[arg(long, default_value = ":9808")]
    pub metrics_addr: String,
    /// The agent's own namespace: where ClusterSecretStores' credential Secrets live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "latchkey")]
    pub namespace: String,
    /// Most values the shared cache holds (least recently used are evicted).
    #[arg(long, default_value_t = CacheLimits::default().max_entries)]
    pub cache_max_entries: usize,
    /// Most bytes of values the shared cache holds.
    #[arg(long, default_value = "64Mi", value_parser = super::parse_size)]
    pub cache_max_bytes: u64,
    /// Cached values expire up to this fraction early, so refreshes of values fetched
    /// together do not align (0 to 0.5).
    #[arg(long, default_value_t = CacheLimits::default().jitter)]
    pub refresh_jitter: f64,
    /// Longest one publish may spend rendering its values (templates, rewrite, decoding) on
    /// the agent's compute threads; past it the publish fails with DEADLINE_EXCEEDED.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub compute_timeout: std::time::Duration,
    /// Directory of secret-store plugin sockets: a `plugin` store's `unix://` endpoint must
    /// name a socket directly in it (no other path, no symbolic link).
    #[arg(long, default_value = providers::plugin::DEFAULT_SOCKET_DIR)]
    pub plugin_socket_dir: PathBuf,
    /// Directory of the Secrets Store CSI Driver's provider sockets: a `secretsStoreCSI` store
    /// names provider `<name>`, the agent calls `<dir>/<name>.sock` (no symbolic link). The
    /// driver's other usual directory is `/etc/kubernetes/secrets-store-csi-providers`.
    #[arg(long, default_value = providers::secrets_store_csi::DEFAULT_PROVIDER_DIR)]
    pub secrets_store_provider_dir: PathBuf,
    /// How long a generated credential that was replaced (its lease could not be renewed any
    /// more) stays valid before it is cleaned up, so readers of the old files can move on.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub generator_grace_period: std::time::Duration,
    /// Put the cleanup finalizer on GeneratorStates: only where `latchkey controller` runs,
    /// which then cleans up after pods whose node or agent is gone (the deploy files set it
    /// with the controller). Without the controller, such credentials end with their TTL.
    #[arg(long)]
    pub generator_finalizer: bool,
}

/// Where the agent's objects come from and its records go: the API server, or a manifest
/// directory and memory.
struct Sources {
    catalog: Arc<dyn Catalog>,
    events: Arc<dyn PodEvents>,
    kube_config: Option<kube::Config>,
    states: Arc<dyn StateStore>,
}

/// Serves until SIGTERM or SIGINT.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let Sources {
        catalog,
        events,
        kube_config,
        states,
    } = match &args.manifests {
        Some(dir) => {
            let catalog = ManifestCatalog::load_dir(dir)
                .with_context(|| format!("loading manifests from {}", dir.display()))?;
            Sources {
                catalog: Arc::new(catalog),
                events: Arc::new(NoEvents),
                kube_config: None,
                states: Arc::new(MemoryStates::default()),
            }
        }
        None => {
            no_api_server_hint(Some("Pass --manifests DIR to serve from YAML files"))?;
            // In-cluster config in a pod, KUBECONFIG elsewhere. Providers that act as the
            // pod reuse its URL and CA with the pod's token instead of the agent's.
            let config = kube::Config::infer()
                .await
                .context("finding the Kubernetes API (in-cluster or KUBECONFIG)")?;
            let client = kube::Client::try_from(config.clone())
                .context("connecting to the Kubernetes API")?;
            let events = KubeEvents::new(client.clone(), &args.node_id);
            Sources {
                catalog: Arc::new(KubernetesCatalog::start(client.clone(), &metrics)),
                events: Arc::new(events),
                kube_config: Some(config),
                states: Arc::new(KubeStates::new(client)),
            }
        }
    };
    let limits = BudgetLimits::with_share(args.volume_budget, args.namespace_volume_share);
    let volumes = Volumes::new(VolumeConfig {
        backend: Backend::Tmpfs,
        size_limit: args.volume_size_limit,
    })
    .with_budget(limits);
    // The agent keeps no state: what earlier runs mounted is still charged to its cgroup, so
    // the budget starts from the volumes mounted now.
    let counted = volumes
        .count_mounted(&args.count_volumes_below)
        .context("counting the volumes already mounted")?;
    let (_, held) = volumes.usage();
    info!(
        volumes = counted,
        held_bytes = held,
        budget_bytes = limits.node_bytes,
        namespace_share_bytes = limits.namespace_bytes,
        "volume budget"
    );
    let publisher = Arc::new(
        Publisher::new(
            Arc::clone(&catalog),
            volumes,
            providers::Env {
                metrics: Arc::clone(&metrics),
                kube: kube_config,
                catalog: Arc::clone(&catalog),
                agent_namespace: args.namespace.clone(),
                aws_sessions: Default::default(),
                vault_tokens: Default::default(),
                plugins: Arc::new(providers::plugin::Plugins::new(
                    args.plugin_socket_dir.clone(),
                )),
                secrets_store: Arc::new(providers::secrets_store_csi::SecretsStoreProviders::new(
                    args.secrets_store_provider_dir.clone(),
                )),
            },
            CacheLimits {
                max_entries: args.cache_max_entries,
                max_bytes: args.cache_max_bytes,
                jitter: args.refresh_jitter,
            },
            events,
            crate::compute::Pool::for_this_machine(args.compute_timeout)
                .context("starting the compute threads")?,
        )
        .with_generators(GeneratorConfig {
            states,
            node: args.node_id.clone(),
            grace: args.generator_grace_period,
            finalizer: args.generator_finalizer,
        }),
    );
    match publisher.recover().await {
        Ok((0, 0)) => {}
        Ok((adopted, let_go)) => info!(
            adopted,
            let_go, "generated credentials an earlier run recorded on this node"
        ),
        Err(e) => tracing::warn!(error = %e,
            "cannot read the GeneratorStates an earlier run recorded; their credentials end \
             with their TTL"),
    }
    // Renews generated credentials and cleans up replaced ones; ends with the process.
    let ticking = Arc::clone(&publisher);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            ticking.tick().await;
        }
    });

    let stopped = super::stop_on_signal();

    // The socket first: a second agent on the same node fails here, with that reason.
    let path = endpoint::socket_path(&args.endpoint).map_err(anyhow::Error::msg)?;
    let socket = server::bind(&path)?;
    let readiness = Arc::new(Readiness::new(move || catalog.is_synced()));
    let http_task = super::serve_metrics(
        &args.metrics_addr,
        Arc::clone(&metrics),
        Arc::clone(&readiness),
        stopped(),
    )
    .await?;

    info!(socket = %path.display(), node_id = %args.node_id, "serving CSI");
    // The listener accepts from here on; connections queue until the server polls them.
    readiness.set_serving(true);
    server::serve(socket, publisher, metrics, args.node_id, stopped()).await?;
    readiness.set_serving(false);
    if let Some(task) = http_task {
        task.await.context("metrics endpoint task")??;
    }
    info!("stopped");
    Ok(())
}

/// A `--namespace-volume-share`: a fraction in (0, 1].
fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!("{s:?} is not a fraction in (0, 1], such as 0.5")),
    }
}

/// Fails with one line saying what to do when there is obviously no Kubernetes API to read
/// from: not in a pod, and no kubeconfig where kube looks for one. (kube's own error repeats
/// the missing file three times and names neither `--manifests` nor KUBECONFIG.) `alternative`
/// is the command's other way out, if it has one (`node --manifests`; the controller has none).
pub(crate) fn no_api_server_hint(alternative: Option<&str>) -> anyhow::Result<()> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kubeconfig = match std::env::var_os("KUBECONFIG") {
        Some(paths) => std::env::split_paths(&paths).any(|p| p.is_file()),
        None => std::env::var_os("HOME")
            .is_some_and(|home| PathBuf::from(home).join(".kube/config").is_file()),
    };
    if in_cluster || kubeconfig {
        return Ok(());
    }
    let what_to_do = match alternative {
        Some(alternative) => format!("{alternative}, or point KUBECONFIG at a cluster"),
        None => "Point KUBECONFIG at a cluster".to_string(),
    };
    anyhow::bail!(
        "no Kubernetes API to read from: not running in a pod and no kubeconfig found \
         (KUBECONFIG or ~/.kube/config). {what_to_do}."
    )
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
