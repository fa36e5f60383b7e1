//! Volumes: the place where resolved secrets become files. [`Volumes`] mounts a fresh tmpfs
//! (`nosuid,nodev,noexec`, size-limited, source `latchkey`) at a CSI target path, writes the files
//! into it atomically the way kubelet does for Secret volumes (`..data` link swap), refreshes them
//! in place, and unmounts and removes them again. This module is the only code in Latchkey that
//! calls mount(2), and it never writes outside the target path. Every volume's memory is counted
//! against the node's volume budget and its namespace's share of it (`budget`): the kernel
//! charges tmpfs pages to the agent's own memory cgroup.
//!
//! Not for deciding *what* goes into a volume or *when* to refresh it (the publish
//! orchestration does that), and not for CSI types: errors carry an [`ErrorClass`] and the CSI
//! edge maps it to a gRPC code. Every function blocks; async callers use `spawn_blocking`, except
//! for payloads [`is_light`] calls light.
//! Operations on one target must be serialised by the caller; different targets are independent.

mod budget;
mod dirs;
mod error;
mod modes;
pub mod mountinfo;
pub mod path;
mod probe;
mod tmpfs;
mod writer;

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::fs;
use std::path::Path;
use std::sync::Arc;

pub use budget::BudgetLimits;
pub use error::{ErrorClass, VolumeError};
pub use path::FilePath;
pub use tmpfs::INODE_BYTES;
pub use tmpfs::SOURCE as MOUNT_SOURCE;
pub use writer::{DEFAULT_FILE_MODE, VolumeFile, untrusted_file_mode};

use budget::Budget;
use probe::{OurMounts, Seen};
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

/// Most files of a payload whose volume work is light (see [`is_light`]).
const LIGHT_FILES: usize = 16;
/// Most bytes, all files together, of a payload whose volume work is light.
const LIGHT_BYTES: usize = 64 * 1024;

/// Whether publishing or refreshing `files` is light enough to run on an async worker without
/// holding it long: a few dozen system calls on a tmpfs, about 0.1 ms, cheaper than the two
/// thread hand-offs of a trip to the blocking pool. Anything bigger belongs on a blocking thread.
pub fn is_light(files: &[VolumeFile]) -> bool {
    files.len() <= LIGHT_FILES
        && files.iter().map(|f| f.contents.len()).sum::<usize>() <= LIGHT_BYTES
}

/// Publishes, refreshes and removes volumes. Cheap to clone; clones share what they know about
/// the mounts they made.
#[derive(Debug, Clone)]
pub struct Volumes {
    config: VolumeConfig,
    /// Size passed to tmpfs; derived from the limit, overridable in tests to provoke ENOSPC.
    tmpfs_size: u64,
    /// The tmpfs mounts made (or recognised) here, so the hot paths need no mountinfo.
    ours: Arc<OurMounts>,
    /// The memory volumes hold, by namespace, against the node's volume budget.
    budget: Arc<Budget>,
}

/// What a target path holds, as far as volumes are concerned.
#[derive(Debug)]
enum Target {
    /// Nothing.
    Absent,
    /// Something that is not a directory (a file or a link).
    NotADirectory,
    /// A directory that is not a mount point.
    Directory,
    /// One of our tmpfs mounts (possibly stacked on more of ours).
    OurMount,
    /// Somebody else's mount.
    ForeignMount(mountinfo::MountEntry),
}

/// What [`Volumes::publish_or_update`] chose to do, and how it went.
#[derive(Debug)]
pub enum Published {
    /// The target held no volume, so a fresh one was mounted and filled.
    Mounted(Result<(), VolumeError>),
    /// The target held a volume, so its content was refreshed; `true` when it changed.
    Updated(Result<bool, VolumeError>),
}

/// What `unpublish` found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpublished {
    /// A volume was unmounted (or, for plain directories, removed) and the target removed.
    Removed,
    /// The target did not exist, or was an empty directory that was removed.
    NothingThere,
}

impl Volumes {
    /// Volumes with the given configuration.
    pub fn new(config: VolumeConfig) -> Self {
        Self {
            config,
            tmpfs_size: tmpfs::tmpfs_size(config.size_limit),
            ours: Arc::default(),
            budget: Arc::new(Budget::new(BudgetLimits::UNLIMITED)),
        }
    }

    /// These volumes, held to `limits` (unlimited otherwise). Call before publishing anything,
    /// then [`Self::count_mounted`] to learn what an earlier run left mounted.
    pub fn with_budget(mut self, limits: BudgetLimits) -> Self {
        self.budget = Arc::new(Budget::new(limits));
        self
    }

    /// Counts every Latchkey tmpfs mounted below `root` in this mount namespace (`/`: all of
    /// them) in the budget: what an earlier run of the agent mounted is still charged to its
    /// memory cgroup. A volume's namespace comes from its mount source; an older agent's volume
    /// without one is counted under `""` until its next refresh names it. Returns how many were
    /// counted.
    pub fn count_mounted(&self, root: &Path) -> Result<usize, VolumeError> {
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let mut counted = 0;
        for entry in mountinfo::read()? {
            if !tmpfs::is_ours(&entry) || !entry.mount_point.starts_with(&root) {
                continue;
            }
            let bytes = match tmpfs::measure(&entry.mount_point) {
                Ok(bytes) => bytes,
                // Not reachable from here (another mount namespace's path): its size is the
                // most it can hold.
                Err(error) => {
                    let size = tmpfs::size(&entry).unwrap_or(self.tmpfs_size);
                    tracing::warn!(target = %entry.mount_point.display(), %error, size,
                        "cannot measure a volume; counting its whole size");
                    size
                }
            };
            let namespace = tmpfs::namespace(&entry).unwrap_or_default();
            self.budget.record(&entry.mount_point, namespace, bytes);
            counted += 1;
        }
        Ok(counted)
    }

    /// Bytes the volumes of each namespace hold (sorted by namespace), and all together.
    pub fn usage(&self) -> (Vec<(String, u64)>, u64) {
        self.budget.usage()
    }

    /// The configuration this was created with.
    pub fn config(&self) -> VolumeConfig {
        self.config
    }

    /// True when `target` is a mount point of a Latchkey tmpfs (Tmpfs backend), or an existing
    /// directory containing our `..data` link (PlainDirectory backend).
    pub fn is_published(&self, target: &Path) -> Result<bool, VolumeError> {
        dirs::check_target(target)?;
        let found = self.inspect(target)?;
        Ok(self.holds_volume(target, &found))
    }

    /// [`Self::update`] when `target` is published, else [`Self::publish`], looking at the
    /// target once for both the choice and the work (the publish hot path). Fails before
    /// choosing only when the target is invalid or cannot be inspected.
    pub fn publish_or_update(
        &self,
        namespace: &str,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<Published, VolumeError> {
        dirs::check_target(target)?;
        // A payload that does not fit fails the refresh or the mount, whichever it is.
        let payload = writer::check(files, self.config.size_limit);
        if let Ok(p) = &payload
            && let Some(created) = dirs::create_missing_target(target)?
        {
            return Ok(Published::Mounted(
                self.mount_and_fill(namespace, target, p, group, created),
            ));
        }
        let found = self.inspect(target)?;
        Ok(if self.holds_volume(target, &found) {
            Published::Updated(payload.and_then(|p| self.refresh(namespace, target, &p, group)))
        } else {
            Published::Mounted(
                payload.and_then(|p| self.publish_found(namespace, target, &p, group, found)),
            )
        })
    }

    /// First publish: creates `target` if needed, mounts a fresh tmpfs there and writes `files`
    /// atomically. With a `group` (the pod's fsGroup) the root is 0750 and everything is
    /// group-owned by it. Refuses a target that is not an empty directory or missing, as kubelet
    /// always hands over an empty one: mounting over content would hide it. On any failure
    /// nothing is left behind: no mount, no files, and no directories that this call created.
    pub fn publish(
        &self,
        namespace: &str,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<(), VolumeError> {
        dirs::check_target(target)?;
        // Everything that can be rejected without touching the disk is rejected first.
        let payload = writer::check(files, self.config.size_limit)?;
        if let Some(created) = dirs::create_missing_target(target)? {
            return self.mount_and_fill(namespace, target, &payload, group, created);
        }
        let found = self.inspect(target)?;
        self.publish_found(namespace, target, &payload, group, found)
    }

    /// [`Self::publish`] of a checked payload onto a target that was just found to hold `found`.
    fn publish_found(
        &self,
        namespace: &str,
        target: &Path,
        payload: &writer::Payload<'_>,
        group: Option<u32>,
        found: Target,
    ) -> Result<(), VolumeError> {
        let created = match found {
            // `create_missing_target`'s one mkdir has failed (most likely no parent).
            Target::Absent => dirs::create_target(target)?,
            Target::NotADirectory => return Err(not_a_directory(target)),
            Target::OurMount => return Err(already_published(target)),
            Target::ForeignMount(entry) => return Err(not_ours(entry)),
            Target::Directory => {
                if self.config.backend == Backend::PlainDirectory && has_data_link(target) {
                    return Err(already_published(target));
                }
                dirs::require_empty(target)?;
                // Somebody else's (kubelet's) directory: never ours to remove on failure.
                dirs::Created::default()
            }
        };
        self.mount_and_fill(namespace, target, payload, group, created)
    }

    /// [`Self::publish`] onto the empty directory `target`, of which this call `created` what
    /// it lists (removed again on failure).
    fn mount_and_fill(
        &self,
        namespace: &str,
        target: &Path,
        payload: &writer::Payload<'_>,
        group: Option<u32>,
        created: dirs::Created,
    ) -> Result<(), VolumeError> {
        // Refused before anything is mounted; the root directory is the one inode beyond the
        // payload's own.
        let reserved = match self
            .budget
            .reserve(namespace, payload.charge() + INODE_BYTES)
        {
            Ok(reserved) => reserved,
            Err(err) => {
                created.remove(target);
                return Err(err);
            }
        };
        let mounted = match self.config.backend {
            Backend::Tmpfs => {
                let Some(source) = tmpfs::source(namespace) else {
                    created.remove(target);
                    return Err(VolumeError::InvalidTarget {
                        target: target.to_path_buf(),
                        reason: "the pod's namespace is not an RFC 1123 label",
                    });
                };
                if let Err(err) = tmpfs::mount(target, &source, self.tmpfs_size, group) {
                    created.remove(target);
                    return Err(err);
                }
                self.remember_mount(target);
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
        .and_then(|()| AtomicWriter::new(target, group).write_fresh(payload));
        drop(on_panic);
        match written {
            Ok(()) => {
                reserved.commit(target, self.measure(target, payload));
                Ok(())
            }
            Err(err) => {
                // The writer has already removed its own partial work; what is left is ours.
                if mounted {
                    if let Err(unmount) = tmpfs::unmount_fresh(target) {
                        tracing::error!(target = %target.display(), error = %unmount,
                            "cannot unmount after a failed publish; the tmpfs stays mounted");
                        return Err(err);
                    }
                    self.ours.forget(target);
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
        namespace: &str,
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
        self.refresh(namespace, target, &payload, group)
    }

    /// Swaps `payload` into the published volume at `target` when it differs, within the
    /// budget: old and new content both exist until the swap, so the new payload's whole charge
    /// must fit beside what the volume holds. On any failure the old content stays.
    fn refresh(
        &self,
        namespace: &str,
        target: &Path,
        payload: &writer::Payload<'_>,
        group: Option<u32>,
    ) -> Result<bool, VolumeError> {
        let namespace: Arc<str> = match self.budget.namespace_of(target) {
            Some(counted) if !counted.is_empty() => counted,
            // Counted at start under its mount point (the target's parents resolved), or not
            // known by namespace (an older agent's volume): counted for the pod asking for it,
            // under the path its requests use, from now on.
            _ => {
                self.forget_counted(target);
                let held = self.measure(target, payload);
                self.budget.record(target, namespace, held);
                Arc::from(namespace)
            }
        };
        let written = AtomicWriter::new(target, group).write_reserving(payload, || {
            self.budget.reserve(&namespace, payload.charge())
        })?;
        Ok(match written {
            Some(reserved) => {
                reserved.commit(target, self.measure(target, payload));
                true
            }
            None => false,
        })
    }

    /// Takes `target` out of the budget, whether counted under its path or (found at start)
    /// under its mount point.
    fn forget_counted(&self, target: &Path) {
        if !self.budget.release(target) {
            self.budget.release(&dirs::resolved(target));
        }
    }

    /// What the volume at `target` holds now: measured on a tmpfs; a plain directory shares
    /// its filesystem, so it is counted as the payload's charge.
    fn measure(&self, target: &Path, payload: &writer::Payload<'_>) -> u64 {
        match self.config.backend {
            Backend::Tmpfs => tmpfs::measure(target).unwrap_or_else(|error| {
                tracing::warn!(target = %target.display(), %error,
                    "cannot measure a volume; counting what it was predicted to hold");
                payload.charge()
            }),
            Backend::PlainDirectory => payload.charge(),
        }
    }

    /// Unmounts our tmpfs (if mounted) and removes the target directory, which must then be
    /// empty: unpublish never deletes anything it did not write. Succeeds when the target does
    /// not exist. Refuses, touching nothing, when the target is not a directory or is a mount
    /// that Latchkey did not create; leaves a directory with somebody else's content in place
    /// and says so ([`VolumeError::NotEmpty`]).
    pub fn unpublish(&self, target: &Path) -> Result<Unpublished, VolumeError> {
        dirs::check_target(target)?;
        let mut removed = false;
        for _ in 0..MAX_STACKED_MOUNTS {
            match self.inspect(target)? {
                Target::Absent => {
                    self.ours.forget(target);
                    self.forget_counted(target);
                    return Ok(outcome(removed));
                }
                Target::NotADirectory => return Err(not_a_directory(target)),
                Target::ForeignMount(entry) => return Err(not_ours(entry)),
                Target::OurMount => {
                    self.unmount_ours(target)?;
                    self.ours.forget(target);
                    removed = true;
                }
                Target::Directory => {
                    if self.config.backend == Backend::PlainDirectory && has_data_link(target) {
                        AtomicWriter::new(target, None).remove_all()?;
                        removed = true;
                    }
                    // Nothing of ours is mounted (or written) there any more.
                    self.forget_counted(target);
                    dirs::remove_empty(target)?;
                    return Ok(outcome(removed));
                }
            }
        }
        Err(VolumeError::Unmount {
            target: target.to_path_buf(),
            source: nix::errno::Errno::EBUSY,
        })
    }

    /// Whether what [`Self::inspect`] found at `target` is a published volume.
    fn holds_volume(&self, target: &Path, found: &Target) -> bool {
        match found {
            Target::OurMount => true,
            Target::Directory => {
                self.config.backend == Backend::PlainDirectory && has_data_link(target)
            }
            Target::Absent | Target::NotADirectory | Target::ForeignMount(_) => false,
        }
    }

    /// What `target` holds. One `statx` answers for plain directories and for mounts recorded
    /// in [`OurMounts`]; anything else is looked up in mountinfo.
    fn inspect(&self, target: &Path) -> Result<Target, VolumeError> {
        let mount = match probe::look(target)? {
            Seen::Absent => return Ok(Target::Absent),
            Seen::NotADirectory => return Ok(Target::NotADirectory),
            Seen::Directory {
                mount_root: Some(false),
                ..
            } => return Ok(Target::Directory),
            Seen::Directory { mount, .. } => mount,
        };
        if let Some(key) = mount
            && self.ours.holds(target, key)
        {
            return Ok(Target::OurMount);
        }
        Ok(match mountinfo::find(&dirs::resolved(target))? {
            None => Target::Directory,
            Some(entry) if tmpfs::is_ours(&entry) => {
                // Recognised (e.g. mounted before a restart): remember it for next time.
                if let Some(key) = mount {
                    self.ours.record(target, key);
                }
                Target::OurMount
            }
            Some(entry) => Target::ForeignMount(entry),
        })
    }

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
    fn unmount_ours(&self, target: &Path) -> Result<(), VolumeError> {
        match tmpfs::unmount(target) {
            Err(VolumeError::Unmount {
                source: nix::errno::Errno::EBUSY,
                ..
            }) => {
                if let Some(inner) = mountinfo::below(&dirs::resolved(target))?
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

    /// Test hook: use a tmpfs of `bytes` regardless of the size limit, to provoke ENOSPC.
    #[cfg(test)]
    fn with_tmpfs_size(mut self, bytes: u64) -> Self {
        self.tmpfs_size = bytes;
        self
    }
}

fn outcome(removed: bool) -> Unpublished {
    if removed {
        Unpublished::Removed
    } else {
        Unpublished::NothingThere
    }
}

fn not_a_directory(target: &Path) -> VolumeError {
    VolumeError::NotADirectory {
        target: target.to_path_buf(),
    }
}

fn already_published(target: &Path) -> VolumeError {
    VolumeError::AlreadyPublished {
        target: target.to_path_buf(),
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
            let _ = tmpfs::unmount_fresh(self.target);
        }
    }
}
