//! Mounting a fresh volume on a prepared target, filling it and recording it: the steps of a
//! first publish after `target` has made an empty directory. [`Fresh`] holds what each step set
//! up (the directories the publish created, the memory set aside, the mount) and takes all of it
//! back when dropped before [`Fresh::record`]: a first publish that fails, or panics (a bug),
//! leaves no mount, no files and no directory it created behind. Also unmounting our tmpfs again.
//!
//! Not for deciding whether to mount (see `target`) nor for the mount(2) calls themselves (see
//! `tmpfs`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::budget::Reservation;
use super::dirs::Created;
use super::error::VolumeError;
use super::payload::Payload;
use super::probe::{self, Seen};
use super::target::not_ours;
use super::tmpfs::INODE_BYTES;
use super::writer::AtomicWriter;
use super::{Backend, Volumes, mountinfo, tmpfs};

/// A fresh volume between its mount and its record; undone when dropped before the record.
pub(super) struct Fresh<'a> {
    volumes: &'a Volumes,
    target: &'a Path,
    group: Option<u32>,
    /// What the publish created to mount on; `None` once there is nothing left to undo.
    created: Option<Created>,
    /// The memory set aside for the volume until it is measured.
    reserved: Option<Reservation<'a>>,
    /// Whether a tmpfs is mounted at `target` that the undo must unmount.
    mounted: bool,
}

impl<'a> Fresh<'a> {
    /// Mounts a fresh volume for `payload` of a pod in `namespace` on the empty directory
    /// `target`, of which the publish `created` what it lists: sets the volume's memory aside
    /// in the budget, then mounts the tmpfs (root 0755, or 0750 owned by `group`, the pod's
    /// fsGroup). Refused by the budget before anything is mounted.
    pub(super) fn mount(
        volumes: &'a Volumes,
        namespace: &str,
        target: &'a Path,
        payload: &Payload<'_>,
        group: Option<u32>,
        created: Created,
    ) -> Result<Self, VolumeError> {
        let mut fresh = Fresh {
            volumes,
            target,
            group,
            created: Some(created),
            reserved: None,
            mounted: false,
        };
        // The root directory is the one inode beyond the payload's own.
        let reserved = volumes
            .budget
            .reserve(namespace, payload.charge() + INODE_BYTES)?;
        fresh.reserved = Some(reserved);
        match volumes.config.backend {
            Backend::Tmpfs => {
                let source =
                    tmpfs::source(namespace).ok_or_else(|| VolumeError::InvalidTarget {
                        target: target.to_path_buf(),
                        reason: "the pod's namespace is not an RFC 1123 label",
                    })?;
                tmpfs::mount(target, &source, volumes.tmpfs_size, group)?;
                fresh.mounted = true;
                volumes.remember_mount(target);
            }
            // tmpfs applies the root's group and mode at mount time; a directory gets them here.
            Backend::PlainDirectory => set_root_group(target, group)?,
        }
        Ok(fresh)
    }

    /// Writes `payload` into the empty volume root (nobody reads it yet, so no swap is needed).
    pub(super) fn fill(&self, payload: &Payload<'_>) -> Result<(), VolumeError> {
        AtomicWriter::new(self.target, self.group).write_fresh(payload)
    }

    /// The volume is complete: what it holds, measured, replaces the memory set aside, and
    /// nothing is undone any more.
    pub(super) fn record(mut self, payload: &Payload<'_>) {
        if let Some(reserved) = self.reserved.take() {
            reserved.commit(self.target, self.volumes.measure(self.target, payload));
        }
        self.created = None;
        self.mounted = false;
    }
}

impl Drop for Fresh<'_> {
    /// Undoes a first publish that did not reach its record. The writer has already removed its
    /// own partial work; the reservation goes back when its field is dropped.
    fn drop(&mut self) {
        if self.mounted {
            if let Err(unmount) = tmpfs::unmount_fresh(self.target) {
                tracing::error!(target = %self.target.display(), error = %unmount,
                    "cannot unmount after a failed publish; the tmpfs stays mounted");
                // The created directories stay too: they hold the mount.
                return;
            }
            self.volumes.ours.forget(self.target);
        }
        if let Some(created) = self.created.take() {
            created.remove(self.target);
        }
    }
}

impl Volumes {
    /// Records the mount just made at `target` as ours.
    fn remember_mount(&self, target: &Path) {
        if let Ok(Seen::Directory {
            mount: Some(key), ..
        }) = probe::look(target)
        {
            self.ours.record(target, key);
        }
    }

    /// Unmounts our tmpfs at `target`. A busy one is detached lazily, unless the reason it is
    /// busy is a mount below it: a detach would take that foreign mount with it.
    pub(super) fn unmount_ours(&self, target: &Path) -> Result<(), VolumeError> {
        match tmpfs::unmount(target) {
            Err(VolumeError::Unmount {
                source: nix::errno::Errno::EBUSY,
                ..
            }) => {
                if let Some(inner) = mountinfo::below(&mountinfo::resolved(target))?
                    .into_iter()
                    .next()
                {
                    return Err(not_ours(inner));
                }
                tmpfs::detach(target)
            }
            other => other,
        }
    }
}

/// Gives a plain-directory volume root the ownership tmpfs would get from its mount options:
/// group `group` and mode 0750. Without a group the root keeps the mode it was created with.
fn set_root_group(target: &Path, group: Option<u32>) -> Result<(), VolumeError> {
    let Some(gid) = group else {
        return Ok(());
    };
    let io = |op, source| VolumeError::Io {
        op,
        path: target.to_path_buf(),
        source,
    };
    nix::unistd::chown(target, None, Some(nix::unistd::Gid::from_raw(gid)))
        .map_err(|e| io("setting the group of", e.into()))?;
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o750))
        .map_err(|e| io("setting the mode of", e))
}
