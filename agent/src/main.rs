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
    /// Send NodePublishVolume as kubelet would (debugging, tests).
    Publish(cmd::kubelet::PublishArgs),
    /// Send NodeUnpublishVolume as kubelet would.
    Unpublish(cmd::kubelet::UnpublishArgs),
    /// Run the whole path locally with the built-in fake provider.
    Demo(cmd::demo::DemoArgs),
    /// Print the CRD YAML generated from the Rust types.
    Crds,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Node(args) => {
            init_logging(cli.log_format, "info");
            cmd::node::run(args).await
        }
        Command::Publish(args) => cmd::kubelet::publish(args).await,
        Command::Unpublish(args) => cmd::kubelet::unpublish(args).await,
        Command::Demo(args) => {
            init_logging(cli.log_format, "warn");
            cmd::demo::run(args).await
        }
        Command::Crds => {
            print!("{}", latchkey::api::crd::render_all()?);
            Ok(())
        }
    }
}
