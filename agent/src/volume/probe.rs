//! What is at a target path, told with one `statx(2)` instead of reading `/proc/self/mountinfo`.
//!
//! mountinfo grows with every mount on the node, and a node with a thousand volumes paid for
//! reading and scanning it several times per publish and unpublish. `statx` says whether a path
//! is a directory, whether it is the root of a mount (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8) and
//! which mount it is on (`STATX_MNT_ID`, the id mountinfo prints). [`OurMounts`] remembers the
//! mount ids of the tmpfs mounts Latchkey made, so the common questions ("is this our volume?",
//! "is this a plain directory?") are answered without mountinfo. Whenever `statx` cannot tell
//! (an older kernel, a mount root we did not record, e.g. after a restart), the caller falls
//! back to mountinfo, which stays the authority.
//!
//! Not for deciding what to do with a target (that is `Volumes`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use rustix::fs::{AtFlags, CWD, FileType, StatxAttributes, StatxFlags};

use super::error::VolumeError;

/// Identifies one mount while it is mounted: the mount id and the device of its filesystem.
/// Mount ids are reused after an unmount; pairing the id with the device makes it unlikely that a
/// later mount at the same path is taken for ours (only root on the node could arrange that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MountKey {
    id: u64,
    device: (u32, u32),
}

/// What `statx` saw at a target path (without following a link at the path itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing there.
    Absent,
    /// A file, a link or anything else that is not a directory.
    NotADirectory,
    /// A directory.
    Directory {
        /// Whether it is the root of a mount; `None` when the kernel cannot say.
        mount_root: Option<bool>,
        /// The mount it is on; `None` when the kernel cannot say.
        mount: Option<MountKey>,
    },
}

/// Looks at `target` with one `statx` call.
pub(crate) fn look(target: &Path) -> Result<Seen, VolumeError> {
    let stat = match rustix::fs::statx(
        CWD,
        target,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::MNT_ID,
    ) {
        Ok(stat) => stat,
        Err(errno) => {
            let err = std::io::Error::from(errno);
            if err.kind() == ErrorKind::NotFound {
                return Ok(Seen::Absent);
            }
            return Err(VolumeError::Io {
                op: "inspecting",
                path: target.to_path_buf(),
                source: err,
            });
        }
    };
    if FileType::from_raw_mode(stat.stx_mode.into()) != FileType::Directory {
        return Ok(Seen::NotADirectory);
    }
    let mount_root = stat
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
        .then(|| stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
    let mount = (stat.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(MountKey {
        id: stat.stx_mnt_id,
        device: (stat.stx_dev_major, stat.stx_dev_minor),
    });
    Ok(Seen::Directory { mount_root, mount })
}

/// The mounts Latchkey made and still holds, by target path. Entries are added when a tmpfs is
/// mounted (or recognised in mountinfo) and removed when it is unmounted, so the map never holds
/// more entries than there are volumes plus those unmounted behind our back.
#[derive(Debug, Default)]
pub(crate) struct OurMounts {
    /// By the target path's bytes (see `publish::locks`): cheaper to hash than a `Path`.
    by_target: Mutex<HashMap<OsString, MountKey>>,
}

impl OurMounts {
    /// Remembers that the mount `key` at `target` is ours.
    pub(crate) fn record(&self, target: &Path, key: MountKey) {
        self.map().insert(target.as_os_str().to_owned(), key);
    }

    /// Forgets `target`.
    pub(crate) fn forget(&self, target: &Path) {
        let mut map = self.map();
        map.remove(target.as_os_str());
        crate::memory::shrink_emptied(&mut map);
    }

    /// True when `key` is the mount recorded for `target`.
    pub(crate) fn holds(&self, target: &Path, key: MountKey) -> bool {
        self.map().get(target.as_os_str()) == Some(&key)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<OsString, MountKey>> {
        // A panic while holding this lock cannot leave the map half-updated (every operation is
        // a single insert, remove or get), so a poisoned lock is still safe to use.
        self.by_target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::test_support::{MountGuard, require_root};

    #[test]
    fn tells_absent_files_links_and_directories_apart() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        assert_eq!(look(&base.join("missing")).unwrap(), Seen::Absent);
        std::fs::write(base.join("file"), b"x").unwrap();
        assert_eq!(look(&base.join("file")).unwrap(), Seen::NotADirectory);
        std::os::unix::fs::symlink(base, base.join("link")).unwrap();
        assert_eq!(look(&base.join("link")).unwrap(), Seen::NotADirectory);
        match look(base).unwrap() {
            Seen::Directory { mount_root, .. } => assert_ne!(mount_root, Some(true)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_mount_root_has_its_own_mount_id() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap().join("t");
        std::fs::create_dir(&target).unwrap();
        let Seen::Directory { mount: before, .. } = look(&target).unwrap() else {
            panic!("not a directory")
        };
        nix::mount::mount(
            Some("probe-test"),
            &target,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        let _guard = MountGuard::new(&target);
        let Seen::Directory { mount_root, mount } = look(&target).unwrap() else {
            panic!("not a directory")
        };
        assert_eq!(mount_root, Some(true));
        assert!(mount.is_some() && mount != before);

        let ours = OurMounts::default();
        assert!(!ours.holds(&target, mount.unwrap()));
        ours.record(&target, mount.unwrap());
        assert!(ours.holds(&target, mount.unwrap()));
        assert!(!ours.holds(&target, before.unwrap()));
        ours.forget(&target);
        assert!(!ours.holds(&target, mount.unwrap()));
    }
}
