//! Tests of what a publish or unpublish finds at its target: removing volumes (stacked, busy,
//! mounted before a restart), and leaving alone what is not ours (foreign mounts, somebody
//! else's directory, files and links).

use super::*;

#[test]
fn unpublish_removes_mount_and_directory_and_is_idempotent() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    f.volumes.unpublish(&f.target).unwrap();
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(!f.target.exists());
    assert!(f.target.parent().unwrap().exists());
    f.volumes.unpublish(&f.target).unwrap();
    assert!(!f.volumes.is_published(&f.target).unwrap());
}

#[test]
fn unpublish_of_a_missing_target_succeeds() {
    let f = fixture(Backend::Tmpfs);
    f.volumes.unpublish(&f.target).unwrap();
}

#[test]
fn unpublish_detaches_a_busy_volume() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    let mut open = fs::File::open(f.target.join("a")).unwrap();
    f.volumes.unpublish(&f.target).unwrap();
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(!f.target.exists());
    // The lazily detached tmpfs still serves the reader that holds it open.
    let mut content = String::new();
    open.read_to_string(&mut content).unwrap();
    assert_eq!(content, "1");
}

/// Mounts a tmpfs that is not ours at `at`, with one file in it.
pub(super) fn foreign_mount(at: &Path) -> MountGuard {
    fs::create_dir_all(at).unwrap();
    nix::mount::mount(
        Some("other"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64k"),
    )
    .unwrap();
    let guard = MountGuard::new(at);
    fs::write(at.join("precious"), b"x").unwrap();
    guard
}

#[test]
fn foreign_mounts_are_refused_and_left_intact() {
    let f = fixture(Backend::Tmpfs);
    let _foreign = foreign_mount(&f.target);
    assert!(!f.volumes.is_published(&f.target).unwrap());
    for result in [
        f.volumes.unpublish(&f.target).map(drop),
        f.volumes.publish(NS, &f.target, &[file("a", "1")], None),
        f.volumes
            .update(NS, &f.target, &[file("a", "1")], None)
            .map(drop),
    ] {
        match result {
            Err(VolumeError::NotOurMount {
                target,
                mount_source,
                ..
            }) => {
                assert_eq!(target, f.target);
                assert_eq!(mount_source, "other");
            }
            Err(VolumeError::NotPublished { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let entry = mountinfo::find(&f.target).unwrap().expect("still mounted");
    assert_eq!(entry.source, "other");
    assert!(f.target.join("precious").exists());
}

#[test]
fn a_foreign_mount_below_the_target_blocks_unpublish() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    let inner = f.target.join("mnt");
    let _foreign = foreign_mount(&inner);
    match f.volumes.unpublish(&f.target) {
        Err(VolumeError::NotOurMount { target, .. }) => assert_eq!(target, inner),
        other => panic!("{other:?}"),
    }
    assert!(inner.join("precious").exists());
    assert!(f.target.join("a").exists());
    assert!(f.volumes.is_published(&f.target).unwrap());
}

#[test]
fn plain_directory_unpublish_removes_only_what_the_writer_wrote() {
    let f = fixture(Backend::PlainDirectory);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1"), file("b/c", "2")], None)
        .unwrap();
    let inner = f.target.join("mnt");
    let _foreign = foreign_mount(&inner);
    fs::write(f.target.join("notes.txt"), b"mine").unwrap();
    match f.volumes.unpublish(&f.target) {
        Err(err @ VolumeError::LeftInPlace { .. }) => {
            assert_eq!(err.class(), ErrorClass::FailedPrecondition);
            let msg = err.to_string();
            assert!(
                msg.contains("2 entries") && msg.contains("\"notes.txt\""),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fs::read(inner.join("precious")).unwrap(), b"x");
    assert_eq!(fs::read(f.target.join("notes.txt")).unwrap(), b"mine");
    let mut left: Vec<_> = fs::read_dir(&f.target)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["mnt", "notes.txt"]);
}

/// A directory holding `precious` (and a subdirectory) that is not a volume.
pub(super) fn someone_elses_directory(at: &Path) {
    fs::create_dir_all(at.join("sub")).unwrap();
    fs::write(at.join("precious"), b"keep me").unwrap();
    fs::write(at.join("sub/deep"), b"me too").unwrap();
}

pub(super) fn assert_intact(at: &Path) {
    assert_eq!(fs::read(at.join("precious")).unwrap(), b"keep me");
    assert_eq!(fs::read(at.join("sub/deep")).unwrap(), b"me too");
}

#[test]
fn unpublish_of_a_directory_that_is_not_a_volume_never_deletes_its_content() {
    for backend in [Backend::Tmpfs, Backend::PlainDirectory] {
        let f = fixture(backend);
        someone_elses_directory(&f.target);
        let err = f.volumes.unpublish(&f.target).unwrap_err();
        assert!(matches!(err, VolumeError::LeftInPlace { .. }), "{err:?}");
        assert_eq!(err.class(), ErrorClass::FailedPrecondition);
        let msg = err.to_string();
        assert!(
            msg.contains(&f.target.display().to_string()) && msg.contains("2 entries"),
            "{msg}"
        );
        assert_intact(&f.target);

        // An empty directory that is not a volume may go: that is what kubelet leaves.
        let empty = f.target.with_file_name("empty");
        fs::create_dir(&empty).unwrap();
        assert_eq!(
            f.volumes.unpublish(&empty).unwrap(),
            Unpublished::NothingThere
        );
        assert!(!empty.exists());
    }
}

#[test]
fn files_and_links_as_targets_are_refused_and_left_alone() {
    for backend in [Backend::Tmpfs, Backend::PlainDirectory] {
        let f = fixture(backend);
        let parent = f.target.parent().unwrap();
        fs::create_dir_all(parent).unwrap();
        let elsewhere = parent.join("elsewhere");
        someone_elses_directory(&elsewhere);

        let refused = || {
            for err in [
                f.volumes.unpublish(&f.target).unwrap_err(),
                f.volumes
                    .publish(NS, &f.target, &[file("a", "1")], None)
                    .unwrap_err(),
            ] {
                assert!(matches!(err, VolumeError::NotADirectory { .. }), "{err:?}");
                assert_eq!(err.class(), ErrorClass::FailedPrecondition);
            }
        };
        fs::write(&f.target, b"a file").unwrap();
        refused();
        assert_eq!(fs::read(&f.target).unwrap(), b"a file");

        fs::remove_file(&f.target).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &f.target).unwrap();
        refused();
        assert_eq!(fs::read_link(&f.target).unwrap(), elsewhere);
        assert_intact(&elsewhere);
        assert_eq!(mountinfo::find(&elsewhere).unwrap(), None);
    }
}

#[test]
fn a_volume_mounted_before_a_restart_is_recognised_and_unpublished() {
    let f = fixture(Backend::Tmpfs);
    f.volumes
        .publish(NS, &f.target, &[file("a", "1")], None)
        .unwrap();
    // A new agent process knows nothing of the mounts the old one made.
    let restarted = Volumes::new(f.volumes.config());
    assert!(restarted.is_published(&f.target).unwrap());
    assert!(
        restarted
            .update(NS, &f.target, &[file("a", "2")], None)
            .unwrap()
    );
    assert_eq!(
        restarted.unpublish(&f.target).unwrap(),
        Unpublished::Removed
    );
    assert_eq!(mountinfo::find(&f.target).unwrap(), None);
    assert!(!f.target.exists());
}
