//! The first thing a new user runs: `latchkey demo` must work from a fresh directory, as root
//! (real tmpfs) and as an ordinary user (plain-directory fallback, said clearly).

mod support;

use std::process::Command;

const DB_PASSWORD: &str = "correct-horse-battery-staple";

fn demo(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(support::BIN)
        .arg("demo")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the demo in `dir` under `unshare` with `unshare_args`; it must succeed. Returns stdout.
/// unshare (util-linux) is required: the test fails rather than skips without it.
fn unshared_demo(dir: &std::path::Path, unshare_args: &[&str], demo_args: &[&str]) -> String {
    let out = Command::new("unshare")
        .args(unshare_args)
        .arg("--")
        .arg(support::BIN)
        .arg("demo")
        .args(demo_args)
        .current_dir(dir)
        .output()
        .expect("unshare (util-linux) is needed for this test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn demo_publishes_shows_masked_files_and_cleans_up() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = demo(dir.path(), &[]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    for want in [
        "csi.latchkey.dev",
        "NodePublishVolume",
        "tmpfs",
        "nosuid,nodev,noexec",
        "-r--r--r--  db-password",
        "api-key",
        "LOG_LEVEL",
        "NodeUnpublishVolume: ok",
        "removed",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(!out.contains(DB_PASSWORD), "values are masked by default");
    assert!(!dir.path().join("latchkey-demo").exists());
    assert_eq!(support::mounts_at(&dir.path().join("latchkey-demo")), 0);
}

#[test]
fn demo_show_values_and_keep() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("latchkey-demo");
    let (ok, out, err) = demo(dir.path(), &["--show-values", "--keep"]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert!(out.contains(DB_PASSWORD), "{out}");
    assert!(out.contains("kept the volume"), "{out}");
    assert_eq!(
        std::fs::read_to_string(target.join("db-password")).unwrap(),
        DB_PASSWORD
    );
    nix::mount::umount(&target).unwrap();
    std::fs::remove_dir(&target).unwrap();
}

#[test]
fn demo_as_non_root_falls_back_to_a_plain_directory_and_says_so() {
    support::require_root();
    // A new user namespace without a uid mapping runs the demo as the overflow user (nobody)
    // with no mount privilege, whether the test itself runs as real root or in a namespace.
    let dir = tempfile::tempdir().unwrap();
    let stdout = unshared_demo(dir.path(), &["--user"], &[]);
    assert!(stdout.contains("not running as root"), "{stdout}");
    assert!(
        stdout.contains("unshare --user --map-root-user --mount"),
        "{stdout}"
    );
    assert!(stdout.contains("plain directory"), "{stdout}");
    assert!(stdout.contains("NodeUnpublishVolume: ok"), "{stdout}");
    assert!(!dir.path().join("latchkey-demo").exists());
}

#[test]
fn demo_never_mounts_over_or_deletes_an_existing_directory() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("latchkey-demo");
    std::fs::create_dir_all(existing.join("sub")).unwrap();
    std::fs::write(existing.join("thesis.tex"), b"four years of work").unwrap();
    std::fs::write(existing.join("sub/notes"), b"more work").unwrap();
    let (ok, out, err) = demo(dir.path(), &[]);
    assert!(!ok, "demo must refuse a non-empty directory:\n{out}\n{err}");
    assert!(
        err.contains("is not empty") && err.contains("--dir"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(existing.join("thesis.tex")).unwrap(),
        b"four years of work"
    );
    assert_eq!(
        std::fs::read(existing.join("sub/notes")).unwrap(),
        b"more work"
    );
    assert_eq!(support::mounts_at(&existing), 0);
}

#[test]
fn demo_in_a_read_only_directory_suggests_a_writable_dir() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let read_only = dir.path().join("ro");
    std::fs::create_dir(&read_only).unwrap();
    nix::mount::mount(
        Some("demo-test"),
        &read_only,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_RDONLY,
        Some("size=64k"),
    )
    .unwrap();
    let (ok, out, err) = demo(&read_only, &[]);
    nix::mount::umount(&read_only).unwrap();
    assert!(!ok, "{out}");
    assert!(
        err.contains("not writable") && err.contains("--dir /tmp/latchkey-demo"),
        "{err}"
    );
}

#[test]
fn demo_in_a_user_namespace_mounts_a_real_tmpfs_and_keep_says_what_stays() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let stdout = unshared_demo(
        dir.path(),
        &["--user", "--map-root-user", "--mount"],
        &["--keep"],
    );
    assert!(
        stdout.contains("tmpfs") && !stdout.contains("not running as root"),
        "{stdout}"
    );
    assert!(stdout.contains("goes away when the demo exits"), "{stdout}");
    // The advice works: the tmpfs went with the namespace, the empty directory is removable.
    let target = dir.path().join("latchkey-demo");
    assert_eq!(support::mounts_at(&target), 0);
    std::fs::remove_dir(&target).unwrap();
}

#[test]
fn node_without_manifests_or_kubeconfig_says_what_to_do_in_one_line() {
    let home = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}/csi.sock", home.path().display());
    let stderr = one_line_failure_without_a_cluster(
        &["node", "--node-id", "n", "--endpoint", &endpoint],
        home.path(),
    );
    assert!(
        stderr.contains("--manifests") && stderr.contains("KUBECONFIG"),
        "{stderr}"
    );
}

/// The controller has no manifest mode: its hint must not send the user to `--manifests`.
#[test]
fn controller_without_kubeconfig_says_what_to_do_without_a_flag_it_lacks() {
    let home = tempfile::tempdir().unwrap();
    let stderr =
        one_line_failure_without_a_cluster(&["controller", "--metrics-addr", "none"], home.path());
    assert!(stderr.contains("KUBECONFIG"), "{stderr}");
    assert!(!stderr.contains("--manifests"), "{stderr}");
}

/// Runs `latchkey <args>` with no cluster configured (no KUBECONFIG, not in a pod, an empty
/// HOME) and returns its stderr, after checking that it failed with exactly one line.
fn one_line_failure_without_a_cluster(args: &[&str], home: &std::path::Path) -> String {
    let out = Command::new(support::BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    stderr
}

/// Every Latchkey object in examples/ parses and passes the agent's validation, so what the
/// README points at works as written.
#[test]
fn every_example_object_is_valid() {
    use latchkey::api::validate;
    use latchkey::api::{ClusterSecretStore, ExternalSecret, SecretStore, StoreKind};
    use serde::Deserialize;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<_> = walk(&dir);
    files.sort();
    let mut checked = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = serde_norway::Value::deserialize(doc).unwrap();
            let where_ = format!("{}: {:?}", path.display(), value.get("metadata"));
            if value.get("apiVersion").and_then(|v| v.as_str()) != Some("latchkey.dev/v1alpha1") {
                continue;
            }
            match value.get("kind").and_then(|v| v.as_str()) {
                Some("ExternalSecret") => {
                    let es: ExternalSecret = serde_norway::from_value(value).expect(&where_);
                    validate::external_secret(&es.spec).expect(&where_);
                }
                Some("SecretStore") => {
                    let s: SecretStore = serde_norway::from_value(value).expect(&where_);
                    validate::provider(&s.spec.provider, StoreKind::SecretStore).expect(&where_);
                }
                Some("ClusterSecretStore") => {
                    let s: ClusterSecretStore = serde_norway::from_value(value).expect(&where_);
                    validate::provider(&s.spec.provider, StoreKind::ClusterSecretStore)
                        .expect(&where_);
                }
                other => panic!("{where_}: unknown kind {other:?}"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} example objects found");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    out
}
