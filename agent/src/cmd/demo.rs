//! `latchkey demo`: the whole path on one machine. Starts the node service on a temporary socket
//! with the `examples/standalone` manifests, publishes a volume the way kubelet would, shows the
//! files, and unpublishes.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::{GetPluginInfoRequest, ProbeRequest};

use super::kubelet::status_error;
use crate::cache::CacheLimits;
use crate::catalog::{Catalog, ManifestCatalog};
use crate::csi::client::{self, PodVolume};
use crate::csi::server;
use crate::events::NoEvents;
use crate::providers;
use crate::publish::Publisher;
use crate::telemetry::Metrics;
use crate::volume::{Backend, VolumeConfig, Volumes, mountinfo};

/// The demo manifests, built in so the demo works from any directory.
const DEMO_MANIFESTS: &str = include_str!("../../../examples/standalone/demo.yaml");
const DEMO_NAMESPACE: &str = "demo";
const DEMO_EXTERNAL_SECRET: &str = "shop-secrets";

/// Flags of `latchkey demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to mount the demo volume.
    #[arg(long, default_value = "latchkey-demo")]
    pub dir: PathBuf,
    /// Print secret values instead of masking them.
    #[arg(long)]
    pub show_values: bool,
    /// Leave the volume mounted on exit.
    #[arg(long)]
    pub keep: bool,
    /// Use the manifests of this directory instead of the built-in example.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// The ExternalSecret to mount (namespace `demo` unless --namespace).
    #[arg(long, default_value = DEMO_EXTERNAL_SECRET)]
    pub external_secret: String,
    /// Namespace of the demo pod.
    #[arg(long, default_value = DEMO_NAMESPACE)]
    pub namespace: String,
}

/// Runs the demo and prints what happens.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let target = std::path::absolute(&args.dir)?;
    check_target(&target)?;
    let backend = if nix::unistd::geteuid().is_root() {
        Backend::Tmpfs
    } else {
        println!(
            "note: not running as root, so no tmpfs can be mounted; the demo falls back to a plain \
             directory.\n      To see the real tmpfs volume, run it as root (`sudo latchkey demo`) \
             or, without root, in a\n      user and mount namespace of your own: \
             `unshare --user --map-root-user --mount latchkey demo`.\n"
        );
        Backend::PlainDirectory
    };
    let catalog = match &args.manifests {
        Some(dir) => ManifestCatalog::load_dir(dir)
            .with_context(|| format!("loading manifests from {}", dir.display()))?,
        None => {
            let mut c = ManifestCatalog::default();
            c.add_documents(Path::new("examples/standalone/demo.yaml"), DEMO_MANIFESTS)?;
            c
        }
    };
    let catalog: Arc<dyn Catalog> = Arc::new(catalog);
    let volumes = Volumes::new(VolumeConfig {
        backend,
        size_limit: 4 << 20,
    });
    // The demo serves no metrics endpoint; the registry only feeds the node service.
    let metrics = Arc::new(Metrics::new());
    let publisher = Arc::new(Publisher::new(
        Arc::clone(&catalog),
        volumes,
        providers::Env {
            metrics: Arc::clone(&metrics),
            kube: None,
            catalog: Arc::clone(&catalog),
            agent_namespace: DEMO_NAMESPACE.into(),
            aws_sessions: Default::default(),
            vault_tokens: Default::default(),
            plugins: Default::default(),
            secrets_store: Default::default(),
        },
        CacheLimits::default(),
        Arc::new(NoEvents),
        crate::compute::Pool::for_this_machine(crate::compute::DEFAULT_TIMEOUT)?,
    ));

    let tmp = tempfile::Builder::new()
        .prefix("latchkey-demo-")
        .tempdir()?;
    let socket_path = tmp.path().join("csi.sock");
    let socket = server::bind(&socket_path)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(
        socket,
        publisher,
        metrics,
        "demo-node".into(),
        async {
            let _ = stopped.await;
        },
    ));

    let result = talk_to_agent(&args, &target, backend, &socket_path).await;
    let _ = stop.send(());
    server.await.context("node service task")??;
    result
}

async fn talk_to_agent(
    args: &DemoArgs,
    target: &Path,
    backend: Backend,
    socket: &Path,
) -> anyhow::Result<()> {
    let channel = client::connect(socket).await?;
    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(status_error("GetPluginInfo"))?
        .into_inner();
    let ready = IdentityClient::new(channel.clone())
        .probe(ProbeRequest {})
        .await
        .map_err(status_error("Probe"))?
        .into_inner()
        .ready;
    println!(
        "1. node service {} {} on {} (ready: {})",
        info.name,
        info.vendor_version,
        socket.display(),
        ready.unwrap_or(false)
    );

    let volume_id = client::volume_id_for(target);
    let pod = PodVolume::new(&args.namespace, "demo-pod", &args.external_secret);
    let mut node = NodeClient::new(channel);
    node.node_publish_volume(pod.publish_request(&volume_id, target))
        .await
        .map_err(status_error("NodePublishVolume"))?;
    println!(
        "2. NodePublishVolume for pod {}/demo-pod, ExternalSecret {:?}: ok\n",
        args.namespace, args.external_secret
    );
    print!("{}", describe(target, args.show_values)?);

    if args.keep {
        println!("\n3. {}", keep_advice(target, backend));
        return Ok(());
    }
    node.node_unpublish_volume(client::unpublish_request(&volume_id, target))
        .await
        .map_err(status_error("NodeUnpublishVolume"))?;
    println!(
        "\n3. NodeUnpublishVolume: ok ({} {})",
        target.display(),
        if target.exists() {
            "still exists!"
        } else {
            "removed"
        }
    );
    Ok(())
}

/// Refuses, before anything starts, a target the demo cannot use: one with content (the demo
/// never mounts over or deletes anything) or one whose parent this user cannot write.
fn check_target(target: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(target) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                anyhow::bail!(
                    "{} exists and is not empty; the demo only mounts on an empty or missing \
                     directory and never deletes anything. Pass another --dir.",
                    target.display()
                );
            }
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let parent = target.parent().unwrap_or(Path::new("/"));
            nix::unistd::access(parent, nix::unistd::AccessFlags::W_OK).map_err(|errno| {
                anyhow::anyhow!(
                    "cannot create {}: {} is not writable for this user ({errno}). Pass a \
                     writable --dir, e.g. --dir /tmp/latchkey-demo",
                    target.display(),
                    parent.display()
                )
            })
        }
        Err(err) => Err(err).with_context(|| format!("inspecting --dir {}", target.display())),
    }
}

/// How to remove what `--keep` left, for the user who ran the demo.
fn keep_advice(target: &Path, backend: Backend) -> String {
    match backend {
        Backend::PlainDirectory => format!(
            "kept the volume (--keep), a plain directory of files. Remove it with: rm -r {}",
            target.display()
        ),
        Backend::Tmpfs => tmpfs_keep_advice(target, host_mounts()),
    }
}

/// Whether this process sees the same mounts as PID 1, so that a mount outlives the process.
#[derive(Clone, Copy, Debug, PartialEq)]
enum HostMounts {
    Shared,
    Separate,
    /// Not allowed to look (as in an unprivileged user namespace): either may be true.
    Unknown,
}

fn host_mounts() -> HostMounts {
    match (
        std::fs::read_link("/proc/self/ns/mnt"),
        std::fs::read_link("/proc/1/ns/mnt"),
    ) {
        (Ok(ours), Ok(init)) if ours == init => HostMounts::Shared,
        (Ok(_), Ok(_)) => HostMounts::Separate,
        _ => HostMounts::Unknown,
    }
}

/// What `--keep` left of a tmpfs volume, said only as far as this process can tell.
fn tmpfs_keep_advice(target: &Path, mounts: HostMounts) -> String {
    let dir = target.display();
    match mounts {
        HostMounts::Shared => {
            format!("kept the volume (--keep). Remove it as root with: umount {dir} && rmdir {dir}")
        }
        HostMounts::Separate => format!(
            "kept the volume (--keep), but this process has a mount namespace of its own (e.g. \
             under unshare), so the tmpfs goes away when the demo exits and only the empty \
             directory stays. Remove it with: rmdir {dir}"
        ),
        HostMounts::Unknown => format!(
            "kept the volume (--keep). This process may not look at PID 1's mounts, so it cannot \
             tell whether the tmpfs outlives it: in a mount namespace of its own (e.g. under \
             unshare) the tmpfs goes away when the demo exits and only the empty directory \
             stays (remove it with: rmdir {dir}); otherwise remove it as root with: \
             umount {dir} && rmdir {dir}"
        ),
    }
}

/// The mount line and the file tree with modes; values masked unless `show_values`.
fn describe(target: &Path, show_values: bool) -> anyhow::Result<String> {
    let mut out = String::new();
    match mountinfo::find(target)? {
        Some(m) => writeln!(
            out,
            "   {}  ({}, source {:?}, mount options {}; {})",
            target.display(),
            m.fstype,
            m.source,
            m.mount_options.join(","),
            m.super_options.join(",")
        )?,
        None => writeln!(out, "   {}  (plain directory)", target.display())?,
    }
    let root_mode = std::fs::metadata(target)?.permissions().mode();
    writeln!(out, "   {}  .", mode_string(root_mode))?;
    let mut files = Vec::new();
    collect(target, Path::new(""), &mut files)?;
    for rel in files {
        let path = target.join(&rel);
        let meta = std::fs::metadata(&path)?;
        let value = if show_values {
            String::from_utf8_lossy(&std::fs::read(&path)?).into_owned()
        } else {
            "********".to_string()
        };
        writeln!(
            out,
            "   {}  {:<14} {:>4} bytes  {}",
            mode_string(meta.permissions().mode()),
            rel.display(),
            meta.len(),
            value
        )?;
    }
    if !show_values {
        writeln!(
            out,
            "   (values masked; run with --show-values to print them)"
        )?;
    }
    Ok(out)
}

/// Files below `dir` as the pod sees them: following the entry symlinks, skipping the writer's
/// own `..`-prefixed bookkeeping entries.
fn collect(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| !n.to_string_lossy().starts_with(".."))
        .collect();
    entries.sort();
    for name in entries {
        let rel = rel.join(name);
        if std::fs::metadata(root.join(&rel))?.is_dir() {
            collect(root, &rel, out)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

fn mode_string(mode: u32) -> String {
    let kind = if mode & 0o170000 == 0o040000 {
        'd'
    } else {
        '-'
    };
    let bits = "rwxrwxrwx";
    std::iter::once(kind)
        .chain(
            bits.chars()
                .enumerate()
                .map(|(i, c)| if mode & (1 << (8 - i)) != 0 { c } else { '-' }),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{HostMounts, tmpfs_keep_advice};
    use std::path::Path;

    #[test]
    fn modes() {
        assert_eq!(super::mode_string(0o100444), "-r--r--r--");
        assert_eq!(super::mode_string(0o040755), "drwxr-xr-x");
    }

    /// A private mount namespace is claimed only when both namespaces could be read and differ.
    #[test]
    fn keep_advice_claims_only_what_it_could_tell() {
        let dir = Path::new("/tmp/d");
        let shared = tmpfs_keep_advice(dir, HostMounts::Shared);
        assert!(shared.contains("umount /tmp/d && rmdir /tmp/d"), "{shared}");
        assert!(!shared.contains("namespace"), "{shared}");
        let separate = tmpfs_keep_advice(dir, HostMounts::Separate);
        assert!(
            separate.contains("has a mount namespace of its own"),
            "{separate}"
        );
        let unknown = tmpfs_keep_advice(dir, HostMounts::Unknown);
        assert!(!unknown.contains("has a mount namespace"), "{unknown}");
        assert!(unknown.contains("cannot tell"), "{unknown}");
        assert!(
            unknown.contains("goes away when the demo exits") && unknown.contains("umount /tmp/d"),
            "{unknown}"
        );
    }
}
