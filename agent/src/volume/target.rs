//! The target path: whether it is acceptable at all, what it holds now, and getting it ready for
//! a publish. Preparing the target is the first step of a publish that touches the disk: it ends
//! with the volume already there (to refresh) or an empty directory to mount on, and it is the
//! one place a publish creates directories (`dirs`) or reads mountinfo.
//!
//! Not for mounting, writing or removing (see `mount`, `writer` and `Volumes::unpublish`).

use std::fs;
use std::path::{Component, Path};

use super::dirs::{self, Created};
use super::error::VolumeError;
use super::mountinfo::{self, MountEntry};
use super::probe::{self, Seen};
use super::{Backend, Volumes, tmpfs};

/// What a target path holds, as far as volumes are concerned.
#[derive(Debug)]
pub(super) enum Found {
    /// Nothing.
    Absent,
    /// Something that is not a directory (a file or a link).
    NotADirectory,
    /// A directory that is not a mount point.
    Directory,
    /// One of our tmpfs mounts (possibly stacked on more of ours).
    OurMount,
    /// Somebody else's mount.
    ForeignMount(MountEntry),
}

/// What [`Volumes::prepare`] made of a target.
#[derive(Debug)]
pub(super) enum Prepared {
    /// It holds one of our volumes: the publish is a refresh.
    Volume,
    /// It is an empty directory to mount a fresh volume on; this call created what `Created`
    /// lists (removed again if the publish fails).
    Empty(Created),
    /// It holds no volume and a fresh one cannot go there, for this reason.
    Refused(VolumeError),
}

/// Checks that `target` is an absolute path naming a directory entry (no `.`/`..`, not `/`).
pub(super) fn check(target: &Path) -> Result<(), VolumeError> {
    let reason = if !target.is_absolute() {
        Some("it must be absolute")
    } else if target
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        Some("it must not contain '.' or '..'")
    } else if target.file_name().is_none() {
        Some("it must not be the root directory")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(VolumeError::InvalidTarget {
            target: target.to_path_buf(),
            reason,
        }),
        None => Ok(()),
    }
}

impl Volumes {
    /// Gets the checked `target` ready for a publish. Fails only when the target cannot be
    /// looked at; a target that cannot take a fresh volume is [`Prepared::Refused`], so the
    /// caller reports it as a failed mount.
    pub(super) fn prepare(&self, target: &Path) -> Result<Prepared, VolumeError> {
        // kubelet's usual first publish: a missing target below a directory it made. One mkdir
        // both tells that and makes it, where a look first would cost a `statx` more.
        if let Some(created) = dirs::create_missing_target(target)? {
            return Ok(Prepared::Empty(created));
        }
        let empty = |made: Result<Created, VolumeError>| match made {
            Ok(created) => Prepared::Empty(created),
            Err(error) => Prepared::Refused(error),
        };
        Ok(match self.look(target)? {
            Found::OurMount => Prepared::Volume,
            Found::Directory if self.has_plain_volume(target) => Prepared::Volume,
            // The one mkdir above failed (most likely no parent): parents are made too.
            Found::Absent => empty(dirs::create_target(target)),
            Found::NotADirectory => Prepared::Refused(not_a_directory(target)),
            Found::ForeignMount(entry) => Prepared::Refused(not_ours(entry)),
            // Somebody else's (kubelet's) directory: never ours to remove on failure. Mounting
            // over content would hide it.
            Found::Directory => empty(dirs::require_empty(target).map(|()| Created::default())),
        })
    }

    /// Whether what [`Self::look`] found at `target` is a published volume.
    pub(super) fn holds_volume(&self, target: &Path, found: &Found) -> bool {
        match found {
            Found::OurMount => true,
            Found::Directory => self.has_plain_volume(target),
            Found::Absent | Found::NotADirectory | Found::ForeignMount(_) => false,
        }
    }

    /// Whether the directory `target` holds a volume of the plain-directory backend (which
    /// has no mount to tell it by).
    pub(super) fn has_plain_volume(&self, target: &Path) -> bool {
        self.config.backend == Backend::PlainDirectory && has_data_link(target)
    }

    /// What `target` holds. One `statx` answers for plain directories and for mounts recorded
    /// in `OurMounts`; anything else is looked up in mountinfo.
    pub(super) fn look(&self, target: &Path) -> Result<Found, VolumeError> {
        let mount = match probe::look(target)? {
            Seen::Absent => return Ok(Found::Absent),
            Seen::NotADirectory => return Ok(Found::NotADirectory),
            Seen::Directory {
                mount_root: Some(false),
                ..
            } => return Ok(Found::Directory),
            Seen::Directory { mount, .. } => mount,
        };
        if let Some(key) = mount
            && self.ours.holds(target, key)
        {
            return Ok(Found::OurMount);
        }
        Ok(match mountinfo::find(&mountinfo::resolved(target))? {
            None => Found::Directory,
            Some(entry) if tmpfs::is_ours(&entry) => {
                // Recognised (e.g. mounted before a restart): remember it for next time.
                if let Some(key) = mount {
                    self.ours.record(target, key);
                }
                Found::OurMount
            }
            Some(entry) => Found::ForeignMount(entry),
        })
    }
}

pub(super) fn not_a_directory(target: &Path) -> VolumeError {
    VolumeError::NotADirectory {
        target: target.to_path_buf(),
    }
}

pub(super) fn not_ours(entry: MountEntry) -> VolumeError {
    VolumeError::NotOurMount {
        target: entry.mount_point,
        fstype: entry.fstype,
        mount_source: entry.source,
    }
}

fn has_data_link(target: &Path) -> bool {
    fs::symlink_metadata(target.join("..data")).is_ok_and(|m| m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_must_be_absolute_and_plain() {
        assert!(check(Path::new("/var/lib/x/mount")).is_ok());
        for bad in ["relative/x", "/a/../b", "/", "./a", ""] {
            match check(Path::new(bad)) {
                Err(VolumeError::InvalidTarget { .. }) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
