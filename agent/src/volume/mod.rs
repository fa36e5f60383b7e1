//! Volumes: the place where resolved secrets become files. [`Volumes`] mounts a fresh tmpfs
//! (`nosuid,nodev,noexec`, size-limited, source `latchkey`) at a CSI target path, writes the files
//! into it atomically the way kubelet does for Secret volumes (`..data` link swap), refreshes them
//! in place, and unmounts and removes them again. This module is the only code in Latchkey that
//! calls mount(2), and it never writes outside the target path.
//!
//! Not for deciding *what* goes into a volume or *when* to refresh it (the publish
//! orchestration does that), and not for CSI types: errors carry an [`ErrorClass`] and the CSI
//! edge maps it to a gRPC code. Every function blocks; async callers use `spawn_blocking`.
//! Operations on one target must be serialised by the caller; different targets are independent.

mod dirs;
mod error;
pub mod mountinfo;
pub mod path;
mod tmpfs;
mod writer;

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

pub use error::{ErrorClass, VolumeError};
pub use path::FilePath;
pub use tmpfs::SOURCE as MOUNT_SOURCE;
pub use writer::{DEFAULT_FILE_MODE, VolumeFile};

use writer::AtomicWriter;

/// How many of our tmpfs mounts stacked on one target `unpublish` will peel off before giving up.
const MAX_STACKED_MOUNTS: usize = 8;

/// Where and how big volumes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeConfig {
    /// What backs a volume.
    pub backend: Backend,
    /// Most bytes one volume's payload may use, counted in filesystem pages.
    pub size_limit: u64,
}

/// What backs a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh tmpfs per volume: secrets stay in memory. The production backend; needs root.
    Tmpfs,
    /// A plain directory and no mount at all, for the non-root demo only: files land on whatever
    /// filesystem holds the target.
    PlainDirectory,
}

/// Publishes, refreshes and removes volumes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Volumes {
    config: VolumeConfig,
    /// Size passed to tmpfs; derived from the limit, overridable in tests to provoke ENOSPC.
    tmpfs_size: u64,
}

impl Volumes {
    /// Volumes with the given configuration.
    pub fn new(config: VolumeConfig) -> Self {
        Self {
            config,
            tmpfs_size: tmpfs::tmpfs_size(config.size_limit),
        }
    }

    /// The configuration this was created with.
    pub fn config(&self) -> VolumeConfig {
        self.config
    }

    /// True when `target` is a mount point of a Latchkey tmpfs (Tmpfs backend), or an existing
    /// directory containing our `..data` link (PlainDirectory backend).
    pub fn is_published(&self, target: &Path) -> Result<bool, VolumeError> {
        dirs::check_target(target)?;
        match fs::symlink_metadata(target) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(VolumeError::Io {
                    op: "inspecting",
                    path: target.to_path_buf(),
                    source,
                });
            }
        }
        match self.config.backend {
            Backend::Tmpfs => Ok(mountinfo::find(&dirs::resolved(target))?
                .is_some_and(|entry| tmpfs::is_ours(&entry))),
            Backend::PlainDirectory => Ok(has_data_link(target)),
        }
    }

    /// First publish: creates `target` if needed, mounts a fresh tmpfs there and writes `files`
    /// atomically. With a `group` (the pod's fsGroup) the root is 0750 and everything is
    /// group-owned by it. On any failure nothing is left behind: no mount, no files, and no
    /// directories that this call created.
    pub fn publish(
        &self,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<(), VolumeError> {
        dirs::check_target(target)?;
        // Everything that can be rejected without touching the disk is rejected first.
        let payload = writer::check(files, self.config.size_limit)?;
        self.refuse_existing_mount(target)?;
        let created = dirs::create_target(target)?;

        let mounted = match self.config.backend {
            Backend::Tmpfs => {
                if let Err(err) = tmpfs::mount(target, self.tmpfs_size, group) {
                    created.remove(target);
                    return Err(err);
                }
                true
            }
            Backend::PlainDirectory => false,
        };
        // Should writing panic (a bug), the unwinding still unmounts: no mount is ever left
        // behind by a failed first publish.
        let on_panic = UnmountOnPanic { target, mounted };
        let written = match self.config.backend {
            // tmpfs applied the root's group and mode at mount time.
            Backend::Tmpfs => Ok(()),
            Backend::PlainDirectory => dirs::set_root_group(target, group),
        }
        .and_then(|()| AtomicWriter::new(target, group).write(&payload));
        drop(on_panic);
        match written {
            Ok(_) => Ok(()),
            Err(err) => {
                // The writer has already removed its own partial work; what is left is ours.
                if mounted && let Err(unmount) = tmpfs::unmount(target) {
                    tracing::error!(target = %target.display(), error = %unmount,
                        "cannot unmount after a failed publish; the tmpfs stays mounted");
                    return Err(err);
                }
                created.remove(target);
                Err(err)
            }
        }
    }

    /// Later publish of an already-published target: swaps in `files` only if they differ from
    /// what is there (paths, bytes, modes and group); returns whether it wrote. On failure the
    /// old content stays fully intact.
    pub fn update(
        &self,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<bool, VolumeError> {
        dirs::check_target(target)?;
        let payload = writer::check(files, self.config.size_limit)?;
        // Without this check an update after an unexpected unmount would write secrets onto
        // the node's disk, below the now empty mount point.
        if !self.is_published(target)? {
            return Err(VolumeError::NotPublished {
                target: target.to_path_buf(),
            });
        }
        AtomicWriter::new(target, group).write(&payload)
    }

    /// Unmounts our tmpfs (if mounted) and removes the target directory. Succeeds when the target
    /// does not exist. Refuses, touching nothing, when the target or anything below it is a
    /// mount that Latchkey did not create.
    pub fn unpublish(&self, target: &Path) -> Result<(), VolumeError> {
        dirs::check_target(target)?;
        match fs::symlink_metadata(target) {
            Ok(meta) if meta.is_dir() => {}
            // A file or a link where a volume was: remove the entry itself, never its target.
            Ok(_) => return dirs::remove_tree(target),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(VolumeError::Io {
                    op: "inspecting",
                    path: target.to_path_buf(),
                    source,
                });
            }
        }
        let point = dirs::resolved(target);
        // A mount below the target would be detached with ours, or deleted into: refuse.
        if let Some(inner) = mountinfo::below(&point)?.into_iter().next() {
            return Err(not_ours(inner));
        }
        for _ in 0..MAX_STACKED_MOUNTS {
            match mountinfo::find(&point)? {
                None => return dirs::remove_tree(target),
                Some(entry) if tmpfs::is_ours(&entry) => tmpfs::unmount(target)?,
                Some(entry) => return Err(not_ours(entry)),
            }
        }
        Err(VolumeError::Unmount {
            target: target.to_path_buf(),
            source: nix::errno::Errno::EBUSY,
        })
    }

    /// Fails when `target` already is a mount point or a published plain directory.
    fn refuse_existing_mount(&self, target: &Path) -> Result<(), VolumeError> {
        if !target.is_dir() {
            return Ok(());
        }
        if let Some(entry) = mountinfo::find(&dirs::resolved(target))? {
            return Err(if tmpfs::is_ours(&entry) {
                VolumeError::AlreadyPublished {
                    target: target.to_path_buf(),
                }
            } else {
                not_ours(entry)
            });
        }
        if self.config.backend == Backend::PlainDirectory && has_data_link(target) {
            return Err(VolumeError::AlreadyPublished {
                target: target.to_path_buf(),
            });
        }
        Ok(())
    }

    /// Test hook: use a tmpfs of `bytes` regardless of the size limit, to provoke ENOSPC.
    #[cfg(test)]
    fn with_tmpfs_size(mut self, bytes: u64) -> Self {
        self.tmpfs_size = bytes;
        self
    }
}

fn has_data_link(target: &Path) -> bool {
    fs::symlink_metadata(target.join("..data")).is_ok_and(|m| m.file_type().is_symlink())
}

fn not_ours(entry: mountinfo::MountEntry) -> VolumeError {
    VolumeError::NotOurMount {
        target: entry.mount_point,
        fstype: entry.fstype,
        mount_source: entry.source,
    }
}

/// Unmounts a just-mounted target when dropped during a panic.
struct UnmountOnPanic<'a> {
    target: &'a Path,
    mounted: bool,
}

impl Drop for UnmountOnPanic<'_> {
    fn drop(&mut self) {
        if self.mounted && std::thread::panicking() {
            let _ = tmpfs::unmount(self.target);
        }
    }
}
