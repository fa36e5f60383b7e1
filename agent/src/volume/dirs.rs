//! Creating and removing target directories: publish must be able to remove exactly the
//! directories it created, and removal must never follow a link or descend into another
//! filesystem (a foreign mount below the target, e.g. a host path bind-mounted there by mistake).
//!
//! Entered from one place per step of a publish: preparing the target (`target`), undoing a
//! failed first publish (`mount`), and removing the emptied target on unpublish (`Volumes`).
//! Not for deciding whether something is *our* mount (that needs mountinfo, see `target`).

use std::fs::{self, DirBuilder};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::error::VolumeError;

/// Mode of a target directory we create: the volume root is world-readable, like kubelet's.
const TARGET_MODE: u32 = 0o755;
/// Mode of missing parents we create, as kubelet creates its own volume directories.
const PARENT_MODE: u32 = 0o750;

/// The directories [`create_target`] made, outermost first.
#[derive(Debug, Default)]
pub(crate) struct Created {
    dirs: Vec<PathBuf>,
}

impl Created {
    /// Removes what was created, innermost first: the target with everything in it, then the
    /// parents as long as they are empty (someone else may have put things there meanwhile).
    /// Best effort, because it runs while another error is being reported; failures are logged.
    pub(crate) fn remove(self, target: &Path) {
        for dir in self.dirs.iter().rev() {
            let result = if dir == target {
                remove_tree(dir)
            } else {
                fs::remove_dir(dir).map_err(|source| VolumeError::Io {
                    op: "removing directory",
                    path: dir.clone(),
                    source,
                })
            };
            match result {
                Ok(()) => {}
                Err(VolumeError::Io { source, .. })
                    if source.kind() == ErrorKind::DirectoryNotEmpty =>
                {
                    break;
                }
                Err(err) => {
                    tracing::warn!(dir = %dir.display(), error = %err, "cleaning up after a failed publish");
                    break;
                }
            }
        }
    }
}

/// Makes sure `target` is a directory, creating it and missing parents. Refuses a target that
/// exists as anything but a real directory (a link to a directory included). The first publish's
/// common case, a missing target below an existing parent, is [`create_missing_target`]'s; this
/// looks at the target and its parents first.
pub(crate) fn create_target(target: &Path) -> Result<Created, VolumeError> {
    let mut missing = Vec::new();
    let mut current = target;
    loop {
        // The target itself must not be a link; links among the parents are the node's business.
        let meta = if current == target {
            fs::symlink_metadata(current)
        } else {
            fs::metadata(current)
        };
        match meta {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(not_a_directory(current)),
            Err(err) if err.kind() == ErrorKind::NotFound => {
                missing.push(current);
                match current.parent() {
                    Some(parent) => current = parent,
                    None => break,
                }
            }
            Err(source) => return Err(io("inspecting", current, source)),
        }
    }
    missing.reverse();
    let created = make_dirs(&missing, target)?;
    refuse_link(created, target)
}

/// Creates a missing `target` below an existing parent with one `mkdir` and nothing else: the
/// first publish's case, as kubelet hands over a missing target below a directory it made. The
/// `mkdir` both tells that the target was absent and makes it, where a look first would cost a
/// `statx` more. `None`, touching nothing, when `mkdir` fails for any reason (the target exists,
/// its parent is missing, ...): the caller then looks at the target, where the reason is judged.
pub(crate) fn create_missing_target(target: &Path) -> Result<Option<Created>, VolumeError> {
    match DirBuilder::new().mode(TARGET_MODE).create(target) {
        Ok(()) => {
            let created = Created {
                dirs: vec![target.to_path_buf()],
            };
            settle_made(created, target, TARGET_MODE, target).map(Some)
        }
        Err(_) => Ok(None),
    }
}

/// Creates `missing` (outermost first), the target with [`TARGET_MODE`] and parents with
/// [`PARENT_MODE`]. On failure removes what it made and returns the error.
fn make_dirs(missing: &[&Path], target: &Path) -> Result<Created, VolumeError> {
    let mut created = Created::default();
    for &dir in missing {
        let mode = if dir == target {
            TARGET_MODE
        } else {
            PARENT_MODE
        };
        match DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => {
                created.dirs.push(dir.to_path_buf());
                created = settle_made(created, dir, mode, target)?;
            }
            // Someone else made it between our check and now: not ours to remove later.
            Err(err) if err.kind() == ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(err) if err.kind() == ErrorKind::AlreadyExists && dir == target => {
                created.remove(target);
                return Err(not_a_directory(target));
            }
            Err(source) => {
                created.remove(target);
                return Err(io("creating directory", dir, source));
            }
        }
    }
    Ok(created)
}

/// Gives `dir`, just made, its exact mode regardless of the process umask. On failure removes
/// what `created` holds (`dir` included) and fails.
fn settle_made(
    created: Created,
    dir: &Path,
    mode: u32,
    target: &Path,
) -> Result<Created, VolumeError> {
    match super::modes::settle(dir, mode) {
        Ok(()) => Ok(created),
        Err(source) => {
            created.remove(target);
            Err(io("setting mode of", dir, source))
        }
    }
}

/// Refuses (and removes what was created) when `target` turned out to be a link: a directory
/// `mkdir` found already there is judged here. A target this call made is a directory: `mkdir`
/// never makes a link, so it is not looked at again.
fn refuse_link(created: Created, target: &Path) -> Result<Created, VolumeError> {
    if created.dirs.last().is_some_and(|made| made == target) {
        return Ok(created);
    }
    if fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink()) {
        created.remove(target);
        return Err(not_a_directory(target));
    }
    Ok(created)
}

/// How many names of a directory's content an error message lists.
const LISTED_NAMES: usize = 3;

/// Fails with [`VolumeError::NotEmpty`] unless the directory `target` is empty.
pub(crate) fn require_empty(target: &Path) -> Result<(), VolumeError> {
    match describe_content(target)? {
        None => Ok(()),
        Some(entries) => Err(VolumeError::NotEmpty {
            target: target.to_path_buf(),
            entries,
        }),
    }
}

/// Removes the directory `target` if it is empty; leaves it, with everything in it, when it is
/// not ([`VolumeError::LeftInPlace`]). Succeeds when `target` does not exist.
pub(crate) fn remove_empty(target: &Path) -> Result<(), VolumeError> {
    match fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
        Err(err) if err.kind() == ErrorKind::DirectoryNotEmpty => Err(VolumeError::LeftInPlace {
            target: target.to_path_buf(),
            entries: describe_content(target)?.unwrap_or_else(|| "emptied meanwhile".into()),
        }),
        Err(source) => Err(io("removing directory", target, source)),
    }
}

/// `None` for an empty directory, else "N entries: "a", "b", ..." (names only, escaped).
fn describe_content(dir: &Path) -> Result<Option<String>, VolumeError> {
    let mut names = Vec::new();
    let mut count = 0usize;
    for entry in fs::read_dir(dir).map_err(|source| io("listing", dir, source))? {
        let entry = entry.map_err(|source| io("listing", dir, source))?;
        count += 1;
        if names.len() < LISTED_NAMES {
            let name = entry.file_name();
            let name = crate::telemetry::escape::printable(&name.to_string_lossy(), 64);
            names.push(format!("\"{name}\""));
        }
    }
    if count == 0 {
        return Ok(None);
    }
    let more = if count > names.len() { ", ..." } else { "" };
    let noun = if count == 1 { "entry" } else { "entries" };
    Ok(Some(format!("{count} {noun}: {}{more}", names.join(", "))))
}

/// Removes `path` and everything below it without following links and without crossing into a
/// different filesystem: a directory on another device is refused with `NotOurMount`.
/// Succeeds when `path` does not exist.
pub(crate) fn remove_tree(path: &Path) -> Result<(), VolumeError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(io("inspecting", path, source)),
    };
    if !meta.is_dir() {
        return fs::remove_file(path).map_err(|source| io("removing", path, source));
    }
    empty_dir(path, meta.dev())?;
    fs::remove_dir(path).map_err(|source| io("removing directory", path, source))
}

fn empty_dir(dir: &Path, device: u64) -> Result<(), VolumeError> {
    let entries = fs::read_dir(dir).map_err(|source| io("listing", dir, source))?;
    for entry in entries {
        let entry = entry.map_err(|source| io("listing", dir, source))?;
        let path = entry.path();
        // symlink_metadata (not DirEntry::file_type alone) because we need the device number.
        let meta = fs::symlink_metadata(&path).map_err(|source| io("inspecting", &path, source))?;
        if meta.is_dir() {
            if meta.dev() != device {
                return Err(VolumeError::NotOurMount {
                    target: path,
                    fstype: "unknown".into(),
                    mount_source: "another filesystem".into(),
                });
            }
            empty_dir(&path, device)?;
            fs::remove_dir(&path).map_err(|source| io("removing directory", &path, source))?;
        } else {
            fs::remove_file(&path).map_err(|source| io("removing", &path, source))?;
        }
    }
    Ok(())
}

fn not_a_directory(path: &Path) -> VolumeError {
    VolumeError::NotADirectory {
        target: path.to_path_buf(),
    }
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> VolumeError {
    VolumeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::volume::test_support::{MountGuard, require_root};

    #[test]
    fn creates_missing_parents_and_removes_only_those() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("a/b/mount");
        let created = create_target(&target).unwrap();
        assert_eq!(created.dirs.len(), 3);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&target), 0o755);
        assert_eq!(mode(&base.path().join("a")), 0o750);
        fs::write(target.join("f"), b"x").unwrap();
        created.remove(&target);
        assert!(!base.path().join("a").exists());
        assert!(base.path().exists());
    }

    #[test]
    fn cleanup_stops_at_a_parent_someone_else_filled() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("a/mount");
        let created = create_target(&target).unwrap();
        fs::write(base.path().join("a/other"), b"x").unwrap();
        created.remove(&target);
        assert!(!target.exists());
        assert!(base.path().join("a/other").exists());
    }

    #[test]
    fn existing_target_is_not_ours() {
        let base = tempfile::tempdir().unwrap();
        let created = create_target(base.path()).unwrap();
        assert!(created.dirs.is_empty());
        created.remove(base.path());
        assert!(base.path().exists());
    }

    #[test]
    fn refuses_links_and_files_as_target() {
        let base = tempfile::tempdir().unwrap();
        let real = base.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = base.path().join("link");
        symlink(&real, &link).unwrap();
        assert!(matches!(
            create_target(&link),
            Err(VolumeError::NotADirectory { .. })
        ));
        let file = base.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(matches!(
            create_target(&file),
            Err(VolumeError::NotADirectory { .. })
        ));
        assert!(matches!(
            create_target(&file.join("below")),
            Err(VolumeError::Io { .. })
        ));
    }

    #[test]
    fn a_target_is_made_with_its_exact_mode_and_what_is_there_is_judged() {
        let base = tempfile::tempdir().unwrap();
        // kubelet made the parent: the target gets the exact mode.
        let target = base.path().join("mount");
        let created = create_target(&target).unwrap();
        assert_eq!(created.dirs, std::slice::from_ref(&target));
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        created.remove(&target);
        assert!(!target.exists() && base.path().exists());

        // A missing parent is made too (and removed again).
        let target = base.path().join("a/mount");
        let created = create_target(&target).unwrap();
        assert_eq!(created.dirs.len(), 2);
        assert!(target.is_dir());
        created.remove(&target);
        assert!(!base.path().join("a").exists());

        // What is already there: a file or a link is refused, a directory used (not ours).
        let file = base.path().join("file");
        fs::write(&file, b"x").unwrap();
        let real = base.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = base.path().join("link");
        symlink(&real, &link).unwrap();
        for appeared in [&file, &link] {
            assert!(matches!(
                create_target(appeared),
                Err(VolumeError::NotADirectory { .. })
            ));
        }
        assert!(file.is_file() && link.is_symlink() && real.is_dir());
        let created = create_target(&real).unwrap();
        assert!(created.dirs.is_empty());
    }

    #[test]
    fn a_missing_target_is_made_with_one_mkdir_and_anything_else_is_left_alone() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("mount");
        let created = create_missing_target(&target).unwrap().expect("made");
        assert_eq!(created.dirs, std::slice::from_ref(&target));
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        created.remove(&target);
        assert!(!target.exists());

        // Whatever is there, or a missing parent, is for the caller's look to judge.
        let file = base.path().join("file");
        fs::write(&file, b"kept").unwrap();
        let real = base.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::write(real.join("content"), b"kept too").unwrap();
        let link = base.path().join("link");
        symlink(&real, &link).unwrap();
        let dangling = base.path().join("dangling");
        symlink(base.path().join("nowhere"), &dangling).unwrap();
        let orphan = base.path().join("no/parent");
        for target in [&file, &real, &link, &dangling, &orphan] {
            assert!(
                create_missing_target(target).unwrap().is_none(),
                "{target:?}"
            );
        }
        assert_eq!(fs::read(&file).unwrap(), b"kept");
        assert_eq!(fs::read(real.join("content")).unwrap(), b"kept too");
        assert_eq!(fs::read_link(&link).unwrap(), real);
        assert!(dangling.is_symlink() && !base.path().join("nowhere").exists());
        assert!(!base.path().join("no").exists());
    }

    #[test]
    fn remove_tree_does_not_follow_links() {
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"x").unwrap();
        let tree = base.path().join("tree");
        fs::create_dir_all(tree.join("sub")).unwrap();
        symlink(&outside, tree.join("sub/link")).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert!(outside.join("keep").exists());
        remove_tree(&tree).unwrap();
    }

    #[test]
    fn remove_tree_refuses_to_cross_into_another_filesystem() {
        require_root();
        let base = tempfile::tempdir().unwrap();
        let tree = base.path().canonicalize().unwrap().join("tree");
        let inner = tree.join("inner");
        fs::create_dir_all(&inner).unwrap();
        nix::mount::mount(
            Some("other"),
            &inner,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        let _guard = MountGuard::new(&inner);
        fs::write(inner.join("precious"), b"x").unwrap();
        match remove_tree(&tree) {
            Err(VolumeError::NotOurMount { target, .. }) => assert_eq!(target, inner),
            other => panic!("{other:?}"),
        }
        assert!(inner.join("precious").exists());
    }
}
