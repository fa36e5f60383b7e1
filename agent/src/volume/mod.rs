//! Volumes: the place where resolved secrets become files. [`Volumes`] mounts a fresh tmpfs
//! (`nosuid,nodev,noexec`, size-limited, source `latchkey`) at a CSI target path, writes the files
//! into it atomically the way kubelet does for Secret volumes (`..data` link swap), refreshes them
//! in place, and unmounts and removes them again. This module is the only code in Latchkey that
//! calls mount(2), and it never writes outside the target path. Every volume's memory is counted
//! against the node's volume budget and its namespace's share of it (`budget`): the kernel
//! charges tmpfs pages to the agent's own memory cgroup.
//!
//! Three async calls for the agent, [`publish`], [`unpublish`] and [`is_published`], over the
//! blocking [`Volumes::publish_or_update`], [`Volumes::unpublish`] and [`Volumes::is_published`]
//! ([`Volumes::publish`] is a first publish only, for the benchmark's floor and tests). A
//! publish goes through these steps, in this order (`publish_or_update` takes 1-2, then
//! `mount_and_fill` or `refresh` 3-5):
//!
//! 1. check what needs no disk: the target path (`target`) and the files (`payload`);
//! 2. prepare the target: the volume already there, or an empty directory (`target`, `dirs`);
//! 3. mount a fresh tmpfs, its memory set aside first (`mount`, `tmpfs`, `budget`);
//!    a refresh instead makes sure the volume is counted for its namespace;
//! 4. fill it with the files (`writer`), or swap them into the volume already there;
//! 5. record what the volume holds (`budget`).
//!
//! A first publish that fails at any step leaves nothing behind; a refresh that fails keeps the
//! old content.
//!
//! Not for deciding *what* goes into a volume or *when* to refresh it (the publish
//! orchestration does that), and not for CSI types: errors carry an [`ErrorClass`] and the CSI
//! edge maps it to a gRPC code. The work blocks: the async calls run it on the blocking pool,
//! except a publish of a payload small enough (`is_light`) to cost less than the trip there.
//! Operations on one target must be serialised by the caller; different targets are independent.

mod budget;
mod dirs;
mod error;
mod modes;
mod mount;
pub mod mountinfo;
pub mod path;
mod payload;
mod probe;
mod target;
mod tmpfs;
mod writer;

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;

pub use budget::BudgetLimits;
pub use error::{ErrorClass, VolumeError};
pub use path::FilePath;
pub use payload::{DEFAULT_FILE_MODE, VolumeFile, untrusted_file_mode};
pub use tmpfs::INODE_BYTES;
pub use tmpfs::SOURCE as MOUNT_SOURCE;

use budget::Budget;
use dirs::Created;
use mount::Fresh;
use payload::Payload;
use probe::OurMounts;
use target::{Found, Prepared};
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
fn is_light(files: &[VolumeFile]) -> bool {
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

/// What [`Volumes::publish_or_update`] chose to do, and how it went.
#[derive(Debug)]
pub enum Published {
    /// The target held no volume, so a fresh one was mounted and filled.
    Mounted(Result<(), VolumeError>),
    /// The target held a volume, so its content was refreshed; `true` when it changed.
    Updated(Result<bool, VolumeError>),
}

/// What [`Volumes::unpublish`] found and did.
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

    /// A publish, step by step: mounts and fills a fresh volume, or refreshes the one already
    /// there, and says which. Fails before choosing only when the target is invalid or cannot
    /// be looked at; after that a failure belongs to the one chosen, and leaves the volume with
    /// its old content, or no fresh volume at all. Blocks; async callers use [`publish`].
    pub fn publish_or_update(
        &self,
        namespace: &str,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<Published, VolumeError> {
        // 1. Check what needs no disk: the target path, then the files (modes, conflicts, size).
        target::check(target)?;
        let payload = match payload::check(files, self.config.size_limit) {
            Ok(payload) => payload,
            // Refused: it fails the refresh or the mount, whichever the target calls for.
            Err(refused) => {
                let found = self.look(target)?;
                return Ok(if self.holds_volume(target, &found) {
                    Published::Updated(Err(refused))
                } else {
                    Published::Mounted(Err(refused))
                });
            }
        };
        // 2. Prepare the target: the volume already there, or an empty directory to mount on.
        Ok(match self.prepare(target)? {
            Prepared::Volume => {
                Published::Updated(self.refresh(namespace, target, &payload, group))
            }
            Prepared::Empty(created) => {
                Published::Mounted(self.mount_and_fill(namespace, target, &payload, group, created))
            }
            Prepared::Refused(error) => Published::Mounted(Err(error)),
        })
    }

    /// A first publish only, through the same steps: refuses a target that already holds a
    /// volume ([`VolumeError::AlreadyPublished`]). With a `group` (the pod's fsGroup) the root
    /// is 0750 and everything is group-owned by it. Refuses a target that is not an empty
    /// directory or missing, as kubelet always hands over an empty one: mounting over content
    /// would hide it. On any failure nothing is left behind: no mount, no files, and no
    /// directories that this call created. Blocks.
    pub fn publish(
        &self,
        namespace: &str,
        target: &Path,
        files: &[VolumeFile],
        group: Option<u32>,
    ) -> Result<(), VolumeError> {
        target::check(target)?;
        // Everything that can be rejected without touching the disk is rejected first.
        let payload = payload::check(files, self.config.size_limit)?;
        match self.prepare(target)? {
            Prepared::Volume => Err(VolumeError::AlreadyPublished {
                target: target.to_path_buf(),
            }),
            Prepared::Empty(created) => {
                self.mount_and_fill(namespace, target, &payload, group, created)
            }
            Prepared::Refused(error) => Err(error),
        }
    }

    /// Steps 3-5 of a first publish onto the empty directory `target`, of which the publish
    /// `created` what it lists. Any failure undoes all of them (see [`Fresh`]).
    fn mount_and_fill(
        &self,
        namespace: &str,
        target: &Path,
        payload: &Payload<'_>,
        group: Option<u32>,
        created: Created,
    ) -> Result<(), VolumeError> {
        // 3. Mount: the volume's memory is set aside in the budget, then the tmpfs mounted.
        let fresh = Fresh::mount(self, namespace, target, payload, group, created)?;
        // 4. Fill: the files are written into the empty root.
        fresh.fill(payload)?;
        // 5. Record: what the volume holds replaces what was set aside.
        fresh.record(payload);
        Ok(())
    }

    /// Steps 3-5 of a refresh of the volume at `target`: swaps `payload` in when it differs
    /// and returns whether it did. Old and new content both exist until the swap, so the new
    /// payload's whole charge must fit beside what the volume holds. On any failure the old
    /// content stays.
    fn refresh(
        &self,
        namespace: &str,
        target: &Path,
        payload: &Payload<'_>,
        group: Option<u32>,
    ) -> Result<bool, VolumeError> {
        // 3. Count the volume for its namespace, if it is not yet.
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
        // 4. Fill: swap the new files in, setting their memory aside first, unless the volume
        //    already holds exactly them.
        let written = AtomicWriter::new(target, group).write_reserving(payload, || {
            self.budget.reserve(&namespace, payload.charge())
        })?;
        // 5. Record what the volume holds now.
        Ok(match written {
            Some(reserved) => {
                reserved.commit(target, self.measure(target, payload));
                true
            }
            None => false,
        })
    }

    /// Unmounts our tmpfs (if mounted) and removes the target directory, which must then be
    /// empty: unpublish never deletes anything it did not write. Succeeds when the target does
    /// not exist. Refuses, touching nothing, when the target is not a directory or is a mount
    /// that Latchkey did not create; leaves a directory with somebody else's content in place
    /// and says so ([`VolumeError::NotEmpty`]). Blocks; async callers use [`unpublish`].
    pub fn unpublish(&self, target: &Path) -> Result<Unpublished, VolumeError> {
        target::check(target)?;
        let mut removed = false;
        for _ in 0..MAX_STACKED_MOUNTS {
            match self.look(target)? {
                Found::Absent => {
                    self.ours.forget(target);
                    self.forget_counted(target);
                    return Ok(outcome(removed));
                }
                Found::NotADirectory => return Err(target::not_a_directory(target)),
                Found::ForeignMount(entry) => return Err(target::not_ours(entry)),
                Found::OurMount => {
                    self.unmount_ours(target)?;
                    self.ours.forget(target);
                    removed = true;
                }
                Found::Directory => {
                    if self.has_plain_volume(target) {
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

    /// True when `target` is a mount point of a Latchkey tmpfs (Tmpfs backend), or an existing
    /// directory containing our `..data` link (PlainDirectory backend). Blocks; async callers
    /// use [`is_published`].
    pub fn is_published(&self, target: &Path) -> Result<bool, VolumeError> {
        target::check(target)?;
        let found = self.look(target)?;
        Ok(self.holds_volume(target, &found))
    }

    /// Takes `target` out of the budget, whether counted under its path or (found at start)
    /// under its mount point.
    fn forget_counted(&self, target: &Path) {
        if !self.budget.release(target) {
            self.budget.release(&mountinfo::resolved(target));
        }
    }

    /// What the volume at `target` holds now: measured on a tmpfs; a plain directory shares
    /// its filesystem, so it is counted as the payload's charge.
    fn measure(&self, target: &Path, payload: &Payload<'_>) -> u64 {
        match self.config.backend {
            Backend::Tmpfs => tmpfs::measure(target).unwrap_or_else(|error| {
                tracing::warn!(target = %target.display(), %error,
                    "cannot measure a volume; counting what it was predicted to hold");
                payload.charge()
            }),
            Backend::PlainDirectory => payload.charge(),
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

/// [`Volumes::publish_or_update`] from async code: on the calling worker when the payload is
/// light (`is_light`), else on the blocking pool.
pub async fn publish(
    volumes: &Volumes,
    namespace: &str,
    target: &Path,
    files: Vec<VolumeFile>,
    group: Option<u32>,
) -> Result<Published, VolumeError> {
    if is_light(&files) {
        // A few small files: ~0.1 ms of system calls, less than the blocking pool's two thread
        // hand-offs cost (docs/benchmarks.md), so it runs right here.
        return volumes.publish_or_update(namespace, target, &files, group);
    }
    let namespace = namespace.to_owned();
    off_runtime(volumes, target, move |v, t| {
        v.publish_or_update(&namespace, t, &files, group)
    })
    .await
}

/// [`Volumes::unpublish`] from async code, on the blocking pool.
pub async fn unpublish(volumes: &Volumes, target: &Path) -> Result<Unpublished, VolumeError> {
    off_runtime(volumes, target, |v, t| v.unpublish(t)).await
}

/// [`Volumes::is_published`] from async code, on the blocking pool.
pub async fn is_published(volumes: &Volumes, target: &Path) -> Result<bool, VolumeError> {
    off_runtime(volumes, target, |v, t| v.is_published(t)).await
}

/// Runs the blocking `op` on the blocking pool, with a clone of `volumes` (cheap: the shared
/// parts are behind `Arc`s).
async fn off_runtime<T: Send + 'static>(
    volumes: &Volumes,
    target: &Path,
    op: impl FnOnce(&Volumes, &Path) -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, VolumeError> {
    let volumes = volumes.clone();
    let path = target.to_path_buf();
    tokio::task::spawn_blocking(move || op(&volumes, &path))
        .await
        .map_err(|e| VolumeError::Worker {
            reason: e.to_string(),
        })?
}
