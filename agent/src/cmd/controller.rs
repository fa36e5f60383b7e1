//! `latchkey controller`: mirrors ExternalSecrets that ask for it into Kubernetes Secrets,
//! writes the ExternalSecrets of ClusterExternalSecrets, cleans up after generators
//! (GeneratorStates being deleted or past their deadline) and reports whether provider objects
//! are valid, with leader election, metrics and health endpoints.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use futures::FutureExt;
use tracing::info;

use crate::api::StoreKind;
use crate::api::validate::ProviderSpec;
use crate::cache::CacheLimits;
use crate::catalog::{Catalog, KubernetesCatalog};
use crate::cluster_external_secret::{self as ces, CesController};
use crate::events::KubeEvents;
use crate::fetch::Fetcher;
use crate::generator_gc::{self, Collector, Identities, IdentityError};
use crate::generators::GeneratorSpec;
use crate::generators::states::KubeStates;
use crate::identity::PodTokens;
use crate::mirror::consent;
use crate::mirror::generated::MirrorGenerators;
use crate::mirror::leader::{Elector, Leadership, Timing};
use crate::mirror::reconcile::{Parts, Reconciler};
use crate::mirror::tokens::TokenMinter;
use crate::mirror::{self, Scope};
use crate::provider_status;
use crate::providers;
use crate::push_secret::controller::{self as push, PushController};
use crate::push_secret::generated::PushGenerators;
use crate::push_secret::pushers::StorePushers;
use crate::push_secret::source::{ApiTokens, SourceReader};
use crate::telemetry::Metrics;
use crate::telemetry::http::Readiness;

/// Flags of `latchkey controller`.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Serve only ExternalSecrets of this namespace (repeatable); default: all namespaces.
    #[arg(long = "namespace")]
    pub namespaces: Vec<String>,
    /// Serve only ExternalSecrets matching this label selector (`team=shop`), so several
    /// instances can split a large cluster.
    #[arg(long)]
    pub selector: Option<String>,
    /// Elect a leader on a Lease so that replicas do not write at the same time.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "latchkey-controller")]
    pub leader_elect_lease: String,
    /// How long a lease holds without renewal, as the other replicas see it.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps writing without a successful renewal.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Pause between attempts to acquire or renew the lease.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The controller's own namespace: its Lease, and ClusterSecretStores' credential Secrets.
    #[arg(long, env = "POD_NAMESPACE", default_value = "latchkey")]
    pub pod_namespace: String,
    /// This replica's name in the Lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconcile and log what would be written (names and keys, never values) without writing
    /// Secrets, statuses or Events.
    #[arg(long)]
    pub dry_run: bool,
    /// Let a ClusterSecretStore with `auth.agentIdentity` read with the controller's own
    /// identity (off: such stores are refused, since any namespace they admit would read as
    /// the controller).
    #[arg(long)]
    pub allow_agent_identity: bool,
    /// Reconciles run at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Address of the `/metrics`, `/healthz` and `/readyz` endpoint; `none` disables it.
    #[arg(long, default_value = ":9809")]
    pub metrics_addr: String,
    /// Most values the shared cache holds.
    #[arg(long, default_value_t = CacheLimits::default().max_entries)]
    pub cache_max_entries: usize,
    /// Most bytes of values the shared cache holds.
    #[arg(long, default_value = "64Mi", value_parser = super::parse_size)]
    pub cache_max_bytes: u64,
    /// Longest one ExternalSecret (or PushSecret template) may spend rendering its values.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub compute_timeout: Duration,
    /// Directory of secret-store plugin sockets: a `plugin` store's `unix://` endpoint must
    /// name a socket directly in it (no other path, no symbolic link).
    #[arg(long, default_value = providers::plugin::DEFAULT_SOCKET_DIR)]
    pub plugin_socket_dir: std::path::PathBuf,
    /// Clean up generated credentials whose GeneratorState is deleted (a pod gone with its
    /// node or agent, a namespace deleted) and delete states past their garbage-collection
    /// deadline. Needs the GeneratorState CRD and RBAC on generatorstates.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub generator_gc: bool,
    /// How long cleanup of a deleted GeneratorState is retried (from its deletion) before its
    /// finalizer is released anyway and the credential left to its TTL: a deletion, or a
    /// namespace's, never waits longer than this on Latchkey.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub generator_cleanup_timeout: Duration,
    /// How long the credentials of generators in a mirrored Secret stay valid once a sync has
    /// written new ones (ESO design 011): then their GeneratorStates are deleted and cleaned up.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub generator_grace_period: Duration,
    /// Write the ExternalSecrets of ClusterExternalSecrets into the namespaces they select
    /// (within `--namespace`, if given). With several controller instances splitting a
    /// cluster, leave it on in one of them only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_external_secrets: bool,
    /// Push the Secrets PushSecrets name into their stores, as their service accounts (within
    /// `--namespace`, if given). Needs the PushSecret CRD and RBAC on pushsecrets.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub push_secrets: bool,
    /// How long deleting what a PushSecret with `deletionPolicy: Delete` pushed is retried
    /// (from its deletion) before its finalizer is released anyway, leaving the remote secrets.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub push_secret_cleanup_timeout: Duration,
}

/// Tokens for generator cleanup: minted as the state's service account under the mirror's
/// rules (opt-in annotation, only the audiences the generator's auth needs, never the API
/// server's for a backend). Credential Secrets are always read with namespaced-store rules.
struct MintedIdentities {
    minter: TokenMinter,
}

#[async_trait]
impl Identities for MintedIdentities {
    async fn tokens(
        &self,
        namespace: &str,
        service_account: &str,
        generator: GeneratorSpec<'_>,
    ) -> Result<PodTokens, IdentityError> {
        let provider = match generator {
            GeneratorSpec::Password(_) => return Ok(PodTokens::default()),
            GeneratorSpec::VaultDynamicSecret(v) => ProviderSpec::Vault(&v.provider),
            GeneratorSpec::Plugin(p) => ProviderSpec::Plugin(&p.provider),
        };
        // The controller's own identity is never lent to generators: no agentIdentity.
        let audiences =
            consent::audiences(provider, StoreKind::SecretStore, false).map_err(|e| {
                IdentityError {
                    message: e.to_string(),
                    permanent: true,
                }
            })?;
        self.minter
            .tokens(namespace, service_account, &audiences)
            .await
            .map_err(|e| IdentityError {
                message: e.to_string(),
                permanent: false,
            })
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    // The controller writes Secrets through the API: unlike the node agent, it has no
    // manifest mode to suggest.
    super::node::no_api_server_hint(None)?;
    let metrics = Arc::new(Metrics::new());
    let config = kube::Config::infer()
        .await
        .context("finding the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let client =
        kube::Client::try_from(config.clone()).context("connecting to the Kubernetes API")?;
    // The mirror keeps the ExternalSecrets in its own watch (mirror::catalog).
    let catalog: Arc<dyn Catalog> = Arc::new(KubernetesCatalog::start_without_external_secrets(
        client.clone(),
        &metrics,
    ));
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("latchkey-{:x}", fastrand::u64(..)));

    let stopped = super::stop_on_signal();

    let (leadership, elector) = if args.leader_elect {
        let timing = Timing {
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
        };
        anyhow::ensure!(
            timing.renew_deadline < timing.lease_duration,
            "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration"
        );
        let (elector, leadership) = Elector::new(
            client.clone(),
            &args.pod_namespace,
            &args.leader_elect_lease,
            &identity,
            timing,
        );
        (leadership, Some(tokio::spawn(elector.run(stopped()))))
    } else {
        (Leadership::always(), None)
    };

    let kube_config = config.clone();
    let env = providers::Env {
        metrics: Arc::clone(&metrics),
        kube: Some(config),
        catalog: Arc::clone(&catalog),
        agent_namespace: args.pod_namespace.clone(),
        aws_sessions: Default::default(),
        vault_tokens: Default::default(),
        plugins: Arc::new(providers::plugin::Plugins::new(
            args.plugin_socket_dir.clone(),
        )),
        // The controller runs on no particular node and mounts no provider directory: a
        // secretsStoreCSI store is for the node agent (see docs/providers.md).
        secrets_store: Default::default(),
    };
    let push_env = env.clone();
    let fetcher = Fetcher::new(
        env.clone(),
        CacheLimits {
            max_entries: args.cache_max_entries,
            max_bytes: args.cache_max_bytes,
            ..CacheLimits::default()
        },
    );
    let reconciler = Arc::new(Reconciler::new(Parts {
        client: client.clone(),
        catalog: Arc::clone(&catalog),
        fetcher,
        compute: crate::compute::Pool::for_this_machine(args.compute_timeout)
            .context("starting the compute threads")?,
        leadership: leadership.clone(),
        metrics: Arc::clone(&metrics),
        events: (!args.dry_run).then(|| KubeEvents::new(client.clone(), &identity)),
        dry_run: args.dry_run,
        allow_agent_identity: args.allow_agent_identity,
        concurrency: args.concurrency.max(1),
        generators: MirrorGenerators {
            states: Arc::new(KubeStates::new(client.clone())),
            grace: args.generator_grace_period,
            // This controller's GeneratorState loop (generator_gc) releases it after cleanup;
            // without that loop nobody would, and every deletion would hang.
            finalizer: args.generator_gc,
        },
    }));

    let synced = Arc::clone(&catalog);
    let readiness = Arc::new(Readiness::new(move || synced.is_synced()));
    let http_task = super::serve_metrics(
        &args.metrics_addr,
        Arc::clone(&metrics),
        Arc::clone(&readiness),
        stopped(),
    )
    .await?;
    readiness.set_serving(true);
    info!(
        %identity, leader_elect = args.leader_elect, dry_run = args.dry_run,
        namespaces = ?args.namespaces, "mirror controller started"
    );
    let collector = args.generator_gc.then(|| {
        let leading = leadership.clone();
        Arc::new(Collector::new(generator_gc::Parts {
            client: client.clone(),
            namespaces: args.namespaces.clone(),
            identities: Arc::new(MintedIdentities {
                minter: TokenMinter::new(client.clone()),
            }),
            cleaner: generator_gc::Generators::new(env),
            metrics: Arc::clone(&metrics),
            leading: Arc::new(move || leading.is_leader()),
            cleanup_timeout: args.generator_cleanup_timeout,
        }))
    });
    let collecting = collector.map(|c| {
        tokio::spawn(run_while_leading(
            move |ended| Arc::clone(&c).run(ended).boxed(),
            leadership.clone(),
            stopped().boxed().shared(),
        ))
    });
    let provisioning = args.cluster_external_secrets.then(|| {
        let leading = leadership.clone();
        let controller = Arc::new(CesController::new(ces::Parts {
            client: client.clone(),
            namespaces: args.namespaces.clone(),
            leading: Arc::new(move || leading.is_leader()),
            events: (!args.dry_run).then(|| Arc::new(KubeEvents::new(client.clone(), &identity))),
            dry_run: args.dry_run,
        }));
        tokio::spawn(run_while_leading(
            move |ended| Arc::clone(&controller).run(ended).boxed(),
            leadership.clone(),
            stopped().boxed().shared(),
        ))
    });
    // Apart from the mirror's: PushSecret templates are another tenant-driven load.
    let push_compute = Arc::new(
        crate::compute::Pool::new(2, args.compute_timeout)
            .context("starting the PushSecret template threads")?,
    );
    let pushing = args.push_secrets.then(|| {
        let leading = leadership.clone();
        let minter = Arc::new(TokenMinter::new(client.clone()));
        let controller = Arc::new(PushController::new(push::Parts {
            client: client.clone(),
            catalog: Arc::clone(&catalog),
            namespaces: args.namespaces.clone(),
            leading: Arc::new(move || leading.is_leader()),
            events: (!args.dry_run).then(|| Arc::new(KubeEvents::new(client.clone(), &identity))),
            dry_run: args.dry_run,
            reader: SourceReader::new(kube_config, Arc::clone(&minter) as Arc<dyn ApiTokens>),
            pushers: Arc::new(StorePushers {
                env: push_env.clone(),
                minter: Arc::clone(&minter),
                allow_agent_identity: args.allow_agent_identity,
            }),
            cleanup_timeout: args.push_secret_cleanup_timeout,
            generators: PushGenerators {
                env: push_env,
                minter,
                allow_agent_identity: args.allow_agent_identity,
                states: MirrorGenerators {
                    states: Arc::new(KubeStates::new(client.clone())),
                    grace: args.generator_grace_period,
                    finalizer: args.generator_gc,
                },
            },
            compute: push_compute,
        }));
        tokio::spawn(run_while_leading(
            move |ended| Arc::clone(&controller).run(ended).boxed(),
            leadership.clone(),
            stopped().boxed().shared(),
        ))
    });
    // Provider objects' `Ready` (design 007's provider reconciler), for the served kinds only.
    let provider_status = {
        let leading = leadership.clone();
        let parts = Arc::new(provider_status::Parts {
            client: client.clone(),
            namespaces: args.namespaces.clone(),
            dry_run: args.dry_run,
            leading: Arc::new(move || leading.is_leader()),
        });
        tokio::spawn(run_while_leading(
            move |ended| {
                let parts = Arc::clone(&parts);
                async move { provider_status::run(&parts, ended).await }.boxed()
            },
            leadership.clone(),
            stopped().boxed().shared(),
        ))
    };
    let scope = Scope {
        namespaces: args.namespaces,
        selector: args.selector,
        concurrency: args.concurrency.max(1),
    };
    let store_status = Arc::new(mirror::stores::StatusWriter::new(
        client.clone(),
        leadership.clone(),
        args.dry_run,
    ));
    mirror::run(
        client,
        scope,
        reconciler,
        store_status,
        leadership,
        metrics,
        stopped(),
    )
    .await;
    readiness.set_serving(false);
    // Cleanups and ExternalSecret writes are idempotent and the next leader retries them:
    // never hold the exit.
    for mut task in collecting
        .into_iter()
        .chain(provisioning)
        .chain(pushing)
        .chain([provider_status])
    {
        if tokio::time::timeout(Duration::from_secs(6), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
    if let Some(elector) = elector {
        elector.await.context("leader election task")?;
    }
    if let Some(task) = http_task {
        task.await.context("metrics endpoint task")??;
    }
    info!("stopped");
    Ok(())
}

/// Runs a controller (`run`, until the future it is given completes) while this replica leads,
/// until `stop` completes.
async fn run_while_leading(
    run: impl Fn(futures::future::BoxFuture<'static, ()>) -> futures::future::BoxFuture<'static, ()>,
    mut leadership: Leadership,
    stop: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.clone() => return,
            _ = leadership.wait_for(true) => {}
        }
        let mut lost = leadership.clone();
        let stop_now = stop.clone();
        let ended = async move {
            tokio::select! {
                _ = lost.wait_for(false) => {}
                _ = stop_now => {}
            }
        };
        run(ended.boxed()).await;
    }
}
