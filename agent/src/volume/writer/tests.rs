//! Tests of the atomic writer on plain directories (and, for ENOSPC, on a tiny real tmpfs).

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::volume::payload::check;
use crate::volume::test_support::{MountGuard, file, file_with_mode, require_root};
use crate::volume::tmpfs::page_size;
use crate::volume::{mountinfo, tmpfs};

const LIMIT: u64 = 1 << 20;

fn write(root: &Path, files: &[VolumeFile]) -> Result<bool, VolumeError> {
    let payload = check(files, LIMIT)?;
    AtomicWriter::new(root, None).write(&payload)
}

fn data_target(root: &Path) -> PathBuf {
    fs::read_link(root.join(DATA_LINK)).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every name in the root, sorted.
fn listing(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn payload_dirs(root: &Path) -> Vec<String> {
    listing(root)
        .into_iter()
        .filter(|n| n.starts_with("..") && n != DATA_LINK)
        .collect()
}

#[test]
fn writes_the_kubelet_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = [
        file("password", "hunter2"),
        file("db/url", "postgres://db"),
        file_with_mode("db/key", "k", 0o400),
    ];
    assert!(write(root, &files).unwrap());

    let data = data_target(root);
    let name = data.to_str().unwrap();
    assert!(is_payload_dir_name(data.as_os_str()), "{name}");
    assert!(name.starts_with("..20") && name.len() == "..2026_05_01_12_00_00.123456789".len());
    assert_eq!(listing(root), [name, DATA_LINK, "db", "password"]);
    assert_eq!(
        fs::read_link(root.join("password")).unwrap(),
        Path::new("..data/password")
    );
    assert_eq!(
        fs::read_link(root.join("db")).unwrap(),
        Path::new("..data/db")
    );
    assert_eq!(fs::read(root.join("password")).unwrap(), b"hunter2");
    assert_eq!(fs::read(root.join("db/url")).unwrap(), b"postgres://db");
    assert_eq!(mode(&root.join("password")), 0o444);
    assert_eq!(mode(&root.join("db/key")), 0o400);
    assert_eq!(mode(&root.join(name)), 0o755);
    assert_eq!(mode(&root.join("db")), 0o755);
}

#[test]
fn identical_content_is_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let files = [file("a", "1"), file("b/c", "2")];
    assert!(write(dir.path(), &files).unwrap());
    let before = data_target(dir.path());
    // Same set in another order.
    let reordered = [file("b/c", "2"), file("a", "1")];
    assert!(!write(dir.path(), &reordered).unwrap());
    assert_eq!(data_target(dir.path()), before);
}

#[test]
fn any_difference_is_written_and_the_old_payload_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let base = [file("a", "1"), file("b/c", "2")];
    let variants: [&[VolumeFile]; 4] = [
        &[file("a", "1"), file("b/c", "3")],
        &[file_with_mode("a", "1", 0o440), file("b/c", "3")],
        &[
            file_with_mode("a", "1", 0o440),
            file("b/c", "3"),
            file("b/d", ""),
        ],
        &[file("a", "1")],
    ];
    write(root, &base).unwrap();
    for files in variants {
        let before = data_target(root);
        assert!(write(root, files).unwrap(), "{files:?}");
        assert_ne!(data_target(root), before);
        assert_eq!(payload_dirs(root).len(), 1, "{:?}", listing(root));
    }
    assert_eq!(mode(&root.join("a")), 0o444);
    // `b` is gone from the set: its link is gone too.
    assert_eq!(listing(root).last().unwrap(), "a");
    assert!(fs::symlink_metadata(root.join("b")).is_err());
}

#[test]
fn removed_keys_disappear_and_new_keys_appear() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, &[file("old", "1"), file("keep", "k")]).unwrap();
    write(root, &[file("new", "2"), file("keep", "k")]).unwrap();
    assert!(fs::symlink_metadata(root.join("old")).is_err());
    assert_eq!(fs::read(root.join("new")).unwrap(), b"2");
    assert_eq!(fs::read(root.join("keep")).unwrap(), b"k");
}

#[test]
fn tampering_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = [file("a", "1")];
    write(root, &files).unwrap();
    // An extra file inside the payload directory makes it differ.
    let data = root.join(data_target(root));
    fs::write(data.join("extra"), b"x").unwrap();
    assert!(write(root, &files).unwrap());
    assert!(!root.join(DATA_LINK).join("extra").exists());
    // A missing top-level link makes it differ as well.
    fs::remove_file(root.join("a")).unwrap();
    assert!(write(root, &files).unwrap());
    assert_eq!(fs::read(root.join("a")).unwrap(), b"1");
    assert!(!write(root, &files).unwrap());
}

#[test]
fn leftovers_of_an_interrupted_write_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, &[file("a", "1")]).unwrap();
    fs::create_dir(root.join("..2001_01_01_00_00_00.000000001")).unwrap();
    fs::write(root.join("..2001_01_01_00_00_00.000000001/a"), b"stale").unwrap();
    symlink("..nowhere", root.join(DATA_TMP)).unwrap();
    symlink("..nowhere", root.join(LINK_TMP)).unwrap();
    write(root, &[file("a", "2")]).unwrap();
    assert_eq!(payload_dirs(root).len(), 1, "{:?}", listing(root));
    assert_eq!(listing(root).len(), 3, "{:?}", listing(root));
}

#[test]
fn foreign_top_level_entries_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join("not-ours"), b"x").unwrap();
    symlink("/etc/hostname", root.join("other-link")).unwrap();
    write(root, &[file("a", "1")]).unwrap();
    write(root, &[file("b", "1")]).unwrap();
    assert!(root.join("not-ours").exists());
    assert!(fs::symlink_metadata(root.join("other-link")).is_ok());
}

#[test]
fn a_directory_in_the_way_fails_without_touching_the_old_set() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, &[file("a", "1")]).unwrap();
    let before = data_target(root);
    fs::create_dir(root.join("blocked")).unwrap();
    let err = write(root, &[file("a", "2"), file("blocked", "x")]).unwrap_err();
    assert!(matches!(err, VolumeError::Io { .. }), "{err:?}");
    assert_eq!(data_target(root), before);
    assert_eq!(fs::read(root.join("a")).unwrap(), b"1");
    assert_eq!(payload_dirs(root), [before.to_str().unwrap()]);
}

#[test]
fn a_data_link_pointing_outside_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("a"), b"1").unwrap();
    symlink(outside.path(), dir.path().join(DATA_LINK)).unwrap();
    assert!(write(dir.path(), &[file("a", "1")]).unwrap());
    assert!(outside.path().join("a").exists());
    assert!(is_payload_dir_name(data_target(dir.path()).as_os_str()));
}

#[test]
fn no_space_is_reported_and_the_old_set_survives() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    // Four pages: room for the first payload, not for the second next to it.
    tmpfs::mount(&root, tmpfs::SOURCE, 4 * page_size(), None).unwrap();
    let _guard = MountGuard::new(&root);
    assert!(mountinfo::find(&root).unwrap().is_some());

    let small = [file("a", "1")];
    write(&root, &small).unwrap();
    let before = data_target(&root);
    let big = "x".repeat(usize::try_from(8 * page_size()).unwrap());
    let err = write(&root, &[file("a", &big)]).unwrap_err();
    match &err {
        VolumeError::NoSpace { target } => assert_eq!(target, &root),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.class(), crate::volume::ErrorClass::ResourceExhausted);
    assert_eq!(data_target(&root), before);
    assert_eq!(fs::read(root.join("a")).unwrap(), b"1");
    assert_eq!(listing(&root).len(), 3, "{:?}", listing(&root));
}

#[test]
fn timestamp_names_are_utc_and_sortable() {
    let at = |secs: u64, nanos: u32| {
        timestamp_name(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
    };
    assert_eq!(at(0, 0), "..1970_01_01_00_00_00.000000000");
    assert_eq!(at(951_782_400, 7), "..2000_02_29_00_00_00.000000007");
    assert_eq!(
        at(1_700_000_000, 123_456_789),
        "..2023_11_14_22_13_20.123456789"
    );
    assert_eq!(at(4_107_542_399, 0), "..2100_02_28_23_59_59.000000000");
    assert_eq!(at(4_107_542_400, 0), "..2100_03_01_00_00_00.000000000");
    assert!(at(1, 0) < at(1, 1));
}

#[test]
fn a_path_buffer_joins_names_with_one_slash_and_truncates_back() {
    let mut path = PathBuffer::new(Path::new("/"));
    path.push("a");
    assert_eq!(path.as_path(), Path::new("/a"));
    let mut path = PathBuffer::new(Path::new("/root/"));
    let root = path.len();
    path.push("..2026_01_01");
    path.push("db");
    assert_eq!(path.as_path(), Path::new("/root/..2026_01_01/db"));
    path.truncate(root);
    path.push("password");
    assert_eq!(path.as_path(), Path::new("/root/password"));
}

#[test]
fn a_fresh_write_that_fails_at_a_link_removes_the_links_it_made_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Not empty after all (a race with somebody else): the link `b` cannot be made.
    fs::write(root.join("b"), b"theirs").unwrap();
    let files = [file("a", "1"), file("b", "2"), file("c", "3")];
    let payload = check(&files, LIMIT).unwrap();
    let err = AtomicWriter::new(root, None)
        .write_fresh(&payload)
        .unwrap_err();
    assert!(err.to_string().contains("creating link"), "{err}");
    assert_eq!(listing(root), ["b"]);
    assert_eq!(fs::read(root.join("b")).unwrap(), b"theirs");
}
