//! End-to-end tests of [`Volumes`] against real tmpfs mounts (they need root) and the
//! plain-directory backend.

use std::fs;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::test_support::{MountGuard, file, file_with_mode, require_root};
use super::*;

mod targets;

use targets::{assert_intact, foreign_mount, someone_elses_directory};

const LIMIT: u64 = 1 << 20;
/// The namespace of the pods the volumes are for.
const NS: &str = "shop";

/// A tmpfs-backed `Volumes`, a scratch directory and a guard that unmounts the target.
/// Field order matters: the guard drops (unmounts) before the directory is deleted.
struct Fixture {
    volumes: Volumes,
    target: PathBuf,
    _guard: MountGuard,
    _dir: tempfile::TempDir,
}

fn fixture(backend: Backend) -> Fixture {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Below the scratch dir, so that publish has to create it (and must remove it again).
    let target = dir.path().canonicalize().unwrap().join("pod/volumes/mount");
    Fixture {
        volumes: Volumes::new(VolumeConfig {
            backend,
            size_limit: LIMIT,
        }),
        _guard: MountGuard::new(&target),
        target,
        _dir: dir,
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn data_link(target: &Path) -> PathBuf {
    fs::read_link(target.join("..data")).unwrap()
}

/// Asserts that the failed publish left nothing: no mount, no target, no created parents.
fn assert_nothing_left(f: &Fixture) {
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(!f.target.exists());
    let created_root = f.target.ancestors().nth(2).unwrap();
    assert!(!created_root.exists(), "{created_root:?} left behind");
}

#[test]
fn publish_mounts_a_locked_down_tmpfs_and_writes_the_files() {
    let f = fixture(Backend::Tmpfs);
    assert!(!f.volumes.is_published(&f.target).unwrap());
    let files = [
        file("password", "hunter2"),
        file("db/url", "postgres://db/shop"),
        file_with_mode("db/key", "k", 0o400),
    ];
    f.volumes.publish(NS, &f.target, &files, None).unwrap();
    assert!(f.volumes.is_published(&f.target).unwrap());

    let entry = mountinfo::find(&f.target).unwrap().expect("mounted");
    assert_eq!(entry.fstype, "tmpfs");
    // The pod's namespace in the source: the budget learns from it whose volume this is.
    assert_eq!(entry.source, "latchkey/shop");
    assert_eq!(MOUNT_SOURCE, "latchkey");
    for option in ["nosuid", "nodev", "noexec"] {
        assert!(entry.has_mount_option(option), "{option}: {entry:?}");
    }
    let expected = format!("{}k", tmpfs::tmpfs_size(LIMIT) / 1024);
    assert_eq!(entry.super_option("size"), Some(expected.as_str()));
    // 2 MiB for two payloads plus 16 pages of slack.
    assert_eq!(
        tmpfs::tmpfs_size(LIMIT),
        2 * LIMIT + 16 * tmpfs::page_size()
    );

    assert_eq!(mode(&f.target), 0o755);
    assert_eq!(mode(&f.target.join("password")), 0o444);
    assert_eq!(mode(&f.target.join("db/key")), 0o400);
    assert_eq!(fs::read(f.target.join("password")).unwrap(), b"hunter2");
    assert_eq!(
        fs::read(f.target.join("db/url")).unwrap(),
        b"postgres://db/shop"
    );
}

#[test]
fn publish_twice_is_refused() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    assert!(matches!(
        f.volumes.publish(NS, &f.target, &[file("a", "1")], None),
        Err(VolumeError::AlreadyPublished { .. })
    ));
    assert_eq!(fs::read(f.target.join("a")).unwrap(), b"1");
}

#[test]
fn publish_or_update_mounts_a_fresh_target_then_refreshes_it() {
    for backend in [Backend::Tmpfs, Backend::PlainDirectory] {
        let f = fixture(backend);
        let files = [file("a", "1")];
        assert!(matches!(
            f.volumes.publish_or_update(NS, &f.target, &files, None),
            Ok(Published::Mounted(Ok(())))
        ));
        assert_eq!(
            mountinfo::find(&f.target).unwrap().is_some(),
            backend == Backend::Tmpfs
        );
        assert!(matches!(
            f.volumes.publish_or_update(NS, &f.target, &files, None),
            Ok(Published::Updated(Ok(false)))
        ));
        assert!(matches!(
            f.volumes
                .publish_or_update(NS, &f.target, &[file("a", "2")], None),
            Ok(Published::Updated(Ok(true)))
        ));
        assert_eq!(fs::read(f.target.join("a")).unwrap(), b"2");
        // A refused payload is a failed refresh of the volume that is there, which stays.
        let big = "x".repeat(usize::try_from(LIMIT).unwrap());
        assert!(matches!(
            f.volumes
                .publish_or_update(NS, &f.target, &[file("a", &big)], None),
            Ok(Published::Updated(Err(VolumeError::TooLarge { .. })))
        ));
        assert_eq!(fs::read(f.target.join("a")).unwrap(), b"2");
        f.volumes.unpublish(&f.target).unwrap();
    }
}

#[test]
fn publish_or_update_fails_a_first_publish_that_cannot_happen() {
    let f = fixture(Backend::Tmpfs);
    let big = "x".repeat(usize::try_from(LIMIT).unwrap());
    assert!(matches!(
        f.volumes
            .publish_or_update(NS, &f.target, &[file("a", &big)], None),
        Ok(Published::Mounted(Err(VolumeError::TooLarge { .. })))
    ));
    assert_nothing_left(&f);
    let _foreign = foreign_mount(&f.target);
    assert!(matches!(
        f.volumes
            .publish_or_update(NS, &f.target, &[file("a", "1")], None),
        Ok(Published::Mounted(Err(VolumeError::NotOurMount { .. })))
    ));
    assert!(f.target.join("precious").exists());
    assert!(matches!(
        f.volumes
            .publish_or_update(NS, Path::new("relative"), &[file("a", "1")], None),
        Err(VolumeError::InvalidTarget { .. })
    ));
}

#[test]
fn update_swaps_atomically_under_concurrent_readers() {
    let f = fixture(Backend::Tmpfs);
    // Big enough that a torn write would be visible inside one file.
    let generation = |n: usize| {
        let body = format!("{n:08}\n").repeat(4096);
        [file("a", &body), file("nested/b", &body)]
    };
    f.volumes
        .publish(NS, &f.target, &generation(0), None)
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, target) = (Arc::clone(&stop), f.target.clone());
        std::thread::spawn(move || read_until_stopped(&target, &stop))
    };
    for n in 1..=200 {
        assert!(
            f.volumes
                .update(NS, &f.target, &generation(n), None)
                .unwrap()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (snapshots, single_reads) = reader.join().unwrap();
    assert!(
        snapshots > 0 && single_reads > 0,
        "{snapshots} {single_reads}"
    );
    assert_eq!(
        fs::read(f.target.join("a")).unwrap(),
        generation(200)[0].contents.expose()
    );
}

/// Reads the volume in a loop until told to stop, panicking on any mixed or torn content.
/// Returns how many consistent two-file snapshots and single-file reads it made.
fn read_until_stopped(target: &Path, stop: &AtomicBool) -> (usize, usize) {
    let (mut snapshots, mut single_reads) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        // Two files read through one resolution of `..data` must come from one generation.
        // ENOENT is allowed: the directory we resolved may be removed right after a swap.
        if let Ok(dir) = fs::File::open(target.join("..data")) {
            let a = read_at(&dir, "a");
            let b = read_at(&dir, "nested/b");
            if let (Some(a), Some(b)) = (a, b) {
                assert_uniform(&a);
                assert_eq!(a, b, "files of one snapshot differ");
                snapshots += 1;
            }
        }
        // A single file read by its public path is never torn.
        if let Ok(content) = fs::read(target.join("nested/b")) {
            assert_uniform(&content);
            single_reads += 1;
        }
    }
    (snapshots, single_reads)
}

fn read_at(dir: &fs::File, name: &str) -> Option<Vec<u8>> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut content = Vec::new();
    fs::File::from(fd).read_to_end(&mut content).ok()?;
    Some(content)
}

fn assert_uniform(content: &[u8]) {
    assert_eq!(content.len(), 9 * 4096, "torn file");
    let first = &content[..9];
    assert!(
        content.chunks(9).all(|c| c == first),
        "mixed generations in one file"
    );
}

#[test]
fn update_removes_keys_and_identical_content_is_not_rewritten() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1"), file("gone/x", "2")], None)
        .unwrap();
    let files = [file("a", "1"), file("new", "3")];
    assert!(f.volumes.update(NS, &f.target, &files, None).unwrap());
    assert!(fs::symlink_metadata(f.target.join("gone")).is_err());
    assert_eq!(fs::read(f.target.join("new")).unwrap(), b"3");

    let before = data_link(&f.target);
    assert!(!f.volumes.update(NS, &f.target, &files, None).unwrap());
    assert_eq!(data_link(&f.target), before);
}

#[test]
fn update_of_an_unpublished_target_writes_nothing() {
    let f = fixture(Backend::Tmpfs);
    fs::create_dir_all(&f.target).unwrap();
    assert!(matches!(
        f.volumes.update(NS, &f.target, &[file("a", "1")], None),
        Err(VolumeError::NotPublished { .. })
    ));
    assert_eq!(fs::read_dir(&f.target).unwrap().count(), 0);
}

#[test]
fn update_errors_keep_the_old_content() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    let before = data_link(&f.target);
    let too_big = "x".repeat(usize::try_from(LIMIT).unwrap());
    assert!(matches!(
        f.volumes
            .update(NS, &f.target, &[file("a", &too_big)], None),
        Err(VolumeError::TooLarge { .. })
    ));
    assert!(matches!(
        f.volumes
            .update(NS, &f.target, &[file("a", "2"), file("a/b", "3")], None),
        Err(VolumeError::Conflict(_))
    ));
    assert_eq!(data_link(&f.target), before);
    assert_eq!(fs::read(f.target.join("a")).unwrap(), b"1");
}

#[test]
fn too_large_publish_leaves_nothing() {
    let f = fixture(Backend::Tmpfs);
    let big = "x".repeat(usize::try_from(LIMIT).unwrap());
    match f.volumes.publish(NS, &f.target, &[file("a", &big)], None) {
        Err(VolumeError::TooLarge { needed, limit }) => {
            assert_eq!(limit, LIMIT);
            assert_eq!(needed, LIMIT + tmpfs::page_size());
        }
        other => panic!("{other:?}"),
    }
    assert_nothing_left(&f);
}

#[test]
fn conflicting_publish_leaves_nothing() {
    let f = fixture(Backend::Tmpfs);
    let err = f
        .volumes
        .publish(NS, &f.target, &[file("db", "1"), file("db/url", "2")], None)
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::InvalidArgument);
    assert!(err.to_string().contains("\"db/url\""), "{err}");
    assert_nothing_left(&f);
}

#[test]
fn no_space_during_publish_leaves_nothing() {
    let f = fixture(Backend::Tmpfs);
    // Within the budget, but the tmpfs is made smaller than the payload.
    let volumes = f.volumes.clone().with_tmpfs_size(2 * tmpfs::page_size());
    let files = [file("a", &"x".repeat(64 * 1024))];
    match volumes.publish(NS, &f.target, &files, None) {
        Err(VolumeError::NoSpace { target }) => assert_eq!(target, f.target),
        other => panic!("{other:?}"),
    }
    assert_nothing_left(&f);
}

#[test]
fn failed_publish_keeps_a_target_it_did_not_create() {
    let f = fixture(Backend::Tmpfs);
    fs::create_dir_all(&f.target).unwrap();
    let volumes = f.volumes.clone().with_tmpfs_size(2 * tmpfs::page_size());
    let files = [file("a", &"x".repeat(64 * 1024))];
    assert!(volumes.publish(NS, &f.target, &files, None).is_err());
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(f.target.is_dir());
    assert_eq!(fs::read_dir(&f.target).unwrap().count(), 0);
}

#[test]
fn publish_refuses_a_directory_with_content() {
    for backend in [Backend::Tmpfs, Backend::PlainDirectory] {
        let f = fixture(backend);
        someone_elses_directory(&f.target);
        let err = f
            .volumes
            .publish(NS, &f.target, &[file("a", "1")], None)
            .unwrap_err();
        assert!(matches!(err, VolumeError::NotEmpty { .. }), "{err:?}");
        assert_eq!(err.class(), ErrorClass::FailedPrecondition);
        assert!(err.to_string().contains(&f.target.display().to_string()));
        assert_eq!(mountinfo::find(&f.target).unwrap(), None);
        assert_intact(&f.target);
        let mut names: Vec<_> = fs::read_dir(&f.target)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["precious", "sub"]);
    }
}

#[test]
fn plain_directory_backend_never_mounts() {
    let f = fixture(Backend::PlainDirectory);
    assert!(!f.volumes.is_published(&f.target).unwrap());
    f.volumes
        .publish(NS, &f.target, &[file("a", "1"), file("b/c", "2")], None)
        .unwrap();
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(f.volumes.is_published(&f.target).unwrap());
    assert_eq!(mode(&f.target), 0o755);
    assert_eq!(fs::read(f.target.join("b/c")).unwrap(), b"2");
    assert!(matches!(
        f.volumes.publish(NS, &f.target, &[file("a", "1")], None),
        Err(VolumeError::AlreadyPublished { .. })
    ));

    assert!(
        f.volumes
            .update(NS, &f.target, &[file("a", "2")], None)
            .unwrap()
    );
    assert!(
        !f.volumes
            .update(NS, &f.target, &[file("a", "2")], None)
            .unwrap()
    );
    assert_eq!(fs::read(f.target.join("a")).unwrap(), b"2");
    assert!(!f.target.join("b").exists());

    assert_eq!(
        f.volumes.unpublish(&f.target).unwrap(),
        Unpublished::Removed
    );
    assert!(!f.target.exists());
    assert_eq!(
        f.volumes.unpublish(&f.target).unwrap(),
        Unpublished::NothingThere
    );
    assert!(matches!(
        f.volumes.update(NS, &f.target, &[file("a", "2")], None),
        Err(VolumeError::NotPublished { .. })
    ));
}

#[test]
fn plain_directory_failed_publish_leaves_nothing() {
    let f = fixture(Backend::PlainDirectory);
    let err = f
        .volumes
        .publish(NS, &f.target, &[file_with_mode("a", "1", 0o2755)], None)
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::InvalidArgument);
    assert_nothing_left(&f);
}

#[test]
fn bad_targets_are_invalid_arguments() {
    let volumes = Volumes::new(VolumeConfig {
        backend: Backend::Tmpfs,
        size_limit: LIMIT,
    });
    for target in ["relative", "/a/../b", "/"] {
        let err = volumes.unpublish(Path::new(target)).unwrap_err();
        assert_eq!(err.class(), ErrorClass::InvalidArgument, "{target}: {err}");
    }
}

#[test]
fn fs_group_owns_the_volume_and_tightens_the_root() {
    use std::os::unix::fs::MetadataExt;
    for backend in [Backend::Tmpfs, Backend::PlainDirectory] {
        let f = fixture(backend);
        let gid = 2345;
        let files = [
            file_with_mode("db/password", "1", 0o440),
            file("api-key", "2"),
        ];
        f.volumes.publish(NS, &f.target, &files, Some(gid)).unwrap();
        let root = fs::metadata(&f.target).unwrap();
        assert_eq!(root.mode() & 0o7777, 0o750, "{backend:?}: root");
        assert_eq!(root.gid(), gid, "{backend:?}: root group");
        for (path, mode) in [("db/password", 0o440), ("api-key", 0o444), ("db", 0o750)] {
            let meta = fs::metadata(f.target.join(path)).unwrap();
            assert_eq!(meta.gid(), gid, "{backend:?}: {path} group");
            assert_eq!(meta.mode() & 0o7777, mode, "{backend:?}: {path} mode");
        }
        if backend == Backend::Tmpfs {
            let m = mountinfo::find(&f.target).unwrap().unwrap();
            assert_eq!(m.super_option("gid"), Some("2345"));
            assert_eq!(m.super_option("mode"), Some("750"));
        }
        // Same content and group: nothing to do. Another group: rewritten with it.
        assert!(!f.volumes.update(NS, &f.target, &files, Some(gid)).unwrap());
        assert!(
            f.volumes
                .update(NS, &f.target, &files, Some(gid + 1))
                .unwrap()
        );
        let meta = fs::metadata(f.target.join("api-key")).unwrap();
        assert_eq!(meta.gid(), gid + 1);
        f.volumes.unpublish(&f.target).unwrap();
    }
}

#[test]
fn only_a_few_small_files_are_light_enough_for_an_async_worker() {
    let small = |n: usize, bytes: usize| -> Vec<VolumeFile> {
        (0..n)
            .map(|i| file(&format!("f{i}"), &"x".repeat(bytes)))
            .collect()
    };
    assert!(is_light(&[]));
    assert!(is_light(&small(3, 64)));
    assert!(is_light(&small(LIGHT_FILES, LIGHT_BYTES / LIGHT_FILES)));
    assert!(!is_light(&small(LIGHT_FILES + 1, 1)));
    assert!(!is_light(&small(1, LIGHT_BYTES + 1)));
    assert!(!is_light(&small(2, LIGHT_BYTES / 2 + 1)));
}
