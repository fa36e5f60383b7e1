//! Helpers shared by the volume tests: a root check with a clear message and a guard that
//! unmounts in `Drop`, so a failing test never leaves a mount behind.
//!
//! Not compiled outside tests.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

use super::target;
use super::{FilePath, VolumeError, VolumeFile, Volumes, mountinfo, payload};
use crate::secret::SecretBytes;

/// Panics with an explanation unless the tests run as root (they mount real tmpfs).
pub(crate) fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "volume tests mount tmpfs: run them as root, or under \
         `unshare --user --map-root-user --mount`"
    );
}

/// Unmounts everything mounted at a path when dropped, even while a test is panicking.
pub(crate) struct MountGuard {
    path: PathBuf,
}

impl MountGuard {
    /// Guards the mount point `path`.
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: mountinfo::resolved(path),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        // Bounded: a path can have several mounts stacked on it, but not forever.
        for _ in 0..8 {
            match mountinfo::find(&self.path) {
                Ok(Some(_)) => {
                    if umount2(&self.path, MntFlags::MNT_DETACH).is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
    }
}

/// A file with the default mode.
pub(crate) fn file(path: &str, contents: &str) -> VolumeFile {
    VolumeFile::new(FilePath::parse(path).unwrap(), SecretBytes::from(contents))
}

/// A file with an explicit mode.
pub(crate) fn file_with_mode(path: &str, contents: &str, mode: u32) -> VolumeFile {
    VolumeFile {
        mode,
        ..file(path, contents)
    }
}

/// The refresh half of [`Volumes::publish_or_update`], so a test can say it expects one.
impl Volumes {
    /// A refresh only: refuses a target that holds no volume ([`VolumeError::NotPublished`]),
    /// else swaps `files` in when they differ and returns whether it did.
    pub(crate) fn update(
        &self,
        namespace: &str,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<bool, VolumeError> {
        target::check(target)?;
        let payload = payload::check(files, self.config.size_limit)?;
        if !self.is_published(target)? {
            return Err(VolumeError::NotPublished {
                target: target.to_path_buf(),
            });
        }
        self.refresh(namespace, target, &payload, group)
    }
}
