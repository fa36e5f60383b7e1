//! Helpers shared by the volume tests: a root check with a clear message and a guard that
//! unmounts in `Drop`, so a failing test never leaves a mount behind.
//!
//! Not compiled outside tests.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, umount2};

use super::{FilePath, VolumeFile, dirs, mountinfo};
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
            path: dirs::resolved(path),
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
