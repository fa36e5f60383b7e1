//! The `latchkey` binary: parses the command line and runs one subcommand.

use clap::{Parser, Subcommand};
use latchkey::cmd;
use latchkey::telemetry::{LogFormat, init_logging};

#[derive(Parser)]
#[command(
    name = "latchkey",
    version,
    about = "Secrets from external secret managers, mounted as files by a CSI node agent"
)]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CSI Identity and Node services to kubelet on a unix socket.
    Node(cmd::node::NodeArgs),
    /// Mirror ExternalSecrets that ask for it (`creationPolicy`) into Kubernetes Secrets.
    Controller(cmd::controller::ControllerArgs),
    /// Send NodePublishVolume as kubelet would (debugging, tests).
    Publish(cmd::kubelet::PublishArgs),
    /// Send NodeUnpublishVolume as kubelet would.
    Unpublish(cmd::kubelet::UnpublishArgs),
    /// Send GetPluginInfo, Probe and NodeGetInfo as kubelet and its liveness probe would.
    Probe(cmd::kubelet::ProbeArgs),
    /// Run the whole path locally with the built-in fake provider.
    Demo(cmd::demo::DemoArgs),
    /// Print the CRD YAML generated from the Rust types (stores, ExternalSecrets, generators;
    /// with `--provider`, the provider kinds instead).
    Crds(CrdsArgs),
    /// Print Latchkey manifests for SecretProviderClasses and External Secrets Operator objects.
    Convert(cmd::convert::ConvertArgs),
}

/// Which CRDs `latchkey crds` prints.
#[derive(clap::Args)]
struct CrdsArgs {
    /// Print the CRDs of these provider kinds (`aws`, `vault`, `kubernetes`, `fake`, `plugin`,
    /// `secretsstorecsi`, or `all`), namespaced and cluster-scoped, instead of the core CRDs:
    /// what `crds/providers/<kind>/crds.yaml` holds. Repeat or comma-separate for several.
    #[arg(long = "provider", value_delimiter = ',')]
    providers: Vec<String>,
}

impl CrdsArgs {
    fn render(&self) -> anyhow::Result<String> {
        use latchkey::api::provider_kinds::ProviderKind;
        if self.providers.is_empty() {
            return Ok(latchkey::api::crd::render_all()?);
        }
        let mut kinds = Vec::new();
        for name in &self.providers {
            if name == "all" {
                kinds.extend(ProviderKind::ALL);
                continue;
            }
            let Some(kind) = ProviderKind::ALL
                .into_iter()
                .find(|k| k.file_stem() == name)
            else {
                let known: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.file_stem()).collect();
                anyhow::bail!(
                    "unknown provider {name:?}; expected one of {}, or all",
                    known.join(", ")
                );
            };
            kinds.push(kind);
        }
        Ok(latchkey::api::crd::render_providers(&kinds)?)
    }
}

/// Volume work (mount, write, unmount) runs on tokio's blocking pool. Its default of 512 threads
/// lets a mount storm balloon memory (the benchmark saw ~97 MiB RSS at 500 concurrent publishes);
/// these calls are short syscalls, so a small pool queues them at no cost in latency.
const MAX_BLOCKING_THREADS: usize = 16;

fn main() -> std::process::ExitCode {
    // Before any thread is started, so that none gets an arena of its own.
    latchkey::memory::one_arena();
    latchkey::tls::install_crypto_provider();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(latchkey::memory::BLOCKING_KEEP_ALIVE)
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(on_a_worker(run(Cli::parse()))));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line, causes joined by ": " (anyhow's alternate form), instead of the
            // multi-line debug report with a backtrace that `main() -> Result` prints.
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the subcommand's future as a task of the runtime rather than in `block_on`, whose thread
/// is not one of the runtime's workers: an accept loop there (the CSI server's) woke that thread
/// for every connection, which kubelet opens per call, and then a worker for the connection's
/// task, two thread hand-offs per call (docs/benchmarks.md at c9d4b4e). A panic in it is
/// re-raised.
async fn on_a_worker(
    main: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    // The task is never aborted (nothing holds its handle but this await, and the runtime is
    // dropped only after `block_on` returns), so a failed join is a panic.
    tokio::spawn(main)
        .await
        .unwrap_or_else(|joined| std::panic::resume_unwind(joined.into_panic()))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Node(args) => {
            init_logging(cli.log_format, "info");
            cmd::node::run(args).await
        }
        Command::Controller(args) => {
            init_logging(cli.log_format, "info");
            cmd::controller::run(args).await
        }
        Command::Publish(args) => cmd::kubelet::publish(args).await,
        Command::Unpublish(args) => cmd::kubelet::unpublish(args).await,
        Command::Probe(args) => cmd::kubelet::probe(args).await,
        Command::Demo(args) => {
            init_logging(cli.log_format, "warn");
            cmd::demo::run(args).await
        }
        Command::Convert(args) => Ok(cmd::convert::run(args)?),
        Command::Crds(args) => {
            print!("{}", args.render()?);
            Ok(())
        }
    }
}
