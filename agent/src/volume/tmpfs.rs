//! Mounting and unmounting the tmpfs that backs one volume: the only mount(2)/umount2(2) calls in
//! Latchkey. Every mount gets the source name [`SOURCE`] so that we can later tell our mounts from
//! anybody else's in mountinfo, and `nosuid,nodev,noexec` so a secret volume can never be used to
//! run or escalate anything.
//!
//! Not for deciding *whether* to mount or unmount (that is `Volumes`), nor for writing files.

use std::path::Path;
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

use super::error::VolumeError;
use super::mountinfo::MountEntry;

/// What one inode (file, directory or link) of a tmpfs costs in kernel memory, beyond its pages:
/// `shmem_inode_cache` and the dentry take ~0.9 KiB, and both are charged to the writer's
/// memory cgroup like the pages are. Rounded up, so many tiny files cannot slip past the budget.
pub const INODE_BYTES: u64 = 1024;

/// The mount source of every Latchkey tmpfs; how mountinfo tells us a mount is ours. A volume's
/// source is `latchkey/<namespace>` (see [`source`]); a bare `latchkey` is a volume mounted by an
/// agent older than the volume budget.
pub const SOURCE: &str = "latchkey";

/// Most bytes of a namespace name (an RFC 1123 label).
const MAX_NAMESPACE: usize = 63;

/// The mount source of a volume of a pod in `namespace`: `latchkey/<namespace>`. It is how the
/// volume budget learns, after a restart, whose volume a mount is. A tenant cannot forge it: only
/// a process with CAP_SYS_ADMIN in the node's mount namespace can mount or remount, and the pod
/// sees the volume read-only through kubelet's bind mount. Only a clean label is accepted, so
/// the source never needs escaping in mountinfo.
pub fn source(namespace: &str) -> Option<String> {
    is_namespace(namespace).then(|| format!("{SOURCE}/{namespace}"))
}

/// The namespace recorded in the source of our mount `entry`; `None` for an older agent's
/// bare `latchkey` or anything that is not ours.
pub fn namespace(entry: &MountEntry) -> Option<&str> {
    let namespace = entry.source.strip_prefix(SOURCE)?.strip_prefix('/')?;
    (entry.fstype == "tmpfs" && is_namespace(namespace)).then_some(namespace)
}

fn is_namespace(name: &str) -> bool {
    (1..=MAX_NAMESPACE).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Extra room beyond two payloads, for the `..data` and temporary links and anything the kernel
/// charges that our budget does not count.
const SLACK_PAGES: u64 = 16;

/// Fallback when sysconf cannot tell the page size.
const DEFAULT_PAGE_SIZE: u64 = 4096;

/// The unit tmpfs charges space in: the memory page size (4096 on x86_64, up to 64 KiB on some
/// arm64 kernels). Budgets are counted in it so they match what the filesystem really uses.
pub fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|size| u64::try_from(size).ok())
            .filter(|size| *size > 0)
            .unwrap_or(DEFAULT_PAGE_SIZE)
    })
}

/// `bytes` rounded up to whole pages.
pub fn round_up_to_pages(bytes: u64) -> u64 {
    bytes.div_ceil(page_size()).saturating_mul(page_size())
}

/// The tmpfs size for a volume whose payload may use `size_limit` bytes. During an atomic swap the
/// old and the new set coexist, so the filesystem must hold two payloads, plus some slack.
pub fn tmpfs_size(size_limit: u64) -> u64 {
    round_up_to_pages(size_limit.saturating_mul(2))
        .saturating_add(SLACK_PAGES.saturating_mul(page_size()))
}

/// True when `entry` is a tmpfs that Latchkey mounted.
pub fn is_ours(entry: &MountEntry) -> bool {
    entry.fstype == "tmpfs" && (entry.source == SOURCE || namespace(entry).is_some())
}

/// The memory the tmpfs mounted at `target` holds, as `statvfs` tells: pages in use plus
/// [`INODE_BYTES`] per inode in use (the kernel charges both to the writer's memory cgroup).
pub fn measure(target: &Path) -> Result<u64, VolumeError> {
    let stat = nix::sys::statvfs::statvfs(target).map_err(|source| VolumeError::Io {
        op: "measuring",
        path: target.to_path_buf(),
        source: source.into(),
    })?;
    let pages =
        (stat.blocks().saturating_sub(stat.blocks_free())).saturating_mul(stat.fragment_size());
    let inodes = stat.files().saturating_sub(stat.files_free());
    Ok(pages.saturating_add(inodes.saturating_mul(INODE_BYTES)))
}

/// The size a tmpfs `entry` was mounted with, in bytes (mountinfo prints `size=8200k`).
pub fn size(entry: &MountEntry) -> Option<u64> {
    let kib: u64 = entry
        .super_option("size")?
        .strip_suffix('k')?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Mounts a fresh tmpfs of `size_bytes` at the existing directory `target` with the mount
/// `source` (see [`source`]): root mode 0755, or 0750 owned by `group` (the pod's fsGroup) so
/// only the pod's processes can enter it.
pub fn mount(
    target: &Path,
    source: &str,
    size_bytes: u64,
    group: Option<u32>,
) -> Result<(), VolumeError> {
    let data = match group {
        Some(gid) => format!("size={size_bytes},mode=0750,gid={gid}"),
        None => format!("size={size_bytes},mode=0755"),
    };
    nix::mount::mount(
        Some(source),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|source| VolumeError::Mount {
        target: target.to_path_buf(),
        source,
    })
}

/// Unmounts whatever is mounted on top at `target`. Fails with `EBUSY` while a process still
/// has a file open in it or something is mounted below it; see [`detach`].
pub fn unmount(target: &Path) -> Result<(), VolumeError> {
    // NOFOLLOW: if someone swapped the target for a symlink, never unmount where it points.
    umount(target, MntFlags::UMOUNT_NOFOLLOW)
}

/// Detaches the mount at `target` lazily: it disappears from the tree now and is freed when the
/// last user lets go (e.g. a container that has not quite exited). Mounts below it go with it,
/// so callers check for those first.
pub fn detach(target: &Path) -> Result<(), VolumeError> {
    tracing::warn!(target = %target.display(), "tmpfs is busy; detaching it lazily");
    umount(target, MntFlags::UMOUNT_NOFOLLOW | MntFlags::MNT_DETACH)
}

/// Unmounts a tmpfs this process has just mounted and nobody else can have mounted below:
/// detached lazily if busy.
pub fn unmount_fresh(target: &Path) -> Result<(), VolumeError> {
    match unmount(target) {
        Err(VolumeError::Unmount {
            source: Errno::EBUSY,
            ..
        }) => detach(target),
        other => other,
    }
}

fn umount(target: &Path, flags: MntFlags) -> Result<(), VolumeError> {
    nix::mount::umount2(target, flags).map_err(|source| VolumeError::Unmount {
        target: target.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::mountinfo;
    use crate::volume::test_support::{MountGuard, require_root};

    #[test]
    fn sizes_hold_two_payloads_plus_slack() {
        let page = page_size();
        assert_eq!(round_up_to_pages(0), 0);
        assert_eq!(round_up_to_pages(1), page);
        assert_eq!(round_up_to_pages(page), page);
        assert_eq!(tmpfs_size(0), 16 * page);
        assert_eq!(tmpfs_size(1), page + 16 * page);
        assert_eq!(tmpfs_size(10 * page), 20 * page + 16 * page);
        assert_eq!(tmpfs_size(u64::MAX), u64::MAX);
    }

    #[test]
    fn mounts_with_our_source_flags_and_size() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap();
        mount(&target, SOURCE, tmpfs_size(1 << 20), None).unwrap();
        let guard = MountGuard::new(&target);
        let entry = mountinfo::find(&target).unwrap().expect("mounted");
        assert!(is_ours(&entry), "{entry:?}");
        for option in ["nosuid", "nodev", "noexec"] {
            assert!(entry.has_mount_option(option), "{option}: {entry:?}");
        }
        let expected = format!("{}k", tmpfs_size(1 << 20) / 1024);
        assert_eq!(entry.super_option("size"), Some(expected.as_str()));
        assert_eq!(entry.super_option("mode"), Some("755"));

        unmount(&target).unwrap();
        assert_eq!(mountinfo::find(&target).unwrap(), None);
        drop(guard);
    }

    #[test]
    fn busy_mount_is_detached() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap();
        mount(&target, SOURCE, tmpfs_size(4096), None).unwrap();
        let _guard = MountGuard::new(&target);
        // An open directory handle on the mount makes a plain umount fail with EBUSY.
        let busy = std::fs::File::open(&target).unwrap();
        assert!(matches!(
            unmount(&target),
            Err(VolumeError::Unmount {
                source: Errno::EBUSY,
                ..
            })
        ));
        unmount_fresh(&target).unwrap();
        assert_eq!(mountinfo::find(&target).unwrap(), None);
        drop(busy);
    }

    #[test]
    fn unmounting_a_plain_directory_fails() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        match unmount(dir.path()) {
            Err(VolumeError::Unmount { source, .. }) => assert_eq!(source, Errno::EINVAL),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_source_names_a_clean_namespace_only() {
        assert_eq!(source("shop").as_deref(), Some("latchkey/shop"));
        for bad in ["", "Shop", "a,b", "a/b", "a b", "x\n", &"a".repeat(64)] {
            assert_eq!(source(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn measures_what_a_tmpfs_holds_in_pages_and_inodes() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap();
        mount(&target, "latchkey/shop", tmpfs_size(1 << 20), None).unwrap();
        let _guard = MountGuard::new(&target);
        let entry = mountinfo::find(&target).unwrap().expect("mounted");
        assert_eq!(namespace(&entry), Some("shop"));
        assert_eq!(size(&entry), Some(tmpfs_size(1 << 20)));
        // The root directory: one inode, no page.
        assert_eq!(measure(&target).unwrap(), INODE_BYTES);
        std::fs::write(target.join("a"), vec![1u8; 5000]).unwrap();
        std::fs::create_dir(target.join("d")).unwrap();
        assert_eq!(
            measure(&target).unwrap(),
            round_up_to_pages(5000) + 3 * INODE_BYTES
        );
    }

    #[test]
    fn is_ours_needs_tmpfs_and_our_source() {
        let mut entry =
            mountinfo::parse(b"40 25 0:39 / /t rw,nosuid - tmpfs latchkey rw,size=8k\n")
                .unwrap()
                .remove(0);
        assert!(is_ours(&entry));
        entry.source = "latchkey/shop".into();
        assert!(is_ours(&entry));
        assert_eq!(namespace(&entry), Some("shop"));
        for forged in [
            "latchkey/",
            "latchkey/Shop",
            "latchkey/a b",
            "latchkeyx/shop",
            "other",
        ] {
            entry.source = forged.into();
            assert!(!is_ours(&entry), "{forged}");
            assert_eq!(namespace(&entry), None, "{forged}");
        }
        entry.source = SOURCE.into();
        entry.fstype = "ramfs".into();
        assert!(!is_ours(&entry));
    }
}
